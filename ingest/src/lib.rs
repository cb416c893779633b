//! Ingest: raw events from market-data pipelines into the event log.
//!
//! - [`batch`]: one NDJSON body → validated events and numbered rejects.
//! - [`http`]: `POST /ingest/v1/events`, acknowledged only once durable.
//! - [`backfill`]: the same for files, with progress and a rejects file.

pub mod backfill;
pub mod batch;
pub mod http;
