//! Tick-level records: every price tick, book snapshot and trade of a
//! step, as ingested, keyed by its timestamp and log position
//! ([`TickKey`]). Written by the store in the same `apply` as the buckets;
//! a replayed event gives the same key, so it rewrites its own row.

use crate::rollup::levels_text;
use hindsight_contracts::{Delivered, Tick, TickKey, TickValue};
use hindsight_schemas::Event;

/// The tick-level record of a price tick, book snapshot or trade, taking
/// the event's strings; `None` for every other kind.
pub fn tick_of(d: Delivered) -> Option<Tick> {
    let (token_id, ts, value) = match d.event {
        Event::Price(e) => (e.token_id, e.ts, TickValue::Price { p: e.p }),
        Event::Book(e) => (
            e.token_id,
            e.ts,
            TickValue::Book {
                bids: levels_text(&e.bids),
                asks: levels_text(&e.asks),
            },
        ),
        Event::Trade(e) => (
            e.token_id,
            e.ts,
            TickValue::Trade {
                price: e.price,
                size: e.size,
                side: e.side,
                trade_id: e.trade_id,
            },
        ),
        Event::Metrics(_) | Event::Series(_) | Event::Event(_) | Event::Market(_) => return None,
    };
    Some(Tick {
        token_id,
        key: TickKey::of(ts, d.position),
        value,
    })
}
