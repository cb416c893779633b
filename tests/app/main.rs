//! The integration tests that run Hindsight's services in this process, on
//! port 0, over real embedded backends in temporary directories (see
//! `helpers::spawn_app`). One binary: the tests run in parallel, and it is
//! linked once. The SIGKILL crash test (`tests/projector_crash.rs`) and the
//! Prometheus test (`tests/ops_prometheus.rs`, which needs the process's
//! metrics registry to itself) are separate binaries.

mod api_contract;
mod caching;
mod candles;
mod cli;
mod cursors;
mod dashboard;
mod dashboard_browser;
mod estimate;
mod explore;
mod export;
mod export_jobs;
mod faults;
mod helpers;
mod ingest_validation;
mod listeners;
mod ops;
mod pipeline;
mod rate_limits;
mod shutdown;
mod ticks;
