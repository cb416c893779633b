//! The batches this process appended last, kept as events for its own
//! consumer.
//!
//! Why: a projector in the process that appends (`hindsight dev`,
//! `backfill --project`) read each batch back from `log.db` moments after
//! it was written: a select, zstd's inflate and a decode of every envelope
//! into fresh strings, 8–14 % of a `backfill --project`'s samples, to
//! rebuild events the appender had held a moment before. Kept here once
//! committed, they are handed to the consumer as they are.
//!
//! The contract:
//! - a batch is kept only after its commit, under the offsets the file
//!   gave it, so a consumer is handed nothing the file does not hold;
//! - a batch is kept only if it ends within `cap` events of where the
//!   consumer last read, and what is kept never exceeds `cap` events: a
//!   consumer far behind (a backlog) reads the file as before, and the
//!   appends meanwhile cost no memory here (`cap` is 0, nothing kept,
//!   unless the appender asks: [`super::SqliteLog::lead_consumer`]);
//! - a consumer takes what it reads: the events move to it (copied only
//!   when the appender still shares the batch), and whatever lies behind
//!   its position is dropped. The file stays the source of every read
//!   that does not find its offset here: another consumer, one that
//!   starts over, one behind.

use hindsight_contracts::{Delivered, Position};
use hindsight_schemas::Event;
use std::collections::VecDeque;
use std::sync::Arc;

/// Batches appended by this process, in offset order, not yet taken.
#[derive(Debug)]
pub struct Recent {
    batches: VecDeque<Kept>,
    /// Events in `batches`.
    kept: usize,
    cap: usize,
    /// Where the consumer read up to last (the offset it reads next).
    consumer_at: u64,
    /// Consumers of the log in this process now: with none, an append
    /// has nothing to wait for ([`Recent::has_room`]).
    consumers: usize,
}

#[derive(Debug)]
struct Kept {
    /// The offset of `events[0]`.
    first: u64,
    events: Arc<Vec<Event>>,
    /// `events[..taken]` are handed out (only while the batch is shared:
    /// a batch of its own is drained instead).
    taken: usize,
}

impl Kept {
    fn next(&self) -> u64 {
        self.first + self.taken as u64
    }

    fn end(&self) -> u64 {
        self.first + self.events.len() as u64
    }
}

impl Recent {
    /// Keeps at most `cap` events (0: none).
    pub fn new(cap: usize) -> Self {
        Recent {
            batches: VecDeque::new(),
            kept: 0,
            cap,
            consumer_at: 0,
            consumers: 0,
        }
    }

    /// Keeps at most `cap` events from now on (set before any is kept).
    pub fn set_cap(&mut self, cap: usize) {
        self.cap = cap;
    }

    /// A consumer reading from `from` on.
    pub fn attach(&mut self, from: u64) {
        self.consumers += 1;
        self.consumed_to(from);
    }

    /// A consumer gone. What is kept stays, for the next one (a projector
    /// opens a consumer for each catch-up), up to `cap`.
    pub fn detach(&mut self) {
        self.consumers -= 1;
    }

    /// Events kept.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.kept
    }

    /// Whether a batch of `n` events appended at `head` would lie within
    /// `cap` events of the consumer (a batch larger than `cap`: once the
    /// consumer has read everything before it). Without a consumer, yes.
    pub fn has_room(&self, head: u64, n: usize) -> bool {
        let ahead = (head + n as u64).saturating_sub(self.consumer_at);
        self.consumers == 0 || ahead <= self.cap.max(n) as u64
    }

    /// A batch just committed at `first`: kept if it ends within `cap`
    /// events of the consumer and fits.
    pub fn keep(&mut self, first: u64, events: Arc<Vec<Event>>) {
        let n = events.len();
        let end = first + n as u64;
        let near = end.saturating_sub(self.consumer_at) <= self.cap as u64;
        if n == 0 || !near || self.kept + n > self.cap || first < self.consumer_at {
            return;
        }
        // The log keeps a batch under its write lock, so in offset order;
        // one out of it would still go in its place.
        let at = self.batches.partition_point(|b| b.first < first);
        self.batches.insert(
            at,
            Kept {
                first,
                events,
                taken: 0,
            },
        );
        self.kept += n;
    }

    /// Moves the kept events from offset `from` on into `out`, in order,
    /// until it holds `max` or the next offset is not kept; drops what lies
    /// behind `from`. Returns the first offset kept past those taken, if
    /// any: what lies before it is only in the file.
    pub fn take(&mut self, from: u64, max: usize, out: &mut Vec<Delivered>) -> Option<u64> {
        let mut from = from;
        self.consumer_at = from;
        while let Some(front) = self.batches.front_mut() {
            if front.end() <= from {
                self.kept -= front.events.len() - front.taken;
                self.batches.pop_front();
                continue;
            }
            if front.next() > from || out.len() >= max {
                break;
            }
            // Skip what lies behind `from`, then take up to `max`.
            let skip = (from - front.next()) as usize;
            let n = (front.events.len() - front.taken - skip).min(max - out.len());
            let offset = from;
            match Arc::get_mut(&mut front.events) {
                Some(events) => {
                    // Its own: the events move out, and the batch's start
                    // moves past them.
                    events.drain(..front.taken + skip);
                    front.first = offset;
                    front.taken = 0;
                    out.extend(events.drain(..n).zip(offset..).map(delivered));
                    front.first += n as u64;
                }
                None => {
                    let start = front.taken + skip;
                    out.extend(
                        front.events[start..start + n]
                            .iter()
                            .cloned()
                            .zip(offset..)
                            .map(delivered),
                    );
                    front.taken = start + n;
                }
            }
            self.kept -= skip + n;
            from += n as u64;
            self.consumer_at = from;
            if front.next() == front.end() {
                self.batches.pop_front();
            }
        }
        self.batches.front().map(Kept::next)
    }

    /// The consumer reads on from `from` (having read the file up to it).
    pub fn consumed_to(&mut self, from: u64) {
        self.take(from, 0, &mut Vec::new());
    }
}

fn delivered((event, offset): (Event, u64)) -> Delivered {
    Delivered {
        position: Position {
            partition: 0,
            offset,
        },
        event,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hindsight_schemas::{PriceTick, Timestamp};

    fn batch(first: u64, n: u64) -> Arc<Vec<Event>> {
        Arc::new(
            (first..first + n)
                .map(|i| {
                    Event::Price(PriceTick {
                        market_id: "m".into(),
                        token_id: format!("t{i}"),
                        ts: Timestamp(i as i64),
                        p: 0.5,
                    })
                })
                .collect(),
        )
    }

    fn attached(cap: usize) -> Recent {
        let mut recent = Recent::new(cap);
        recent.attach(0);
        recent
    }

    #[test]
    fn keeps_nothing_at_cap_zero() {
        let mut recent = attached(0);
        recent.keep(0, batch(0, 10));
        assert_eq!(recent.len(), 0);
    }

    /// An append waits for a consumer only while there is one, and a batch
    /// larger than the cap until the consumer has read all before it.
    #[test]
    fn there_is_room_within_cap_of_the_consumer_or_without_one() {
        let mut recent = Recent::new(100);
        assert!(recent.has_room(1_000, 10), "no consumer");
        recent.attach(0);
        assert!(recent.has_room(90, 10));
        assert!(!recent.has_room(91, 10));
        assert!(!recent.has_room(1, 150));
        assert!(recent.has_room(0, 150), "caught up");
        recent.consumed_to(50);
        assert!(recent.has_room(140, 10));
        recent.detach();
        assert!(recent.has_room(1_000, 10), "the consumer gone");
    }

    /// A projector opens a consumer for each catch-up: what was kept for
    /// one, and appended between them, is there for the next.
    #[test]
    fn what_is_kept_outlasts_a_consumer() {
        let mut recent = attached(100);
        recent.keep(0, batch(0, 10));
        recent.detach();
        recent.keep(10, batch(10, 10));
        recent.attach(0);
        let mut out = Vec::new();
        recent.take(0, 100, &mut out);
        assert_eq!(offsets(&out), (0..20).collect::<Vec<_>>());
    }

    /// The offsets handed out, each checked against the event kept there.
    fn offsets(out: &[Delivered]) -> Vec<u64> {
        for d in out {
            let Event::Price(tick) = &d.event else {
                panic!("a tick")
            };
            assert_eq!(tick.token_id, format!("t{}", d.position.offset));
        }
        out.iter().map(|d| d.position.offset).collect()
    }

    #[test]
    fn takes_in_order_across_batches_up_to_max() {
        let mut recent = attached(100);
        recent.keep(0, batch(0, 10));
        recent.keep(10, batch(10, 10));
        let mut out = Vec::new();
        assert_eq!(recent.take(0, 15, &mut out), Some(15));
        assert_eq!(offsets(&out), (0..15).collect::<Vec<_>>());
        assert_eq!(recent.len(), 5);
        out.clear();
        assert_eq!(recent.take(15, 100, &mut out), None);
        assert_eq!(offsets(&out), (15..20).collect::<Vec<_>>());
        assert_eq!(recent.len(), 0);
    }

    #[test]
    fn a_shared_batch_is_copied_and_its_events_stay_with_the_sharer() {
        let mut recent = attached(100);
        let shared = batch(0, 10);
        recent.keep(0, shared.clone());
        let mut out = Vec::new();
        recent.take(0, 4, &mut out);
        recent.take(4, 100, &mut out);
        assert_eq!(offsets(&out), (0..10).collect::<Vec<_>>());
        assert_eq!(shared.len(), 10, "the sharer's batch is whole");
        assert_eq!(recent.len(), 0);
    }

    #[test]
    fn what_lies_behind_the_consumer_is_dropped_and_a_gap_is_reported() {
        let mut recent = attached(100);
        recent.keep(0, batch(0, 10));
        recent.keep(20, batch(20, 10));
        let mut out = Vec::new();
        // Read 0..13 from the file: the kept 0..10 is behind, 10..20 is not
        // kept, so nothing is taken and the next kept offset is 20.
        assert_eq!(recent.take(13, 100, &mut out), Some(20));
        assert!(out.is_empty());
        assert_eq!(recent.len(), 10);
        // From inside a kept batch: the part behind is skipped.
        assert_eq!(recent.take(25, 100, &mut out), None);
        assert_eq!(offsets(&out), (25..30).collect::<Vec<_>>());
        assert_eq!(recent.len(), 0);
    }

    #[test]
    fn keeps_nothing_past_its_cap_from_the_consumer() {
        let mut recent = attached(25);
        recent.keep(0, batch(0, 10));
        recent.keep(10, batch(10, 10));
        recent.keep(20, batch(20, 10)); // ends 30 past the consumer: not kept
        assert_eq!(recent.len(), 20);
        let mut out = Vec::new();
        assert_eq!(recent.take(0, 100, &mut out), None);
        assert_eq!(offsets(&out), (0..20).collect::<Vec<_>>());
        // The consumer read 20..30 from the file; now 30..40 is near it.
        recent.consumed_to(30);
        recent.keep(30, batch(30, 10));
        assert_eq!(recent.len(), 10);
        // A consumer far behind: appends are not kept.
        recent.consumed_to(0);
        recent.keep(40, batch(40, 10));
        assert_eq!(recent.len(), 10);
    }

    #[test]
    fn batches_reported_out_of_order_are_kept_in_order() {
        let mut recent = attached(100);
        recent.keep(10, batch(10, 10));
        recent.keep(0, batch(0, 10));
        let mut out = Vec::new();
        recent.take(0, 100, &mut out);
        assert_eq!(offsets(&out), (0..20).collect::<Vec<_>>());
    }
}
