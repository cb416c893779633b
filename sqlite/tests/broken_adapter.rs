//! The conformance suite can fail: an adapter around the embedded store
//! that breaks one clause at a time fails the check for that clause, while
//! the same adapter breaking nothing passes it.

use async_trait::async_trait;
use hindsight_contracts::conformance::{store, Check};
use hindsight_contracts::*;
use hindsight_schemas::{Event, MarketRecord, Resolution, Timestamp};
use hindsight_sqlite::SqliteStore;
use std::sync::atomic::{AtomicI64, Ordering};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Break {
    Nothing,
    /// A market upsert adds to the stored token list instead of replacing it.
    AddsTokens,
    /// `catalog_changes(Some(cursor))` answers nothing.
    EmptyChangesSince,
    /// The last version to arrive wins, older or not.
    LastArrivalWins,
    /// Positions are written before the rows and catalog.
    PositionsFirst,
    /// Rate limits count fixed minute windows (Hindsight before the log).
    FixedWindows,
    /// A hit is counted, then taken without a second look: racing hits all
    /// see room under the limit.
    CheckThenTake,
    /// `apply` does not report the catalog records it refused.
    HidesRefusals,
    /// A catalog record applied again is decided again (as a store
    /// without per-partition catalog marks would).
    DecidesAgain,
    /// Ticks of a write are stored last first: of two trades with one id
    /// in a write, the later is kept.
    KeepsTheLastOfAWrite,
    /// Ticks come back in arrival (log) order, not by time.
    TicksByArrival,
    /// A sign-in token is read, not deleted: the link works again.
    TokensReused,
    /// Every use is counted as served: the status class is dropped.
    OneStatusClass,
    /// A frontier is the last stored bucket's start, not its end.
    FrontierAtTheLastBucket,
}

struct Broken {
    inner: SqliteStore,
    how: Break,
    arrivals: AtomicI64,
}

#[async_trait]
impl ProjectionStore for Broken {
    async fn committed(&self) -> Result<Vec<Position>> {
        self.inner.committed().await
    }

    async fn load(&self, keys: Vec<RowKey>) -> Result<Vec<Row>> {
        self.inner.load(keys).await
    }

    async fn frontiers(&self, series: Vec<Series>) -> Result<Vec<Frontiers>> {
        let mut bounds = self.inner.frontiers(series).await?;
        if self.how == Break::FrontierAtTheLastBucket {
            for per_res in &mut bounds {
                for (b, res) in per_res.iter_mut().zip(Resolution::ALL) {
                    if b.0 != i64::MIN {
                        b.0 -= res.width_ms();
                    }
                }
            }
        }
        Ok(bounds)
    }

    async fn lookup_tokens(&self, token_ids: Vec<String>) -> Result<Vec<TokenRef>> {
        self.inner.lookup_tokens(token_ids).await
    }

    async fn apply(&self, mut write: ProjectionWrite) -> Result<Applied> {
        match self.how {
            Break::KeepsTheLastOfAWrite => write.ticks.reverse(),
            Break::AddsTokens => {
                for (_, event) in &mut write.catalog {
                    if let Event::Market(m) = event {
                        if let Some(stored) = self.inner.market(&m.id).await? {
                            merge_tokens(m, stored);
                        }
                    }
                }
            }
            Break::LastArrivalWins => {
                for (_, event) in &mut write.catalog {
                    let n = self.arrivals.fetch_add(1, Ordering::SeqCst);
                    let stamp = Timestamp(4_000_000_000_000 + n);
                    match event {
                        Event::Series(s) => s.updated_at = stamp,
                        Event::Event(e) => e.updated_at = stamp,
                        Event::Market(m) => m.updated_at = stamp,
                        _ => {}
                    }
                }
            }
            Break::PositionsFirst => {
                let consumed = std::mem::take(&mut write.consumed);
                self.inner
                    .apply(ProjectionWrite {
                        consumed,
                        ..Default::default()
                    })
                    .await?;
            }
            Break::DecidesAgain => {
                // Every apply's records at positions never seen before.
                let shift = 1_000_000 * (self.arrivals.fetch_add(1, Ordering::SeqCst) as u64 + 1);
                for (pos, _) in &mut write.catalog {
                    pos.offset += shift;
                }
            }
            Break::HidesRefusals => {
                self.inner.apply(write).await?;
                return Ok(Applied::default());
            }
            _ => {}
        }
        self.inner.apply(write).await
    }

    async fn reset(&self) -> Result<()> {
        self.inner.reset().await
    }
}

fn merge_tokens(m: &mut MarketRecord, stored: MarketRecord) {
    for t in stored.tokens {
        if !m.tokens.iter().any(|n| n.id == t.id) {
            m.tokens.push(t);
        }
    }
}

#[async_trait]
impl ReadStore for Broken {
    async fn prices(&self, token_id: &str, range: Range) -> Result<Vec<PricePoint>> {
        self.inner.prices(token_id, range).await
    }
    async fn candles(&self, token_id: &str, range: Range) -> Result<Vec<CandlePoint>> {
        self.inner.candles(token_id, range).await
    }
    async fn metrics(&self, market_id: &str, range: Range) -> Result<Vec<MetricsPoint>> {
        self.inner.metrics(market_id, range).await
    }
    async fn books(&self, token_id: &str, range: Range) -> Result<Vec<BookPoint>> {
        self.inner.books(token_id, range).await
    }
    async fn count(&self, table: Table, id: &str, range: Range) -> Result<u64> {
        self.inner.count(table, id, range).await
    }
    async fn count_ticks(
        &self,
        kind: TickKind,
        token_id: &str,
        start: Timestamp,
        end: Timestamp,
    ) -> Result<u64> {
        self.inner.count_ticks(kind, token_id, start, end).await
    }
    async fn ticks(&self, kind: TickKind, token_id: &str, range: TickRange) -> Result<Vec<Tick>> {
        let mut ticks = self.inner.ticks(kind, token_id, range).await?;
        if self.how == Break::TicksByArrival {
            ticks.sort_by_key(|t| (t.key.partition, t.key.offset));
        }
        Ok(ticks)
    }
    async fn book_at(
        &self,
        token_id: &str,
        since: Timestamp,
        at: Timestamp,
    ) -> Result<Option<Tick>> {
        self.inner.book_at(token_id, since, at).await
    }
    async fn token(&self, token_id: &str) -> Result<Option<TokenRef>> {
        self.inner.token(token_id).await
    }
    async fn market(&self, id_or_slug: &str) -> Result<Option<MarketRecord>> {
        self.inner.market(id_or_slug).await
    }
    async fn catalog_changes(
        &self,
        since: Option<&CatalogCursor>,
    ) -> Result<(Vec<Event>, CatalogCursor)> {
        let (changes, cursor) = self.inner.catalog_changes(since).await?;
        if self.how == Break::EmptyChangesSince && since.is_some() {
            return Ok((Vec::new(), cursor));
        }
        Ok((changes, cursor))
    }
}

#[async_trait]
impl AuthStore for Broken {
    async fn put_key(&self, key: ApiKeyRecord) -> Result<()> {
        self.inner.put_key(key).await
    }
    async fn key_by_hash(&self, hash: [u8; 32]) -> Result<Option<ApiKeyRecord>> {
        self.inner.key_by_hash(hash).await
    }
    async fn list_keys(&self) -> Result<Vec<ApiKeyRecord>> {
        self.inner.list_keys().await
    }
    async fn take_hit(&self, key_id: &str, now: Timestamp, limit: u32) -> Result<RateHits> {
        let room = match self.how {
            Break::FixedWindows => {
                let start = now.0.div_euclid(auth::RATE_WINDOW_MS) * auth::RATE_WINDOW_MS;
                let hits = self.inner.rate_hits(key_id, now).await?;
                let in_window = hits.iter().filter(|h| h.0 >= start && h.0 <= now.0);
                in_window.count() < limit as usize
            }
            Break::CheckThenTake => {
                let hits = self.inner.rate_hits(key_id, now).await?;
                // Long enough for the other racers' counts to be read too
                // before this one takes: under load the blocking threads
                // their reads wait on start later than a yield comes back,
                // the takes were serialized and the race was lost (CI).
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                hits.len() < limit as usize
            }
            _ => return self.inner.take_hit(key_id, now, limit).await,
        };
        if room {
            self.inner.take_hit(key_id, now, u32::MAX).await
        } else {
            let hits = self.inner.rate_hits(key_id, now).await?;
            Ok(RateHits {
                admitted: false,
                hits,
            })
        }
    }
    async fn rate_hits(&self, key_id: &str, now: Timestamp) -> Result<Vec<Timestamp>> {
        self.inner.rate_hits(key_id, now).await
    }
}

#[async_trait]
impl AccountStore for Broken {
    async fn put_organization(&self, org: Organization) -> Result<()> {
        self.inner.put_organization(org).await
    }
    async fn organization(&self, name: &str) -> Result<Option<Organization>> {
        self.inner.organization(name).await
    }
    async fn put_user(&self, user: User) -> Result<()> {
        self.inner.put_user(user).await
    }
    async fn user(&self, email: &str) -> Result<Option<User>> {
        self.inner.user(email).await
    }
    async fn users(&self, organization: &str) -> Result<Vec<User>> {
        self.inner.users(organization).await
    }
    async fn put_sign_in_token(&self, token: SignInToken) -> Result<()> {
        self.inner.put_sign_in_token(token).await
    }
    async fn take_sign_in_token(&self, hash: [u8; 32]) -> Result<Option<SignInToken>> {
        let taken = self.inner.take_sign_in_token(hash).await?;
        if let (Break::TokensReused, Some(token)) = (self.how, &taken) {
            self.inner.put_sign_in_token(token.clone()).await?;
        }
        Ok(taken)
    }
    async fn put_session(&self, session: Session) -> Result<()> {
        self.inner.put_session(session).await
    }
    async fn session(&self, hash: [u8; 32]) -> Result<Option<Session>> {
        self.inner.session(hash).await
    }
    async fn delete_session(&self, hash: [u8; 32]) -> Result<()> {
        self.inner.delete_session(hash).await
    }
    async fn put_org_key(&self, key: OrgKey) -> Result<()> {
        self.inner.put_org_key(key).await
    }
    async fn org_keys(&self, organization: &str) -> Result<Vec<OrgKey>> {
        self.inner.org_keys(organization).await
    }
    async fn record_uses(&self, mut uses: Vec<KeyUse>) -> Result<()> {
        if let Break::OneStatusClass = self.how {
            for u in &mut uses {
                u.class = StatusClass::Ok;
            }
        }
        self.inner.record_uses(uses).await
    }
    async fn key_usage(&self, key_id: &str, since: Timestamp) -> Result<KeyUsage> {
        self.inner.key_usage(key_id, since).await
    }
}

/// Runs `check` on two handles of a fresh store broken as `how` says.
async fn run<F, Fut>(how: Break, check: F) -> Check
where
    F: FnOnce(&'static Broken, &'static Broken, String) -> Fut,
    Fut: std::future::Future<Output = Check>,
{
    let dir = tempfile::tempdir().unwrap();
    let handle = || -> &'static Broken {
        Box::leak(Box::new(Broken {
            inner: SqliteStore::open(dir.path()).unwrap(),
            how,
            arrivals: AtomicI64::new(0),
        }))
    };
    let (a, b) = (handle(), handle());
    check(a, b, format!("broken-{how:?}")).await
}

macro_rules! breaking {
    ($name:ident, $how:expr, $check:path) => {
        #[tokio::test]
        async fn $name() {
            let ok = run(
                Break::Nothing,
                |a, b, p| async move { $check(a, b, &p).await },
            )
            .await;
            assert_eq!(
                ok,
                Ok(()),
                "the unbroken adapter fails {}",
                stringify!($check)
            );
            let broken = run($how, |a, b, p| async move { $check(a, b, &p).await }).await;
            assert!(
                broken.is_err(),
                "{} passes on an adapter where {:?}",
                stringify!($check),
                $how
            );
        }
    };
}

breaking!(
    adding_tokens_fails_the_token_list_check,
    Break::AddsTokens,
    store::catalog_token_list_is_replaced
);
breaking!(
    an_empty_change_feed_fails_the_cursor_check,
    Break::EmptyChangesSince,
    store::catalog_changes_after_a_cursor
);
breaking!(
    letting_the_last_arrival_win_fails_the_version_check,
    Break::LastArrivalWins,
    store::catalog_newest_version_wins_whatever_arrival_order
);
breaking!(
    hiding_refusals_fails_the_first_market_check,
    Break::HidesRefusals,
    store::catalog_first_market_keeps_its_tokens_and_slug
);
breaking!(
    deciding_a_replayed_record_again_fails_the_replay_check,
    Break::DecidesAgain,
    store::catalog_replay_decides_nothing_again
);
breaking!(
    positions_before_rows_fail_the_positions_check,
    Break::PositionsFirst,
    store::positions_never_advance_past_unwritten_rows
);
breaking!(
    fixed_minute_windows_fail_the_sliding_window_check,
    Break::FixedWindows,
    store::rate_limit_decisions_are_the_sliding_window
);
breaking!(
    taking_without_a_second_count_fails_the_concurrency_check,
    Break::CheckThenTake,
    store::rate_limit_holds_under_concurrent_handles
);
breaking!(
    keeping_the_last_trade_of_a_write_fails_the_trade_id_check,
    Break::KeepsTheLastOfAWrite,
    store::trade_ids_count_once_whatever_write_they_come_in
);
breaking!(
    serving_ticks_by_arrival_fails_the_tick_order_check,
    Break::TicksByArrival,
    store::ticks_round_trip_in_key_order_and_page
);
breaking!(
    reusing_sign_in_tokens_fails_the_single_use_check,
    Break::TokensReused,
    store::sign_in_tokens_are_taken_exactly_once
);
breaking!(
    dropping_the_status_class_fails_the_usage_check,
    Break::OneStatusClass,
    store::usage_counts_add_up_across_handles
);
breaking!(
    a_frontier_at_the_last_bucket_fails_the_frontier_check,
    Break::FrontierAtTheLastBucket,
    store::frontiers_bound_every_stored_bucket
);
