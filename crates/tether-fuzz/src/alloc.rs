//! A counting global allocator, so the targets can check their memory bounds.
//!
//! A binary that wants the checks installs it:
//!
//! ```ignore
//! #[global_allocator]
//! static ALLOC: tether_fuzz::TrackingAlloc = tether_fuzz::TrackingAlloc;
//! ```
//!
//! Counts are kept per thread (the targets run on one thread; the smoke test runs several
//! at once), so a [`MemScope`] sees only the allocations of the thread that opened it.
//! Without the allocator installed, [`MemScope::installed`] is false and the targets skip
//! their memory checks.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};

/// Wraps the system allocator and counts, per thread, live bytes, their peak and the
/// largest single allocation.
pub struct TrackingAlloc;

static INSTALLED: AtomicBool = AtomicBool::new(false);

thread_local! {
    // Const-initialised and without destructors: usable from inside the allocator.
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn grew(delta: isize, size: usize) {
    let _ = LIVE.try_with(|live| {
        let now = live.get() + delta;
        live.set(now);
        let _ = PEAK.try_with(|p| p.set(p.get().max(now)));
    });
    let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
}

fn shrank(size: usize) {
    let _ = LIVE.try_with(|live| live.set(live.get() - size as isize));
}

// SAFETY: every call is forwarded to the system allocator unchanged; the bookkeeping only
// touches thread-local cells and never allocates.
unsafe impl GlobalAlloc for TrackingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !INSTALLED.load(Ordering::Relaxed) {
            INSTALLED.store(true, Ordering::Relaxed);
        }
        // SAFETY: forwarded with the caller's layout.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size() as isize, layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !INSTALLED.load(Ordering::Relaxed) {
            INSTALLED.store(true, Ordering::Relaxed);
        }
        // SAFETY: forwarded with the caller's layout.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size() as isize, layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded with the caller's pointer and layout.
        unsafe { System.dealloc(ptr, layout) };
        shrank(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded with the caller's arguments.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            grew(new_size as isize - layout.size() as isize, new_size);
        }
        p
    }
}

/// Memory use of this thread from the moment the scope was opened.
pub struct MemScope {
    base: isize,
}

impl MemScope {
    /// Starts measuring: the peak and the largest allocation are reset for this thread.
    pub fn start() -> MemScope {
        let base = LIVE.with(Cell::get);
        PEAK.with(|p| p.set(base));
        LARGEST.with(|l| l.set(0));
        MemScope { base }
    }

    /// Whether [`TrackingAlloc`] is the global allocator (otherwise nothing is counted).
    pub fn installed() -> bool {
        INSTALLED.load(Ordering::Relaxed)
    }

    /// Highest number of bytes live at once since the start, above what was live then.
    pub fn peak_growth(&self) -> usize {
        (PEAK.with(Cell::get) - self.base).max(0) as usize
    }

    /// Largest single allocation (or reallocation) since the start.
    pub fn largest(&self) -> usize {
        LARGEST.with(Cell::get)
    }

    /// Panics if the thread allocated more than `peak` bytes at once or one block larger
    /// than `largest` since the start. Does nothing without [`TrackingAlloc`].
    pub fn check(&self, what: &str, peak: usize, largest: usize) {
        if !Self::installed() {
            return;
        }
        let (p, l) = (self.peak_growth(), self.largest());
        assert!(
            l <= largest,
            "{what}: allocated a block of {l} bytes, above the bound of {largest}"
        );
        assert!(
            p <= peak,
            "{what}: {p} bytes live at once, above the bound of {peak}"
        );
    }
}
