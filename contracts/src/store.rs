//! The read store: bucket rows and catalog, written by projectors and read
//! by the API.
//!
//! The projector is the single writer of bucket rows (one owner per log
//! partition); it loads the rows a batch touches, folds the batch into them
//! and writes whole rows back together with the log positions they derive
//! from ([`ProjectionStore::apply`]). Each row carries the offset of the last
//! event folded into it, so a re-delivered event is recognised and skipped:
//! replays leave every table as if each event were applied once.

use crate::{Position, Result};
use async_trait::async_trait;
use hindsight_schemas::wire::Reject;
use hindsight_schemas::{Event, MarketRecord, Resolution, Timestamp, TradeSide};

/// The three bucket tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Table {
    /// Per token: average probability.
    Prices,
    /// Per market: average volume, liquidity and spread.
    Metrics,
    /// Per token: the last snapshot in the bucket.
    Books,
}

impl Table {
    pub const ALL: [Table; 3] = [Table::Prices, Table::Metrics, Table::Books];

    pub fn as_str(self) -> &'static str {
        match self {
            Table::Prices => "prices",
            Table::Metrics => "metrics",
            Table::Books => "books",
        }
    }
}

/// A series of bucket rows: a table and an id (a token id, or a market id
/// for metrics).
pub type Series = (Table, std::sync::Arc<str>);

/// Per resolution, in [`Resolution::ALL`]'s order, a bucket start no stored
/// row of a series is at or after ([`ProjectionStore::frontiers`]).
pub type Frontiers = [Timestamp; Resolution::ALL.len()];

/// Identity of one bucket row. `id` is a token id (prices, books) or a
/// market id (metrics), shared: one id names many rows.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RowKey {
    pub table: Table,
    pub id: std::sync::Arc<str>,
    pub res: Resolution,
    pub bucket: Timestamp,
}

/// The stored state of a bucket. Averages are kept as sums and a count —
/// never a running average — so that folding more events is exact.
#[derive(Debug, Clone, PartialEq)]
pub enum RowValue {
    /// `candle` is `None` only for a row projected before candles were
    /// stored (an older store, until `rebuild`): such a row never gains a
    /// candle from later ticks, which would describe only part of its
    /// bucket.
    Price {
        sum: f64,
        count: u64,
        candle: Option<Candle>,
    },
    Metrics {
        volume_sum: f64,
        liquidity_sum: f64,
        spread_sum: f64,
        count: u64,
    },
    /// The latest snapshot: greatest `(ts, offset)`. Levels are stored as
    /// their JSON text (`[[price,size],…]`), which is what the API serves.
    Book {
        ts: Timestamp,
        offset: u64,
        bids: String,
        asks: String,
    },
}

/// A tick's place in a candle: its time, its log offset (which breaks ties
/// on time) and its probability.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mark {
    pub ts: Timestamp,
    pub offset: u64,
    pub p: f64,
}

impl Mark {
    fn key(&self) -> (Timestamp, u64) {
        (self.ts, self.offset)
    }
}

/// Open, high, low and close of the ticks folded into a price bucket.
///
/// Contract: `open` is the tick with the least `(ts, offset)`, `close` the
/// greatest, `high` and `low` the greatest and least `p` (by
/// `f64::total_cmp`). Each is a function of the set of ticks, not of the
/// order they are folded in: replays, rebuilds and out-of-order events give
/// the same candle, bit for bit. The count of ticks is the price row's
/// `count`. Trade volume and trade counts are not derived from price
/// ticks: they come from the deduplicated trades
/// ([`ReadStore::trade_totals`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candle {
    pub open: Mark,
    pub close: Mark,
    pub high: f64,
    pub low: f64,
}

impl Candle {
    /// The candle of one tick.
    pub fn of(tick: Mark) -> Self {
        Candle {
            open: tick,
            close: tick,
            high: tick.p,
            low: tick.p,
        }
    }

    /// Folds one more tick in.
    #[inline]
    pub fn fold(&mut self, tick: Mark) {
        if tick.key() < self.open.key() {
            self.open = tick;
        }
        if tick.key() > self.close.key() {
            self.close = tick;
        }
        if tick.p.total_cmp(&self.high).is_gt() {
            self.high = tick.p;
        }
        if tick.p.total_cmp(&self.low).is_lt() {
            self.low = tick.p;
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub key: RowKey,
    pub value: RowValue,
    /// Offset of the last event folded into this row (in the row's partition).
    pub last_offset: u64,
}

/// The three kinds of a token's market data kept tick by tick, as ingested.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TickKind {
    /// Every price tick.
    Price,
    /// Every book snapshot.
    Book,
    /// Every trade (a repeated trade id once).
    Trade,
}

impl TickKind {
    pub const ALL: [TickKind; 3] = [TickKind::Price, TickKind::Book, TickKind::Trade];

    pub fn as_str(self) -> &'static str {
        match self {
            TickKind::Price => "price_ticks",
            TickKind::Book => "book_ticks",
            TickKind::Trade => "trades",
        }
    }
}

/// Where a tick sorts among its token's ticks of one kind: by timestamp,
/// then by log position, so ticks sharing a millisecond keep a definite
/// order and each has a key of its own. The key is also the tick's
/// identity: a replayed event writes the same key again, never a second row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TickKey {
    pub ts: Timestamp,
    pub partition: u32,
    pub offset: u64,
}

impl TickKey {
    /// The first key at `ts`: a range from it holds every tick at `ts`.
    pub const fn at(ts: Timestamp) -> Self {
        TickKey {
            ts,
            partition: 0,
            offset: 0,
        }
    }

    pub fn of(ts: Timestamp, position: Position) -> Self {
        TickKey {
            ts,
            partition: position.partition,
            offset: position.offset,
        }
    }
}

/// What one tick holds.
#[derive(Debug, Clone, PartialEq)]
pub enum TickValue {
    Price {
        p: f64,
    },
    /// Levels as JSON text (`[[price,size],…]`), as the API serves them.
    Book {
        bids: Box<str>,
        asks: Box<str>,
    },
    Trade {
        price: f64,
        size: f64,
        side: TradeSide,
        trade_id: Option<Box<str>>,
    },
}

/// One price tick, book snapshot or trade of a token, as ingested, with its
/// exact timestamp.
///
/// Its token's id is shared: the projector hands each tick the id its
/// rows carry (and frees the event's), so a store can tell a step's ticks
/// of one token by the pointer rather than by comparing names. Its other
/// strings are boxed (no capacity kept). So a tick is no larger than the
/// event it is made from (80 bytes, with its log position): a step's
/// ticks are made in its events' buffer, not in a second one beside it.
#[derive(Debug, Clone, PartialEq)]
pub struct Tick {
    pub token_id: std::sync::Arc<str>,
    pub key: TickKey,
    pub value: TickValue,
}

impl Tick {
    pub fn kind(&self) -> TickKind {
        match self.value {
            TickValue::Price { .. } => TickKind::Price,
            TickValue::Book { .. } => TickKind::Book,
            TickValue::Trade { .. } => TickKind::Trade,
        }
    }
}

/// A tick-level read: ticks with `from <= key` and `ts < end`, in key
/// order, at most `limit`. Paging continues from the key after the last
/// returned tick (its offset plus one).
///
/// Contract: like [`Range`], a read costs what the ticks it returns (and
/// the partitions that hold them) cost, whatever the empty time in range.
#[derive(Debug, Clone, Copy)]
pub struct TickRange {
    pub from: TickKey,
    pub end: Timestamp,
    pub limit: usize,
}

/// One durable step of the projector: rows, tick-level records, catalog
/// upserts and the positions up to which the log has been consumed.
#[derive(Debug, Default)]
pub struct ProjectionWrite {
    pub rows: Vec<Row>,
    /// Price ticks, book snapshots and trades of the step, in log order.
    pub ticks: Vec<Tick>,
    /// Catalog records in log order; the latest `(updated_at, position)` wins.
    pub catalog: Vec<(Position, Event)>,
    /// Per partition, the last position consumed.
    pub consumed: Vec<Position>,
}

/// What an `apply` did not store: catalog records refused because they
/// contradict the stored catalog (see "one market per token and per slug"
/// on [`ProjectionStore`]). Everything else of the write was applied.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Applied {
    /// In the order the records came in the write.
    pub refused: Vec<Refused>,
}

/// A catalog record `apply` refused to store.
#[derive(Debug, Clone, PartialEq)]
pub struct Refused {
    pub position: Position,
    /// The record's id (a market id).
    pub id: String,
    /// Why: [`RejectKind::TokenClaimed`](hindsight_schemas::wire::RejectKind)
    /// or `SlugTaken`, naming the field and the market holding it, as
    /// ingest would have said.
    pub reason: Reject,
}

/// The projector's side of the read store.
///
/// Contract:
/// - **Whole rows**: `apply` writes each row as given (an upsert of the whole
///   row); `load` returns exactly what was last applied for a key, or
///   nothing.
/// - **Positions last**: after `apply` returns `Ok`, `committed` reports
///   positions at least `consumed + 1`. If `apply` fails or the process dies
///   inside it, some rows may be written, but `committed` never advances
///   past rows that are not durable. (The embedded store writes all of it in
///   one transaction; the CQL store writes rows, then catalog, then
///   positions.) Re-applying the same write is a no-op, so the projector's
///   replay from `committed` converges.
/// - **Catalog upserts**: of several versions of one record, the one with
///   the greatest `(updated_at, position)` is kept, whatever order they
///   arrive in (in separate writes or in one). A market upsert replaces the
///   market's token list and slug: tokens no longer listed stop resolving
///   through `ReadStore::token`, and the old slug stops resolving through
///   `ReadStore::market`. A catalog entry that is not a series, event or
///   market fails the `apply`.
/// - **One market per token and per slug** (`hindsight_schemas::claims`):
///   a market version that would be stored is refused instead when one of
///   its tokens is listed under another stored market, or its slug is
///   another stored market's. It is not stored, and `apply` reports it in
///   [`Applied::refused`]. Records of a write are decided in order, each
///   against the catalog as the records before it left it: the first market
///   to list a token or take a slug keeps it until a newer version of that
///   market drops it.
/// - **Catalog decided once**: the store remembers, per log partition, the
///   position of the last catalog record it decided (stored, refused, or
///   older than the stored version), and skips a record at or before it.
///   So re-applying a write after a crash re-decides nothing — not even a
///   refused record whose token a later record of the write released. (A
///   store's `consumed` position may lag its catalog: the CQL store writes
///   positions last.)
/// - **Ticks are keyed, not appended**: each tick is stored under (kind,
///   token, [`TickKey`]); writing one again (a replay) leaves one row, the
///   same. Ticks are durable before the positions, like rows.
/// - **A trade id counts once**: a trade with a `trade_id` is stored only at
///   the first position the store was given that (token, trade id) at; one
///   at another position, in the same write or any later one, is left out,
///   and one at that same position (a replay) is written again. Since a
///   token's events come from one log partition, in log order, the trade
///   kept is the first in the log: replays and a `rebuild` keep the same.
/// - **Any size**: `apply` takes a write of any number of rows, whatever
///   limits the backend puts on one request (the CQL store splits it).
/// - **Frontiers bound what is stored**: `frontiers` answers, for each
///   series and resolution, a bucket start that no stored row of it is at
///   or after. Any bound past the last stored bucket is correct
///   (`Timestamp(i64::MAX)` always is); a series with no row stored at a
///   resolution may answer `Timestamp(i64::MIN)`. A bound covers the rows
///   durable when it was read: the projector asks before it writes any row
///   of the series.
/// - `reset` drops every row, catalog record (with its lookups) and consumed
///   position; API keys and rate windows are not derived from the log and
///   stay. A catalog cursor returned before a reset stays valid.
#[async_trait]
pub trait ProjectionStore: Send + Sync {
    /// Per partition, the position after the last consumed event.
    async fn committed(&self) -> Result<Vec<Position>>;
    /// The stored rows among `keys` (missing rows are simply absent).
    async fn load(&self, keys: Vec<RowKey>) -> Result<Vec<Row>>;
    /// For each of `series`, per resolution, a bound on its stored buckets
    /// (see the contract). The projector loads a row it has not seen only
    /// before its series' bound: a log appended after a store's history,
    /// or a new store, is then projected without a load per bucket.
    async fn frontiers(&self, series: Vec<Series>) -> Result<Vec<Frontiers>>;
    /// The market each of `token_ids` is listed under, as
    /// `ReadStore::token` would answer after this handle's last `apply`;
    /// tokens no market lists are absent.
    async fn lookup_tokens(&self, token_ids: Vec<String>) -> Result<Vec<TokenRef>>;
    async fn apply(&self, write: ProjectionWrite) -> Result<Applied>;
    async fn reset(&self) -> Result<()>;
}

#[derive(Debug, Clone, PartialEq)]
pub struct PricePoint {
    pub t: Timestamp,
    pub p: f64,
}

/// One bucket's candle, as [`ReadStore::candles`] reads it: the bucket
/// start, its number of ticks and the candle (`None` for a bucket
/// projected before candles were stored; see [`RowValue::Price`]).
#[derive(Debug, Clone, PartialEq)]
pub struct CandlePoint {
    pub t: Timestamp,
    pub count: u64,
    pub candle: Option<Candle>,
    /// The bucket's trades; `None` when it holds none. Stores answer
    /// `None` from [`ReadStore::candles`]: the API joins
    /// [`ReadStore::trade_totals`] in.
    pub trades: Option<TradeTotals>,
}

/// The trades of one bucket: the sum of their sizes and their number, of
/// the deduplicated trades (a repeated trade id once).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TradeTotals {
    pub volume: f64,
    pub count: u64,
}

/// Trades read per [`ReadStore::ticks`] call while [`ReadStore::trade_totals`]
/// sums them.
pub const TRADE_TOTALS_PAGE: usize = 10_000;

#[derive(Debug, Clone, PartialEq)]
pub struct MetricsPoint {
    pub t: Timestamp,
    pub volume: f64,
    pub liquidity: f64,
    pub spread: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct BookPoint {
    pub t: Timestamp,
    /// JSON text of `[[price, size], …]`, best first.
    pub bids: String,
    pub asks: String,
}

/// A range read: buckets with `start <= t < end`, chronological, at most
/// `limit`. Paging continues from the last returned bucket plus one.
///
/// Contract: a read costs what the rows it returns (and the partitions that
/// hold them) cost, whatever the empty time between `start` and `end`: any
/// client may ask for decades at 1m, and a store that walked every empty
/// time partition would let one request cost thousands of queries.
#[derive(Debug, Clone, Copy)]
pub struct Range {
    pub res: Resolution,
    pub start: Timestamp,
    pub end: Timestamp,
    pub limit: usize,
}

/// Where a token belongs.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenRef {
    pub token_id: String,
    pub market_id: String,
    pub label: String,
}

/// What the API reads. Every method answers from precomputed buckets or the
/// projected catalog; nothing aggregates raw events.
#[async_trait]
pub trait ReadStore: Send + Sync {
    /// A stamp of everything the reads below answer from. Contract: once a
    /// write through any handle (in any process) has committed, a stamp
    /// read after it differs from every stamp read before it; so an answer
    /// built from reads made after reading stamp `s` is still the answer
    /// while the stamp reads `s`. Stamps read through one handle never
    /// decrease, so a caller can tell a stamp read before another (a
    /// request that was slow to get to its cache) from a newer one.
    /// `None`: the backend cannot tell at the cost below (or could not
    /// just now), and a caller keeps nothing.
    ///
    /// Cost contract: less than the cheapest read, with no round trip —
    /// the API reads it for every history page it may serve from its page
    /// cache (`hindsight_api::cache`). The embedded store answers an
    /// epoch it advances whenever the header of SQLite's WAL index, which
    /// every commit rewrites, has changed since the last read; the CQL
    /// store cannot tell without a query, so it answers `None`.
    fn version(&self) -> Option<u64> {
        None
    }
    async fn prices(&self, token_id: &str, range: Range) -> Result<Vec<PricePoint>>;
    /// The candles of the same price buckets `prices` averages: one point
    /// per stored price row, with its count and [`Candle`] as last applied.
    async fn candles(&self, token_id: &str, range: Range) -> Result<Vec<CandlePoint>>;
    /// Per bucket of `range.res` with `range.start <= bucket < range.end`
    /// holding at least one trade, in bucket order, at most `range.limit`:
    /// the sum of the sizes and the number of the token's trades whose `ts`
    /// falls in the bucket (whole buckets, even where `range.end` cuts one),
    /// exactly the trades [`ReadStore::ticks`] serves.
    ///
    /// Contract: bit for bit a function of the stored trade set. Sizes are
    /// added in [`TickKey`] order; the store keeps a trade id's first
    /// position, so replays and `rebuild` give the same set and so the
    /// same totals.
    ///
    /// Why derived at read time rather than kept in the price rows: the
    /// trades table is already an idempotent set (a repeated trade id is
    /// decided by the store, in `apply`), so totals read from it can never
    /// count a trade twice, whatever was replayed; counters folded by the
    /// projector would have to repeat that decision before the store makes
    /// it. The price: a read costs the trades it sums ([`TRADE_TOTALS_PAGE`]
    /// per query), not one row per bucket. One implementation serves every
    /// backend, over `ticks`, whose cost contract it inherits.
    async fn trade_totals(
        &self,
        token_id: &str,
        range: Range,
    ) -> Result<Vec<(Timestamp, TradeTotals)>> {
        let width = range.res.width_ms();
        let ceil = |t: Timestamp| {
            Timestamp(
                t.0.div_euclid(width) * width + if t.0.rem_euclid(width) == 0 { 0 } else { width },
            )
        };
        let mut from = TickKey::at(ceil(range.start));
        let end = ceil(range.end);
        let mut out: Vec<(Timestamp, TradeTotals)> = Vec::new();
        loop {
            let trades = self
                .ticks(
                    TickKind::Trade,
                    token_id,
                    TickRange {
                        from,
                        end,
                        limit: TRADE_TOTALS_PAGE,
                    },
                )
                .await?;
            for trade in &trades {
                let TickValue::Trade { size, .. } = trade.value else {
                    return Err(crate::Error::corrupt(
                        "store",
                        format!("a trades read of {token_id} answered a {:?}", trade.kind()),
                    ));
                };
                let bucket = Timestamp(trade.key.ts.0.div_euclid(width) * width);
                if let Some((_, totals)) = out.last_mut().filter(|(t, _)| *t == bucket) {
                    totals.volume += size;
                    totals.count += 1;
                } else if out.len() == range.limit {
                    return Ok(out);
                } else {
                    out.push((
                        bucket,
                        TradeTotals {
                            volume: size,
                            count: 1,
                        },
                    ));
                }
            }
            match trades.last() {
                Some(last) if trades.len() == TRADE_TOTALS_PAGE => {
                    from = TickKey {
                        offset: last.key.offset + 1,
                        ..last.key
                    };
                }
                _ => return Ok(out),
            }
        }
    }
    async fn metrics(&self, market_id: &str, range: Range) -> Result<Vec<MetricsPoint>>;
    async fn books(&self, token_id: &str, range: Range) -> Result<Vec<BookPoint>>;
    /// How many rows of `table` the series `id` (token, or market for
    /// metrics) holds with `range.start <= bucket < range.end` at
    /// `range.res`; `range.limit` is ignored. Contract: counted where the
    /// rows are (one count per time partition holding rows on CQL), never
    /// by reading them, and at a cost set by those partitions, not by the
    /// empty time in the range (as for range reads).
    async fn count(&self, table: Table, id: &str, range: Range) -> Result<u64>;
    /// How many ticks of `kind` the token holds with `start <= ts < end`:
    /// exactly as many as [`ReadStore::ticks`] serves over that span (a
    /// repeated trade id once). Contract: as [`ReadStore::count`], counted
    /// where the ticks lie (an index range on SQLite, one count per hour
    /// partition holding ticks on CQL), never by reading them.
    async fn count_ticks(
        &self,
        kind: TickKind,
        token_id: &str,
        start: Timestamp,
        end: Timestamp,
    ) -> Result<u64>;
    /// A token's ticks of one kind, as ingested: every price tick, book
    /// snapshot or (deduplicated) trade in `range`, in [`TickKey`] order.
    /// Served from storage laid out per token and time, never the log.
    async fn ticks(&self, kind: TickKind, token_id: &str, range: TickRange) -> Result<Vec<Tick>>;
    /// The book at a moment: of a token's snapshots with
    /// `since <= ts <= at`, the one with the greatest [`TickKey`] (the
    /// latest; of several at one instant, the last in the log). Costs a
    /// bounded number of reads however far back the snapshot lies.
    async fn book_at(
        &self,
        token_id: &str,
        since: Timestamp,
        at: Timestamp,
    ) -> Result<Option<Tick>>;
    async fn token(&self, token_id: &str) -> Result<Option<TokenRef>>;
    /// A market by id, or else by slug.
    async fn market(&self, id_or_slug: &str) -> Result<Option<MarketRecord>>;
    /// Catalog records (series, events, markets) changed after `since`, and
    /// the cursor to pass as the next `since`. `None` reads everything.
    /// Feeds the API's in-memory catalog.
    ///
    /// Contract: a record whose stored version changes after a cursor was
    /// returned is in the answer of the next call with that cursor, on any
    /// handle, whichever log partition the change came from. Records may
    /// repeat across calls, and an answer may hold versions that were
    /// stored for a while before a newer one (a backend may re-read a safety
    /// margin of its history), but the last version of a record in an
    /// answer is the stored one, and a version that lost on arrival never
    /// appears. So callers apply an answer in order and keep, per record,
    /// the version with the greatest `updated_at`, the later one on a tie.
    async fn catalog_changes(
        &self,
        since: Option<&CatalogCursor>,
    ) -> Result<(Vec<Event>, CatalogCursor)>;
}

/// Where a reader of catalog changes stands: opaque to callers. The
/// embedded store counts its own change sequence (not log offsets, which
/// are per partition), the CQL store change times; neither meaning leaks
/// out.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct CatalogCursor(u64);

impl CatalogCursor {
    /// For adapters: wraps the backend's own position.
    pub fn from_backend(value: u64) -> Self {
        CatalogCursor(value)
    }

    /// For adapters: the backend's own position.
    pub fn backend_value(&self) -> u64 {
        self.0
    }
}

/// A whole read-store backend, as the services hold it.
pub trait Store: ProjectionStore + ReadStore + crate::AuthStore + crate::AccountStore {}
impl<T: ProjectionStore + ReadStore + crate::AuthStore + crate::AccountStore> Store for T {}

/// A shared store is a store: wrappers (faults) take either.
#[async_trait]
impl<T: ProjectionStore + ?Sized> ProjectionStore for std::sync::Arc<T> {
    async fn committed(&self) -> Result<Vec<Position>> {
        (**self).committed().await
    }

    async fn load(&self, keys: Vec<RowKey>) -> Result<Vec<Row>> {
        (**self).load(keys).await
    }

    async fn frontiers(&self, series: Vec<Series>) -> Result<Vec<Frontiers>> {
        (**self).frontiers(series).await
    }

    async fn lookup_tokens(&self, token_ids: Vec<String>) -> Result<Vec<TokenRef>> {
        (**self).lookup_tokens(token_ids).await
    }

    async fn apply(&self, write: ProjectionWrite) -> Result<Applied> {
        (**self).apply(write).await
    }

    async fn reset(&self) -> Result<()> {
        (**self).reset().await
    }
}
