//! Sharing one output buffer between parallel tasks that each write their own, disjoint elements
//! (e.g. GEMM tiles: a column block of every row). Only the raw-pointer handle lives here; which
//! elements a task owns is decided, and documented, by the kernel that splits the work.

use std::marker::PhantomData;

/// A `&mut [f32]` handed to several tasks at once as a raw pointer.
pub(crate) struct SharedOut<'a> {
    ptr: *mut f32,
    len: usize,
    _borrow: PhantomData<&'a mut [f32]>,
}

// SAFETY: the handle is only a pointer plus length; every write through it goes through
// `SharedOut::ptr_at`, whose callers guarantee that concurrent tasks touch disjoint elements.
unsafe impl Send for SharedOut<'_> {}
// SAFETY: as above.
unsafe impl Sync for SharedOut<'_> {}

impl<'a> SharedOut<'a> {
    pub(crate) fn new(out: &'a mut [f32]) -> Self {
        Self {
            ptr: out.as_mut_ptr(),
            len: out.len(),
            _borrow: PhantomData,
        }
    }

    /// Pointer to element `offset`; panics if `offset > len` (one past the end is allowed).
    /// Writing through it is `unsafe`: the caller must ensure the elements it writes lie in
    /// `0..len` and that no other task reads or writes them while this task runs.
    pub(crate) fn ptr_at(&self, offset: usize) -> *mut f32 {
        assert!(
            offset <= self.len,
            "offset {offset} beyond shared output of {}",
            self.len
        );
        // SAFETY: offset <= len keeps the pointer inside (or one past) the borrowed allocation.
        unsafe { self.ptr.add(offset) }
    }
}

/// Splits `0..n` into about `pieces` contiguous ranges whose lengths are multiples of `align`
/// (except the last); never returns an empty range.
pub(crate) fn split_aligned(n: usize, pieces: usize, align: usize) -> Vec<std::ops::Range<usize>> {
    if n == 0 {
        return Vec::new();
    }
    let per = n.div_ceil(pieces.max(1)).next_multiple_of(align.max(1));
    (0..n).step_by(per).map(|s| s..(s + per).min(n)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_covers_everything_with_aligned_pieces() {
        for (n, pieces, align) in [
            (0, 4, 4),
            (1, 4, 4),
            (10, 3, 4),
            (1024, 8, 4),
            (7, 16, 1),
            (130, 2, 64),
        ] {
            let ranges = split_aligned(n, pieces, align);
            let mut next = 0;
            for r in &ranges {
                assert_eq!(r.start, next);
                assert!(!r.is_empty());
                assert!(r.end == n || r.len() % align == 0);
                next = r.end;
            }
            assert_eq!(next, n);
        }
    }
}
