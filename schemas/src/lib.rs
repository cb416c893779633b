//! The vocabulary every Hindsight service shares.
//!
//! Read in this order: [`time`] (UTC milliseconds and how we parse them),
//! [`resolution`] (bucket widths and bucket math), [`event`] (what flows
//! through the log), [`wire`] (how pipelines send events, and every
//! validation rule), [`claims`] (one market per token and per slug, the
//! catalog rule), [`codec`] (the versioned envelope the log stores).
//!
//! Nothing here does I/O: the crate is pure so that ingest, projector and API
//! agree on one definition of every rule.

pub mod api;
pub mod claims;
pub mod codec;
pub mod event;
pub mod num;
pub mod resolution;
pub mod time;
pub mod wire;

pub use event::{
    BookLevel, BookSnapshot, Event, EventKind, EventRecord, MarketRecord, MetricsSample, PriceTick,
    SeriesRecord, Token, Trade, TradeSide,
};
pub use resolution::{Granularity, Resolution};
pub use time::{IsoTime, IsoWriter, Timestamp};

/// Longest id or slug accepted anywhere (SPEC §8: path ids are 1..200).
pub const MAX_ID_LEN: usize = 200;
