//! Splitting and validating one NDJSON body.

use crate::catalog::BatchClaims;
use hindsight_schemas::claims::Claims;
use hindsight_schemas::wire::{self, Limits, Reject};
use hindsight_schemas::{Event, EventKind, Timestamp};
use hindsight_telemetry as tm;
use serde::{Serialize, Serializer};

/// A refused line: its 1-based number in the body and why. On the wire
/// (the HTTP response, the backfill rejects file) the reason is its text.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Rejected {
    pub line: u64,
    #[serde(serialize_with = "as_text")]
    pub reason: Reject,
}

fn as_text<S: Serializer>(reason: &Reject, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(reason)
}

#[derive(Debug, Default)]
pub struct Validated {
    pub events: Vec<Event>,
    /// The first `max_listed` rejects (see [`validate`]).
    pub rejected: Vec<Rejected>,
    /// Every reject, listed or not.
    pub rejected_count: usize,
}

/// The UTF-8 byte order mark some editors and exporters put first.
const BOM: &[u8] = b"\xEF\xBB\xBF";

/// Validates every non-blank line; `first_line` numbers the first line of
/// `body` (1 for an HTTP body or the start of a file, later for a chunk of
/// a file). A UTF-8 byte order mark that starts the stream is skipped: it
/// says "this is UTF-8", which NDJSON is anyway.
///
/// Every reject is counted, but only the first `max_listed` are kept, so
/// the answer to a huge all-invalid batch stays small (HTTP lists a few;
/// a backfill writes them all to its rejects file).
///
/// A valid line is also checked against the catalog (`catalog`, what the
/// read store holds, and `claims`, what the accepted lines before it
/// claimed): a tick under another market than its token's, a market taking
/// another market's token or slug, are refused like any bad line.
pub fn validate(
    body: &[u8],
    first_line: u64,
    now: Timestamp,
    limits: &Limits,
    max_listed: usize,
    catalog: &dyn Claims,
    claims: &mut BatchClaims,
) -> Validated {
    let body = match body.strip_prefix(BOM) {
        Some(rest) if first_line == 1 => rest,
        _ => body,
    };
    // As many events as lines, at most: filled without growing. No line
    // of an event is shorter than `kind` and its value alone, so a body of
    // blank lines does not reserve room for millions.
    let lines = memchr::memchr_iter(b'\n', body).count() + 1;
    let room = lines.min(body.len() / r#"{"kind":"price"}"#.len() + 1);
    let mut out = Validated {
        events: Vec::with_capacity(room),
        ..Validated::default()
    };
    // Lines are found with `memchr` and the body is checked as UTF-8 in
    // one pass; a line at a time only when some line is not UTF-8. (A byte
    // at a time, splitting, counting and checking each line were a sixth
    // of validating a body of ticks.)
    let text = std::str::from_utf8(body).ok();
    let ends = memchr::memchr_iter(b'\n', body).chain([body.len()]);
    let mut start = 0;
    for (i, end) in ends.enumerate() {
        let (from, line) = (start, &body[start..end]);
        start = end + 1;
        let text = match text {
            // Both ends are at a newline or the body's ends: char boundaries.
            Some(all) => Ok(&all[from..end]),
            None => std::str::from_utf8(line),
        };
        let parsed = match text {
            Ok(text) if text.trim().is_empty() => continue,
            Ok(text) => wire::parse_line_with(text.trim_end_matches('\r'), now, limits)
                .and_then(|event| claims.check(catalog, &event).map(|()| event)),
            Err(e) => Err(Reject::not_utf8(e)),
        };
        match parsed {
            Ok(event) => out.events.push(event),
            Err(reason) => {
                metrics::counter!(tm::INGEST_EVENTS_REJECTED, "reason" => reason.kind().label())
                    .increment(1);
                out.rejected_count += 1;
                if out.rejected.len() < max_listed {
                    out.rejected.push(Rejected {
                        line: first_line + i as u64,
                        reason,
                    });
                }
            }
        }
    }
    out
}

/// Events per kind, indexed by the kind's tag (tags start at 1).
pub type KindCounts = [u64; EventKind::ALL.len() + 1];

pub fn kind_counts(events: &[Event]) -> KindCounts {
    let mut per_kind = [0u64; EventKind::ALL.len() + 1];
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

#[cfg(test)]
mod tests {
    use super::*;
    use hindsight_schemas::claims::Lookups;
    use metrics_exporter_prometheus::PrometheusBuilder;

    const NOW: Timestamp = Timestamp(1_760_000_000_000);

    /// Validates `body` under a recorder of its own; returns the result and
    /// the rendered metrics.
    fn validate_counted(body: &[u8]) -> (Validated, String) {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let out = metrics::with_local_recorder(&recorder, || {
            validate(
                body,
                1,
                NOW,
                &Limits::default(),
                usize::MAX,
                &Lookups::default(),
                &mut BatchClaims::default(),
            )
        });
        (out, handle.render())
    }

    fn rejected_count(metrics: &str, reason: &str) -> Option<f64> {
        let prefix = format!("{}{{reason=\"{reason}\"}} ", tm::INGEST_EVENTS_REJECTED);
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .map(|v| v.parse().unwrap())
    }

    #[test]
    fn a_line_that_is_not_utf8_is_counted_as_not_utf8_and_its_neighbours_kept() {
        let body = b"{\"kind\":\"price\",\"market_id\":\"m\xff\"}\n{\"kind\":\"price\",\"market_id\":\"m1\",\"token_id\":\"t1\",\"ts\":1756684830,\"p\":0.5}\n";
        let (out, metrics) = validate_counted(body);
        assert_eq!(out.events.len(), 1);
        assert_eq!(out.rejected.len(), 1);
        assert_eq!(out.rejected[0].line, 1);
        assert_eq!(out.rejected[0].reason.kind().label(), "not_utf8");
        assert_eq!(rejected_count(&metrics, "not_utf8"), Some(1.0), "{metrics}");
        assert_eq!(rejected_count(&metrics, "bad_timestamp"), None, "{metrics}");
    }

    #[test]
    fn each_reject_is_counted_once_under_its_kind_label() {
        let body = concat!(
            "{oops\n",
            "\n",
            "{\"kind\":\"quote\"}\n",
            "{\"kind\":\"price\",\"market_id\":\"m1\",\"token_id\":\"t1\",\"ts\":\"soon\",\"p\":0.5}\n",
            "{\"kind\":\"price\",\"market_id\":\"m1\",\"token_id\":\"t1\",\"ts\":1756684830,\"p\":2}\n",
            "{\"kind\":\"price\",\"market_id\":\"m1\",\"token_id\":\"t1\",\"ts\":1756684830,\"p\":3}\n",
        );
        let (out, metrics) = validate_counted(body.as_bytes());
        let lines: Vec<u64> = out.rejected.iter().map(|r| r.line).collect();
        assert_eq!(
            lines,
            [1, 3, 4, 5, 6],
            "the blank line 2 is skipped, not rejected"
        );
        for (label, n) in [
            ("malformed_json", 1.0),
            ("unknown_kind", 1.0),
            ("bad_timestamp", 1.0),
            ("out_of_range", 2.0),
        ] {
            assert_eq!(
                rejected_count(&metrics, label),
                Some(n),
                "{label}: {metrics}"
            );
        }
    }

    #[test]
    fn a_reject_serializes_as_its_line_and_text() {
        let (out, _) = validate_counted(b"{\"kind\":\"quote\"}");
        let json = serde_json::to_value(&out.rejected[0]).unwrap();
        assert_eq!(json["line"], 1);
        assert!(json["reason"]
            .as_str()
            .unwrap()
            .starts_with("unknown kind `quote`"));
    }
}
