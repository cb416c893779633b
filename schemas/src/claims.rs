//! One market per token and per slug: the catalog rule ingest, the read
//! store and the projector share.
//!
//! A token id or a slug belongs to the first market that lists it, until a
//! newer version of that market drops it. Without the rule a token listed by
//! two markets resolves to whichever was written last, `/v1/markets/{slug}`
//! to one of two markets, and a tick sent under market A with market B's
//! token is folded into B's history.
//!
//! - Ingest refuses a line the catalog it can see already contradicts
//!   ([`check`]), with a [`RejectKind`](crate::wire::RejectKind) of
//!   [`RejectKind::CATALOG`](crate::wire::RejectKind::CATALOG).
//! - What reaches the log anyway (lines accepted before the contradicting
//!   record was projected, logs written before the rule) is decided in log
//!   order: the read store does not store a market version that would take
//!   another market's token or slug ([`market_conflict`]), and the projector
//!   does not fold a price tick or book snapshot whose token the catalog
//!   lists under another market ([`tick_conflict`]).

use crate::wire::Reject;
use crate::{Event, MarketRecord};
use std::collections::HashMap;

/// Who holds a token or a slug, as some reader of the catalog sees it.
pub trait Claims {
    /// The market the catalog lists `token_id` under.
    fn token_market(&self, token_id: &str) -> Option<&str>;
    /// The market whose slug is `slug`.
    fn slug_market(&self, slug: &str) -> Option<&str>;
}

/// Claims looked up ahead, for one decision (what a store read for a
/// record); also the empty catalog.
#[derive(Debug, Default, Clone)]
pub struct Lookups {
    /// Token id → market id.
    pub tokens: HashMap<String, String>,
    /// Slug → market id.
    pub slugs: HashMap<String, String>,
}

impl Claims for Lookups {
    fn token_market(&self, token_id: &str) -> Option<&str> {
        self.tokens.get(token_id).map(String::as_str)
    }

    fn slug_market(&self, slug: &str) -> Option<&str> {
        self.slugs.get(slug).map(String::as_str)
    }
}

/// A price tick or book snapshot of `market_id` for `token_id`, which the
/// catalog lists under `listed_under` (if at all): refused when that is
/// another market. A token no market lists passes: ticks may come before
/// their market's record.
pub fn tick_conflict(
    market_id: &str,
    token_id: &str,
    listed_under: Option<&str>,
) -> Option<Reject> {
    match listed_under {
        Some(owner) if owner != market_id => {
            Some(Reject::market_mismatch(market_id, token_id, owner))
        }
        _ => None,
    }
}

/// A version of market `m`: refused when one of its tokens is listed under
/// another market (the first such token is named), or else when its slug
/// is another market's.
pub fn market_conflict(claims: &(impl Claims + ?Sized), m: &MarketRecord) -> Option<Reject> {
    for (i, t) in m.tokens.iter().enumerate() {
        match claims.token_market(&t.id) {
            Some(owner) if owner != m.id => return Some(Reject::token_claimed(i, &t.id, owner)),
            _ => {}
        }
    }
    match claims.slug_market(&m.slug) {
        Some(owner) if owner != m.id => Some(Reject::slug_taken(&m.slug, owner)),
        _ => None,
    }
}

/// The rule for any event: ticks, snapshots and trades by their token, markets by
/// their tokens and slug; series, events and metrics samples always pass.
pub fn check(claims: &(impl Claims + ?Sized), event: &Event) -> Result<(), Reject> {
    let conflict = match event {
        Event::Market(m) => market_conflict(claims, m),
        other => other
            .token_data()
            .and_then(|(market, token)| tick_conflict(market, token, claims.token_market(token))),
    };
    conflict.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{parse_line, RejectKind};
    use crate::Timestamp;

    const NOW: Timestamp = Timestamp(1_760_000_000_000);

    fn catalog() -> Lookups {
        let mut l = Lookups::default();
        l.tokens.insert("b-yes".into(), "b".into());
        l.tokens.insert("a-yes".into(), "a".into());
        l.slugs.insert("b-slug".into(), "b".into());
        l.slugs.insert("a-slug".into(), "a".into());
        l
    }

    fn line(text: &str) -> Event {
        parse_line(text, NOW).unwrap()
    }

    fn refused(event: &Event) -> (RejectKind, String, String) {
        let r = check(&catalog(), event).expect_err("refused");
        (r.kind(), r.field_name().unwrap().to_string(), r.to_string())
    }

    #[test]
    fn a_tick_under_another_market_than_its_tokens_is_a_market_mismatch() {
        for kind in [
            r#"{"kind":"price","market_id":"a","token_id":"b-yes","ts":1756684830,"p":0.5}"#,
            r#"{"kind":"book","market_id":"a","token_id":"b-yes","ts":1756684830,"bids":[],"asks":[]}"#,
        ] {
            let (kind, field, text) = refused(&line(kind));
            assert_eq!(
                (kind, field.as_str()),
                (RejectKind::MarketMismatch, "market_id")
            );
            assert_eq!(
                text,
                "field `market_id`: token `b-yes` is listed under market `b` in the catalog, not `a`"
            );
        }
        // Its own token, or a token no market lists: folded as sent.
        for ok in [
            r#"{"kind":"price","market_id":"a","token_id":"a-yes","ts":1756684830,"p":0.5}"#,
            r#"{"kind":"price","market_id":"a","token_id":"new","ts":1756684830,"p":0.5}"#,
            r#"{"kind":"metrics","market_id":"a","ts":1756684830,"volume":1,"liquidity":1,"spread":0}"#,
        ] {
            assert_eq!(check(&catalog(), &line(ok)), Ok(()), "{ok}");
        }
    }

    #[test]
    fn a_market_taking_another_markets_token_or_slug_is_refused_naming_the_field() {
        let m = |id: &str, slug: &str, tokens: &str| {
            line(&format!(
                r#"{{"kind":"market","id":"{id}","slug":"{slug}","status":"open","tokens":{tokens}}}"#
            ))
        };
        let (kind, field, text) = refused(&m(
            "c",
            "c-slug",
            r#"[{"id":"c-yes","label":"Yes"},{"id":"b-yes","label":"No"}]"#,
        ));
        assert_eq!(
            (kind, field.as_str()),
            (RejectKind::TokenClaimed, "tokens[1].id")
        );
        assert!(
            text.contains("token `b-yes` is already listed under market `b`"),
            "{text}"
        );
        let (kind, field, text) = refused(&m("c", "b-slug", r#"[{"id":"c-yes","label":"Yes"}]"#));
        assert_eq!((kind, field.as_str()), (RejectKind::SlugTaken, "slug"));
        assert_eq!(
            text,
            "field `slug`: `b-slug` is already the slug of market `b`"
        );
        // A market keeps its own tokens and slug in a new version.
        let again = m(
            "b",
            "b-slug",
            r#"[{"id":"b-yes","label":"Yes"},{"id":"b-no","label":"No"}]"#,
        );
        assert_eq!(check(&catalog(), &again), Ok(()));
    }
}
