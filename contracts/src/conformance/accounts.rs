//! Account checks: [`crate::AccountStore`], run with the store checks (the
//! same two handles on one backend, ids under the check's prefix).

use super::{ensure, store_err, Backend, Check, T0};
use crate::accounts::*;
use hindsight_schemas::Timestamp;

fn hash_of(prefix: &str, seed: u8) -> [u8; 32] {
    let mut hash = [seed; 32];
    for (i, byte) in prefix.bytes().enumerate() {
        hash[i % 32] ^= byte.wrapping_mul(31).wrapping_add(i as u8);
    }
    hash
}

/// Organizations, users and an organization's keys read back through the
/// other handle as written; a second write of a user replaces it (a
/// password set later); lists hold the organization's own, oldest first.
pub async fn accounts_round_trip_and_replace(
    a: &dyn Backend,
    b: &dyn Backend,
    prefix: &str,
) -> Check {
    let org = Organization {
        name: format!("org-{prefix}"),
        plan: "pro".into(),
        created_at: Timestamp(T0),
    };
    a.put_organization(org.clone()).await.map_err(store_err)?;
    let got = b.organization(&org.name).await.map_err(store_err)?;
    ensure(got.as_ref() == Some(&org), || {
        format!("organization reads {got:?}")
    })?;
    let missing = b
        .organization(&format!("none-{prefix}"))
        .await
        .map_err(store_err)?;
    ensure(missing.is_none(), || {
        format!("an unknown organization reads {missing:?}")
    })?;

    let owner = User {
        email: format!("owner-{prefix}@example.com"),
        organization: org.name.clone(),
        role: "owner".into(),
        password_hash: None,
        created_at: Timestamp(T0),
    };
    let member = User {
        email: format!("member-{prefix}@example.com"),
        role: "member".into(),
        created_at: Timestamp(T0 + 5),
        ..owner.clone()
    };
    a.put_user(member.clone()).await.map_err(store_err)?;
    a.put_user(owner.clone()).await.map_err(store_err)?;
    let with_password = User {
        password_hash: Some("$argon2id$v=19$m=19456,t=2,p=1$c2FsdA$aGFzaA".into()),
        ..owner.clone()
    };
    b.put_user(with_password.clone()).await.map_err(store_err)?;
    let got = a.user(&owner.email).await.map_err(store_err)?;
    ensure(got.as_ref() == Some(&with_password), || {
        format!("a replaced user reads {got:?}")
    })?;
    let users = b.users(&org.name).await.map_err(store_err)?;
    ensure(users == vec![with_password, member], || {
        format!("users of the organization: {users:?}")
    })?;

    let key = |n: u8, at: i64| OrgKey {
        organization: org.name.clone(),
        key_id: format!("key_{prefix}_{n}"),
        name: format!("key <{n}> & \"quoted\""),
        prefix: format!("hsk_{n:08}"),
        hash: hash_of(prefix, n),
        created_at: Timestamp(at),
    };
    a.put_org_key(key(2, T0 + 10)).await.map_err(store_err)?;
    a.put_org_key(key(1, T0)).await.map_err(store_err)?;
    let keys = b.org_keys(&org.name).await.map_err(store_err)?;
    ensure(keys == vec![key(1, T0), key(2, T0 + 10)], || {
        format!("keys of the organization: {keys:?}")
    })?;
    let others = b
        .org_keys(&format!("none-{prefix}"))
        .await
        .map_err(store_err)?;
    ensure(others.is_empty(), || {
        format!("another organization lists {others:?}")
    })
}

/// A sign-in token is taken once: of many concurrent takes through two
/// handles exactly one gets it, and it is gone after.
pub async fn sign_in_tokens_are_taken_exactly_once(
    a: &dyn Backend,
    b: &dyn Backend,
    prefix: &str,
) -> Check {
    // Expiring a day from now: a backend may forget an expired token (the
    // CQL store writes it with a TTL until its expiry, at least a second),
    // and a fixed date long past left the takes a second to find it.
    let token = SignInToken {
        hash: hash_of(prefix, 0x33),
        email: format!("u-{prefix}@example.com"),
        expires_at: Timestamp(Timestamp::now().0 + 86_400_000),
    };
    a.put_sign_in_token(token.clone())
        .await
        .map_err(store_err)?;
    let takes = (0..8).map(|i| {
        let client = if i % 2 == 0 { a } else { b };
        client.take_sign_in_token(token.hash)
    });
    let mut taken = Vec::new();
    for result in super::store::join_all(takes.collect()).await {
        if let Some(t) = result.map_err(store_err)? {
            taken.push(t);
        }
    }
    ensure(taken == vec![token.clone()], || {
        format!("8 concurrent takes of one token got {taken:?}")
    })?;
    let again = a.take_sign_in_token(token.hash).await.map_err(store_err)?;
    ensure(again.is_none(), || {
        format!("a taken token is taken again: {again:?}")
    })
}

/// A session reads back through the other handle until deleted.
pub async fn sessions_live_until_deleted(a: &dyn Backend, b: &dyn Backend, prefix: &str) -> Check {
    let now = Timestamp::now();
    let session = Session {
        hash: hash_of(prefix, 0x44),
        email: format!("u-{prefix}@example.com"),
        created_at: now,
        expires_at: Timestamp(now.0 + 3_600_000),
    };
    a.put_session(session.clone()).await.map_err(store_err)?;
    let got = b.session(session.hash).await.map_err(store_err)?;
    ensure(got.as_ref() == Some(&session), || {
        format!("session reads {got:?}")
    })?;
    let other = b.session(hash_of(prefix, 0x45)).await.map_err(store_err)?;
    ensure(other.is_none(), || format!("another hash finds {other:?}"))?;
    b.delete_session(session.hash).await.map_err(store_err)?;
    let got = a.session(session.hash).await.map_err(store_err)?;
    ensure(got.is_none(), || format!("a deleted session reads {got:?}"))
}

/// Usage counts add up per hour and status class whatever the handle and
/// concurrency; `last_used` is the latest use; `since` cuts earlier hours.
pub async fn usage_counts_add_up_across_handles(
    a: &dyn Backend,
    b: &dyn Backend,
    prefix: &str,
) -> Check {
    let key = format!("key_use_{prefix}");
    let h0 = hour_of(Timestamp(T0));
    let at = |hour: i64, ms: i64| Timestamp(h0.0 + hour * HOUR_MS + ms);
    let one = |t: Timestamp, status: u16| KeyUse {
        key_id: key.clone(),
        hour: hour_of(t),
        class: StatusClass::of(status),
        count: 1,
        last_at: t,
    };
    // The latest use first: last_used must not go back.
    let mut calls = vec![vec![one(at(3, 5), 500)]];
    // Hour 0: ten single requests, and a tally of ten more.
    calls.extend((0..10).map(|i| vec![one(at(0, i), 200)]));
    calls.push(vec![KeyUse {
        count: 10,
        last_at: at(0, 19),
        ..one(at(0, 10), 200)
    }]);
    calls.extend((0..6).map(|i| vec![one(at(1, i), 429)]));
    // Tallies of two hours and classes in one call.
    calls.push(vec![one(at(1, 7), 404), one(at(2, 9), 304)]);
    let records = calls.into_iter().enumerate().map(|(i, uses)| {
        let client = if i % 2 == 0 { a } else { b };
        client.record_uses(uses)
    });
    for result in super::store::join_all(records.collect()).await {
        result.map_err(store_err)?;
    }
    let usage = a.key_usage(&key, at(1, 0)).await.map_err(store_err)?;
    let count = |hour, class, count| UsageCount {
        hour: at(hour, 0),
        class,
        count,
    };
    let want = vec![
        count(1, StatusClass::Limited, 6),
        count(1, StatusClass::Error, 1),
        count(2, StatusClass::Ok, 1),
        count(3, StatusClass::Error, 1),
    ];
    let mut got = usage.counts.clone();
    got.sort_by_key(|c| (c.hour, c.class));
    let mut want_sorted = want.clone();
    want_sorted.sort_by_key(|c| (c.hour, c.class));
    ensure(got == want_sorted, || {
        format!("counts since hour 1: {:?}, want {want:?}", usage.counts)
    })?;
    ensure(usage.counts == got, || {
        format!(
            "counts are not ascending by hour and class: {:?}",
            usage.counts
        )
    })?;
    ensure(usage.last_used == Some(at(3, 5)), || {
        format!("last_used is {:?}, want {:?}", usage.last_used, at(3, 5))
    })?;
    let all = b.key_usage(&key, h0).await.map_err(store_err)?;
    let first: u64 = all
        .counts
        .iter()
        .filter(|c| c.hour == h0)
        .map(|c| c.count)
        .sum();
    ensure(first == 20, || format!("hour 0 counts {first}, want 20"))?;
    let none = b
        .key_usage(&format!("{key}_unused"), h0)
        .await
        .map_err(store_err)?;
    ensure(none == KeyUsage::default(), || {
        format!("an unused key has usage {none:?}")
    })
}
