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
        if self.loaded.is_some_and(|at| at.elapsed() > MAX_AGE) {
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
