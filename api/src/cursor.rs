//! Opaque history cursors: the next bucket start, with a check value so a
//! damaged or hand-made cursor is refused (400 "Invalid pagination cursor")
//! rather than silently read as another position.

use hindsight_schemas::Timestamp;
use sha2::{Digest, Sha256};

const CONTEXT: &[u8] = b"hindsight history cursor v1";

fn check(payload: &[u8]) -> [u8; 4] {
    let digest = Sha256::new()
        .chain_update(CONTEXT)
        .chain_update(payload)
        .finalize();
    [digest[0], digest[1], digest[2], digest[3]]
}

pub fn encode(next: Timestamp) -> String {
    let payload = next.0.to_be_bytes();
    let mut out = String::from("h1");
    for b in payload.iter().chain(check(&payload).iter()) {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

pub fn decode(cursor: &str) -> Option<Timestamp> {
    let hex = cursor.strip_prefix("h1")?;
    if hex.len() != 24 || !hex.is_ascii() {
        return None;
    }
    let bytes: Vec<u8> = (0..12)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok())
        .collect::<Option<_>>()?;
    let (payload, sum) = bytes.split_at(8);
    (check(payload) == sum).then(|| Timestamp(i64::from_be_bytes(payload.try_into().unwrap())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_tampering() {
        let t = Timestamp(1_756_684_800_000);
        let c = encode(t);
        assert_eq!(decode(&c), Some(t));
        let mut forged = c.clone().into_bytes();
        forged[10] = if forged[10] == b'0' { b'1' } else { b'0' };
        assert_eq!(decode(std::str::from_utf8(&forged).unwrap()), None);
        assert_eq!(decode("garbage"), None);
        assert_eq!(decode(""), None);
    }
}
