//! Ingest: raw events from market-data pipelines into the event log.
//!
//! - [`batch`]: one NDJSON body → validated events and numbered rejects.
//! - [`catalog`]: the read store's catalog, cached, which lines are checked
//!   against (one market per token and per slug).
//! - [`http`]: `POST /ingest/v1/events`, acknowledged only once durable.
//! - [`backfill`]: the same for files, with progress and a rejects file.

pub mod backfill;
pub mod batch;
pub mod catalog;
pub mod http;
