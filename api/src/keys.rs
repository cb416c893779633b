//! API keys: random, shown once, stored only as a SHA-256 hash.
//!
//! A key is 32 random bytes (256 bits), so a plain SHA-256 is enough: there
//! is nothing to brute-force, unlike a password. The hash is what the store
//! indexes and what a lookup compares.

use hindsight_contracts::ApiKeyRecord;
use hindsight_schemas::Timestamp;
use sha2::{Digest, Sha256};

/// Prefix of every key, so that leaked keys are recognisable by scanners.
pub const KEY_PREFIX: &str = "hsk_";

pub fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    getrandom::fill(&mut buf).expect("the OS random source is available");
    crate::hex::encode(&buf)
}

pub fn hash(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// A new key: its plaintext (to show once) and the record to store.
pub fn generate(organization: &str, plan: &str) -> (String, ApiKeyRecord) {
    let plaintext = format!("{KEY_PREFIX}{}", random_hex(32));
    (
        plaintext.clone(),
        record_for(&plaintext, organization, plan),
    )
}

/// The record of a given plaintext key (for a configured demo key).
pub fn record_for(plaintext: &str, organization: &str, plan: &str) -> ApiKeyRecord {
    let hash = hash(plaintext);
    // The public handle derives from the hash, not the key: it names the key
    // in `keys list` and logs without revealing any of it.
    let key_id = format!("key_{}", crate::hex::encode(&hash[..6]));
    ApiKeyRecord {
        key_id,
        hash,
        organization: organization.to_string(),
        plan: plan.to_string(),
        created_at: Timestamp::now(),
        revoked_at: None,
    }
}
