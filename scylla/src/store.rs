//! [`ScyllaStore`]: buckets, catalog, keys and rate windows on ScyllaDB.
//!
//! Writes: prepared statements only; the projector's rows are grouped by
//! partition into unlogged batches (one partition per batch: no coordinator
//! fan-out), run with bounded concurrency, each with a timeout and retried
//! with backoff; consumed positions are written after every row. Replay
//! safety needs no lightweight transaction: the projector owning a log
//! partition is the single writer of its rows and overwrites whole rows that
//! carry the offset of the last event folded in.

use crate::schema;
use crate::statements::{self, period_of, Stmt};
use async_trait::async_trait;
use hindsight_contracts::*;
use hindsight_schemas::{codec, Event, MarketRecord, Resolution, Timestamp};
use hindsight_telemetry as tm;
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use scylla::frame::response::result::{CollectionType, ColumnType, NativeType};
use scylla::response::{PagingState, PagingStateResponse};
use scylla::serialize::row::SerializeRow;
use scylla::statement::batch::{Batch, BatchType};
use scylla::statement::prepared::PreparedStatement;
use scylla::statement::{Consistency, SerialConsistency};
use scylla::value::{Counter, CqlTimestamp};
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
}

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
            // Every plain write is a whole-row overwrite or a counter bump;
            // the counter and the lightweight transactions are not safe to
            // retry blindly (their callers handle a lost answer).
            p.set_is_idempotent(name != "hit_window" && !lwt);
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
        for statement in &plan {
            session
                .query_unpaged(statement.as_str(), ())
                .await
                .map_err(|e| fail(format!("{statement}: {e}")))?;
        }
        Ok(plan)
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
    async fn scan<F>(&self, name: &str, mut each: F) -> Result<()>
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
                                RowValue::Price { sum, count } => (
                                    r.key.id.to_string(),
                                    period_of(r.key.res, r.key.bucket.0),
                                    ts(r.key.bucket.0),
                                    *sum,
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

    /// Upserts a catalog record if newer than the stored version, with its
    /// lookups and a change-feed entry. A market's new slug and tokens are
    /// written before the rows of its dropped ones are deleted, so the
    /// market stays reachable throughout.
    async fn write_catalog(&self, pos: Position, event: &Event) -> Result<()> {
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
                return Ok(());
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
        Ok(())
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

    async fn range<R>(
        &self,
        kind: &str,
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
        // Time partitions in order; stop as soon as the page is full.
        for period in first..=last {
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
        Ok(out)
    }
}

#[async_trait]
impl ProjectionStore for ScyllaStore {
    async fn committed(&self) -> Result<Vec<Position>> {
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
        // One query per partition, the buckets as an IN list.
        let mut partitions: BTreeMap<(Table, Resolution, Arc<str>, i64), Vec<i64>> =
            BTreeMap::new();
        for k in &keys {
            partitions
                .entry((k.table, k.res, k.id.clone(), period_of(k.res, k.bucket.0)))
                .or_default()
                .push(k.bucket.0);
        }
        let mut out = Vec::new();
        for ((table, res, id, period), buckets) in partitions {
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
                    for r in rows
                        .rows::<(CqlTimestamp, f64, i64, i64)>()
                        .map_err(corrupt)?
                    {
                        let (b, sum, count, last) = r.map_err(corrupt)?;
                        out.push(Row {
                            key: key(b),
                            value: RowValue::Price {
                                sum,
                                count: count as u64,
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
        }
        Ok(out)
    }

    async fn apply(&self, write: ProjectionWrite) -> Result<()> {
        let started = Instant::now();
        let mut partitions: BTreeMap<(Table, Resolution, Arc<str>, i64), Vec<Row>> =
            BTreeMap::new();
        for row in write.rows {
            let k = (
                row.key.table,
                row.key.res,
                row.key.id.clone(),
                period_of(row.key.res, row.key.bucket.0),
            );
            partitions.entry(k).or_default().push(row);
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
        let results = join_all(tasks).await;
        results.into_iter().collect::<Result<Vec<()>>>()?;
        for (pos, event) in &write.catalog {
            self.write_catalog(*pos, event).await?;
        }
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
        Ok(())
    }

    async fn reset(&self) -> Result<()> {
        for table in statements::derived_tables(&self.config.keyspace) {
            self.session
                .query_unpaged(format!("TRUNCATE {table}"), ())
                .await
                .map_err(fail)?;
        }
        Ok(())
    }
}

/// Awaits futures concurrently (they hold semaphore permits, so at most
/// `write_concurrency` run at once).
async fn join_all<F: std::future::Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut set = Vec::with_capacity(futures.len());
    let mut pinned: Vec<std::pin::Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut done: Vec<Option<F::Output>> = (0..pinned.len()).map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, f) in pinned.iter_mut().enumerate() {
            if done[i].is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => done[i] = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    set.extend(done.into_iter().map(|d| d.expect("every future completed")));
    set
}

fn decode_market(body: &[u8]) -> Result<MarketRecord> {
    match codec::decode(body).map_err(corrupt)? {
        Event::Market(m) => Ok(m),
        other => Err(corrupt(format!(
            "markets row holds a {}",
            other.kind().as_str()
        ))),
    }
}

#[async_trait]
impl ReadStore for ScyllaStore {
    async fn prices(&self, token_id: &str, range: Range) -> Result<Vec<PricePoint>> {
        self.range("prices", token_id, range, |rows, out| {
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

    async fn metrics(&self, market_id: &str, range: Range) -> Result<Vec<MetricsPoint>> {
        self.range("metrics", market_id, range, |rows, out| {
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
        })
        .await
    }

    async fn books(&self, token_id: &str, range: Range) -> Result<Vec<BookPoint>> {
        self.range("books", token_id, range, |rows, out| {
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

    async fn token(&self, token_id: &str) -> Result<Option<TokenRef>> {
        // One row per market listing the token: normally one. While two
        // markets list it (it moved and the old market's update is still
        // to come), the latest written wins, as in the embedded store.
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

    async fn hit_window(&self, key_id: &str, window: Timestamp) -> Result<u64> {
        // A counter: increments from every API replica add up. The read
        // after the increment sees at least this request.
        self.exec("hit_window", "hit_window", (key_id, ts(window.0)))
            .await?;
        let rows = self
            .exec("hit_window", "read_window", (key_id, ts(window.0)))
            .await?
            .into_rows_result()
            .map_err(corrupt)?;
        Ok(rows
            .maybe_first_row::<(Counter,)>()
            .map_err(corrupt)?
            .map_or(1, |(c,)| c.0.max(1) as u64))
    }
}
