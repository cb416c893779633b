//! The explorer's charts, drawn on the server as inline SVG (no script,
//! nothing fetched): a line chart of a series, and an order book's depth.
//!
//! Each chart is an image with a name (`role="img"`, `aria-label` and a
//! `<title>`) that says what a sighted reader sees: how many points, over
//! which span, the range of values. Every point or level carries its own
//! `<title>` (a tooltip, and the exact value for a screen reader that
//! walks the drawing).

use super::html::esc;
use hindsight_schemas::Timestamp;
use std::fmt::Write;

const W: f64 = 640.0;
const H: f64 = 220.0;
const LEFT: f64 = 48.0;
const RIGHT: f64 = 8.0;
const TOP: f64 = 10.0;
const BOTTOM: f64 = 22.0;

/// `2025-09-01 12:00`.
fn short(t: Timestamp) -> String {
    chrono::DateTime::from_timestamp_millis(t.0)
        .map_or_else(|| "-".into(), |d| d.format("%Y-%m-%d %H:%M").to_string())
}

/// A number, short: `0.5`, `1234.57`.
pub fn num(v: f64) -> String {
    let s = format!("{v:.4}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s.is_empty() || s == "-" {
        "0".into()
    } else {
        s.to_string()
    }
}

/// Maps `[lo, hi]` onto `[a, b]` (a flat domain onto its middle).
fn scale(v: f64, (lo, hi): (f64, f64), (a, b): (f64, f64)) -> f64 {
    if hi > lo {
        a + (v - lo) / (hi - lo) * (b - a)
    } else {
        (a + b) / 2.0
    }
}

fn open(id: &str, label: &str, points: usize) -> String {
    format!(
        r#"<svg class="chart explore" id="{id}" viewBox="0 0 {W} {H}" role="img" aria-label="{label}" data-points="{points}"><title>{label}</title>"#,
        id = esc(id),
        label = esc(label),
    )
}

/// A line chart of `points` (time, value), over the time span `x` and the
/// values `y` (`None`: from 0, or the lowest value if negative, to the
/// highest). One `circle.pt` per point.
pub fn line(
    id: &str,
    what: &str,
    points: &[(Timestamp, f64)],
    x: (Timestamp, Timestamp),
    y: Option<(f64, f64)>,
) -> String {
    let (lo, hi) = y.unwrap_or_else(|| {
        let max = points.iter().map(|p| p.1).fold(0.0, f64::max);
        let min = points.iter().map(|p| p.1).fold(0.0, f64::min);
        (min, if max > min { max } else { min + 1.0 })
    });
    let label = match (points.first(), points.last()) {
        (Some(first), Some(last)) => {
            let min = points.iter().map(|p| p.1).fold(f64::INFINITY, f64::min);
            let max = points.iter().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
            format!(
                "{what}: {} points from {} to {} UTC; lowest {}, highest {}, last {}",
                points.len(),
                short(first.0),
                short(last.0),
                num(min),
                num(max),
                num(last.1)
            )
        }
        _ => format!(
            "{what}: no points from {} to {} UTC",
            short(x.0),
            short(x.1)
        ),
    };
    let xs = (x.0 .0 as f64, x.1 .0 as f64);
    let px = |t: Timestamp| scale(t.0 as f64, xs, (LEFT, W - RIGHT));
    let py = |v: f64| scale(v, (lo, hi), (H - BOTTOM, TOP));
    let mut svg = open(id, &label, points.len());
    axes(&mut svg, (num(lo), num(hi)), (short(x.0), short(x.1)));
    if points.is_empty() {
        let _ = write!(
            svg,
            r#"<text class="empty" x="{}" y="{}" text-anchor="middle">No data in this range</text>"#,
            W / 2.0,
            H / 2.0
        );
    } else {
        let path: Vec<String> = points
            .iter()
            .map(|(t, v)| format!("{:.1},{:.1}", px(*t), py(*v)))
            .collect();
        let _ = write!(
            svg,
            r#"<polyline class="line" points="{}"/>"#,
            path.join(" ")
        );
        for (t, v) in points {
            let _ = write!(
                svg,
                r#"<circle class="pt" cx="{:.1}" cy="{:.1}" r="2.5"><title>{} UTC: {}</title></circle>"#,
                px(*t),
                py(*v),
                short(*t),
                num(*v)
            );
        }
    }
    svg.push_str("</svg>");
    svg
}

fn axes(svg: &mut String, (lo, hi): (String, String), (from, to): (String, String)) {
    let _ = write!(
        svg,
        r#"<line class="axis" x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{b}"/><line class="axis" x1="{LEFT}" y1="{b}" x2="{r}" y2="{b}"/>
<text x="{tx}" y="{ty_hi}" text-anchor="end">{hi}</text><text x="{tx}" y="{b}" text-anchor="end">{lo}</text>
<text x="{LEFT}" y="{tb}">{from}</text><text x="{r}" y="{tb}" text-anchor="end">{to}</text>"#,
        b = H - BOTTOM,
        r = W - RIGHT,
        tx = LEFT - 4.0,
        ty_hi = TOP + 8.0,
        tb = H - 6.0,
        hi = esc(&hi),
        lo = esc(&lo),
        from = esc(&from),
        to = esc(&to),
    );
}

/// Levels of one side, `[price, size]` best first, with their running
/// total: the depth at each price.
fn cumulative(levels: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let mut total = 0.0;
    levels
        .iter()
        .map(|(p, s)| {
            total += s;
            (*p, total)
        })
        .collect()
}

/// The depth chart of a book: bids and asks (`[price, size]`, best
/// first) as the size available at each price or better, bids left of
/// the spread and asks right of it. One `circle.lvl` per level.
pub fn depth(id: &str, what: &str, bids: &[(f64, f64)], asks: &[(f64, f64)]) -> String {
    let bid = cumulative(bids);
    let ask = cumulative(asks);
    let prices = bid.iter().chain(&ask).map(|l| l.0);
    let (lo, hi) = prices.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), p| {
        (lo.min(p), hi.max(p))
    });
    let (lo, hi) = if lo.is_finite() { (lo, hi) } else { (0.0, 1.0) };
    let top = bid.iter().chain(&ask).map(|l| l.1).fold(0.0, f64::max);
    let top = if top > 0.0 { top } else { 1.0 };
    let best = |side: &[(f64, f64)]| side.first().map_or_else(|| "none".into(), |l| num(l.0));
    let label = format!(
        "{what}: {} bid levels (best {}, {} in total), {} ask levels (best {}, {} in total)",
        bids.len(),
        best(bids),
        num(bid.last().map_or(0.0, |l| l.1)),
        asks.len(),
        best(asks),
        num(ask.last().map_or(0.0, |l| l.1)),
    );
    let px = |p: f64| scale(p, (lo, hi), (LEFT, W - RIGHT));
    let py = |v: f64| scale(v, (0.0, top), (H - BOTTOM, TOP));
    let mut svg = open(id, &label, bids.len() + asks.len());
    axes(&mut svg, ("0".into(), num(top)), (num(lo), num(hi)));
    for (class, side) in [("bid", &bid), ("ask", &ask)] {
        if side.is_empty() {
            continue;
        }
        // A step area: from the best price outwards, the depth holds
        // until the next level's price.
        let base = H - BOTTOM;
        let mut outline = format!("{:.1},{base:.1}", px(side[0].0));
        let mut depth = 0.0;
        for (p, total) in side.iter() {
            let _ = write!(outline, " {:.1},{:.1}", px(*p), py(depth));
            let _ = write!(outline, " {:.1},{:.1}", px(*p), py(*total));
            depth = *total;
        }
        let last = side[side.len() - 1].0;
        let _ = write!(outline, " {:.1},{base:.1}", px(last));
        let _ = write!(svg, r#"<polygon class="{class}" points="{outline}"/>"#);
        for (p, total) in side.iter() {
            let _ = write!(
                svg,
                r#"<circle class="lvl {class}" cx="{:.1}" cy="{:.1}" r="2.5"><title>{class} {}: {} at this price or better</title></circle>"#,
                px(*p),
                py(*total),
                num(*p),
                num(*total)
            );
        }
    }
    if bids.is_empty() && asks.is_empty() {
        let _ = write!(
            svg,
            r#"<text class="empty" x="{}" y="{}" text-anchor="middle">An empty book</text>"#,
            W / 2.0,
            H / 2.0
        );
    }
    svg.push_str("</svg>");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_chart_draws_one_point_per_value_and_names_them() {
        let pts = [(Timestamp(0), 0.25), (Timestamp(60_000), 0.75)];
        let svg = line(
            "c",
            "Price of Yes",
            &pts,
            (Timestamp(0), Timestamp(120_000)),
            Some((0.0, 1.0)),
        );
        assert_eq!(svg.matches("<circle class=\"pt\"").count(), 2);
        assert!(svg.contains(r#"data-points="2""#));
        assert!(svg.contains("Price of Yes: 2 points from 1970-01-01 00:00 to 1970-01-01 00:01 UTC; lowest 0.25, highest 0.75, last 0.75"));
        let empty = line("c", "Price", &[], (Timestamp(0), Timestamp(1)), None);
        assert!(empty.contains("No data in this range") && empty.contains(r#"data-points="0""#));
    }

    #[test]
    fn depth_accumulates_each_side_from_its_best_level() {
        assert_eq!(
            cumulative(&[(0.5, 10.0), (0.4, 5.0)]),
            vec![(0.5, 10.0), (0.4, 15.0)]
        );
        let svg = depth("d", "Book", &[(0.5, 10.0), (0.4, 5.0)], &[(0.6, 3.0)]);
        assert_eq!(svg.matches("<circle class=\"lvl bid\"").count(), 2);
        assert_eq!(svg.matches("<circle class=\"lvl ask\"").count(), 1);
        assert!(svg
            .contains("2 bid levels (best 0.5, 15 in total), 1 ask levels (best 0.6, 3 in total)"));
    }
}
