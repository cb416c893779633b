//! A hint to the CPU, shared by the two loops that walk a step's items
//! where they lie scattered in memory: the rollup's fold over its slots
//! (`hindsight-projector`) and the embedded store's merge of the rows the
//! fold drained (`hindsight-sqlite`). Both know a few items ahead what
//! they will read; asked for them at once, the CPU waits for several
//! cache misses together instead of for each in turn. It lives here
//! because both crates build on this one and on no other common one.

/// Asks the CPU to start loading every cache line of `item` while the
/// caller goes on. A hint only: nothing is read into the program, and
/// elsewhere than on x86-64 it does nothing.
#[inline]
pub fn prefetch<T>(item: &T) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let first = (item as *const T).cast::<i8>();
        let size = std::mem::size_of::<T>();
        // From the item's first byte a line at a time, then its last.
        let mut at = 0;
        while at < size {
            // SAFETY: a prefetch reads nothing into the program and never
            // faults, whatever the address; SSE, which it needs, is part
            // of every x86-64 CPU.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(first.wrapping_add(at)) };
            at += 64;
        }
        if size > 1 {
            // SAFETY: as above.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(first.wrapping_add(size - 1)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = item;
}
