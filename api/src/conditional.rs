//! `If-None-Match` (RFC 9110 §13.1.2): a `200` whose `ETag` the client
//! already holds becomes a `304` with the same validators and caching
//! headers and no body.
//!
//! One layer for every route: a handler opts in by setting `ETag` (the
//! history pages do). The request has been authenticated, metered and
//! answered in full before the comparison, so a `304` is counted, limited
//! and refused exactly like the `200` it replaces; errors are never turned
//! into a `304`.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::Response;

/// The middleware: runs the route, then compares.
pub async fn not_modified(request: Request, next: Next) -> Response {
    let conditions: Vec<_> = request
        .headers()
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .cloned()
        .collect();
    let response = next.run(request).await;
    if conditions.is_empty() || response.status() != StatusCode::OK {
        return response;
    }
    let Some(etag) = response
        .headers()
        .get(header::ETAG)
        .and_then(|v| v.to_str().ok())
    else {
        return response;
    };
    let matched = conditions
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|list| matches_any(list, etag));
    if !matched {
        return response;
    }
    let (parts, _) = response.into_parts();
    let mut headers = parts.headers;
    strip_content_headers(&mut headers);
    let mut answer = Response::new(Body::empty());
    *answer.status_mut() = StatusCode::NOT_MODIFIED;
    *answer.headers_mut() = headers;
    *answer.extensions_mut() = parts.extensions;
    answer
}

/// A 304 carries the 200's `ETag`, `Cache-Control`, `Vary` (and the rate
/// headers), but describes no body of its own.
fn strip_content_headers(headers: &mut HeaderMap) {
    headers.remove(header::CONTENT_TYPE);
    headers.remove(header::CONTENT_LENGTH);
}

/// Whether one `If-None-Match` field value (`*`, or a list of entity tags)
/// matches `etag` by the weak comparison: `W/` prefixes are ignored, the
/// opaque tags must be equal. A list that does not parse matches nothing
/// after the point it breaks, so a malformed header costs a full answer,
/// never a wrong `304`.
pub fn matches_any(list: &str, etag: &str) -> bool {
    let ours = opaque(etag);
    let mut rest = list;
    loop {
        rest = rest.trim_start_matches([' ', '\t', ',']);
        if rest.is_empty() {
            return false;
        }
        if rest.starts_with('*') {
            // Any current representation: there is one, this is a 200.
            return true;
        }
        let tagged = rest.strip_prefix("W/").unwrap_or(rest);
        let Some(quoted) = tagged.strip_prefix('"') else {
            return false;
        };
        let Some(close) = quoted.find('"') else {
            return false;
        };
        if Some(&quoted[..close]) == ours {
            return true;
        }
        rest = &quoted[close + 1..];
        if !(rest.is_empty() || rest.starts_with([' ', '\t', ','])) {
            return false;
        }
    }
}

/// The opaque part of an entity tag: between the quotes, without `W/`.
fn opaque(etag: &str) -> Option<&str> {
    etag.strip_prefix("W/")
        .unwrap_or(etag)
        .strip_prefix('"')?
        .strip_suffix('"')
}

#[cfg(test)]
mod tests {
    use super::matches_any as matches;

    const TAG: &str = "\"0af3\"";

    #[test]
    fn if_none_match_uses_the_weak_comparison_over_lists_and_star() {
        for list in [
            "\"0af3\"",
            "W/\"0af3\"",
            "\"x\", \"0af3\"",
            "\"x\",W/\"0af3\" ,\"y\"",
            "*",
            " \t*",
            ", ,\"0af3\"",
        ] {
            assert!(matches(list, TAG), "{list}");
        }
        assert!(matches("\"0af3\"", "W/\"0af3\""), "weak on our side too");
        for list in [
            "",
            "\"0af\"",
            "\"0af3",
            "0af3",
            "\"0AF3\"",
            "w/\"0af3\"",
            "\"x\"\"0af3\"",
            "\"x\" junk, \"0af3\"",
            "\"a,b\"",
        ] {
            assert!(!matches(list, TAG), "{list}");
        }
        assert!(matches("\"a,b\", \"0af3\"", TAG), "a comma inside a tag");
    }
}
