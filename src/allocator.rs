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
//! Why a purge delay of 10 ms rather than mimalloc's 1 s for a service:
//! memory a step freed is handed back to the system 10 ms later instead of
//! a second later, by which time the next step has allocated its own. Over
//! 20 s of live sending, peak RSS was 978–987 MB with 1 s, 774 MB with
//! 100 ms, 704 MB with 10 ms and 687 MB with 0 (glibc: 691–699 MB), at the
//! same events/s; at 0 a long-tail backfill spent ~0.5 s more in the kernel.
//!
//! Why mimalloc's own 1 s for a batch command (`backfill`, `rebuild`): it
//! runs flat out and exits, so memory handed back between two steps is
//! only faulted in and zeroed again by the next one, a step later
//! (100–300 ms). Kept longer than a step, the next step reuses it. On the
//! `shapes` files, alternated with 10 ms, 250 ms halved a `backfill
//! --project`'s page faults and made it ~5 % faster, for ~20–30 MB more
//! at peak on the dense file and ~60–70 MB on the long tail. With 16 KiB
//! store pages, where the kernel's page faults were still ~8 % of a
//! long-tail `backfill --project`'s samples, 1 s against 250 ms
//! (alternated three times): long tail 1.46–1.49 s against 1.53–1.58,
//! dense 0.51–0.55 s against 0.53–0.58, peak RSS 423–460 MB against
//! 382–415 and 154–165 MB against 127–156 (docs/DESIGN.md, "The global
//! allocator is mimalloc", has the figures).
//!
//! Why no transparent huge pages: mimalloc asks the kernel for them on the
//! memory it maps (`madvise`), so where the system allows them on request
//! (Debian's default) a fault zeroes 2 MiB at once and memory is purged in
//! 2 MiB pieces. A long-tail rebuild faulted in ~410 of them (820 MB) for a
//! peak of 330 MB. With them off (`PR_SET_THP_DISABLE`, and mimalloc's
//! option), over 60 s of live sending to 100 000 tokens the peak RSS was
//! 494 MB against 548 at the same events/s (the full 100 M-tick run peaked
//! at 647 against 633, within its noise). The flag is inherited through
//! `exec`, so the benchmarks give their anchors the system's policy back
//! ([`with_system_thp`]).

use std::os::raw::c_int;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mi_option_purge_delay` in mimalloc.h (`mimalloc` 2 and 3 alike), which
/// `libmimalloc-sys` does not name.
const MI_OPTION_PURGE_DELAY: c_int = 15;

/// What the process runs, which sets how soon mimalloc hands the memory
/// it freed back to the system (see the module's doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// A long-running service: memory goes back 10 ms after it is freed,
    /// so a process that drained a backlog or served a burst shrinks.
    Service,
    /// A command that runs its steps back to back and exits (`backfill`,
    /// `rebuild`): memory is kept 1 s, past the next steps' allocations.
    Batch,
}

impl Workload {
    /// Milliseconds before mimalloc hands freed memory back to the system.
    pub fn purge_delay_ms(self) -> i64 {
        match self {
            Workload::Service => 10,
            Workload::Batch => 1000,
        }
    }
}

/// `mi_option_allow_thp` in mimalloc 3's mimalloc.h, which
/// `libmimalloc-sys` does not name either.
const MI_OPTION_ALLOW_THP: c_int = 43;

/// Tunes both allocators for `workload`, unless the environment already
/// sets the parameter (`MIMALLOC_PURGE_DELAY`, `MALLOC_ARENA_MAX`,
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
pub fn tune_malloc(workload: Workload) {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: sets one of mimalloc's options, which it reads when it
        // next purges.
        unsafe {
            libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, workload.purge_delay_ms() as _);
        }
    }
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_none() {
        // SAFETY: sets one of mimalloc's options, which it reads when it
        // next maps memory from the system.
        unsafe {
            libmimalloc_sys::mi_option_set(MI_OPTION_ALLOW_THP, 0);
        }
        // mimalloc asked for huge pages on the memory it mapped before
        // `main`; the option covers only what it maps from now on.
        #[cfg(target_os = "linux")]
        // SAFETY: sets a flag of this process; it fails only on a kernel
        // without it, which leaves huge pages as they were.
        unsafe {
            libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
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

/// Gives a child process back the system's huge-page policy, which
/// [`tune_malloc`] turned off for this process and which a child inherits
/// through `exec`: the benchmarks' anchors (DuckDB, ClickHouse, nginx) run
/// as they would on their own.
pub fn with_system_thp(command: &mut std::process::Command) -> &mut std::process::Command {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: between fork and exec the hook only makes one system
        // call, which allocates nothing and takes no lock.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_THP_DISABLE, 0, 0, 0, 0);
                Ok(())
            });
        }
    }
    command
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
    use std::sync::Mutex;

    /// Held by each test that tunes the allocators: the options are the
    /// process's, and the test harness runs tests on parallel threads, so
    /// one test's `tune_malloc(Service)` could land between another's
    /// `tune_malloc(Batch)` and its read-back (CI saw 10 for `Batch`).
    static TUNING: Mutex<()> = Mutex::new(());

    /// The option index is mimalloc.h's, which no binding names: the
    /// purge delay is the option whose default is 1 000 ms (mimalloc 3),
    /// and setting it through the index reads back, each workload's own.
    #[test]
    fn the_purge_delay_option_is_the_one_set() {
        let _tuning = TUNING.lock().unwrap_or_else(|e| e.into_inner());
        let delays = [Workload::Service, Workload::Batch].map(Workload::purge_delay_ms);
        // SAFETY: reads and sets an option of the allocator.
        unsafe {
            if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
                let before = libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) as i64;
                assert!(
                    before == 1000 || delays.contains(&before),
                    "option {MI_OPTION_PURGE_DELAY} is {before}, not the purge delay"
                );
            }
            for workload in [Workload::Batch, Workload::Service] {
                tune_malloc(workload);
                let after = libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) as i64;
                let want = std::env::var("MIMALLOC_PURGE_DELAY")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(workload.purge_delay_ms());
                assert_eq!(after, want, "{workload:?}");
            }
        }
    }

    /// `THP_enabled` of a process's `/proc/…/status`.
    fn thp_enabled(status: &str) -> Option<&str> {
        status
            .lines()
            .find_map(|l| l.strip_prefix("THP_enabled:"))
            .map(str::trim)
    }

    /// Tuned (with no `MIMALLOC_ALLOW_THP` set), this process has huge
    /// pages off, through mimalloc's option (whose index no binding names)
    /// and the process's flag; a child inherits the flag, unless given the
    /// system's policy back.
    #[test]
    #[cfg(target_os = "linux")]
    fn huge_pages_are_off_here_and_given_back_to_an_anchor() {
        use std::process::Command;
        let _tuning = TUNING.lock().unwrap_or_else(|e| e.into_inner());
        tune_malloc(Workload::Service);
        // SAFETY: reads an option of the allocator.
        let option = unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_ALLOW_THP) };
        assert_eq!(option, 0, "option {MI_OPTION_ALLOW_THP}");
        let own = std::fs::read_to_string("/proc/self/status").unwrap();
        assert_eq!(thp_enabled(&own), Some("0"));
        let status = |command: &mut Command| {
            let out = command.arg("/proc/self/status").output().unwrap();
            String::from_utf8(out.stdout).unwrap()
        };
        assert_eq!(thp_enabled(&status(&mut Command::new("cat"))), Some("0"));
        let anchor = status(with_system_thp(&mut Command::new("cat")));
        assert_eq!(thp_enabled(&anchor), Some("1"));
    }
}
