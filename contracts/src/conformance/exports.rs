//! Export job checks: [`crate::ExportJobStore`]. A claim takes any
//! claimable job of the store, so each check gets a store of its own
//! (two handles on it: two API replicas).

use super::{ensure, store_err, Check, ExportJobsPair, T0};
use crate::exports::*;
use hindsight_schemas::Timestamp;

fn job(prefix: &str, n: u32, owner: &str, at: i64) -> ExportJob {
    ExportJob::queued(
        format!("job-{prefix}-{n}"),
        owner.to_string(),
        format!("prices?token_id=t{n}&start_ts=0&end_ts=60"),
        1000 + u64::from(n),
        Timestamp(at),
    )
}

/// Jobs read back through the other handle as created; an owner's list
/// holds its own jobs only, newest first.
pub async fn export_jobs_round_trip_and_list_newest_first(
    p: &ExportJobsPair,
    prefix: &str,
) -> Check {
    let owner = format!("org:{prefix}");
    let (old, new) = (job(prefix, 1, &owner, T0), job(prefix, 2, &owner, T0 + 5));
    let other = job(prefix, 3, &format!("key:{prefix}"), T0 + 1);
    for j in [&old, &new, &other] {
        p.a.create_job(j.clone()).await.map_err(store_err)?;
    }
    let got = p.b.job(&old.id).await.map_err(store_err)?;
    ensure(got.as_ref() == Some(&old), || {
        format!("a created job reads {got:?}")
    })?;
    let missing =
        p.b.job(&format!("none-{prefix}"))
            .await
            .map_err(store_err)?;
    ensure(missing.is_none(), || {
        format!("an unknown job reads {missing:?}")
    })?;
    let listed = p.b.jobs(&owner).await.map_err(store_err)?;
    ensure(listed == vec![new, old], || {
        format!("the owner's jobs: {listed:?}")
    })
}

/// Claims take the oldest claimable job first, and of concurrent claims
/// through both handles each job goes to exactly one, as running in
/// attempt 1 with the asked lease.
pub async fn export_job_claims_are_exclusive_and_oldest_first(
    p: &ExportJobsPair,
    prefix: &str,
) -> Check {
    let owner = format!("org:{prefix}");
    for (n, at) in [(2, T0 + 2), (1, T0), (3, T0 + 3)] {
        p.a.create_job(job(prefix, n, &owner, at))
            .await
            .map_err(store_err)?;
    }
    let (now, until) = (Timestamp(T0 + 10), Timestamp(T0 + 60_000));
    let first = p.b.claim_job(now, until).await.map_err(store_err)?;
    let first = first.ok_or("no job claimed of three queued")?;
    ensure(first.id == job(prefix, 1, &owner, T0).id, || {
        format!("the first claim took {}, not the oldest", first.id)
    })?;
    ensure(
        first.status == JobStatus::Running
            && first.attempt == 1
            && first.lease_until == Some(until),
        || format!("a claimed job reads {first:?}"),
    )?;
    let claims = (0..8).map(|i| {
        let store = if i % 2 == 0 { p.a.clone() } else { p.b.clone() };
        tokio::spawn(async move { store.claim_job(now, until).await })
    });
    let mut won = Vec::new();
    for claim in claims {
        let got = claim.await.map_err(|e| e.to_string())?.map_err(store_err)?;
        won.extend(got.map(|j| j.id));
    }
    won.sort();
    let expected = vec![job(prefix, 2, &owner, 0).id, job(prefix, 3, &owner, 0).id];
    ensure(won == expected, || {
        format!("8 concurrent claims of 2 queued jobs took {won:?}")
    })
}

/// A running job is not claimed while its lease lasts; once it runs out
/// the job is claimed again in a new attempt, and the old holder can no
/// longer record progress, finish or fail it. The new attempt's file is
/// what the finished job reads.
pub async fn export_job_an_expired_lease_is_reclaimed_and_the_old_holder_is_fenced(
    p: &ExportJobsPair,
    prefix: &str,
) -> Check {
    let j = job(prefix, 1, &format!("org:{prefix}"), T0);
    p.a.create_job(j.clone()).await.map_err(store_err)?;
    let held =
        p.a.claim_job(Timestamp(T0), Timestamp(T0 + 100))
            .await
            .map_err(store_err)?;
    ensure(held.as_ref().map(|j| j.attempt) == Some(1), || {
        format!("first claim: {held:?}")
    })?;
    let early =
        p.b.claim_job(Timestamp(T0 + 99), Timestamp(T0 + 200))
            .await
            .map_err(store_err)?;
    ensure(early.is_none(), || {
        format!("a job was claimed under a live lease: {early:?}")
    })?;
    let renewed =
        p.a.job_progress(&j.id, 1, 10, 100, Timestamp(T0 + 150))
            .await
            .map_err(store_err)?;
    ensure(renewed, || "the holder could not record progress".into())?;
    let still =
        p.b.claim_job(Timestamp(T0 + 120), Timestamp(T0 + 200))
            .await
            .map_err(store_err)?;
    ensure(still.is_none(), || {
        format!("a renewed lease was claimed: {still:?}")
    })?;
    p.a.put_chunk(&j.id, 1, 0, b"stale".to_vec())
        .await
        .map_err(store_err)?;
    let taken =
        p.b.claim_job(Timestamp(T0 + 150), Timestamp(T0 + 500))
            .await
            .map_err(store_err)?;
    ensure(
        taken.as_ref().map(|j| (j.attempt, j.rows)) == Some((2, 10)),
        || format!("the expired lease was claimed as {taken:?}"),
    )?;
    let progress =
        p.a.job_progress(&j.id, 1, 20, 200, Timestamp(T0 + 900))
            .await
            .map_err(store_err)?;
    let finish =
        p.a.finish_job(&j.id, 1, 20, 200, 1, Timestamp(T0 + 160))
            .await
            .map_err(store_err)?;
    let fail =
        p.a.fail_job(&j.id, 1, "old".into(), Timestamp(T0 + 160))
            .await
            .map_err(store_err)?;
    ensure(!progress && !finish && !fail, || {
        format!(
            "the fenced holder changed the job: progress {progress}, finish {finish}, fail {fail}"
        )
    })?;
    p.b.put_chunk(&j.id, 2, 0, b"fresh".to_vec())
        .await
        .map_err(store_err)?;
    let done =
        p.b.finish_job(&j.id, 2, 7, 5, 1, Timestamp(T0 + 170))
            .await
            .map_err(store_err)?;
    ensure(done, || "the holder could not finish its job".into())?;
    let got =
        p.a.job(&j.id)
            .await
            .map_err(store_err)?
            .ok_or("the job is gone")?;
    ensure(
        got.status == JobStatus::Done
            && (got.attempt, got.rows, got.bytes, got.chunks) == (2, 7, 5, 1)
            && got.finished_at == Some(Timestamp(T0 + 170))
            && got.lease_until.is_none(),
        || format!("the finished job reads {got:?}"),
    )?;
    let file = p.a.chunk(&j.id, got.attempt, 0).await.map_err(store_err)?;
    ensure(file.as_deref() == Some(&b"fresh"[..]), || {
        format!("the file reads {file:?}")
    })?;
    let again =
        p.a.claim_job(Timestamp(T0 + 10_000), Timestamp(T0 + 20_000))
            .await
            .map_err(store_err)?;
    ensure(again.is_none(), || {
        format!("a finished job was claimed: {again:?}")
    })
}

/// Chunks read back whole through the other handle (a megabyte, an empty
/// one), by attempt and number; a chunk written again is replaced.
pub async fn export_job_chunks_round_trip_and_replace(p: &ExportJobsPair, prefix: &str) -> Check {
    let id = format!("job-{prefix}");
    let big: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
    p.a.put_chunk(&id, 1, 0, big.clone())
        .await
        .map_err(store_err)?;
    p.a.put_chunk(&id, 1, 1, b"first".to_vec())
        .await
        .map_err(store_err)?;
    p.a.put_chunk(&id, 1, 2, Vec::new())
        .await
        .map_err(store_err)?;
    p.b.put_chunk(&id, 1, 1, b"second".to_vec())
        .await
        .map_err(store_err)?;
    let read = |attempt, n| {
        let (b, id) = (p.b.clone(), id.clone());
        async move { b.chunk(&id, attempt, n).await.map_err(store_err) }
    };
    ensure(read(1, 0).await?.as_deref() == Some(&big[..]), || {
        "the 1 MB chunk differs".into()
    })?;
    let second = read(1, 1).await?;
    ensure(second.as_deref() == Some(&b"second"[..]), || {
        format!("a replaced chunk reads {second:?}")
    })?;
    let empty = read(1, 2).await?;
    ensure(empty == Some(Vec::new()), || {
        format!("an empty chunk reads {empty:?}")
    })?;
    let (missing, other) = (read(1, 3).await?, read(2, 0).await?);
    ensure(missing.is_none() && other.is_none(), || {
        format!("unwritten chunks read {missing:?} and {other:?}")
    })
}

/// A failed job keeps its error and is never claimed again.
pub async fn export_job_failure_is_recorded_and_final(p: &ExportJobsPair, prefix: &str) -> Check {
    let j = job(prefix, 1, &format!("org:{prefix}"), T0);
    p.a.create_job(j.clone()).await.map_err(store_err)?;
    p.a.claim_job(Timestamp(T0), Timestamp(T0 + 100))
        .await
        .map_err(store_err)?;
    let failed =
        p.a.fail_job(&j.id, 1, "the market is gone".into(), Timestamp(T0 + 5))
            .await
            .map_err(store_err)?;
    ensure(failed, || "the holder could not fail its job".into())?;
    let got =
        p.b.job(&j.id)
            .await
            .map_err(store_err)?
            .ok_or("the job is gone")?;
    ensure(
        got.status == JobStatus::Failed
            && got.error.as_deref() == Some("the market is gone")
            && got.finished_at == Some(Timestamp(T0 + 5)),
        || format!("the failed job reads {got:?}"),
    )?;
    let again =
        p.b.claim_job(Timestamp(T0 + 10_000), Timestamp(T0 + 20_000))
            .await
            .map_err(store_err)?;
    ensure(again.is_none(), || {
        format!("a failed job was claimed: {again:?}")
    })
}

/// Expiry deletes the jobs finished before the cutoff with their chunks,
/// keeps later and unfinished ones, and drops chunks of superseded
/// attempts.
pub async fn export_jobs_expire_with_their_chunks(p: &ExportJobsPair, prefix: &str) -> Check {
    let owner = format!("org:{prefix}");
    let (old, recent, open) = (
        job(prefix, 1, &owner, T0),
        job(prefix, 2, &owner, T0 + 1),
        job(prefix, 3, &owner, T0 + 2),
    );
    for j in [&old, &recent, &open] {
        p.a.create_job(j.clone()).await.map_err(store_err)?;
    }
    // old: attempt 1, done at T0+10.
    p.a.claim_job(Timestamp(T0), Timestamp(T0 + 5))
        .await
        .map_err(store_err)?;
    p.a.put_chunk(&old.id, 1, 0, b"old".to_vec())
        .await
        .map_err(store_err)?;
    p.a.finish_job(&old.id, 1, 1, 3, 1, Timestamp(T0 + 10))
        .await
        .map_err(store_err)?;
    // recent: attempt 1 stalls, attempt 2 finishes at T0+1000.
    p.a.claim_job(Timestamp(T0), Timestamp(T0 + 5))
        .await
        .map_err(store_err)?;
    p.a.put_chunk(&recent.id, 1, 0, b"stale".to_vec())
        .await
        .map_err(store_err)?;
    // open: claimed, running.
    p.a.claim_job(Timestamp(T0), Timestamp(T0 + 50))
        .await
        .map_err(store_err)?;
    let retaken =
        p.b.claim_job(Timestamp(T0 + 20), Timestamp(T0 + 900))
            .await
            .map_err(store_err)?;
    ensure(
        retaken.as_ref().map(|j| (j.id.as_str(), j.attempt)) == Some((recent.id.as_str(), 2)),
        || format!("the stalled job was reclaimed as {retaken:?}"),
    )?;
    p.a.put_chunk(&recent.id, 1, 1, b"zombie".to_vec())
        .await
        .map_err(store_err)?;
    p.b.put_chunk(&recent.id, 2, 0, b"recent".to_vec())
        .await
        .map_err(store_err)?;
    p.b.finish_job(&recent.id, 2, 1, 6, 1, Timestamp(T0 + 1000))
        .await
        .map_err(store_err)?;
    let deleted =
        p.b.expire_jobs(Timestamp(T0 + 500))
            .await
            .map_err(store_err)?;
    ensure(deleted == 1, || {
        format!("expiry deleted {deleted} jobs, not 1")
    })?;
    let listed: Vec<String> =
        p.a.jobs(&owner)
            .await
            .map_err(store_err)?
            .into_iter()
            .map(|j| j.id)
            .collect();
    ensure(listed == vec![open.id.clone(), recent.id.clone()], || {
        format!("after expiry: {listed:?}")
    })?;
    let gone = p.a.chunk(&old.id, 1, 0).await.map_err(store_err)?;
    let stale = p.a.chunk(&recent.id, 1, 1).await.map_err(store_err)?;
    let kept = p.a.chunk(&recent.id, 2, 0).await.map_err(store_err)?;
    ensure(
        gone.is_none() && stale.is_none() && kept.as_deref() == Some(&b"recent"[..]),
        || format!("chunks after expiry: expired {gone:?}, superseded {stale:?}, current {kept:?}"),
    )
}
