//! Price ticks in blocks (store schema 7): a row of `price_tick_blocks`
//! holds up to [`BLOCK_TICKS`] of one token's ticks, keyed by its first.
//!
//! A row per tick cost a B-tree entry of ~31 bytes and an insert of a few
//! microseconds; a rebuild of 2 000 000 long-tail ticks spent more time on
//! those inserts than on anything else. A block is written whole: a step
//! reads the blocks its ticks fall in, merges, and writes each back once.
//!
//! Why blocks are keyed by the tick they start at and capped by count,
//! not cut by time: a step rewrites every block it touches, so what
//! bounds a block bounds the rewrite. An hour (the first cut, commit
//! `cbae048`) let a token ticking hundreds of times a second grow blocks
//! of hundreds of thousands of ticks, rewritten at every step. A count
//! bounds it whatever the token's rate, and a rarely trading token still
//! keeps days in one block. The rules (the store's `price_ticks` applies
//! them):
//! - a token's blocks partition its key space: a tick belongs to the
//!   block with the greatest start at or before its key, and a tick before
//!   every block starts a block of its own. A block's first tick is its
//!   start, so a start never moves;
//! - a block past [`BLOCK_TICKS`] is cut into equal pieces ([`pieces`]),
//!   each starting at its first tick.
//!
//! So a replayed tick finds the block that holds it and overwrites itself
//! (a tick is stored once, a block's count is exact), and a read seeks to
//! the block holding its cursor. Where blocks are cut depends on how the
//! log was cut into steps; the ticks they hold do not.
//!
//! Layout of `v`, after a tag byte:
//! - `0` (plain): the body;
//! - `1` (zstd): the body's length (varint), then the body as one zstd
//!   frame — used when that is smaller, tried only on a body whose bytes
//!   repeat ([`repetitive`]).
//!
//! The body: the tick count; whether the ticks' partitions are kept (`1`)
//! or all the start's (`0`: a token's events come from one log partition,
//! so in practice always); the prices' scale (below); then per tick in key
//! order the differences of `ts`, the partition if kept, and the offset
//! from the previous tick's (the first from the block's start, so all
//! zero) as zigzag varints, and the price.
//!
//! When every price of the block is a decimal at one scale `k`
//! ([`crate::decimal`]), the scale byte is `k` and each price is its
//! integer `m` minus the previous one's, a zigzag varint: one or two
//! bytes. Otherwise (a NaN, -0.0, a price of more digits) the scale byte
//! is [`BITS`] and each price is its bits XOR the previous price's bits,
//! eight little-endian bytes. Every value round-trips bit for bit.

use crate::decimal;
use crate::rowcodec::{put_zigzag, Reader};
use crate::Result;
use hindsight_contracts::TickKey;
use hindsight_schemas::Timestamp;

/// The most ticks a block holds: a step rewrites at most this many per
/// block it touches. 64 long-tail ticks encode to ~0.3 KB, which keeps a
/// block inside its B-tree page: SQLite moves a key-ordered row's payload
/// past ~1 KB (on 4 KB pages) to an overflow page of its own, and a cap of
/// 128 left ~70 % of the table's pages empty.
pub(crate) const BLOCK_TICKS: usize = 64;

const PLAIN: u8 = 0;
const ZSTD: u8 = 1;
/// Bodies shorter than this stay plain: a zstd frame's header would eat
/// what it saves.
const COMPRESS_FROM: usize = 128;
const ZSTD_LEVEL: i32 = 1;
/// See [`repetitive`]: 0.6 of a byte's 8 bits.
const MAX_COLLISION_BITS: f64 = 4.8;
/// A body longer than this is corrupt ([`BLOCK_TICKS`] ticks take at most
/// 39 bytes each; an older store's migration writes no larger blocks).
const MAX_BODY: usize = 1 << 20;
const WHAT: &str = "price tick block";
/// The scale byte of a block whose prices are kept as bits.
const BITS: u8 = 0xff;

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

/// `ticks` (in key order, distinct keys) cut into the fewest blocks of at
/// most [`BLOCK_TICKS`], of equal size give or take one: a block that
/// grew one past the cap becomes two half full, so the next few steps
/// appending to it rewrite half a block, not a full one.
pub(crate) fn pieces(ticks: &[PriceTick]) -> impl Iterator<Item = &[PriceTick]> {
    let n = ticks.len().div_ceil(BLOCK_TICKS).max(1);
    let (size, longer) = (ticks.len() / n, ticks.len() % n);
    let mut rest = ticks;
    (0..n).map(move |i| {
        let (piece, after) = rest.split_at(size + usize::from(i < longer));
        rest = after;
        piece
    })
}

/// The blob of a block holding `ticks`: in key order, distinct keys, at
/// least one. Its first tick is the block's start.
pub(crate) fn encode(ticks: &[PriceTick]) -> Vec<u8> {
    let mut body = Vec::with_capacity(2 + ticks.len() * 14);
    put_zigzag(&mut body, ticks.len() as i64);
    let start = ticks.first().expect("a block holds a tick").0;
    let partitions = ticks
        .iter()
        .any(|(key, _)| key.partition != start.partition);
    body.push(u8::from(partitions));
    let scale = decimal::scale(ticks.iter().map(|(_, p)| *p));
    body.push(scale.unwrap_or(BITS));
    let (mut ts, mut part, mut off, mut price) = (
        start.ts.millis(),
        start.partition as i64,
        start.offset as i64,
        0u64,
    );
    for (key, p) in ticks {
        put_zigzag(&mut body, key.ts.millis().wrapping_sub(ts));
        if partitions {
            put_zigzag(&mut body, (key.partition as i64).wrapping_sub(part));
        }
        put_zigzag(&mut body, (key.offset as i64).wrapping_sub(off));
        let next = match scale {
            Some(k) => {
                let m = decimal::mantissa(*p, k).expect("scale checked every price") as u64;
                put_zigzag(&mut body, m.wrapping_sub(price) as i64);
                m
            }
            None => {
                body.extend_from_slice(&(p.to_bits() ^ price).to_le_bytes());
                p.to_bits()
            }
        };
        (ts, part, off, price) = (
            key.ts.millis(),
            key.partition as i64,
            key.offset as i64,
            next,
        );
    }
    if body.len() >= COMPRESS_FROM && repetitive(&body) {
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

/// Whether zstd is worth trying on `body`: its bytes repeat enough that
/// their collision entropy (Rényi's of order 2, from the sum of squared
/// byte counts) is under [`MAX_COLLISION_BITS`] a byte. A long-tail block
/// (irregular gaps between ticks, prices that jump) rarely is, and zstd
/// saved 258 KB on the benchmark's 62.6 MB store while a rebuild spent a
/// tenth of its write compressing 35 000 blocks; under the bound it tries
/// 6 200 of them and keeps 237 KB of those savings. A dense block (a
/// tick a second, small price steps) always is, and compresses ~6×. A
/// function of the body alone, so a block's bytes still depend only on
/// its ticks.
fn repetitive(body: &[u8]) -> bool {
    let mut counts = [0u32; 256];
    body.iter().for_each(|b| counts[*b as usize] += 1);
    let collisions: u64 = counts.iter().map(|c| u64::from(*c) * u64::from(*c)).sum();
    let n = body.len() as f64;
    // -log2(Σ(c/n)²) < bits  <=>  Σc² · 2^bits > n²
    collisions as f64 * MAX_COLLISION_BITS.exp2() > n * n
}

/// The ticks of the block at `start` [`encode`] wrote; a malformed blob
/// (or one whose first tick is not `start`) is [`crate::Error::Corrupt`].
pub(crate) fn decode(start: TickKey, v: &[u8]) -> Result<Vec<PriceTick>> {
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
    // A tick takes at least 3 bytes: a count beyond that is corrupt, and
    // must not size an allocation.
    if n < 0 || n as usize > body.len() / 3 {
        return Err(r.corrupt(format_args!("{n} ticks in {} bytes", body.len())));
    }
    let partitions = match r.byte()? {
        0 => false,
        1 => true,
        other => return Err(r.corrupt(format_args!("partitions flag {other}"))),
    };
    let scale = match r.byte()? {
        BITS => None,
        k if k <= decimal::MAX_SCALE => Some(k),
        other => return Err(r.corrupt(format_args!("price scale {other}"))),
    };
    let mut out = Vec::with_capacity(n as usize);
    let (mut ts, mut part, mut off, mut price) = (
        start.ts.millis(),
        start.partition as i64,
        start.offset as i64,
        0u64,
    );
    for _ in 0..n {
        ts = ts.wrapping_add(r.zigzag()?);
        if partitions {
            part = part.wrapping_add(r.zigzag()?);
        }
        off = off.wrapping_add(r.zigzag()?);
        let p = match scale {
            Some(k) => {
                price = price.wrapping_add(r.zigzag()? as u64);
                decimal::value(price as i64, k)
            }
            None => {
                price ^= r.f64()?.to_bits();
                f64::from_bits(price)
            }
        };
        let partition = u32::try_from(part).map_err(|_| r.corrupt("partition out of range"))?;
        out.push((
            TickKey {
                ts: Timestamp(ts),
                partition,
                offset: off as u64,
            },
            p,
        ));
    }
    if !r.done() {
        return Err(r.corrupt("bytes after the last tick"));
    }
    if out.first().map(|t| t.0) != Some(start) {
        return Err(r.corrupt("first tick is not the block's start"));
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

    const T0: i64 = 1_756_684_800_000;

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
        let few = vec![tick(T0, 0, 7, 0.5), tick(T0 + 10, 0, 3, -0.0)];
        let v = encode(&few);
        assert_eq!(v[0], PLAIN);
        assert_eq!(decode(few[0].0, &v).unwrap(), few);
        assert_eq!(
            decode(few[0].0, &v).unwrap()[1].1.to_bits(),
            (-0.0f64).to_bits()
        );

        let many: Vec<_> = (0..3_600)
            .map(|i| tick(T0 + i * 1_000, (i % 3) as u32, 1_000 + i as u64 * 17, 0.25))
            .chain([tick(T0 + 3_600_000 - 1, 9, u64::MAX, f64::NAN)])
            .collect();
        let v = encode(&many);
        assert_eq!(v[0], ZSTD);
        assert!(v.len() < many.len() * 4, "{} bytes", v.len());
        let back = decode(many[0].0, &v).unwrap();
        assert_eq!(back.len(), many.len());
        for (b, m) in back.iter().zip(&many) {
            assert_eq!((b.0, b.1.to_bits()), (m.0, m.1.to_bits()));
        }
    }

    #[test]
    fn only_a_block_whose_bytes_repeat_is_compressed() {
        // A tick a second at one price: the same few bytes over and over.
        let dense: Vec<_> = (0..64)
            .map(|i| tick(T0 + i * 1_000, 0, 1_000 + i as u64, 0.5))
            .collect();
        assert_eq!(encode(&dense)[0], ZSTD);
        // Irregular gaps, offsets and prices: bytes all over the range.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let (mut ts, mut offset) = (T0, 0);
        let sparse: Vec<_> = (0..64)
            .map(|_| {
                ts += 1 + (next() % 3_600_000) as i64;
                offset += 1 + next() % 100_000;
                tick(ts, 0, offset, (next() % 1_000) as f64 / 1_000.0)
            })
            .collect();
        let v = encode(&sparse);
        assert_eq!(v[0], PLAIN, "{} bytes", v.len());
        assert!(
            v.len() > COMPRESS_FROM && !repetitive(&v[1..]),
            "zstd is not even tried"
        );
        assert_eq!(decode(sparse[0].0, &v).unwrap(), sparse);
    }

    #[test]
    fn decimal_prices_take_a_byte_or_two_and_other_prices_their_bits() {
        for prices in [
            vec![0.001, 0.999, 0.5],
            vec![0.1 + 0.2, 0.5],
            vec![0.5, -0.0],
        ] {
            let ticks: Vec<PriceTick> = prices
                .iter()
                .enumerate()
                .map(|(i, p)| tick(T0 + i as i64, 0, i as u64, *p))
                .collect();
            let v = encode(&ticks);
            assert_eq!(
                v[3] == BITS,
                decimal::scale(prices.iter().copied()).is_none()
            );
            let back = decode(ticks[0].0, &v).unwrap();
            for (b, t) in back.iter().zip(&ticks) {
                assert_eq!((b.0, b.1.to_bits()), (t.0, t.1.to_bits()), "{prices:?}");
            }
        }
        // A long-tail block: prices of three decimals, offsets far apart.
        let ticks: Vec<_> = (0..64)
            .map(|i| {
                tick(
                    T0 + i * 47_000,
                    0,
                    i as u64 * 1_003,
                    ((i * 7919) % 1000) as f64 / 1000.0,
                )
            })
            .collect();
        let v = encode(&ticks);
        assert!(v.len() <= ticks.len() * 8, "{} bytes", v.len());
        assert_eq!(decode(ticks[0].0, &v).unwrap(), ticks);
    }

    #[test]
    fn a_malformed_block_is_corrupt_not_a_panic() {
        let many: Vec<_> = (0..100).map(|i| tick(T0 + i, 0, i as u64, 0.5)).collect();
        let start = many[0].0;
        for v in [encode(&many[..3]), encode(&many)] {
            for cut in 0..v.len() {
                assert!(decode(start, &v[..cut]).is_err(), "cut at {cut}");
            }
            let mut longer = v.clone();
            longer.push(0);
            assert!(decode(start, &longer).is_err());
        }
        assert!(decode(start, &[7]).is_err());
        // A count no body could hold.
        let mut huge = vec![PLAIN];
        put_zigzag(&mut huge, i64::MAX);
        assert!(decode(start, &huge).is_err());
        // A first tick that is not the block's start.
        let mut off_start = vec![PLAIN];
        put_zigzag(&mut off_start, 1);
        off_start.extend_from_slice(&[1, BITS]);
        for v in [1, 0, 0] {
            put_zigzag(&mut off_start, v);
        }
        off_start.extend_from_slice(&[0; 8]);
        assert!(decode(start, &off_start).is_err());
        off_start[4] = 0;
        assert_eq!(decode(start, &off_start).unwrap(), vec![(start, 0.0)]);
        // Two ticks in the wrong order.
        let swapped = encode(&[many[1], many[0]]);
        assert!(decode(many[1].0, &swapped).is_err());
    }

    #[test]
    fn a_merge_keeps_key_order_and_the_new_tick_of_a_stored_key() {
        let stored = vec![
            tick(T0, 0, 1, 0.1),
            tick(T0 + 5, 0, 4, 0.2),
            tick(T0 + 9, 0, 8, 0.3),
        ];
        let new = [
            tick(T0 + 1, 0, 2, 0.9),
            tick(T0 + 5, 0, 4, 0.7),
            tick(T0 + 20, 0, 9, 0.4),
        ];
        assert_eq!(
            merge(stored, &new),
            vec![
                tick(T0, 0, 1, 0.1),
                tick(T0 + 1, 0, 2, 0.9),
                tick(T0 + 5, 0, 4, 0.7),
                tick(T0 + 9, 0, 8, 0.3),
                tick(T0 + 20, 0, 9, 0.4),
            ]
        );
        assert_eq!(merge(vec![], &new), new.to_vec());
        assert_eq!(merge(new.to_vec(), &[]), new.to_vec());
    }

    #[test]
    fn pieces_are_capped_and_even() {
        let ticks: Vec<_> = (0..1_000).map(|i| tick(T0 + i, 0, i as u64, 0.5)).collect();
        let sizes = |n: usize| pieces(&ticks[..n]).map(<[_]>::len).collect::<Vec<_>>();
        assert_eq!(sizes(1), vec![1]);
        assert_eq!(sizes(BLOCK_TICKS), vec![BLOCK_TICKS]);
        assert_eq!(
            sizes(BLOCK_TICKS + 1),
            vec![BLOCK_TICKS / 2 + 1, BLOCK_TICKS / 2]
        );
        let many = sizes(1_000);
        assert_eq!(many.len(), 1_000usize.div_ceil(BLOCK_TICKS));
        assert!(many
            .iter()
            .all(|&n| n <= BLOCK_TICKS && n + 1 >= 1_000 / many.len()));
        assert_eq!(many.iter().sum::<usize>(), 1_000);
    }
}
