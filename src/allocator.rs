//! The process's allocators, tuned once before any thread starts.
//!
//! Rust's heap is mimalloc's (the global allocator below); SQLite's page
//! caches and zstd's contexts are allocated by glibc's malloc, tuned here
//! too.
//!
//! Why mimalloc: a step's events, rows and ticks are allocated and freed by
//! the hundred thousand, on different threads (decoded on a blocking
//! thread, folded on a runtime worker, dropped with their write on
//! another). With glibc's malloc a dense `backfill --project` spent about a
//! quarter of its CPU in malloc and free (`perf`: `_int_malloc`,
//! `_int_free`, `malloc_consolidate`, `unlink_chunk`). Measured against
//! glibc tuned as below, alternated (`hindsight-bench shapes` files,
//! `live` over 20 s on 20 000 tokens), see docs/DESIGN.md, "The global
//! allocator is mimalloc".
//!
//! Why a purge delay of 10 ms rather than mimalloc's 1 s: memory a step
//! freed is handed back to the system 10 ms later instead of a second
//! later, by which time the next step has allocated its own. Over 20 s of
//! live sending, peak RSS was 978–987 MB with 1 s, 774 MB with 100 ms,
//! 704 MB with 10 ms and 687 MB with 0 (glibc: 691–699 MB), at the same
//! events/s; at 0 a long-tail backfill spent ~0.5 s more in the kernel.

use std::os::raw::c_int;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mi_option_purge_delay` in mimalloc.h (`mimalloc` 2 and 3 alike), which
/// `libmimalloc-sys` does not name.
const MI_OPTION_PURGE_DELAY: c_int = 15;

/// Milliseconds before mimalloc hands freed memory back to the system.
const PURGE_DELAY_MS: i64 = 10;

/// Tunes both allocators, unless the environment already sets the
/// parameter (`MIMALLOC_PURGE_DELAY`, `MALLOC_ARENA_MAX`,
/// `MALLOC_MMAP_THRESHOLD_`): mimalloc's purge delay (above), and glibc's
/// malloc, which SQLite's page caches use, to two arenas with blocks of
/// 4 MiB and more mapped on their own.
///
/// Why two arenas: glibc gives threads that allocate at once arenas of
/// their own, up to eight per core, and memory freed into one arena is
/// reused only by threads allocating from it. While Rust's heap was
/// glibc's too, a projector step's events piled up in arenas the next
/// decode did not use: on the live benchmark's drain of 20 000 tokens,
/// peak RSS was 1 156 MB with the default and 625–761 MB with two arenas.
///
/// Why a fixed mmap threshold: glibc raises its threshold (up to 32 MiB)
/// each time a mapped block is freed, so after the first steps mid-sized
/// buffers came from the arenas, where what a step freed stayed in the
/// process among live small allocations; mapped, they go back to the
/// system when freed (measured while Rust's heap was glibc's: peak RSS
/// 747–784 MB with glibc's default, 690–719 MB at 4 MiB over 20 s of live
/// sending). 128 KiB made a backfill's parse buffers mapped and faulted in
/// afresh.
pub fn tune_malloc() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: sets one of mimalloc's options, which it reads when it
        // next purges.
        unsafe {
            libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS as _);
        }
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only sets a parameter of the allocator; it is
        // called before any other thread exists.
        if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
            unsafe {
                libc::mallopt(libc::M_ARENA_MAX, 2);
            }
        }
        if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_none() {
            unsafe {
                libc::mallopt(libc::M_MMAP_THRESHOLD, 4 << 20);
            }
        }
    }
}

/// Hands both allocators' free memory back to the system (mimalloc's
/// `mi_collect`, glibc's `malloc_trim`): the projector calls it once a
/// backlog is drained ([`hindsight_projector::ProjectorConfig::release_memory`]).
/// Freed memory is otherwise kept for reuse, so a process that drained a
/// backlog stayed near its peak while idle: `hindsight projector` catching
/// up a backfilled long-tail log of 2 000 000 ticks into an empty store sat
/// at 417 MB 10 s later (peak 556 MB) before this and the 4 MiB threshold,
/// and at 207 MB (peak 524 MB) with both; a call took ~20 ms (both
/// measured while Rust's heap was glibc's).
pub fn release_free_memory() {
    // SAFETY: mi_collect frees what the calling thread's heap holds unused
    // and purges what is due; any thread may call it at any time.
    unsafe {
        libmimalloc_sys::mi_collect(true);
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes the allocator's own locks; any thread may
    // call it at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The option index is mimalloc.h's, which no binding names: the
    /// purge delay is the option whose default is 1 000 ms (mimalloc 3),
    /// and setting it through the index reads back.
    #[test]
    fn the_purge_delay_option_is_the_one_set() {
        // SAFETY: reads and sets an option of the allocator.
        unsafe {
            if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
                let before = libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) as i64;
                assert!(
                    before == 1000 || before == PURGE_DELAY_MS,
                    "option {MI_OPTION_PURGE_DELAY} is {before}, not the purge delay"
                );
            }
            tune_malloc();
            let after = libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) as i64;
            let want = std::env::var("MIMALLOC_PURGE_DELAY")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(PURGE_DELAY_MS);
            assert_eq!(after, want);
        }
    }
}
