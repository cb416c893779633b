//! A table numbered like a `Vec`, kept in chunks of a fixed size.
//!
//! Why: over many tokens the rollup holds hundreds of thousands of slots
//! (112 bytes each), and once memory reaches its bound
//! [`super::Rollup::forget_rows`] drops most of them every step. In one
//! `Vec` they cost what the most ever held did: its buffer doubles to the
//! next power of two (2^20 slots, 117 MB, over 100 000 tokens; `heaptrack`),
//! each doubling copies the whole with both buffers live, and its pages,
//! once touched, stay resident after the rows are gone. Here the table
//! grows a chunk at a time, and the chunks past the last item kept are
//! freed.

use hindsight_contracts::prefetch::prefetch;
use std::ops::{Index, IndexMut};

/// Items per chunk (16 384; 1.8 MB of slots): small next to a step's rows,
/// large enough that the chunk table stays in cache.
const BITS: u32 = 14;
const CHUNK: usize = 1 << BITS;

pub(crate) struct Chunked<T> {
    /// Every chunk but the last holds `CHUNK` items.
    chunks: Vec<Vec<T>>,
    len: usize,
}

impl<T> Default for Chunked<T> {
    fn default() -> Self {
        Chunked {
            chunks: Vec::new(),
            len: 0,
        }
    }
}

impl<T> Chunked<T> {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Items the chunks have room for.
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.chunks.iter().map(Vec::capacity).sum()
    }

    pub(crate) fn push(&mut self, item: T) {
        match self.chunks.last_mut() {
            Some(last) if last.len() < CHUNK => {
                // A chunk shrunk to fit grows back to `CHUNK`, not past it.
                last.reserve_exact(CHUNK - last.len());
                last.push(item);
            }
            _ => {
                let mut chunk = Vec::with_capacity(CHUNK);
                chunk.push(item);
                self.chunks.push(chunk);
            }
        }
        self.len += 1;
    }

    pub(crate) fn clear(&mut self) {
        self.chunks.clear();
        self.len = 0;
    }

    /// Frees the last chunk's spare room.
    pub(crate) fn shrink_to_fit(&mut self) {
        if let Some(last) = self.chunks.last_mut() {
            last.shrink_to_fit();
        }
    }

    /// Keeps the items `keep` is true of, in their order, and frees the
    /// chunks past them. `keep` sees every item once, in index order.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&T) -> bool) {
        let mut kept = 0;
        for i in 0..self.len {
            if keep(&self[i]) {
                if kept != i {
                    self.swap(kept, i);
                }
                kept += 1;
            }
        }
        // Forgotten items were swapped past `kept`: dropped with their chunks.
        let chunks = kept.div_ceil(CHUNK);
        self.chunks.truncate(chunks);
        if let Some(last) = self.chunks.last_mut() {
            last.truncate(kept - (chunks - 1) * CHUNK);
        }
        self.len = kept;
    }

    /// Asks the CPU to start loading item `i` into its cache, if there is
    /// one ([`prefetch`]).
    #[inline]
    pub(crate) fn prefetch(&self, i: usize) {
        if let Some(item) = self
            .chunks
            .get(i >> BITS)
            .and_then(|c| c.get(i & (CHUNK - 1)))
        {
            prefetch(item);
        }
    }

    /// Swaps items `a` and `b`, `a < b`.
    fn swap(&mut self, a: usize, b: usize) {
        let (ca, ia) = (a >> BITS, a & (CHUNK - 1));
        let (cb, ib) = (b >> BITS, b & (CHUNK - 1));
        if ca == cb {
            self.chunks[ca].swap(ia, ib);
        } else {
            let (low, high) = self.chunks.split_at_mut(cb);
            std::mem::swap(&mut low[ca][ia], &mut high[0][ib]);
        }
    }
}

impl<T> Index<usize> for Chunked<T> {
    type Output = T;

    #[inline]
    fn index(&self, i: usize) -> &T {
        &self.chunks[i >> BITS][i & (CHUNK - 1)]
    }
}

impl<T> IndexMut<usize> for Chunked<T> {
    #[inline]
    fn index_mut(&mut self, i: usize) -> &mut T {
        &mut self.chunks[i >> BITS][i & (CHUNK - 1)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filled(n: usize) -> Chunked<String> {
        let mut t = Chunked::default();
        for i in 0..n {
            t.push(i.to_string());
        }
        t
    }

    #[test]
    fn items_are_numbered_in_push_order_across_chunks() {
        let t = filled(2 * CHUNK + 5);
        assert_eq!(t.len(), 2 * CHUNK + 5);
        for i in [0, CHUNK - 1, CHUNK, 2 * CHUNK + 4] {
            assert_eq!(t[i], i.to_string());
        }
        assert_eq!(t.capacity(), 3 * CHUNK);
    }

    #[test]
    fn retain_keeps_order_and_frees_the_chunks_past_the_last_kept() {
        let n = 3 * CHUNK + 10;
        let mut t = filled(n);
        let mut seen = Vec::new();
        // Keep every third item: most of them move to an earlier chunk.
        t.retain(|s| {
            seen.push(s.parse::<usize>().unwrap());
            seen.last().unwrap() % 3 == 0
        });
        assert_eq!(
            seen,
            (0..n).collect::<Vec<_>>(),
            "each item seen once, in order"
        );
        let kept: Vec<usize> = (0..n).filter(|i| i % 3 == 0).collect();
        assert_eq!(t.len(), kept.len());
        for (i, k) in kept.iter().enumerate() {
            assert_eq!(t[i], k.to_string());
        }
        assert_eq!(t.capacity(), kept.len().div_ceil(CHUNK) * CHUNK);
        // Pushing after a retain continues the numbering.
        t.push("next".into());
        assert_eq!(t[kept.len()], "next");
    }

    #[test]
    fn retaining_nothing_frees_every_chunk_and_a_shrunk_chunk_grows_only_to_its_size() {
        let mut t = filled(CHUNK + 1);
        t.retain(|_| false);
        assert!(t.is_empty());
        assert_eq!(t.capacity(), 0);
        let mut t = filled(10);
        t.shrink_to_fit();
        assert_eq!(t.capacity(), 10);
        for i in 10..CHUNK + 1 {
            t.push(i.to_string());
        }
        assert_eq!(t.capacity(), 2 * CHUNK);
        assert_eq!(t[CHUNK], CHUNK.to_string());
    }
}
