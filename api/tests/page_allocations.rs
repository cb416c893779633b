//! A history page is encoded with one allocation, its body: written into
//! its thread's buffer, room reserved up front, then copied once at its
//! exact size; no copy of the points into wire structs, no regrowth. The
//! serde path it replaced (points copied into the documented types, then
//! `serde_json::to_vec`) is counted beside it for scale.

use hindsight_api::page::{self, Meta};
use hindsight_contracts::PricePoint;
use hindsight_schemas::api::{PageMetadata, TokenPricesResponse};
use hindsight_schemas::{IsoTime, Timestamp};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct Counting;

thread_local! {
    static COUNT: Cell<Option<usize>> = const { Cell::new(None) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        COUNT.with(|c| c.set(c.get().map(|n| n + 1)));
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, size: usize) -> *mut u8 {
        COUNT.with(|c| c.set(c.get().map(|n| n + 1)));
        unsafe { System.realloc(ptr, layout, size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Allocations (and reallocations) `f` makes on this thread.
fn allocations<T>(f: impl FnOnce() -> T) -> (usize, T) {
    COUNT.with(|c| c.set(Some(0)));
    let out = f();
    let n = COUNT.with(|c| c.replace(None)).unwrap();
    (n, out)
}

#[test]
fn a_200_point_page_is_encoded_with_one_allocation() {
    let points: Vec<PricePoint> = (0..200)
        .map(|i| PricePoint {
            t: Timestamp(1_756_684_800_000 + i * 60_000),
            p: 1.0 / (i as f64 + 3.0),
        })
        .collect();
    let cursor = "h00000199048f5a8045a1c2b3d4e5f60718293a4b".to_string();
    let head = [
        ("market_id", "m1"),
        ("token_id", "t1"),
        ("token_label", "Yes"),
        ("resolution", "1m"),
    ];
    let meta = Meta {
        count: 200,
        limit: 200,
        next_cursor: Some(cursor.clone()),
    };
    // The thread's buffer is allocated by its first page, and kept.
    let (first, _) = allocations(|| page::series(&head, &points, &meta, true).unwrap());
    assert_eq!(first, 2, "the thread's buffer and the body");
    let (ours, page) = allocations(|| page::series(&head, &points, &meta, true).unwrap());
    let (serde, bytes) = allocations(|| {
        serde_json::to_vec(&TokenPricesResponse {
            market_id: "m1".into(),
            token_id: "t1".into(),
            token_label: "Yes".into(),
            resolution: "1m".into(),
            data: points
                .iter()
                .map(|p| hindsight_schemas::api::PricePoint {
                    t: IsoTime(p.t),
                    p: p.p,
                    filled: false,
                })
                .collect(),
            metadata: PageMetadata {
                count: 200,
                limit: 200,
                next_cursor: Some(cursor.clone()),
            },
        })
        .unwrap()
    });
    drop(page);
    println!(
        "200-point page: {ours} allocation(s); the serde path: {serde} ({} bytes)",
        bytes.len()
    );
    assert_eq!(ours, 1, "the page's body, and nothing else");
    assert!(serde > ours);
}
