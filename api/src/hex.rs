//! Lowercase hex, the spelling of every token the API hands out: keys,
//! key ids, cursors, CSRF tokens.

/// `bytes` as lowercase hex, two digits a byte.
///
/// Why not `format!("{b:02x}")` per byte: that allocated a string per
/// byte, 24 for a history page's next cursor (its 8-byte position and
/// 16-byte tag; `perf`: 1.5 % of a cache-missed page).
pub fn encode(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(2 * bytes.len());
    for &b in bytes {
        text.push(DIGITS[usize::from(b >> 4)] as char);
        text.push(DIGITS[usize::from(b & 0xf)] as char);
    }
    text
}

/// The inverse of [`encode`], and only of it: pairs of lowercase digits.
/// Where a MAC authenticates the bytes, this makes the text one-to-one
/// with them, so only the exact text the API wrote is accepted, never
/// another spelling of its bytes (`FF` or `+f` for `ff` or `0f`, as
/// `from_str_radix` would take).
pub fn decode(text: &str) -> Option<Vec<u8>> {
    let digit = |b: u8| match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        _ => None,
    };
    let pairs = text.as_bytes().chunks_exact(2);
    if !pairs.remainder().is_empty() {
        return None;
    }
    pairs
        .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_as_format_does_and_decodes_only_its_own_spelling() {
        let bytes: Vec<u8> = (0..=255).collect();
        let text = encode(&bytes);
        let formatted: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(text, formatted);
        assert_eq!(decode(&text), Some(bytes));
        assert_eq!(decode(""), Some(vec![]));
        for other in ["FF", "+f", "0", "0g", "f f"] {
            assert_eq!(decode(other), None, "{other}");
        }
    }
}
