//! The process's allocator, tuned once before any thread starts.

/// Caps glibc's malloc at two arenas (unless `MALLOC_ARENA_MAX` is set).
///
/// Why: glibc gives threads that allocate at once arenas of their own, up
/// to eight per core, and memory freed into one arena is reused only by
/// threads allocating from it. A projector step's events are decoded on a
/// blocking thread, folded on a runtime worker and dropped with their
/// write on another, so freed events piled up in arenas the next decode
/// did not use. On the live benchmark's drain of 20 000 tokens (`-- live`,
/// 15 s of sending), peak RSS was 1 156 MB with the default and 625–761 MB
/// with two arenas, at the same events/s.
pub fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: mallopt only sets a parameter of the allocator; it is
        // called before any other thread exists.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 2);
        }
    }
}
