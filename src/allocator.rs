//! The process's allocator, tuned once before any thread starts.

/// Tunes glibc's malloc for a projector's steps (unless `MALLOC_ARENA_MAX`
/// or `MALLOC_MMAP_THRESHOLD_` set these parameters): two arenas, and
/// blocks of 4 MiB and more mapped on their own.
///
/// Why two arenas: glibc gives threads that allocate at once arenas of
/// their own, up to eight per core, and memory freed into one arena is
/// reused only by threads allocating from it. A projector step's events
/// are decoded on a blocking thread, folded on a runtime worker and
/// dropped with their write on another, so freed events piled up in
/// arenas the next decode did not use. On the live benchmark's drain of
/// 20 000 tokens (`-- live`, 15 s of sending), peak RSS was 1 156 MB with
/// the default and 625–761 MB with two arenas, at the same events/s.
///
/// Why a fixed mmap threshold: glibc raises its threshold (up to 32 MiB)
/// each time a mapped block is freed, so after the first steps a step's
/// mid-sized buffers came from the arenas, where what a step freed stayed
/// in the process among live small allocations; mapped, they go back to
/// the system when freed. Over 20 s of sending to 20 000 tokens, then the
/// drain (`-- live`, two runs each), peak RSS was 747–784 MB with glibc's
/// default, 690–719 MB at 4 MiB and 646–662 MB at 128 KiB; over 100 000
/// tokens, 875–900, 796–828 and 753–787 MB. 128 KiB is not taken: a
/// backfill's parse buffers (a few MB each) were then mapped and faulted
/// in afresh, and a dense `backfill --project` spent 1.2–1.5 s in the
/// kernel instead of 0.5 (2.9–3.5 s against 2.2–2.8 s); at 4 MiB it took
/// 2.1–2.8 s.
pub fn tune_malloc() {
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

/// Hands the allocator's free memory back to the system (glibc's
/// `malloc_trim`): the projector calls it once a backlog is drained
/// ([`hindsight_projector::ProjectorConfig::release_memory`]). Freed
/// memory inside glibc's heaps is otherwise kept for reuse, so a process
/// that drained a backlog stayed near its peak while idle: `hindsight
/// projector` catching up a backfilled long-tail log of 2 000 000 ticks
/// into an empty store sat at 417 MB 10 s later (peak 556 MB) with neither
/// this nor the 4 MiB threshold, and at 207 MB (peak 524 MB) with both. A
/// call took ~20 ms.
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes the allocator's own locks; any thread may
    // call it at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}
