//! A log batch packed before zstd (codec 2, `Codec::Packed`): each price
//! tick as the index of its ids in the batch, its time as a delta and its
//! price as a decimal; every other event as its envelope.
//!
//! Why: a price tick is nearly every event a log holds, and its envelope
//! (~33 bytes and a 4-byte length) is mostly its two ids, a full
//! timestamp and the f64 of its price, which zstd then read and matched
//! byte by byte. Packed, a tick takes ~5 bytes before compression, so zstd
//! reads a sixth of what it read, and the log is smaller too (see
//! docs/DESIGN.md, "Embedded log"). Nothing of an event is lost: decoding
//! gives back every field bit for bit (`tests` below, over every kind of
//! event and awkward prices), and envelopes stay the log's format for
//! every other kind and for Kafka.
//!
//! ```text
//! per event, in offset order, a tag byte, then:
//!   0      an envelope: its length (varint), then its bytes
//!            (hindsight_schemas::codec)
//!   1..=16 a price tick whose price is the decimal m / 10^(tag - 1),
//!   17     a price tick whose price is the f64 (8 bytes LE) at the end:
//!            the pair of its ids (varint index into the batch's pairs; the
//!            next index brings a new pair: market id, token id, each a
//!            length and its bytes), its time in ms minus the batch's
//!            previous price tick's (0 before the first), then m (varint)
//!            or the f64
//! ```
//! Varints are LEB128 of the zigzag mapping (`rowcodec::put_zigzag`).

use crate::decimal;
use crate::rowcodec::{put_f64, put_zigzag, Reader};
use crate::{Error, Result};
use hindsight_contracts::Delivered;
use hindsight_schemas::{codec, Event, PriceTick, Timestamp};
use rustc_hash::FxHashMap;

const ENVELOPE: u8 = 0;
/// A decimal price at scale `k` is tag `DECIMAL + k`.
const DECIMAL: u8 = 1;
const BITS: u8 = DECIMAL + decimal::MAX_SCALE + 1;

/// Appends the packed payload of `events` to `out`.
pub(super) fn encode<'e>(events: impl Iterator<Item = &'e Event>, out: &mut Vec<u8>) {
    // Each token's latest pair (its index and market): a token is quoted
    // under one market, and a tick under another market than its pair's
    // gets a pair of its own.
    let mut pair_of: FxHashMap<&str, (u32, &str)> = FxHashMap::default();
    let mut pairs = 0u32;
    let mut last_ts = 0i64;
    // The scale of the last decimal price, tried first: a market's prices
    // share one.
    let mut scale = 0u8;
    let mut envelope = Vec::new();
    for event in events {
        let Event::Price(t) = event else {
            envelope.clear();
            codec::encode_into(event, &mut envelope);
            out.push(ENVELOPE);
            put_zigzag(out, envelope.len() as i64);
            out.extend_from_slice(&envelope);
            continue;
        };
        let k = match decimal::mantissa(t.p, scale) {
            Some(m) => Some((scale, m)),
            None => {
                (0..=decimal::MAX_SCALE).find_map(|k| decimal::mantissa(t.p, k).map(|m| (k, m)))
            }
        };
        out.push(k.map_or(BITS, |(k, _)| DECIMAL + k));
        match pair_of.get(t.token_id.as_str()) {
            Some(&(i, market)) if market == t.market_id => put_zigzag(out, i64::from(i)),
            _ => {
                put_zigzag(out, i64::from(pairs));
                for id in [&t.market_id, &t.token_id] {
                    put_zigzag(out, id.len() as i64);
                    out.extend_from_slice(id.as_bytes());
                }
                pair_of.insert(&t.token_id, (pairs, &t.market_id));
                pairs += 1;
            }
        }
        put_zigzag(out, t.ts.0.wrapping_sub(last_ts));
        last_ts = t.ts.0;
        match k {
            Some((k, m)) => {
                scale = k;
                put_zigzag(out, m);
            }
            None => put_f64(out, t.p),
        }
    }
}

/// Decodes the events of a packed batch at `first..first + count` from
/// `from` on into `out`, until it holds `max`. An envelope that does not
/// decode is skipped as [`super::push_envelope`] says; a payload that
/// breaks the layout is [`Error::Corrupt`].
pub(super) fn decode(
    first: u64,
    count: u64,
    payload: &[u8],
    from: u64,
    max: usize,
    out: &mut Vec<Delivered>,
) -> Result<()> {
    let mut r = Reader::new(payload, "packed log batch");
    let mut pairs: Vec<(&str, &str)> = Vec::new();
    let mut last_ts = 0i64;
    let at = |i: u64, e: Error| Error::Corrupt(format!("log batch at {first}, event {i}: {e}"));
    for i in first..first + count {
        if out.len() >= max {
            break;
        }
        let tag = r.byte().map_err(|e| at(i, e))?;
        if tag == ENVELOPE {
            let bytes = bytes(&mut r).map_err(|e| at(i, e))?;
            if i >= from {
                super::push_envelope(i, bytes, out);
            }
            continue;
        }
        let tick = tick(&mut r, tag, &mut pairs, &mut last_ts).map_err(|e| at(i, e))?;
        if i >= from {
            let (market_id, token_id, ts, p) = tick;
            out.push(Delivered {
                position: hindsight_contracts::Position {
                    partition: 0,
                    offset: i,
                },
                event: Event::Price(PriceTick {
                    market_id: market_id.to_owned(),
                    token_id: token_id.to_owned(),
                    ts: Timestamp(ts),
                    p,
                }),
            });
        }
    }
    Ok(())
}

/// A price tick after its tag: its ids, time and price.
fn tick<'a>(
    r: &mut Reader<'a>,
    tag: u8,
    pairs: &mut Vec<(&'a str, &'a str)>,
    last_ts: &mut i64,
) -> Result<(&'a str, &'a str, i64, f64)> {
    let i = r.zigzag()?;
    let (market_id, token_id) = match usize::try_from(i) {
        Ok(i) if i < pairs.len() => pairs[i],
        Ok(i) if i == pairs.len() => {
            let pair = (id(r)?, id(r)?);
            pairs.push(pair);
            pair
        }
        _ => return Err(r.corrupt(format_args!("ids pair {i} of {}", pairs.len()))),
    };
    let ts = last_ts.wrapping_add(r.zigzag()?);
    *last_ts = ts;
    let p = match tag {
        BITS => r.f64()?,
        t if t > BITS => return Err(r.corrupt(format_args!("tag {t}"))),
        t => decimal::value(r.zigzag()?, t - DECIMAL),
    };
    Ok((market_id, token_id, ts, p))
}

/// A length, then that many bytes.
fn bytes<'a>(r: &mut Reader<'a>) -> Result<&'a [u8]> {
    let n = r.zigzag()?;
    let n = usize::try_from(n).map_err(|_| r.corrupt(format_args!("length {n}")))?;
    r.take(n)
}

/// An id: a length, then its UTF-8.
fn id<'a>(r: &mut Reader<'a>) -> Result<&'a str> {
    let b = bytes(r)?;
    std::str::from_utf8(b).map_err(|e| r.corrupt(format_args!("id: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hindsight_schemas::{BookLevel, BookSnapshot, MarketRecord, MetricsSample, Token};

    /// A deterministic stream of numbers (splitmix64), so a failure names
    /// its seed.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// Prices a feed sends and the awkward ones: every f64 must come back
    /// with its bits.
    fn price(rng: &mut Rng) -> f64 {
        match rng.below(12) {
            0 => -0.0,
            1 => f64::NAN,
            2 => f64::from_bits(rng.next()),
            3 => 1.0 / 3.0,
            4 => f64::MIN_POSITIVE / 2.0,
            5 => 1e300,
            6 => rng.below(1000) as f64 / 1000.0 + 1e-9,
            7 => -(rng.below(100) as f64) / 100.0,
            8 => rng.below(10_000_000) as f64 / 10_000_000.0,
            _ => rng.below(100) as f64 / 100.0,
        }
    }

    fn events(rng: &mut Rng, n: usize) -> Vec<Event> {
        let ids = ["m0", "m1", "märket-2", ""];
        let mut ts = rng.next() as i64 >> rng.below(64);
        (0..n)
            .map(|_| {
                let market = ids[rng.below(4) as usize].to_string();
                let token = format!("{market}-t{}", rng.below(3));
                ts = match rng.below(5) {
                    0 => rng.next() as i64,
                    1 => ts.wrapping_sub(rng.below(10_000) as i64),
                    _ => ts.wrapping_add(rng.below(2_000) as i64),
                };
                let at = Timestamp(ts);
                match rng.below(10) {
                    0 => Event::Book(Box::new(BookSnapshot {
                        market_id: market,
                        token_id: token,
                        ts: at,
                        bids: vec![BookLevel {
                            price: price(rng),
                            size: 2.0,
                        }],
                        asks: vec![],
                    })),
                    1 => Event::Metrics(MetricsSample {
                        market_id: market,
                        ts: at,
                        volume: price(rng),
                        liquidity: 1.0,
                        spread: 0.01,
                    }),
                    2 => Event::Market(Box::new(MarketRecord {
                        id: market.clone(),
                        slug: format!("{market}-slug"),
                        event_id: None,
                        question: Some("?".into()),
                        description: None,
                        status: "open".into(),
                        start_date: None,
                        end_date: Some(at),
                        closed_at: None,
                        resolved_token_id: None,
                        resolved_token_label: None,
                        tokens: vec![Token {
                            id: token,
                            label: "Yes".into(),
                        }],
                        created_at: at,
                        updated_at: at,
                    })),
                    // A token under another market than its first.
                    3 => Event::Price(PriceTick {
                        market_id: "elsewhere".into(),
                        token_id: token,
                        ts: at,
                        p: price(rng),
                    }),
                    _ => Event::Price(PriceTick {
                        market_id: market,
                        token_id: token,
                        ts: at,
                        p: price(rng),
                    }),
                }
            })
            .collect()
    }

    /// Events compare by their envelopes: bit for bit, NaN included.
    fn envelopes(events: impl Iterator<Item = Event>) -> Vec<Vec<u8>> {
        events.map(|e| codec::encode(&e)).collect()
    }

    #[test]
    fn every_event_comes_back_bit_for_bit_from_any_offset() {
        for seed in 0..300 {
            let rng = &mut Rng(seed);
            let n = rng.below(200) as usize;
            let batch = events(rng, n);
            let mut payload = Vec::new();
            encode(batch.iter(), &mut payload);
            let first = 1_000 + seed;
            let from = first + rng.below(n as u64 + 1);
            let max = rng.below(n as u64 + 2) as usize;
            let mut out = Vec::new();
            decode(first, n as u64, &payload, from, max, &mut out).unwrap();
            let skip = (from - first) as usize;
            let want: Vec<_> = batch.into_iter().skip(skip).take(max).collect();
            let offsets: Vec<u64> = out.iter().map(|d| d.position.offset).collect();
            let want_offsets: Vec<u64> = (from..).take(want.len()).collect();
            assert_eq!(offsets, want_offsets, "seed {seed}");
            assert_eq!(
                envelopes(out.into_iter().map(|d| d.event)),
                envelopes(want.into_iter()),
                "seed {seed}"
            );
        }
    }

    #[test]
    fn a_tick_of_decimal_price_packs_to_a_few_bytes() {
        let tick = |i: i64, p: f64| {
            Event::Price(PriceTick {
                market_id: "0x1234".into(),
                token_id: "0x5678".into(),
                ts: Timestamp(1_756_684_800_000 + i * 1000),
                p,
            })
        };
        let batch: Vec<Event> = (0..1000)
            .map(|i| tick(i, (250 + i) as f64 / 1000.0))
            .collect();
        let mut payload = Vec::new();
        encode(batch.iter(), &mut payload);
        // Tag, pair, time delta (1000 ms: two bytes), price (~two bytes).
        assert!(payload.len() < 1000 * 6 + 32, "{} bytes", payload.len());
    }

    /// A batch as this codec first wrote it: the log keeps batches for
    /// years, so these bytes must decode to these events whatever changes.
    #[test]
    fn a_frozen_payload_still_decodes() {
        let tick = |market: &str, token: &str, ts: i64, p: f64| {
            Event::Price(PriceTick {
                market_id: market.into(),
                token_id: token.into(),
                ts: Timestamp(ts),
                p,
            })
        };
        let batch = vec![
            tick("m1", "t1", 1_756_684_800_000, 0.25),
            tick("m1", "t2", 1_756_684_800_000, 0.75),
            tick("m1", "t1", 1_756_684_801_500, 0.251),
            Event::Metrics(MetricsSample {
                market_id: "m1".into(),
                ts: Timestamp(1_756_684_802_000),
                volume: 10.0,
                liquidity: 2.5,
                spread: 0.01,
            }),
            tick("m2", "t1", 1_756_684_799_000, 1.0 / 3.0),
        ];
        let mut encoded = Vec::new();
        encode(batch.iter(), &mut encoded);
        let hex: String = encoded.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, FROZEN, "the encoder changed its bytes");
        let payload: Vec<u8> = (0..FROZEN.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&FROZEN[i..i + 2], 16).unwrap())
            .collect();
        let mut out = Vec::new();
        decode(0, batch.len() as u64, &payload, 0, usize::MAX, &mut out).unwrap();
        let got: Vec<Event> = out.into_iter().map(|d| d.event).collect();
        assert_eq!(got, batch);
    }

    const FROZEN: &str = "0300046d3104743180c096a9a066320302046d310474320096010400b817f603004c0103026d31fda0af250532030000000000000000244000000000000004407b14ae47e17a843f1104046d320474318727555555555555d53f";

    #[test]
    fn a_payload_that_breaks_the_layout_is_corrupt_not_a_panic() {
        let rng = &mut Rng(7);
        let batch = events(rng, 50);
        let mut payload = Vec::new();
        encode(batch.iter(), &mut payload);
        for cut in 0..payload.len() {
            let mut out = Vec::new();
            // Cut short, every read of it either fails or stops short.
            let _ = decode(0, 50, &payload[..cut], 0, usize::MAX, &mut out);
            assert!(out.len() < 50, "cut at {cut}");
        }
        // Any bytes at all: an answer, never a panic or a runaway read.
        let rng = &mut Rng(11);
        for _ in 0..20_000 {
            let len = rng.below(64) as usize;
            let bytes: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            let mut out = Vec::new();
            let _ = decode(0, 8, &bytes, rng.below(8), usize::MAX, &mut out);
            assert!(out.len() <= 8);
        }
        for (at, byte) in [(0, 200u8), (0, BITS + 1)] {
            let mut bad = payload.clone();
            bad[at] = byte;
            let err = decode(0, 50, &bad, 0, usize::MAX, &mut Vec::new()).unwrap_err();
            assert!(err.to_string().contains("log batch at 0, event 0"), "{err}");
        }
    }
}
