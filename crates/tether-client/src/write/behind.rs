//! Write-behind (opt-in: `tether mount --writes behind`): a small written-through `write()`
//! is answered as soon as its WRITE is on the wire, not when the server's reply comes back.
//!
//! Why the guest never sees old data: the server executes every WRITE of at most
//! [`ORDERED_WRITE_MAX`](tether_proto::handshake::ORDERED_WRITE_MAX) bytes before it reads
//! the next request (feature `ORDERED_WRITES`), and every request the kernel sends after
//! hearing "written" goes out on the same stream after that WRITE. So whatever asks about
//! the file next (a READ of a page the kernel does not hold, a GETATTR, a truncation, an
//! unlock, after which the next lock holder anywhere reads the data) sees it, as if the
//! write had waited. A lost connection sends the WRITE again (it is retry-safe) before
//! anything newer; the client's exit waits for every one to be answered.
//!
//! What changes: the host has the data a moment after `write()` returned, and after
//! `close()` too (FUSE does not tell the client of closes here), so a host process told by
//! other means that a guest program is done may read the file before its last writes. An
//! error (a full disk, a host that made the file read-only) reaches the writer one call
//! late, at its next `write()` to the file or at `fsync()`, as write-back errors do on a
//! local file system; it is logged, and the kernel's copy of the file is dropped so that
//! the guest sees what the host has. A write opened with `O_SYNC`, `O_DSYNC` or `O_DIRECT`
//! still waits, and so does any write while too much is in flight.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use tether_proto::{NodeId, WireErrno};

/// Most bytes answered before the server has them, over the whole mount.
const MAX_BYTES_IN_FLIGHT: u64 = 1 << 20;

#[derive(Default)]
pub struct Counters {
    /// Writes answered before the server's reply.
    pub answered_early: AtomicU64,
    /// Of those, writes the server then failed (their error went to the next call).
    pub failed_later: AtomicU64,
}

/// Runs once the writes to a file in flight when it was registered are answered, with
/// the file's first error among them (if any).
pub type AfterWrites = Box<dyn FnOnce(Option<WireErrno>) + Send>;

/// What waits for a file's writes: until `finished` reaches `target`; `reports` if it
/// gives their error to a caller (a FLUSH), which then is not kept for the next one.
struct Waiter {
    target: u64,
    reports: bool,
    then: AfterWrites,
}

/// A file's early-answered writes: how many were sent and answered, and what waits for
/// some of them.
#[derive(Default)]
struct NodeWrites {
    begun: u64,
    finished: u64,
    /// Each waits until `finished` reaches its number: the writes before it, not those a
    /// steady writer keeps adding (a `stat` during a long `dd` must not wait for its end).
    waiting: Vec<Waiter>,
}

#[derive(Default)]
struct InFlight {
    bytes: u64,
    /// Writes and creations answered early and not answered by the server yet.
    ops: u64,
    /// Files with writes in flight or waiters.
    per_node: HashMap<NodeId, NodeWrites>,
    /// The first error of a file's early-answered write, not yet given to a caller.
    errors: HashMap<NodeId, WireErrno>,
}

/// The mount's early-answered writes: how many are in flight, and their errors.
pub struct WriteBehind {
    /// Asked for (`--writes behind` or `create-behind`); the caller checks that the server executes small
    /// WRITEs in order (feature `ORDERED_WRITES`).
    enabled: bool,
    state: Mutex<InFlight>,
    drained: Condvar,
    pub counters: Counters,
}

/// Whether a write of `len` bytes through a file opened with `open_flags` may be answered
/// early at all: not one the caller asked to be durable or uncached.
pub fn may_answer_early(len: usize, open_flags: i32) -> bool {
    len <= tether_proto::handshake::ORDERED_WRITE_MAX && !durable_or_uncached(open_flags)
}

/// Whether a file opened with `open_flags` asked for its writes to be durable or uncached
/// (`O_SYNC`, `O_DSYNC`, `O_DIRECT`): nothing about it is answered early.
pub fn durable_or_uncached(open_flags: i32) -> bool {
    open_flags & (libc::O_SYNC | libc::O_DSYNC | libc::O_DIRECT) != 0
}

impl WriteBehind {
    pub fn new(enabled: bool) -> WriteBehind {
        WriteBehind {
            enabled,
            state: Mutex::new(InFlight::default()),
            drained: Condvar::new(),
            counters: Counters::default(),
        }
    }

    /// Whether writes may be answered early on this mount at all.
    pub fn on(&self) -> bool {
        self.enabled
    }

    /// An error of an earlier early-answered write to `node`, given to this caller (once).
    pub fn take_error(&self, node: NodeId) -> Option<WireErrno> {
        if !self.enabled {
            return None; // every write and fsync asks: no lock when the option is off
        }
        self.state.lock().unwrap().errors.remove(&node)
    }

    /// Whether writes to `node` answered early are on their way.
    pub fn writing(&self, node: NodeId) -> bool {
        if !self.enabled {
            return false; // every GETATTR asks
        }
        let s = self.state.lock().unwrap();
        s.per_node.get(&node).is_some_and(|w| w.begun > w.finished)
    }

    /// Runs `then` once every write to `node` in flight now is answered by the server (on
    /// the thread that handles the reply), or gives it back when none is.
    pub fn after_writes(&self, node: NodeId, then: AfterWrites) -> Result<(), AfterWrites> {
        self.wait(node, false, then).map_err(|(then, _)| then)
    }

    /// For a FLUSH: runs `then` with the file's first unreported error (taken), once every
    /// write to `node` in flight now is answered by the server (on the thread that handles
    /// the last reply), or at once when none is. Every FLUSH waiting for the same writes
    /// gets their error: the writer's close() may wait beside another of the file, such as
    /// a forked child's close of its copy of the descriptor at exec.
    pub fn when_written(
        &self,
        node: NodeId,
        then: impl FnOnce(Option<WireErrno>) + Send + 'static,
    ) {
        if let Err((then, error)) = self.wait(node, true, Box::new(then)) {
            then(error);
        }
    }

    /// Queues `then` behind the writes to `node` in flight now; with none, gives it back,
    /// with the file's error taken if `reports`.
    fn wait(
        &self,
        node: NodeId,
        reports: bool,
        then: AfterWrites,
    ) -> Result<(), (AfterWrites, Option<WireErrno>)> {
        let mut s = self.state.lock().unwrap();
        if let Some(w) = s.per_node.get_mut(&node).filter(|w| w.begun > w.finished) {
            let target = w.begun;
            w.waiting.push(Waiter {
                target,
                reports,
                then,
            });
            return Ok(());
        }
        let error = if reports {
            s.errors.remove(&node)
        } else {
            None
        };
        Err((then, error))
    }

    /// Counts a write of `len` bytes to `node` as in flight, if it may be answered early
    /// ([`may_answer_early`] already checked): false when write-behind is off or too much
    /// is in flight already (the caller then waits for the reply).
    pub fn begin(&self, node: NodeId, len: usize) -> bool {
        let begun = self.track(node, len);
        if begun {
            self.counters.answered_early.fetch_add(1, Ordering::Relaxed);
        }
        begun
    }

    /// Counts the creation of `node` (write/spares.rs), answered before the server made it, as in
    /// flight like a write: later writes' errors and waiters queue behind it, and the
    /// client's exit waits for it. False when write-behind is off or too much is in flight.
    pub fn begin_creation(&self, node: NodeId) -> bool {
        self.track(node, 0)
    }

    fn track(&self, node: NodeId, len: usize) -> bool {
        if !self.enabled {
            return false;
        }
        let mut s = self.state.lock().unwrap();
        if s.bytes + len as u64 > MAX_BYTES_IN_FLIGHT {
            return false;
        }
        s.bytes += len as u64;
        s.ops += 1;
        s.per_node.entry(node).or_default().begun += 1;
        true
    }

    /// The server answered a write (or creation, `len` 0) counted by [`WriteBehind::begin`]
    /// (or [`WriteBehind::begin_creation`]). Returns true when it failed (the caller drops
    /// the kernel's copy of the file).
    pub fn finish(&self, node: NodeId, len: usize, outcome: Result<u64, WireErrno>) -> bool {
        let error = match outcome {
            Ok(n) if n >= len as u64 => None,
            // A regular file written short has no room left.
            Ok(_) => Some(WireErrno::ENOSPC),
            Err(e) => Some(e),
        };
        let mut s = self.state.lock().unwrap();
        s.bytes -= len as u64;
        s.ops -= 1;
        if let Some(e) = error {
            s.errors.entry(node).or_insert(e);
            self.counters.failed_later.fetch_add(1, Ordering::Relaxed);
            let what = if len == 0 {
                "a file creation"
            } else {
                "a write"
            };
            tracing::warn!(
                %node,
                "{what} answered before the server had it failed there: {e:?}; the next \
                 write to the file or fsync() gets the error, and the guest's copy is dropped"
            );
        }
        let mut waited = Vec::new();
        if let Some(w) = s.per_node.get_mut(&node) {
            // Replies come in the order the writes went out: the answered ones are a prefix.
            w.finished += 1;
            let finished = w.finished;
            let (ready, rest): (Vec<_>, Vec<_>) = w
                .waiting
                .drain(..)
                .partition(|waiter| waiter.target <= finished);
            w.waiting = rest;
            waited = ready;
            if w.begun == w.finished && w.waiting.is_empty() {
                s.per_node.remove(&node);
            }
        }
        // Given to every waiter at once; kept for the next caller unless one reports it.
        let waited_error = if waited.iter().any(|waiter| waiter.reports) {
            s.errors.remove(&node)
        } else {
            s.errors.get(&node).copied()
        };
        if s.ops == 0 {
            self.drained.notify_all();
        }
        drop(s);
        for waiter in waited {
            (waiter.then)(waited_error);
        }
        error.is_some()
    }

    /// Waits until every early-answered write is answered by the server, or `limit` passed.
    /// Returns how many are still in flight.
    pub fn drain(&self, limit: Duration) -> usize {
        let deadline = Instant::now() + limit;
        let mut s = self.state.lock().unwrap();
        while s.ops > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            s = self.drained.wait_timeout(s, left).unwrap().0;
        }
        s.per_node
            .values()
            .map(|w| (w.begun - w.finished) as usize)
            .sum()
    }

    /// Errors no caller was given (logged at the client's exit).
    pub fn unreported(&self) -> Vec<(NodeId, WireErrno)> {
        let s = self.state.lock().unwrap();
        s.errors.iter().map(|(n, e)| (*n, *e)).collect()
    }

    /// Writes in flight now (for `tether status`).
    pub fn in_flight(&self) -> usize {
        self.state
            .lock()
            .unwrap()
            .per_node
            .values()
            .map(|w| (w.begun - w.finished) as usize)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_goes_to_the_next_caller_once_and_draining_waits_for_replies() {
        let wb = WriteBehind::new(true);
        assert!(wb.begin(NodeId::new(7), 4096));
        assert!(wb.begin(NodeId::new(7), 4096));
        assert_eq!(wb.in_flight(), 2);
        assert!(!wb.finish(NodeId::new(7), 4096, Ok(4096)));
        assert!(
            wb.finish(NodeId::new(7), 4096, Ok(100)),
            "a short write is an error"
        );
        assert_eq!(wb.drain(Duration::from_millis(10)), 0);
        assert_eq!(wb.take_error(NodeId::new(7)), Some(WireErrno::ENOSPC));
        assert_eq!(wb.take_error(NodeId::new(7)), None);
        assert_eq!(wb.counters.failed_later.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn what_waits_for_a_files_writes_runs_after_the_last_reply() {
        use std::sync::atomic::AtomicBool;
        use std::sync::Arc;
        let wb = WriteBehind::new(true);
        assert!(
            wb.after_writes(NodeId::new(3), Box::new(|_| ())).is_err(),
            "nothing in flight"
        );
        assert!(
            wb.begin(NodeId::new(3), 10)
                && wb.begin(NodeId::new(3), 10)
                && wb.begin(NodeId::new(4), 10)
        );
        let ran = Arc::new(AtomicBool::new(false));
        let r = ran.clone();
        let then = Box::new(move |_| r.store(true, Ordering::SeqCst));
        assert!(wb.after_writes(NodeId::new(3), then).is_ok());
        wb.finish(NodeId::new(3), 10, Ok(10));
        wb.finish(NodeId::new(4), 10, Ok(10));
        assert!(
            !ran.load(Ordering::SeqCst),
            "one write to the file is still on its way"
        );
        wb.finish(NodeId::new(3), 10, Ok(10));
        assert!(ran.load(Ordering::SeqCst));
        assert!(!wb.writing(NodeId::new(3)));
    }

    /// A FLUSH with nothing in flight gets the file's error at once; one with writes in
    /// flight gets the error of those writes once the last is answered, and only once.
    #[test]
    fn a_flush_gets_the_error_of_the_writes_before_it() {
        use std::sync::{Arc, Mutex};
        let wb = Arc::new(WriteBehind::new(true));
        let (a, b) = (NodeId::new(8), NodeId::new(9));
        let got = Arc::new(Mutex::new(Vec::new()));
        let record = |got: &Arc<Mutex<Vec<_>>>| {
            let got = got.clone();
            move |e| got.lock().unwrap().push(e)
        };
        assert!(wb.begin(a, 10) && wb.begin(b, 10));
        assert!(wb.finish(a, 10, Err(WireErrno::EIO)));
        wb.when_written(a, record(&got));
        wb.when_written(a, record(&got));
        assert_eq!(*got.lock().unwrap(), [Some(WireErrno::EIO), None]);
        // Two closes of b wait for its write (the writer's, and a forked child's of its
        // copy of the descriptor): both get the error, which is then reported.
        wb.when_written(b, record(&got));
        wb.when_written(b, record(&got));
        assert_eq!(got.lock().unwrap().len(), 2, "b's write is on its way");
        assert!(wb.finish(b, 10, Err(WireErrno::ENOSPC)));
        assert_eq!(
            got.lock().unwrap()[2..],
            [Some(WireErrno::ENOSPC), Some(WireErrno::ENOSPC)]
        );
        assert_eq!(wb.take_error(b), None, "the flushes took it");
    }

    #[test]
    fn a_waiter_does_not_wait_for_writes_begun_after_it() {
        use std::sync::atomic::AtomicBool;
        use std::sync::Arc;
        let wb = WriteBehind::new(true);
        assert!(wb.begin(NodeId::new(5), 10));
        let ran = Arc::new(AtomicBool::new(false));
        let r = ran.clone();
        assert!(wb
            .after_writes(
                NodeId::new(5),
                Box::new(move |_| r.store(true, Ordering::SeqCst))
            )
            .is_ok());
        // A steady writer: the file always has a write in flight.
        assert!(wb.begin(NodeId::new(5), 10));
        wb.finish(NodeId::new(5), 10, Ok(10));
        assert!(
            ran.load(Ordering::SeqCst),
            "the write before it was answered"
        );
        assert!(wb.writing(NodeId::new(5)));
        wb.finish(NodeId::new(5), 10, Ok(10));
        assert_eq!(wb.in_flight(), 0);
    }

    #[test]
    fn writes_wait_when_the_server_does_not_order_them_or_too_much_is_in_flight() {
        assert!(!WriteBehind::new(false).begin(NodeId::new(1), 10));
        let wb = WriteBehind::new(true);
        let big = tether_proto::handshake::ORDERED_WRITE_MAX;
        let mut n = 0;
        while wb.begin(NodeId::new(1), big) {
            n += 1;
        }
        assert_eq!(n as u64, MAX_BYTES_IN_FLIGHT / big as u64);
        assert_eq!(
            wb.drain(Duration::from_millis(5)),
            n,
            "nothing answered yet"
        );
        assert!(!may_answer_early(big + 1, 0));
        assert!(!may_answer_early(10, libc::O_WRONLY | libc::O_SYNC));
        assert!(!may_answer_early(10, libc::O_DIRECT));
        assert!(may_answer_early(10, libc::O_WRONLY | libc::O_APPEND));
    }
}
