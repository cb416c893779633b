//! The rollup engine alone, on one core: ticks folded into all seven
//! resolutions per second, with realistic interleaving (2 000 tokens, each
//! ticking about once a second, in time order).

use hindsight_contracts::{Delivered, Position};
use hindsight_projector::Rollup;
use hindsight_schemas::{Event, PriceTick, Resolution, Timestamp};
use std::time::Instant;

pub fn run(quick: bool) {
    let tokens = 2_000;
    let per_pass = if quick { 200_000 } else { 1_000_000 };
    let passes = 5;
    let batch = 20_000;
    let ids: Vec<(String, String)> = (0..tokens)
        .map(|i| {
            (
                format!("market-{:06}", i / 2),
                format!("{:077}", 7_919u64 * i as u64 + 1),
            )
        })
        .collect();
    let mut events: Vec<Delivered> = (0..per_pass)
        .map(|i| {
            let (m, t) = &ids[i % tokens];
            Delivered {
                position: Position {
                    partition: 0,
                    offset: i as u64,
                },
                event: Event::Price(PriceTick {
                    market_id: m.clone(),
                    token_id: t.clone(),
                    ts: Timestamp(
                        1_756_684_800_000
                            + (i / tokens) as i64 * 1_000
                            + (i % tokens) as i64 % 1000,
                    ),
                    p: (i % 1000) as f64 / 1000.0,
                }),
            }
        })
        .collect();
    let mut rollup = Rollup::new();
    let mut rows = 0;
    let mut elapsed = 0.0;
    for pass in 0..passes {
        // Later passes continue the log (new offsets, later timestamps).
        if pass > 0 {
            let span = (per_pass / tokens) as i64 * 1_000;
            for d in &mut events {
                d.position.offset += per_pass as u64;
                if let Event::Price(p) = &mut d.event {
                    p.ts = Timestamp(p.ts.0 + span);
                }
            }
        }
        let started = Instant::now();
        for chunk in events.chunks(batch) {
            // As over an empty store: its bounds say nothing is stored.
            let new_series = rollup.series_of(chunk);
            rollup.learn_frontiers(vec![
                [Timestamp(i64::MIN); Resolution::ALL.len()];
                new_series.len()
            ]);
            let missing = rollup.missing(chunk);
            std::hint::black_box(&missing);
            rollup.apply(chunk);
            rows += rollup.drain_dirty().len();
        }
        elapsed += started.elapsed().as_secs_f64();
    }
    let ticks = (per_pass * passes) as f64;
    println!(
        "== rollup engine (one core, {} resolutions, {tokens} tokens)",
        Resolution::ALL.len()
    );
    println!(
        "   {:.0} ticks in {:.3} s: {:.1} M ticks/s ({} dirty rows handed out)",
        ticks,
        elapsed,
        ticks / elapsed / 1e6,
        rows
    );
}
