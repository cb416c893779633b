//! The bounds issue 12 put on ingest lines, each refused with a reason
//! that names the field and the limit. Only `parse_line` (default limits)
//! is used, so each test states what the shipped defaults guarantee.

use hindsight_schemas::wire::parse_line;
use hindsight_schemas::Timestamp;

/// 2025-10-09T08:53:20Z.
const NOW: Timestamp = Timestamp(1_760_000_000_000);

fn refused(line: &str) -> (String, Option<String>, String) {
    let r = parse_line(line, NOW).expect_err(line);
    (
        r.kind().label().to_string(),
        r.field_name().map(str::to_string),
        r.to_string(),
    )
}

fn metrics(volume: &str) -> String {
    format!(
        r#"{{"kind":"metrics","market_id":"m1","ts":1756684830,"volume":{volume},"liquidity":1,"spread":0.01}}"#
    )
}

#[test]
fn metric_values_that_could_overflow_a_bucket_sum_are_refused_as_out_of_range() {
    let (kind, field, text) = refused(&metrics("1.7e308"));
    assert_eq!(
        (kind.as_str(), field.as_deref()),
        ("out_of_range", Some("volume"))
    );
    assert!(text.contains("largest accepted value, 1e15"), "{text}");
    // The bound itself is accepted, and a bucket of such values stays finite.
    assert!(parse_line(&metrics("1e15"), NOW).is_ok());
}

#[test]
fn timestamps_beyond_the_allowed_skew_are_refused_as_in_the_future() {
    let price = |ts: i64| {
        format!(r#"{{"kind":"price","market_id":"m1","token_id":"t1","ts":{ts},"p":0.5}}"#)
    };
    let now_s = NOW.millis() / 1000;
    // Within 5 minutes: clock skew, accepted.
    assert!(parse_line(&price(now_s + 299), NOW).is_ok());
    let (kind, field, text) = refused(&price(now_s + 301));
    assert_eq!(
        (kind.as_str(), field.as_deref()),
        ("in_the_future", Some("ts"))
    );
    assert!(text.contains("allowed clock skew"), "{text}");
    let (kind, field, _) = refused(&price(4_000_000_000)); // 2096
    assert_eq!(
        (kind.as_str(), field.as_deref()),
        ("in_the_future", Some("ts"))
    );
    // A catalog version from the future could never be superseded.
    let series =
        r#"{"kind":"series","id":"s1","slug":"s","title":"S","updated_at":"2099-12-31T00:00:00Z"}"#;
    let (kind, field, _) = refused(series);
    assert_eq!(
        (kind.as_str(), field.as_deref()),
        ("in_the_future", Some("updated_at"))
    );
    // Dates that legitimately lie ahead are not versions.
    let ends_later =
        r#"{"kind":"event","id":"e1","slug":"e","title":"E","end_date":"2099-12-31T00:00:00Z"}"#;
    assert!(parse_line(ends_later, NOW).is_ok());
}

#[test]
fn a_json_line_that_is_not_an_object_says_expected_a_json_object() {
    for (line, found) in [
        (r#""hello""#, "a string"),
        ("[1]", "an array"),
        ("42", "a number"),
    ] {
        let (kind, _, text) = refused(line);
        assert_eq!(kind, "malformed_json");
        assert_eq!(
            text,
            format!("malformed JSON: expected a JSON object, found {found}")
        );
        assert!(!text.contains("WireLine"), "{text}");
    }
}

#[test]
fn a_book_side_deeper_than_1000_levels_is_refused() {
    let book = |n: usize| {
        let bids: Vec<String> = (0..n)
            .map(|i| format!("[{},1]", 0.9 - i as f64 * 1e-6))
            .collect();
        format!(
            r#"{{"kind":"book","market_id":"m1","token_id":"t1","ts":1756684830,"bids":[{}],"asks":[]}}"#,
            bids.join(",")
        )
    };
    assert!(parse_line(&book(1000), NOW).is_ok());
    let (kind, field, text) = refused(&book(1001));
    assert_eq!(
        (kind.as_str(), field.as_deref()),
        ("too_long", Some("bids"))
    );
    assert!(
        text.contains("1001 levels; at most 1000 per side"),
        "{text}"
    );
}

#[test]
fn ids_with_zero_width_or_bidi_characters_are_refused_as_bad_id() {
    for c in ['\u{200B}', '\u{200D}', '\u{202E}', '\u{2066}', '\u{FEFF}'] {
        let line = format!(
            r#"{{"kind":"price","market_id":"m{c}1","token_id":"t1","ts":1756684830,"p":0.5}}"#
        );
        let (kind, field, text) = refused(&line);
        assert_eq!(
            (kind.as_str(), field.as_deref()),
            ("bad_id", Some("market_id")),
            "{text}"
        );
        let slug = format!(r#"{{"kind":"series","id":"s1","slug":"a{c}b","title":"S"}}"#);
        assert_eq!(refused(&slug).0, "bad_id");
    }
}

#[test]
fn titles_texts_and_tag_lists_are_capped() {
    let title = format!(
        r#"{{"kind":"series","id":"s1","slug":"s","title":"{}"}}"#,
        "t".repeat(1001)
    );
    let (kind, field, text) = refused(&title);
    assert_eq!(
        (kind.as_str(), field.as_deref()),
        ("too_long", Some("title"))
    );
    assert!(text.contains("at most 1000"), "{text}");
    let market = |extra: &str| {
        format!(
            r#"{{"kind":"market","id":"m1","slug":"s","status":"open","tokens":[{{"id":"t1","label":"Yes"}}]{extra}}}"#
        )
    };
    let q = market(&format!(r#","question":"{}""#, "q".repeat(1001)));
    assert_eq!(refused(&q).1.as_deref(), Some("question"));
    let d = market(&format!(r#","description":"{}""#, "d".repeat(10_001)));
    assert_eq!(refused(&d).1.as_deref(), Some("description"));
    assert!(parse_line(
        &market(&format!(r#","description":"{}""#, "d".repeat(10_000))),
        NOW
    )
    .is_ok());
    let tags: Vec<String> = (0..51).map(|i| format!("\"t{i}\"")).collect();
    let many = format!(
        r#"{{"kind":"event","id":"e1","slug":"e","title":"E","tags":[{}]}}"#,
        tags.join(",")
    );
    let (kind, field, text) = refused(&many);
    assert_eq!(
        (kind.as_str(), field.as_deref()),
        ("too_long", Some("tags"))
    );
    assert!(text.contains("51 tags; at most 50"), "{text}");
}

#[test]
fn unix_seconds_of_1e20_are_reported_by_their_value_not_as_i64_max() {
    let line = r#"{"kind":"price","market_id":"m1","token_id":"t1","ts":1e20,"p":0.5}"#;
    let (kind, field, text) = refused(line);
    assert_eq!(
        (kind.as_str(), field.as_deref()),
        ("bad_timestamp", Some("ts"))
    );
    assert!(
        text.contains("100000000000000000000 is out of range"),
        "{text}"
    );
    assert!(!text.contains("+292"), "{text}");
}
