//! The bench process's heap allocations, counted: a global allocator that
//! forwards to the system's and counts every `alloc`, `alloc_zeroed` and
//! `realloc` call.
//!
//! Counts are kept in 64 padded slots, one per thread (threads beyond 64
//! share), so that counting adds no cache-line traffic between the
//! runtime's workers: a contender that allocates more pays for its own
//! allocations, not for everyone's. [`total`] sums the slots; a window's
//! count is the difference of two totals, divided by the cycles in it
//! (the same cycles every other section-1 figure is divided by).
//!
//! The per-thread slot index is a constant-initialised thread local
//! without a destructor: on Linux (native TLS, where the bench runs: it
//! reads `/proc`) reading it never allocates, so the allocator never
//! re-enters itself.
//!
//! The one module of the workspace that allows `unsafe`: `GlobalAlloc` is
//! an unsafe trait. Every call is forwarded unchanged to [`System`].

#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// One slot, alone on its cache line.
#[repr(align(64))]
struct Slot(AtomicU64);

const SLOTS: usize = 64;

#[allow(clippy::declare_interior_mutable_const)]
const ZERO: Slot = Slot(AtomicU64::new(0));

static COUNTS: [Slot; SLOTS] = [ZERO; SLOTS];

/// The slot the next thread gets.
static NEXT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's slot (`usize::MAX`: none yet). Constant-initialised and
    /// without a destructor, so reading it never allocates.
    static MINE: Cell<usize> = const { Cell::new(usize::MAX) };
}

fn count() {
    let slot = MINE
        .try_with(|mine| {
            if mine.get() == usize::MAX {
                mine.set(NEXT.fetch_add(1, Ordering::Relaxed) % SLOTS);
            }
            mine.get()
        })
        .unwrap_or(0);
    COUNTS[slot].0.fetch_add(1, Ordering::Relaxed);
}

/// Allocation calls made by the whole process so far.
pub(crate) fn total() -> u64 {
    COUNTS.iter().map(|s| s.0.load(Ordering::Relaxed)).sum()
}

/// The counting allocator (installed in `main.rs`).
pub(crate) struct Counting;

// SAFETY: every call is forwarded unchanged to `System`, which upholds
// `GlobalAlloc`'s contract; counting touches no allocated memory.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_this_threads_allocations() {
        let before = total();
        let v: Vec<Box<u64>> = (0..100).map(Box::new).collect();
        let after = total();
        // 100 boxes and the vector itself (other test threads may add more).
        assert!(after - before >= 101, "{before} → {after}");
        drop(v);
    }
}
