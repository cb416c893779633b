//! The `v` column of `price_buckets`: a bucket's sum and candle in a few
//! bytes (store schema 6).
//!
//! Most buckets of a long-tail market hold one tick, and then the sum, the
//! open, the close, the high and the low are all that tick: eight columns
//! of the same value. The blob stores them once. Times are stored relative
//! to the bucket's start and offsets relative to the row's `last_offset`
//! (both in the row's key and columns), as zigzag varints: small numbers
//! in a byte or four, and any value (even a mark after `last_offset` or
//! outside its bucket, which the projector never writes) round-trips.
//!
//! Layout, after a tag byte:
//! - `0` (no candle: a row migrated from before schema 5): `sum` (f64).
//! - `1` (one tick: sum = open = close = high = low = `p`): `p` (f64),
//!   `ts - bucket`, `last_offset - offset`.
//! - `2` (full): `sum` (f64), the open and the close as
//!   `ts - bucket`, `last_offset - offset`, `p` (f64), then `high`, `low`.
//! - `3` and `4`: `1` and `2` with every price (not the sum, which is
//!   rarely one) a decimal at one scale ([`crate::decimal`]): the scale
//!   byte `k` after the tag (after the sum for `4`), then each price as
//!   its integer `m`, a zigzag varint, where `1` and `2` have the f64 —
//!   a one-tick bucket in ~8 bytes instead of ~13.
//!
//! f64s are little-endian bits, so every value round-trips exactly. The
//! encoding is canonical — equal values give equal bytes (tag 1 or 3
//! exactly when the values are one tick's, bit for bit; 3 and 4 exactly
//! when the prices are decimals, at their least scale) — so an
//! incrementally projected store and a rebuilt one compare equal byte by
//! byte. [`sum`] reads the sum without decoding marks.

use crate::decimal;
use crate::{Error, Result};
use hindsight_contracts::{Candle, Mark};
use hindsight_schemas::Timestamp;

const NO_CANDLE: u8 = 0;
const ONE_TICK: u8 = 1;
const FULL: u8 = 2;
const DECIMAL_ONE_TICK: u8 = 3;
const DECIMAL_FULL: u8 = 4;

/// The blob of a price bucket starting at `bucket` (Unix ms) whose last
/// folded event is at `last_offset`.
pub(crate) fn encode(sum: f64, candle: Option<&Candle>, bucket: i64, last_offset: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(16);
    encode_into(&mut out, sum, candle, bucket, last_offset);
    out
}

/// [`encode`], appended to `out`: a step encodes its rows into one buffer.
pub(crate) fn encode_into(
    out: &mut Vec<u8>,
    sum: f64,
    candle: Option<&Candle>,
    bucket: i64,
    last_offset: u64,
) {
    let Some(c) = candle else {
        out.push(NO_CANDLE);
        put_f64(out, sum);
        return;
    };
    let p = c.open.p.to_bits();
    let one_tick = c.open.ts == c.close.ts
        && c.open.offset == c.close.offset
        && [c.close.p, c.high, c.low, sum]
            .iter()
            .all(|v| v.to_bits() == p);
    let prices = [c.open.p, c.close.p, c.high, c.low];
    let scale = decimal::scale(prices[..if one_tick { 1 } else { 4 }].iter().copied());
    // A price in the layout the tag says: its f64, or its decimal integer.
    let put_price = |out: &mut Vec<u8>, p: f64| match scale {
        Some(k) => put_zigzag(out, decimal::mantissa(p, k).expect("scale checked it")),
        None => put_f64(out, p),
    };
    if one_tick {
        match scale {
            Some(k) => out.extend_from_slice(&[DECIMAL_ONE_TICK, k]),
            None => out.push(ONE_TICK),
        }
        put_price(out, c.open.p);
        put_mark_position(out, &c.open, bucket, last_offset);
    } else {
        out.push(if scale.is_some() { DECIMAL_FULL } else { FULL });
        put_f64(out, sum);
        if let Some(k) = scale {
            out.push(k);
        }
        for m in [&c.open, &c.close] {
            put_mark_position(out, m, bucket, last_offset);
            put_price(out, m.p);
        }
        put_price(out, c.high);
        put_price(out, c.low);
    }
}

/// The sum and candle [`encode`] packed; a malformed blob is
/// [`Error::Corrupt`].
pub(crate) fn decode(v: &[u8], bucket: i64, last_offset: u64) -> Result<(f64, Option<Candle>)> {
    let mut r = Reader::new(v, WHAT);
    let tag = r.byte()?;
    let out = match tag {
        NO_CANDLE => (r.f64()?, None),
        ONE_TICK | DECIMAL_ONE_TICK => {
            let scale = r.scale_of(tag == DECIMAL_ONE_TICK)?;
            let p = r.price(scale)?;
            let (ts, offset) = r.mark_position(bucket, last_offset)?;
            let tick = Mark { ts, offset, p };
            (p, Some(Candle::of(tick)))
        }
        FULL | DECIMAL_FULL => {
            let sum = r.f64()?;
            let scale = r.scale_of(tag == DECIMAL_FULL)?;
            let mut mark = || -> Result<Mark> {
                let (ts, offset) = r.mark_position(bucket, last_offset)?;
                Ok(Mark {
                    ts,
                    offset,
                    p: r.price(scale)?,
                })
            };
            let (open, close) = (mark()?, mark()?);
            let (high, low) = (r.price(scale)?, r.price(scale)?);
            (
                sum,
                Some(Candle {
                    open,
                    close,
                    high,
                    low,
                }),
            )
        }
        other => return Err(corrupt(format!("tag {other}"))),
    };
    if r.at != v.len() {
        return Err(corrupt(format!("{} bytes after the value", v.len() - r.at)));
    }
    Ok(out)
}

/// The bucket's sum alone: the first f64 of every layout but a decimal
/// tick's, whose price is its sum.
pub(crate) fn sum(v: &[u8]) -> Result<f64> {
    let mut r = Reader {
        at: 1,
        ..Reader::new(v, WHAT)
    };
    match v.first().copied() {
        Some(NO_CANDLE | ONE_TICK | FULL | DECIMAL_FULL) => r.f64(),
        Some(DECIMAL_ONE_TICK) => {
            let scale = r.scale_of(true)?;
            r.price(scale)
        }
        Some(other) => Err(corrupt(format!("tag {other}"))),
        None => Err(corrupt("empty".into())),
    }
}

/// What a malformed blob is reported as.
const WHAT: &str = "price bucket value";

fn corrupt(why: String) -> Error {
    Error::Corrupt(format!("{WHAT}: {why}"))
}

pub(crate) fn put_f64(out: &mut Vec<u8>, v: f64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_mark_position(out: &mut Vec<u8>, m: &Mark, bucket: i64, last_offset: u64) {
    put_zigzag(out, m.ts.millis().wrapping_sub(bucket));
    put_zigzag(out, (last_offset as i64).wrapping_sub(m.offset as i64));
}

/// LEB128 of the zigzag mapping (0, -1, 1, -2, … → 0, 1, 2, 3, …).
pub(crate) fn put_zigzag(out: &mut Vec<u8>, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        out.push(z as u8 | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

/// Reads what `put_f64` and `put_zigzag` wrote; running past the end or
/// an overlong varint is [`Error::Corrupt`], named by `what`.
pub(crate) struct Reader<'a> {
    v: &'a [u8],
    pub(crate) at: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(v: &'a [u8], what: &'static str) -> Self {
        Reader { v, at: 0, what }
    }

    pub(crate) fn corrupt(&self, why: impl std::fmt::Display) -> Error {
        Error::Corrupt(format!("{}: {why}", self.what))
    }

    /// Whether every byte was read.
    pub(crate) fn done(&self) -> bool {
        self.at == self.v.len()
    }

    pub(crate) fn byte(&mut self) -> Result<u8> {
        let b = *self
            .v
            .get(self.at)
            .ok_or_else(|| self.corrupt(format_args!("ends at byte {}", self.at)))?;
        self.at += 1;
        Ok(b)
    }

    /// The next `n` bytes.
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let bytes = self
            .v
            .get(self.at..self.at.saturating_add(n))
            .ok_or_else(|| {
                self.corrupt(format_args!("ends inside {n} bytes at byte {}", self.at))
            })?;
        self.at += n;
        Ok(bytes)
    }

    pub(crate) fn f64(&mut self) -> Result<f64> {
        let bytes = self
            .v
            .get(self.at..self.at + 8)
            .ok_or_else(|| self.corrupt(format_args!("ends inside the f64 at byte {}", self.at)))?;
        self.at += 8;
        Ok(f64::from_le_bytes(bytes.try_into().expect("8 bytes")))
    }

    pub(crate) fn zigzag(&mut self) -> Result<i64> {
        let mut z: u64 = 0;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            if shift == 63 && b > 1 {
                return Err(self.corrupt("varint over 64 bits"));
            }
            z |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return Ok((z >> 1) as i64 ^ -((z & 1) as i64));
            }
        }
        Err(self.corrupt("varint over 64 bits"))
    }

    /// The scale byte of a decimal layout (`decimal`), or none.
    fn scale_of(&mut self, decimal: bool) -> Result<Option<u8>> {
        if !decimal {
            return Ok(None);
        }
        match self.byte()? {
            k if k <= decimal::MAX_SCALE => Ok(Some(k)),
            other => Err(self.corrupt(format_args!("price scale {other}"))),
        }
    }

    /// A price: its f64, or at `scale` its decimal integer.
    fn price(&mut self, scale: Option<u8>) -> Result<f64> {
        match scale {
            Some(k) => Ok(decimal::value(self.zigzag()?, k)),
            None => self.f64(),
        }
    }

    fn mark_position(&mut self, bucket: i64, last_offset: u64) -> Result<(Timestamp, u64)> {
        let ts = bucket.wrapping_add(self.zigzag()?);
        let offset = (last_offset as i64).wrapping_sub(self.zigzag()?) as u64;
        Ok((Timestamp(ts), offset))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUCKET: i64 = 1_756_684_800_000;

    fn mark(ts: i64, offset: u64, p: f64) -> Mark {
        Mark {
            ts: Timestamp(ts),
            offset,
            p,
        }
    }

    fn round_trip(sum: f64, candle: Option<Candle>, bucket: i64, last: u64) -> Vec<u8> {
        let v = encode(sum, candle.as_ref(), bucket, last);
        let (got_sum, got) = decode(&v, bucket, last).unwrap();
        assert_eq!(got_sum.to_bits(), sum.to_bits(), "sum of {v:?}");
        assert_eq!(super::sum(&v).unwrap().to_bits(), sum.to_bits());
        match (candle, got) {
            (None, None) => {}
            (Some(a), Some(b)) => {
                for (x, y) in [
                    (a.open.p, b.open.p),
                    (a.close.p, b.close.p),
                    (a.high, b.high),
                    (a.low, b.low),
                ] {
                    assert_eq!(x.to_bits(), y.to_bits(), "{a:?} vs {b:?}");
                }
                assert_eq!(
                    (a.open.ts, a.open.offset, a.close.ts, a.close.offset),
                    (b.open.ts, b.open.offset, b.close.ts, b.close.offset)
                );
            }
            (a, b) => panic!("{a:?} came back as {b:?}"),
        }
        v
    }

    #[test]
    fn a_bucket_of_one_tick_takes_its_price_once() {
        let tick = mark(BUCKET + 59_999, 1_000_000, 1.0 / 3.0);
        let v = round_trip(tick.p, Some(Candle::of(tick)), BUCKET, 1_000_000);
        assert_eq!(v[0], ONE_TICK);
        assert_eq!(v.len(), 1 + 8 + 3 + 1, "{v:?}");
        // A decimal price: its scale and integer (123, two bytes).
        let tick = mark(BUCKET + 59_999, 1_000_000, 0.123);
        let v = round_trip(tick.p, Some(Candle::of(tick)), BUCKET, 1_000_000);
        assert_eq!(v[..2], [DECIMAL_ONE_TICK, 3]);
        assert_eq!(v.len(), 2 + 2 + 3 + 1, "{v:?}");
    }

    #[test]
    fn a_bucket_of_several_ticks_keeps_every_candle_value() {
        let c = Candle {
            open: mark(BUCKET + 5, 10, 0.25),
            close: mark(BUCKET + 50_000, 12, 0.75),
            high: 0.9,
            low: 0.1,
        };
        let v = round_trip(0.25 + 0.75 + 0.9 + 0.1, Some(c), BUCKET, 13);
        assert_eq!((v[0], v[9]), (DECIMAL_FULL, 2));
        let c = Candle {
            high: 1.0 / 3.0,
            ..c
        };
        assert_eq!(round_trip(1.0, Some(c), BUCKET, 13)[0], FULL);
    }

    #[test]
    fn a_row_without_candle_keeps_its_sum() {
        let v = round_trip(2.25, None, BUCKET, 7);
        assert_eq!(
            v,
            [vec![NO_CANDLE], 2.25f64.to_le_bytes().to_vec()].concat()
        );
    }

    #[test]
    fn one_tick_is_chosen_only_when_every_value_is_that_tick_bit_for_bit() {
        let tick = mark(BUCKET, 3, 0.5);
        // Equal as numbers, different bits: the full layout keeps -0.0.
        let zero = mark(BUCKET, 3, 0.0);
        let v = round_trip(-0.0, Some(Candle::of(zero)), BUCKET, 3);
        assert_eq!(v[0], DECIMAL_FULL);
        let two_marks = Candle {
            close: mark(BUCKET + 1, 4, 0.5),
            ..Candle::of(tick)
        };
        assert_eq!(round_trip(1.0, Some(two_marks), BUCKET, 4)[0], DECIMAL_FULL);
        // A price of -0.0 is no decimal: its bits are kept.
        let v = round_trip(-0.0, Some(Candle::of(mark(BUCKET, 3, -0.0))), BUCKET, 3);
        assert_eq!(v[0], ONE_TICK);
    }

    #[test]
    fn marks_outside_the_bucket_or_after_last_offset_round_trip() {
        let c = Candle {
            open: mark(i64::MIN, u64::MAX, f64::MIN_POSITIVE),
            close: mark(i64::MAX, 0, f64::MAX),
            high: f64::INFINITY,
            low: f64::NEG_INFINITY,
        };
        round_trip(1e300, Some(c), BUCKET, 5);
        round_trip(0.5, Some(Candle::of(mark(BUCKET - 1, 9, 0.5))), BUCKET, 2);
    }

    #[test]
    fn random_rows_round_trip_and_encode_canonically() {
        // xorshift64*: reproducible without a dependency.
        let mut s: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            s.wrapping_mul(0x2545_f491_4f6c_dd1d)
        };
        for _ in 0..20_000 {
            let bucket = (next() % 2_000_000_000_000) as i64;
            let width = [60_000, 86_400_000][(next() % 2) as usize];
            let last = next() % (1 << 40);
            let m = |n: &mut dyn FnMut() -> u64| {
                mark(
                    bucket + (n() % width) as i64,
                    last.saturating_sub(n() % 100_000),
                    (n() % 1_000_001) as f64 / 1e6,
                )
            };
            let (a, b) = (m(&mut next), m(&mut next));
            let candle = match next() % 3 {
                0 => None,
                1 => Some(Candle::of(a)),
                _ => Some(Candle {
                    open: a,
                    close: b,
                    high: a.p.max(b.p),
                    low: a.p.min(b.p),
                }),
            };
            let sum = match candle {
                Some(c) if next() % 2 == 0 => c.open.p,
                _ => f64::from_bits(next() >> 2),
            };
            let v = round_trip(sum, candle, bucket, last);
            let (s2, c2) = decode(&v, bucket, last).unwrap();
            assert_eq!(encode(s2, c2.as_ref(), bucket, last), v, "canonical");
        }
    }

    /// Every width's edges (63 / -64 the last in one byte, 64 / -65 the
    /// first in two, and so on) round-trip one after another, as a block
    /// holds them, and what runs past the end or past 64 bits is corrupt.
    #[test]
    fn varints_round_trip_at_every_width_and_refuse_overlong() {
        let mut values = vec![0, 1, -1, i64::MAX, i64::MIN];
        for bits in (6..63).step_by(7) {
            let edge = 1i64 << bits;
            values.extend([edge - 1, edge, -edge, -edge - 1]);
        }
        let mut out = Vec::new();
        for &v in &values {
            put_zigzag(&mut out, v);
        }
        assert_eq!(out.iter().filter(|&&b| b < 0x80).count(), values.len());
        let mut r = Reader::new(&out, WHAT);
        for &v in &values {
            assert_eq!(r.zigzag().unwrap(), v);
        }
        assert!(r.done());
        for bad in [
            &[0x80][..],
            &[0xff; 9],
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02],
            &[0x80; 11],
        ] {
            assert!(
                matches!(Reader::new(bad, WHAT).zigzag(), Err(Error::Corrupt(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn malformed_values_are_corrupt_not_a_panic() {
        let candle = |p| Candle {
            open: mark(BUCKET + 1, 1, p),
            close: mark(BUCKET + 2, 2, p),
            high: p,
            low: p,
        };
        for good in [
            encode(1.0, Some(&candle(0.5)), BUCKET, 2),
            encode(1.0, Some(&candle(1.0 / 3.0)), BUCKET, 2),
            encode(0.5, Some(&Candle::of(mark(BUCKET, 2, 0.5))), BUCKET, 2),
        ] {
            for len in 0..good.len() {
                assert!(matches!(
                    decode(&good[..len], BUCKET, 2),
                    Err(Error::Corrupt(_))
                ));
            }
            let mut longer = good.clone();
            longer.push(0);
            assert!(matches!(decode(&longer, BUCKET, 2), Err(Error::Corrupt(_))));
        }
        // A scale past the largest.
        assert!(matches!(
            decode(&[DECIMAL_ONE_TICK, 16, 2, 0, 0], BUCKET, 2),
            Err(Error::Corrupt(_))
        ));
        assert!(matches!(
            decode(&[9, 0, 0], BUCKET, 2),
            Err(Error::Corrupt(_))
        ));
        assert!(matches!(sum(&[]), Err(Error::Corrupt(_))));
        assert!(matches!(sum(&[1, 0]), Err(Error::Corrupt(_))));
        let endless = [vec![ONE_TICK], vec![0; 8], vec![0xff; 11]].concat();
        assert!(matches!(
            decode(&endless, BUCKET, 2),
            Err(Error::Corrupt(_))
        ));
    }
}
