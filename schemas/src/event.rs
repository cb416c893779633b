//! What flows through the event log.
//!
//! Four market-data kinds (price tick, book snapshot, metrics sample, trade) and
//! three catalog upserts (series, event, market). Closing and resolving a
//! market are market upserts. These types are validated already: the only way
//! to build one from outside input is [`crate::wire::parse_line`].
//!
//! They are also the `bincode` bodies of log format version 1
//! ([`crate::codec`]): changing a field here changes the bytes, which the
//! frozen fixture test catches. Evolve by adding a new format version.

use crate::time::Timestamp;

/// One tick of a token's probability.
#[derive(Debug, Clone, PartialEq, bincode::Encode, bincode::Decode)]
pub struct PriceTick {
    pub market_id: String,
    pub token_id: String,
    pub ts: Timestamp,
    /// Probability in `[0, 1]`.
    pub p: f64,
}

/// `[price, size]` of one level of an order book.
#[derive(Debug, Clone, Copy, PartialEq, bincode::Encode, bincode::Decode)]
pub struct BookLevel {
    pub price: f64,
    pub size: f64,
}

/// A level-2 snapshot: bids descending and asks ascending (best first).
#[derive(Debug, Clone, PartialEq, bincode::Encode, bincode::Decode)]
pub struct BookSnapshot {
    pub market_id: String,
    pub token_id: String,
    pub ts: Timestamp,
    pub bids: Vec<BookLevel>,
    pub asks: Vec<BookLevel>,
}

/// Market-level liquidity metrics at one instant.
#[derive(Debug, Clone, PartialEq, bincode::Encode, bincode::Decode)]
pub struct MetricsSample {
    pub market_id: String,
    pub ts: Timestamp,
    pub volume: f64,
    pub liquidity: f64,
    pub spread: f64,
}

/// Which side took liquidity in a trade.
#[derive(Debug, Clone, Copy, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub enum TradeSide {
    Buy,
    Sell,
}

impl TradeSide {
    pub const fn as_str(self) -> &'static str {
        match self {
            TradeSide::Buy => "buy",
            TradeSide::Sell => "sell",
        }
    }

    pub fn parse(text: &str) -> Option<TradeSide> {
        [TradeSide::Buy, TradeSide::Sell]
            .into_iter()
            .find(|s| s.as_str() == text)
    }
}

/// One trade of a token. `trade_id`, when the venue gives one, names the
/// trade: a trade id repeated for a token counts once, at its first log
/// position (the read store keeps it, see `ProjectionStore`).
#[derive(Debug, Clone, PartialEq, bincode::Encode, bincode::Decode)]
pub struct Trade {
    pub market_id: String,
    pub token_id: String,
    pub ts: Timestamp,
    /// Probability in `[0, 1]`.
    pub price: f64,
    /// Shares traded, `>= 0`.
    pub size: f64,
    pub side: TradeSide,
    pub trade_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, bincode::Encode, bincode::Decode)]
pub struct SeriesRecord {
    pub id: String,
    pub slug: String,
    pub title: String,
    pub tags: Vec<String>,
    pub status: Option<String>,
    pub start_date: Option<Timestamp>,
    pub end_date: Option<Timestamp>,
    pub created_at: Timestamp,
    /// Version of the record: the latest `updated_at` wins, ties by log position.
    pub updated_at: Timestamp,
}

#[derive(Debug, Clone, PartialEq, bincode::Encode, bincode::Decode)]
pub struct EventRecord {
    pub id: String,
    pub slug: String,
    pub series_id: Option<String>,
    pub title: String,
    pub tags: Vec<String>,
    pub status: Option<String>,
    pub start_date: Option<Timestamp>,
    pub end_date: Option<Timestamp>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

/// An outcome contract of a market.
#[derive(Debug, Clone, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub struct Token {
    pub id: String,
    pub label: String,
}

#[derive(Debug, Clone, PartialEq, bincode::Encode, bincode::Decode)]
pub struct MarketRecord {
    pub id: String,
    pub slug: String,
    pub event_id: Option<String>,
    pub question: Option<String>,
    pub description: Option<String>,
    pub status: String,
    pub start_date: Option<Timestamp>,
    pub end_date: Option<Timestamp>,
    pub closed_at: Option<Timestamp>,
    pub resolved_token_id: Option<String>,
    pub resolved_token_label: Option<String>,
    pub tokens: Vec<Token>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

/// Every event the log carries.
///
/// Every kind but the price tick and the metrics sample is boxed, so an
/// event is the size of a price tick (64 bytes): a projector step holds
/// its events by the hundred thousand, and then its ticks, made in the
/// events' buffer, while the next step is polled. Unboxed, catalog records
/// (three times a price tick's size) made every event 280 bytes, books and
/// trades 112.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Price(PriceTick),
    Book(Box<BookSnapshot>),
    Metrics(MetricsSample),
    Series(Box<SeriesRecord>),
    Event(Box<EventRecord>),
    Market(Box<MarketRecord>),
    Trade(Box<Trade>),
}

/// The kind of an event: its name on the ingest wire, its tag in the log
/// envelope, and a label on metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    Price = 1,
    Book = 2,
    Metrics = 3,
    Series = 4,
    Event = 5,
    Market = 6,
    Trade = 7,
}

impl EventKind {
    pub const ALL: [EventKind; 7] = [
        EventKind::Price,
        EventKind::Book,
        EventKind::Metrics,
        EventKind::Series,
        EventKind::Event,
        EventKind::Market,
        EventKind::Trade,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            EventKind::Price => "price",
            EventKind::Book => "book",
            EventKind::Metrics => "metrics",
            EventKind::Series => "series",
            EventKind::Event => "event",
            EventKind::Market => "market",
            EventKind::Trade => "trade",
        }
    }

    pub fn parse(text: &str) -> Option<EventKind> {
        EventKind::ALL.into_iter().find(|k| k.as_str() == text)
    }

    pub fn from_tag(tag: u8) -> Option<EventKind> {
        EventKind::ALL.into_iter().find(|k| *k as u8 == tag)
    }
}

impl Event {
    pub fn kind(&self) -> EventKind {
        match self {
            Event::Price(_) => EventKind::Price,
            Event::Book(_) => EventKind::Book,
            Event::Metrics(_) => EventKind::Metrics,
            Event::Series(_) => EventKind::Series,
            Event::Event(_) => EventKind::Event,
            Event::Market(_) => EventKind::Market,
            Event::Trade(_) => EventKind::Trade,
        }
    }

    /// `(market_id, token_id)` of a token's market data (price tick, book
    /// snapshot, trade): the events the catalog rule decides by their
    /// token, and the read store keeps tick by tick.
    pub fn token_data(&self) -> Option<(&str, &str)> {
        match self {
            Event::Price(e) => Some((&e.market_id, &e.token_id)),
            Event::Book(e) => Some((&e.market_id, &e.token_id)),
            Event::Trade(e) => Some((&e.market_id, &e.token_id)),
            Event::Metrics(_) | Event::Series(_) | Event::Event(_) | Event::Market(_) => None,
        }
    }

    /// The log record key. Market data and market upserts are keyed by market
    /// id so that everything about one market stays ordered in one partition;
    /// series and event upserts by their own id.
    pub fn key(&self) -> &str {
        match self {
            Event::Price(e) => &e.market_id,
            Event::Book(e) => &e.market_id,
            Event::Metrics(e) => &e.market_id,
            Event::Series(e) => &e.id,
            Event::Event(e) => &e.id,
            Event::Market(e) => &e.id,
            Event::Trade(e) => &e.market_id,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// See [`Event`]: every kind but the two smallest is boxed, and a book
    /// or trade unboxed would make every event 112 bytes.
    #[test]
    fn an_event_is_the_size_of_a_price_tick() {
        assert_eq!(
            std::mem::size_of::<Event>(),
            std::mem::size_of::<PriceTick>()
        );
    }
}
