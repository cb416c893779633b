//! Tick-level records: every price tick, book snapshot and trade of a
//! step, as ingested, keyed by its timestamp and log position
//! ([`TickKey`]). Written by the store in the same `apply` as the buckets;
//! a replayed event gives the same key, so it rewrites its own row.

use crate::rollup::levels_text;
use hindsight_contracts::{Delivered, Tick, TickKey, TickValue};
use hindsight_schemas::Event;
use std::sync::Arc;

/// The tick-level record of a price tick, book snapshot or trade, taking
/// the event's strings; `None` for every other kind. Its token's id is
/// `id` when given (the id the rollup interned for the event's rows, see
/// [`Tick`]), else the event's own.
pub fn tick_of(d: Delivered, id: Option<&Arc<str>>) -> Option<Tick> {
    let (token_id, ts, value) = match d.event {
        Event::Price(e) => (e.token_id, e.ts, TickValue::Price { p: e.p }),
        Event::Book(e) => (
            e.token_id,
            e.ts,
            TickValue::Book {
                bids: levels_text(&e.bids).into(),
                asks: levels_text(&e.asks).into(),
            },
        ),
        Event::Trade(e) => (
            e.token_id,
            e.ts,
            TickValue::Trade {
                price: e.price,
                size: e.size,
                side: e.side,
                trade_id: e.trade_id.map(String::into_boxed_str),
            },
        ),
        Event::Metrics(_) | Event::Series(_) | Event::Event(_) | Event::Market(_) => return None,
    };
    Some(Tick {
        token_id: id.cloned().unwrap_or_else(|| token_id.into()),
        key: TickKey::of(ts, d.position),
        value,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use hindsight_contracts::Position;
    use hindsight_schemas::{PriceTick, Timestamp};

    /// A step's ticks are made in its events' buffer: a tick larger than
    /// an event would need a buffer of its own beside it (~50 MB for a
    /// 640 000-event step).
    #[test]
    fn a_steps_ticks_take_its_events_buffer() {
        assert!(std::mem::size_of::<Tick>() <= std::mem::size_of::<Delivered>());
        let events: Vec<Delivered> = (0..1_000)
            .map(|i| Delivered {
                position: Position {
                    partition: 0,
                    offset: i,
                },
                event: Event::Price(PriceTick {
                    market_id: "m".into(),
                    token_id: format!("t{}", i % 7),
                    ts: Timestamp(1_756_684_800_000 + i as i64),
                    p: 0.5,
                }),
            })
            .collect();
        // As the projector makes them: with the ids its rollup interned.
        let ids: Vec<Arc<str>> = (0..7).map(|t| format!("t{t}").into()).collect();
        let buffer = events.as_ptr() as usize;
        let ticks: Vec<Tick> = events
            .into_iter()
            .enumerate()
            .filter_map(|(i, d)| tick_of(d, Some(&ids[i % 7])))
            .collect();
        assert_eq!(ticks.len(), 1_000);
        assert_eq!(
            ticks.as_ptr() as usize,
            buffer,
            "the ticks have a buffer of their own"
        );
        assert!(ticks
            .iter()
            .enumerate()
            .all(|(i, t)| Arc::ptr_eq(&t.token_id, &ids[i % 7])));
    }
}
