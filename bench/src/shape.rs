//! Data shapes the benchmarks feed: NDJSON lines in the ingest wire format,
//! the catalog first, then price ticks in time order.

use hindsight_schemas::{wire, Event, Timestamp};

/// 2025-09-01T00:00:00Z in Unix seconds: the day every shape covers.
pub const DAY: i64 = 1_756_684_800;

pub struct Shape {
    pub name: String,
    pub lines: Vec<String>,
}

impl Shape {
    /// NDJSON bodies of at most `per` lines.
    pub fn bodies(&self, per: usize) -> Vec<String> {
        self.lines
            .chunks(per)
            .map(|c| c.join("\n") + "\n")
            .collect()
    }

    /// The lines parsed as ingest parses them.
    pub fn events(&self) -> Vec<Event> {
        let now = Timestamp::now();
        self.lines
            .iter()
            .map(|l| wire::parse_line(l, now).expect("bench lines are valid"))
            .collect()
    }

    /// Writes the lines as one NDJSON file.
    pub fn write(&self, path: &std::path::Path) -> std::io::Result<()> {
        use std::io::Write;
        let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
        for line in &self.lines {
            out.write_all(line.as_bytes())?;
            out.write_all(b"\n")?;
        }
        out.flush()
    }
}

fn market_line(m: &str) -> String {
    format!(
        r#"{{"kind":"market","id":"{m}","slug":"{m}-slug","question":"Will {m} happen?","status":"open","tokens":[{{"id":"{m}-yes","label":"Yes"}},{{"id":"{m}-no","label":"No"}}],"updated_at":"2025-08-15T00:00:00Z"}}"#
    )
}

fn tick_line(m: &str, side: &str, ts: i64, p: f64) -> String {
    format!(r#"{{"kind":"price","market_id":"{m}","token_id":"{m}-{side}","ts":{ts},"p":{p}}}"#)
}

/// `12345678` as `12 345 678`, as the figures are printed.
pub fn spaced(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(' ');
        }
        out.push(c);
    }
    out
}

/// `markets` markets (two tokens each) over one day; token activity follows
/// a Zipf-like law (weight 1/rank), so a few tokens trade every few seconds
/// and most a handful of times a day: nearly every tick opens new buckets.
pub fn long_tail(prefix: &str, markets: usize, ticks: usize) -> Shape {
    let tokens = markets * 2;
    // Inverse CDF of weights 1/(rank+1), sampled by a fixed LCG.
    let cdf: Vec<f64> = (0..tokens)
        .scan(0.0, |acc, r| {
            *acc += 1.0 / (r as f64 + 1.0);
            Some(*acc)
        })
        .collect();
    let total = *cdf.last().unwrap();
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut lines: Vec<String> = (0..markets)
        .map(|m| market_line(&format!("{prefix}{m}")))
        .collect();
    for n in 0..ticks {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let u = (state >> 11) as f64 / (1u64 << 53) as f64 * total;
        let token = cdf.partition_point(|&c| c < u).min(tokens - 1);
        let ts = DAY + (n as i64 * 86_400) / ticks as i64;
        let p = ((n * 7919) % 1000) as f64 / 1000.0;
        let side = if token % 2 == 0 { "yes" } else { "no" };
        lines.push(tick_line(&format!("{prefix}{}", token / 2), side, ts, p));
    }
    Shape {
        name: format!("long tail: {} tokens, 1 day, Zipf activity", spaced(tokens)),
        lines,
    }
}

/// `markets` markets (two tokens each), each token a tick every `every`
/// seconds for `hours` hours: nearly every tick lands in a bucket row that
/// is already open.
pub fn dense(prefix: &str, markets: usize, every: i64, hours: i64) -> Shape {
    let mut lines: Vec<String> = (0..markets)
        .map(|m| market_line(&format!("{prefix}{m}")))
        .collect();
    for s in (0..hours * 3600).step_by(every as usize) {
        for m in 0..markets {
            for side in ["yes", "no"] {
                let p = (((s as usize) * 31 + m * 7) % 1000) as f64 / 1000.0;
                lines.push(tick_line(&format!("{prefix}{m}"), side, DAY + s, p));
            }
        }
    }
    Shape {
        name: format!(
            "dense: {} tokens, {hours} h, a tick every {every} s each",
            markets * 2
        ),
        lines,
    }
}
