//! `hindsight`: every service of Hindsight in one binary.
//!
//! `dev` runs ingest, projector, API and a demo feed in one process on the
//! embedded backends; `ingest`, `projector` and `api` run one service each
//! over a shared data directory; `backfill`, `rebuild` and `keys` are
//! operator commands. Every flag has a `HINDSIGHT_*` environment variable.
//! The library (`src/lib.rs`) holds everything; this only starts it.

use clap::Parser;
use hindsight::config::Cli;
use std::io::IsTerminal;

fn main() -> anyhow::Result<()> {
    // Parsing starts no thread: the allocators are still tuned before any.
    let cli = Cli::parse();
    hindsight::allocator::tune_malloc(cli.command.workload());
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_new(&cli.log)?)
        .with_writer(std::io::stderr)
        // Colour for a person at a terminal; plain text for files and journald.
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(hindsight::commands::run(cli.command))
}
