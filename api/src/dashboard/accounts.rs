//! Accounts as the dashboard and `hindsight accounts` use them: creating an
//! organization with its owner, one-time sign-in links, passwords, sessions.
//!
//! Secrets handed out (sign-in tokens, session cookies) are 32 random bytes
//! and stored as their SHA-256; passwords are stored as Argon2id PHC
//! strings. None of them is ever logged.

use crate::keys::{hash, random_hex};
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;
use hindsight_contracts::{AccountStore, Organization, Session, SignInToken, User};
use hindsight_schemas::Timestamp;

/// How long a sign-in link works.
pub const SIGN_IN_LINK_MS: i64 = 24 * 3_600_000;
/// How long a session lasts after sign-in.
pub const SESSION_MS: i64 = 7 * 24 * 3_600_000;
/// The shortest password accepted.
pub const MIN_PASSWORD_CHARS: usize = 10;
/// The path of a sign-in link, before its token.
pub const LINK_PATH: &str = "/dashboard/link/";

/// What creating an account can refuse.
#[derive(Debug, thiserror::Error)]
pub enum AccountError {
    #[error("organization {0:?} exists already")]
    OrganizationExists(String),
    #[error("{0:?} already has an account")]
    UserExists(String),
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Store(#[from] hindsight_contracts::Error),
}

/// An email as stored and compared: trimmed, lowercased, and plausibly an
/// address.
pub fn normalize_email(email: &str) -> Result<String, AccountError> {
    let email = email.trim().to_lowercase();
    let ok = email.len() <= 254
        && email.split_once('@').is_some_and(|(local, domain)| {
            !local.is_empty() && domain.contains('.') && !domain.starts_with('.')
        })
        && !email.chars().any(|c| c.is_whitespace() || c.is_control());
    if ok {
        Ok(email)
    } else {
        Err(AccountError::Invalid(format!(
            "email {email:?} is not an address (name@domain)"
        )))
    }
}

/// An organization name: 1 to 64 letters, digits, `-`, `_` or `.`.
pub fn check_org_name(name: &str) -> Result<(), AccountError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(AccountError::Invalid(format!(
            "organization {name:?} must be 1 to 64 letters, digits, '-', '_' or '.'"
        )))
    }
}

/// Creates an organization and its owner (without a password); returns the
/// owner's sign-in token, for [`sign_in_link`].
pub async fn create_organization(
    store: &dyn AccountStore,
    org: &str,
    plan: &str,
    email: &str,
    now: Timestamp,
) -> Result<String, AccountError> {
    check_org_name(org)?;
    let email = normalize_email(email)?;
    if store.organization(org).await?.is_some() {
        return Err(AccountError::OrganizationExists(org.to_string()));
    }
    if store.user(&email).await?.is_some() {
        return Err(AccountError::UserExists(email));
    }
    store
        .put_organization(Organization {
            name: org.to_string(),
            plan: plan.to_string(),
            created_at: now,
        })
        .await?;
    invite(store, org, &email, "owner", now).await
}

/// Adds a user to an organization (or keeps an existing user of it) and
/// returns a new sign-in token for them. A user of another organization is
/// refused.
pub async fn invite(
    store: &dyn AccountStore,
    org: &str,
    email: &str,
    role: &str,
    now: Timestamp,
) -> Result<String, AccountError> {
    let email = normalize_email(email)?;
    match store.user(&email).await? {
        Some(user) if user.organization != org => return Err(AccountError::UserExists(email)),
        Some(_) => {}
        None => {
            store
                .put_user(User {
                    email: email.clone(),
                    organization: org.to_string(),
                    role: role.to_string(),
                    password_hash: None,
                    created_at: now,
                })
                .await?
        }
    }
    let token = random_hex(32);
    store
        .put_sign_in_token(SignInToken {
            hash: hash(&token),
            email,
            expires_at: Timestamp(now.0 + SIGN_IN_LINK_MS),
        })
        .await?;
    Ok(token)
}

/// The full sign-in link of a token on the service's public address.
pub fn sign_in_link(public_url: &str, token: &str) -> String {
    format!("{}{LINK_PATH}{token}", public_url.trim_end_matches('/'))
}

/// The Argon2id PHC string of a password, with a random salt.
pub fn hash_password(password: &str) -> String {
    let mut salt = [0u8; 16];
    getrandom::fill(&mut salt).expect("the OS random source is available");
    let salt = SaltString::encode_b64(&salt).expect("16 bytes is a valid salt");
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .expect("Argon2id with default parameters hashes any password")
        .to_string()
}

/// Whether `password` matches a stored PHC string (false for a corrupt one).
pub fn verify_password(password: &str, phc: &str) -> bool {
    PasswordHash::new(phc).is_ok_and(|parsed| {
        Argon2::default()
            .verify_password(password.as_bytes(), &parsed)
            .is_ok()
    })
}

/// A password the dashboard accepts, or why not.
pub fn check_password(password: &str, again: &str) -> Result<(), String> {
    if password != again {
        return Err("the two passwords differ".into());
    }
    if password.chars().count() < MIN_PASSWORD_CHARS {
        return Err(format!(
            "a password needs at least {MIN_PASSWORD_CHARS} characters"
        ));
    }
    if password.len() > 1024 {
        return Err("a password may have at most 1024 bytes".into());
    }
    Ok(())
}

/// Starts a session for `email`: stores its hash, returns the cookie value.
pub async fn start_session(
    store: &dyn AccountStore,
    email: &str,
    now: Timestamp,
) -> Result<String, hindsight_contracts::Error> {
    let secret = random_hex(32);
    store
        .put_session(Session {
            hash: hash(&secret),
            email: email.to_string(),
            created_at: now,
            expires_at: Timestamp(now.0 + SESSION_MS),
        })
        .await?;
    Ok(secret)
}
