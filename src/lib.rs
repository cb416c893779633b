//! The composition root of Hindsight: configuration, the one place that
//! chooses backends, and the services built over them.
//!
//! - [`config`]: the command line, each subcommand with its own flags.
//! - [`backends`]: [`backends::Backends::connect`], the only place choosing
//!   SQLite, Kafka or CQL; everything else sees the contracts' traits.
//! - [`services`]: ingest, projector, api and dev, each built over backends
//!   and already bound listeners, run until a shutdown future completes.
//! - [`commands`]: what each subcommand does; [`shutdown`]: the signals.
//! - [`demo`]: the demo generator and the loop feeding it to dev or ingest.
//! - [`app`]: the embedded parts as concrete types, for the benchmarks.
//! - [`allocator`]: malloc tuned (two arenas, a fixed mmap threshold)
//!   before any thread starts.

pub mod allocator;
pub mod app;
pub mod backends;
pub mod commands;
pub mod config;
pub mod demo;
pub mod services;
pub mod shutdown;
