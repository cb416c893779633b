//! The versioned envelope around `bincode` bodies that the event log stores.
//!
//! ```text
//! byte 0      format version (currently 1)
//! byte 1      event kind tag (EventKind as u8)
//! bytes 2..   bincode 2.0.1 body, standard config (varint integers)
//! ```
//!
//! The raw events in the log are the source of truth and live for years, so
//! every version ever written must stay decodable. `bincode` is unmaintained
//! and pinned to 2.0.1; keeping it behind this module means a future switch of
//! body format is a new version number here and nothing anywhere else.
//! `schemas/tests/codec_fixture.rs` decodes frozen bytes of every kind.

use crate::event::*;
use bincode::config::{self, Configuration, LittleEndian, Varint};

/// The version [`encode`] writes.
pub const FORMAT_VERSION: u8 = 1;

const CONFIG: Configuration = config::standard();

/// Most bytes the strings and lists of one body may claim while it is
/// decoded. bincode allocates a string or list as long as its length prefix
/// says before reading any of it: without a limit, a damaged prefix
/// (2^45, say) is an allocation failure that aborts the process — a
/// projector meeting a corrupt record would die on it at every restart
/// instead of counting and skipping it. 1 GiB is far above any valid
/// event: a list claims at most 48 bytes per item, so with the default
/// 64 MiB ingest body no event claims more than about 150 MB. Limits
/// change no byte of the format.
pub const DECODE_LIMIT: usize = 1 << 30;

const DECODE_CONFIG: Configuration<LittleEndian, Varint, config::Limit<DECODE_LIMIT>> =
    CONFIG.with_limit::<DECODE_LIMIT>();

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum DecodeError {
    #[error("empty or truncated envelope")]
    Truncated,
    #[error("unknown envelope format version {0}")]
    UnknownVersion(u8),
    #[error("unknown event kind tag {0}")]
    UnknownKind(u8),
    #[error("corrupt {kind} body: {reason}")]
    Body { kind: &'static str, reason: String },
}

/// Appends the envelope of `event` to `buf`.
pub fn encode_into(event: &Event, buf: &mut Vec<u8>) {
    buf.push(FORMAT_VERSION);
    buf.push(event.kind() as u8);
    let written = match event {
        Event::Price(e) => bincode::encode_into_std_write(e, buf, CONFIG),
        Event::Book(e) => bincode::encode_into_std_write(e, buf, CONFIG),
        Event::Metrics(e) => bincode::encode_into_std_write(e, buf, CONFIG),
        Event::Series(e) => bincode::encode_into_std_write(e, buf, CONFIG),
        Event::Event(e) => bincode::encode_into_std_write(e, buf, CONFIG),
        Event::Market(e) => bincode::encode_into_std_write(e, buf, CONFIG),
        Event::Trade(e) => bincode::encode_into_std_write(e, buf, CONFIG),
    };
    // Writing plain structs into a Vec cannot fail.
    written.expect("bincode encoding into a Vec is infallible");
}

pub fn encode(event: &Event) -> Vec<u8> {
    let mut buf = Vec::with_capacity(64);
    encode_into(event, &mut buf);
    buf
}

pub fn decode(bytes: &[u8]) -> Result<Event, DecodeError> {
    let [version, tag, body @ ..] = bytes else {
        return Err(DecodeError::Truncated);
    };
    if *version != FORMAT_VERSION {
        return Err(DecodeError::UnknownVersion(*version));
    }
    let kind = EventKind::from_tag(*tag).ok_or(DecodeError::UnknownKind(*tag))?;
    Ok(match kind {
        EventKind::Price => Event::Price(body_v1(kind, body)?),
        EventKind::Book => Event::Book(body_v1(kind, body)?),
        EventKind::Metrics => Event::Metrics(body_v1(kind, body)?),
        EventKind::Series => Event::Series(body_v1(kind, body)?),
        EventKind::Event => Event::Event(body_v1(kind, body)?),
        EventKind::Market => Event::Market(body_v1(kind, body)?),
        EventKind::Trade => Event::Trade(body_v1(kind, body)?),
    })
}

fn body_v1<T: bincode::Decode<()>>(kind: EventKind, body: &[u8]) -> Result<T, DecodeError> {
    let corrupt = |reason: String| DecodeError::Body {
        kind: kind.as_str(),
        reason,
    };
    let (value, used) =
        bincode::decode_from_slice(body, DECODE_CONFIG).map_err(|e| corrupt(e.to_string()))?;
    if used != body.len() {
        return Err(corrupt(format!("{} trailing bytes", body.len() - used)));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Timestamp;

    #[test]
    fn round_trips_and_refuses_damage() {
        let e = Event::Price(PriceTick {
            market_id: "m1".into(),
            token_id: "t1".into(),
            ts: Timestamp(1_756_684_830_000),
            p: 0.42,
        });
        let bytes = encode(&e);
        assert_eq!(decode(&bytes), Ok(e));
        assert_eq!(decode(&[]), Err(DecodeError::Truncated));
        assert_eq!(decode(&[9, 1, 0]), Err(DecodeError::UnknownVersion(9)));
        assert_eq!(decode(&[1, 99, 0]), Err(DecodeError::UnknownKind(99)));
        assert!(matches!(
            decode(&bytes[..bytes.len() - 1]),
            Err(DecodeError::Body { .. })
        ));
        let mut long = bytes.clone();
        long.push(0);
        assert!(matches!(decode(&long), Err(DecodeError::Body { .. })));
    }

    /// Found by the `envelope` fuzz target: a book whose second string
    /// length prefix reads 56 TB made bincode allocate it, and the process
    /// abort.
    #[test]
    fn a_huge_length_prefix_is_a_decode_error_not_an_allocation() {
        let crash = [
            1, 2, 2, 109, 49, 5, 1, 116, 45, 121, 101, 115, 253, 86, 139, 38, 5, 50, 3, 0, 0, 2,
            61, 10, 215, 163, 112, 61, 218, 63, 0, 0, 0, 0, 0, 0, 89, 64, 154, 153, 153, 153, 153,
            153, 217, 63, 0, 0, 0, 0, 0, 0, 32, 32, 32, 32, 32, 4, 1, 32, 32, 32, 32, 32, 32, 226,
        ];
        assert!(matches!(decode(&crash), Err(DecodeError::Body { .. })));
        // A string claiming u64::MAX bytes, and a list of u64::MAX levels
        // (varint 253: a u64 follows).
        let mut string = vec![FORMAT_VERSION, EventKind::Price as u8, 253];
        string.extend_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(decode(&string), Err(DecodeError::Body { .. })));
        let mut levels = vec![
            FORMAT_VERSION,
            EventKind::Book as u8,
            1,
            b'm',
            1,
            b't',
            0,
            253,
        ];
        levels.extend_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(decode(&levels), Err(DecodeError::Body { .. })));
    }

    #[test]
    fn the_decode_limit_leaves_room_for_the_largest_valid_events() {
        let token = |i: usize| Token {
            id: format!("token-{i}"),
            label: format!("label-{i}"),
        };
        // 500 000 tokens: a market record far beyond real ones, whose
        // token list claims 24 MB.
        let market = Event::Market(Box::new(MarketRecord {
            id: "m".into(),
            slug: "m".into(),
            event_id: None,
            question: None,
            description: Some("d".repeat(crate::wire::MAX_TEXT_LEN)),
            status: "open".into(),
            start_date: None,
            end_date: None,
            closed_at: None,
            resolved_token_id: None,
            resolved_token_label: None,
            tokens: (0..500_000).map(token).collect(),
            created_at: Timestamp(0),
            updated_at: Timestamp(0),
        }));
        assert_eq!(decode(&encode(&market)), Ok(market));
    }
}
