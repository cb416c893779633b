//! The usage page: the organization's plan limits (what `/v1/usage` says)
//! and requests per day over the last 30 days by status class, per key and
//! in total, as an inline SVG chart (no script needed).

use super::html::{self, esc};
use super::{require, DashError};
use crate::ApiState;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use hindsight_contracts::accounts::{hour_of, HOUR_MS};
use hindsight_contracts::{KeyUsage, StatusClass};
use hindsight_schemas::Timestamp;
use std::fmt::Write;

/// Days on the chart, today included.
pub const DAYS: usize = 30;
const DAY_MS: i64 = 24 * HOUR_MS;
const CLASSES: [StatusClass; 3] = [StatusClass::Ok, StatusClass::Error, StatusClass::Limited];

/// Requests per day (oldest first) and class, over [`DAYS`] days ending
/// with `now`'s day.
pub fn per_day(usage: &[KeyUsage], now: Timestamp) -> Vec<[u64; 3]> {
    let first = Timestamp(now.0.div_euclid(DAY_MS) * DAY_MS - (DAYS as i64 - 1) * DAY_MS);
    let mut days = vec![[0u64; 3]; DAYS];
    for count in usage.iter().flat_map(|u| &u.counts) {
        let day = (count.hour.0 - first.0).div_euclid(DAY_MS);
        if (0..DAYS as i64).contains(&day) {
            let class = CLASSES.iter().position(|c| *c == count.class).unwrap_or(1);
            days[day as usize][class] += count.count;
        }
    }
    days
}

/// A stacked bar chart of `days`, with a text alternative.
pub fn chart(id: &str, title: &str, days: &[[u64; 3]]) -> String {
    let (w, h, pad) = (600.0, 160.0, 20.0);
    let max = days
        .iter()
        .map(|d| d.iter().sum::<u64>())
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let bar = (w - pad) / days.len().max(1) as f64;
    let total: u64 = days.iter().flatten().sum();
    let mut svg = format!(
        r#"<svg class="chart" id="{}" viewBox="0 0 {w} {}" role="img" aria-label="{}: {total} requests in {} days" data-total="{total}">"#,
        esc(id),
        h + pad,
        esc(title),
        days.len()
    );
    for (i, day) in days.iter().enumerate() {
        let mut y = h;
        for (class, n) in CLASSES.iter().zip(day) {
            if *n == 0 {
                continue;
            }
            let height = (*n as f64 / max * (h - pad)).max(1.0);
            y -= height;
            let _ = write!(
                svg,
                r#"<rect class="s{}" x="{:.1}" y="{y:.1}" width="{:.1}" height="{height:.1}"><title>{} {}</title></rect>"#,
                class.as_str(),
                pad + i as f64 * bar,
                (bar - 2.0).max(1.0),
                n,
                class.as_str()
            );
        }
    }
    let _ = write!(
        svg,
        r#"<text x="0" y="12">{}</text><text x="{pad}" y="{}">{} days ago</text><text x="{}" y="{}" text-anchor="end">today</text></svg>"#,
        max as u64,
        h + 14.0,
        days.len() - 1,
        w,
        h + 14.0
    );
    svg
}

pub async fn page(
    State(state): State<ApiState>,
    headers: HeaderMap,
) -> Result<Response, DashError> {
    let me = match require(&state, &headers).await? {
        Ok(me) => me,
        Err(redirect) => return Ok(redirect),
    };
    let now = state.clock.now();
    let since = Timestamp(hour_of(now).0.div_euclid(DAY_MS) * DAY_MS - (DAYS as i64 - 1) * DAY_MS);
    // This process's latest requests, counted but not yet written.
    state.usage.flush().await?;
    let mut per_key = Vec::new();
    for (key, _) in super::key_rows(&state, &me.org.name).await? {
        let usage = state.accounts.key_usage(&key.key_id, since).await?;
        per_key.push((key, usage));
    }
    let all: Vec<KeyUsage> = per_key.iter().map(|(_, u)| u.clone()).collect();
    let mut body = String::from(r#"<section class="card"><h1>Usage</h1>"#);
    match state.plans.get(&me.org.plan) {
        Some(plan) => {
            let _ = write!(
                body,
                r#"<p>Plan <strong>{}</strong>: {} requests per minute per key, resolutions down to <code>{}</code>, {} days of history; metrics {}, prices {}, order books {}.</p>"#,
                esc(&plan.name),
                plan.requests_per_minute
                    .map_or_else(|| "unlimited".to_string(), |r| r.to_string()),
                plan.finest.as_str(),
                plan.max_history_days,
                yes(plan.metrics),
                yes(plan.prices),
                yes(plan.books),
            );
        }
        None => {
            let _ = write!(body, "<p>Plan <strong>{}</strong>.</p>", esc(&me.org.plan));
        }
    }
    body.push_str(
        r#"<p class="legend"><span class="muted">Requests per day, last 30 days:</span> <span class="l2xx">■ 2xx</span> <span class="l4xx">■ 4xx</span> <span class="l429">■ 429</span></p>"#,
    );
    body.push_str(&chart("usage-total", "All keys", &per_day(&all, now)));
    body.push_str("</section>");
    for (key, usage) in &per_key {
        let _ = write!(
            body,
            r#"<section class="card"><h2>{} <code>{}…</code></h2>{}</section>"#,
            esc(&key.name),
            esc(&key.prefix),
            chart(
                &format!("usage-{}", key.key_id),
                &key.name,
                &per_day(std::slice::from_ref(usage), now)
            )
        );
    }
    Ok(super::html_page(html::page(
        "Usage",
        Some(&me.nav()),
        &body,
    )))
}

fn yes(allowed: bool) -> &'static str {
    if allowed {
        "included"
    } else {
        "not included"
    }
}
