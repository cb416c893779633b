//! Opaque pagination cursors, signed and bound to the request they continue.
//!
//! - History: the next bucket start; tick-level history: the next tick's
//!   key (timestamp and log position).
//! - Lists: the sort position `(key, id)` of the last item of the page.
//!
//! A cursor is `prefix || hex(payload) || hex(tag)`, the tag a 128-bit
//! HMAC-SHA256 under the API's cursor secret over the payload and the
//! cursor's [`Scope`]: the route, and what fixes the result set (history:
//! the token or market id the path resolved to, `start_ts`, `end_ts`,
//! `resolution`; lists: sort, order and every filter). A cursor that was
//! edited, made up, or taken from another route, series, range, resolution
//! or list is refused (400) rather than read as some other position.
//! `limit` is not bound, so a client may change its page size while paging,
//! and a market's cursor continues whether the path names it by id or slug.
//!
//! The secret ([`CursorKeys`]) is configuration, the same on every API
//! replica, so that any replica continues any replica's cursor. Several
//! secrets may be given for rotation: the first signs, all verify.

use crate::hex;
use hindsight_contracts::TickKey;
use hindsight_schemas::Timestamp;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::sync::Arc;

type HmacSha256 = Hmac<Sha256>;

/// Shortest secret accepted: 32 bytes, e.g. `openssl rand -hex 32` (64).
pub const MIN_SECRET_LEN: usize = 32;
/// Bytes of the tag kept: 128 bits, beyond guessing.
const TAG_LEN: usize = 16;
/// Domain separation: a tag of anything else never verifies as a cursor's.
const DOMAIN: &[u8] = b"hindsight cursor v2\0";

/// The secrets cursors are signed with: the first signs, every one verifies.
#[derive(Clone)]
pub struct CursorKeys {
    macs: Arc<[HmacSha256]>,
}

impl std::fmt::Debug for CursorKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CursorKeys({} secrets)", self.macs.len())
    }
}

impl CursorKeys {
    /// At least one secret, each at least [`MIN_SECRET_LEN`] bytes.
    pub fn new<S: AsRef<[u8]>>(secrets: &[S]) -> Result<Self, String> {
        if secrets.is_empty() {
            return Err("no cursor secret given".into());
        }
        let macs = secrets
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let s = s.as_ref();
                if s.len() < MIN_SECRET_LEN {
                    return Err(format!(
                        "cursor secret {} is {} bytes; at least {MIN_SECRET_LEN} are needed \
                         (generate one with `openssl rand -hex 32`)",
                        i + 1,
                        s.len()
                    ));
                }
                Ok(HmacSha256::new_from_slice(s).expect("HMAC takes a key of any length"))
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(CursorKeys { macs: macs.into() })
    }

    fn mac(mac: &HmacSha256, prefix: &str, scope: &Scope, payload: &[u8]) -> HmacSha256 {
        let mut mac = mac.clone();
        mac.update(DOMAIN);
        mac.update(prefix.as_bytes());
        mac.update(&(scope.0.len() as u64).to_be_bytes());
        mac.update(&scope.0);
        mac.update(payload);
        mac
    }

    fn seal(&self, prefix: &str, scope: &Scope, payload: &[u8]) -> String {
        let tag = Self::mac(&self.macs[0], prefix, scope, payload).finalize();
        format!(
            "{prefix}{}{}",
            hex::encode(payload),
            hex::encode(&tag.into_bytes()[..TAG_LEN])
        )
    }

    fn open(&self, prefix: &str, scope: &Scope, cursor: &str) -> Option<Vec<u8>> {
        let bytes = hex::decode(cursor.strip_prefix(prefix)?)?;
        let (payload, tag) = bytes.split_at(bytes.len().checked_sub(TAG_LEN)?);
        self.macs
            .iter()
            .any(|m| {
                Self::mac(m, prefix, scope, payload)
                    .verify_truncated_left(tag)
                    .is_ok()
            })
            .then(|| payload.to_vec())
    }
}

/// What a cursor is valid for: a route and named values, in an unambiguous
/// encoding (every part length-prefixed).
#[derive(Debug, Clone, PartialEq)]
pub struct Scope(Vec<u8>);

impl Scope {
    /// The route, as its template (`/v1/tokens/{token_id}/prices`).
    pub fn new(route: &str) -> Self {
        Scope(Vec::new()).with("route", route)
    }

    pub fn with(mut self, name: &str, value: &str) -> Self {
        for part in [name, value] {
            self.0.extend_from_slice(&(part.len() as u64).to_be_bytes());
            self.0.extend_from_slice(part.as_bytes());
        }
        self
    }
}

/// Seals and opens the cursors of one request: its keys and its scope.
#[derive(Debug, Clone)]
pub struct Pager {
    keys: CursorKeys,
    scope: Scope,
}

const HISTORY: &str = "h2";
const TICK: &str = "k1";
const LIST: &str = "l2";

/// Where a list page ended.
#[derive(Debug, Clone, PartialEq)]
pub struct ListCursor {
    pub key: Option<i64>,
    pub id: String,
}

impl Pager {
    pub fn new(keys: CursorKeys, scope: Scope) -> Self {
        Pager { keys, scope }
    }

    pub fn history(&self, next: Timestamp) -> String {
        self.keys.seal(HISTORY, &self.scope, &next.0.to_be_bytes())
    }

    pub fn history_from(&self, cursor: &str) -> Option<Timestamp> {
        let payload = self.keys.open(HISTORY, &self.scope, cursor)?;
        Some(Timestamp(i64::from_be_bytes(payload.try_into().ok()?)))
    }

    /// Payload: the tick key's timestamp, log partition and offset,
    /// big-endian (20 bytes).
    pub fn tick(&self, next: TickKey) -> String {
        let mut payload = Vec::with_capacity(20);
        payload.extend_from_slice(&next.ts.0.to_be_bytes());
        payload.extend_from_slice(&next.partition.to_be_bytes());
        payload.extend_from_slice(&next.offset.to_be_bytes());
        self.keys.seal(TICK, &self.scope, &payload)
    }

    pub fn tick_from(&self, cursor: &str) -> Option<TickKey> {
        let payload = self.keys.open(TICK, &self.scope, cursor)?;
        if payload.len() != 20 {
            return None;
        }
        Some(TickKey {
            ts: Timestamp(i64::from_be_bytes(payload[..8].try_into().ok()?)),
            partition: u32::from_be_bytes(payload[8..12].try_into().ok()?),
            offset: u64::from_be_bytes(payload[12..].try_into().ok()?),
        })
    }

    /// Payload: `0 || id` without a sort key, `1 || key || id` with one.
    pub fn list(&self, c: &ListCursor) -> String {
        let mut payload = match c.key {
            None => vec![0],
            Some(k) => [&[1][..], &k.to_be_bytes()].concat(),
        };
        payload.extend_from_slice(c.id.as_bytes());
        self.keys.seal(LIST, &self.scope, &payload)
    }

    pub fn list_after(&self, cursor: &str) -> Option<ListCursor> {
        let payload = self.keys.open(LIST, &self.scope, cursor)?;
        let (key, id) = match payload.split_first()? {
            (0, id) => (None, id),
            (1, rest) if rest.len() >= 8 => {
                let (k, id) = rest.split_at(8);
                (Some(i64::from_be_bytes(k.try_into().ok()?)), id)
            }
            _ => return None,
        };
        Some(ListCursor {
            key,
            id: String::from_utf8(id.to_vec()).ok()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "0123456789abcdef0123456789abcdef";
    const OTHER: &str = "fedcba9876543210fedcba9876543210";

    fn keys(secrets: &[&str]) -> CursorKeys {
        CursorKeys::new(secrets).unwrap()
    }

    fn prices(token: &str, resolution: &str) -> Scope {
        Scope::new("/v1/tokens/{token_id}/prices")
            .with("id", token)
            .with("start_ts", "1756684800000")
            .with("end_ts", "1756771200000")
            .with("resolution", resolution)
    }

    #[test]
    fn tick_cursors_round_trip_and_are_not_bucket_cursors() {
        let pager = Pager::new(keys(&[SECRET]), prices("t1", "tick"));
        let k = TickKey {
            ts: Timestamp(1_756_688_400_123),
            partition: 7,
            offset: u64::MAX - 1,
        };
        let c = pager.tick(k);
        assert_eq!(pager.tick_from(&c), Some(k));
        assert_eq!(pager.history_from(&c), None);
        assert_eq!(pager.tick_from(&pager.history(k.ts)), None);
        let other = Pager::new(keys(&[SECRET]), prices("t2", "tick"));
        assert_eq!(other.tick_from(&c), None);
    }

    #[test]
    fn history_cursors_round_trip_and_refuse_tampering() {
        let pager = Pager::new(keys(&[SECRET]), prices("t1", "1h"));
        let t = Timestamp(1_756_688_400_000);
        let c = pager.history(t);
        assert_eq!(pager.history_from(&c), Some(t));
        // Every single-character edit is refused.
        for i in 2..c.len() {
            let mut forged = c.clone().into_bytes();
            forged[i] = if forged[i] == b'0' { b'1' } else { b'0' };
            let forged = String::from_utf8(forged).unwrap();
            assert_eq!(pager.history_from(&forged), None, "edit at {i}: {forged}");
        }
        for bad in [
            "garbage",
            "",
            "h2",
            "h2zz",
            &c[..c.len() - 1],
            &c[..c.len() - 2],
        ] {
            assert_eq!(pager.history_from(bad), None, "{bad}");
        }
    }

    /// Found by the `cursor` fuzz target: `h1ffffFfff…` (one digit in
    /// uppercase) decoded as the cursor `h1ffffffff…`. A signed cursor would
    /// still verify so (the MAC is over the bytes): hex decodes only as
    /// written.
    #[test]
    fn only_the_exact_text_written_decodes() {
        let pager = Pager::new(keys(&[SECRET]), prices("t1", "1h"));
        let c = pager.history(Timestamp(-1));
        assert!(c.starts_with("h2ffff"), "{c}");
        assert_eq!(pager.history_from(&c), Some(Timestamp(-1)));
        let upper = format!("h2ffffF{}", &c[7..]);
        assert_eq!(pager.history_from(&upper), None, "{upper}");
        let all_upper = c.to_uppercase().replacen('H', "h", 1);
        assert_eq!(pager.history_from(&all_upper), None, "{all_upper}");
        // `+f` is 0x0f to from_str_radix.
        let t = pager.history(Timestamp(15));
        let plus = t.replacen("0f", "+f", 1);
        assert_ne!(plus, t);
        assert_eq!(pager.history_from(&plus), None, "{plus}");
        let list = Pager::new(keys(&[SECRET]), Scope::new("/v1/series"));
        let c = list.list(&ListCursor {
            key: None,
            id: "x".into(),
        });
        assert!(list.list_after(&c).is_some());
        let upper = c.to_uppercase().replacen('L', "l", 1);
        assert_eq!(list.list_after(&upper), None, "{upper}");
    }

    #[test]
    fn a_cursor_is_refused_on_another_token_route_range_or_resolution() {
        let keys = keys(&[SECRET]);
        let t = Timestamp(1_756_688_400_000);
        let c = Pager::new(keys.clone(), prices("t1", "1h")).history(t);
        let elsewhere = [
            prices("t2", "1h"),
            prices("t1", "1m"),
            Scope::new("/v1/tokens/{token_id}/books")
                .with("id", "t1")
                .with("start_ts", "1756684800000")
                .with("end_ts", "1756771200000")
                .with("resolution", "1h"),
            Scope::new("/v1/tokens/{token_id}/prices")
                .with("id", "t1")
                .with("start_ts", "1756684800000")
                .with("end_ts", "1756771200001")
                .with("resolution", "1h"),
            // Parts cannot be shifted between fields.
            Scope::new("/v1/tokens/{token_id}/prices")
                .with("id", "t1")
                .with("start_ts", "1756684800000end_ts")
                .with("", "1756771200000")
                .with("resolution", "1h"),
        ];
        for scope in elsewhere {
            assert_eq!(
                Pager::new(keys.clone(), scope.clone()).history_from(&c),
                None,
                "{scope:?}"
            );
        }
    }

    #[test]
    fn only_the_configured_secrets_verify_and_the_first_signs() {
        let t = Timestamp(1_756_688_400_000);
        let signed = Pager::new(keys(&[SECRET]), prices("t1", "1h")).history(t);
        let other = Pager::new(keys(&[OTHER]), prices("t1", "1h"));
        assert_eq!(other.history_from(&signed), None);
        // Rotation: the new secret signs, the old one still verifies.
        let rotating = Pager::new(keys(&[OTHER, SECRET]), prices("t1", "1h"));
        assert_eq!(rotating.history_from(&signed), Some(t));
        assert_eq!(rotating.history(t), other.history(t));
    }

    #[test]
    fn list_cursors_round_trip_and_are_not_history_cursors() {
        let scope = Scope::new("/v1/markets")
            .with("sort", "updated_at")
            .with("order", "desc");
        let pager = Pager::new(keys(&[SECRET]), scope.clone());
        for c in [
            ListCursor {
                key: Some(42),
                id: "m-1".into(),
            },
            ListCursor {
                key: None,
                id: "x".into(),
            },
            ListCursor {
                key: Some(-1),
                id: String::new(),
            },
        ] {
            let sealed = pager.list(&c);
            assert_eq!(pager.list_after(&sealed), Some(c));
            assert_eq!(pager.history_from(&sealed), None);
        }
        let asc = Pager::new(
            keys(&[SECRET]),
            Scope::new("/v1/markets")
                .with("sort", "updated_at")
                .with("order", "asc"),
        );
        let c = pager.list(&ListCursor {
            key: Some(42),
            id: "m-1".into(),
        });
        assert_eq!(asc.list_after(&c), None);
    }

    #[test]
    fn secrets_must_be_long_enough() {
        assert!(CursorKeys::new::<&str>(&[]).is_err());
        let short = CursorKeys::new(&["too short"]).unwrap_err();
        assert!(short.contains("at least 32"), "{short}");
        assert!(CursorKeys::new(&[SECRET, "short"]).is_err());
    }
}
