//! A deterministic generator of realistic prediction markets, for `dev` and
//! `hindsight feed`.
//!
//! Series → events → markets, binary (Yes/No) and multi-outcome. Each market
//! carries a vector of logits doing a random walk; token probabilities are
//! its softmax, so the outcomes of a market always sum to one. Books sit
//! around the price with best levels first, and metrics follow: cumulative
//! volume, drifting liquidity, the book's spread. Same seed and start, same
//! events, byte for byte.

use hindsight_schemas::*;

/// SplitMix64: tiny, fast, and plenty for demo data. Not for secrets.
#[derive(Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Roughly standard normal (sum of uniforms; cheap and bounded).
    pub fn normal(&mut self) -> f64 {
        (0..4).map(|_| self.unit()).sum::<f64>() * 1.732_050_8 - 3.464_101_6
    }
}

struct DemoMarket {
    id: String,
    tokens: Vec<String>,
    logits: Vec<f64>,
    volume: f64,
    liquidity: f64,
    spread: f64,
}

/// `(series slug, title, tags, [(event slug, title, [(market slug, question, outcomes)])])`
type Plan = &'static [(
    &'static str,
    &'static str,
    &'static [&'static str],
    &'static [EventPlan],
)];
type EventPlan = (
    &'static str,
    &'static str,
    &'static [(&'static str, &'static str, &'static [&'static str])],
);

const YES_NO: &[&str] = &["Yes", "No"];

const PLAN: Plan = &[
    (
        "us-politics",
        "US Politics",
        &["politics", "us"],
        &[
            (
                "presidential-election-2028",
                "Presidential Election 2028",
                &[
                    (
                        "presidential-election-winner-2028",
                        "Who will win the 2028 US presidential election?",
                        &["Vance", "Newsom", "Shapiro", "Other"],
                    ),
                    (
                        "popular-vote-winner-party-2028",
                        "Which party wins the 2028 popular vote?",
                        &["Democratic", "Republican"],
                    ),
                ],
            ),
            (
                "fed-decision-december-2026",
                "Fed decision in December 2026",
                &[
                    (
                        "fed-cuts-25bps-december-2026",
                        "Will the Fed cut rates by 25 bps in December 2026?",
                        YES_NO,
                    ),
                    (
                        "fed-holds-december-2026",
                        "Will the Fed hold rates in December 2026?",
                        YES_NO,
                    ),
                ],
            ),
        ],
    ),
    (
        "crypto-prices",
        "Crypto prices",
        &["crypto", "bitcoin"],
        &[
            (
                "bitcoin-price-end-of-2026",
                "Bitcoin price at the end of 2026",
                &[
                    (
                        "bitcoin-above-150k-end-of-2026",
                        "Will Bitcoin close 2026 above $150k?",
                        YES_NO,
                    ),
                    (
                        "bitcoin-above-100k-end-of-2026",
                        "Will Bitcoin close 2026 above $100k?",
                        YES_NO,
                    ),
                ],
            ),
            (
                "ethereum-flippening-2027",
                "Ethereum flippening by 2027",
                &[(
                    "ethereum-flips-bitcoin-2027",
                    "Will Ethereum's market cap pass Bitcoin's by 2027?",
                    YES_NO,
                )],
            ),
        ],
    ),
    (
        "sports",
        "Sports",
        &["sports", "basketball"],
        &[(
            "nba-champion-2027",
            "NBA Champion 2027",
            &[(
                "nba-champion-2027",
                "Which team wins the 2027 NBA Finals?",
                &["Celtics", "Thunder", "Nuggets", "Knicks", "Field"],
            )],
        )],
    ),
];

pub struct Demo {
    rng: Rng,
    markets: Vec<DemoMarket>,
    catalog: Vec<Event>,
    step: u64,
}

impl Demo {
    /// The catalog is stamped with `created`: start of the generated history.
    pub fn new(seed: u64, created: Timestamp) -> Self {
        let mut rng = Rng::new(seed);
        let mut catalog = Vec::new();
        let mut markets = Vec::new();
        let year = 365 * 86_400_000;
        for (s_slug, s_title, tags, events) in PLAN {
            let series_id = format!("ser-{s_slug}");
            catalog.push(Event::Series(Box::new(SeriesRecord {
                id: series_id.clone(),
                slug: s_slug.to_string(),
                title: s_title.to_string(),
                tags: tags.iter().map(|t| t.to_string()).collect(),
                status: Some("active".into()),
                start_date: Some(created),
                end_date: None,
                created_at: created,
                updated_at: created,
            })));
            for (e_slug, e_title, ms) in *events {
                let event_id = format!("evt-{e_slug}");
                catalog.push(Event::Event(Box::new(EventRecord {
                    id: event_id.clone(),
                    slug: e_slug.to_string(),
                    series_id: Some(series_id.clone()),
                    title: e_title.to_string(),
                    tags: tags.iter().map(|t| t.to_string()).collect(),
                    status: Some("active".into()),
                    start_date: Some(created),
                    end_date: Some(Timestamp(created.0 + year)),
                    created_at: created,
                    updated_at: created,
                })));
                for (m_slug, question, outcomes) in *ms {
                    let id = format!("mkt-{m_slug}");
                    let tokens: Vec<Token> = outcomes
                        .iter()
                        .map(|o| Token {
                            id: format!("tok-{m_slug}-{}", o.to_lowercase()),
                            label: o.to_string(),
                        })
                        .collect();
                    let mut logits: Vec<f64> = outcomes.iter().map(|_| rng.normal()).collect();
                    if outcomes.len() == 2 {
                        logits[1] = 0.0;
                    }
                    catalog.push(Event::Market(Box::new(MarketRecord {
                        id: id.clone(),
                        slug: m_slug.to_string(),
                        event_id: Some(event_id.clone()),
                        question: Some(question.to_string()),
                        description: Some(format!(
                            "{question} Resolves according to the official announcement."
                        )),
                        status: "open".into(),
                        start_date: Some(created),
                        end_date: Some(Timestamp(created.0 + year)),
                        closed_at: None,
                        resolved_token_id: None,
                        resolved_token_label: None,
                        tokens: tokens.clone(),
                        created_at: created,
                        updated_at: created,
                    })));
                    markets.push(DemoMarket {
                        id,
                        tokens: tokens.into_iter().map(|t| t.id).collect(),
                        logits,
                        volume: 50_000.0 + rng.unit() * 2_000_000.0,
                        liquidity: 10_000.0 + rng.unit() * 200_000.0,
                        spread: 0.01,
                    });
                }
            }
        }
        Demo {
            rng,
            markets,
            catalog,
            step: 0,
        }
    }

    /// Series, events and markets, in dependency order.
    pub fn catalog(&self) -> &[Event] {
        &self.catalog
    }

    /// Tokens of every market: `(market id, [token ids])`.
    pub fn markets(&self) -> impl Iterator<Item = (&str, &[String])> {
        self.markets
            .iter()
            .map(|m| (m.id.as_str(), m.tokens.as_slice()))
    }

    /// One round of market data at `ts`: a price for every token, and every
    /// `book_every`-th round a book per token and a metrics sample per market.
    pub fn round(&mut self, ts: Timestamp, book_every: u64, out: &mut Vec<Event>) {
        let with_books = self.step.is_multiple_of(book_every.max(1));
        self.step += 1;
        for m in &mut self.markets {
            for l in m.logits.iter_mut() {
                *l += self.rng.normal() * 0.02;
            }
            if m.tokens.len() == 2 {
                m.logits[1] = 0.0;
            }
            let max = m.logits.iter().cloned().fold(f64::MIN, f64::max);
            let exp: Vec<f64> = m.logits.iter().map(|l| (l - max).exp()).collect();
            let total: f64 = exp.iter().sum();
            m.spread = (m.spread + self.rng.normal() * 0.001).clamp(0.002, 0.04);
            for (token, e) in m.tokens.iter().zip(&exp) {
                let p = (e / total * 10_000.0).round() / 10_000.0;
                out.push(Event::Price(PriceTick {
                    market_id: m.id.clone(),
                    token_id: token.clone(),
                    ts,
                    p,
                }));
                if with_books {
                    out.push(Event::Book(Box::new(book_around(
                        &mut self.rng,
                        &m.id,
                        token,
                        ts,
                        p,
                        m.spread,
                    ))));
                }
            }
            if with_books {
                m.volume += self.rng.unit() * 5_000.0;
                m.liquidity = (m.liquidity * (1.0 + self.rng.normal() * 0.01)).max(1_000.0);
                out.push(Event::Metrics(MetricsSample {
                    market_id: m.id.clone(),
                    ts,
                    volume: (m.volume * 100.0).round() / 100.0,
                    liquidity: (m.liquidity * 100.0).round() / 100.0,
                    spread: (m.spread * 10_000.0).round() / 10_000.0,
                }));
            }
        }
    }
}

fn book_around(
    rng: &mut Rng,
    market: &str,
    token: &str,
    ts: Timestamp,
    p: f64,
    spread: f64,
) -> BookSnapshot {
    let tick = 0.01;
    let half = (spread / 2.0).max(0.001);
    let mut bids = Vec::new();
    let mut asks = Vec::new();
    for k in 0..5 {
        let bid = ((p - half - k as f64 * tick) * 1000.0).floor() / 1000.0;
        let ask = ((p + half + k as f64 * tick) * 1000.0).ceil() / 1000.0;
        if bid > 0.0 && bids.last().is_none_or(|l: &BookLevel| bid < l.price) {
            bids.push(BookLevel {
                price: bid,
                size: (10.0 + rng.unit() * 5_000.0).round(),
            });
        }
        if ask < 1.0 && asks.last().is_none_or(|l: &BookLevel| ask > l.price) {
            asks.push(BookLevel {
                price: ask,
                size: (10.0 + rng.unit() * 5_000.0).round(),
            });
        }
    }
    BookSnapshot {
        market_id: market.into(),
        token_id: token.into(),
        ts,
        bids,
        asks,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_consistent_and_valid() {
        let start = Timestamp(1_756_684_800_000);
        let (mut a, mut b) = (Demo::new(7, start), Demo::new(7, start));
        let (mut ea, mut eb) = (Vec::new(), Vec::new());
        for i in 0..50 {
            a.round(Timestamp(start.0 + i * 60_000), 5, &mut ea);
            b.round(Timestamp(start.0 + i * 60_000), 5, &mut eb);
        }
        assert_eq!(ea, eb, "same seed, same events");
        assert!(a
            .catalog()
            .iter()
            .any(|e| matches!(e, Event::Market(m) if m.tokens.len() > 2)));
        // Every generated event passes ingest validation and round-trips
        // exactly through its ingest line.
        // Validated as of the last round: ingest refuses ticks from the future.
        let now = Timestamp(start.0 + 50 * 60_000);
        for e in ea.iter().chain(a.catalog()) {
            let line = wire::to_line(e);
            assert_eq!(wire::parse_line(&line, now).as_ref(), Ok(e), "{line}");
        }
        // Outcomes of a market sum to one (up to the 4-decimal rounding).
        let mut sums = std::collections::HashMap::<&str, f64>::new();
        for e in &ea[..] {
            if let Event::Price(p) = e {
                if p.ts == start {
                    *sums.entry(&p.market_id).or_default() += p.p;
                }
            }
        }
        for (m, s) in sums {
            assert!((s - 1.0).abs() < 0.001, "{m}: {s}");
        }
    }

    /// The OpenAPI document's examples (and `dev`'s `curl`) name a market
    /// of this demo: its slug and its first token.
    #[test]
    fn the_openapi_examples_name_a_demo_market() {
        let demo = Demo::new(2025, Timestamp(1_756_684_800_000));
        let example = |name| hindsight_api::openapi::example(name).unwrap();
        let market = demo.catalog().iter().find_map(|e| match e {
            Event::Market(m) if m.slug == example("id_or_slug") => Some(m),
            _ => None,
        });
        let market = market.expect("the example id_or_slug is a demo market's slug");
        assert_eq!(market.tokens[0].id, example("token_id"));
    }
}
