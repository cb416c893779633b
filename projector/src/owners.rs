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
use hindsight_schemas::claims::tick_conflict;
use hindsight_schemas::wire::Reject;
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

/// What [`Owners::judge`] found of a batch's ticks, snapshots and trades.
#[derive(Debug, Default)]
pub struct Judged {
    /// Sent under another market than their token's: index in the batch,
    /// and why.
    pub mismatched: Vec<(usize, Reject)>,
    /// Of tokens not known yet: their indices in the batch.
    unknown: Vec<usize>,
}

impl Judged {
    /// The tokens of the unknown ticks, each once: to be looked up.
    pub fn missing(&self, batch: &[Delivered]) -> Vec<String> {
        let mut missing: FxHashSet<&str> = FxHashSet::default();
        for &i in &self.unknown {
            if let Some((_, token)) = batch[i].event.token_data() {
                missing.insert(token);
            }
        }
        missing.into_iter().map(str::to_string).collect()
    }
}

#[derive(Default)]
pub struct Owners {
    /// Token id → the market listing it, `None` when no market does.
    by_token: FxHashMap<Box<str>, Option<Box<str>>>,
    loaded: Option<Instant>,
}

impl Owners {
    pub fn clear(&mut self) {
        self.by_token.clear();
        self.loaded = None;
    }

    /// Judges the price ticks, snapshots and trades of `batch` against the
    /// owners known:
    /// those sent under another market than their token's are
    /// `mismatched` (by index in `batch`), and those of tokens not known
    /// yet are `unknown`. Look the latter's tokens up
    /// ([`Judged::missing`]), pass them to [`Owners::fill`] and then to
    /// [`Owners::judge_unknown`].
    ///
    /// One lookup per tick, where asking which tokens were missing and
    /// then, for each tick, its owner took two (~1.5 % of a live run's
    /// CPU, a cache miss or two each).
    pub fn judge(&mut self, batch: &[Delivered]) -> Judged {
        if self.loaded.is_some_and(|at| at.elapsed() > MAX_AGE) || self.by_token.len() > MAX_TOKENS
        {
            self.clear();
        }
        let mut judged = Judged::default();
        for (i, d) in batch.iter().enumerate() {
            let Some((market, token)) = d.event.token_data() else {
                continue;
            };
            match self.by_token.get(token) {
                Some(owner) => {
                    if let Some(reason) = tick_conflict(market, token, owner.as_deref()) {
                        judged.mismatched.push((i, reason));
                    }
                }
                None => judged.unknown.push(i),
            }
        }
        judged
    }

    /// Judges the ticks [`Owners::judge`] found `unknown`, once their
    /// tokens are filled in, adding them to `mismatched` in batch order.
    pub fn judge_unknown(&self, batch: &[Delivered], judged: &mut Judged) {
        if judged.unknown.is_empty() {
            return;
        }
        for i in std::mem::take(&mut judged.unknown) {
            if let Some((market, token)) = batch[i].event.token_data() {
                if let Some(reason) = tick_conflict(market, token, self.get(token)) {
                    judged.mismatched.push((i, reason));
                }
            }
        }
        judged.mismatched.sort_by_key(|(i, _)| *i);
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
        let missing = |owners: &mut Owners| {
            let batch = [tick("t1")];
            owners.judge(&batch).missing(&batch)
        };
        // At the bound, a known token is not asked for again.
        assert!(missing(&mut owners).is_empty());
        owners.fill(vec!["one more".into()], Vec::new());
        // Past it, every entry is dropped.
        assert_eq!(missing(&mut owners), ["t1"]);
    }

    /// Each tick is judged once: known tokens at once, the others once
    /// filled in, the mismatched listed in batch order whichever way they
    /// were found.
    #[test]
    fn ticks_are_judged_by_their_tokens_owners_in_batch_order() {
        let mut owners = Owners::default();
        let listed = |token: &str, market: &str| TokenRef {
            token_id: token.into(),
            market_id: market.into(),
            label: "Yes".into(),
        };
        owners.fill(vec!["known".into()], vec![listed("known", "other")]);
        let batch = [tick("late"), tick("known"), tick("free"), tick("late")];
        let mut judged = owners.judge(&batch);
        assert_eq!(judged.mismatched.len(), 1, "the known token at once");
        let mut missing = judged.missing(&batch);
        missing.sort();
        assert_eq!(missing, ["free", "late"], "each unknown token once");
        owners.fill(missing, vec![listed("late", "other")]);
        owners.judge_unknown(&batch, &mut judged);
        let at: Vec<usize> = judged.mismatched.iter().map(|(i, _)| *i).collect();
        assert_eq!(at, [0, 1, 3]);
    }
}
