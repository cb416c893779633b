//! Pagination cursor decoding (`api/src/cursor.rs`) on arbitrary text. A
//! cursor is opaque and sealed: whatever decodes must be exactly the text the
//! encoder writes for that position, so no hand-edited variant of a cursor
//! (other case, other digits spelling the same bytes) is accepted.
#![no_main]

use hindsight_api::cursor;
use libfuzzer_sys::fuzz_target;

/// Scopes the lists use (`ListQuery::scope`), and one no list uses.
const SCOPES: [&str; 4] = [
    "markets:updated_at:desc",
    "events:start_date:asc",
    "series:end_date:desc",
    "",
];

fuzz_target!(|text: &str| {
    if let Some(at) = cursor::decode_history(text) {
        assert_eq!(cursor::encode_history(at), text);
    }
    for scope in SCOPES {
        if let Some(position) = cursor::decode_list(scope, text) {
            assert_eq!(cursor::encode_list(scope, &position), text, "{scope}");
        }
    }
});
