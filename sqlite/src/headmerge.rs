//! The part of a token's step through its head ([`crate::head`]) that needs
//! no SQL: merging the step's price rows and price ticks into the head's
//! blocks and encoding them. It runs on a thread of its own, beside the
//! store's writer.
//!
//! Why: the writer's thread was the projector's slowest stage. Profiled on
//! a long-tail `rebuild` (2 000 tokens, 2 000 000 ticks) it was busy ~90 %
//! of the run while the thread folding the next step waited on it, and
//! close to half of its samples were this merging and encoding (rows'
//! values, bucket blocks, tick blocks), which need only the head and the
//! step. The writer now reads a token's head, merges into the full tables
//! whatever of the step lies behind the head (a late event: that needs
//! reads), and hands the rest here; it writes each merged head, and the
//! blocks the merge moved out of it, as they come back. Per token, what is
//! written is exactly what one thread wrote before, so a rebuilt store is
//! still byte for byte an incrementally projected one.

use crate::bucketblock::{self, Entry};
use crate::head::{self, Head};
use crate::store::{price_block_at, put_price_value, RowOrder};
use crate::tickblock::{self, PriceTick};
use crate::Result;
use hindsight_contracts::prefetch::prefetch;
use hindsight_contracts::{Row, TickKey};
use std::borrow::Cow;
use std::cmp::Ordering;
use std::sync::mpsc::{Receiver, Sender};

/// One token's work: its head as read, and what of the step is at or
/// after the head's blocks.
pub(crate) struct Job<'r> {
    pub sid: i64,
    pub head: Head,
    /// Price rows in key order, none behind the head's block at its
    /// resolution.
    pub rows: Cow<'r, [(RowOrder, &'r Row)]>,
    /// Price ticks in key order, distinct keys, none before the head's
    /// tick block.
    pub ticks: Vec<PriceTick>,
}

/// A price block moved out of a head: (`res` code, `block`), (`n`,
/// `ticks`), blob.
pub(crate) type MovedPriceBlock = ((i64, i64), (u64, u64), Vec<u8>);

/// A token's merged head, and the blocks the merge moved out of it, which
/// the full tables take.
pub(crate) struct Done {
    pub sid: i64,
    pub head: Head,
    pub price_blocks: Vec<MovedPriceBlock>,
    /// Tick blocks: start, tick count, blob.
    pub tick_blocks: Vec<(TickKey, u64, Vec<u8>)>,
}

/// Merges each job received and sends back its result, until the jobs
/// end or nobody takes the results.
pub(crate) fn run(jobs: Receiver<Job<'_>>, done: Sender<Result<Done>>) {
    let mut merger = Merger::default();
    for job in jobs {
        if done.send(merger.merge(job)).is_err() {
            return;
        }
    }
}

/// Buffers kept from token to token: a live step merges into tens of
/// thousands of heads, and an allocation per value and per block showed
/// in its profile.
#[derive(Default)]
struct Merger {
    /// The new values end to end.
    values: Vec<u8>,
    /// Each new row's count and where its value ends in `values`.
    parts: Vec<(u64, usize)>,
    merged: Vec<u8>,
}

impl Merger {
    fn merge(&mut self, job: Job<'_>) -> Result<Done> {
        let Job {
            sid,
            mut head,
            rows,
            ticks,
        } = job;
        let (mut price_blocks, mut tick_blocks) = (Vec::new(), Vec::new());
        self.price_rows(&mut head, &rows, &mut price_blocks)?;
        price_ticks(&mut head, ticks, &mut tick_blocks)?;
        Ok(Done {
            sid,
            head,
            price_blocks,
            tick_blocks,
        })
    }

    /// Merges a token's price rows into the head's blocks, block by block:
    /// a block of the head's window at its resolution is the head's, and a
    /// block past it becomes the head's, the block it held going to the
    /// full table.
    fn price_rows(
        &mut self,
        head: &mut Head,
        rows: &[(RowOrder, &Row)],
        moved: &mut Vec<MovedPriceBlock>,
    ) -> Result<()> {
        // The rows lie scattered, and a long tail's blocks hold one or two
        // each: the CPU is asked for the rows `AHEAD` past those merged, so
        // that it loads several at once rather than each in turn.
        const AHEAD: usize = 32;
        let all = rows;
        all.iter().take(AHEAD).for_each(|(_, row)| prefetch(*row));
        let mut done = 0;
        let at = |(order, _): &(RowOrder, &Row)| price_block_at(order);
        for rows in all.chunk_by(|a, b| at(a).0 == at(b).0) {
            let ahead = done + AHEAD..(done + AHEAD + rows.len()).min(all.len());
            let ahead = all.get(ahead).unwrap_or_default();
            ahead.iter().for_each(|(_, row)| prefetch(*row));
            done += rows.len();
            let ((_, res, block), resolution) = at(&rows[0]);
            let width = resolution.width_ms();
            self.merged.clear();
            let new = entries(rows, &mut self.values, &mut self.parts)?;
            let newest = &mut head.prices[resolution.index()];
            match newest.as_ref().map(|h| block.cmp(&h.block)) {
                Some(Ordering::Equal) => {
                    let h = newest.as_mut().expect("compared above");
                    (h.n, h.ticks) = bucketblock::merge_into(&mut self.merged, &h.v, block, width, new)?;
                    std::mem::swap(&mut h.v, &mut self.merged);
                }
                Some(Ordering::Less) => {
                    return Err(crate::Error::Corrupt(format!(
                        "a price row behind its head's block reached the merge (res {res}, block {block})"
                    )))
                }
                _ => {
                    // A newer window: the head's block, if any, is behind
                    // it from now on.
                    if let Some(h) = newest.take() {
                        moved.push(((res, h.block), (h.n, h.ticks), h.v));
                    }
                    let (n, ticks) = bucketblock::merge_into(&mut self.merged, &[], block, width, new)?;
                    *newest = Some(head::PriceBlock {
                        block,
                        n,
                        ticks,
                        v: std::mem::take(&mut self.merged),
                    });
                }
            }
        }
        Ok(())
    }
}

/// The rows of one price block (ascending buckets) as entries of it, their
/// values encoded end to end in `values`; `parts` keeps each row's count
/// and where its value ends. Both buffers are cleared first and reused
/// from block to block.
pub(crate) fn entries<'a>(
    rows: &'a [(RowOrder, &'a Row)],
    values: &'a mut Vec<u8>,
    parts: &'a mut Vec<(u64, usize)>,
) -> Result<impl Iterator<Item = Entry<'a>>> {
    values.clear();
    parts.clear();
    for (_, row) in rows {
        let count = put_price_value(values, row)?;
        parts.push((count, values.len()));
    }
    let (values, parts): (&'a Vec<u8>, &'a Vec<(u64, usize)>) = (values, parts);
    Ok(rows.iter().enumerate().map(move |(i, (_, row))| Entry {
        bucket: row.key.bucket.millis(),
        count: parts[i].0,
        last_offset: row.last_offset,
        v: &values[i.checked_sub(1).map_or(0, |j| parts[j].1)..parts[i].1],
    }))
}

/// Merges a token's price ticks into its head's tick block, by the rules
/// of [`crate::tickblock`]: when the block outgrows the cap its pieces but
/// the last go to the full table, the last staying the head's.
fn price_ticks(
    head: &mut Head,
    new: Vec<PriceTick>,
    moved: &mut Vec<(TickKey, u64, Vec<u8>)>,
) -> Result<()> {
    if new.is_empty() {
        return Ok(());
    }
    let merged = match head.ticks.take() {
        Some(h) => tickblock::merge(tickblock::decode(h.start, &h.v)?, &new),
        None => new,
    };
    let mut pieces = tickblock::pieces(&merged).peekable();
    while let Some(piece) = pieces.next() {
        let block = (piece[0].0, piece.len() as u64, tickblock::encode(piece));
        if pieces.peek().is_some() {
            moved.push(block);
        } else {
            let (start, n, v) = block;
            head.ticks = Some(head::TickBlock { start, n, v });
        }
    }
    Ok(())
}
