//! [`ScyllaStore`]: buckets, catalog, keys and the rate-limit log on ScyllaDB.
//!
//! Writes: prepared statements only; the projector's rows are grouped by
//! partition into unlogged batches (one partition per batch: no coordinator
//! fan-out), run with bounded concurrency, each with a timeout and retried
//! with backoff; consumed positions are written after every row. Replay
//! safety needs no lightweight transaction: the projector owning a log
//! partition is the single writer of its rows and overwrites whole rows that
//! carry the offset of the last event folded in.

use crate::schema;
use crate::statements::{self, period_of, tick_period, Stmt};
use async_trait::async_trait;
use futures::{future, stream, StreamExt, TryStreamExt};
use hindsight_contracts::auth::counted_range;
use hindsight_contracts::*;
use hindsight_schemas::claims::{market_conflict, Lookups};
use hindsight_schemas::wire::Reject;
use hindsight_schemas::{codec, Event, MarketRecord, Resolution, Timestamp, TradeSide};
use hindsight_telemetry as tm;
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use scylla::frame::response::result::{CollectionType, ColumnType, NativeType};
use scylla::response::{PagingState, PagingStateResponse};
use scylla::serialize::row::SerializeRow;
use scylla::statement::batch::{Batch, BatchType};
use scylla::statement::prepared::PreparedStatement;
use scylla::statement::{Consistency, SerialConsistency};
use scylla::value::CqlTimestamp;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

#[derive(Debug, Clone)]
pub struct ScyllaConfig {
    /// `host:port` of one or more nodes.
    pub nodes: Vec<String>,
    pub keyspace: String,
    /// CQL replication map, for `migrate`.
    pub replication: String,
    pub consistency: Consistency,
    pub request_timeout: Duration,
    /// Unlogged batches in flight at once during a projector write.
    pub write_concurrency: usize,
}

pub fn parse_consistency(text: &str) -> Option<Consistency> {
    Some(match text.to_ascii_uppercase().as_str() {
        "ONE" => Consistency::One,
        "TWO" => Consistency::Two,
        "THREE" => Consistency::Three,
        "QUORUM" => Consistency::Quorum,
        "ALL" => Consistency::All,
        "LOCAL_QUORUM" => Consistency::LocalQuorum,
        "EACH_QUORUM" => Consistency::EachQuorum,
        "LOCAL_ONE" => Consistency::LocalOne,
        _ => return None,
    })
}

pub(crate) fn fail(e: impl std::fmt::Display) -> Error {
    Error::unavailable("cql", e.to_string())
}

pub(crate) fn corrupt(e: impl std::fmt::Display) -> Error {
    Error::corrupt("cql", e.to_string())
}

async fn session(config: &ScyllaConfig) -> Result<Session> {
    SessionBuilder::new()
        .known_nodes(&config.nodes)
        .connection_timeout(Duration::from_secs(5))
        .build()
        .await
        .map_err(fail)
}

/// The CQL spelling of a bind marker's type, to compare with [`Stmt::binds`].
fn cql_type(t: &ColumnType) -> String {
    match t {
        ColumnType::Native(n) => match n {
            NativeType::Text | NativeType::Ascii => "text",
            NativeType::BigInt => "bigint",
            NativeType::Int => "int",
            NativeType::Double => "double",
            NativeType::Timestamp => "timestamp",
            NativeType::Blob => "blob",
            NativeType::Counter => "counter",
            other => return format!("{other:?}").to_lowercase(),
        }
        .to_string(),
        ColumnType::Collection {
            typ: CollectionType::List(inner),
            ..
        } => format!("list<{}>", cql_type(inner)),
        other => format!("{other:?}"),
    }
}

/// Runs a write up to four times with exponential backoff.
async fn retry<T, F, Fut>(op: &'static str, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let mut delay = Duration::from_millis(50);
    for attempt in 1.. {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) if attempt < 4 => {
                tracing::warn!(op, attempt, error = %e, "scylla write failed; retrying");
                tokio::time::sleep(delay).await;
                delay *= 4;
            }
            Err(e) => {
                metrics::counter!(tm::STORE_ERRORS, "op" => op).increment(1);
                return Err(e);
            }
        }
    }
    unreachable!()
}

pub struct ScyllaStore {
    session: Arc<Session>,
    prepared: HashMap<String, PreparedStatement>,
    config: ScyllaConfig,
    writes: Arc<Semaphore>,
    /// `series_periods` entries this handle has written (or found written),
    /// so each is written about once per process; forgotten whole past
    /// [`INDEXED_REMEMBERED`] entries (writing one again is harmless).
    indexed: std::sync::Mutex<std::collections::HashSet<SeriesPeriod>>,
}

/// A table partitioned by series and time: a bucket table (a kind at a
/// resolution) or a tick-level table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Series {
    Bucket(Table, Resolution),
    Tick(TickKind),
}

impl Series {
    /// The table's name, as `series_periods.tbl` holds it.
    fn table(self) -> String {
        match self {
            Series::Bucket(table, res) => format!("{}_{}", table.as_str(), res.as_str()),
            Series::Tick(kind) => kind.as_str().to_string(),
        }
    }
}

/// A partition of a series table (its `series_periods` entry): table,
/// series id, time partition.
type SeriesPeriod = (Series, Arc<str>, i64);

/// How many `series_periods` entries a handle remembers writing.
const INDEXED_REMEMBERED: usize = 1 << 20;

/// A range read spanning at most this many time partitions reads them all;
/// a longer one lists the series' partitions in range first.
const DIRECT_PERIODS: i64 = 2;
/// Partitions listed per `series_periods` query.
const PERIODS_PER_LIST: i32 = 256;

/// The Paxos consistency of lightweight transactions: within the local data
/// center when the configured consistency is local, else across all.
fn serial_for(consistency: Consistency) -> SerialConsistency {
    match consistency {
        Consistency::LocalQuorum | Consistency::LocalOne => SerialConsistency::LocalSerial,
        _ => SerialConsistency::Serial,
    }
}

pub(crate) fn ts(ms: i64) -> CqlTimestamp {
    CqlTimestamp(ms)
}

const DAY_MS: i64 = 86_400_000;
/// Changes re-read on each incremental catalog refresh, for writes that
/// reach the feed late (clock skew between projectors, slow replicas).
const CHANGE_MARGIN_MS: i64 = 30_000;

impl ScyllaStore {
    /// Connects, prepares every statement and checks each one's bind types
    /// against what the server reports.
    pub async fn connect(config: ScyllaConfig) -> Result<Self> {
        schema::check_keyspace(&config.keyspace).map_err(|e| Error::backend("cql", e))?;
        let session = session(&config).await?;
        let mut prepared = HashMap::new();
        for stmt in statements::all(&config.keyspace) {
            let lwt = statements::is_lwt(&stmt);
            let counter = statements::is_counter(&stmt);
            let Stmt { name, cql, binds } = stmt;
            let mut p = session
                .prepare(cql.as_str())
                .await
                .map_err(|e| fail(format!("preparing {name}: {e}")))?;
            let server: Vec<String> = p
                .get_variable_col_specs()
                .iter()
                .map(|s| cql_type(s.typ()))
                .collect();
            if server != binds {
                return Err(Error::backend("cql", format!(
                    "statement {name}: the server expects bind types {server:?}, the code declares {binds:?} (schema out of date? run `hindsight scylla migrate`)"
                )));
            }
            p.set_consistency(config.consistency);
            p.set_request_timeout(Some(config.request_timeout));
            // Every plain write is a whole-row overwrite, or the insert or
            // delete of a rate hit under its own random id: all safe to
            // retry. Lightweight transactions are not (their callers handle
            // a lost answer).
            // Counter increments are not either.
            p.set_is_idempotent(!lwt && !counter);
            if lwt {
                p.set_serial_consistency(Some(serial_for(config.consistency)));
            }
            prepared.insert(name, p);
        }
        let writes = Arc::new(Semaphore::new(config.write_concurrency.max(1)));
        Ok(ScyllaStore {
            session: Arc::new(session),
            prepared,
            config,
            writes,
            indexed: Default::default(),
        })
    }

    /// Applies the schema unless the keyspace already records the current
    /// version; returns the statements run (none the second time).
    pub async fn migrate(config: &ScyllaConfig) -> Result<Vec<String>> {
        schema::check_keyspace(&config.keyspace).map_err(|e| Error::backend("cql", e))?;
        let session = session(config).await?;
        let recorded = match session
            .query_unpaged(
                format!("SELECT version FROM {}.schema_migrations", config.keyspace),
                (),
            )
            .await
        {
            // No keyspace or table yet: nothing recorded.
            Err(_) => None,
            Ok(result) => {
                let rows = result.into_rows_result().map_err(corrupt)?;
                let versions: Vec<i32> = rows
                    .rows::<(i32,)>()
                    .map_err(corrupt)?
                    .filter_map(|r| r.ok())
                    .map(|(v,)| v)
                    .collect();
                versions.into_iter().max()
            }
        };
        let plan = schema::migration_plan(recorded, &config.keyspace, &config.replication);
        for (i, statement) in plan.iter().enumerate() {
            // The last statement records the version: an older keyspace's
            // derived index is filled before it.
            if i + 1 == plan.len() && recorded.is_some_and(|v| v < schema::INDEXED_SINCE) {
                index_series_periods(&session, &config.keyspace).await?;
            }
            if i + 1 == plan.len() && recorded.is_some_and(|v| v < schema::CANDLES_SINCE) {
                add_candle_columns(&session, &config.keyspace).await?;
            }
            session
                .query_unpaged(statement.as_str(), ())
                .await
                .map_err(|e| fail(format!("{statement}: {e}")))?;
        }
        Ok(plan)
    }

    /// Lists the time partitions about to receive rows in `series_periods`
    /// (before the rows: a listed partition that never got its rows only
    /// costs an empty read), skipping those this handle already listed.
    async fn index_periods<'a>(
        &self,
        partitions: impl Iterator<Item = &'a SeriesPeriod>,
    ) -> Result<()> {
        let fresh: Vec<SeriesPeriod> = {
            let known = self.indexed.lock().expect("not poisoned");
            partitions
                .filter(|partition| !known.contains(*partition))
                .cloned()
                .collect()
        };
        let writes = fresh.iter().map(|(series, id, period)| async move {
            let tbl = series.table();
            let _permit = self.writes.acquire().await.map_err(fail)?;
            retry("write_rows", || {
                self.exec(
                    "write_rows",
                    "insert_series_period",
                    (tbl.as_str(), id.as_ref(), *period),
                )
            })
            .await
        });
        future::try_join_all(writes).await?;
        let mut known = self.indexed.lock().expect("not poisoned");
        if known.len() + fresh.len() > INDEXED_REMEMBERED {
            known.clear();
        }
        known.extend(fresh);
        Ok(())
    }

    fn stmt(&self, name: &str) -> &PreparedStatement {
        self.prepared
            .get(name)
            .unwrap_or_else(|| panic!("statement {name} is prepared at connect"))
    }

    pub(crate) async fn exec(
        &self,
        op: &'static str,
        name: &str,
        values: impl SerializeRow,
    ) -> Result<scylla::response::query_result::QueryResult> {
        let started = Instant::now();
        let out = self
            .session
            .execute_unpaged(self.stmt(name), values)
            .await
            .map_err(fail);
        metrics::histogram!(tm::STORE_QUERY_SECONDS, "op" => op)
            .record(started.elapsed().as_secs_f64());
        if out.is_err() {
            metrics::counter!(tm::STORE_ERRORS, "op" => op).increment(1);
        }
        out
    }

    /// Every page of an unbounded read.
    pub(crate) async fn scan<F>(&self, name: &str, mut each: F) -> Result<()>
    where
        F: FnMut(&scylla::response::query_result::QueryRowsResult) -> Result<()>,
    {
        let mut paging = PagingState::start();
        loop {
            let (result, next) = self
                .session
                .execute_single_page(self.stmt(name), (), paging)
                .await
                .map_err(fail)?;
            each(&result.into_rows_result().map_err(corrupt)?)?;
            match next {
                PagingStateResponse::HasMorePages { state } => paging = state,
                PagingStateResponse::NoMorePages => return Ok(()),
            }
        }
    }

    /// Writes the rows of one partition as one unlogged batch.
    /// The stored rows of one partition among `buckets`.
    async fn load_partition(
        &self,
        (table, res, id, period): (Table, Resolution, Arc<str>, i64),
        buckets: Vec<i64>,
    ) -> Result<Vec<Row>> {
        let mut out = Vec::new();
        let name = format!("load_{}_{}", table.as_str(), res.as_str());
        let list: Vec<CqlTimestamp> = buckets.iter().map(|&b| ts(b)).collect();
        let rows = self
            .exec("load_rows", &name, (id.as_ref(), period, list))
            .await?
            .into_rows_result()
            .map_err(corrupt)?;
        let key = |bucket: CqlTimestamp| RowKey {
            table,
            id: id.clone(),
            res,
            bucket: Timestamp(bucket.0),
        };
        match table {
            Table::Prices => {
                type Stored = (
                    CqlTimestamp,
                    f64,
                    i64,
                    Option<CqlTimestamp>,
                    Option<i64>,
                    Option<f64>,
                    Option<CqlTimestamp>,
                    Option<i64>,
                    Option<f64>,
                    Option<f64>,
                    Option<f64>,
                    i64,
                );
                for r in rows.rows::<Stored>().map_err(corrupt)? {
                    let (b, sum, count, ot, oo, op, ct, co, cp, h, l, last) = r.map_err(corrupt)?;
                    out.push(Row {
                        key: key(b),
                        value: RowValue::Price {
                            sum,
                            count: count as u64,
                            candle: candle_of((ot, oo, op, ct, co, cp, h, l))?,
                        },
                        last_offset: last as u64,
                    });
                }
            }
            Table::Metrics => {
                for r in rows
                    .rows::<(CqlTimestamp, f64, f64, f64, i64, i64)>()
                    .map_err(corrupt)?
                {
                    let (b, v, l, s, count, last) = r.map_err(corrupt)?;
                    out.push(Row {
                        key: key(b),
                        value: RowValue::Metrics {
                            volume_sum: v,
                            liquidity_sum: l,
                            spread_sum: s,
                            count: count as u64,
                        },
                        last_offset: last as u64,
                    });
                }
            }
            Table::Books => {
                for r in rows
                    .rows::<(CqlTimestamp, CqlTimestamp, i64, String, String, i64)>()
                    .map_err(corrupt)?
                {
                    let (b, at, offset, bids, asks, last) = r.map_err(corrupt)?;
                    out.push(Row {
                        key: key(b),
                        value: RowValue::Book {
                            ts: Timestamp(at.0),
                            offset: offset as u64,
                            bids,
                            asks,
                        },
                        last_offset: last as u64,
                    });
                }
            }
        }
        Ok(out)
    }

    async fn write_partition(&self, rows: Vec<Row>) -> Result<()> {
        let Some(first) = rows.first() else {
            return Ok(());
        };
        let name = format!(
            "insert_{}_{}",
            first.key.table.as_str(),
            first.key.res.as_str()
        );
        let mut batch = Batch::new(BatchType::Unlogged);
        batch.set_consistency(self.config.consistency);
        batch.set_request_timeout(Some(self.config.request_timeout));
        for _ in &rows {
            batch.append_statement(self.stmt(&name).clone());
        }
        let session = self.session.clone();
        let run = |batch: Batch, rows: Vec<Row>| {
            let session = session.clone();
            async move {
                match rows[0].value {
                    RowValue::Price { .. } => {
                        let values: Vec<_> = rows
                            .iter()
                            .map(|r| match &r.value {
                                RowValue::Price { sum, count, candle } => {
                                    let (ot, oo, op, ct, co, cp, h, l) = candle_cols(candle);
                                    (
                                        r.key.id.to_string(),
                                        period_of(r.key.res, r.key.bucket.0),
                                        ts(r.key.bucket.0),
                                        *sum,
                                        *count as i64,
                                        ot,
                                        oo,
                                        op,
                                        ct,
                                        co,
                                        cp,
                                        h,
                                        l,
                                        r.last_offset as i64,
                                    )
                                }
                                _ => unreachable!("one table per batch"),
                            })
                            .collect();
                        session
                            .batch(&batch, values)
                            .await
                            .map(|_| ())
                            .map_err(fail)
                    }
                    RowValue::Metrics { .. } => {
                        let values: Vec<_> = rows
                            .iter()
                            .map(|r| match &r.value {
                                RowValue::Metrics {
                                    volume_sum,
                                    liquidity_sum,
                                    spread_sum,
                                    count,
                                } => (
                                    r.key.id.to_string(),
                                    period_of(r.key.res, r.key.bucket.0),
                                    ts(r.key.bucket.0),
                                    *volume_sum,
                                    *liquidity_sum,
                                    *spread_sum,
                                    *count as i64,
                                    r.last_offset as i64,
                                ),
                                _ => unreachable!("one table per batch"),
                            })
                            .collect();
                        session
                            .batch(&batch, values)
                            .await
                            .map(|_| ())
                            .map_err(fail)
                    }
                    RowValue::Book { .. } => {
                        let values: Vec<_> = rows
                            .iter()
                            .map(|r| match &r.value {
                                RowValue::Book {
                                    ts: snap,
                                    offset,
                                    bids,
                                    asks,
                                } => (
                                    r.key.id.to_string(),
                                    period_of(r.key.res, r.key.bucket.0),
                                    ts(r.key.bucket.0),
                                    ts(snap.0),
                                    *offset as i64,
                                    bids.clone(),
                                    asks.clone(),
                                    r.last_offset as i64,
                                ),
                                _ => unreachable!("one table per batch"),
                            })
                            .collect();
                        session
                            .batch(&batch, values)
                            .await
                            .map(|_| ())
                            .map_err(fail)
                    }
                }
            }
        };
        retry("write_rows", || run(batch.clone(), rows.clone())).await
    }

    /// Upserts a catalog record if newer than the stored version (and, for a
    /// market, taking no other market's token or slug), with its lookups and
    /// a change-feed entry. A market's new slug and tokens are written before
    /// the rows of its dropped ones are deleted, so the market stays
    /// reachable throughout.
    async fn write_catalog(&self, pos: Position, event: &Event) -> Result<Decision> {
        let (table, kind, id, updated) = match event {
            Event::Series(s) => ("series", "series", &s.id, s.updated_at),
            Event::Event(e) => ("events", "event", &e.id, e.updated_at),
            Event::Market(m) => ("markets", "market", &m.id, m.updated_at),
            other => {
                return Err(Error::backend(
                    "cql",
                    format!("{} is not a catalog record", other.kind().as_str()),
                ))
            }
        };
        let stored = self
            .exec(
                "catalog_version",
                &format!("version_{table}"),
                (id.as_str(),),
            )
            .await?;
        let stored = stored.into_rows_result().map_err(corrupt)?;
        let stored = stored
            .maybe_first_row::<(CqlTimestamp, i64, Vec<u8>)>()
            .map_err(corrupt)?;
        if let Some((at, offset, _)) = &stored {
            // Equal is the same record delivered again: written again (a
            // crash may have come anywhere below), which is harmless.
            if (updated.0, pos.offset as i64) < (at.0, *offset) {
                return Ok(Decision::Done);
            }
        }
        if let Event::Market(m) = event {
            if let Some(reason) = self.market_refusal(m).await? {
                return Ok(Decision::Refused(reason));
            }
        }
        // Lookups first, the record last: until the record is written, a
        // redelivery still sees the previous version and redoes the same
        // lookup changes, so a crash in between leaves no stale or missing
        // slug or token (redeliveries come in log order).
        if let Event::Market(m) = event {
            let previous = match &stored {
                Some((_, _, body)) => Some(decode_market(body)?),
                None => None,
            };
            self.write_market_lookups(m, previous.as_ref()).await?;
        }
        let body = codec::encode(event);
        let off = pos.offset as i64;
        let upsert = format!("upsert_{table}");
        retry("write_catalog", || {
            self.exec(
                "write_catalog",
                &upsert,
                (id.as_str(), ts(updated.0), off, body.as_slice()),
            )
        })
        .await?;
        let now = Timestamp::now().0;
        retry("write_catalog", || {
            self.exec(
                "write_catalog",
                "insert_catalog_change",
                (
                    now.div_euclid(DAY_MS),
                    ts(now),
                    kind,
                    id.as_str(),
                    body.as_slice(),
                ),
            )
        })
        .await?;
        Ok(Decision::Done)
    }

    /// Why market version `m` may not be stored: one of its tokens is
    /// listed under another market, or its slug is another market's. A
    /// lookup row counts only if its market's stored record still lists the
    /// token or has the slug: a crash between a market's lookups and its
    /// record can leave a row of a version never stored.
    async fn market_refusal(&self, m: &MarketRecord) -> Result<Option<Reject>> {
        let mut claims = Lookups::default();
        for t in &m.tokens {
            let rows = self
                .exec("write_catalog", "select_token", (t.id.as_str(),))
                .await?
                .into_rows_result()
                .map_err(corrupt)?;
            let mut others: Vec<String> = Vec::new();
            for r in rows.rows::<(String, String, i64)>().map_err(corrupt)? {
                let (market_id, _, _) = r.map_err(corrupt)?;
                if market_id != m.id {
                    others.push(market_id);
                }
            }
            others.sort();
            for other in others {
                let lists = self
                    .market_by_id(&other)
                    .await?
                    .is_some_and(|o| o.tokens.iter().any(|ot| ot.id == t.id));
                if lists {
                    claims.tokens.insert(t.id.clone(), other);
                    break;
                }
            }
        }
        let ids = self
            .exec("write_catalog", "select_market_slug", (m.slug.as_str(),))
            .await?
            .into_rows_result()
            .map_err(corrupt)?;
        let mut others: Vec<String> = Vec::new();
        for r in ids.rows::<(String,)>().map_err(corrupt)? {
            let (id,) = r.map_err(corrupt)?;
            if id != m.id {
                others.push(id);
            }
        }
        others.sort();
        for other in others {
            if self
                .market_by_id(&other)
                .await?
                .is_some_and(|o| o.slug == m.slug)
            {
                claims.slugs.insert(m.slug.clone(), other);
                break;
            }
        }
        Ok(market_conflict(&claims, m))
    }

    /// Where the catalog of log partition `partition` was decided up to.
    async fn catalog_consumed(&self, partition: u32) -> Result<u64> {
        let rows = self
            .exec(
                "write_catalog",
                "select_catalog_consumed",
                (partition as i32,),
            )
            .await?
            .into_rows_result()
            .map_err(corrupt)?;
        Ok(rows
            .maybe_first_row::<(i64,)>()
            .map_err(corrupt)?
            .map_or(0, |(next,)| next.max(0) as u64))
    }

    async fn write_catalog_consumed(&self, partition: u32, next: u64) -> Result<()> {
        retry("write_catalog", || {
            self.exec(
                "write_catalog",
                "upsert_catalog_consumed",
                (partition as i32, next as i64),
            )
        })
        .await
        .map(|_| ())
    }

    /// The catalog records of one apply, in order, each decided once: a
    /// record before the partition's `catalog_consumed` is skipped. The mark
    /// is written after each refusal (a replay must not store what was
    /// refused, even if a later record released its token) and after the
    /// last record; a stored record decided again is stored again, the same.
    async fn write_catalog_records(&self, catalog: &[(Position, Event)]) -> Result<Applied> {
        let mut applied = Applied::default();
        let mut decided: BTreeMap<u32, u64> = BTreeMap::new();
        for (pos, event) in catalog {
            if !matches!(event, Event::Series(_) | Event::Event(_) | Event::Market(_)) {
                return Err(Error::backend(
                    "cql",
                    format!("{} is not a catalog record", event.kind().as_str()),
                ));
            }
            let next = match decided.get(&pos.partition) {
                Some(next) => *next,
                None => self.catalog_consumed(pos.partition).await?,
            };
            decided.insert(pos.partition, next.max(pos.offset + 1));
            if pos.offset < next {
                continue;
            }
            if let Decision::Refused(reason) = self.write_catalog(*pos, event).await? {
                self.write_catalog_consumed(pos.partition, pos.offset + 1)
                    .await?;
                applied.refused.push(Refused {
                    position: *pos,
                    id: event.key().to_string(),
                    reason,
                });
            }
        }
        for (partition, next) in decided {
            self.write_catalog_consumed(partition, next).await?;
        }
        Ok(applied)
    }

    /// The slug and token lookups of a market's new version; the rows of
    /// the slug and tokens the previous version had and this one dropped
    /// are deleted (only this market's: a token another market lists keeps
    /// that market's row).
    async fn write_market_lookups(
        &self,
        m: &MarketRecord,
        previous: Option<&MarketRecord>,
    ) -> Result<()> {
        let op = "write_catalog";
        retry(op, || {
            self.exec(op, "upsert_market_slug", (m.slug.as_str(), m.id.as_str()))
        })
        .await?;
        for t in &m.tokens {
            retry(op, || {
                self.exec(
                    op,
                    "upsert_token",
                    (t.id.as_str(), m.id.as_str(), t.label.as_str()),
                )
            })
            .await?;
        }
        let Some(previous) = previous else {
            return Ok(());
        };
        if previous.slug != m.slug {
            retry(op, || {
                self.exec(
                    op,
                    "delete_market_slug",
                    (previous.slug.as_str(), m.id.as_str()),
                )
            })
            .await?;
        }
        for t in &previous.tokens {
            if !m.tokens.iter().any(|n| n.id == t.id) {
                retry(op, || {
                    self.exec(op, "delete_token", (t.id.as_str(), m.id.as_str()))
                })
                .await?;
            }
        }
        Ok(())
    }

    async fn market_by_id(&self, id: &str) -> Result<Option<MarketRecord>> {
        let rows = self
            .exec("read_market", "select_market", (id,))
            .await?
            .into_rows_result()
            .map_err(corrupt)?;
        match rows.maybe_first_row::<(Vec<u8>,)>().map_err(corrupt)? {
            Some((body,)) => decode_market(&body).map(Some),
            None => Ok(None),
        }
    }

    /// The next time partitions of a series to read, from `from` to `to`
    /// (from `to` down to `from` when `backwards`): a short span's
    /// partitions directly; a long one's only those `series_periods` lists,
    /// so empty years cost nothing. Empty when none is left.
    async fn next_periods(
        &self,
        op: &'static str,
        tbl: &str,
        id: &str,
        from: i64,
        to: i64,
        backwards: bool,
    ) -> Result<Vec<i64>> {
        if to < from {
            return Ok(Vec::new());
        }
        if to - from < DIRECT_PERIODS {
            let mut direct: Vec<i64> = (from..=to).collect();
            if backwards {
                direct.reverse();
            }
            return Ok(direct);
        }
        let list = if backwards {
            "select_series_periods_desc"
        } else {
            "select_series_periods"
        };
        self.exec(op, list, (tbl, id, from, to, PERIODS_PER_LIST))
            .await?
            .into_rows_result()
            .map_err(corrupt)?
            .rows::<(i64,)>()
            .map_err(corrupt)?
            .map(|r| r.map(|(p,)| p).map_err(corrupt))
            .collect()
    }

    /// Rows of series `id` in table `tbl` with `start <= t < end`, over
    /// time partitions `first..=last`: one `stmt` count (bound `id`,
    /// partition, `start`, `end`) per partition `next_periods` lists, so
    /// rows are counted where they lie and empty time costs nothing. Shared
    /// by bucket counts and tick counts.
    async fn count_listed(
        &self,
        op: &'static str,
        tbl: &str,
        stmt: &str,
        id: &str,
        (first, last): (i64, i64),
        (start, end): (Timestamp, Timestamp),
    ) -> Result<u64> {
        let mut total = 0;
        if end <= start {
            return Ok(total);
        }
        let mut next = first;
        while next <= last {
            let periods = self.next_periods(op, tbl, id, next, last, false).await?;
            let Some(&after) = periods.last() else {
                break;
            };
            next = after + 1;
            for period in periods {
                let (n,) = self
                    .exec(op, stmt, (id, period, ts(start.0), ts(end.0)))
                    .await?
                    .into_rows_result()
                    .map_err(corrupt)?
                    .single_row::<(i64,)>()
                    .map_err(corrupt)?;
                total += n as u64;
            }
        }
        Ok(total)
    }

    /// The ticks of `write` to store: every one but trades whose (token,
    /// trade id) the store holds at another position, or an earlier tick
    /// of this write holds. The ids seen first here are recorded in
    /// `trade_ids` before their trades are written, so a replay after a
    /// crash in between finds its own position and writes the trade.
    /// Single writer: a token's events are one log partition's, which one
    /// projector owns, so the read, then write, needs no transaction.
    async fn first_trades(&self, ticks: Vec<Tick>) -> Result<Vec<Tick>> {
        let mut ids: Vec<(Arc<str>, Box<str>)> = ticks
            .iter()
            .filter_map(|t| match &t.value {
                TickValue::Trade {
                    trade_id: Some(id), ..
                } => Some((t.token_id.clone(), id.clone())),
                _ => None,
            })
            .collect();
        if ids.is_empty() {
            return Ok(ticks);
        }
        ids.sort();
        ids.dedup();
        let lookups = ids.into_iter().map(|(token, id)| async move {
            let _permit = self.writes.acquire().await.map_err(fail)?;
            let stored = self
                .exec("write_ticks", "select_trade_id", (&*token, &*id))
                .await?
                .into_rows_result()
                .map_err(corrupt)?
                .maybe_first_row::<(i32, i64)>()
                .map_err(corrupt)?;
            Ok::<_, Error>(((token, id), stored))
        });
        let mut first: HashMap<(Arc<str>, Box<str>), (i32, i64)> = HashMap::new();
        let mut fresh = Vec::new();
        for ((token, id), stored) in future::try_join_all(lookups).await? {
            if let Some(at) = stored {
                first.insert((token, id), at);
            }
        }
        let mut kept = Vec::with_capacity(ticks.len());
        for tick in ticks {
            if let TickValue::Trade {
                trade_id: Some(id), ..
            } = &tick.value
            {
                let here = (tick.key.partition as i32, tick.key.offset as i64);
                let key = (tick.token_id.clone(), id.clone());
                match first.get(&key) {
                    Some(at) if *at != here => continue,
                    Some(_) => {}
                    None => {
                        first.insert(key.clone(), here);
                        fresh.push((key, here));
                    }
                }
            }
            kept.push(tick);
        }
        let writes = fresh.iter().map(|((token, id), (p, o))| async move {
            let _permit = self.writes.acquire().await.map_err(fail)?;
            retry("write_ticks", || {
                self.exec("write_ticks", "insert_trade_id", (token, id, *p, *o))
            })
            .await
        });
        future::try_join_all(writes).await?;
        Ok(kept)
    }

    /// Writes ticks of one partition (one kind, token and hour) as one
    /// unlogged batch.
    async fn write_ticks(&self, ticks: Vec<Tick>) -> Result<()> {
        let Some(first) = ticks.first() else {
            return Ok(());
        };
        let name = format!("insert_{}", first.kind().as_str());
        let mut batch = Batch::new(BatchType::Unlogged);
        batch.set_consistency(self.config.consistency);
        batch.set_request_timeout(Some(self.config.request_timeout));
        for _ in &ticks {
            batch.append_statement(self.stmt(&name).clone());
        }
        let key = |t: &Tick| {
            (
                t.token_id.clone(),
                tick_period(t.key.ts.0),
                ts(t.key.ts.0),
                t.key.partition as i32,
                t.key.offset as i64,
            )
        };
        let run = || async {
            let sent = match &first.value {
                TickValue::Price { .. } => {
                    let values: Vec<_> = ticks
                        .iter()
                        .map(|t| match &t.value {
                            TickValue::Price { p } => {
                                let (a, b, c, d, e) = key(t);
                                (a, b, c, d, e, *p)
                            }
                            _ => unreachable!("one table per batch"),
                        })
                        .collect();
                    self.session.batch(&batch, values).await
                }
                TickValue::Book { .. } => {
                    let values: Vec<_> = ticks
                        .iter()
                        .map(|t| match &t.value {
                            TickValue::Book { bids, asks } => {
                                let (a, b, c, d, e) = key(t);
                                (a, b, c, d, e, bids.clone(), asks.clone())
                            }
                            _ => unreachable!("one table per batch"),
                        })
                        .collect();
                    self.session.batch(&batch, values).await
                }
                TickValue::Trade { .. } => {
                    let values: Vec<_> = ticks
                        .iter()
                        .map(|t| match &t.value {
                            TickValue::Trade {
                                price,
                                size,
                                side,
                                trade_id,
                            } => {
                                let (a, b, c, d, e) = key(t);
                                (
                                    a,
                                    b,
                                    c,
                                    d,
                                    e,
                                    *price,
                                    *size,
                                    side.as_str(),
                                    trade_id.clone(),
                                )
                            }
                            _ => unreachable!("one table per batch"),
                        })
                        .collect();
                    self.session.batch(&batch, values).await
                }
            };
            sent.map(|_| ()).map_err(fail)
        };
        retry("write_ticks", run).await
    }

    /// Reads `range` of one series of the `{table}_{res}` tables with the
    /// `range_{kind}_{res}` statements (`kind` is the table's, or
    /// `candles` on the prices tables).
    async fn range<R>(
        &self,
        (table, kind): (Table, &str),
        id: &str,
        range: Range,
        map: impl Fn(&scylla::response::query_result::QueryRowsResult, &mut Vec<R>) -> Result<()>,
    ) -> Result<Vec<R>> {
        let name = format!("range_{kind}_{}", range.res.as_str());
        let mut out = Vec::new();
        if range.end <= range.start || range.limit == 0 {
            return Ok(out);
        }
        let (first, last) = (
            period_of(range.res, range.start.0),
            period_of(range.res, range.end.0 - 1),
        );
        let tbl = format!("{}_{}", table.as_str(), range.res.as_str());
        // Time partitions in order; stop as soon as the page is full.
        let mut next = first;
        while next <= last && out.len() < range.limit {
            let periods = self
                .next_periods("read_range", &tbl, id, next, last, false)
                .await?;
            let Some(&after) = periods.last() else {
                break;
            };
            next = after + 1;
            for period in periods {
                let want = (range.limit - out.len()) as i32;
                let result = self
                    .exec(
                        "read_range",
                        &name,
                        (id, period, ts(range.start.0), ts(range.end.0), want),
                    )
                    .await?
                    .into_rows_result()
                    .map_err(corrupt)?;
                map(&result, &mut out)?;
                if out.len() >= range.limit {
                    break;
                }
            }
        }
        Ok(out)
    }
}

#[async_trait]
impl ProjectionStore for ScyllaStore {
    async fn committed(&self) -> Result<Vec<Position>> {
        // A caller reads its positions to (re)play from them, after a
        // restart, a failed step or lost writes (a node that died with
        // acknowledged writes unsynced): rows are rewritten from the log,
        // and so must their `series_periods` entries be.
        self.indexed.lock().expect("not poisoned").clear();
        let mut out = Vec::new();
        self.scan("select_consumed", |rows| {
            for row in rows.rows::<(i32, i64)>().map_err(corrupt)? {
                let (partition, next) = row.map_err(corrupt)?;
                out.push(Position {
                    partition: partition as u32,
                    offset: next as u64,
                });
            }
            Ok(())
        })
        .await?;
        out.sort();
        Ok(out)
    }

    async fn load(&self, keys: Vec<RowKey>) -> Result<Vec<Row>> {
        // One query per partition, the buckets as an IN list; partitions
        // are read concurrently (at most `write_concurrency` at once): a
        // long-tail batch touches thousands of partitions, and one after
        // another the step would wait on thousands of round trips.
        let mut partitions: BTreeMap<(Table, Resolution, Arc<str>, i64), Vec<i64>> =
            BTreeMap::new();
        for k in &keys {
            partitions
                .entry((k.table, k.res, k.id.clone(), period_of(k.res, k.bucket.0)))
                .or_default()
                .push(k.bucket.0);
        }
        let parts: Vec<Vec<Row>> = stream::iter(
            partitions
                .into_iter()
                .map(|(partition, buckets)| self.load_partition(partition, buckets)),
        )
        .buffer_unordered(self.config.write_concurrency.max(1))
        .try_collect()
        .await?;
        Ok(parts.into_iter().flatten().collect())
    }

    async fn frontiers(&self, series: Vec<hindsight_contracts::Series>) -> Result<Vec<Frontiers>> {
        // The last time partition `series_periods` lists for a series at a
        // resolution bounds its rows: an entry is written before the rows
        // of its partition. The bound is that partition's end, so rows in
        // the partition written last are still loaded one by one. Read
        // side by side, in order, at most `write_concurrency` at once (as
        // `load` reads).
        let mut reads = Vec::with_capacity(series.len() * Resolution::ALL.len());
        for (table, id) in series {
            for res in Resolution::ALL {
                reads.push((Series::Bucket(table, res).table(), id.clone(), res));
            }
        }
        let bounds: Vec<Timestamp> =
            stream::iter(reads.into_iter().map(|(tbl, id, res)| async move {
                let last = self
                    .exec(
                        "read_frontiers",
                        "select_series_periods_desc",
                        (tbl.as_str(), id.as_ref(), i64::MIN, i64::MAX, 1i32),
                    )
                    .await?
                    .into_rows_result()
                    .map_err(corrupt)?
                    .maybe_first_row::<(i64,)>()
                    .map_err(corrupt)?;
                let end =
                    |(p,): (i64,)| (p.saturating_add(1)).saturating_mul(statements::period_ms(res));
                Ok::<_, Error>(Timestamp(last.map_or(i64::MIN, end)))
            }))
            .buffered(self.config.write_concurrency.max(1))
            .try_collect()
            .await?;
        Ok(bounds
            .chunks(Resolution::ALL.len())
            .map(|per_res| per_res.try_into().expect("one bound per resolution"))
            .collect())
    }

    async fn lookup_tokens(&self, token_ids: Vec<String>) -> Result<Vec<TokenRef>> {
        // Point reads side by side, within the projector's one budget of
        // requests in flight (`write_concurrency`).
        let lookups = token_ids.iter().map(|id| async move {
            let _permit = self.writes.acquire().await.map_err(fail)?;
            self.token(id).await
        });
        let found = future::join_all(lookups).await;
        Ok(found
            .into_iter()
            .collect::<Result<Vec<_>>>()?
            .into_iter()
            .flatten()
            .collect())
    }

    async fn apply(&self, write: ProjectionWrite) -> Result<Applied> {
        let started = Instant::now();
        let mut partitions: BTreeMap<SeriesPeriod, Vec<Row>> = BTreeMap::new();
        for row in write.rows {
            let k = (
                Series::Bucket(row.key.table, row.key.res),
                row.key.id.clone(),
                period_of(row.key.res, row.key.bucket.0),
            );
            partitions.entry(k).or_default().push(row);
        }
        let ticks = self.first_trades(write.ticks).await?;
        let mut tick_partitions: BTreeMap<SeriesPeriod, Vec<Tick>> = BTreeMap::new();
        for tick in ticks {
            let k = (
                Series::Tick(tick.kind()),
                Arc::from(&*tick.token_id),
                tick_period(tick.key.ts.0),
            );
            tick_partitions.entry(k).or_default().push(tick);
        }
        let listed = self
            .index_periods(partitions.keys().chain(tick_partitions.keys()))
            .await;
        if let Err(e) = listed {
            self.indexed.lock().expect("not poisoned").clear();
            return Err(e);
        }
        // Large partitions go in several batches of at most 100 rows.
        let chunks: Vec<Vec<Row>> = partitions
            .into_values()
            .flat_map(|rows| rows.chunks(100).map(<[Row]>::to_vec).collect::<Vec<_>>())
            .collect();
        let mut tasks = Vec::new();
        for chunk in chunks {
            let writes = self.writes.clone();
            tasks.push(async move {
                let _permit = writes.acquire_owned().await.map_err(fail)?;
                self.write_partition(chunk).await
            });
        }
        // Bounded by the semaphore; awaited together.
        future::try_join_all(tasks).await?;
        let tick_chunks: Vec<Vec<Tick>> = tick_partitions
            .into_values()
            .flat_map(|ticks| ticks.chunks(100).map(<[Tick]>::to_vec).collect::<Vec<_>>())
            .collect();
        let tick_writes = tick_chunks.into_iter().map(|chunk| async move {
            let _permit = self.writes.acquire().await.map_err(fail)?;
            self.write_ticks(chunk).await
        });
        future::try_join_all(tick_writes).await?;
        let applied = self.write_catalog_records(&write.catalog).await?;
        // Positions last: they may only say what is durable.
        for p in &write.consumed {
            retry("write_consumed", || {
                self.exec(
                    "write_consumed",
                    "upsert_consumed",
                    (p.partition as i32, p.offset as i64 + 1),
                )
            })
            .await?;
        }
        metrics::histogram!(tm::STORE_QUERY_SECONDS, "op" => "apply")
            .record(started.elapsed().as_secs_f64());
        Ok(applied)
    }

    async fn reset(&self) -> Result<()> {
        self.indexed.lock().expect("not poisoned").clear();
        for table in statements::derived_tables(&self.config.keyspace) {
            self.session
                .query_unpaged(format!("TRUNCATE {table}"), ())
                .await
                .map_err(fail)?;
        }
        Ok(())
    }
}

/// The candle columns of a prices row ([`statements::CANDLE_COLUMNS`]).
type CandleCols = (
    Option<CqlTimestamp>,
    Option<i64>,
    Option<f64>,
    Option<CqlTimestamp>,
    Option<i64>,
    Option<f64>,
    Option<f64>,
    Option<f64>,
);

/// A candle as its columns: all NULL without one.
fn candle_cols(candle: &Option<Candle>) -> CandleCols {
    match candle {
        None => (None, None, None, None, None, None, None, None),
        Some(c) => (
            Some(ts(c.open.ts.0)),
            Some(c.open.offset as i64),
            Some(c.open.p),
            Some(ts(c.close.ts.0)),
            Some(c.close.offset as i64),
            Some(c.close.p),
            Some(c.high),
            Some(c.low),
        ),
    }
}

/// The candle of stored columns: all NULL is none (a row written before
/// schema version 7), some NULL is corrupt.
fn candle_of(cols: CandleCols) -> Result<Option<Candle>> {
    match cols {
        (None, None, None, None, None, None, None, None) => Ok(None),
        (Some(ot), Some(oo), Some(op), Some(ct), Some(co), Some(cp), Some(high), Some(low)) => {
            Ok(Some(Candle {
                open: Mark {
                    ts: Timestamp(ot.0),
                    offset: oo as u64,
                    p: op,
                },
                close: Mark {
                    ts: Timestamp(ct.0),
                    offset: co as u64,
                    p: cp,
                },
                high,
                low,
            }))
        }
        partial => Err(corrupt(format!("a candle with NULL columns: {partial:?}"))),
    }
}

/// Adds the candle columns to the `prices_*` tables of a keyspace older
/// than [`schema::CANDLES_SINCE`], each only if absent (a migration that
/// died half way is run again); existing rows keep NULL: no candle until
/// `hindsight rebuild`.
async fn add_candle_columns(session: &Session, ks: &str) -> Result<()> {
    let columns =
        "SELECT column_name FROM system_schema.columns WHERE keyspace_name = ? AND table_name = ?";
    for res in Resolution::ALL {
        let tbl = format!("prices_{}", res.as_str());
        let present: Vec<String> = session
            .query_unpaged(columns, (ks, tbl.as_str()))
            .await
            .map_err(|e| fail(format!("{columns}: {e}")))?
            .into_rows_result()
            .map_err(corrupt)?
            .rows::<(String,)>()
            .map_err(corrupt)?
            .map(|r| r.map(|(c,)| c).map_err(corrupt))
            .collect::<Result<_>>()?;
        for (column, kind) in statements::CANDLE_COLUMNS {
            if present.iter().any(|c| c == column) {
                continue;
            }
            let alter = format!("ALTER TABLE {ks}.{tbl} ADD {column} {kind}");
            session
                .query_unpaged(alter.as_str(), ())
                .await
                .map_err(|e| fail(format!("{alter}: {e}")))?;
        }
    }
    Ok(())
}

/// Fills `series_periods` from the bucket tables of a keyspace written
/// before it existed (every partition key of every bucket table, one paged
/// scan each).
async fn index_series_periods(session: &Session, ks: &str) -> Result<()> {
    for (kind, id_col, _) in statements::BUCKET_TABLES {
        for res in Resolution::ALL {
            let tbl = format!("{kind}_{}", res.as_str());
            let scan = format!("SELECT DISTINCT {id_col}, period FROM {ks}.{tbl}");
            let insert =
                format!("INSERT INTO {ks}.series_periods (tbl, id, period) VALUES (?, ?, ?)");
            let mut paging = PagingState::start();
            loop {
                let (result, next) = session
                    .query_single_page(scan.as_str(), (), paging)
                    .await
                    .map_err(|e| fail(format!("{scan}: {e}")))?;
                let rows = result.into_rows_result().map_err(corrupt)?;
                for row in rows.rows::<(String, i64)>().map_err(corrupt)? {
                    let (id, period) = row.map_err(corrupt)?;
                    session
                        .query_unpaged(insert.as_str(), (tbl.as_str(), id, period))
                        .await
                        .map_err(|e| fail(format!("{insert}: {e}")))?;
                }
                match next {
                    PagingStateResponse::HasMorePages { state } => paging = state,
                    PagingStateResponse::NoMorePages => break,
                }
            }
        }
    }
    Ok(())
}

/// What became of one catalog record.
enum Decision {
    /// Stored, or older than the stored version (and so left out).
    Done,
    /// Not stored: it contradicts the stored catalog.
    Refused(Reject),
}

fn decode_market(body: &[u8]) -> Result<MarketRecord> {
    match codec::decode(body).map_err(corrupt)? {
        Event::Market(m) => Ok(*m),
        other => Err(corrupt(format!(
            "markets row holds a {}",
            other.kind().as_str()
        ))),
    }
}

#[async_trait]
impl ReadStore for ScyllaStore {
    async fn prices(&self, token_id: &str, range: Range) -> Result<Vec<PricePoint>> {
        self.range((Table::Prices, "prices"), token_id, range, |rows, out| {
            for r in rows.rows::<(CqlTimestamp, f64, i64)>().map_err(corrupt)? {
                let (b, sum, count) = r.map_err(corrupt)?;
                out.push(PricePoint {
                    t: Timestamp(b.0),
                    p: sum / count as f64,
                });
            }
            Ok(())
        })
        .await
    }

    async fn candles(&self, token_id: &str, range: Range) -> Result<Vec<CandlePoint>> {
        self.range((Table::Prices, "candles"), token_id, range, |rows, out| {
            type Read = (
                CqlTimestamp,
                i64,
                Option<CqlTimestamp>,
                Option<i64>,
                Option<f64>,
                Option<CqlTimestamp>,
                Option<i64>,
                Option<f64>,
                Option<f64>,
                Option<f64>,
            );
            for r in rows.rows::<Read>().map_err(corrupt)? {
                let (b, count, ot, oo, op, ct, co, cp, h, l) = r.map_err(corrupt)?;
                out.push(CandlePoint {
                    t: Timestamp(b.0),
                    count: count as u64,
                    candle: candle_of((ot, oo, op, ct, co, cp, h, l))?,
                    trades: None,
                });
            }
            Ok(())
        })
        .await
    }

    async fn metrics(&self, market_id: &str, range: Range) -> Result<Vec<MetricsPoint>> {
        self.range(
            (Table::Metrics, "metrics"),
            market_id,
            range,
            |rows, out| {
                for r in rows
                    .rows::<(CqlTimestamp, f64, f64, f64, i64)>()
                    .map_err(corrupt)?
                {
                    let (b, v, l, s, count) = r.map_err(corrupt)?;
                    let n = count as f64;
                    out.push(MetricsPoint {
                        t: Timestamp(b.0),
                        volume: v / n,
                        liquidity: l / n,
                        spread: s / n,
                    });
                }
                Ok(())
            },
        )
        .await
    }

    async fn books(&self, token_id: &str, range: Range) -> Result<Vec<BookPoint>> {
        self.range((Table::Books, "books"), token_id, range, |rows, out| {
            for r in rows
                .rows::<(CqlTimestamp, CqlTimestamp, i64, String, String)>()
                .map_err(corrupt)?
            {
                let (b, _, _, bids, asks) = r.map_err(corrupt)?;
                out.push(BookPoint {
                    t: Timestamp(b.0),
                    bids,
                    asks,
                });
            }
            Ok(())
        })
        .await
    }

    async fn count(&self, table: Table, id: &str, range: Range) -> Result<u64> {
        let tbl = format!("{}_{}", table.as_str(), range.res.as_str());
        let periods = (
            period_of(range.res, range.start.0),
            period_of(range.res, range.end.0 - 1),
        );
        self.count_listed(
            "count_rows",
            &tbl,
            &format!("count_{tbl}"),
            id,
            periods,
            (range.start, range.end),
        )
        .await
    }

    async fn count_ticks(
        &self,
        kind: TickKind,
        token_id: &str,
        start: Timestamp,
        end: Timestamp,
    ) -> Result<u64> {
        let tbl = kind.as_str();
        let periods = (tick_period(start.0), tick_period(end.0 - 1));
        self.count_listed(
            "count_ticks",
            tbl,
            &format!("count_{tbl}"),
            token_id,
            periods,
            (start, end),
        )
        .await
    }

    async fn ticks(&self, kind: TickKind, token_id: &str, range: TickRange) -> Result<Vec<Tick>> {
        let mut out = Vec::new();
        if range.end <= range.from.ts || range.limit == 0 {
            return Ok(out);
        }
        let tbl = kind.as_str();
        let name = format!("range_{tbl}");
        let (first, last) = (tick_period(range.from.ts.0), tick_period(range.end.0 - 1));
        let from = range.from;
        let mut next = first;
        while next <= last && out.len() < range.limit {
            let periods = self
                .next_periods("read_ticks", tbl, token_id, next, last, false)
                .await?;
            let Some(&after) = periods.last() else {
                break;
            };
            next = after + 1;
            for period in periods {
                let want = (range.limit - out.len()) as i32;
                let values = (
                    token_id,
                    period,
                    ts(from.ts.0),
                    from.partition as i32,
                    from.offset as i64,
                    ts(range.end.0),
                    want,
                );
                let rows = self
                    .exec("read_ticks", &name, values)
                    .await?
                    .into_rows_result()
                    .map_err(corrupt)?;
                read_ticks(kind, token_id, &rows, &mut out)?;
                if out.len() >= range.limit {
                    break;
                }
            }
        }
        Ok(out)
    }

    async fn book_at(
        &self,
        token_id: &str,
        since: Timestamp,
        at: Timestamp,
    ) -> Result<Option<Tick>> {
        let tbl = TickKind::Book.as_str();
        let first = tick_period(since.0);
        let mut upto = tick_period(at.0);
        // Hours from `at` backwards; the latest snapshot is in the first
        // listed hour holding one (a listed hour without rows was left by
        // a crash before its rows, and only costs a read).
        loop {
            let periods = self
                .next_periods("read_book_at", tbl, token_id, first, upto, true)
                .await?;
            let Some(&lowest) = periods.last() else {
                return Ok(None);
            };
            for period in periods {
                let rows = self
                    .exec(
                        "read_book_at",
                        "latest_book_ticks",
                        (token_id, period, ts(since.0), ts(at.0)),
                    )
                    .await?
                    .into_rows_result()
                    .map_err(corrupt)?;
                let mut found = Vec::new();
                read_ticks(TickKind::Book, token_id, &rows, &mut found)?;
                if let Some(tick) = found.pop() {
                    return Ok(Some(tick));
                }
            }
            upto = lowest - 1;
        }
    }

    async fn token(&self, token_id: &str) -> Result<Option<TokenRef>> {
        // One row per market listing the token: one, since a market version
        // listing another market's token is not stored. Several only in a
        // keyspace written before that rule, or after two projectors stored
        // conflicting markets at the same instant (docs/DESIGN.md, "The
        // catalog"): the latest written wins, as in the embedded store.
        let rows = self
            .exec("read_token", "select_token", (token_id,))
            .await?
            .into_rows_result()
            .map_err(corrupt)?;
        let mut best: Option<(i64, String, String)> = None;
        for r in rows.rows::<(String, String, i64)>().map_err(corrupt)? {
            let (market_id, label, written) = r.map_err(corrupt)?;
            if best.as_ref().is_none_or(|(w, _, _)| written > *w) {
                best = Some((written, market_id, label));
            }
        }
        Ok(best.map(|(_, market_id, label)| TokenRef {
            token_id: token_id.to_string(),
            market_id,
            label,
        }))
    }

    async fn market(&self, id_or_slug: &str) -> Result<Option<MarketRecord>> {
        if let Some(m) = self.market_by_id(id_or_slug).await? {
            return Ok(Some(m));
        }
        // By slug: of the markets whose slug row names it, those that still
        // carry it (a row left by a crash between a market's upsert and the
        // deletion of its old slug names a market that moved on); the
        // newest if several.
        let ids = self
            .exec("read_market", "select_market_slug", (id_or_slug,))
            .await?
            .into_rows_result()
            .map_err(corrupt)?;
        let ids: Vec<String> = ids
            .rows::<(String,)>()
            .map_err(corrupt)?
            .map(|r| r.map(|(id,)| id).map_err(corrupt))
            .collect::<Result<_>>()?;
        let mut found: Option<MarketRecord> = None;
        for id in ids {
            if let Some(m) = self.market_by_id(&id).await? {
                if m.slug == id_or_slug
                    && found.as_ref().is_none_or(|f| m.updated_at > f.updated_at)
                {
                    found = Some(m);
                }
            }
        }
        Ok(found)
    }

    async fn catalog_changes(
        &self,
        since: Option<&CatalogCursor>,
    ) -> Result<(Vec<Event>, CatalogCursor)> {
        // The cursor is the wall-clock time (ms) of the previous read.
        let now = Timestamp::now().0;
        let mut out = Vec::new();
        match since {
            // Everything: the three tables.
            None => {
                for table in ["series", "events", "markets"] {
                    self.scan(&format!("all_{table}"), |rows| {
                        for r in rows.rows::<(i64, Vec<u8>)>().map_err(corrupt)? {
                            let (_, body) = r.map_err(corrupt)?;
                            out.push(codec::decode(&body).map_err(corrupt)?);
                        }
                        Ok(())
                    })
                    .await?;
                }
            }
            // The change feed since then, re-reading a margin for entries
            // that reach the feed late.
            Some(since) => {
                let from = since.backend_value() as i64 - CHANGE_MARGIN_MS;
                for day in from.div_euclid(DAY_MS)..=now.div_euclid(DAY_MS) {
                    let rows = self
                        .exec("catalog_changes", "select_catalog_changes", (day, ts(from)))
                        .await?
                        .into_rows_result()
                        .map_err(corrupt)?;
                    for r in rows.rows::<(CqlTimestamp, Vec<u8>)>().map_err(corrupt)? {
                        let (_, body) = r.map_err(corrupt)?;
                        out.push(codec::decode(&body).map_err(corrupt)?);
                    }
                }
            }
        }
        Ok((out, CatalogCursor::from_backend(now.max(0) as u64)))
    }
}

/// Ticks of one kind from rows `ts, log_partition, log_offset, <values>`.
fn read_ticks(
    kind: TickKind,
    token_id: &str,
    rows: &scylla::response::query_result::QueryRowsResult,
    out: &mut Vec<Tick>,
) -> Result<()> {
    let tick = |at: CqlTimestamp, partition: i32, offset: i64, value| Tick {
        token_id: token_id.into(),
        key: TickKey {
            ts: Timestamp(at.0),
            partition: partition as u32,
            offset: offset as u64,
        },
        value,
    };
    match kind {
        TickKind::Price => {
            for r in rows
                .rows::<(CqlTimestamp, i32, i64, f64)>()
                .map_err(corrupt)?
            {
                let (at, partition, offset, p) = r.map_err(corrupt)?;
                out.push(tick(at, partition, offset, TickValue::Price { p }));
            }
        }
        TickKind::Book => {
            for r in rows
                .rows::<(CqlTimestamp, i32, i64, String, String)>()
                .map_err(corrupt)?
            {
                let (at, partition, offset, bids, asks) = r.map_err(corrupt)?;
                let (bids, asks) = (bids.into(), asks.into());
                out.push(tick(at, partition, offset, TickValue::Book { bids, asks }));
            }
        }
        TickKind::Trade => {
            type TradeRow = (CqlTimestamp, i32, i64, f64, f64, String, Option<String>);
            for r in rows.rows::<TradeRow>().map_err(corrupt)? {
                let (at, partition, offset, price, size, side, trade_id) = r.map_err(corrupt)?;
                let side = TradeSide::parse(&side)
                    .ok_or_else(|| corrupt(format!("trade side {side:?}")))?;
                let value = TickValue::Trade {
                    price,
                    size,
                    side,
                    trade_id: trade_id.map(String::into_boxed_str),
                };
                out.push(tick(at, partition, offset, value));
            }
        }
    }
    Ok(())
}

type KeyRow = (
    Vec<u8>,
    String,
    String,
    String,
    CqlTimestamp,
    Option<CqlTimestamp>,
);

fn key_record(row: KeyRow) -> Result<ApiKeyRecord> {
    let (hash, key_id, organization, plan, created, revoked) = row;
    Ok(ApiKeyRecord {
        key_id,
        hash: hash
            .try_into()
            .map_err(|_| corrupt("api key hash is not 32 bytes"))?,
        organization,
        plan,
        created_at: Timestamp(created.0),
        revoked_at: revoked.map(|t| Timestamp(t.0)),
    })
}

#[async_trait]
impl AuthStore for ScyllaStore {
    async fn put_key(&self, key: ApiKeyRecord) -> Result<()> {
        let values = (
            key.hash.to_vec(),
            key.key_id.as_str(),
            key.organization.as_str(),
            key.plan.as_str(),
            ts(key.created_at.0),
            key.revoked_at.map(|t| ts(t.0)),
        );
        self.exec("put_key", "upsert_key", values).await.map(|_| ())
    }

    async fn key_by_hash(&self, hash: [u8; 32]) -> Result<Option<ApiKeyRecord>> {
        let rows = self
            .exec("read_key", "select_key", (hash.to_vec(),))
            .await?
            .into_rows_result()
            .map_err(corrupt)?;
        rows.maybe_first_row::<KeyRow>()
            .map_err(corrupt)?
            .map(key_record)
            .transpose()
    }

    async fn list_keys(&self) -> Result<Vec<ApiKeyRecord>> {
        let mut out = Vec::new();
        self.scan("all_keys", |rows| {
            for r in rows.rows::<KeyRow>().map_err(corrupt)? {
                out.push(key_record(r.map_err(corrupt)?)?);
            }
            Ok(())
        })
        .await?;
        out.sort_by_key(|k| k.created_at);
        Ok(out)
    }

    /// Check, write, count again; a hit that finds the limit exceeded
    /// deletes its own row. No lightweight transaction and no counter.
    ///
    /// Why no interval `I` of one window ever holds more than `limit`
    /// admitted hits: suppose it held `limit + 1`, and let `h` be the one
    /// among them whose insert was acknowledged last. Every other one was
    /// acknowledged before, so before `h`'s second read began; admitted rows
    /// are never deleted and outlive any read that counts them
    /// ([`RATE_HIT_RETENTION_MS`](hindsight_contracts::auth::RATE_HIT_RETENTION_MS));
    /// all lie in `I`, which lies within [`counted_range`] of `h.at` (it
    /// holds `h`, and is one window long). So that read counted at least
    /// `limit + 1` rows and `h` was refused.
    ///
    /// The one assumption: a read begun after a write was acknowledged sees
    /// it, i.e. the read and write consistency levels' replica sets
    /// intersect (`QUORUM`, `LOCAL_QUORUM` within one datacenter, or `ONE`
    /// with one replica). With `LOCAL_QUORUM` across datacenters the bound
    /// holds per datacenter.
    ///
    /// Hits racing for the last places may all see each other's rows and
    /// all withdraw. Such a hit tries again after a random pause (growing
    /// with each attempt, [`RACE_ATTEMPTS`] in all), which spreads the
    /// racers out; each attempt is the whole procedure, so the bound holds
    /// whatever happens.
    ///
    /// Cost per request: one read of the key's partition (at most `limit`
    /// rows, plus racers' rows) for a refused hit, the common case of a
    /// client over its limit, which writes nothing; one insert and a second
    /// read for an admitted one; a delete (and a retry) only for a hit that
    /// lost a race at the limit.
    async fn take_hit(&self, key_id: &str, now: Timestamp, limit: u32) -> Result<RateHits> {
        let limit = limit as usize;
        let mut attempt = 0;
        loop {
            let before = self.hits("take_hit", key_id, now).await?;
            if before.len() >= limit {
                return Ok(RateHits {
                    admitted: false,
                    hits: before,
                });
            }
            let id = random_u64() as i64;
            self.exec("take_hit", "insert_hit", (key_id, ts(now.0), id))
                .await?;
            let after = self.hits("take_hit", key_id, now).await?;
            if after.len() <= limit {
                return Ok(RateHits {
                    admitted: true,
                    hits: after,
                });
            }
            self.exec("take_hit", "delete_hit", (key_id, ts(now.0), id))
                .await?;
            attempt += 1;
            if attempt == RACE_ATTEMPTS {
                // Refused in a race: the window had room before it.
                return Ok(RateHits {
                    admitted: false,
                    hits: before,
                });
            }
            let pause_ms = random_u64() % (RACE_PAUSE_MS << attempt);
            tokio::time::sleep(Duration::from_millis(pause_ms)).await;
        }
    }

    async fn rate_hits(&self, key_id: &str, now: Timestamp) -> Result<Vec<Timestamp>> {
        self.hits("read_hits", key_id, now).await
    }
}

impl ScyllaStore {
    /// The hits of `key_id` counted at `now`, ascending (the clustering order).
    async fn hits(&self, op: &'static str, key_id: &str, now: Timestamp) -> Result<Vec<Timestamp>> {
        let (after, before) = counted_range(now);
        let rows = self
            .exec(op, "select_hits", (key_id, ts(after.0), ts(before.0)))
            .await?
            .into_rows_result()
            .map_err(corrupt)?;
        rows.rows::<(CqlTimestamp,)>()
            .map_err(corrupt)?
            .map(|r| r.map(|(t,)| Timestamp(t.0)).map_err(corrupt))
            .collect()
    }
}

/// Attempts of a hit that keeps losing races for the last places in its
/// window before it is refused.
const RACE_ATTEMPTS: u32 = 4;
/// The longest pause before the second attempt; doubled for each next one.
const RACE_PAUSE_MS: u64 = 10;

/// Random bits: a hit's row id (two hits of one key in one millisecond are
/// two rows, and a withdrawn hit deletes only its own) and race pauses.
fn random_u64() -> u64 {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).expect("the OS random source is available");
    u64::from_le_bytes(bytes)
}
