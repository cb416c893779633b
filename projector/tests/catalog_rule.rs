//! The catalog rule as the projector applies it to what is already in the
//! log (lines ingest accepted before a contradicting record was projected,
//! logs written before the rule): a tick under another market than its
//! token's is not folded, a market version taking another market's token or
//! slug is not stored, each decided against the catalog at the event's log
//! position — so the outcome is the same however the log is cut into steps.

use hindsight_contracts::{conformance, AppendBatch, EventLog, Range, ReadStore, TickKind};
use hindsight_projector::{Projector, ProjectorConfig};
use hindsight_schemas::wire::parse_line;
use hindsight_schemas::{Event, Resolution, Timestamp};
use hindsight_sqlite::{EmbeddedSource, SqliteLog, SqliteStore};
use std::sync::Arc;
use std::time::Duration;

/// 2025-09-01T00:00:00Z, in seconds.
const DAY: i64 = 1_756_684_800;

fn tick(market: &str, token: &str, offset_s: i64, p: f64) -> Event {
    let line = format!(
        r#"{{"kind":"price","market_id":"{market}","token_id":"{token}","ts":{},"p":{p}}}"#,
        DAY + offset_s
    );
    parse_line(&line, Timestamp::now()).unwrap()
}

/// Market `id` (version `v`, its `updated_at` in seconds after DAY) with
/// `slug` and `tokens`.
fn market(id: &str, v: i64, slug: &str, tokens: &[&str]) -> Event {
    let tokens: Vec<(&str, &str)> = tokens.iter().map(|t| (*t, *t)).collect();
    Event::Market(Box::new(conformance::store::market(
        id,
        slug,
        "q",
        (DAY + v) * 1000,
        &tokens,
    )))
}

/// Appends `events` as they are (no ingest check: the log may hold
/// anything valid) and projects them in steps of `step` events; the store
/// and what the projector reported.
async fn project(
    dir: &std::path::Path,
    events: Vec<Event>,
    step: usize,
) -> (Arc<SqliteStore>, u64) {
    let log = Arc::new(SqliteLog::open(dir).unwrap());
    log.append(AppendBatch {
        events: events.into(),
        idempotency: None,
    })
    .await
    .unwrap();
    let store = Arc::new(SqliteStore::open(dir).unwrap());
    let source = Arc::new(EmbeddedSource {
        log,
        store: store.clone(),
    });
    let config = ProjectorConfig {
        batch_max: step,
        backlog_batch_max: step,
        idle_wait: Duration::from_millis(5),
        ..ProjectorConfig::default()
    };
    let consumed = Projector::new(source, store.clone(), config)
        .catch_up()
        .await
        .unwrap();
    (store, consumed)
}

/// A token's 1m prices over the test day, in order.
async fn day_prices(store: &SqliteStore, token: &str) -> Vec<f64> {
    let range = Range {
        res: Resolution::M1,
        start: Timestamp(DAY * 1000),
        end: Timestamp((DAY + 86_400) * 1000),
        limit: 1000,
    };
    store
        .prices(token, range)
        .await
        .unwrap()
        .into_iter()
        .map(|p| p.p)
        .collect()
}

#[tokio::test]
async fn a_tick_under_another_market_than_its_token_is_not_folded_into_that_history() {
    for step in [1, 3, 100] {
        let dir = tempfile::tempdir().unwrap();
        let events = vec![
            market("a", 0, "a-slug", &["a-yes"]),
            market("b", 0, "b-slug", &["b-yes"]),
            tick("a", "b-yes", 0, 0.9),
            tick("b", "b-yes", 60, 0.5),
            // A token no market lists yet is folded as sent.
            tick("a", "a-new", 0, 0.3),
        ];
        let (store, consumed) = project(dir.path(), events, step).await;
        assert_eq!(consumed, 5, "every event consumed, folded or not");
        assert_eq!(day_prices(&store, "b-yes").await, [0.5], "step {step}");
        assert_eq!(day_prices(&store, "a-new").await, [0.3], "step {step}");
    }
}

/// A trade is judged as a tick is, even in a step holding no price tick
/// or snapshot of its token (whose owner the projector looked up only
/// for those before).
#[tokio::test]
async fn a_trade_under_another_market_than_its_token_is_not_stored() {
    let trade = |market: &str, token: &str, id: &str| {
        let line = format!(
            r#"{{"kind":"trade","market_id":"{market}","token_id":"{token}","ts":{DAY},"price":0.5,"size":1,"side":"buy","trade_id":"{id}"}}"#
        );
        parse_line(&line, Timestamp::now()).unwrap()
    };
    for step in [1, 3, 100] {
        let dir = tempfile::tempdir().unwrap();
        let events = vec![
            market("a", 0, "a-slug", &["a-yes"]),
            market("b", 0, "b-slug", &["b-yes"]),
            trade("a", "b-yes", "x1"),
            trade("b", "b-yes", "x2"),
        ];
        let (store, consumed) = project(dir.path(), events, step).await;
        assert_eq!(consumed, 4, "every event consumed, stored or not");
        let (start, end) = (Timestamp(DAY * 1000), Timestamp((DAY + 60) * 1000));
        let trades = store
            .count_ticks(TickKind::Trade, "b-yes", start, end)
            .await
            .unwrap();
        assert_eq!(trades, 1, "step {step}: only b's trade of b-yes");
    }
}

#[tokio::test]
async fn a_market_taking_a_listed_token_or_slug_is_not_stored_until_the_first_releases_it() {
    for step in [1, 2, 4, 100] {
        let dir = tempfile::tempdir().unwrap();
        let events = vec![
            market("a", 0, "a-slug", &["t"]),
            market("b", 0, "b-slug", &["t"]), // refused: a lists t
            market("c", 0, "a-slug", &["c-yes"]), // refused: a's slug
            tick("b", "t", 0, 0.9),           // t is a's: not folded
            market("a", 1, "a-slug2", &["a-2"]), // a releases t and its slug
            tick("b", "t", 60, 0.2),          // t is nobody's: folded
            market("b", 1, "b-slug", &["t"]), // stored now
            market("c", 1, "a-slug", &["c-yes"]), // stored now
            tick("a", "t", 120, 0.7),         // t is b's: not folded
            tick("b", "t", 180, 0.4),
        ];
        let (store, _) = project(dir.path(), events, step).await;
        assert_eq!(day_prices(&store, "t").await, [0.2, 0.4], "step {step}");
        let t = store.token("t").await.unwrap().unwrap();
        assert_eq!(t.market_id, "b", "step {step}");
        let by_slug = store.market("a-slug").await.unwrap().unwrap();
        assert_eq!(by_slug.id, "c", "step {step}");
    }
}
