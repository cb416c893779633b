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
    ///
    /// On disk before it returns: otherwise the kernel writes its hundreds
    /// of MB back during whichever run comes first, and that run pays for
    /// it.
    pub fn write(&self, path: &std::path::Path) -> std::io::Result<()> {
        use std::io::Write;
        let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
        for line in &self.lines {
            out.write_all(line.as_bytes())?;
            out.write_all(b"\n")?;
        }
        out.into_inner()?.sync_all()
    }
}

/// The catalog line of market `m` with its two tokens `{m}-yes`, `{m}-no`.
pub fn market_line(m: &str) -> String {
    format!(
        r#"{{"kind":"market","id":"{m}","slug":"{m}-slug","question":"Will {m} happen?","status":"open","tokens":[{{"id":"{m}-yes","label":"Yes"}},{{"id":"{m}-no","label":"No"}}],"updated_at":"2025-08-15T00:00:00Z"}}"#
    )
}

fn tick_line(prefix: &str, market: usize, side: &str, ts: i64, p: usize) -> String {
    let mut line = String::new();
    write_tick(&mut line, prefix, market, side, ts, p);
    line
}

/// The price tick of market `{prefix}{market}`'s token `side` at `ts`
/// (seconds) at `p` thousandths:
/// `{"kind":"price","market_id":"…","token_id":"…-side","ts":…,"p":…}`.
///
/// Written piece by piece, the price from a table: the live benchmark's
/// clients generate their bodies as they send, in the process measured,
/// and with `write!` (a float formatted per line, an id allocated per
/// line) they took ~8 % of its CPU samples (`perf`, 500 000 events/s).
/// Still 7.9 % a later session, which found each line's market number
/// written out twice, its second once per line, and the token's rank
/// searched over the whole CDF: with the number written once, the second
/// once per second ([`write_tick_at`]) and the rank found through a
/// guide table ([`ZipfTokens`]), a 10 000-line body takes 75–100 ns a line
/// against 155–240 (timed in a release build over 3 M lines, 20 000 and
/// 100 000 tokens).
fn write_tick(out: &mut String, prefix: &str, market: usize, side: &str, ts: i64, p: usize) {
    let mut ts_digits = [0u8; 20];
    write_tick_at(out, prefix, market, side, decimal(ts, &mut ts_digits), p);
}

/// [`write_tick`] with `ts` already in decimal: a feed's ticks share their
/// second with the ticks around them, and it is written once per second.
fn write_tick_at(out: &mut String, prefix: &str, market: usize, side: &str, ts: &str, p: usize) {
    let mut market_digits = [0u8; 20];
    let market = decimal(market as i64, &mut market_digits);
    out.push_str(r#"{"kind":"price","market_id":""#);
    out.push_str(prefix);
    out.push_str(market);
    out.push_str(r#"","token_id":""#);
    out.push_str(prefix);
    out.push_str(market);
    out.push('-');
    out.push_str(side);
    out.push_str(r#"","ts":"#);
    out.push_str(ts);
    out.push_str(r#","p":"#);
    out.push_str(&price_text()[p]);
    out.push('}');
}

/// `n` in decimal, written into `digits`.
fn decimal(n: i64, digits: &mut [u8; 20]) -> &str {
    let mut at = digits.len();
    let mut rest = n.unsigned_abs();
    loop {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    if n < 0 {
        at -= 1;
        digits[at] = b'-';
    }
    std::str::from_utf8(&digits[at..]).expect("ASCII digits")
}

/// `k / 1000` as a float prints, for `k` in 0..1000: the shapes' prices.
fn price_text() -> &'static [String] {
    static TEXT: std::sync::LazyLock<Vec<String>> =
        std::sync::LazyLock::new(|| (0..1000).map(|k| (k as f64 / 1000.0).to_string()).collect());
    &TEXT
}

/// Token number `token` of markets `{prefix}{number}`: even tokens are a
/// market's `yes`, odd ones its `no`; returns (market number, side).
fn market_side(token: usize) -> (usize, &'static str) {
    let side = if token.is_multiple_of(2) { "yes" } else { "no" };
    (token / 2, side)
}

/// The id of token number `token`, as [`long_tail`] and [`LiveFeed`] name it.
pub fn token_id(prefix: &str, token: usize) -> String {
    let (market, side) = market_side(token);
    format!("{prefix}{market}-{side}")
}

/// The price of the `n`th tick of a shape, in thousandths: spread over
/// [0, 1) without a random source, so runs are repeatable.
fn price(n: usize) -> usize {
    (n * 7919) % 1000
}

/// The long-tail activity law: token ranks drawn with weight 1/(rank+1)
/// (Zipf-like), so a few tokens trade every few seconds and most a handful
/// of times a day. Drawn by a fixed LCG through the inverse CDF, so a seed
/// gives the same sequence on every run; the CDF is shared, not copied,
/// between the generators of one run.
#[derive(Clone)]
pub struct ZipfTokens {
    cdf: std::sync::Arc<[f64]>,
    /// `guide[j]`: the first rank whose CDF reaches `j / GUIDE` of the
    /// total, so a draw searches only the ranks between two neighbouring
    /// entries: the same rank as a search of the whole CDF, without its
    /// ~15 unpredictable steps (a third of the live benchmark's own
    /// clients' CPU, `perf`).
    guide: std::sync::Arc<[u32]>,
    state: u64,
}

/// Entries of [`ZipfTokens`]'s guide table.
const GUIDE: usize = 4096;

impl ZipfTokens {
    /// The seed [`long_tail`] files are drawn with.
    pub const SEED: u64 = 0x9e37_79b9_7f4a_7c15;

    pub fn new(tokens: usize, seed: u64) -> ZipfTokens {
        let cdf: std::sync::Arc<[f64]> = (0..tokens)
            .scan(0.0, |acc, r| {
                *acc += 1.0 / (r as f64 + 1.0);
                Some(*acc)
            })
            .collect();
        let total = cdf.last().copied().unwrap_or(0.0);
        let guide = (0..=GUIDE)
            .map(|j| cdf.partition_point(|&c| c < total * j as f64 / GUIDE as f64) as u32)
            .collect();
        ZipfTokens {
            cdf,
            guide,
            state: seed,
        }
    }

    /// The same law drawn from another seed (another client's feed).
    pub fn reseeded(&self, seed: u64) -> ZipfTokens {
        ZipfTokens {
            cdf: self.cdf.clone(),
            guide: self.guide.clone(),
            state: seed,
        }
    }

    /// The next token number, in `0..tokens`.
    pub fn draw(&mut self) -> usize {
        self.state = self
            .state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let fraction = (self.state >> 11) as f64 / (1u64 << 53) as f64;
        let u = fraction * self.cdf[self.cdf.len() - 1];
        // The rank is at or past `guide[j]` and at most `guide[j + 1]` for
        // the `j` of `u`; one entry either side covers the rounding of `j`.
        let j = (fraction * GUIDE as f64) as usize;
        let lo = self.guide[j.saturating_sub(1)] as usize;
        let hi = self.guide[(j + 2).min(GUIDE)] as usize;
        let rank = lo + self.cdf[lo..hi].partition_point(|&c| c < u);
        rank.min(self.cdf.len() - 1)
    }
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

/// `markets` markets (two tokens each) over one day; token activity
/// follows [`ZipfTokens`], so nearly every tick opens new buckets.
pub fn long_tail(prefix: &str, markets: usize, ticks: usize) -> Shape {
    let mut tokens = ZipfTokens::new(markets * 2, ZipfTokens::SEED);
    let mut lines: Vec<String> = (0..markets)
        .map(|m| market_line(&format!("{prefix}{m}")))
        .collect();
    for n in 0..ticks {
        let (market, side) = market_side(tokens.draw());
        let ts = DAY + (n as i64 * 86_400) / ticks as i64;
        lines.push(tick_line(prefix, market, side, ts, price(n)));
    }
    Shape {
        name: format!(
            "long tail: {} tokens, 1 day, Zipf activity",
            spaced(markets * 2)
        ),
        lines,
    }
}

/// An endless long-tail feed for the live benchmark: tokens drawn as
/// [`long_tail`] draws them, and event time that moves forward with the
/// feed (`per_second` ticks per second of event time from [`DAY`]), so
/// buckets keep closing however long it runs. Clients share one sequence
/// of tick numbers and each generates the ranges it claims, so bodies are
/// built as they are sent instead of held in memory.
pub struct LiveFeed {
    prefix: String,
    tokens: ZipfTokens,
    per_second: u64,
}

impl LiveFeed {
    pub fn new(prefix: &str, tokens: ZipfTokens, per_second: u64) -> LiveFeed {
        LiveFeed {
            prefix: prefix.to_string(),
            tokens,
            per_second,
        }
    }

    /// The NDJSON body of ticks number `range` (one line each).
    ///
    /// Sized from its first line, with an eighth to spare: sized at 80
    /// bytes a line, a body of 10 000 lines of ~84 bytes outgrew its buffer
    /// near its end and was copied into one twice as large, newly faulted
    /// in, and the clients share the server's two cores (12 % of the live
    /// benchmark's page faults, `perf record -e page-faults`).
    pub fn body(&mut self, range: std::ops::Range<u64>) -> String {
        let lines = (range.end - range.start) as usize;
        let mut out = String::new();
        let (mut second, mut digits) = (None, [0u8; 20]);
        let mut ts = "";
        for (i, n) in range.enumerate() {
            let (market, side) = market_side(self.tokens.draw());
            let at = DAY + (n / self.per_second) as i64;
            if second != Some(at) {
                second = Some(at);
                ts = decimal(at, &mut digits);
            }
            write_tick_at(&mut out, &self.prefix, market, side, ts, price(n as usize));
            out.push('\n');
            if i == 0 {
                out.reserve((out.len() + out.len() / 8) * (lines - 1));
            }
        }
        out
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
                let p = ((s as usize) * 31 + m * 7) % 1000;
                lines.push(tick_line(prefix, m, side, DAY + s, p));
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The guide table changes how fast a rank is found, not which: every
    /// draw is the rank a search of the whole CDF finds.
    #[test]
    fn a_draw_is_the_rank_the_whole_cdf_gives() {
        for (tokens, draws) in [
            (1, 1_000),
            (2, 10_000),
            (3, 10_000),
            (20_000, 1_000_000),
            (100_000, 300_000),
        ] {
            let mut law = ZipfTokens::new(tokens, ZipfTokens::SEED);
            let mut state = ZipfTokens::SEED;
            for _ in 0..draws {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                let cdf = &law.cdf;
                let u = (state >> 11) as f64 / (1u64 << 53) as f64 * cdf[cdf.len() - 1];
                let whole = cdf.partition_point(|&c| c < u).min(cdf.len() - 1);
                assert_eq!(law.draw(), whole, "{tokens} tokens, u = {u}");
            }
        }
    }

    /// A live body is the lines [`tick_line`] writes (checked against
    /// `format!` above) for the same draws, one per line.
    #[test]
    fn a_live_body_is_its_tick_lines() {
        let law = ZipfTokens::new(20_000, 7);
        let mut feed = LiveFeed::new("lt", law.reseeded(11), 1000);
        let mut same = law.reseeded(11);
        for range in [0..2_500, 2_500..2_501, 999_990..1_001_020] {
            let expected: String = range
                .clone()
                .map(|n| {
                    let (market, side) = market_side(same.draw());
                    let ts = DAY + (n / 1000) as i64;
                    tick_line("lt", market, side, ts, price(n as usize)) + "\n"
                })
                .collect();
            assert_eq!(feed.body(range), expected);
        }
    }

    /// A body of the live benchmark's size fits the room its first line
    /// made for it: it was not regrown (a regrown buffer is twice as large
    /// as it had to be).
    #[test]
    fn a_live_body_is_not_regrown() {
        let mut feed = LiveFeed::new("lt", ZipfTokens::new(20_000, 7), 1000);
        for start in [0, 5_000_000, 90_000_000] {
            let body = feed.body(start..start + 10_000);
            assert!(
                body.capacity() <= body.len() * 5 / 4,
                "{} bytes in a buffer of {}",
                body.len(),
                body.capacity()
            );
        }
    }

    #[test]
    fn a_tick_line_is_what_format_makes() {
        for (market, side, ts, p) in [
            (0, "yes", DAY, 0),
            (7, "no", DAY + 86_399, 1),
            (19_999, "yes", 9_999_999_999, 999),
            (123, "no", 1, 500),
            (4_567, "yes", DAY + 3_600, 70),
            (3, "no", -86_400, 42),
            (1, "yes", i64::MIN, 9),
        ] {
            let f = p as f64 / 1000.0;
            assert_eq!(
                tick_line("lt", market, side, ts, p),
                format!(
                    r#"{{"kind":"price","market_id":"lt{market}","token_id":"lt{market}-{side}","ts":{ts},"p":{f}}}"#
                )
            );
        }
        for k in 0..1000 {
            assert_eq!(price_text()[k], format!("{}", k as f64 / 1000.0));
            assert_eq!(price_text()[k].parse::<f64>().unwrap(), k as f64 / 1000.0);
        }
    }
}
