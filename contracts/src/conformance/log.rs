//! Log checks: [`crate::EventLog`], [`crate::ConsumerSource`] and [`crate::LogConsumer`].
//!
//! Each check gets a log of its own ([`LogFixture`]): an empty embedded log,
//! or Kafka topics under a prefix of its own with a consumer group of its
//! own. Consumers are read as the projector reads them: `poll`, then
//! `assignment_changed`, and a step's positions recorded in the read store
//! before they are committed to the log ([`record_consumed`]).

use super::{ensure, store_err, Check, LogFixture, T0};
use crate::{
    append_body, AppendBatch, AppendOutcome, Delivered, Idempotency, LogConsumer, Position,
    ProjectionWrite,
};
use hindsight_schemas::{
    BookLevel, BookSnapshot, Event, MarketRecord, MetricsSample, PriceTick, Timestamp, Token,
};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Longest a check waits for events it appended (a Kafka consumer first
/// joins its group).
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(30);

/// Events of `markets` markets, `rounds` of each: price ticks of two
/// tokens, and now and then a book snapshot, a metrics sample and a new
/// version of the market record, interleaved across markets as a feed would.
pub fn sample_events(prefix: &str, markets: usize, rounds: usize) -> Vec<Event> {
    let mut out = Vec::new();
    for round in 0..rounds {
        for m in 0..markets {
            let market_id = format!("{prefix}-m{m}");
            let ts = Timestamp(T0 + (round as i64) * 7_000 + m as i64);
            let token = |side: &str| format!("{market_id}-{side}");
            if round % 4 == 0 {
                out.push(Event::Market(Box::new(MarketRecord {
                    id: market_id.clone(),
                    slug: format!("{market_id}-slug"),
                    event_id: None,
                    question: Some(format!("version {round}")),
                    description: None,
                    status: "open".into(),
                    start_date: None,
                    end_date: None,
                    closed_at: None,
                    resolved_token_id: None,
                    resolved_token_label: None,
                    tokens: ["yes", "no"]
                        .iter()
                        .map(|side| Token {
                            id: token(side),
                            label: side.to_string(),
                        })
                        .collect(),
                    created_at: Timestamp(T0),
                    updated_at: ts,
                })));
            }
            let p = ((round * 13 + m * 7) % 100) as f64 / 100.0;
            for (side, prob) in [("yes", p), ("no", 1.0 - p)] {
                out.push(Event::Price(PriceTick {
                    market_id: market_id.clone(),
                    token_id: token(side),
                    ts,
                    p: prob,
                }));
            }
            if round % 3 == 1 {
                out.push(Event::Book(Box::new(BookSnapshot {
                    market_id: market_id.clone(),
                    token_id: token("yes"),
                    ts,
                    bids: vec![BookLevel {
                        price: p.max(0.01),
                        size: round as f64 + 1.0,
                    }],
                    asks: vec![],
                })));
            }
            if round % 2 == 1 {
                out.push(Event::Metrics(MetricsSample {
                    market_id: market_id.clone(),
                    ts,
                    volume: round as f64 * 10.0,
                    liquidity: 100.0,
                    spread: 0.02,
                }));
            }
        }
    }
    out
}

/// The events one table is fed from, in the log's order guarantee:
/// per key and per stream (ticks, snapshots, samples, catalog records).
fn stream(e: &Event) -> (String, &'static str) {
    let family = match e {
        Event::Price(_) => "price",
        Event::Book(_) => "book",
        Event::Metrics(_) => "metrics",
        Event::Trade(_) => "trade",
        Event::Series(_) | Event::Event(_) | Event::Market(_) => "catalog",
    };
    (e.key().to_string(), family)
}

fn by_stream<'a>(
    events: impl Iterator<Item = &'a Event>,
) -> BTreeMap<(String, &'static str), Vec<&'a Event>> {
    let mut out: BTreeMap<_, Vec<_>> = BTreeMap::new();
    for e in events {
        out.entry(stream(e)).or_default().push(e);
    }
    out
}

async fn append(fixture: &LogFixture, events: Vec<Event>) -> Check {
    let n = events.len();
    let batch = AppendBatch {
        events: events.into(),
        idempotency: None,
    };
    let what = format!("appending {n} events answered");
    append_expecting(fixture, batch, AppendOutcome::Appended { count: n }, &what).await
}

/// Appends `events` in batches of `batch` events.
async fn append_in_batches(fixture: &LogFixture, events: &[Event], batch: usize) -> Check {
    for chunk in events.chunks(batch) {
        append(fixture, chunk.to_vec()).await?;
    }
    Ok(())
}

/// What a consumer delivered, and what `assignment_changed` said after each
/// poll: `(events delivered before this poll, answer)` for every `true`.
#[derive(Default)]
struct Drained {
    events: Vec<Delivered>,
    changes: Vec<usize>,
}

/// Polls as the projector does until `want` events have arrived, then once
/// more to see nothing else does.
async fn drain(consumer: &mut dyn LogConsumer, want: usize, into: &mut Drained) -> Check {
    let deadline = Instant::now() + DELIVERY_TIMEOUT;
    let start = into.events.len();
    while into.events.len() - start < want {
        if Instant::now() > deadline {
            return Err(format!(
                "{} of {want} appended events delivered after {DELIVERY_TIMEOUT:?}",
                into.events.len() - start
            ));
        }
        poll_once(consumer, 500, Duration::from_millis(200), into).await?;
    }
    poll_once(consumer, 500, Duration::from_millis(300), into).await?;
    let got = into.events.len() - start;
    ensure(got == want, || {
        format!("{got} events delivered where {want} were appended")
    })
}

async fn poll_once(
    consumer: &mut dyn LogConsumer,
    max: usize,
    wait: Duration,
    into: &mut Drained,
) -> Check {
    let batch = consumer.poll(max, wait).await.map_err(store_err)?;
    if consumer.assignment_changed() {
        into.changes.push(into.events.len());
    }
    ensure(batch.len() <= max, || {
        format!("poll(max = {max}) returned {} events", batch.len())
    })?;
    into.events.extend(batch);
    Ok(())
}

/// What the projector does after writing a step: record the positions in
/// the read store, then commit them to the log.
pub async fn record_consumed(
    fixture: &LogFixture,
    consumer: &mut dyn LogConsumer,
    upto: &[Position],
) -> Check {
    fixture
        .store
        .apply(ProjectionWrite {
            consumed: upto.to_vec(),
            ..Default::default()
        })
        .await
        .map_err(store_err)?;
    consumer.commit(upto).await.map_err(store_err)
}

/// Every appended event is delivered once to a fresh consumer, and the
/// events of one key and one stream (ticks, snapshots, samples, catalog
/// records) in the order they were appended.
pub async fn log_delivers_every_event_once_in_order_per_key(
    fixture: &LogFixture,
    prefix: &str,
) -> Check {
    let events = sample_events(prefix, 6, 12);
    append_in_batches(fixture, &events, 37).await?;
    let mut consumer = fixture.source.open().await.map_err(store_err)?;
    let mut got = Drained::default();
    drain(consumer.as_mut(), events.len(), &mut got).await?;
    let want = by_stream(events.iter());
    let have = by_stream(got.events.iter().map(|d| &d.event));
    for (key, sent) in &want {
        let seen = have.get(key).cloned().unwrap_or_default();
        ensure(&seen == sent, || {
            format!(
                "{key:?}: delivered {} events, not the {} appended in their order\nfirst delivered: {:?}\nfirst appended: {:?}",
                seen.len(),
                sent.len(),
                seen.first(),
                sent.first()
            )
        })?;
    }
    ensure(have.len() == want.len(), || {
        "events of streams never appended were delivered".into()
    })
}

/// In each partition, the positions of batches appended without a key
/// follow each other without gaps or repeats, in delivery order.
pub async fn log_positions_are_dense_per_partition(fixture: &LogFixture, prefix: &str) -> Check {
    let events = sample_events(prefix, 5, 8);
    append_in_batches(fixture, &events, 50).await?;
    let mut consumer = fixture.source.open().await.map_err(store_err)?;
    let mut got = Drained::default();
    drain(consumer.as_mut(), events.len(), &mut got).await?;
    let mut partitions: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    for d in &got.events {
        partitions
            .entry(d.position.partition)
            .or_default()
            .push(d.position.offset);
    }
    for (partition, offsets) in &partitions {
        ensure(offsets.windows(2).all(|w| w[1] == w[0] + 1), || {
            format!("partition {partition} delivered offsets {offsets:?}")
        })?;
    }
    Ok(())
}

/// Positions recorded and committed as the projector does: a consumer
/// opened afterwards delivers exactly the events after them.
pub async fn log_commit_then_reopen_resumes_after_committed(
    fixture: &LogFixture,
    prefix: &str,
) -> Check {
    let events = sample_events(prefix, 6, 8);
    append_in_batches(fixture, &events, 40).await?;
    let mut first = fixture.source.open().await.map_err(store_err)?;
    let mut got = Drained::default();
    drain(first.as_mut(), events.len(), &mut got).await?;
    // Commit about half of each partition's events.
    let mut per_partition: BTreeMap<u32, Vec<&Delivered>> = BTreeMap::new();
    for d in &got.events {
        per_partition
            .entry(d.position.partition)
            .or_default()
            .push(d);
    }
    let upto: Vec<Position> = per_partition
        .values()
        .map(|ds| ds[(ds.len() - 1) / 2].position)
        .collect();
    record_consumed(fixture, first.as_mut(), &upto).await?;
    drop(first);
    let rest: Vec<&Delivered> = got
        .events
        .iter()
        .filter(|d| {
            upto.iter()
                .any(|u| u.partition == d.position.partition && d.position.offset > u.offset)
        })
        .collect();
    let mut second = fixture.source.open().await.map_err(store_err)?;
    let mut again = Drained::default();
    drain(second.as_mut(), rest.len(), &mut again).await?;
    let mut want: Vec<&Delivered> = rest;
    let mut have: Vec<&Delivered> = again.events.iter().collect();
    want.sort_by_key(|d| d.position);
    have.sort_by_key(|d| d.position);
    ensure(have == want, || {
        format!(
            "after committing {upto:?}, a new consumer delivered {} events from {:?}, not the {} after the commit",
            have.len(),
            have.first().map(|d| d.position),
            want.len()
        )
    })
}

fn keyed(key: &str, body: u8, events: &[Event], response: &[u8]) -> AppendBatch {
    AppendBatch {
        events: events.to_vec().into(),
        idempotency: Some(Idempotency {
            key: key.to_string(),
            body_digest: [body; 32],
            response: response.to_vec(),
        }),
    }
}

/// Drains a fresh consumer and checks the log holds exactly `want`.
async fn log_holds_exactly(fixture: &LogFixture, want: &[Event]) -> Check {
    let mut consumer = fixture.source.open().await.map_err(store_err)?;
    let mut got = Drained::default();
    drain(consumer.as_mut(), want.len(), &mut got).await?;
    let mut have: Vec<&Event> = got.events.iter().map(|d| &d.event).collect();
    let mut want: Vec<&Event> = want.iter().collect();
    let order = |e: &&Event| format!("{e:?}");
    have.sort_by_key(order);
    want.sort_by_key(order);
    ensure(have == want, || {
        "the log holds other events than the first batch's".into()
    })
}

async fn append_expecting(
    fixture: &LogFixture,
    batch: AppendBatch,
    want: AppendOutcome,
    what: &str,
) -> Check {
    let outcome = fixture.log.append(batch).await.map_err(store_err)?;
    ensure(outcome == want, || format!("{what}: {outcome:?}"))
}

/// Appends the first half of a sample under a new key (body digest 1,
/// response "first"); returns that half, the other half and the key.
async fn first_half_under_a_key(
    fixture: &LogFixture,
    prefix: &str,
) -> Result<(Vec<Event>, Vec<Event>, String), String> {
    let mut first = sample_events(prefix, 3, 4);
    let second = first.split_off(first.len() / 2);
    let key = format!("{prefix}-key");
    let appended = AppendOutcome::Appended { count: first.len() };
    let batch = keyed(&key, 1, &first, b"first");
    append_expecting(fixture, batch, appended, "first append under a key").await?;
    Ok((first, second, key))
}

fn first_response() -> AppendOutcome {
    AppendOutcome::Duplicate {
        response: b"first".to_vec(),
    }
}

/// A batch appended under an idempotency key seen before, with the same
/// body digest, is not appended again; the first append's response comes
/// back (here the retry's events differ, to show none is appended).
pub async fn log_idempotency_key_appends_once(fixture: &LogFixture, prefix: &str) -> Check {
    let (first, retry, key) = first_half_under_a_key(fixture, prefix).await?;
    for _ in 0..2 {
        let batch = keyed(&key, 1, &retry, b"second");
        append_expecting(fixture, batch, first_response(), "a key seen before").await?;
    }
    log_holds_exactly(fixture, &first).await
}

/// A batch under a key seen before with another body digest is a
/// `Conflict`, appends nothing, and leaves the key answering the first
/// body's retries.
pub async fn log_idempotency_key_with_another_body_conflicts(
    fixture: &LogFixture,
    prefix: &str,
) -> Check {
    let (first, other, key) = first_half_under_a_key(fixture, prefix).await?;
    let batch = keyed(&key, 2, &other, b"other");
    let what = "another body under a key seen before";
    append_expecting(fixture, batch, AppendOutcome::Conflict, what).await?;
    let batch = keyed(&key, 1, &first, b"again");
    let what = "the first body's retry after a conflict";
    append_expecting(fixture, batch, first_response(), what).await?;
    log_holds_exactly(fixture, &first).await
}

/// A key recorded by a build that kept the body's SHA-256 as its digest
/// (before 2026-11-27): [`append_body`] answers the retry of its body with
/// the first response, and another body with a `Conflict`, appending
/// neither. A body sent under a key of its own is appended once.
pub async fn log_a_key_recorded_with_a_sha256_digest_answers_its_retries(
    fixture: &LogFixture,
    prefix: &str,
) -> Check {
    use sha2::{Digest, Sha256};
    let mut first = sample_events(prefix, 3, 4);
    let other = first.split_off(first.len() / 2);
    let body = format!("{prefix} body").into_bytes();
    let key = format!("{prefix}-earlier");
    let earlier = AppendBatch {
        events: first.clone().into(),
        idempotency: Some(Idempotency {
            key: key.clone(),
            body_digest: Sha256::digest(&body).into(),
            response: b"first".to_vec(),
        }),
    };
    let appended = AppendOutcome::Appended { count: first.len() };
    append_expecting(fixture, earlier, appended, "a batch under a SHA-256 digest").await?;
    let send = |key: &str, events: &[Event], body: &[u8]| {
        let batch = AppendBatch {
            events: events.to_vec().into(),
            idempotency: Some(Idempotency::for_body(key, body, b"second".to_vec())),
        };
        let body = body.to_vec();
        async move {
            append_body(&*fixture.log, batch, &body)
                .await
                .map_err(store_err)
        }
    };
    let retry = send(&key, &other, &body).await?;
    ensure(retry == first_response(), || {
        format!("the earlier build's body retried under its key: {retry:?}")
    })?;
    let another = send(&key, &other, b"another body").await?;
    ensure(another == AppendOutcome::Conflict, || {
        format!("another body under the earlier build's key: {another:?}")
    })?;
    log_holds_exactly(fixture, &first).await?;
    let fresh = format!("{prefix}-fresh");
    let appended = send(&fresh, &other, &body).await?;
    let want = AppendOutcome::Appended { count: other.len() };
    ensure(appended == want, || format!("a new key: {appended:?}"))?;
    let again = send(&fresh, &first, &body).await?;
    let want = AppendOutcome::Duplicate {
        response: b"second".to_vec(),
    };
    ensure(again == want, || format!("the new key's retry: {again:?}"))?;
    let mut all = first;
    all.extend(other);
    log_holds_exactly(fixture, &all).await
}

/// Total of `lag()` once it reports every owned partition, waiting for it
/// to equal `want`.
async fn lag_until(consumer: &mut dyn LogConsumer, want: u64) -> Check {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let lag = consumer.lag().await.map_err(store_err)?;
        let total: u64 = lag.iter().map(|(_, n)| n).sum();
        if !lag.is_empty() && total == want {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("lag stays {lag:?}, not {want} events in all"));
        }
        // Not polling meanwhile: a poll would move the position. (A group
        // member stays in its group for `max.poll.interval.ms` without.)
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `lag` counts the events beyond the consumer's position: zero once it
/// has read everything, the number appended since then after more appends.
pub async fn log_lag_reaches_zero(fixture: &LogFixture, prefix: &str) -> Check {
    let events = sample_events(prefix, 4, 6);
    append_in_batches(fixture, &events, 30).await?;
    let mut consumer = fixture.source.open().await.map_err(store_err)?;
    let mut got = Drained::default();
    drain(consumer.as_mut(), events.len(), &mut got).await?;
    lag_until(consumer.as_mut(), 0).await?;
    let more = sample_events(&format!("{prefix}-more"), 2, 3);
    append(fixture, more.clone()).await?;
    lag_until(consumer.as_mut(), more.len() as u64).await?;
    drain(consumer.as_mut(), more.len(), &mut got).await?;
    lag_until(consumer.as_mut(), 0).await
}

/// With no other consumer in its group, a consumer's assignment changes at
/// most once (its first assignment), and if `assignment_changed` says so,
/// it says so before any event was handed over.
pub async fn log_assignment_changed_at_most_once_for_a_lone_consumer(
    fixture: &LogFixture,
    prefix: &str,
) -> Check {
    let events = sample_events(prefix, 4, 6);
    append_in_batches(fixture, &events, 25).await?;
    let mut consumer = fixture.source.open().await.map_err(store_err)?;
    let mut got = Drained::default();
    drain(consumer.as_mut(), events.len(), &mut got).await?;
    let more = sample_events(&format!("{prefix}-more"), 2, 2);
    append(fixture, more.clone()).await?;
    drain(consumer.as_mut(), more.len(), &mut got).await?;
    ensure(got.changes.len() <= 1, || {
        format!(
            "assignment_changed said true {} times (after {:?} events) with no other consumer",
            got.changes.len(),
            got.changes
        )
    })?;
    // Said after the poll whose rebalance assigned the partitions, before
    // the projector folds that poll's events: no event came earlier.
    ensure(got.changes.iter().all(|&before| before == 0), || {
        format!(
            "assignment_changed said true only after {:?} events had been handed over",
            got.changes
        )
    })
}
