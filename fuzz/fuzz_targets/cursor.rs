//! Pagination cursors (`api/src/cursor.rs`) under arbitrary input. A cursor
//! is sealed: a MAC under the API's secret over its position and the request
//! it continues (route, series, range and resolution; a list's sort, order
//! and filters), in lowercase hex. Each input is used twice:
//!
//! - as cursor text, opened by pagers of several secrets and scopes: never a
//!   panic, and what a pager accepts is exactly the text it writes for that
//!   position (anything else, a forgery or another spelling, is refused);
//! - as a position (a history bucket start; a list's sort key and id):
//!   written by the API's pager, it opens to the same position there and
//!   under a rotated secret list, and is refused by every other secret,
//!   route and scope, by the other kind of cursor, and after an edit of one
//!   character, a cut or an extension at the place the input picks.
#![no_main]

use hindsight_api::cursor::{CursorKeys, ListCursor, Pager, Scope};
use hindsight_schemas::Timestamp;
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

/// The API's secret (the committed seed cursors are signed with it).
const SECRET: &str = "hindsight-fuzz-cursor-secret-0123456789abcdef";
const OTHER: &str = "another-secret-than-the-apis-0123456789abcdef";

fn prices(id: &str, end_ts: &str, resolution: &str) -> Scope {
    Scope::new("/v1/tokens/{token_id}/prices")
        .with("id", id)
        .with("start_ts", "1756684800000")
        .with("end_ts", end_ts)
        .with("resolution", resolution)
}

fn markets(order: &str, event_id: &str) -> Scope {
    Scope::new("/v1/markets")
        .with("sort", "updated_at")
        .with("order", order)
        .with("event_id", event_id)
}

struct Pagers {
    /// The API's history and list pagers the seeds were written by.
    history: Pager,
    list: Pager,
    /// The same, after a rotation: a new secret signs, the API's verifies.
    rotated: [Pager; 2],
    /// Another secret, or another series, range, resolution, route, order
    /// or filter: none of them may open the API's cursors.
    others: Vec<Pager>,
}

fn pagers() -> &'static Pagers {
    static PAGERS: OnceLock<Pagers> = OnceLock::new();
    PAGERS.get_or_init(|| {
        let api = CursorKeys::new(&[SECRET]).unwrap();
        let other = CursorKeys::new(&[OTHER]).unwrap();
        let rotated = CursorKeys::new(&[OTHER, SECRET]).unwrap();
        let history = || prices("t1", "1756771200000", "1h");
        let list = || markets("desc", "");
        let pager = |keys: &CursorKeys, scope| Pager::new(keys.clone(), scope);
        Pagers {
            history: pager(&api, history()),
            list: pager(&api, list()),
            rotated: [pager(&rotated, history()), pager(&rotated, list())],
            others: vec![
                pager(&other, history()),
                pager(&other, list()),
                pager(&api, prices("t2", "1756771200000", "1h")),
                pager(&api, prices("t1", "1756771200001", "1h")),
                pager(&api, prices("t1", "1756771200000", "1m")),
                pager(
                    &api,
                    Scope::new("/v1/tokens/{token_id}/books")
                        .with("id", "t1")
                        .with("start_ts", "1756684800000")
                        .with("end_ts", "1756771200000")
                        .with("resolution", "1h"),
                ),
                pager(&api, markets("asc", "")),
                pager(&api, markets("desc", "e1")),
                pager(&api, Scope::new("/v1/events")),
            ],
        }
    })
}

/// Opened by `pager`, `text` is exactly what the pager writes for the
/// position it opened to.
fn accepts_only_its_own_text(pager: &Pager, text: &str) {
    if let Some(at) = pager.history_from(text) {
        assert_eq!(pager.history(at), text);
    }
    if let Some(after) = pager.list_after(text) {
        assert_eq!(pager.list(&after), text);
    }
}

fn opens(pager: &Pager, text: &str) -> bool {
    pager.history_from(text).is_some() || pager.list_after(text).is_some()
}

/// `cursor` (written by `writer`) opened nowhere else, and refused once
/// edited at the place `at` picks: `with` written over one character, cut
/// there, or `with` appended.
fn refused_elsewhere_and_edited(writer: &Pager, cursor: &str, at: usize, with: u8) {
    let p = pagers();
    for other in &p.others {
        assert!(!opens(other, cursor), "{cursor}");
    }
    let at = at % cursor.len();
    let with = char::from(with & 0x7f);
    let mut edited = cursor.to_string();
    edited.replace_range(at..at + 1, with.encode_utf8(&mut [0; 4]));
    let appended = format!("{cursor}{with}");
    for forged in [edited.as_str(), &cursor[..at], &appended] {
        if forged != cursor {
            assert!(!opens(writer, forged), "{cursor} edited to {forged}");
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let p = pagers();
    let text = String::from_utf8_lossy(data);
    for pager in [&p.history, &p.list].into_iter().chain(&p.others) {
        accepts_only_its_own_text(pager, &text);
    }

    // The input as a position: [at: 2][with: 1][flags: 1][key: 8][id...].
    let mut head = [0u8; 12];
    let n = data.len().min(12);
    head[..n].copy_from_slice(&data[..n]);
    let at = usize::from(u16::from_be_bytes([head[0], head[1]]));
    let (with, flags) = (head[2], head[3]);
    let key = i64::from_be_bytes(head[4..12].try_into().unwrap());
    let id = String::from_utf8_lossy(&data[n..]);

    let c = p.history.history(Timestamp(key));
    assert_eq!(p.history.history_from(&c), Some(Timestamp(key)));
    assert_eq!(p.rotated[0].history_from(&c), Some(Timestamp(key)));
    assert_eq!(p.list.list_after(&c), None);
    refused_elsewhere_and_edited(&p.history, &c, at, with);

    let position = ListCursor {
        key: (flags & 1 == 1).then_some(key),
        id: id.into_owned(),
    };
    let c = p.list.list(&position);
    assert_eq!(p.list.list_after(&c).as_ref(), Some(&position));
    assert_eq!(p.rotated[1].list_after(&c).as_ref(), Some(&position));
    assert_eq!(p.history.history_from(&c), None);
    refused_elsewhere_and_edited(&p.list, &c, at, with);
});
