//! The rollup engine: events in, bucket rows out, at every resolution.
//!
//! Per batch: [`Rollup::series_of`] names the series met for the first time,
//! whose bounds the caller reads from the store
//! ([`Rollup::learn_frontiers`]); [`Rollup::missing`] names the rows the
//! batch touches that are not in memory and may be stored, the caller loads
//! them ([`Rollup::fill`]), [`Rollup::apply`] folds the events in log
//! order, and [`Rollup::drain_dirty`] hands back the changed rows to write.
//!
//! Two properties make the read tables exact:
//! - **Replay-safe**: each row remembers the offset of the last event folded
//!   into it; an event at or before that offset is a re-delivery and skipped.
//!   (All events of a row come from one log partition: the record key is the
//!   market id.)
//! - **Batch-independent**: a row is always continued from its stored value,
//!   adding events one at a time in log order, so the floating-point sums are
//!   bit-identical however the log was cut into batches — a `rebuild`
//!   reproduces incremental tables exactly.
//!
//! Speed: the engine interns ids once per event, and keeps per id and
//! resolution a cursor on the open bucket; in-order ticks hit the cursor with
//! one comparison per resolution and never hash.

use hindsight_contracts::prefetch::prefetch;
use hindsight_contracts::Delivered;
use hindsight_contracts::{Candle, Frontiers, Mark, Row, RowKey, RowValue, Series, Table};
use hindsight_schemas::{BookLevel, Event, Resolution, Timestamp};
use rustc_hash::FxHashMap;
use smallvec::SmallVec;
use std::sync::Arc;

mod chunked;
use chunked::Chunked;

const NRES: usize = Resolution::ALL.len();

/// How many events ahead [`Rollup::missing`] and [`Rollup::apply`] have
/// the CPU load what they will touch ([`prefetch`]): on a long tail most
/// ticks open a bucket, so a step's slots and bucket lists lie scattered
/// in memory, and waiting on each in turn was half of those loops' time
/// (`perf annotate`).
const AHEAD: usize = 2;

/// A series' slots at one resolution, by bucket. Between steps most hold
/// one (the open row), kept inline: a heap `Vec` each cost ~60 bytes more
/// per series and resolution, 42 MB over 100 000 tokens (`heaptrack`).
/// 24 bytes with smallvec's `union` feature (which tells inline from
/// spilled by the capacity rather than by a tag of its own), 32 without.
type Buckets = SmallVec<[(i64, u32); 1]>;

/// The bucket a series' last event fell in at one resolution, and its
/// slot. Its end is the start plus the resolution's width, not kept: a
/// series holds one cursor per resolution, and over 100 000 series a
/// field costs 5.6 MB.
#[derive(Clone, Copy)]
struct Cursor {
    start: i64,
    slot: u32,
}

impl Cursor {
    /// Whether `ts` falls in the cursor's bucket, `width` ms wide.
    #[inline]
    fn covers(self, ts: i64, width: i64) -> bool {
        // `NO_CURSOR` covers nothing: its slot is no slot.
        self.slot != u32::MAX && ts >= self.start && ts - self.start < width
    }
}

const NO_CURSOR: Cursor = Cursor {
    start: 0,
    slot: u32::MAX,
};

/// Each resolution's width in ms, by index.
const WIDTHS: [i64; NRES] = {
    let mut w = [0; NRES];
    let mut r = 0;
    while r < NRES {
        w[r] = Resolution::ALL[r].width_ms();
        r += 1;
    }
    w
};

#[derive(Debug, Clone)]
enum Levels {
    /// As loaded from the store.
    Json(String),
    /// From an event folded in this process.
    Parsed(Vec<BookLevel>),
}

#[derive(Debug, Clone)]
enum State {
    /// `candle` is `None` only for a row loaded without one (projected
    /// before candles were stored): it stays without, see `RowValue::Price`.
    Price {
        sum: f64,
        count: u64,
        candle: Option<Candle>,
    },
    Metrics {
        volume: f64,
        liquidity: f64,
        spread: f64,
        count: u64,
    },
    Book {
        ts: Timestamp,
        offset: u64,
        bids: Levels,
        asks: Levels,
    },
    /// Not loaded yet, or absent from the store: nothing folded.
    Empty,
}

struct Slot {
    series: u32,
    res: Resolution,
    bucket: i64,
    state: State,
    /// The offset after the last event folded in; 0 for a row never
    /// written, so that an event is a replay when its offset is below it.
    /// (An `Option` of the last offset took 8 bytes more per slot.)
    next: u64,
    dirty: bool,
}

/// What one [`Rollup::apply`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ApplyStats {
    pub prices: u64,
    pub books: u64,
    pub metrics: u64,
    /// Row updates skipped because the row already held the event.
    pub replays_skipped: u64,
}

impl std::ops::AddAssign for ApplyStats {
    fn add_assign(&mut self, other: ApplyStats) {
        self.prices += other.prices;
        self.books += other.books;
        self.metrics += other.metrics;
        self.replays_skipped += other.replays_skipped;
    }
}

#[derive(Default)]
pub struct Rollup {
    /// Per table, each id's series. The key is the series' own `Arc`, so
    /// an id is allocated once, not twice.
    interned: [FxHashMap<Arc<str>, u32>; 3],
    series: Vec<(Table, Arc<str>)>,
    cursors: Vec<[Cursor; NRES]>,
    /// Per series and resolution, the slots in memory by bucket, in
    /// bucket order. Events come mostly in time order, so the bucket a
    /// cursor moves on to is usually past every one in memory: found
    /// absent and added by a comparison with the last, where a map of
    /// every slot cost a hash and a cache miss or two per new bucket.
    buckets: Vec<[Buckets; NRES]>,
    /// The rows in memory, by slot number; chunked, so the memory of rows
    /// forgotten goes back (see [`chunked`]).
    slots: Chunked<Slot>,
    /// Series index of each event of the batch being applied (u32::MAX for
    /// catalog events), filled by `series_of`.
    batch_series: Vec<u32>,
    /// The slot of each event of the batch at each resolution (`NRES` per
    /// event, u32::MAX for catalog events), filled by `missing`: `apply`
    /// folds into them without looking a bucket up again. (Looked up
    /// again, each event's bucket was no longer the one its cursor ended
    /// on in `missing`, and a search found it: a tenth of the fold.)
    batch_slots: Vec<u32>,
    /// Slots changed since the last drain, each listed once.
    dirty: Vec<u32>,
    /// Slots of the last drain: the rows of the write that may still be in
    /// flight, which [`Rollup::forget_rows`] keeps.
    drained: Vec<u32>,
    /// Per series and resolution, the store's frontier: from this bucket
    /// on, the store holds no row of the series that is not in memory, so
    /// a row missing from memory there is absent and is not loaded.
    /// `UNKNOWN` (no bucket is past it) until the store's bound is learnt
    /// ([`Rollup::learn_frontiers`]), or the least bucket when the store is
    /// known to be empty ([`Rollup::store_emptied`]); then it moves past
    /// every row forgotten ([`Rollup::forget_rows`]).
    frontier: Vec<[i64; NRES]>,
    /// Series interned with an `UNKNOWN` frontier whose bound has not been
    /// asked for, then (from [`Rollup::series_of`] to
    /// [`Rollup::learn_frontiers`]) those being asked for.
    unasked: Vec<u32>,
    asking: Vec<u32>,
    /// The store held no row when [`Rollup::store_emptied`] was last
    /// called, and nothing since ([`Rollup::clear`]) has made its rows
    /// unknown: a series seen for the first time has none stored.
    store_known: bool,
}

/// The frontier of a series the store may hold any row of.
const UNKNOWN: i64 = i64::MAX;

fn table_of(event: &Event) -> Option<(Table, &str)> {
    match event {
        Event::Price(e) => Some((Table::Prices, &e.token_id)),
        Event::Book(e) => Some((Table::Books, &e.token_id)),
        Event::Metrics(e) => Some((Table::Metrics, &e.market_id)),
        _ => None,
    }
}

fn ts_of(event: &Event) -> i64 {
    match event {
        Event::Price(e) => e.ts.0,
        Event::Book(e) => e.ts.0,
        Event::Metrics(e) => e.ts.0,
        _ => 0,
    }
}

impl Rollup {
    pub fn new() -> Self {
        Self::default()
    }

    /// Rows in memory.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    fn intern(&mut self, table: Table, id: &str) -> u32 {
        let map = &mut self.interned[table as usize];
        if let Some(&i) = map.get(id) {
            return i;
        }
        let i = self.series.len() as u32;
        let id: Arc<str> = id.into();
        map.insert(id.clone(), i);
        self.series.push((table, id));
        self.cursors.push([NO_CURSOR; NRES]);
        self.buckets.push(Default::default());
        let frontier = if self.store_known {
            i64::MIN
        } else {
            self.unasked.push(i);
            UNKNOWN
        };
        self.frontier.push([frontier; NRES]);
        i
    }

    /// The slot of (series, res, bucket of ts), creating an empty one (and
    /// reporting it in `missing`) when the row is not in memory.
    #[inline]
    fn slot_for(&mut self, series: u32, r: usize, ts: i64, missing: &mut Vec<RowKey>) -> u32 {
        let c = self.cursors[series as usize][r];
        if c.covers(ts, WIDTHS[r]) {
            return c.slot;
        }
        self.slot_slow(series, r, ts, missing)
    }

    #[cold]
    fn slot_slow(&mut self, series: u32, r: usize, ts: i64, missing: &mut Vec<RowKey>) -> u32 {
        let res = Resolution::ALL[r];
        let width = res.width_ms();
        let bucket = ts.div_euclid(width) * width;
        let slot = match find(&self.buckets[series as usize][r], bucket) {
            Ok(s) => s,
            Err(at) => {
                let s = self.slots.len() as u32;
                self.slots.push(Slot {
                    series,
                    res,
                    bucket,
                    state: State::Empty,
                    next: 0,
                    dirty: false,
                });
                self.buckets[series as usize][r].insert(at, (bucket, s));
                let stored = bucket < self.frontier[series as usize][r];
                if stored {
                    let (table, id) = &self.series[series as usize];
                    missing.push(RowKey {
                        table: *table,
                        id: id.clone(),
                        res,
                        bucket: Timestamp(bucket),
                    });
                }
                s
            }
        };
        self.cursors[series as usize][r] = Cursor {
            start: bucket,
            slot,
        };
        slot
    }

    /// Takes in the series of the batch's events and returns those whose
    /// stored rows are not known: read their bounds from the store
    /// ([`hindsight_contracts::ProjectionStore::frontiers`]) and pass them
    /// to [`Rollup::learn_frontiers`]. A series never asked for keeps an
    /// `UNKNOWN` frontier: each row of it not in memory is loaded.
    pub fn series_of(&mut self, batch: &[Delivered]) -> Vec<Series> {
        self.batch_series.clear();
        self.batch_slots.clear();
        for d in batch {
            let series = match table_of(&d.event) {
                Some((table, id)) => self.intern(table, id),
                None => u32::MAX,
            };
            self.batch_series.push(series);
        }
        self.asking = std::mem::take(&mut self.unasked);
        self.asking
            .iter()
            .map(|&i| self.series[i as usize].clone())
            .collect()
    }

    /// The store's bounds of the series [`Rollup::series_of`] returned, in
    /// its order. None of their rows is in memory yet, so the frontier is
    /// the store's bound.
    pub fn learn_frontiers(&mut self, frontiers: Vec<Frontiers>) {
        assert_eq!(
            frontiers.len(),
            self.asking.len(),
            "one bound per series asked for"
        );
        for (i, bounds) in self.asking.drain(..).zip(frontiers) {
            self.frontier[i as usize] = bounds.map(|b| b.0);
        }
    }

    /// The id interned for the `i`th event of the batch given to
    /// [`Rollup::series_of`]: its token's or market's, shared by its rows.
    /// `None` for an event with no series.
    pub fn batch_id(&self, i: usize) -> Option<&Arc<str>> {
        let series = *self.batch_series.get(i)?;
        self.series.get(series as usize).map(|(_, id)| id)
    }

    /// Rows the batch given to [`Rollup::series_of`] touches that are not in
    /// memory and may be stored: load them from the store and pass them to
    /// [`Rollup::fill`] before [`Rollup::apply`].
    pub fn missing(&mut self, batch: &[Delivered]) -> Vec<RowKey> {
        assert_eq!(
            batch.len(),
            self.batch_series.len(),
            "the batch given to series_of"
        );
        let mut missing = Vec::new();
        self.batch_slots.clear();
        self.batch_slots.reserve(batch.len() * NRES);
        for (d, i) in batch.iter().zip(0..) {
            self.prefetch_buckets(batch, i + AHEAD);
            let series = self.batch_series[i];
            if series == u32::MAX {
                self.batch_slots.extend([u32::MAX; NRES]);
                continue;
            }
            let ts = ts_of(&d.event);
            for r in 0..NRES {
                let slot = self.slot_for(series, r, ts, &mut missing);
                self.batch_slots.push(slot);
            }
        }
        missing
    }

    /// Has the CPU load the last bucket of each of event `i`'s series'
    /// bucket lists its cursor does not cover: where [`Rollup::slot_slow`]
    /// will look. A long tail's sparse tokens open a bucket with nearly
    /// every tick, and those lists lie scattered in memory.
    #[inline]
    fn prefetch_buckets(&self, batch: &[Delivered], i: usize) {
        let (Some(d), Some(&series)) = (batch.get(i), self.batch_series.get(i)) else {
            return;
        };
        if series == u32::MAX {
            return;
        }
        let ts = ts_of(&d.event);
        let cursors = &self.cursors[series as usize];
        for (r, buckets) in self.buckets[series as usize].iter().enumerate() {
            if !cursors[r].covers(ts, WIDTHS[r]) {
                if let Some(last) = buckets.last() {
                    prefetch(last);
                }
            }
        }
    }

    /// Stored values of rows reported by [`Rollup::missing`].
    pub fn fill(&mut self, rows: Vec<Row>) {
        for row in rows {
            let series = self.intern(row.key.table, &row.key.id);
            let in_memory = &self.buckets[series as usize][row.key.res.index()];
            let Ok(s) = find(in_memory, row.key.bucket.0) else {
                continue;
            };
            let slot = &mut self.slots[s as usize];
            slot.next = row.last_offset + 1;
            slot.state = match row.value {
                RowValue::Price { sum, count, candle } => State::Price { sum, count, candle },
                RowValue::Metrics {
                    volume_sum,
                    liquidity_sum,
                    spread_sum,
                    count,
                } => State::Metrics {
                    volume: volume_sum,
                    liquidity: liquidity_sum,
                    spread: spread_sum,
                    count,
                },
                RowValue::Book {
                    ts,
                    offset,
                    bids,
                    asks,
                } => State::Book {
                    ts,
                    offset,
                    bids: Levels::Json(bids),
                    asks: Levels::Json(asks),
                },
            };
        }
    }

    /// Folds the batch (the same slice given to `series_of` and `missing`)
    /// in log order.
    pub fn apply(&mut self, batch: &[Delivered]) -> ApplyStats {
        assert_eq!(
            batch.len() * NRES,
            self.batch_slots.len(),
            "apply the batch given to missing"
        );
        let mut stats = ApplyStats::default();
        for (i, d) in batch.iter().enumerate() {
            // The slots of an event a few ahead: they lie scattered in
            // memory, and waiting for each in turn was half of this loop.
            let ahead = (i + AHEAD) * NRES..(i + AHEAD + 1) * NRES;
            for &s in self.batch_slots.get(ahead).unwrap_or_default() {
                self.slots.prefetch(s as usize);
            }
            let series = self.batch_series[i];
            if series == u32::MAX {
                continue;
            }
            let offset = d.position.offset;
            match &d.event {
                Event::Price(_) => stats.prices += 1,
                Event::Book(_) => stats.books += 1,
                Event::Metrics(_) => stats.metrics += 1,
                _ => {}
            }
            for &s in &self.batch_slots[i * NRES..(i + 1) * NRES] {
                let slot = &mut self.slots[s as usize];
                if offset < slot.next {
                    stats.replays_skipped += 1;
                    continue;
                }
                // Price ticks are most of the traffic: add in place without
                // the general (event, state) dispatch.
                match (&d.event, &mut slot.state) {
                    (Event::Price(e), State::Price { sum, count, candle }) => {
                        *sum += e.p;
                        *count += 1;
                        if let Some(c) = candle {
                            c.fold(mark(e, offset));
                        }
                    }
                    (event, state) => fold(state, event, offset),
                }
                slot.next = offset + 1;
                if !slot.dirty {
                    slot.dirty = true;
                    self.dirty.push(s);
                }
            }
        }
        stats
    }

    /// How many rows changed since the last drain.
    pub fn dirty_rows(&self) -> usize {
        self.dirty.len()
    }

    /// Rows changed since the last drain, ready to write.
    pub fn drain_dirty(&mut self) -> Vec<Row> {
        let mut rows = Vec::with_capacity(self.dirty.len());
        self.drained.clear();
        self.drained.extend_from_slice(&self.dirty);
        for s in self.dirty.drain(..) {
            let slot = &mut self.slots[s as usize];
            slot.dirty = false;
            let (table, id) = &self.series[slot.series as usize];
            let value = match &slot.state {
                State::Price { sum, count, candle } => RowValue::Price {
                    sum: *sum,
                    count: *count,
                    candle: *candle,
                },
                State::Metrics {
                    volume,
                    liquidity,
                    spread,
                    count,
                } => RowValue::Metrics {
                    volume_sum: *volume,
                    liquidity_sum: *liquidity,
                    spread_sum: *spread,
                    count: *count,
                },
                State::Book {
                    ts,
                    offset,
                    bids,
                    asks,
                } => RowValue::Book {
                    ts: *ts,
                    offset: *offset,
                    bids: levels_json(bids),
                    asks: levels_json(asks),
                },
                State::Empty => unreachable!("a dirty row has folded at least one event"),
            };
            rows.push(Row {
                key: RowKey {
                    table: *table,
                    id: id.clone(),
                    res: slot.res,
                    bucket: Timestamp(slot.bucket),
                },
                value,
                // A dirty row folded an event: `next` is past it.
                last_offset: slot.next - 1,
            });
        }
        rows
    }

    /// Forgets every row and what is known of the store (after a failed
    /// write, which may have left some of its rows, or when another
    /// projector may have written): rows are loaded again when next
    /// touched.
    pub fn clear(&mut self) {
        self.interned.iter_mut().for_each(|m| m.clear());
        self.series.clear();
        self.cursors.clear();
        self.buckets.clear();
        self.frontier.clear();
        self.unasked.clear();
        self.asking.clear();
        self.store_known = false;
        self.slots.clear();
        self.batch_series.clear();
        self.batch_slots.clear();
        self.dirty.clear();
        self.drained.clear();
    }

    /// Hands back what a backlog's large steps grew: the rows' and the
    /// batch buffers' spare capacity, which stays resident otherwise (a
    /// step's pages are touched up to the largest it held). For an idle
    /// projector; the next large step grows them again.
    pub fn shrink(&mut self) {
        self.slots.shrink_to_fit();
        self.batch_series = Vec::new();
        self.batch_slots = Vec::new();
        self.dirty.shrink_to_fit();
        self.drained.shrink_to_fit();
    }

    /// Forgets rows in memory (when memory grows past its bound), except:
    /// - the rows of the last drain, which may be in the write still in
    ///   flight: no row may be loaded from the store before its last write
    ///   lands. Keeping them, rather than waiting for that write, spares
    ///   the writer idling through the next poll and fold (on a live drain,
    ///   every third step);
    /// - each series' last bucket at each resolution, its open row, which
    ///   the next events most likely fold into — unless, with the first
    ///   kind, they would be more than `bound` rows (a hundred thousand
    ///   series' open rows alone can be): memory is what the bound is for.
    ///
    /// A forgotten row is durable, and is loaded again when next touched.
    /// A known frontier moves past each one, since the store holds it: rows
    /// at or past the frontier were all in memory. (`UNKNOWN` stays.) The
    /// series stay, with what is known of them.
    pub fn forget_rows(&mut self, bound: usize) {
        let mut keep = vec![false; self.slots.len()];
        for &s in self.drained.iter().chain(&self.dirty) {
            keep[s as usize] = true;
        }
        let open = || self.buckets.iter().flatten().filter_map(|b| b.last());
        let kept = keep.iter().filter(|k| **k).count();
        if kept + open().filter(|(_, s)| !keep[*s as usize]).count() <= bound {
            for &(_, s) in open() {
                keep[s as usize] = true;
            }
        }
        // Old slot number -> new, `u32::MAX` for a slot forgotten. The
        // chunks past the last slot kept are freed.
        let mut renumbered = vec![u32::MAX; self.slots.len()];
        let mut next = 0u32;
        let mut i = 0;
        self.slots.retain(|slot| {
            let kept = keep[i];
            if kept {
                renumbered[i] = next;
                next += 1;
            } else {
                let frontier = &mut self.frontier[slot.series as usize][slot.res.index()];
                *frontier = (*frontier).max(slot.bucket + 1);
            }
            i += 1;
            kept
        });
        for b in self.buckets.iter_mut().flatten() {
            b.retain(|(_, s)| {
                *s = renumbered[*s as usize];
                *s != u32::MAX
            });
            // Freed, not only emptied, where most of a series' rows went:
            // after a bound on memory is reached, a hundred thousand
            // series' capacity would stay behind. One left goes back inline.
            if b.capacity() > 2 * b.len() + 4 || (b.spilled() && b.len() <= 1) {
                b.shrink_to_fit();
            }
        }
        for c in self.cursors.iter_mut().flatten() {
            if c.slot != u32::MAX {
                c.slot = renumbered[c.slot as usize];
                if c.slot == u32::MAX {
                    *c = NO_CURSOR;
                }
            }
        }
        for s in self.drained.iter_mut().chain(self.dirty.iter_mut()) {
            *s = renumbered[*s as usize];
        }
        self.batch_series.clear();
        self.batch_slots.clear();
    }

    /// The store holds no row (it was just reset) and, until [`Rollup::clear`],
    /// only this rollup writes the rows of the series it folds: every row
    /// past the last one it wrote for a series is absent without a load.
    pub fn store_emptied(&mut self) {
        self.clear();
        self.store_known = true;
    }
}

/// The slot of `bucket` among a series' buckets at one resolution (in
/// bucket order), or where to insert it: a bucket past the last (the usual
/// case) without a search.
#[inline]
fn find(buckets: &[(i64, u32)], bucket: i64) -> std::result::Result<u32, usize> {
    match buckets.last() {
        Some(&(last, _)) if last < bucket => Err(buckets.len()),
        None => Err(0),
        _ => buckets
            .binary_search_by_key(&bucket, |&(b, _)| b)
            .map(|i| buckets[i].1),
    }
}

#[inline]
fn fold(state: &mut State, event: &Event, offset: u64) {
    match (event, &mut *state) {
        (Event::Price(e), State::Price { sum, count, candle }) => {
            *sum += e.p;
            *count += 1;
            if let Some(c) = candle {
                c.fold(mark(e, offset));
            }
        }
        (Event::Price(e), State::Empty) => {
            *state = State::Price {
                sum: e.p,
                count: 1,
                candle: Some(Candle::of(mark(e, offset))),
            }
        }
        (
            Event::Metrics(e),
            State::Metrics {
                volume,
                liquidity,
                spread,
                count,
            },
        ) => {
            *volume += e.volume;
            *liquidity += e.liquidity;
            *spread += e.spread;
            *count += 1;
        }
        (Event::Metrics(e), State::Empty) => {
            *state = State::Metrics {
                volume: e.volume,
                liquidity: e.liquidity,
                spread: e.spread,
                count: 1,
            }
        }
        (
            Event::Book(e),
            State::Book {
                ts, offset: held, ..
            },
        ) => {
            // The latest snapshot wins; equal timestamps go to the later
            // log position.
            if (e.ts, offset) > (*ts, *held) {
                *state = book_state(e, offset);
            }
        }
        (Event::Book(e), State::Empty) => *state = book_state(e, offset),
        (event, state) => unreachable!("{:?} folded into {state:?}", event.kind()),
    }
}

/// A tick's place in its bucket's candle.
#[inline]
fn mark(e: &hindsight_schemas::PriceTick, offset: u64) -> Mark {
    Mark {
        ts: e.ts,
        offset,
        p: e.p,
    }
}

fn book_state(e: &hindsight_schemas::BookSnapshot, offset: u64) -> State {
    State::Book {
        ts: e.ts,
        offset,
        bids: Levels::Parsed(e.bids.clone()),
        asks: Levels::Parsed(e.asks.clone()),
    }
}

/// `[[price,size],…]`, the form the API serves.
fn levels_json(levels: &Levels) -> String {
    match levels {
        Levels::Json(s) => s.clone(),
        Levels::Parsed(v) => levels_text(v),
    }
}

/// `[[price,size],…]` of parsed levels: the text bucket rows and tick-level
/// snapshots both store.
pub(crate) fn levels_text(levels: &[BookLevel]) -> String {
    let pairs: Vec<[f64; 2]> = levels.iter().map(|l| [l.price, l.size]).collect();
    serde_json::to_string(&pairs).expect("finite floats serialize")
}

#[cfg(test)]
mod tests {
    use super::*;
    use hindsight_contracts::Position;
    use hindsight_schemas::{BookSnapshot, MetricsSample, PriceTick};

    /// What the rollup keeps per row and per series and resolution: over
    /// 100 000 tokens there are ~700 000 of each, so a field added here
    /// shows in the live path's memory (see the types' comments).
    #[test]
    fn a_slot_a_cursor_and_a_bucket_list_stay_small() {
        assert_eq!(std::mem::size_of::<Slot>(), 112);
        assert_eq!(std::mem::size_of::<Cursor>(), 16);
        assert_eq!(std::mem::size_of::<Buckets>(), 24);
    }

    const T0: i64 = 1_756_684_800_000; // 2025-09-01T00:00:00Z

    fn at(offset: u64, event: Event) -> Delivered {
        Delivered {
            position: Position {
                partition: 0,
                offset,
            },
            event,
        }
    }

    fn tick(offset: u64, token: &str, ms: i64, p: f64) -> Delivered {
        at(
            offset,
            Event::Price(PriceTick {
                market_id: "m".into(),
                token_id: token.into(),
                ts: Timestamp(T0 + ms),
                p,
            }),
        )
    }

    fn book(offset: u64, ms: i64, bid: f64) -> Delivered {
        at(
            offset,
            Event::Book(Box::new(BookSnapshot {
                market_id: "m".into(),
                token_id: "t".into(),
                ts: Timestamp(T0 + ms),
                bids: vec![BookLevel {
                    price: bid,
                    size: 1.0,
                }],
                asks: vec![],
            })),
        )
    }

    /// Runs batches through a rollup backed by an in-memory "store", as the
    /// projector does, and returns the final rows.
    fn project(batches: &[Vec<Delivered>]) -> BTreeMapRows {
        let mut store = BTreeMapRows::new();
        for batch in batches {
            // A fresh engine per batch: everything comes from the "store".
            let mut rollup = Rollup::new();
            load(&mut rollup, batch, &store);
            rollup.apply(batch);
            for row in rollup.drain_dirty() {
                store.insert(row.key.clone(), row);
            }
        }
        store
    }

    type BTreeMapRows = std::collections::BTreeMap<RowKey, Row>;

    /// What the projector does before `apply`: the bounds of the batch's
    /// new series (the end of the last bucket `store` holds of each), then
    /// the rows it touches that may be stored.
    fn load(rollup: &mut Rollup, batch: &[Delivered], store: &BTreeMapRows) {
        let series = rollup.series_of(batch);
        let bounds = series
            .iter()
            .map(|(table, id)| {
                Resolution::ALL.map(|res| {
                    let stored = store
                        .keys()
                        .filter(|k| (k.table, &k.id, k.res) == (*table, id, res));
                    let end = stored.map(|k| k.bucket.0 + res.width_ms()).max();
                    Timestamp(end.unwrap_or(i64::MIN))
                })
            })
            .collect();
        rollup.learn_frontiers(bounds);
        let missing = rollup.missing(batch);
        rollup.fill(
            missing
                .iter()
                .filter_map(|k| store.get(k).cloned())
                .collect(),
        );
    }

    /// A store holding one 1m price row of "t" at `T0`.
    fn stored_m1(sum: f64, count: u64, candle: Option<Candle>, last_offset: u64) -> BTreeMapRows {
        let key = RowKey {
            table: Table::Prices,
            id: "t".into(),
            res: Resolution::M1,
            bucket: Timestamp(T0),
        };
        let row = Row {
            key: key.clone(),
            value: RowValue::Price { sum, count, candle },
            last_offset,
        };
        BTreeMapRows::from([(key, row)])
    }

    fn price(rows: &BTreeMapRows, token: &str, res: Resolution, ms: i64) -> (f64, u64) {
        let key = RowKey {
            table: Table::Prices,
            id: token.into(),
            res,
            bucket: Timestamp(T0 + ms),
        };
        match rows[&key].value {
            RowValue::Price { sum, count, .. } => (sum, count),
            _ => unreachable!(),
        }
    }

    #[test]
    fn folds_every_resolution_and_late_events_land_in_their_own_bucket() {
        let rows = project(&[vec![
            tick(0, "t", 10_000, 0.2),
            tick(1, "t", 70_000, 0.6),
            tick(2, "t", 20_000, 0.4), // late: back in the first minute
        ]]);
        assert_eq!(price(&rows, "t", Resolution::M1, 0), (0.2 + 0.4, 2));
        assert_eq!(price(&rows, "t", Resolution::M1, 60_000), (0.6, 1));
        assert_eq!(price(&rows, "t", Resolution::D1, 0).1, 3);
        assert_eq!(
            rows.len(),
            1 + 7,
            "two 1m rows and one row at each coarser resolution"
        );
    }

    /// Runs `batch` through `rollup` as a step does, its store known
    /// (empty when first reset, then holding what was drained); returns
    /// the rows reported missing.
    fn step(rollup: &mut Rollup, batch: &[Delivered]) -> Vec<(String, Resolution, i64)> {
        assert!(rollup.series_of(batch).is_empty(), "the store is known");
        let missing = rollup.missing(batch);
        rollup.apply(batch);
        rollup.drain_dirty();
        missing
            .iter()
            .map(|k| (k.id.to_string(), k.res, k.bucket.0 - T0))
            .collect()
    }

    /// Forgetting keeps the rows of the last drain (the write that may be
    /// in flight) and, within its bound, each series' open bucket at each
    /// resolution; a row it dropped is reported missing when touched
    /// again, so it is loaded from the store, and no other is.
    #[test]
    fn forgetting_keeps_the_write_in_flight_and_the_open_buckets() {
        let minute = 60_000;
        let (open, all) = (NRES, NRES + 2);
        for (bound, kept) in [(usize::MAX, 2 * open), (2 * open - 1, open)] {
            let mut rollup = Rollup::new();
            rollup.store_emptied();
            // Durable: "a" in three minutes; in flight: "b" in one.
            step(
                &mut rollup,
                &[
                    tick(0, "a", 0, 0.1),
                    tick(1, "a", minute, 0.2),
                    tick(2, "a", 2 * minute, 0.3),
                ],
            );
            step(&mut rollup, &[tick(3, "b", 0, 0.4)]);
            assert_eq!(rollup.len(), all + open);
            assert!(rollup.buckets[0][0].spilled(), "a's three minutes");
            rollup.forget_rows(bound);
            assert_eq!(rollup.len(), kept, "bound {bound}");
            // What a list keeps, its open bucket or none, is off the heap.
            assert!(
                rollup.buckets.iter().flatten().all(|b| !b.spilled()),
                "bound {bound}"
            );
            // Past the bound, a's open rows went too: each is loaded back.
            let loaded_back: Vec<_> = if kept == 2 * open {
                Vec::new()
            } else {
                Resolution::ALL
                    .into_iter()
                    .map(|r| {
                        let bucket = if r == Resolution::M1 { 2 * minute } else { 0 };
                        ("a".to_string(), r, bucket)
                    })
                    .collect()
            };
            assert_eq!(
                step(
                    &mut rollup,
                    &[tick(5, "a", 2 * minute + 1, 0.6), tick(6, "b", 1_000, 0.7)]
                ),
                loaded_back,
                "bound {bound}: rows kept are not loaded"
            );
            assert_eq!(
                step(&mut rollup, &[tick(7, "a", 0, 0.5)]),
                [("a".to_string(), Resolution::M1, 0)],
                "bound {bound}: a forgotten row is loaded back"
            );
        }
    }

    #[test]
    fn forgetting_and_shrinking_hand_back_a_large_steps_rows_and_keep_the_rest() {
        let mut rollup = Rollup::new();
        rollup.store_emptied();
        // 21 000 slots: more than one chunk of the slot table.
        let large: Vec<_> = (0..3_000)
            .map(|i| tick(i, &format!("t{i}"), 0, 0.5))
            .collect();
        step(&mut rollup, &large);
        let grown = rollup.slots.capacity();
        assert!(grown >= 3_000 * NRES);
        step(&mut rollup, &[tick(3_000, "t0", 60_000, 0.6)]);
        // The large step's rows go, and with them the slot table's chunks
        // past the rows kept; the last drain's (t0's) stay.
        rollup.forget_rows(10 * NRES);
        let rows = rollup.len();
        assert_eq!(rows, NRES);
        assert!(rollup.slots.capacity() < grown, "{grown}");
        rollup.shrink();
        assert_eq!(rollup.len(), rows);
        assert_eq!(rollup.slots.capacity(), rows);
        assert_eq!(rollup.batch_slots.capacity(), 0);
        // Rows kept are still folded into, without a load.
        let loaded = step(&mut rollup, &[tick(3_001, "t0", 60_001, 0.7)]);
        assert!(loaded.is_empty(), "{loaded:?}");
    }

    #[test]
    fn a_late_bucket_between_buckets_in_memory_and_stored_ones_are_each_found() {
        let minute = |m: i64, s: i64| m * 60_000 + s * 1_000;
        let rows = project(&[
            vec![
                tick(0, "t", minute(1, 0), 0.1),
                tick(1, "t", minute(4, 0), 0.2),
            ],
            vec![
                tick(2, "t", minute(6, 0), 0.3),
                tick(3, "t", minute(3, 0), 0.4), // a new bucket before minute 6
                tick(4, "t", minute(2, 0), 0.5), // and before that one
                tick(5, "t", minute(4, 1), 0.6), // stored, between the two
                tick(6, "t", minute(1, 1), 0.7), // stored, before every one
                tick(7, "t", minute(3, 1), 0.8), // in memory, in the middle
            ],
        ]);
        let m1 = |m: i64| price(&rows, "t", Resolution::M1, minute(m, 0));
        assert_eq!(m1(1), (0.1 + 0.7, 2));
        assert_eq!(m1(2), (0.5, 1));
        assert_eq!(m1(3), (0.4 + 0.8, 2));
        assert_eq!(m1(4), (0.2 + 0.6, 2));
        assert_eq!(m1(6), (0.3, 1));
        assert_eq!(price(&rows, "t", Resolution::M5, 0).1, 7);
        assert_eq!(price(&rows, "t", Resolution::M5, minute(5, 0)).1, 1);
    }

    #[test]
    fn redelivered_events_are_skipped_row_by_row() {
        let first = vec![tick(0, "t", 0, 0.1), tick(1, "t", 1_000, 0.3)];
        // Crash after the first batch was durable but before its commit: the
        // log re-delivers offsets 0..=1, then continues.
        let replay = vec![
            tick(0, "t", 0, 0.1),
            tick(1, "t", 1_000, 0.3),
            tick(2, "t", 2_000, 0.5),
        ];
        let rows = project(&[first, replay]);
        assert_eq!(price(&rows, "t", Resolution::M1, 0), (0.1 + 0.3 + 0.5, 3));
        let mut rollup = Rollup::new();
        let b = vec![tick(5, "t", 0, 0.1)];
        load(&mut rollup, &b, &stored_m1(1.0, 2, None, 5));
        assert_eq!(
            rollup.apply(&b).replays_skipped,
            1,
            "only the 1m row already held offset 5"
        );
    }

    #[test]
    fn sums_do_not_depend_on_how_the_log_was_batched() {
        let events: Vec<Delivered> = (0..500)
            .map(|i| {
                tick(
                    i,
                    "t",
                    (i as i64 * 997) % 3_600_000,
                    ((i * 7919) % 1000) as f64 / 997.0 % 1.0,
                )
            })
            .collect();
        let whole = project(std::slice::from_ref(&events));
        let pieces: Vec<Vec<Delivered>> = events.chunks(7).map(|c| c.to_vec()).collect();
        let split = project(&pieces);
        assert_eq!(whole, split, "bit-identical rows");
    }

    #[test]
    fn books_keep_the_latest_snapshot_ties_going_to_the_later_log_position() {
        let rows = project(&[
            vec![book(0, 30_000, 0.40), book(1, 50_000, 0.41)],
            vec![book(2, 10_000, 0.39), book(3, 50_000, 0.42)],
        ]);
        let key = RowKey {
            table: Table::Books,
            id: "t".into(),
            res: Resolution::M1,
            bucket: Timestamp(T0),
        };
        match &rows[&key].value {
            RowValue::Book {
                ts, offset, bids, ..
            } => {
                assert_eq!((*ts, *offset), (Timestamp(T0 + 50_000), 3));
                assert_eq!(bids, "[[0.42,1.0]]");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(rows[&key].last_offset, 3);
    }

    fn candle(rows: &BTreeMapRows, res: Resolution, ms: i64) -> Option<Candle> {
        let key = RowKey {
            table: Table::Prices,
            id: "t".into(),
            res,
            bucket: Timestamp(T0 + ms),
        };
        match rows[&key].value {
            RowValue::Price { candle, .. } => candle,
            _ => unreachable!(),
        }
    }

    #[test]
    fn candles_open_on_the_earliest_tick_and_close_on_the_latest_ties_going_by_log_position() {
        // Log order is not time order; two ticks share the earliest and two
        // the latest time.
        let events = vec![
            tick(0, "t", 30_000, 0.5),
            tick(1, "t", 50_000, 0.7),
            tick(2, "t", 10_000, 0.2),
            tick(3, "t", 10_000, 0.3),
            tick(4, "t", 50_000, 0.6),
            tick(5, "t", 40_000, 0.9),
            tick(6, "t", 20_000, 0.1),
        ];
        let whole = project(std::slice::from_ref(&events));
        let c = candle(&whole, Resolution::M1, 0).expect("a candle");
        assert_eq!((c.open.p, c.open.offset), (0.2, 2), "earlier offset opens");
        assert_eq!((c.close.p, c.close.offset), (0.6, 4), "later offset closes");
        assert_eq!((c.high, c.low), (0.9, 0.1));
        // One event per batch, and replays of every prefix: the same rows.
        let mut pieces: Vec<Vec<Delivered>> = Vec::new();
        for i in 0..events.len() {
            pieces.push(events[..=i].to_vec());
        }
        assert_eq!(project(&pieces), whole, "bit-identical rows");
    }

    #[test]
    fn a_price_row_stored_without_a_candle_never_gains_a_partial_one() {
        let mut rollup = Rollup::new();
        let b = vec![tick(9, "t", 0, 0.4)];
        load(&mut rollup, &b, &stored_m1(1.0, 2, None, 5));
        rollup.apply(&b);
        let rows = rollup.drain_dirty();
        let m1 = rows.iter().find(|r| r.key.res == Resolution::M1).unwrap();
        assert_eq!(
            m1.value,
            RowValue::Price {
                sum: 1.4,
                count: 3,
                candle: None
            }
        );
        let h1 = rows.iter().find(|r| r.key.res == Resolution::H1).unwrap();
        assert!(
            matches!(
                h1.value,
                RowValue::Price {
                    candle: Some(_),
                    ..
                }
            ),
            "a new row has its candle"
        );
    }

    #[test]
    fn metrics_are_summed_per_market() {
        let m = |o, ms, v| {
            at(
                o,
                Event::Metrics(MetricsSample {
                    market_id: "m".into(),
                    ts: Timestamp(T0 + ms),
                    volume: v,
                    liquidity: 2.0,
                    spread: 0.5,
                }),
            )
        };
        let rows = project(&[vec![m(0, 0, 10.0), m(1, 1_000, 30.0)]]);
        let key = RowKey {
            table: Table::Metrics,
            id: "m".into(),
            res: Resolution::H1,
            bucket: Timestamp(T0),
        };
        assert_eq!(
            rows[&key].value,
            RowValue::Metrics {
                volume_sum: 40.0,
                liquidity_sum: 4.0,
                spread_sum: 1.0,
                count: 2
            }
        );
    }
}
