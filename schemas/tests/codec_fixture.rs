//! Frozen bytes of every event kind, written by format version 1.
//!
//! The log is the source of truth for years: events written today must decode
//! after any future schema change. `fixtures/events-v1.hex` was produced once
//! and is never regenerated; if this test fails, the change broke old logs —
//! add a new format version in `codec.rs` instead of editing v1.

use hindsight_schemas::codec;
use hindsight_schemas::event::*;
use hindsight_schemas::Timestamp;

fn expected() -> Vec<Event> {
    let ts = Timestamp(1_756_684_830_123);
    vec![
        Event::Price(PriceTick {
            market_id: "m1".into(),
            token_id: "t-yes".into(),
            ts,
            p: 0.42,
        }),
        Event::Book(Box::new(BookSnapshot {
            market_id: "m1".into(),
            token_id: "t-yes".into(),
            ts,
            bids: vec![
                BookLevel {
                    price: 0.41,
                    size: 100.0,
                },
                BookLevel {
                    price: 0.4,
                    size: 7.5,
                },
            ],
            asks: vec![BookLevel {
                price: 0.43,
                size: 50.0,
            }],
        })),
        Event::Metrics(MetricsSample {
            market_id: "m1".into(),
            ts,
            volume: 123_456.78,
            liquidity: 9_876.5,
            spread: 0.02,
        }),
        Event::Series(Box::new(SeriesRecord {
            id: "s1".into(),
            slug: "us-politics".into(),
            title: "US politics".into(),
            tags: vec!["politics".into(), "us".into()],
            status: Some("active".into()),
            start_date: Some(Timestamp(1_754_006_400_000)),
            end_date: None,
            created_at: Timestamp(1_754_006_400_000),
            updated_at: ts,
        })),
        Event::Event(Box::new(EventRecord {
            id: "e1".into(),
            slug: "election-2028".into(),
            series_id: Some("s1".into()),
            title: "Election 2028".into(),
            tags: vec!["politics".into()],
            status: None,
            start_date: None,
            end_date: Some(Timestamp(1_857_000_000_000)),
            created_at: ts,
            updated_at: ts,
        })),
        Event::Market(Box::new(MarketRecord {
            id: "m1".into(),
            slug: "will-it-happen".into(),
            event_id: Some("e1".into()),
            question: Some("Will it happen?".into()),
            description: None,
            status: "closed".into(),
            start_date: Some(Timestamp(1_754_006_400_000)),
            end_date: Some(Timestamp(1_857_000_000_000)),
            closed_at: Some(ts),
            resolved_token_id: Some("t-yes".into()),
            resolved_token_label: Some("Yes".into()),
            tokens: vec![
                Token {
                    id: "t-yes".into(),
                    label: "Yes".into(),
                },
                Token {
                    id: "t-no".into(),
                    label: "No".into(),
                },
            ],
            created_at: Timestamp(1_754_006_400_000),
            updated_at: ts,
        })),
        // Added with the trade kind (tag 7); the lines above are unchanged.
        Event::Trade(Box::new(Trade {
            market_id: "m1".into(),
            token_id: "t-yes".into(),
            ts,
            price: 0.42,
            size: 150.0,
            side: TradeSide::Buy,
            trade_id: Some("0xabc-7".into()),
        })),
    ]
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
fn frozen_v1_bytes_of_every_kind_still_decode() {
    let fixture = include_str!("fixtures/events-v1.hex");
    let lines: Vec<&str> = fixture.lines().filter(|l| !l.starts_with('#')).collect();
    let want = expected();
    assert_eq!(lines.len(), want.len(), "one fixture line per event kind");
    for (line, want) in lines.iter().zip(&want) {
        let (kind, bytes) = line.split_once(' ').unwrap();
        assert_eq!(kind, want.kind().as_str());
        let decoded = codec::decode(&unhex(bytes)).unwrap_or_else(|e| panic!("{kind}: {e}"));
        assert_eq!(&decoded, want, "{kind} decodes to its frozen value");
    }
}

#[test]
fn current_encoder_still_writes_v1_bytes() {
    // While FORMAT_VERSION is 1, the encoder must write exactly the frozen
    // bytes; a silent change of body layout would strand old logs.
    let fixture = include_str!("fixtures/events-v1.hex");
    let lines: Vec<&str> = fixture.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(lines.len(), expected().len(), "one fixture line per kind");
    for (line, event) in lines.iter().zip(expected()) {
        let (_, bytes) = line.split_once(' ').unwrap();
        assert_eq!(
            hex(&codec::encode(&event)),
            *bytes,
            "{}",
            event.kind().as_str()
        );
    }
}
