//! Tick-level reads on the embedded store: a token's price ticks paged
//! 1 000 at a time from `ReadStore::ticks`, as the API's tick pages read
//! them (the API serves at most 200 per page; 1 000 shows the per-tick
//! cost). The store holds 20 tokens' ticks interleaved, written as the
//! projector writes them (steps of 20 000).

use hindsight_contracts::{
    Position, ProjectionStore, ProjectionWrite, ReadStore, Tick, TickKey, TickKind, TickRange,
    TickValue,
};
use hindsight_schemas::Timestamp;
use hindsight_sqlite::SqliteStore;
use std::time::Instant;

const T0: i64 = 1_756_684_800_000;
const TOKENS: usize = 20;
const PAGE: usize = 1_000;

pub fn run(quick: bool) -> anyhow::Result<()> {
    let per_token = if quick { 20_000 } else { 100_000 };
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let dir =
            std::env::temp_dir().join(format!("hindsight-bench-ticks-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = SqliteStore::open(&dir)?;
        let total = per_token * TOKENS;
        let started = Instant::now();
        let mut offset = 0u64;
        while (offset as usize) < total {
            let ticks: Vec<Tick> = (offset..(offset + 20_000).min(total as u64))
                .map(|i| Tick {
                    token_id: format!("token-{:02}", i as usize % TOKENS).into(),
                    key: TickKey::of(
                        // Several ticks a second per token; some share a ms.
                        Timestamp(T0 + (i as i64 / TOKENS as i64) * 250),
                        Position {
                            partition: 0,
                            offset: i,
                        },
                    ),
                    value: TickValue::Price {
                        p: (i % 1000) as f64 / 1000.0,
                    },
                })
                .collect();
            offset += ticks.len() as u64;
            store
                .apply(ProjectionWrite {
                    ticks,
                    ..Default::default()
                })
                .await?;
        }
        let written = started.elapsed().as_secs_f64();
        let started = Instant::now();
        let (mut pages, mut read) = (0usize, 0usize);
        let mut from = TickKey::at(Timestamp(T0));
        loop {
            let page = store
                .ticks(
                    TickKind::Price,
                    "token-07",
                    TickRange {
                        from,
                        end: Timestamp(T0 + 86_400_000),
                        limit: PAGE,
                    },
                )
                .await?;
            pages += 1;
            read += page.len();
            match page.last() {
                Some(last) if page.len() == PAGE => {
                    from = TickKey {
                        offset: last.key.offset + 1,
                        ..last.key
                    }
                }
                _ => break,
            }
        }
        let secs = started.elapsed().as_secs_f64();
        anyhow::ensure!(read == per_token, "read {read} ticks of {per_token}");
        println!(
            "ticks: wrote {total} price ticks of {TOKENS} tokens in {written:.2} s ({:.0}/s); \
             read one token's {read} in {pages} pages of {PAGE}: {:.0} pages/s, {:.0} ticks/s",
            total as f64 / written,
            pages as f64 / secs,
            read as f64 / secs
        );
        let _ = std::fs::remove_dir_all(&dir);
        Ok(())
    })
}
