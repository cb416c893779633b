//! The dashboard, served by the API process under `/dashboard` (and `/`
//! sends a browser there): server-rendered pages, one stylesheet and one
//! small script embedded in the binary.
//!
//! - [`accounts`]: organizations, sign-in links, passwords, sessions.
//! - [`html`]: the pages, every user-controlled text escaped.
//! - [`usage`]: the usage page and its chart.
//! - [`explore`]: searching markets and a market's charts, each beside
//!   the `/v1` request it was drawn from ([`v1`]), drawn by [`charts`].
//!
//! Security, in one place:
//! - The session is a random cookie (`hs_session`, `HttpOnly`,
//!   `SameSite=Lax`, `Secure` when the public address is `https` or the
//!   request came through a proxy saying `X-Forwarded-Proto: https`); the
//!   store keeps only its hash. Signing in always issues a new value and
//!   deletes the session the browser had, so a value planted before
//!   sign-in is never honoured after it (no fixation).
//! - CSRF: every state-changing form carries a synchronizer token derived
//!   from the browser's cookie (SHA-256 of a label and the cookie value);
//!   a POST whose token does not match its cookie is refused with 403.
//!   Before sign-in the cookie is an anonymous random value set with the
//!   form, so the sign-in and set-password forms are covered too.
//! - Sign-in attempts are throttled per account and per client address
//!   through the same shared sliding windows as API keys
//!   ([`AuthStore::take_hit`](hindsight_contracts::AuthStore::take_hit)),
//!   so the limits hold across replicas.
//! - Pages are `no-store`, framed by nobody, and sent with a content
//!   security policy allowing only this origin's stylesheet and script.

pub mod accounts;
pub mod charts;
pub mod explore;
pub mod html;
pub mod usage;
pub mod v1;

use crate::keys;
use crate::ApiState;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Extension, Form, Router};
use hindsight_contracts::accounts::HOUR_MS;
use hindsight_contracts::{ApiKeyRecord, OrgKey, Organization, User};
use hindsight_schemas::Timestamp;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::net::SocketAddr;
use subtle::ConstantTimeEq;

/// The session cookie's name.
pub const COOKIE: &str = "hs_session";
/// Sign-in attempts allowed per account in any minute.
pub const SIGN_IN_PER_ACCOUNT: u32 = 5;
/// Sign-in attempts allowed per client address in any minute.
pub const SIGN_IN_PER_ADDRESS: u32 = 20;

/// The dashboard's settings.
#[derive(Debug, Clone, Default)]
pub struct DashboardConfig {
    /// Set `Secure` on cookies whatever the request says (the public
    /// address is `https`).
    pub secure_cookies: bool,
    /// The public base URL, for the sign-in links owners hand out (`None`:
    /// the request's own scheme and `Host`).
    pub public_url: Option<String>,
}

/// Everything the dashboard answers besides its pages.
#[derive(Debug, thiserror::Error)]
pub enum DashError {
    #[error("the form's security token is missing or does not match this browser's session; reload the page and try again")]
    Csrf,
    #[error("{0}")]
    Throttled(String),
    #[error("this sign-in link has expired or was already used; ask for a new one")]
    BadLink,
    #[error("{0}")]
    NotFound(String),
    #[error("only an owner of the organization may invite members")]
    NotOwner,
    #[error(transparent)]
    Store(#[from] hindsight_contracts::Error),
}

impl IntoResponse for DashError {
    fn into_response(self) -> Response {
        let (status, title) = match &self {
            DashError::Csrf => (StatusCode::FORBIDDEN, "Forbidden"),
            DashError::Throttled(_) => (StatusCode::TOO_MANY_REQUESTS, "Too many attempts"),
            DashError::BadLink => (StatusCode::GONE, "Link expired"),
            DashError::NotFound(_) => (StatusCode::NOT_FOUND, "Not found"),
            DashError::NotOwner => (StatusCode::FORBIDDEN, "Forbidden"),
            DashError::Store(e) => {
                tracing::error!(error = %e, "dashboard request failed");
                (StatusCode::INTERNAL_SERVER_ERROR, "Something went wrong")
            }
        };
        let detail = match &self {
            DashError::Store(_) => "the service could not reach its store; try again".to_string(),
            other => other.to_string(),
        };
        let mut response = (status, html_page(html::error(title, &detail))).into_response();
        if let DashError::Throttled(_) = self {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("60"));
        }
        response
    }
}

type Result<T, E = DashError> = std::result::Result<T, E>;

fn html_page(body: String) -> Response {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], body).into_response()
}

pub fn router(state: ApiState) -> Router {
    Router::new()
        .route("/", get(root))
        .route("/dashboard", get(keys_page))
        .route("/dashboard/sign-in", get(sign_in_page).post(sign_in))
        .route("/dashboard/sign-out", post(sign_out))
        .route("/dashboard/link/{token}", get(link_page))
        .route("/dashboard/link", post(set_password))
        .route("/dashboard/keys", post(create_key))
        .route("/dashboard/members", post(invite_member))
        .route("/dashboard/keys/{key_id}/revoke", post(revoke_key))
        .route("/dashboard/keys/{key_id}/rotate", post(rotate_key))
        .route("/dashboard/usage", get(usage::page))
        .route("/dashboard/markets", get(explore::markets))
        .route("/dashboard/markets/{id_or_slug}", get(explore::market))
        .route("/dashboard/assets/app.css", get(css))
        .route("/dashboard/assets/app.js", get(js))
        .layer(middleware::from_fn(page_headers))
        .with_state(state)
}

/// Headers of every dashboard answer.
async fn page_headers(request: axum::extract::Request, next: Next) -> Response {
    let asset = request.uri().path().starts_with("/dashboard/assets/");
    let mut response = next.run(request).await;
    let h = response.headers_mut();
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    // Sign-in links carry their token in the path: never in a Referer.
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self' data:; \
             form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    if !asset {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}

async fn css() -> Response {
    asset("text/css; charset=utf-8", include_str!("assets/app.css"))
}

async fn js() -> Response {
    asset(
        "text/javascript; charset=utf-8",
        include_str!("assets/app.js"),
    )
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "public, max-age=3600"),
        ],
        body,
    )
        .into_response()
}

/// `/`: a browser goes to the dashboard; anything else gets the API's 404.
async fn root(headers: HeaderMap) -> Response {
    let browser = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/html"));
    if browser {
        Redirect::to("/dashboard").into_response()
    } else {
        crate::error::ApiError::NotFound("Not Found".into()).into_response()
    }
}

// ---- the browser's cookie, session and CSRF token ------------------------------

/// The value of this browser's session cookie, if it sent one that looks
/// like ours (64 hex digits).
fn cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.to_string())
        .filter(|v| v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The synchronizer token of a cookie value.
pub fn csrf_for(cookie: &str) -> String {
    let digest = Sha256::digest(format!("hindsight-csrf:{cookie}").as_bytes());
    crate::hex::encode(&digest[..16])
}

/// Refuses a form whose token does not belong to the browser's cookie.
fn check_csrf(headers: &HeaderMap, sent: &str) -> Result<String> {
    let cookie = cookie(headers).ok_or(DashError::Csrf)?;
    let want = csrf_for(&cookie);
    if bool::from(want.as_bytes().ct_eq(sent.as_bytes())) {
        Ok(cookie)
    } else {
        Err(DashError::Csrf)
    }
}

fn secure(state: &ApiState, headers: &HeaderMap) -> bool {
    state.dashboard.secure_cookies
        || headers
            .get("x-forwarded-proto")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case("https"))
}

fn set_cookie(state: &ApiState, headers: &HeaderMap, value: &str, max_age_s: i64) -> HeaderValue {
    let secure = if secure(state, headers) {
        "; Secure"
    } else {
        ""
    };
    HeaderValue::from_str(&format!(
        "{COOKIE}={value}; Path=/; HttpOnly; SameSite=Lax; Max-Age={max_age_s}{secure}"
    ))
    .expect("hex and ASCII attributes make a valid header")
}

/// The browser's cookie, or a new anonymous one to set with the page (so
/// that its forms carry a token).
fn anonymous_cookie(headers: &HeaderMap) -> (String, bool) {
    match cookie(headers) {
        Some(c) => (c, false),
        None => (keys::random_hex(32), true),
    }
}

fn with_cookie(
    state: &ApiState,
    headers: &HeaderMap,
    response: Response,
    new: Option<&str>,
) -> Response {
    let mut response = response;
    if let Some(value) = new {
        response.headers_mut().append(
            header::SET_COOKIE,
            set_cookie(state, headers, value, accounts::SESSION_MS / 1000),
        );
    }
    response
}

/// A signed-in browser.
pub struct SignedIn {
    pub user: User,
    pub org: Organization,
    pub csrf: String,
}

impl SignedIn {
    pub fn nav(&self) -> html::Nav<'_> {
        html::Nav {
            email: &self.user.email,
            organization: &self.org.name,
            csrf: &self.csrf,
        }
    }
}

/// The signed-in user of this browser, if its cookie names a live session.
pub async fn signed_in(state: &ApiState, headers: &HeaderMap) -> Result<Option<SignedIn>> {
    let Some(cookie) = cookie(headers) else {
        return Ok(None);
    };
    let Some(session) = state.accounts.session(keys::hash(&cookie)).await? else {
        return Ok(None);
    };
    if session.expires_at <= state.clock.now() {
        return Ok(None);
    }
    let Some(user) = state.accounts.user(&session.email).await? else {
        return Ok(None);
    };
    let Some(org) = state.accounts.organization(&user.organization).await? else {
        return Ok(None);
    };
    Ok(Some(SignedIn {
        user,
        org,
        csrf: csrf_for(&cookie),
    }))
}

/// The signed-in user, or a redirect to the sign-in page.
pub async fn require(state: &ApiState, headers: &HeaderMap) -> Result<Result<SignedIn, Response>> {
    Ok(signed_in(state, headers)
        .await?
        .ok_or_else(|| Redirect::to("/dashboard/sign-in").into_response()))
}

/// The user behind a state-changing form: its CSRF token checked first,
/// then the session (or a redirect to the sign-in page).
async fn signed_in_form(
    state: &ApiState,
    headers: &HeaderMap,
    csrf: &str,
) -> Result<Result<SignedIn, Response>> {
    check_csrf(headers, csrf)?;
    require(state, headers).await
}

// ---- sign-in, sign-in links, sign-out ------------------------------------------

/// The sign-in form (also to a signed-in browser: signing in as someone
/// else ends its session).
async fn sign_in_page(State(state): State<ApiState>, headers: HeaderMap) -> Result<Response> {
    let (cookie, new) = anonymous_cookie(&headers);
    let page = html_page(html::sign_in(&csrf_for(&cookie), "", None));
    Ok(with_cookie(
        &state,
        &headers,
        page,
        new.then_some(cookie.as_str()),
    ))
}

#[derive(Deserialize)]
struct SignInForm {
    #[serde(default)]
    csrf: String,
    email: String,
    password: String,
}

/// Takes a sign-in attempt from the shared window of `subject`, or says
/// how the attempt is throttled.
async fn throttle(state: &ApiState, subject: String, limit: u32, what: &str) -> Result<()> {
    let taken = state
        .keys
        .take_hit(&subject, state.clock.now(), limit)
        .await?;
    if taken.admitted {
        Ok(())
    } else {
        Err(DashError::Throttled(format!(
            "too many sign-in attempts {what} ({limit} per minute); wait a minute and try again"
        )))
    }
}

async fn sign_in(
    State(state): State<ApiState>,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
    headers: HeaderMap,
    Form(form): Form<SignInForm>,
) -> Result<Response> {
    let old = check_csrf(&headers, &form.csrf)?;
    if let Some(Extension(ConnectInfo(addr))) = peer {
        throttle(
            &state,
            format!("sign-in:addr:{}", addr.ip()),
            SIGN_IN_PER_ADDRESS,
            "from this address",
        )
        .await?;
    }
    let email = form.email.trim().to_lowercase();
    throttle(
        &state,
        format!("sign-in:account:{email}"),
        SIGN_IN_PER_ACCOUNT,
        "for this account",
    )
    .await?;
    let user = state.accounts.user(&email).await?;
    let ok = user.as_ref().is_some_and(|u| {
        u.password_hash
            .as_deref()
            .is_some_and(|phc| accounts::verify_password(&form.password, phc))
    });
    if !ok {
        let page = html::sign_in(&csrf_for(&old), &email, Some("wrong email or password"));
        return Ok((StatusCode::UNAUTHORIZED, html_page(page)).into_response());
    }
    start(&state, &headers, &old, &email).await
}

/// Signs `email` in: a new session under a new cookie value; the browser's
/// previous session, if it had one, is ended.
async fn start(state: &ApiState, headers: &HeaderMap, old: &str, email: &str) -> Result<Response> {
    state.accounts.delete_session(keys::hash(old)).await?;
    let secret = accounts::start_session(state.accounts.as_ref(), email, state.clock.now()).await?;
    let mut response = Redirect::to("/dashboard").into_response();
    response.headers_mut().append(
        header::SET_COOKIE,
        set_cookie(state, headers, &secret, accounts::SESSION_MS / 1000),
    );
    Ok(response)
}

/// The page behind a sign-in link. It does not take the token (link
/// previews open links too): setting the password does.
async fn link_page(
    State(state): State<ApiState>,
    Path(token): Path<String>,
    headers: HeaderMap,
) -> Result<Response> {
    let (cookie, new) = anonymous_cookie(&headers);
    let page = html_page(html::set_password(&csrf_for(&cookie), &token, None));
    Ok(with_cookie(
        &state,
        &headers,
        page,
        new.then_some(cookie.as_str()),
    ))
}

#[derive(Deserialize)]
struct LinkForm {
    #[serde(default)]
    csrf: String,
    token: String,
    password: String,
    again: String,
}

async fn set_password(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Form(form): Form<LinkForm>,
) -> Result<Response> {
    let old = check_csrf(&headers, &form.csrf)?;
    // Checked before the token is taken: a typo does not spend the link.
    if let Err(why) = accounts::check_password(&form.password, &form.again) {
        let page = html::set_password(&csrf_for(&old), &form.token, Some(&why));
        return Ok((StatusCode::UNPROCESSABLE_ENTITY, html_page(page)).into_response());
    }
    let now = state.clock.now();
    let token = state
        .accounts
        .take_sign_in_token(keys::hash(&form.token))
        .await?;
    let Some(token) = token.filter(|t| t.expires_at > now) else {
        return Err(DashError::BadLink);
    };
    let Some(mut user) = state.accounts.user(&token.email).await? else {
        return Err(DashError::BadLink);
    };
    user.password_hash = Some(accounts::hash_password(&form.password));
    state.accounts.put_user(user).await?;
    start(&state, &headers, &old, &token.email).await
}

#[derive(Deserialize)]
struct CsrfForm {
    #[serde(default)]
    csrf: String,
}

async fn sign_out(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Form(form): Form<CsrfForm>,
) -> Result<Response> {
    let cookie = check_csrf(&headers, &form.csrf)?;
    state.accounts.delete_session(keys::hash(&cookie)).await?;
    let mut response = Redirect::to("/dashboard/sign-in").into_response();
    response
        .headers_mut()
        .append(header::SET_COOKIE, set_cookie(&state, &headers, "", 0));
    Ok(response)
}

// ---- keys ----------------------------------------------------------------------

async fn key_rows(state: &ApiState, org: &str) -> Result<Vec<(OrgKey, ApiKeyRecord)>> {
    let mut out = Vec::new();
    for key in state.accounts.org_keys(org).await? {
        if let Some(record) = state.keys.key_by_hash(key.hash).await? {
            out.push((key, record));
        }
    }
    Ok(out)
}

async fn render_keys(
    state: &ApiState,
    me: &SignedIn,
    shown: Option<html::NewSecret<'_>>,
    invited: html::Invited<'_>,
) -> Result<Response> {
    let now = state.clock.now();
    let since = Timestamp(accounts_hour(now).0 - 23 * HOUR_MS);
    // This process's latest requests, counted but not yet written.
    state.usage.flush().await?;
    let mut rows = Vec::new();
    for (key, record) in key_rows(state, &me.org.name).await? {
        let usage = state.accounts.key_usage(&key.key_id, since).await?;
        rows.push(html::KeyRow {
            requests_24h: usage.counts.iter().map(|c| c.count).sum(),
            last_used: usage.last_used,
            key_id: key.key_id,
            name: key.name,
            prefix: key.prefix,
            created_at: key.created_at,
            revoked_at: record.revoked_at,
        });
    }
    let members = (me.user.role == "owner").then(|| html::members(&me.csrf, invited));
    Ok(html_page(html::keys(
        &me.nav(),
        &me.org.plan,
        &rows,
        shown,
        members,
    )))
}

fn accounts_hour(t: Timestamp) -> Timestamp {
    hindsight_contracts::accounts::hour_of(t)
}

async fn keys_page(State(state): State<ApiState>, headers: HeaderMap) -> Result<Response> {
    match require(&state, &headers).await? {
        Ok(me) => render_keys(&state, &me, None, None).await,
        Err(redirect) => Ok(redirect),
    }
}

#[derive(Deserialize)]
struct KeyForm {
    #[serde(default)]
    csrf: String,
    name: String,
}

/// A new key of the organization, on its plan: the key the API checks, and
/// the organization's entry naming it.
async fn new_key(state: &ApiState, org: &Organization, name: &str) -> Result<(String, String)> {
    let (secret, mut record) = keys::generate(&org.name, &org.plan);
    record.created_at = state.clock.now();
    state.keys.put_key(record.clone()).await?;
    state
        .accounts
        .put_org_key(OrgKey {
            organization: org.name.clone(),
            key_id: record.key_id,
            name: name.to_string(),
            prefix: secret[..keys::KEY_PREFIX.len() + 8].to_string(),
            hash: record.hash,
            created_at: record.created_at,
        })
        .await?;
    Ok((secret, name.to_string()))
}

async fn create_key(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Form(form): Form<KeyForm>,
) -> Result<Response> {
    let me = match signed_in_form(&state, &headers, &form.csrf).await? {
        Ok(me) => me,
        Err(redirect) => return Ok(redirect),
    };
    let name: String = form.name.trim().chars().take(100).collect();
    let name = if name.is_empty() {
        "unnamed".to_string()
    } else {
        name
    };
    let (secret, name) = new_key(&state, &me.org, &name).await?;
    render_keys(
        &state,
        &me,
        Some(html::NewSecret {
            name: &name,
            secret: &secret,
        }),
        None,
    )
    .await
}

/// The organization's key `key_id`, or 404 (another organization's key is
/// not found either).
async fn own_key(state: &ApiState, me: &SignedIn, key_id: &str) -> Result<(OrgKey, ApiKeyRecord)> {
    key_rows(state, &me.org.name)
        .await?
        .into_iter()
        .find(|(k, _)| k.key_id == key_id)
        .ok_or_else(|| DashError::NotFound(format!("your organization has no key {key_id}")))
}

async fn revoke(state: &ApiState, mut record: ApiKeyRecord) -> Result<()> {
    if record.revoked_at.is_none() {
        record.revoked_at = Some(state.clock.now());
        state.keys.put_key(record).await?;
    }
    Ok(())
}

async fn revoke_key(
    State(state): State<ApiState>,
    Path(key_id): Path<String>,
    headers: HeaderMap,
    Form(form): Form<CsrfForm>,
) -> Result<Response> {
    let me = match signed_in_form(&state, &headers, &form.csrf).await? {
        Ok(me) => me,
        Err(redirect) => return Ok(redirect),
    };
    let (_, record) = own_key(&state, &me, &key_id).await?;
    revoke(&state, record).await?;
    Ok(Redirect::to("/dashboard").into_response())
}

/// A new secret under the same name; the old key is revoked at once.
async fn rotate_key(
    State(state): State<ApiState>,
    Path(key_id): Path<String>,
    headers: HeaderMap,
    Form(form): Form<CsrfForm>,
) -> Result<Response> {
    let me = match signed_in_form(&state, &headers, &form.csrf).await? {
        Ok(me) => me,
        Err(redirect) => return Ok(redirect),
    };
    let (old, record) = own_key(&state, &me, &key_id).await?;
    if record.revoked_at.is_some() {
        return Err(DashError::NotFound(format!("key {key_id} is revoked")));
    }
    let (secret, name) = new_key(&state, &me.org, &old.name).await?;
    revoke(&state, record).await?;
    render_keys(
        &state,
        &me,
        Some(html::NewSecret {
            name: &name,
            secret: &secret,
        }),
        None,
    )
    .await
}

// ---- members -------------------------------------------------------------------

#[derive(Deserialize)]
struct MemberForm {
    #[serde(default)]
    csrf: String,
    email: String,
}

/// An owner invites a member: a new user of the organization and a
/// one-time sign-in link to hand them, shown once on the page.
async fn invite_member(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Form(form): Form<MemberForm>,
) -> Result<Response> {
    let me = match signed_in_form(&state, &headers, &form.csrf).await? {
        Ok(me) => me,
        Err(redirect) => return Ok(redirect),
    };
    if me.user.role != "owner" {
        return Err(DashError::NotOwner);
    }
    let now = state.clock.now();
    let made = accounts::invite(
        state.accounts.as_ref(),
        &me.org.name,
        &form.email,
        "member",
        now,
    )
    .await;
    match made {
        Ok(token) => {
            let email = accounts::normalize_email(&form.email).unwrap_or_default();
            let link = accounts::sign_in_link(&public_url(&state, &headers), &token);
            render_keys(&state, &me, None, Some(Ok((&email, &link)))).await
        }
        Err(accounts::AccountError::Store(e)) => Err(e.into()),
        Err(refused) => render_keys(&state, &me, None, Some(Err(&refused.to_string()))).await,
    }
}

/// Where browsers reach this service: the configured public address, else
/// the scheme and `Host` of this request.
fn public_url(state: &ApiState, headers: &HeaderMap) -> String {
    if let Some(url) = &state.dashboard.public_url {
        return url.clone();
    }
    let scheme = if secure(state, headers) {
        "https"
    } else {
        "http"
    };
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("localhost");
    format!("{scheme}://{host}")
}
