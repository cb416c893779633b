//! Price ticks in blocks (store schema 7): one row of `price_tick_blocks`
//! per token and hour, holding that hour's ticks.
//!
//! A row per tick cost a B-tree entry of ~31 bytes and an insert of a few
//! microseconds; a rebuild of 2 000 000 long-tail ticks spent more time on
//! those inserts than on anything else. A block is written whole: a step
//! reads the blocks its ticks fall in, merges, and writes each back once.
//! An hour bounds the rewrite (a token ticking every second rewrites at
//! most an hour of ticks per step) and keeps a long-tail token's block at a
//! few dozen ticks.
//!
//! Layout of `v`, after a tag byte:
//! - `0` (plain): the body;
//! - `1` (zstd): the body's length (varint), then the body as one zstd
//!   frame — used when that is smaller.
//!
//! The body: the tick count, then per tick in key order (ts, partition,
//! offset) the differences from the previous tick's `ts` (the first from
//! the span's start), partition and offset (the first from 0) as zigzag
//! varints, and the price's bits XOR the previous price's bits as eight
//! little-endian bytes (a repeated price is eight zero bytes, which zstd
//! folds). Every value round-trips bit for bit, and equal sets of ticks
//! give equal bytes, so a rebuilt store equals an incrementally projected
//! one byte for byte.

use crate::rowcodec::{put_zigzag, Reader};
use crate::Result;
use hindsight_contracts::TickKey;
use hindsight_schemas::Timestamp;

/// The width of a block, in ms.
pub(crate) const SPAN_MS: i64 = 3_600_000;

const PLAIN: u8 = 0;
const ZSTD: u8 = 1;
/// Bodies shorter than this stay plain: a zstd frame's header would eat
/// what it saves.
const COMPRESS_FROM: usize = 128;
const ZSTD_LEVEL: i32 = 1;
/// A body longer than this is corrupt (an hour of one tick per
/// millisecond, at most 27 bytes each, is ~97 MB).
const MAX_BODY: usize = 128 << 20;
const WHAT: &str = "price tick block";

thread_local! {
    /// zstd contexts, kept: creating one per block (a rebuild writes tens
    /// of thousands) costs more than compressing a small block.
    static COMPRESSOR: std::cell::RefCell<zstd::bulk::Compressor<'static>> =
        std::cell::RefCell::new(
            zstd::bulk::Compressor::new(ZSTD_LEVEL).expect("a zstd context at level 1"),
        );
    static DECOMPRESSOR: std::cell::RefCell<zstd::bulk::Decompressor<'static>> =
        std::cell::RefCell::new(zstd::bulk::Decompressor::new().expect("a zstd context"));
}

/// One price tick: its key and price.
pub(crate) type PriceTick = (TickKey, f64);

/// The start of the block `ts` falls in.
pub(crate) fn span_of(ts: Timestamp) -> i64 {
    ts.millis().div_euclid(SPAN_MS) * SPAN_MS
}

/// The blob of the block starting at `span` holding `ticks`, which are in
/// key order with distinct keys.
pub(crate) fn encode(span: i64, ticks: &[PriceTick]) -> Vec<u8> {
    let mut body = Vec::with_capacity(1 + ticks.len() * 14);
    put_zigzag(&mut body, ticks.len() as i64);
    let (mut ts, mut part, mut off, mut bits) = (span, 0i64, 0i64, 0u64);
    for (key, p) in ticks {
        put_zigzag(&mut body, key.ts.millis().wrapping_sub(ts));
        put_zigzag(&mut body, (key.partition as i64).wrapping_sub(part));
        put_zigzag(&mut body, (key.offset as i64).wrapping_sub(off));
        body.extend_from_slice(&(p.to_bits() ^ bits).to_le_bytes());
        (ts, part, off, bits) = (
            key.ts.millis(),
            key.partition as i64,
            key.offset as i64,
            p.to_bits(),
        );
    }
    if body.len() >= COMPRESS_FROM {
        let frame = COMPRESSOR
            .with_borrow_mut(|c| c.compress(&body))
            .expect("zstd compresses a buffer");
        let mut out = Vec::with_capacity(frame.len() + 6);
        out.push(ZSTD);
        put_zigzag(&mut out, body.len() as i64);
        if out.len() + frame.len() < 1 + body.len() {
            out.extend_from_slice(&frame);
            return out;
        }
    }
    let mut out = Vec::with_capacity(1 + body.len());
    out.push(PLAIN);
    out.extend_from_slice(&body);
    out
}

/// The ticks of a block [`encode`] wrote; a malformed blob is
/// [`crate::Error::Corrupt`].
pub(crate) fn decode(span: i64, v: &[u8]) -> Result<Vec<PriceTick>> {
    let mut r = Reader::new(v, WHAT);
    let inflated;
    let body = match r.byte()? {
        PLAIN => &v[1..],
        ZSTD => {
            let len = r.zigzag()?;
            if !(0..=MAX_BODY as i64).contains(&len) {
                return Err(r.corrupt(format_args!("body of {len} bytes")));
            }
            inflated = DECOMPRESSOR
                .with_borrow_mut(|d| d.decompress(&v[r.at..], len as usize))
                .map_err(|e| r.corrupt(format_args!("zstd: {e}")))?;
            if inflated.len() != len as usize {
                return Err(r.corrupt(format_args!(
                    "body of {} bytes, {len} announced",
                    inflated.len()
                )));
            }
            &inflated[..]
        }
        other => return Err(r.corrupt(format_args!("tag {other}"))),
    };
    let mut r = Reader::new(body, WHAT);
    let n = r.zigzag()?;
    // A tick takes at least 11 bytes: a count beyond that is corrupt, and
    // must not size an allocation.
    if n < 0 || n as usize > body.len() / 11 {
        return Err(r.corrupt(format_args!("{n} ticks in {} bytes", body.len())));
    }
    let mut out = Vec::with_capacity(n as usize);
    let (mut ts, mut part, mut off, mut bits) = (span, 0i64, 0i64, 0u64);
    for _ in 0..n {
        ts = ts.wrapping_add(r.zigzag()?);
        part = part.wrapping_add(r.zigzag()?);
        off = off.wrapping_add(r.zigzag()?);
        bits ^= r.f64()?.to_bits();
        let partition = u32::try_from(part).map_err(|_| r.corrupt("partition out of range"))?;
        out.push((
            TickKey {
                ts: Timestamp(ts),
                partition,
                offset: off as u64,
            },
            f64::from_bits(bits),
        ));
    }
    if !r.done() {
        return Err(r.corrupt("bytes after the last tick"));
    }
    if out.windows(2).any(|w| w[0].0 >= w[1].0) {
        return Err(r.corrupt("ticks out of key order"));
    }
    Ok(out)
}

/// `stored` with `new` written over it: a tick whose key is stored
/// replaces it (a replayed event writes its own tick again). Both are in
/// key order; so is the result.
pub(crate) fn merge(stored: Vec<PriceTick>, new: &[PriceTick]) -> Vec<PriceTick> {
    if stored.is_empty() {
        return new.to_vec();
    }
    let mut out = Vec::with_capacity(stored.len() + new.len());
    let mut stored = stored.into_iter().peekable();
    for t in new {
        while let Some(s) = stored.next_if(|s| s.0 < t.0) {
            out.push(s);
        }
        stored.next_if(|s| s.0 == t.0);
        out.push(*t);
    }
    out.extend(stored);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPAN: i64 = 1_756_684_800_000;

    fn tick(ts: i64, partition: u32, offset: u64, p: f64) -> PriceTick {
        (
            TickKey {
                ts: Timestamp(ts),
                partition,
                offset,
            },
            p,
        )
    }

    #[test]
    fn blocks_round_trip_bit_for_bit_plain_and_compressed() {
        let few = vec![tick(SPAN, 0, 7, 0.5), tick(SPAN + 10, 0, 3, -0.0)];
        let v = encode(SPAN, &few);
        assert_eq!(v[0], PLAIN);
        assert_eq!(decode(SPAN, &v).unwrap(), few);
        assert_eq!(
            decode(SPAN, &v).unwrap()[1].1.to_bits(),
            (-0.0f64).to_bits()
        );

        let many: Vec<_> = (0..3_600)
            .map(|i| {
                tick(
                    SPAN + i * 1_000,
                    (i % 3) as u32,
                    1_000 + i as u64 * 17,
                    0.25,
                )
            })
            .chain([tick(SPAN + SPAN_MS - 1, 9, u64::MAX, f64::NAN)])
            .collect();
        let v = encode(SPAN, &many);
        assert_eq!(v[0], ZSTD);
        assert!(v.len() < many.len() * 4, "{} bytes", v.len());
        let back = decode(SPAN, &v).unwrap();
        assert_eq!(back.len(), many.len());
        for (b, m) in back.iter().zip(&many) {
            assert_eq!((b.0, b.1.to_bits()), (m.0, m.1.to_bits()));
        }
        assert_eq!(decode(SPAN, &encode(SPAN, &[])).unwrap(), vec![]);
    }

    #[test]
    fn a_malformed_block_is_corrupt_not_a_panic() {
        let many: Vec<_> = (0..100).map(|i| tick(SPAN + i, 0, i as u64, 0.5)).collect();
        for v in [encode(SPAN, &many[..3]), encode(SPAN, &many)] {
            for cut in 0..v.len() {
                assert!(decode(SPAN, &v[..cut]).is_err(), "cut at {cut}");
            }
            let mut longer = v.clone();
            longer.push(0);
            assert!(decode(SPAN, &longer).is_err());
        }
        assert!(decode(SPAN, &[7]).is_err());
        // A count no body could hold.
        let mut huge = vec![PLAIN];
        put_zigzag(&mut huge, i64::MAX);
        assert!(decode(SPAN, &huge).is_err());
        // Two ticks in the wrong order.
        let swapped = encode(SPAN, &[many[1], many[0]]);
        assert!(decode(SPAN, &swapped).is_err());
    }

    #[test]
    fn a_merge_keeps_key_order_and_the_new_tick_of_a_stored_key() {
        let stored = vec![
            tick(SPAN, 0, 1, 0.1),
            tick(SPAN + 5, 0, 4, 0.2),
            tick(SPAN + 9, 0, 8, 0.3),
        ];
        let new = [
            tick(SPAN + 1, 0, 2, 0.9),
            tick(SPAN + 5, 0, 4, 0.7),
            tick(SPAN + 20, 0, 9, 0.4),
        ];
        assert_eq!(
            merge(stored, &new),
            vec![
                tick(SPAN, 0, 1, 0.1),
                tick(SPAN + 1, 0, 2, 0.9),
                tick(SPAN + 5, 0, 4, 0.7),
                tick(SPAN + 9, 0, 8, 0.3),
                tick(SPAN + 20, 0, 9, 0.4),
            ]
        );
        assert_eq!(merge(vec![], &new), new.to_vec());
        assert_eq!(merge(new.to_vec(), &[]), new.to_vec());
    }
}
