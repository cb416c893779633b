//! Splitting and validating one NDJSON body.

use hindsight_schemas::{wire, Event, EventKind, Timestamp};
use hindsight_telemetry as tm;
use serde::Serialize;

/// A refused line: its 1-based number in the body and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Rejected {
    pub line: u64,
    pub reason: String,
}

#[derive(Debug, Default)]
pub struct Validated {
    pub events: Vec<Event>,
    pub rejected: Vec<Rejected>,
}

/// Validates every non-blank line; `first_line` numbers the first line of
/// `body` (1 for an HTTP body, later for a chunk of a file).
pub fn validate(body: &[u8], first_line: u64, now: Timestamp) -> Validated {
    let mut out = Validated::default();
    for (i, line) in body.split(|b| *b == b'\n').enumerate() {
        let parsed = match std::str::from_utf8(line) {
            Ok(text) if text.trim().is_empty() => continue,
            Ok(text) => wire::parse_line(text.trim_end_matches('\r'), now),
            Err(e) => Err(format!("line is not valid UTF-8 ({e})")),
        };
        match parsed {
            Ok(event) => out.events.push(event),
            Err(reason) => {
                metrics::counter!(tm::INGEST_EVENTS_REJECTED, "reason" => reason_class(&reason))
                    .increment(1);
                out.rejected.push(Rejected {
                    line: first_line + i as u64,
                    reason,
                });
            }
        }
    }
    out
}

/// Events per kind, indexed by the kind's tag.
pub type KindCounts = [u64; 7];

pub fn kind_counts(events: &[Event]) -> KindCounts {
    let mut per_kind = [0u64; 7];
    events.iter().for_each(|e| per_kind[e.kind() as usize] += 1);
    per_kind
}

/// Counts events the log has durably accepted, by kind.
pub fn count_accepted(per_kind: KindCounts) {
    for kind in EventKind::ALL {
        if per_kind[kind as usize] > 0 {
            metrics::counter!(tm::INGEST_EVENTS_ACCEPTED, "kind" => kind.as_str())
                .increment(per_kind[kind as usize]);
        }
    }
}

/// A short, bounded label for the metrics: the reason without its details.
fn reason_class(reason: &str) -> &'static str {
    if reason.starts_with("malformed JSON") {
        "malformed_json"
    } else if reason.starts_with("unknown kind") {
        "unknown_kind"
    } else if reason.starts_with("missing field") {
        "missing_field"
    } else if reason.contains("`ts`") || reason.contains("UTF-8") {
        "bad_timestamp"
    } else if reason.contains("not best first") {
        "book_not_best_first"
    } else if reason.contains("characters long")
        || reason.contains("is empty")
        || reason.contains("may not contain")
    {
        "bad_id"
    } else {
        "out_of_range"
    }
}
