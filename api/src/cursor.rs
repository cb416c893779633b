//! Opaque pagination cursors.
//!
//! - History: the next bucket start.
//! - Lists: the sort position `(key, id)` of the last item of the page, with
//!   the list, sort field and order it belongs to.
//!
//! Both carry a check value, so a damaged or hand-edited cursor, or one from
//! another list or sort, is refused with 400 "Invalid pagination cursor"
//! rather than read as some other position.

use hindsight_schemas::Timestamp;
use sha2::{Digest, Sha256};

fn check(kind: &[u8], payload: &[u8]) -> [u8; 4] {
    let digest = Sha256::new()
        .chain_update(b"hindsight cursor v1\0")
        .chain_update(kind)
        .chain_update(payload)
        .finalize();
    [digest[0], digest[1], digest[2], digest[3]]
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The inverse of [`hex`], and only of it: lowercase digits. (`from_str_radix`
/// alone also takes `A`-`F` and a `+` sign, so `+f` or `FF` would spell the
/// same cursor as `0f` or `ff`: an edited cursor accepted.)
fn unhex(text: &str) -> Option<Vec<u8>> {
    let lower_hex = |b: u8| b.is_ascii_digit() || (b'a'..=b'f').contains(&b);
    if !text.len().is_multiple_of(2) || !text.bytes().all(lower_hex) {
        return None;
    }
    (0..text.len() / 2)
        .map(|i| u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok())
        .collect()
}

/// `prefix` + hex(payload) + hex(check(prefix, payload)).
fn seal(prefix: &str, payload: &[u8]) -> String {
    format!(
        "{prefix}{}{}",
        hex(payload),
        hex(&check(prefix.as_bytes(), payload))
    )
}

fn open(prefix: &str, cursor: &str) -> Option<Vec<u8>> {
    let bytes = unhex(cursor.strip_prefix(prefix)?)?;
    let (payload, sum) = bytes.split_at(bytes.len().checked_sub(4)?);
    (check(prefix.as_bytes(), payload) == sum).then(|| payload.to_vec())
}

pub fn encode_history(next: Timestamp) -> String {
    seal("h1", &next.0.to_be_bytes())
}

pub fn decode_history(cursor: &str) -> Option<Timestamp> {
    let payload = open("h1", cursor)?;
    Some(Timestamp(i64::from_be_bytes(payload.try_into().ok()?)))
}

/// Where a list page ended.
#[derive(Debug, Clone, PartialEq)]
pub struct ListCursor {
    pub key: Option<i64>,
    pub id: String,
}

/// `scope` names the list, sort field and order (e.g. `markets:updated_at:desc`).
pub fn encode_list(scope: &str, c: &ListCursor) -> String {
    let payload = serde_json::json!({ "s": scope, "k": c.key, "i": c.id });
    seal("l1", payload.to_string().as_bytes())
}

pub fn decode_list(scope: &str, cursor: &str) -> Option<ListCursor> {
    let payload = open("l1", cursor)?;
    let v: serde_json::Value = serde_json::from_slice(&payload).ok()?;
    if v["s"] != scope {
        return None;
    }
    let key = match &v["k"] {
        serde_json::Value::Null => None,
        k => Some(k.as_i64()?),
    };
    Some(ListCursor {
        key,
        id: v["i"].as_str()?.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_cursors_round_trip_and_refuse_tampering() {
        let t = Timestamp(1_756_684_800_000);
        let c = encode_history(t);
        assert_eq!(decode_history(&c), Some(t));
        let mut forged = c.clone().into_bytes();
        forged[10] = if forged[10] == b'0' { b'1' } else { b'0' };
        assert_eq!(decode_history(std::str::from_utf8(&forged).unwrap()), None);
        for bad in ["garbage", "", "h1", "h1zz", &c[..c.len() - 1]] {
            assert_eq!(decode_history(bad), None, "{bad}");
        }
    }

    /// Found by the `cursor` fuzz target: `h1ffffFfff…` (one digit in
    /// uppercase) decoded as the cursor `h1ffffffff…`.
    #[test]
    fn only_the_exact_text_written_decodes() {
        let c = encode_history(Timestamp(-1));
        assert!(c.starts_with("h1ffff"), "{c}");
        assert_eq!(decode_history(&c), Some(Timestamp(-1)));
        let upper = format!("h1ffffF{}", &c[7..]);
        assert_eq!(decode_history(&upper), None, "{upper}");
        assert_eq!(
            decode_history(&c.to_uppercase().replacen("H", "h", 1)),
            None
        );
        // `+f` is 0x0f to from_str_radix.
        let t = encode_history(Timestamp(15));
        let plus = t.replacen("0f", "+f", 1);
        assert_ne!(plus, t);
        assert_eq!(decode_history(&plus), None, "{plus}");
        let list = encode_list(
            "s",
            &ListCursor {
                key: None,
                id: "x".into(),
            },
        );
        assert_eq!(
            decode_list("s", &list.to_uppercase().replacen("L", "l", 1)),
            None
        );
    }

    #[test]
    fn list_cursors_are_bound_to_their_list_and_sort() {
        let c = ListCursor {
            key: Some(42),
            id: "m-1".into(),
        };
        let s = encode_list("markets:updated_at:desc", &c);
        assert_eq!(decode_list("markets:updated_at:desc", &s), Some(c));
        assert_eq!(decode_list("markets:updated_at:asc", &s), None);
        assert_eq!(decode_list("series:updated_at:desc", &s), None);
        let null = ListCursor {
            key: None,
            id: "x".into(),
        };
        assert_eq!(decode_list("e", &encode_list("e", &null)), Some(null));
        assert_eq!(decode_history(&s), None);
    }
}
