//! The NDJSON body parser (`hindsight_ingest::batch::validate`, which runs
//! `schemas/src/wire.rs` on every line), on arbitrary bytes.
//!
//! Beyond "no panic": every non-blank line is accounted for exactly once
//! (accepted or rejected, never dropped), rejects carry their line number in
//! order and a reason, and every accepted event survives what happens to it
//! next unchanged: the log envelope (`codec`) and the feed's line form
//! (`wire::to_line`, parsed again). The catalog rule
//! (`hindsight_schemas::claims`) runs over an empty catalog, so only the
//! body's own market records claim tokens and slugs: the accepted events,
//! checked again in order, keep the rule among themselves (a refused market
//! claims nothing).
#![no_main]

use hindsight_ingest::batch;
use hindsight_ingest::catalog::BatchClaims;
use hindsight_schemas::claims::Lookups;
use hindsight_schemas::{codec, wire, Timestamp};
use libfuzzer_sys::fuzz_target;

const NOW: Timestamp = Timestamp(1_760_000_000_000);

fuzz_target!(|body: &[u8]| {
    let empty = Lookups::default();
    let out = batch::validate(
        body,
        1,
        NOW,
        &wire::Limits::default(),
        usize::MAX,
        &empty,
        &mut BatchClaims::default(),
    );

    let text = body.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(body);
    let lines: Vec<&[u8]> = text.split(|b| *b == b'\n').collect();
    let blank = |l: &[u8]| std::str::from_utf8(l).is_ok_and(|t| t.trim().is_empty());
    let counted = lines.iter().filter(|l| !blank(l)).count();
    assert_eq!(
        out.events.len() + out.rejected_count,
        counted,
        "a line was lost or counted twice"
    );
    assert_eq!(out.rejected.len(), out.rejected_count);
    let mut previous = 0;
    for r in &out.rejected {
        assert!(
            r.line > previous && r.line as usize <= lines.len(),
            "line {}",
            r.line
        );
        assert!(
            !blank(lines[r.line as usize - 1]),
            "blank line {} rejected",
            r.line
        );
        assert!(!r.reason.to_string().is_empty());
        previous = r.line;
    }

    let mut claims = BatchClaims::default();
    for event in &out.events {
        if let Err(reject) = claims.check(&empty, event) {
            panic!("accepted against the catalog rule: {reject}: {event:?}");
        }
        assert_eq!(codec::decode(&codec::encode(event)).as_ref(), Ok(event));
        let line = wire::to_line(event);
        assert_eq!(wire::parse_line(&line, NOW).as_ref(), Ok(event), "{line}");
    }
});
