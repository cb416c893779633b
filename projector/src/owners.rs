//! Which market each token is listed under, as the projector needs it to
//! decide whether a tick is folded: read from the store once per token and
//! kept until a catalog record of this projector may have changed it.
//!
//! With one projector (the embedded log) it is the only writer of the
//! catalog, so the cache is exact: every market record it writes drops the
//! entries it could change. Beside other projectors (Kafka), their catalog
//! writes are seen once an entry is reloaded: entries live at most
//! [`MAX_AGE`].

use hindsight_contracts::{Delivered, Position, TokenRef};
use hindsight_schemas::Event;
use rustc_hash::{FxHashMap, FxHashSet};
use std::time::{Duration, Instant};

/// How long an entry is trusted before it is read again.
pub const MAX_AGE: Duration = Duration::from_secs(10);

/// Most tokens kept (~100 bytes each); past it the entries are dropped and
/// read again as segments need them.
///
/// Why a bound of their own: they were dropped with the rollup's rows
/// whenever those passed `max_cached_rows`, which a live step over many
/// tokens soon does (it opens new rows at the finer resolutions), and the
/// next segment then looked up nearly every token again, one query each:
/// ~2.5 % of the live benchmark's CPU samples over 20 000 tokens (`perf`).
pub const MAX_TOKENS: usize = 250_000;

#[derive(Default)]
pub struct Owners {
    /// Token id → the market listing it, `None` when no market does.
    by_token: FxHashMap<Box<str>, Option<Box<str>>>,
    loaded: Option<Instant>,
}

fn token_of(event: &Event) -> Option<&str> {
    match event {
        Event::Price(e) => Some(&e.token_id),
        Event::Book(e) => Some(&e.token_id),
        _ => None,
    }
}

impl Owners {
    pub fn clear(&mut self) {
        self.by_token.clear();
        self.loaded = None;
    }

    /// The tokens of `segment`'s ticks and snapshots not known yet (each
    /// once): look them up and pass them to [`Owners::fill`].
    pub fn missing(&mut self, segment: &[Delivered]) -> Vec<String> {
        if self.loaded.is_some_and(|at| at.elapsed() > MAX_AGE) || self.by_token.len() > MAX_TOKENS
        {
            self.clear();
        }
        let mut missing: FxHashSet<&str> = FxHashSet::default();
        for d in segment {
            if let Some(token) = token_of(&d.event) {
                if !self.by_token.contains_key(token) {
                    missing.insert(token);
                }
            }
        }
        missing.into_iter().map(str::to_string).collect()
    }

    /// What the store answered for `asked`: listed tokens with their
    /// market, the others as listed nowhere.
    pub fn fill(&mut self, asked: Vec<String>, found: Vec<TokenRef>) {
        self.loaded.get_or_insert_with(Instant::now);
        for token in asked {
            self.by_token.insert(token.into(), None);
        }
        for t in found {
            self.by_token
                .insert(t.token_id.into(), Some(t.market_id.into()));
        }
    }

    /// The market `token` is listed under; `None` also for a token not
    /// looked up (every token of a segment is, before it is folded).
    pub fn get(&self, token: &str) -> Option<&str> {
        self.by_token.get(token).and_then(|m| m.as_deref())
    }

    /// Drops every entry the market records of `catalog` may change: their
    /// tokens, and the tokens listed under them.
    pub fn forget_markets(&mut self, catalog: &[(Position, Event)]) {
        let mut markets: FxHashSet<&str> = FxHashSet::default();
        for (_, e) in catalog {
            if let Event::Market(m) = e {
                markets.insert(&m.id);
                for t in &m.tokens {
                    self.by_token.remove(t.id.as_str());
                }
            }
        }
        if !markets.is_empty() {
            self.by_token
                .retain(|_, owner| owner.as_deref().is_none_or(|m| !markets.contains(m)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hindsight_schemas::{PriceTick, Timestamp};

    fn tick(token: &str) -> Delivered {
        Delivered {
            position: Position {
                partition: 0,
                offset: 0,
            },
            event: Event::Price(PriceTick {
                market_id: "m".into(),
                token_id: token.into(),
                ts: Timestamp(0),
                p: 0.5,
            }),
        }
    }

    #[test]
    fn past_its_bound_every_owner_is_read_again() {
        let mut owners = Owners::default();
        let asked: Vec<String> = (0..MAX_TOKENS).map(|i| format!("t{i}")).collect();
        owners.fill(asked, Vec::new());
        // At the bound, a known token is not asked for again.
        assert!(owners.missing(&[tick("t1")]).is_empty());
        owners.fill(vec!["one more".into()], Vec::new());
        // Past it, every entry is dropped.
        assert_eq!(owners.missing(&[tick("t1")]), ["t1"]);
    }
}
