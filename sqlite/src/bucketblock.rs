//! Price buckets in blocks (since store schema 8): a row of `price_bucket_blocks`
//! holds the buckets of one token at one resolution that fall in one
//! window of [`BLOCK_BUCKETS`] buckets.
//!
//! A row per bucket cost a B-tree entry of ~45 bytes (its three key
//! columns, a record header and a cell pointer around a value of ~17) and
//! an insert of a few microseconds. A rebuild of 2 000 000 long-tail ticks
//! writes 1 540 000 such rows, and they were most of its time and of the
//! store's bytes. In blocks, the same rows are ~240 000 entries.
//!
//! Why windows of a fixed span of time, where price ticks are blocked by
//! count ([`crate::tickblock`]): a window holds at most one row per bucket,
//! so [`BLOCK_BUCKETS`] bounds what a step rewrites whatever the token's
//! rate, and a bucket's block follows from its key alone — a load, a read
//! and a write each go straight to it. The content of a block is a function
//! of its rows (ascending, each encoded by [`crate::rowcodec`]), so an
//! incrementally projected store and a rebuilt one are equal byte for
//! byte, however the log was cut into steps.
//!
//! `block` is the window's first bucket: the bucket rounded down to a
//! multiple of `BLOCK_BUCKETS` buckets of its resolution since the Unix
//! epoch. Layout of `v`, per row in bucket order: the bucket's index in
//! the window (one byte, ascending), `count`, `last_offset` minus the
//! previous row's (the first row's from zero) as zigzag varints, the
//! length of the row's value and the value ([`crate::rowcodec`], which
//! stores times and offsets relative to the row's bucket and
//! `last_offset`).

use crate::rowcodec::{put_zigzag, Reader};
use crate::Result;

/// Buckets in a window: a step rewrites at most this many rows per block
/// it touches. Measured on the long tail (`hindsight-bench shapes` and
/// `live --quick`): at 32, blocks of busy tokens near 1 KB left 41 % of the
/// table's pages unused (a B-tree page of few large cells packs badly) and
/// the live drain rewrote more per step; at 8, more entries slowed the
/// rebuild. 16 keeps a block under ~0.6 KB: the store is 62.6 MB instead
/// of 80.5 at 32, the rebuild as fast. Wider windows for the finer
/// resolutions alone, where a long-tail token has ~4 buckets in 16
/// minutes, did not pay either (docs/benchmarks.md, "Wider windows for
/// the finer resolutions' price blocks"): 32 one-minute buckets saved a
/// long-tail `backfill --project` ~1.5 % of its instructions; 128, 64
/// and 32 for 1, 5 and 10 minutes ~15 % of its CPU, but steps the size
/// of a live projector's, which rewrite each busy token's open window,
/// then took 10 % longer and wrote 35 % more.
pub(crate) const BLOCK_BUCKETS: i64 = 16;

const WHAT: &str = "price bucket block";

/// One price bucket of a block: its key's bucket, the columns a bucket row
/// had, and its value as [`crate::rowcodec`] encoded it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Entry<'a> {
    /// The bucket's start, Unix ms.
    pub bucket: i64,
    pub count: u64,
    pub last_offset: u64,
    pub v: &'a [u8],
}

/// The first bucket of the window holding `bucket`, at a resolution
/// `width_ms` wide.
pub(crate) fn block_of(bucket: i64, width_ms: i64) -> i64 {
    let span = BLOCK_BUCKETS * width_ms;
    bucket.div_euclid(span) * span
}

/// Appends the blob of a block to a buffer, entry by entry, in ascending
/// buckets of its window. A bucket outside the window, off the
/// resolution's grid or not after the last is [`crate::Error::Corrupt`]:
/// the index kept for it would name another bucket.
pub(crate) struct Encoder<'o> {
    out: &'o mut Vec<u8>,
    block: i64,
    width_ms: i64,
    /// The least index the next entry may have.
    next: i64,
    last_offset: u64,
    n: u64,
    ticks: u64,
}

impl<'o> Encoder<'o> {
    /// Starts the block at `block` at the end of `out`.
    pub(crate) fn new(out: &'o mut Vec<u8>, block: i64, width_ms: i64) -> Self {
        Encoder {
            out,
            block,
            width_ms,
            next: 0,
            last_offset: 0,
            n: 0,
            ticks: 0,
        }
    }

    pub(crate) fn push(&mut self, e: Entry) -> Result<()> {
        let offset = e.bucket - self.block;
        let index = offset / self.width_ms;
        if offset % self.width_ms != 0 || index < self.next || index >= BLOCK_BUCKETS {
            return Err(Reader::new(&[], WHAT).corrupt(format_args!(
                "bucket {} is not after the last one of the window at {} ({} ms buckets)",
                e.bucket, self.block, self.width_ms
            )));
        }
        self.out.push(index as u8);
        put_zigzag(self.out, e.count as i64);
        put_zigzag(
            self.out,
            (e.last_offset as i64).wrapping_sub(self.last_offset as i64),
        );
        put_zigzag(self.out, e.v.len() as i64);
        self.out.extend_from_slice(e.v);
        self.next = index + 1;
        self.last_offset = e.last_offset;
        self.n += 1;
        self.ticks += e.count;
        Ok(())
    }

    /// How many entries the block holds, and the sum of their counts.
    pub(crate) fn finish(self) -> (u64, u64) {
        (self.n, self.ticks)
    }
}

/// The entries of the block at `block` an [`Encoder`] wrote, in bucket
/// order, borrowing their values from `v`; a malformed blob yields
/// [`crate::Error::Corrupt`] and then nothing.
pub(crate) fn entries(v: &[u8], block: i64, width_ms: i64) -> Entries<'_> {
    Entries {
        r: Reader::new(v, WHAT),
        v,
        block,
        width_ms,
        next: 0,
        last_offset: 0,
    }
}

pub(crate) struct Entries<'a> {
    r: Reader<'a>,
    v: &'a [u8],
    block: i64,
    width_ms: i64,
    next: i64,
    last_offset: u64,
}

impl<'a> Entries<'a> {
    fn entry(&mut self) -> Result<Entry<'a>> {
        let r = &mut self.r;
        let index = i64::from(r.byte()?);
        if index < self.next || index >= BLOCK_BUCKETS {
            return Err(r.corrupt(format_args!("bucket index {index} after {}", self.next - 1)));
        }
        let count = r.zigzag()?;
        if count < 0 {
            return Err(r.corrupt(format_args!("count {count}")));
        }
        self.last_offset = (self.last_offset as i64).wrapping_add(r.zigzag()?) as u64;
        let len = r.zigzag()?;
        let value = usize::try_from(len)
            .ok()
            .and_then(|len| self.v.get(r.at..r.at.checked_add(len)?))
            .ok_or_else(|| r.corrupt(format_args!("a value of {len} bytes at byte {}", r.at)))?;
        r.at += value.len();
        self.next = index + 1;
        Ok(Entry {
            bucket: self.block + index * self.width_ms,
            count: count as u64,
            last_offset: self.last_offset,
            v: value,
        })
    }
}

impl<'a> Iterator for Entries<'a> {
    type Item = Result<Entry<'a>>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.r.done() {
            return None;
        }
        let entry = self.entry();
        if entry.is_err() {
            // Nothing after a malformed entry can be read.
            self.r.at = self.v.len();
        }
        Some(entry)
    }
}

/// Appends to `out` the block at `block` holding the entries of `stored`
/// (a blob, empty for a new block) with `new` ones (ascending) merged in:
/// a new entry replaces the stored one of its bucket, as a row written
/// again replaced the row. Returns [`Encoder::finish`]'s counts.
pub(crate) fn merge_into<'a>(
    out: &mut Vec<u8>,
    stored: &'a [u8],
    block: i64,
    width_ms: i64,
    new: impl IntoIterator<Item = Entry<'a>>,
) -> Result<(u64, u64)> {
    let mut old = entries(stored, block, width_ms);
    let mut new = new.into_iter();
    let mut enc = Encoder::new(out, block, width_ms);
    let (mut o, mut n) = (old.next().transpose()?, new.next());
    loop {
        match (o, n) {
            (Some(a), Some(b)) if a.bucket < b.bucket => {
                enc.push(a)?;
                o = old.next().transpose()?;
            }
            (Some(a), Some(b)) if a.bucket == b.bucket => {
                enc.push(b)?;
                (o, n) = (old.next().transpose()?, new.next());
            }
            (_, Some(b)) => {
                enc.push(b)?;
                n = new.next();
            }
            (Some(a), None) => {
                enc.push(a)?;
                o = old.next().transpose()?;
            }
            (None, None) => return Ok(enc.finish()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: i64 = 60_000;
    /// 2025-09-01T00:00:00Z, a multiple of every window of 1-minute buckets.
    const BLOCK: i64 = 1_756_684_800_000 - 1_756_684_800_000 % (BLOCK_BUCKETS * MINUTE);

    fn encode<'a>(
        block: i64,
        width_ms: i64,
        entries: impl IntoIterator<Item = Entry<'a>>,
    ) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        let mut enc = Encoder::new(&mut out, block, width_ms);
        for e in entries {
            enc.push(e)?;
        }
        Ok(out)
    }

    fn decode(v: &[u8], block: i64, width_ms: i64) -> Result<Vec<Entry<'_>>> {
        entries(v, block, width_ms).collect()
    }

    fn entry(index: i64, count: u64, last_offset: u64, v: &[u8]) -> Entry<'_> {
        Entry {
            bucket: BLOCK + index * MINUTE,
            count,
            last_offset,
            v,
        }
    }

    #[test]
    fn a_block_round_trips_its_entries() {
        let entries = [
            entry(0, 1, 7, &[1, 2, 3]),
            entry(1, 40, 3, &[]),
            entry(BLOCK_BUCKETS - 2, 2, u64::MAX >> 1, &[9; 200]),
            entry(BLOCK_BUCKETS - 1, u64::MAX >> 1, 0, &[4]),
        ];
        let v = encode(BLOCK, MINUTE, entries).unwrap();
        assert_eq!(decode(&v, BLOCK, MINUTE).unwrap(), entries);
    }

    #[test]
    fn merged_entries_replace_the_stored_ones_of_their_bucket() {
        let stored = [
            entry(0, 1, 1, &[1]),
            entry(2, 1, 2, &[2]),
            entry(5, 1, 3, &[3]),
        ];
        let new = [
            entry(1, 1, 4, &[4]),
            entry(2, 2, 5, &[5]),
            entry(7, 1, 6, &[6]),
        ];
        let stored_blob = encode(BLOCK, MINUTE, stored).unwrap();
        let merge = |stored: &[u8], new: &[Entry]| {
            let mut out = vec![0xAA];
            let counts = merge_into(&mut out, stored, BLOCK, MINUTE, new.to_vec()).unwrap();
            // Appended after what `out` held.
            assert_eq!(out[0], 0xAA);
            (out[1..].to_vec(), counts)
        };
        let want = [stored[0], new[0], new[1], stored[2], new[2]];
        assert_eq!(
            merge(&stored_blob, &new),
            (encode(BLOCK, MINUTE, want).unwrap(), (5, 6))
        );
        assert_eq!(
            merge(&[], &new),
            (encode(BLOCK, MINUTE, new).unwrap(), (3, 4))
        );
        assert_eq!(merge(&stored_blob, &[]), (stored_blob.clone(), (3, 3)));
        // A malformed stored block is an error, not a block written short.
        let mut out = Vec::new();
        assert!(merge_into(&mut out, &stored_blob[..3], BLOCK, MINUTE, new).is_err());
    }

    #[test]
    fn buckets_fall_in_the_window_of_their_resolution() {
        let span = BLOCK_BUCKETS * MINUTE;
        assert_eq!(block_of(BLOCK, MINUTE), BLOCK);
        assert_eq!(block_of(BLOCK + span - MINUTE, MINUTE), BLOCK);
        assert_eq!(block_of(BLOCK + span, MINUTE), BLOCK + span);
        assert_eq!(block_of(BLOCK - MINUTE, MINUTE), BLOCK - span);
        // Before the epoch, still rounded down.
        assert_eq!(block_of(-MINUTE, MINUTE), -span);
    }

    #[test]
    fn buckets_out_of_order_or_outside_the_window_are_refused() {
        for entries in [
            vec![entry(1, 1, 1, &[]), entry(1, 1, 2, &[])],
            vec![entry(2, 1, 1, &[]), entry(1, 1, 2, &[])],
            vec![entry(BLOCK_BUCKETS, 1, 1, &[])],
            vec![entry(-1, 1, 1, &[])],
        ] {
            assert!(
                encode(BLOCK, MINUTE, entries.clone()).is_err(),
                "{entries:?}"
            );
        }
        let off_grid = Entry {
            bucket: BLOCK + 1,
            ..entry(0, 1, 1, &[])
        };
        assert!(encode(BLOCK, MINUTE, [off_grid]).is_err());
    }

    #[test]
    fn a_malformed_block_is_corrupt_not_a_panic() {
        let v = encode(BLOCK, MINUTE, [entry(3, 2, 9, &[5, 6, 7])]).unwrap();
        for cut in 0..v.len() {
            let short = &v[..cut];
            if cut > 0 {
                assert!(decode(short, BLOCK, MINUTE).is_err(), "cut at {cut}");
            }
        }
        // An index past the window, and one going backwards.
        assert!(decode(&[BLOCK_BUCKETS as u8, 2, 2, 0], BLOCK, MINUTE).is_err());
        assert!(decode(&[3, 2, 2, 0, 3, 2, 2, 0], BLOCK, MINUTE).is_err());
        // A value longer than what is left.
        assert!(decode(&[0, 2, 2, 100, 1], BLOCK, MINUTE).is_err());
        // A negative count.
        assert!(decode(&[0, 1, 2, 0], BLOCK, MINUTE).is_err());
    }
}
