//! Pagination cursors are signed and bound to their request: forged ones
//! and ones from another token, route, resolution, range or list are 400s
//! naming `cursor`; API replicas sharing the secret continue each other's
//! cursors, and paging through them is complete.

use crate::helpers::*;
use serde_json::Value;

const DAY: i64 = 1_756_684_800; // 2025-09-01
const MINUTES: i64 = 240;
const SECRET: &str = "cursor-test-secret-0123456789abcdef";
const OTHER_SECRET: &str = "another-cursor-secret-0123456789abcdef";

/// An app signing cursors with [`SECRET`], holding markets `c1` and `c2`
/// with a price a minute for four hours on both tokens, and 30 more markets.
async fn seeded(name: &str) -> TestApp {
    let app = spawn_app_with(
        name,
        Options {
            cursor_secrets: vec![SECRET.into()],
            ..Options::default()
        },
    )
    .await;
    let mut lines = Vec::new();
    for i in 0..32 {
        lines.push(market_line(&format!("c{i}")));
    }
    for m in ["c1", "c2"] {
        for k in 0..MINUTES {
            for token in ["yes", "no"] {
                lines.push(price_line(m, &format!("{m}-{token}"), DAY + k * 60, 0.5));
            }
        }
    }
    let (status, body) = ingest(&app, lines.join("\n")).await;
    assert_eq!(
        (status, &body["rejected_count"]),
        (200, &Value::from(0)),
        "{body}"
    );
    // The batch's last tick is projected last.
    let last = format!(
        "/v1/tokens/c2-no/prices?start_ts={}&end_ts={}&resolution=1m",
        DAY + (MINUTES - 1) * 60,
        DAY + MINUTES * 60
    );
    wait_for(&app, &last, |b| {
        b["data"].as_array().is_some_and(|d| d.len() == 1)
    })
    .await;
    wait_for(&app, "/v1/markets?limit=1000", |b| {
        b["data"].as_array().is_some_and(|d| d.len() == 32)
    })
    .await;
    app
}

fn prices(token: &str, resolution: &str, extra: &str) -> String {
    format!(
        "/v1/tokens/{token}/prices?start_ts={DAY}&end_ts={}&resolution={resolution}{extra}",
        DAY + 86_400
    )
}

async fn call(base: &str, path: &str) -> (u16, Value) {
    let (status, _, body) = get_from(base, Some(API_KEY), path).await;
    (status, body)
}

fn next_cursor(body: &Value) -> String {
    body["metadata"]["next_cursor"]
        .as_str()
        .unwrap_or_else(|| panic!("no next_cursor: {body}"))
        .to_string()
}

/// A refusal of the `cursor` parameter: 400, JSON `detail` naming it.
fn assert_refused(answer: &(u16, Value), what: &str) {
    let detail = answer.1["detail"].as_str().unwrap_or_default();
    assert!(
        answer.0 == 400
            && detail.starts_with("Invalid pagination cursor")
            && detail.contains("`cursor`"),
        "{what}: {} {}",
        answer.0,
        answer.1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_and_edited_cursors_are_refused_naming_the_cursor_parameter() {
    let app = seeded("cursor-forged").await;
    let (_, page) = call(&app.api, &prices("c1-yes", "1m", "&limit=10")).await;
    let cursor = next_cursor(&page);
    let continued = prices("c1-yes", "1m", &format!("&limit=10&cursor={cursor}"));
    assert_eq!(call(&app.api, &continued).await.0, 200);
    // The old format held a timestamp and an unkeyed check value: anyone
    // could make one. The same position, hand-made, in either format:
    let position = format!("{:016x}", (DAY + 600) * 1000);
    for forged in [
        format!("h1{position}00000000"),
        format!("h2{position}{}", "0".repeat(32)),
        // A real cursor with one character of its position changed.
        {
            let mut c = cursor.clone().into_bytes();
            c[12] = if c[12] == b'0' { b'1' } else { b'0' };
            String::from_utf8(c).unwrap()
        },
        // Cut short, and padded.
        cursor[..cursor.len() - 2].to_string(),
        format!("{cursor}00"),
        "not-a-cursor".into(),
    ] {
        let answer = call(
            &app.api,
            &prices("c1-yes", "1m", &format!("&cursor={forged}")),
        )
        .await;
        assert_refused(&answer, &forged);
    }
    // Discovery lists too.
    let (_, list) = call(&app.api, "/v1/markets?limit=5").await;
    let c = next_cursor(&list);
    assert_eq!(
        call(&app.api, &format!("/v1/markets?limit=5&cursor={c}"))
            .await
            .0,
        200
    );
    let edited = c.replacen("l2", "l2ff", 1);
    assert_refused(
        &call(&app.api, &format!("/v1/markets?limit=5&cursor={edited}")).await,
        "an edited list cursor",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_is_refused_on_another_token_route_resolution_range_or_list() {
    let app = seeded("cursor-foreign").await;
    let (_, page) = call(&app.api, &prices("c1-yes", "1m", "&limit=10")).await;
    let c = next_cursor(&page);
    let range = |end: i64| {
        format!("/v1/tokens/c1-yes/prices?start_ts={DAY}&end_ts={end}&resolution=1m&cursor={c}")
    };
    for (what, path) in [
        (
            "another token",
            prices("c1-no", "1m", &format!("&cursor={c}")),
        ),
        (
            "another market's token",
            prices("c2-yes", "1m", &format!("&cursor={c}")),
        ),
        (
            "another route",
            prices("c1-yes", "1m", &format!("&cursor={c}")).replace("/prices", "/books"),
        ),
        (
            "another resolution",
            prices("c1-yes", "5m", &format!("&cursor={c}")),
        ),
        ("another range", range(DAY + 86_400 + 60)),
        (
            "the market route",
            format!(
                "/v1/markets/c1/prices?start_ts={DAY}&end_ts={}&resolution=1m&cursor={c}",
                DAY + 86_400
            ),
        ),
        ("a list", format!("/v1/markets?cursor={c}")),
    ] {
        assert_refused(&call(&app.api, &path).await, what);
    }
    // The same request continues it, whatever its page size.
    let (st, b) = call(
        &app.api,
        &prices("c1-yes", "1m", &format!("&limit=3&cursor={c}")),
    )
    .await;
    assert_eq!(st, 200, "{b}");
    assert_eq!(b["data"][0]["t"], "2025-09-01T00:10:00Z");

    // A market's cursor continues whether the path names it by id or slug.
    let market = |key: &str, extra: &str| {
        format!(
            "/v1/markets/{key}/prices?start_ts={DAY}&end_ts={}&resolution=1m&limit=10{extra}",
            DAY + 86_400
        )
    };
    let (_, b) = call(&app.api, &market("c1-slug", "")).await;
    let mc = next_cursor(&b);
    assert_eq!(
        call(&app.api, &market("c1", &format!("&cursor={mc}")))
            .await
            .0,
        200
    );
    assert_refused(
        &call(&app.api, &market("c2", &format!("&cursor={mc}"))).await,
        "another market",
    );

    // List cursors: bound to their list, sort, order and filters.
    let (_, b) = call(&app.api, "/v1/markets?limit=5&sort=created_at&order=asc").await;
    let lc = next_cursor(&b);
    for (what, path) in [
        (
            "another list",
            format!("/v1/events?limit=5&sort=created_at&order=asc&cursor={lc}"),
        ),
        (
            "another order",
            format!("/v1/markets?limit=5&sort=created_at&order=desc&cursor={lc}"),
        ),
        (
            "another sort",
            format!("/v1/markets?limit=5&sort=updated_at&order=asc&cursor={lc}"),
        ),
        (
            "a filter added",
            format!("/v1/markets?limit=5&sort=created_at&order=asc&search=c1&cursor={lc}"),
        ),
        (
            "a history route",
            prices("c1-yes", "1m", &format!("&cursor={lc}")),
        ),
    ] {
        assert_refused(&call(&app.api, &path).await, what);
    }
}

/// Every point of `token` at 1m, paging `limit` at a time and sending each
/// page to the next of `bases` in turn.
async fn page_through(bases: &[&str], token: &str, limit: usize) -> (Vec<String>, usize) {
    let mut seen = Vec::new();
    let mut cursor = String::new();
    let mut pages = 0;
    loop {
        let base = bases[pages % bases.len()];
        let (st, b) = call(
            base,
            &prices(token, "1m", &format!("&limit={limit}{cursor}")),
        )
        .await;
        assert_eq!(st, 200, "page {pages} from {base}: {b}");
        pages += 1;
        seen.extend(point_times(&b));
        match b["metadata"]["next_cursor"].as_str() {
            Some(c) => cursor = format!("&cursor={c}"),
            None => return (seen, pages),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_sharing_the_secret_continue_each_others_cursors() {
    let app = seeded("cursor-replicas").await;
    let b = spawn_api_replica(&app, &[SECRET]).await;
    // Paging alternately through both replicas is complete and in order.
    let (seen, pages) = page_through(&[&app.api, &b.api], "c2-yes", 7).await;
    assert_eq!(seen.len() as i64, MINUTES, "every point once");
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "chronological, no repeats"
    );
    assert_eq!(pages as i64, (MINUTES + 6) / 7);
    // Market-level pages and lists, alternating too.
    let mut market_points = 0;
    let mut cursor = String::new();
    for i in 0.. {
        let base = [&app.api, &b.api][i % 2];
        let path = format!(
            "/v1/markets/c1/prices?start_ts={DAY}&end_ts={}&resolution=1m&limit=50{cursor}",
            DAY + 86_400
        );
        let (st, body) = call(base, &path).await;
        assert_eq!(st, 200, "{body}");
        market_points += body["metadata"]["count"].as_u64().unwrap();
        match body["metadata"]["next_cursor"].as_str() {
            Some(c) => cursor = format!("&cursor={c}"),
            None => break,
        }
    }
    assert_eq!(
        market_points as i64,
        2 * MINUTES,
        "both tokens, every minute"
    );
    let mut ids = Vec::new();
    let mut cursor = String::new();
    for i in 0.. {
        let base = [&app.api, &b.api][i % 2];
        let (st, body) = call(base, &format!("/v1/markets?limit=6{cursor}")).await;
        assert_eq!(st, 200, "{body}");
        ids.extend(
            body["data"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m["id"].clone()),
        );
        match body["metadata"]["next_cursor"].as_str() {
            Some(c) => cursor = format!("&cursor={c}"),
            None => break,
        }
    }
    assert_eq!(ids.len(), 32);

    // A replica with another secret, or with the data directory's generated
    // one, refuses them; one rotating from this secret to another accepts.
    let (_, page) = call(&app.api, &prices("c2-yes", "1m", "&limit=10")).await;
    let c = next_cursor(&page);
    let continued = prices("c2-yes", "1m", &format!("&limit=10&cursor={c}"));
    let other = spawn_api_replica(&app, &[OTHER_SECRET]).await;
    assert_refused(&call(&other.api, &continued).await, "another secret");
    let generated = spawn_api_replica(&app, &[]).await;
    assert_refused(
        &call(&generated.api, &continued).await,
        "the generated secret",
    );
    let rotating = spawn_api_replica(&app, &[OTHER_SECRET, SECRET]).await;
    let (st, body) = call(&rotating.api, &continued).await;
    assert_eq!(st, 200, "{body}");
    // It signs with the new secret, which the old-only replica refuses.
    let c = next_cursor(&body);
    let again = prices("c2-yes", "1m", &format!("&limit=10&cursor={c}"));
    assert_eq!(call(&other.api, &again).await.0, 200);
    assert_refused(
        &call(&app.api, &again).await,
        "a cursor of the new secret, on the old",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_configured_secret_the_data_directory_keeps_one_for_every_api_on_it() {
    let app = spawn_app("cursor-generated").await;
    let mut lines = vec![market_line("g")];
    for k in 0..30 {
        lines.push(price_line("g", "g-yes", DAY + k * 60, 0.5));
    }
    assert_eq!(ingest(&app, lines.join("\n")).await.0, 200);
    wait_for(&app, &prices("g-yes", "1m", ""), |b| {
        b["data"].as_array().is_some_and(|d| d.len() == 30)
    })
    .await;
    let file = app.data_dir.join("cursor.secret");
    let secret = std::fs::read_to_string(&file).unwrap();
    assert_eq!(secret.trim().len(), 64, "32 random bytes, hex");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "readable by its owner only");
    // Another API on the directory (a restart, or a second process) uses
    // the same secret and continues the first one's cursors.
    let (_, page) = call(&app.api, &prices("g-yes", "1m", "&limit=10")).await;
    let c = next_cursor(&page);
    let second = spawn_api_replica(&app, &[]).await;
    let (st, b) = call(
        &second.api,
        &prices("g-yes", "1m", &format!("&limit=10&cursor={c}")),
    )
    .await;
    assert_eq!(
        (st, b["data"][0]["t"].as_str()),
        (200, Some("2025-09-01T00:10:00Z")),
        "{b}"
    );
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        secret,
        "kept, not replaced"
    );
}
