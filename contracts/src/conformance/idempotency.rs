//! Idempotency store checks: [`crate::IdempotencyStore`].
//!
//! Each check gets two handles on one store ([`IdempotencyPair`]), as two
//! ingest replicas would hold, and writes only keys under its prefix. Leases
//! are short where a check needs one to run out.

use super::{ensure, store_err, Check, IdempotencyPair};
use crate::{Claim, Hold, IdempotencyStore, Marker, Position};
use std::sync::Arc;
use std::time::Duration;

/// A lease no check waits out.
const LONG: Duration = Duration::from_secs(120);
/// A lease a check waits out.
const SHORT: Duration = Duration::from_millis(400);

fn digest(n: u8) -> [u8; 32] {
    [n; 32]
}

/// The marker of a committing attempt.
fn the_marker() -> Marker {
    Marker {
        position: Position {
            partition: 2,
            offset: 41,
        },
        writer: "writer-of-the-first-attempt".into(),
    }
}

/// A new owner id for every attempt of a check (process-wide: checks run
/// in parallel, and an id is never reused).
fn next_owner() -> u128 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    u128::from(NEXT.fetch_add(1, Ordering::SeqCst)) << 64 | u128::from(std::process::id())
}

async fn claim(
    store: &dyn IdempotencyStore,
    key: &str,
    body: u8,
    response: &str,
    lease: Duration,
) -> Result<Claim, String> {
    store
        .claim(key, &digest(body), next_owner(), response.as_bytes(), lease)
        .await
        .map_err(store_err)
}

fn owned(claim: Claim, what: &str) -> Result<Hold, String> {
    match claim {
        Claim::Owned(hold) => Ok(hold),
        other => Err(format!("{what}: expected Owned, got {other:?}")),
    }
}

/// How far two processes' clocks may disagree on when a lease ends (the
/// holder sets its end by its clock, another claim reads it by its own).
const CLOCK_SLACK: Duration = Duration::from_secs(1);

fn busy(claim: &Claim, lease: Duration, what: &str) -> Result<Duration, String> {
    match claim {
        Claim::Busy { retry_after }
            if !retry_after.is_zero() && *retry_after <= lease + CLOCK_SLACK =>
        {
            Ok(*retry_after)
        }
        other => Err(format!(
            "{what}: expected Busy with a retry within the {lease:?} lease, got {other:?}"
        )),
    }
}

fn done(claim: &Claim, response: &str, what: &str) -> Check {
    ensure(
        *claim
            == Claim::Done {
                response: response.as_bytes().to_vec(),
            },
        || format!("{what}: expected Done with the first response {response:?}, got {claim:?}"),
    )
}

/// A claim of `key` on `store` while another holder's [`SHORT`] lease runs
/// (`Busy`), then again once it ran out.
async fn claim_after_the_lease(
    store: &dyn IdempotencyStore,
    key: &str,
    what: &str,
) -> Result<Claim, String> {
    let wait = busy(&claim(store, key, 1, "second", LONG).await?, SHORT, what)?;
    tokio::time::sleep(wait + Duration::from_millis(150)).await;
    claim(store, key, 1, "second", LONG).await
}

/// The first claim of `key` (body 1, response "first"), which must be owned.
async fn first_claim(
    store: &dyn IdempotencyStore,
    key: &str,
    lease: Duration,
) -> Result<Hold, String> {
    owned(claim(store, key, 1, "first", lease).await?, "first claim")
}

/// `committing` by a holder that must still hold the key.
async fn mark_committing(store: &dyn IdempotencyStore, hold: &Hold) -> Check {
    let moved = store
        .committing(hold, &the_marker())
        .await
        .map_err(store_err)?;
    ensure(moved, || {
        format!("holder {:x} could not mark committing", hold.owner)
    })
}

/// `done` by a holder that must still hold the key.
async fn mark_done(store: &dyn IdempotencyStore, hold: &Hold) -> Check {
    let moved = store.done(hold).await.map_err(store_err)?;
    ensure(moved, || {
        format!("holder {:x} could not mark done", hold.owner)
    })
}

/// A retry of the first body is answered `Done` with the first response.
async fn replays_the_first(store: &dyn IdempotencyStore, key: &str, what: &str) -> Check {
    done(&claim(store, key, 1, "third", LONG).await?, "first", what)
}

/// Claims `key` eight times at once, half on each handle; returns every
/// answer.
async fn claim_concurrently(pair: &IdempotencyPair, key: &str) -> Result<Vec<Claim>, String> {
    let mut tasks = Vec::new();
    for i in 0..8 {
        let store: Arc<dyn IdempotencyStore> = if i % 2 == 0 {
            pair.a.clone()
        } else {
            pair.b.clone()
        };
        let key = key.to_string();
        tasks.push(tokio::spawn(async move {
            store
                .claim(
                    &key,
                    &digest(1),
                    next_owner(),
                    format!("response {i}").as_bytes(),
                    LONG,
                )
                .await
        }));
    }
    let mut out = Vec::new();
    for task in tasks {
        out.push(
            task.await
                .map_err(|e| format!("claim task: {e}"))?
                .map_err(store_err)?,
        );
    }
    Ok(out)
}

fn exactly_one_owner(claims: &[Claim], what: &str) -> Result<Hold, String> {
    let owners: Vec<&Hold> = claims
        .iter()
        .filter_map(|c| match c {
            Claim::Owned(h) => Some(h),
            _ => None,
        })
        .collect();
    ensure(owners.len() == 1, || {
        format!(
            "{what}: {} of {} concurrent claims were granted the key: {claims:?}",
            owners.len(),
            claims.len()
        )
    })?;
    for c in claims {
        if !matches!(c, Claim::Owned(_)) {
            busy(c, LONG, what)?;
        }
    }
    Ok(owners[0].clone())
}

/// Eight concurrent claims of a new key from two handles: exactly one holds
/// it, the others are told to come back. Released, the key is taken over
/// by exactly one of eight concurrent claims again.
pub async fn idempotency_concurrent_claims_grant_exactly_one_owner(
    pair: &IdempotencyPair,
    prefix: &str,
) -> Check {
    let key = format!("{prefix}-k");
    let first = exactly_one_owner(&claim_concurrently(pair, &key).await?, "a new key")?;
    pair.a.release(&first).await.map_err(store_err)?;
    let second = exactly_one_owner(&claim_concurrently(pair, &key).await?, "a released key")?;
    ensure(second.owner != first.owner, || {
        "the takeover kept the released owner".into()
    })
}

/// A claim with another body digest is `Conflict` while the key is
/// pending, committing and done, and changes nothing: the first body's
/// retry still gets the first response.
pub async fn idempotency_another_body_conflicts_in_every_state(
    pair: &IdempotencyPair,
    prefix: &str,
) -> Check {
    let key = format!("{prefix}-k");
    let hold = first_claim(&*pair.a, &key, LONG).await?;
    let other = |state: &'static str| {
        let key = key.clone();
        async move {
            let c = claim(&*pair.b, &key, 2, "other", LONG).await?;
            ensure(c == Claim::Conflict, || {
                format!("another body while {state}: {c:?}")
            })
        }
    };
    other("pending").await?;
    mark_committing(&*pair.a, &hold).await?;
    other("committing").await?;
    mark_done(&*pair.a, &hold).await?;
    other("done").await?;
    replays_the_first(&*pair.b, &key, "the first body's retry after the conflicts").await
}

/// While the holder's lease runs, a claim is `Busy`; after it, the key is
/// taken over, and the previous holder's `committing`, `done` and `release`
/// change nothing.
pub async fn idempotency_an_expired_lease_is_taken_over_and_the_old_holder_is_ignored(
    pair: &IdempotencyPair,
    prefix: &str,
) -> Check {
    let key = format!("{prefix}-k");
    let old = first_claim(&*pair.a, &key, SHORT).await?;
    let new = owned(
        claim_after_the_lease(&*pair.b, &key, "a claim during the lease").await?,
        "a claim after the lease of a pending holder",
    )?;
    ensure(new.owner != old.owner, || {
        "the takeover kept the old owner".into()
    })?;
    let stale_committing = pair
        .a
        .committing(&old, &the_marker())
        .await
        .map_err(store_err)?;
    let stale_done = pair.a.done(&old).await.map_err(store_err)?;
    ensure(!stale_committing && !stale_done, || {
        format!(
            "the taken-over holder still moved the key (committing: {stale_committing}, done: {stale_done})"
        )
    })?;
    pair.a.release(&old).await.map_err(store_err)?;
    busy(
        &claim(&*pair.a, &key, 1, "third", LONG).await?,
        LONG,
        "a claim after the old holder's release (the new holder's lease runs)",
    )?;
    mark_committing(&*pair.b, &new).await?;
    mark_done(&*pair.b, &new).await?;
    replays_the_first(&*pair.a, &key, "a retry after the new holder finished").await
}

/// A holder that died after `committing` hands its marker to the claim that
/// takes the key over, with the first response; that claim finishes it.
pub async fn idempotency_a_committing_holder_is_taken_over_with_its_marker(
    pair: &IdempotencyPair,
    prefix: &str,
) -> Check {
    let key = format!("{prefix}-k");
    let old = first_claim(&*pair.a, &key, SHORT).await?;
    mark_committing(&*pair.a, &old).await?;
    let taken = claim_after_the_lease(
        &*pair.b,
        &key,
        "a claim while the committing holder's lease runs",
    )
    .await?;
    let Claim::TakenOver {
        hold,
        marker,
        response,
    } = taken
    else {
        return Err(format!(
            "a claim after a committing holder's lease: expected TakenOver, got {taken:?}"
        ));
    };
    ensure(
        marker == the_marker() && response == b"first" && hold.owner != old.owner,
        || {
            format!(
                "TakenOver carries marker {marker:?} and response {:?}, not {:?} and \"first\" (or kept the old owner)",
                String::from_utf8_lossy(&response),
                the_marker()
            )
        },
    )?;
    let stale = pair.a.done(&old).await.map_err(store_err)?;
    ensure(!stale, || "the taken-over holder marked done".into())?;
    mark_done(&*pair.b, &hold).await?;
    replays_the_first(&*pair.a, &key, "a retry after the takeover finished").await
}

/// `release` ends the lease at once: a pending key is owned by the next
/// claim, a committing one taken over with its marker, without waiting.
pub async fn idempotency_release_lets_the_next_claim_take_over_at_once(
    pair: &IdempotencyPair,
    prefix: &str,
) -> Check {
    let key = format!("{prefix}-k");
    let first = first_claim(&*pair.a, &key, LONG).await?;
    pair.a.release(&first).await.map_err(store_err)?;
    let second = owned(
        claim(&*pair.b, &key, 1, "second", LONG).await?,
        "a claim after a pending holder released",
    )?;
    mark_committing(&*pair.b, &second).await?;
    pair.b.release(&second).await.map_err(store_err)?;
    let third = claim(&*pair.a, &key, 1, "third", LONG).await?;
    ensure(
        matches!(&third, Claim::TakenOver { marker, .. } if *marker == the_marker()),
        || format!("a claim after a committing holder released: {third:?}"),
    )
}

/// A claim repeated by its owner (its answer was lost, the request retried
/// within the attempt) is granted again, not `Busy` on itself.
pub async fn idempotency_a_repeated_claim_of_the_same_owner_is_granted_again(
    pair: &IdempotencyPair,
    prefix: &str,
) -> Check {
    let key = format!("{prefix}-k");
    let owner = next_owner();
    let first = pair
        .a
        .claim(&key, &digest(1), owner, b"first", LONG)
        .await
        .map_err(store_err)?;
    let again = pair
        .b
        .claim(&key, &digest(1), owner, b"first", LONG)
        .await
        .map_err(store_err)?;
    let (first, again) = (
        owned(first, "first claim")?,
        owned(again, "the same owner again")?,
    );
    ensure(first == again, || format!("{first:?} then {again:?}"))?;
    busy(
        &claim(&*pair.b, &key, 1, "other", LONG).await?,
        LONG,
        "another owner's claim",
    )
    .map(|_| ())
}
