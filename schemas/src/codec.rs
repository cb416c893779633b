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
use bincode::config::{self, Configuration};

/// The version [`encode`] writes.
pub const FORMAT_VERSION: u8 = 1;

const CONFIG: Configuration = config::standard();

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
    })
}

fn body_v1<T: bincode::Decode<()>>(kind: EventKind, body: &[u8]) -> Result<T, DecodeError> {
    let corrupt = |reason: String| DecodeError::Body {
        kind: kind.as_str(),
        reason,
    };
    let (value, used) =
        bincode::decode_from_slice(body, CONFIG).map_err(|e| corrupt(e.to_string()))?;
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
}
