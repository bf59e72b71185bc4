//! Guest caches that live until the host revokes them.
//!
//! The server pushes INVALIDATE frames; the RPC reader thread hands them to
//! [`Coherence::on_push`], which records *when* each node was invalidated (a push sequence
//! number) and queues the work. A dedicated thread applies the queue as FUSE notifications:
//! never from a request handler and never while holding a lock, because the kernel may have
//! to wait for an in-flight reply before it can drop a page or a dentry (FUSE-FACTS.md,
//! deadlocks).
//!
//! Ordering rule: a reply to a request that was sent before the newest invalidation of a node
//! it describes may have been computed before that change, so it is not cached (TTL 0).
//! Requests sent after the push was received were answered after the server saw the change.

use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::OsStr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, OnceLock};

use std::time::{Duration, Instant};

use bytes::Bytes;
use dashmap::DashMap;
use fuser::Notifier;
use tether_proto::{
    decode_invalidate, decode_lock_freed, push_op, FrameHeader, HostEvent, InvalidatePush,
    Invalidation, NodeId, ROOT_NODE,
};

use crate::invalidate::fixer::AttrFixer;
use crate::invalidate::host_events::{Backlog, Replayer};
use crate::kernel_ids::ino_of;

/// Host events to replay: batch `batch` of the name invalidations that wait for them.
struct Replay {
    events: Vec<HostEvent>,
    batch: u64,
}

/// Name invalidations waiting for the replays of their batch of host events, until `due`.
struct WaitingNames {
    batch: u64,
    due: Instant,
    names: Vec<Invalidation>,
}

/// What the invalidation thread is given, in the order the pushes came.
enum Queued {
    Push(InvalidatePush),
    /// [`Coherence::barrier`]: told once everything queued before it has been applied.
    Barrier(Sender<()>),
}

/// The name invalidations that wait for replays ([`WaitingNames`]), and those being applied.
#[derive(Default)]
struct Names {
    /// Oldest first: applied by the replay thread once the replays before them are done,
    /// or by the invalidation thread when due.
    waiting: VecDeque<WaitingNames>,
    /// For each run of waiting names taken out and being applied now, its oldest batch.
    applying: Vec<u64>,
}

impl Names {
    /// Whether the names of every batch up to `batch` have been applied.
    fn applied_through(&self, batch: u64) -> bool {
        self.waiting.front().is_none_or(|w| w.batch > batch)
            && self.applying.iter().all(|&oldest| oldest > batch)
    }
}

/// A barrier the invalidation thread reached ([`Coherence::barrier`]), waiting for what
/// was queued before it but is applied later: the names of batches up to `batch`, and the
/// invalidations the kernel had refused (`refused`: node and when first refused) until it
/// takes them, forgets the node or `until` passes.
struct PendingBarrier {
    batch: u64,
    refused: Vec<(NodeId, Instant)>,
    until: Instant,
    done: Sender<()>,
}

/// Longest a barrier waits for invalidations the kernel refused because it was still
/// making the node from a reply (`Coherence::inval_pushed`): they are usually taken at the
/// first or second try, 1 to 3 ms later.
const BARRIER_WAITS_FOR_REFUSED: Duration = Duration::from_secs(1);
/// How often the invalidation thread looks at the barriers that wait, at least.
const BARRIER_LOOK_AGAIN: Duration = Duration::from_millis(10);

/// Longest a name invalidation waits for the replays before it. The invalidation thread
/// applies it then, whatever the replay thread is doing (a scan of guest watchers, a long
/// backlog, a replay that blocks), so that the guest never shows a name the host changed
/// for longer than this because of replays.
const NAMES_WAIT_AT_MOST: Duration = Duration::from_millis(200);

/// Longest a replay of host events waits for the fixes of the files they are about
/// (invalidate/fixer.rs).
const FIX_WAIT_AT_MOST: Duration = Duration::from_millis(500);

/// Longest stretch of host-event replays between two looks at new pushes.
const REPLAY_SLICE: Duration = Duration::from_millis(50);

/// A refused `inval_inode` is tried again only for a node given to the kernel this
/// recently: one given earlier is an inode the kernel dropped, whose FORGET is on its way.
const REFUSED_GIVEN_WITHIN: Duration = Duration::from_secs(2);
/// It is tried again after 1 ms, then twice as long each time up to the longest wait,
/// until the kernel takes it, forgets the node, or the whole time has passed.
const REFUSED_FIRST_WAIT: Duration = Duration::from_millis(1);
const REFUSED_LONGEST_WAIT: Duration = Duration::from_millis(100);
const REFUSED_RETRY_FOR: Duration = Duration::from_secs(10);
/// Refused invalidations tried again at most at once (each is one system call a try).
const REFUSED_AT_MOST: usize = 4096;

/// How long the kernel may keep what the server watches: "until revoked".
pub const WATCHED_TTL: Duration = Duration::from_secs(24 * 3600);

#[derive(Default)]
pub struct Counters {
    pub pushes: AtomicU64,
    pub invalidations: AtomicU64,
    /// Entries the client listed through the mount ahead of a walk's LOOKUPs (cache/prefetch.rs).
    pub listed: AtomicU64,
    /// Directories being listed ahead now, and the most at once.
    pub listing_now: AtomicU64,
    pub listing_most: AtomicU64,
    /// Runs of partly written pages dropped (cache/partial_pages.rs).
    pub partial_pages_dropped: AtomicU64,
    /// Pushed invalidations of a node the kernel was given nothing of since the last one.
    pub invalidations_unneeded: AtomicU64,
    /// Blocked locks granted on a try sent because a lock was released through this mount
    /// or (pushed) another one (fuse/locks.rs), not found by polling.
    pub lock_waits_ended_by_release: AtomicU64,
    /// Pushed `inval_inode`s the kernel refused because it had not yet made the node's
    /// inode from the reply that gave it, and took when tried again.
    pub invalidations_retried: AtomicU64,
    /// READs answered from what this mount wrote to a small file (cache/written_files.rs).
    pub reads_from_written_files: AtomicU64,
}

/// Told of each node another session freed a lock on (a LOCK_FREED push).
pub type LockFreed = Box<dyn Fn(NodeId) + Send + Sync>;

pub struct Coherence {
    /// The server watches and pushes (negotiated in HELLO).
    enabled: AtomicBool,
    /// Sequence number of the newest push received (local: counts every push of every
    /// connection).
    last_push: AtomicU64,
    next_seq: AtomicU64,
    /// Node -> sequence of the newest push that invalidated it (or an entry in it).
    invalidated: DashMap<NodeId, u64>,
    /// Directory -> sequence at which this client last made or removed a name in it
    /// ([`Coherence::changed_here`]).
    changed_here: DashMap<NodeId, u64>,
    /// The newest of those sequences dropped with a forgotten node: a reply about a node
    /// not in `invalidated`, to a request sent before it, may predate a change pushed for
    /// a node the kernel forgot meanwhile (a LOOKUP racing the FORGET), so it is not fresh.
    forgotten_floor: AtomicU64,
    /// Nodes whose entries the server marked as watched, with when the kernel was last
    /// given one.
    watched: DashMap<NodeId, Instant>,
    /// Nodes the server could not watch (they fall back to the mount's timeout).
    unwatched: DashMap<NodeId, Instant>,
    queue: Sender<Queued>,
    pending: Mutex<Option<Receiver<Queued>>>,
    pub counters: Counters,
    /// Set when host events are replayed as inotify events in the guest.
    pub replayer: OnceLock<Arc<Replayer>>,
    /// Wakes the lock thread's waiters on a node another session freed a lock on (set by
    /// the lock thread, fuse/locks.rs, which this layer does not know).
    lock_freed: OnceLock<LockFreed>,
    /// Set when the kernel caches writes (invalidate/fixer.rs).
    fixer: OnceLock<Arc<AttrFixer>>,
    fuse_dev: OnceLock<OwnedFd>,
    /// Name invalidations waiting for replays, and those being applied.
    names: Mutex<Names>,
    /// Barriers reached whose waiting names or refused invalidations are not applied yet.
    barriers: Mutex<Vec<PendingBarrier>>,
    /// "Invalidate everything" requests queued by reconnects, and applied.
    alls_queued: AtomicU64,
    alls_applied: AtomicU64,
    /// Files this client created, with the push sequence when it asked: while nothing
    /// about one has been invalidated since, it has no `security.capability`.
    created: DashMap<NodeId, u64>,
    /// Directories this client made, with the push sequence when it asked and every name
    /// made in them through this mount since: while nothing in one has been invalidated, a
    /// name not among them does not exist, and its LOOKUP needs no round trip.
    new_dirs: DashMap<NodeId, (u64, HashSet<Bytes>)>,
    /// Directories whose last listing reached their end (feature DIR_END).
    listing_ends: DashMap<NodeId, ListingEnd>,
    /// Names made or moved through this mount, counted.
    names_made: AtomicU64,
    /// Nodes the kernel may hold something of that `inval_inode` drops, given since the
    /// last one was applied (attributes cached for longer than a moment, pages, a listing),
    /// and how many replies are being decided about now ([`Coherence::kernel_may_hold`]).
    kernel_holds: DashMap<NodeId, Holding>,
    /// Taken around every `inval_inode`, and held by a lock's grant while it asks the
    /// kernel for a file's size ([`Coherence::hold_invalidations`]).
    inval_gate: Mutex<()>,
    /// Nodes just given to the kernel whose pushed `inval_inode` it refused (no such
    /// inode yet), to be tried again ([`Coherence::retry_refused`]).
    refused: Mutex<HashMap<NodeId, Refused>>,
    /// Nodes a reconnect made anew under an id the kernel holds (a spare's BIND sent again,
    /// protocol.md §17), with the generation the kernel knows them by: given under the new
    /// file's own, the kernel would take the node for a reused id and fail every
    /// descriptor open on it with EIO.
    generations_kept: DashMap<NodeId, u64>,
}

/// What the kernel may hold of a node, for [`Coherence::kernel_holds`].
#[derive(Default)]
struct Holding {
    /// Something was given since the last `inval_inode` was applied.
    given: bool,
    /// Replies whose caching is being decided now ([`Caching`]).
    deciding: u32,
}

/// A reply about a node being decided: while it lives, a pushed `inval_inode` of the node
/// is applied, since the reply may yet be cached.
pub struct Caching<'a> {
    co: &'a Coherence,
    node: NodeId,
}

impl Caching<'_> {
    /// The reply is cached (beyond a moment): the next push must drop it.
    pub fn cached(&self) {
        self.co.kernel_may_hold(self.node);
    }
}

impl Drop for Caching<'_> {
    fn drop(&mut self) {
        if let Some(mut h) = self.co.kernel_holds.get_mut(&self.node) {
            h.deciding = h.deciding.saturating_sub(1);
        }
        self.co.drop_holding_if_idle(self.node);
    }
}

/// A refused `inval_inode` to try again.
#[derive(Clone, Copy)]
struct Refused {
    since: Instant,
    next: Instant,
    wait: Duration,
}

/// Where a listing of a directory ended, and what must not have changed since.
struct ListingEnd {
    /// The cookie of the last entry: the kernel's next READDIR asks from there.
    offset: u64,
    /// The push sequence when the listing was asked for.
    sent: u64,
    /// [`Coherence::names_made`] when the listing was asked for.
    names: u64,
    /// When its reply came.
    at: Instant,
}

/// How long the end of a listing answers the request after it: the kernel asks right
/// away, in the same `getdents` loop.
const LISTING_END_FOR: Duration = Duration::from_secs(1);

/// Past this many names a new directory is no longer tracked (the memory is not worth it:
/// the kernel caches the negative entries it looks up anyway).
const NEW_DIR_NAMES_AT_MOST: usize = 4096;

fn is_not_found(r: &std::io::Result<()>) -> bool {
    matches!(r, Err(e) if e.kind() == std::io::ErrorKind::NotFound)
}

/// FUSE_NOTIFY_INC_EPOCH: every dentry of the mount, positive or negative, must be looked
/// up again before it is used. A notification is an out header with `unique` 0 and the
/// code in `error`; this one has no body.
fn inc_epoch(fuse_dev: &OwnedFd) -> std::io::Result<()> {
    const FUSE_NOTIFY_INC_EPOCH: i32 = 8;
    let mut header = [0u8; 16];
    header[0..4].copy_from_slice(&16u32.to_ne_bytes());
    header[4..8].copy_from_slice(&FUSE_NOTIFY_INC_EPOCH.to_ne_bytes());
    // SAFETY: writes 16 bytes from a live buffer to a descriptor we own.
    let n = unsafe { libc::write(fuse_dev.as_raw_fd(), header.as_ptr().cast(), header.len()) };
    if n == header.len() as isize {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

impl Coherence {
    pub fn new() -> Arc<Coherence> {
        let (tx, rx) = channel();
        Arc::new(Coherence {
            enabled: AtomicBool::new(false),
            last_push: AtomicU64::new(0),
            changed_here: DashMap::new(),
            next_seq: AtomicU64::new(0),
            invalidated: DashMap::new(),
            forgotten_floor: AtomicU64::new(0),
            watched: DashMap::new(),
            unwatched: DashMap::new(),
            queue: tx,
            pending: Mutex::new(Some(rx)),
            counters: Counters::default(),
            replayer: OnceLock::new(),
            lock_freed: OnceLock::new(),
            fixer: OnceLock::new(),
            fuse_dev: OnceLock::new(),
            names: Mutex::default(),
            barriers: Mutex::default(),
            alls_queued: AtomicU64::new(0),
            alls_applied: AtomicU64::new(0),
            created: DashMap::new(),
            new_dirs: DashMap::new(),
            listing_ends: DashMap::new(),
            names_made: AtomicU64::new(0),
            kernel_holds: DashMap::new(),
            inval_gate: Mutex::new(()),
            refused: Mutex::new(HashMap::new()),
            generations_kept: DashMap::new(),
        })
    }

    pub fn enable(&self) {
        self.enabled.store(true, Ordering::Relaxed);
        self.watched.insert(ROOT_NODE, Instant::now());
    }

    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// The push sequence to remember when sending a request.
    pub fn now(&self) -> u64 {
        self.last_push.load(Ordering::Acquire)
    }

    /// True when nothing about `node` was invalidated after a request sent at `sent` (whose
    /// reply is arriving now), and no replay of host events is changing names in it
    /// (invalidate/host_events.rs: a reply about an entry of such a directory is not cached, whenever
    /// it was sent).
    pub fn fresh(&self, node: NodeId, sent: u64) -> bool {
        self.unchanged_since(node, sent, true)
            && self.changed_here.get(&node).is_none_or(|s| *s <= sent)
    }

    /// This client just made or removed a name in directory `dir`: a reply about `dir` to
    /// a request sent before now may have been computed before the change (a listing of its
    /// parent on another server worker, or sent before an early-answered creation's BIND),
    /// so the kernel must not keep it ([`Coherence::fresh`]); if it did, the stale times
    /// would stand until the next change. What was learned of `dir` before stays usable: the
    /// client's own records follow its changes ([`Coherence::still_cacheable`]).
    pub fn changed_here(&self, dir: NodeId) {
        let seq = self.next_seq();
        (self.changed_here)
            .entry(dir)
            .and_modify(|s| *s = (*s).max(seq))
            .or_insert(seq);
        self.last_push.fetch_max(seq, Ordering::AcqRel);
    }

    /// `doubt_forgotten`: whether an invalidation dropped with a forgotten node may concern
    /// `node` (a reply racing the FORGET); not for a record kept since `since`, which goes
    /// with its node.
    fn unchanged_since(&self, node: NodeId, since: u64, doubt_forgotten: bool) -> bool {
        if self.replayer.get().is_some_and(|r| r.holds(node)) {
            return false;
        }
        match self.invalidated.get(&node) {
            Some(s) => *s <= since,
            None => !doubt_forgotten || self.forgotten_floor.load(Ordering::Acquire) <= since,
        }
    }

    /// May the kernel keep what a reply (to a request sent at `sent`) says about `node`
    /// until it is revoked?
    pub fn cacheable(&self, node: NodeId, sent: u64) -> bool {
        self.watches(node) && self.fresh(node, sent)
    }

    /// Does what the client kept about `node` from a reply found [`Coherence::cacheable`]
    /// (to a request sent at `since`) still hold? Such records go when the kernel forgets
    /// the node, so every invalidation of it since is on record.
    pub fn still_cacheable(&self, node: NodeId, since: u64) -> bool {
        self.watches(node) && self.unchanged_since(node, since, false)
    }

    /// The server pushes invalidations for `node`.
    pub fn watches(&self, node: NodeId) -> bool {
        self.enabled() && self.watched.contains_key(&node)
    }

    pub fn set_watched(&self, node: NodeId, watched: bool) {
        if watched {
            self.watched.insert(node, Instant::now());
            self.unwatched.remove(&node);
        } else {
            self.watched.remove(&node);
            if self.enabled()
                && self.unwatched.insert(node, Instant::now()).is_none()
                && self.unwatched.len() == 1
            {
                tracing::warn!(
                    "the server cannot watch part of the tree: those files are revalidated with \
                     the mount's --attr-timeout instead (see `tether status`)"
                );
            }
        }
    }

    /// The kernel was given `e` (lookup, creation, readdirplus).
    pub fn entry_given(&self, e: &tether_proto::Entry) {
        self.set_watched(e.node, e.flags & tether_proto::entry_flags::WATCHED != 0);
        if let Some(f) = self.fixer.get() {
            f.entry_given(e.node, e.generation, e.attr.mode);
        }
    }

    /// An entry of a node the kernel did not hold, recorded by [`Coherence::entry_given`],
    /// did not reach it after all (it did not fit in a listing's reply): no FORGET will come
    /// for it.
    pub fn entry_not_given(&self, node: NodeId) {
        if node != ROOT_NODE {
            self.watched.remove(&node);
            self.unwatched.remove(&node);
        }
    }

    /// The server made file `e` for a CREATE sent at `sent`.
    pub fn created(&self, e: &tether_proto::Entry, sent: u64) {
        if e.flags & tether_proto::entry_flags::NEW_FILE != 0 && self.cacheable(e.node, sent) {
            self.created.insert(e.node, sent);
        }
    }

    /// Whether `node` is known to have no `security.capability`: this client created it
    /// and nothing about it was invalidated since (a host `setcap` would have been). The
    /// kernel asks before the first write to every file (FUSE_HANDLE_KILLPRIV_V2), so this
    /// saves a round trip per new file.
    pub fn known_without_capability(&self, node: NodeId) -> bool {
        let Some(sent) = self.created.get(&node).map(|s| *s) else {
            return false;
        };
        let known = self.still_cacheable(node, sent);
        if !known {
            self.created.remove(&node);
        }
        known
    }

    /// The server made directory `e` for a MKDIR sent at `sent`: it is empty. After
    /// `entry_given` (only a watched directory is tracked), before the kernel hears of it.
    pub fn dir_made(&self, e: &tether_proto::Entry, sent: u64) {
        if e.attr.mode & libc::S_IFMT == libc::S_IFDIR && self.cacheable(e.node, sent) {
            self.new_dirs.insert(e.node, (sent, HashSet::new()));
        }
    }

    /// How many names were made (or moved somewhere) through this mount so far: taken
    /// when a listing is asked for, for [`Coherence::listing_ended`].
    pub fn names_made(&self) -> u64 {
        self.names_made.load(Ordering::SeqCst)
    }

    /// A listing of watched directory `dir` asked for at push sequence `sent`, with
    /// `names` made through this mount ([`Coherence::names_made`]), reached the directory's
    /// end after the entry with cookie `offset`, and the kernel got every entry.
    pub fn listing_ended(&self, dir: NodeId, offset: u64, sent: u64, names: u64) {
        // A name made while the listing was on its way may be missing from it: no mark.
        if self.cacheable(dir, sent) && self.names_made() == names {
            let end = ListingEnd {
                offset,
                sent,
                names,
                at: Instant::now(),
            };
            self.listing_ends.insert(dir, end);
        }
    }

    /// True when a listing of `dir` after cookie `offset` surely has no entries: the
    /// last listing ended there a moment ago, and since it was asked for nothing in `dir`
    /// was invalidated (a change by the host or another mount) and no name was made
    /// anywhere through this mount. Answers once.
    pub fn listing_surely_ended(&self, dir: NodeId, offset: u64) -> bool {
        self.listing_ends
            .remove_if(&dir, |_, end| end.offset == offset)
            .is_some_and(|(_, end)| {
                end.at.elapsed() < LISTING_END_FOR
                    && self.names_made() == end.names
                    && self.still_cacheable(dir, end.sent)
            })
    }

    /// `name` now exists in `dir`, made or moved there through this mount.
    pub fn name_made(&self, dir: NodeId, name: &[u8]) {
        self.names_made.fetch_add(1, Ordering::SeqCst);
        let full = match self.new_dirs.get_mut(&dir) {
            Some(mut d) if d.1.len() < NEW_DIR_NAMES_AT_MOST => {
                d.1.insert(Bytes::copy_from_slice(name));
                false
            }
            Some(_) => true,
            None => false,
        };
        if full {
            self.new_dirs.remove(&dir);
        }
    }

    /// `name` was removed from `dir` (or moved away) through this mount.
    pub fn name_removed(&self, dir: NodeId, name: &[u8]) {
        if let Some(mut d) = self.new_dirs.get_mut(&dir) {
            d.1.remove(name);
        }
    }

    /// True when `name` surely does not exist in `dir`: this client made the directory,
    /// made every name in it since, and nothing in it was invalidated (the host, or another
    /// mount, changed nothing there).
    pub fn surely_absent(&self, dir: NodeId, name: &[u8]) -> bool {
        // A name the server refuses gets its error from the server (ENAMETOOLONG, EINVAL).
        if !tether_proto::is_component(name) || name.len() > tether_proto::NAME_MAX {
            return false;
        }
        let Some(d) = self.new_dirs.get(&dir) else {
            return false;
        };
        if self.still_cacheable(dir, d.0) {
            return !d.1.contains(name);
        }
        drop(d);
        self.new_dirs.remove(&dir);
        false
    }

    /// This client is about to change `node`'s extended attributes.
    pub fn xattrs_changing(&self, node: NodeId) {
        self.created.remove(&node);
    }

    /// The kernel caches writes: host changes to regular files go through `fixer` too.
    pub fn set_fixer(&self, fixer: Arc<AttrFixer>) {
        fixer.start();
        let _ = self.fixer.set(fixer);
    }

    pub fn fixer(&self) -> Option<&Arc<AttrFixer>> {
        self.fixer.get()
    }

    /// The kernel holds no lookup of `node` any more (counted by `Known`: a LOOKUP answered
    /// just before a FORGET gave it the node again, and what that reply may be cached for
    /// depends on the node's invalidations).
    pub fn forget(&self, node: NodeId) {
        if let Some(f) = self.fixer.get() {
            f.forget(node);
        }
        if node != ROOT_NODE {
            self.watched.remove(&node);
            self.unwatched.remove(&node);
            // The floor first: `fresh` finds either the entry or the raised floor.
            let changed = self.changed_here.get(&node).map(|s| *s);
            if let Some(s) = self.invalidated.get(&node).map(|s| *s).max(changed) {
                self.forgotten_floor.fetch_max(s, Ordering::AcqRel);
            }
            self.invalidated.remove(&node);
            self.changed_here.remove(&node);
            self.created.remove(&node);
            self.new_dirs.remove(&node);
            self.listing_ends.remove(&node);
            if self.refused.lock().unwrap().remove(&node).is_some() {
                // Nothing to invalidate any more: a barrier may have waited for it.
                self.release_barriers();
            }
            self.generations_kept.remove(&node);
            // Nothing held any more, but a reply being decided about (a LOOKUP racing the
            // FORGET) still counts.
            if let Some(mut h) = self.kernel_holds.get_mut(&node) {
                h.given = false;
            }
            self.drop_holding_if_idle(node);
        }
    }

    /// `node`, which the kernel knows by `generation`, was made anew under another one by a
    /// reconnect: it is given to the kernel under `generation` until forgotten.
    pub fn keep_generation(&self, node: NodeId, generation: u64) {
        self.generations_kept.insert(node, generation);
    }

    /// The generation to give the kernel for `node`, which a reply gave as `generation`.
    pub fn generation(&self, node: NodeId, generation: u64) -> u64 {
        self.generations_kept.get(&node).map_or(generation, |g| *g)
    }

    /// Nodes cached until revoked, and nodes that fall back to revalidation.
    /// Who is told of LOCK_FREED pushes (the lock thread).
    pub fn on_lock_freed(&self, freed: LockFreed) {
        let _ = self.lock_freed.set(freed);
    }

    pub fn watch_counts(&self) -> (usize, usize) {
        (self.watched.len(), self.unwatched.len())
    }

    /// Called on the RPC reader thread for every push frame, in stream order.
    pub fn on_push(&self, h: FrameHeader, body: Bytes) {
        if h.op == push_op::LOCK_FREED {
            match decode_lock_freed(body) {
                Ok(nodes) => {
                    if let Some(freed) = self.lock_freed.get() {
                        for node in nodes {
                            freed(node);
                        }
                    }
                }
                Err(e) => tracing::warn!("malformed LOCK_FREED push: {e}"),
            }
            return;
        }
        if h.op != push_op::INVALIDATE {
            return; // a push type from a newer server: ignore it
        }
        let push = match decode_invalidate(body) {
            Ok(push) => push,
            Err(e) => {
                tracing::warn!("malformed invalidation push: {e}");
                return;
            }
        };
        // Local sequence numbers: a new connection's pushes count from 1 again.
        let seq = self.next_seq();
        for item in &push.items {
            match item {
                Invalidation::Inode(n) | Invalidation::Entry { parent: n, .. } => {
                    self.mark_invalidated(*n, seq);
                }
                Invalidation::All => self.invalidate_all(seq),
            }
        }
        self.last_push.fetch_max(seq, Ordering::AcqRel);
        self.counters.pushes.fetch_add(1, Ordering::Relaxed);
        let _ = self.queue.send(Queued::Push(push));
    }

    /// A new local sequence number, for a push or a distrust.
    fn next_seq(&self) -> u64 {
        self.next_seq.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// What the client kept about `node`, and replies about it already on their way, may
    /// be out of date although no push said so yet: a lock on it was just granted, and the
    /// last holder may have written it elsewhere a moment ago (fuse/locks.rs). Treated as
    /// invalidated now, as by a push; the caller drops the kernel's copy itself.
    pub fn distrust(&self, node: NodeId) {
        let seq = self.next_seq();
        self.mark_invalidated(node, seq);
        self.last_push.fetch_max(seq, Ordering::AcqRel);
    }

    /// What the kernel holds of `node` is wrong (a write it was told had succeeded failed on
    /// the server): treated as invalidated now, and dropped from the kernel by the
    /// invalidation thread, as a push would be.
    pub fn revoke(&self, node: NodeId) {
        self.drop_from_kernel(&[node], vec![Invalidation::Inode(node)]);
    }

    /// The kernel was told `name` in `dir` is `node`, and it is not (a creation answered
    /// early failed on the server): the name and the node are dropped from the kernel as a
    /// push would drop them, so that the next lookup asks the server.
    pub fn revoke_name(&self, dir: NodeId, name: Bytes, node: NodeId) {
        let items = vec![
            Invalidation::Entry { parent: dir, name },
            Invalidation::Inode(dir),
            Invalidation::Inode(node),
        ];
        self.drop_from_kernel(&[dir, node], items);
    }

    /// [`Coherence::revoke`] of `nodes`, applying `items` through the invalidation thread.
    fn drop_from_kernel(&self, nodes: &[NodeId], items: Vec<Invalidation>) {
        for &node in nodes {
            self.distrust(node);
            // Applied even without pushed invalidation, where nothing records what the
            // kernel holds (the invalidation thread skips nodes it was given nothing of).
            self.kernel_holds.entry(node).or_default().given = true;
        }
        let _ = self.queue.send(Queued::Push(InvalidatePush {
            items,
            events: Vec::new(),
        }));
    }

    /// Records that `node` was invalidated at `seq`, unless a later sequence is recorded
    /// already: a push (reader thread) and a distrust (lock thread) each take a number and
    /// then record it, possibly in the other order, and a record moved back would make a
    /// reply sent between the two count as fresh.
    fn mark_invalidated(&self, node: NodeId, seq: u64) {
        self.invalidated
            .entry(node)
            .and_modify(|s| *s = (*s).max(seq))
            .or_insert(seq);
    }

    /// Treats every node as invalidated at `seq`.
    fn invalidate_all(&self, seq: u64) {
        for mut e in self.invalidated.iter_mut() {
            *e = (*e).max(seq);
        }
        for e in self.watched.iter().chain(self.unwatched.iter()) {
            self.mark_invalidated(*e.key(), seq);
        }
    }

    /// The kernel may keep something of `node` that a later push must drop: pages or a
    /// listing a request is about to fill, or attributes a reply gives it for longer than
    /// a moment ([`Coherence::caching`]). Said before the request is sent.
    pub fn kernel_may_hold(&self, node: NodeId) {
        if self.enabled() {
            self.kernel_holds.entry(node).or_default().given = true;
        }
    }

    /// A reply about `node` is being decided: taken before its freshness is checked, so
    /// that a push recorded after the check finds it, and it is applied.
    ///
    /// A pushed `inval_inode` of a node the kernel was given nothing of since the last one
    /// (and no reply is being decided about) is not needed, and it would do harm: the
    /// kernel throws away an attribute reply when the file is invalidated while the reply
    /// is on its way, so a file the host never stops changing (a `utime` every 0.2 ms)
    /// had nearly every GETATTR's answer dropped, and reads went by the size from before
    /// the host made it longer. Skipped, the reply is taken; one to a request sent before
    /// the push is not fresh and so given with TTL 0.
    pub fn caching(&self, node: NodeId) -> Caching<'_> {
        if self.enabled() {
            self.kernel_holds.entry(node).or_default().deciding += 1;
        }
        Caching { co: self, node }
    }

    /// Whether a pushed `inval_inode` of `node` must be applied; if so, what the kernel
    /// was given counts as dropped from now on.
    fn kernel_holds_anything(&self, node: NodeId) -> bool {
        let Some(mut h) = self.kernel_holds.get_mut(&node) else {
            return false;
        };
        let holds = h.given || h.deciding > 0;
        h.given = false;
        drop(h);
        self.drop_holding_if_idle(node);
        holds
    }

    /// Forgets `node`'s [`Holding`] once there is nothing in it.
    fn drop_holding_if_idle(&self, node: NodeId) {
        (self.kernel_holds).remove_if(&node, |_, h| !h.given && h.deciding == 0);
    }

    /// Drops the kernel's attributes of `node` and its pages in `offset..offset + len`
    /// (`len` 0: to the end). Every `inval_inode` of the mount goes through here, so that
    /// [`Coherence::hold_invalidations`] can hold them all back.
    pub fn inval_inode(
        &self,
        notifier: &Notifier,
        node: NodeId,
        offset: i64,
        len: i64,
    ) -> std::io::Result<()> {
        let _gate = self.inval_gate.lock().unwrap_or_else(|e| e.into_inner());
        notifier.inval_inode(ino_of(node), offset, len)
    }

    /// Holds back every `inval_inode` until the guard is dropped. The kernel throws away
    /// an attribute reply if the file is invalidated while the reply is on its way (the
    /// inode's `attr_version` moved), and then goes by the size it had: a lock's grant
    /// that asks for the size the last holder left must not meet one (fuse/locks.rs).
    /// Never hold it on a FUSE handler's thread, nor on the invalidation thread.
    pub fn hold_invalidations(&self) -> std::sync::MutexGuard<'_, ()> {
        self.inval_gate.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The connection was lost or replaced: whatever changed meanwhile was never pushed,
    /// so every cache goes, and no reply to a request sent before now is cached. Waits (at
    /// most `wait`) until the kernel has dropped them: a request waiting for the connection
    /// may hold a page the invalidation needs, so it cannot wait for good.
    pub fn distrust_all(&self, wait: Duration) {
        let seq = self.next_seq();
        self.invalidate_all(seq);
        self.last_push.fetch_max(seq, Ordering::AcqRel);
        let target = self.alls_queued.fetch_add(1, Ordering::AcqRel) + 1;
        let _ = self.queue.send(Queued::Push(InvalidatePush {
            items: vec![Invalidation::All],
            events: Vec::new(),
        }));
        let deadline = Instant::now() + wait;
        while self.alls_applied.load(Ordering::Acquire) < target && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Starts the thread that applies invalidations to the kernel and, with a `replayer`,
    /// the thread that replays host events into the guest (see invalidate/host_events.rs).
    /// `fuse_dev` is the mount's /dev/fuse descriptor, for notifications fuser lacks.
    pub fn start_applier(
        self: &Arc<Self>,
        notifier: Notifier,
        replayer: Option<Arc<Replayer>>,
        fuse_dev: Option<OwnedFd>,
    ) {
        if let Some(fd) = fuse_dev {
            let _ = self.fuse_dev.set(fd);
        }
        let Some(rx) = self.pending.lock().unwrap().take() else {
            return;
        };
        let replays = replayer.map(|r| {
            let _ = self.replayer.set(r.clone());
            let (tx, rx) = channel();
            let (me, notifier) = (self.clone(), notifier.clone());
            std::thread::Builder::new()
                .name("tether-replay".into())
                .spawn(move || {
                    r.bind_to_current_thread();
                    // Replays scan the guest's processes for watchers: in a one-vCPU guest
                    // that must not hold up the content invalidations beside it.
                    crate::sys::lower_this_threads_priority(10);
                    me.replay_loop(rx, notifier, &r)
                })
                .expect("spawn replay thread");
            tx
        });
        let me = self.clone();
        std::thread::Builder::new()
            .name("tether-invalidate".into())
            .spawn(move || me.apply_loop(rx, notifier, replays))
            .expect("spawn invalidation thread");
    }

    fn apply_loop(
        &self,
        rx: Receiver<Queued>,
        notifier: Notifier,
        replays: Option<Sender<Replay>>,
    ) {
        let mut batch = 0;
        loop {
            // Wake up for the next push, when the oldest waiting names are due, to try
            // refused invalidations again, or now and then while a barrier waits (a safety
            // net: whatever it waits for tells it).
            let names_due = self.names.lock().unwrap().waiting.front().map(|w| w.due);
            let retry_due = self.refused.lock().unwrap().values().map(|r| r.next).min();
            let barrier_due = (!self.barriers.lock().unwrap().is_empty())
                .then(|| Instant::now() + BARRIER_LOOK_AGAIN);
            let first = match names_due
                .into_iter()
                .chain(retry_due)
                .chain(barrier_due)
                .min()
            {
                None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
                Some(due) => rx.recv_timeout(due.saturating_duration_since(Instant::now())),
            };
            let first = match first {
                Ok(first) => first,
                Err(RecvTimeoutError::Timeout) => {
                    self.retry_refused(&notifier);
                    self.apply_waiting_names(|w| w.due <= Instant::now(), &notifier);
                    self.release_barriers();
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => return,
            };
            // Coalesce a burst: everything queued so far, up to a barrier, each invalidation
            // once.
            let (mut items, mut events, mut barrier) = match first {
                Queued::Push(p) => (p.items, p.events, None),
                Queued::Barrier(done) => (Vec::new(), Vec::new(), Some(done)),
            };
            while barrier.is_none() {
                match rx.try_recv() {
                    Ok(Queued::Push(more)) => {
                        items.extend(more.items);
                        events.extend(more.events);
                    }
                    Ok(Queued::Barrier(done)) => barrier = Some(done),
                    Err(_) => break,
                }
            }
            let mut seen = HashSet::new();
            items.retain(|item| seen.insert(item.clone()));
            tracing::trace!(
                target: "tether::lat",
                items = items.len(),
                events = events.len(),
                "applying"
            );
            match &replays {
                Some(tx) if !events.is_empty() => {
                    // Content now, so that a watcher woken by an event reads the new data.
                    // Names after the events are replayed (at most NAMES_WAIT_AT_MOST
                    // later), so that a replayed removal still finds the directories above
                    // it that the host removed.
                    let (names, others): (Vec<_>, Vec<_>) = items
                        .into_iter()
                        .partition(|i| matches!(i, Invalidation::Entry { .. }));
                    self.apply(others, &notifier);
                    batch += 1;
                    // (A batch without names leaves nothing waiting: a barrier after it need
                    // not wait for its replays.)
                    if !names.is_empty() {
                        self.names.lock().unwrap().waiting.push_back(WaitingNames {
                            batch,
                            due: Instant::now() + NAMES_WAIT_AT_MOST,
                            names,
                        });
                    }
                    if tx.send(Replay { events, batch }).is_err() {
                        self.apply_waiting_names(|_| true, &notifier);
                    }
                }
                _ => self.apply(items, &notifier),
            }
            tracing::trace!(target: "tether::lat", "applied");
            self.retry_refused(&notifier);
            self.apply_waiting_names(|w| w.due <= Instant::now(), &notifier);
            if let Some(done) = barrier {
                self.barrier_reached(batch, done);
            }
        }
    }

    /// Waits (at most `limit`) until every push received before the call has been applied
    /// to the kernel: the invalidations of its batch, the name invalidations that wait for
    /// the replays of its host events (`NAMES_WAIT_AT_MOST`), the invalidations the kernel
    /// refused while it was still making a node (tried again, `BARRIER_WAITS_FOR_REFUSED`
    /// at most), and with the writeback cache the fixes they queued. False if the limit
    /// passed first (or the invalidation thread is gone).
    ///
    /// After a SYNC reply (protocol.md §18) every push before it has been received, so the
    /// kernel then holds nothing older than any host change made before the SYNC was sent.
    pub fn barrier(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let (done, wait) = channel();
        if self.queue.send(Queued::Barrier(done)).is_err() {
            return false;
        }
        if wait.recv_timeout(limit).is_err() {
            return false;
        }
        if let Some(f) = self.fixer.get() {
            let left = deadline.saturating_duration_since(Instant::now());
            f.settle(left.min(FIX_WAIT_AT_MOST));
        }
        true
    }

    /// The invalidation thread applied everything queued before a barrier (up to batch
    /// `batch` of waiting names): it is done now, or once the rest has been applied.
    fn barrier_reached(&self, batch: u64, done: Sender<()>) {
        let now = Instant::now();
        let refused = (self.refused.lock().unwrap().iter())
            .map(|(node, r)| (*node, r.since))
            .collect();
        self.barriers.lock().unwrap().push(PendingBarrier {
            batch,
            refused,
            until: now + BARRIER_WAITS_FOR_REFUSED,
            done,
        });
        self.release_barriers();
    }

    /// Tells the barriers whose waiting names and refused invalidations have all been
    /// applied (or given up on) since they were reached.
    fn release_barriers(&self) {
        let mut barriers = self.barriers.lock().unwrap();
        if barriers.is_empty() {
            return;
        }
        let now = Instant::now();
        let names = self.names.lock().unwrap();
        let refused = self.refused.lock().unwrap();
        barriers.retain(|b| {
            let still_refused = b.refused.iter().any(|(node, since)| {
                refused.get(node).is_some_and(|r| r.since == *since) && now < b.until
            });
            if !names.applied_through(b.batch) || still_refused {
                return true;
            }
            let _ = b.done.send(());
            false
        });
    }

    /// Applies a pushed `inval_inode` of `node`, to be tried again if the kernel has no
    /// inode for it though it was given the node and has not forgotten it. The kernel makes
    /// a node's inode on the thread of the request that returned it (a LOOKUP, or each entry
    /// of a READDIRPLUS), once that thread runs after the reply; a push applied in between
    /// finds nothing, and the inode is then made with the attributes from before the change,
    /// cached until revoked. (Seen 80 times in 1,000 host writes racing guest listings under
    /// load; fsx.rs's rename test once read a file as 0 bytes this way.) A name has no such
    /// gap: `inval_entry` waits for the directory's lookups and listings to finish.
    fn inval_pushed(&self, notifier: &Notifier, node: NodeId) {
        let r = self.inval_inode(notifier, node, 0, 0);
        tracing::trace!(%node, ok = r.is_ok(), "inval_inode");
        let just_given =
            || (self.last_given(node)).is_some_and(|at| at.elapsed() < REFUSED_GIVEN_WITHIN);
        if is_not_found(&r) && just_given() {
            let now = Instant::now();
            let mut refused = self.refused.lock().unwrap();
            if refused.len() < REFUSED_AT_MOST {
                refused.entry(node).or_insert(Refused {
                    since: now,
                    next: now + REFUSED_FIRST_WAIT,
                    wait: REFUSED_FIRST_WAIT,
                });
            } else {
                drop(refused);
                self.gave_up_on(node);
            }
        }
        if let Some(f) = self.fixer.get() {
            f.fix_later(node);
        }
    }

    /// When the kernel was last given `node` (in an entry), if it has not forgotten it.
    pub fn last_given(&self, node: NodeId) -> Option<Instant> {
        (self.watched.get(&node).map(|t| *t)).or_else(|| self.unwatched.get(&node).map(|t| *t))
    }

    /// Tries the refused invalidations that are due again: each is done once the kernel
    /// has the inode, or when the node is forgotten (there was nothing to drop), or given
    /// up after [`REFUSED_RETRY_FOR`].
    fn retry_refused(&self, notifier: &Notifier) {
        let now = Instant::now();
        let due: Vec<(NodeId, Refused)> = {
            let refused = self.refused.lock().unwrap();
            (refused.iter())
                .filter(|(_, r)| r.next <= now)
                .map(|(n, r)| (*n, *r))
                .collect()
        };
        for (node, r) in due {
            let result = self.inval_inode(notifier, node, 0, 0);
            let mut refused = self.refused.lock().unwrap();
            if is_not_found(&result) && self.last_given(node).is_some() {
                if r.since.elapsed() < REFUSED_RETRY_FOR {
                    let wait = (r.wait * 2).min(REFUSED_LONGEST_WAIT);
                    let next = Instant::now() + wait;
                    refused.insert(node, Refused { next, wait, ..r });
                    continue;
                }
                refused.remove(&node);
                drop(refused);
                self.gave_up_on(node);
                continue;
            }
            refused.remove(&node);
            drop(refused);
            if result.is_ok() {
                (self.counters.invalidations_retried).fetch_add(1, Ordering::Relaxed);
                if let Some(f) = self.fixer.get() {
                    f.fix_later(node);
                }
            }
        }
        self.release_barriers();
    }

    /// A refused invalidation of `node` is not tried again. If the kernel makes the inode
    /// after all, the next push must still be applied, not skipped as unneeded.
    fn gave_up_on(&self, node: NodeId) {
        tracing::debug!(
            %node,
            "the kernel has no inode for a node it was given: not invalidated"
        );
        self.kernel_may_hold(node);
    }

    /// Applies the waiting name invalidations from the oldest on, as long as `ready`.
    fn apply_waiting_names(&self, ready: impl Fn(&WaitingNames) -> bool, notifier: &Notifier) {
        let mut names = Vec::new();
        let oldest = {
            let mut n = self.names.lock().unwrap();
            let Some(oldest) = n.waiting.front().filter(|w| ready(w)).map(|w| w.batch) else {
                return;
            };
            while n.waiting.front().is_some_and(&ready) {
                names.extend(n.waiting.pop_front().unwrap().names);
            }
            n.applying.push(oldest);
            oldest
        };
        self.apply(names, notifier);
        {
            let mut n = self.names.lock().unwrap();
            if let Some(i) = n.applying.iter().position(|&b| b == oldest) {
                n.applying.swap_remove(i);
            }
        }
        self.release_barriers();
    }

    /// Replays host events a slice at a time, then applies the name invalidations that
    /// waited for them (unless the invalidation thread did, because they were due). Runs on
    /// its own thread, so that content invalidations never wait for a replay (or for the
    /// scan of guest watchers before it).
    fn replay_loop(&self, rx: Receiver<Replay>, notifier: Notifier, r: &Replayer) {
        let mut backlog = Backlog::default();
        let mut admitted = 0;
        let mut changed = HashSet::new();
        loop {
            let mut work = Vec::new();
            if backlog.is_empty() {
                match rx.recv() {
                    Ok(w) => work.push(w),
                    Err(_) => return,
                }
            }
            work.extend(rx.try_iter());
            for w in work {
                if self.fixer.get().is_some() {
                    changed.extend(w.events.iter().filter_map(|e| e.node));
                }
                r.admit(&mut backlog, w.events);
                admitted = w.batch;
            }
            tracing::trace!(admitted, "replay: host events admitted");
            if let Some(f) = self.fixer.get() {
                // The fixes of the files these events are about were queued before the
                // events were sent here: a watcher woken by an event must read the new size.
                f.settle(FIX_WAIT_AT_MOST);
                tracing::trace!("replay: fixes settled");
            }
            r.replay(&mut backlog, &notifier, REPLAY_SLICE);
            tracing::trace!(done = backlog.is_empty(), "replay: replayed");
            if backlog.is_empty() {
                // A replay sets a file's times to what the kernel showed when it ran, which
                // may predate a fix made meanwhile by the invalidation thread: fix again.
                if let Some(f) = self.fixer.get() {
                    changed.drain().for_each(|n| f.fix_later(n));
                }
                self.apply_waiting_names(|w| w.batch <= admitted, &notifier);
            }
        }
    }

    fn apply(&self, items: Vec<Invalidation>, notifier: &Notifier) {
        for item in items {
            // (The writeback cache's fixer follows every invalidation: kept as it is.)
            if let Invalidation::Inode(n) = item {
                if self.fixer.get().is_none() && !self.kernel_holds_anything(n) {
                    let unneeded = &self.counters.invalidations_unneeded;
                    unneeded.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
            }
            self.counters.invalidations.fetch_add(1, Ordering::Relaxed);
            // Errors mean the kernel holds nothing for it (already forgotten, or not yet
            // made: `inval_pushed`).
            match item {
                Invalidation::Inode(n) => self.inval_pushed(notifier, n),
                Invalidation::Entry { parent, name } => {
                    let r = notifier.inval_entry(ino_of(parent), OsStr::from_bytes(&name));
                    tracing::trace!(%parent, name = %String::from_utf8_lossy(&name), ok = r.is_ok(), "inval_entry");
                }
                Invalidation::All => {
                    // Cached names cannot be listed one by one: make the kernel look every
                    // name up again (FUSE_NOTIFY_INC_EPOCH, Linux 6.16), or else ask it to
                    // drop every unused dentry (best effort; needs root). Names first: it
                    // is cheap and never waits for a request.
                    let bumped = self.fuse_dev.get().is_some_and(|fd| inc_epoch(fd).is_ok());
                    let nodes: Vec<NodeId> = (self.watched.iter().chain(self.unwatched.iter()))
                        .map(|e| *e.key())
                        .collect();
                    for n in nodes {
                        self.inval_pushed(notifier, n);
                    }
                    if !bumped {
                        let _ = std::fs::write("/proc/sys/vm/drop_caches", "2");
                    }
                    self.alls_applied.fetch_add(1, Ordering::AcqRel);
                }
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use tether_proto::{invalidate_frame, FrameHeader, FRAME_HEADER_LEN, MAX_FRAME_LEN};

    /// Delivers a push of `items` with sequence `seq`, as the connection would.
    pub(crate) fn push(co: &Coherence, seq: u64, items: &[Invalidation]) {
        let frame = invalidate_frame(seq, items, &[]);
        let h = FrameHeader::decode(frame[..FRAME_HEADER_LEN].try_into().unwrap(), MAX_FRAME_LEN)
            .unwrap();
        co.on_push(h, Bytes::copy_from_slice(&frame[FRAME_HEADER_LEN..]));
    }

    /// The end of a listing answers the kernel's next READDIR once, at that offset, within
    /// a second, and only while nothing could have added a name to the directory since the
    /// listing was asked for.
    #[test]
    fn a_listing_end_answers_once_and_only_while_nothing_changed() {
        let co = Coherence::new();
        co.enable();
        co.set_watched(NodeId::new(5), true);
        let asked = |co: &Coherence| (co.now(), co.names_made());

        let (sent, names) = asked(&co);
        co.listing_ended(NodeId::new(5), 99, sent, names);
        assert!(
            !co.listing_surely_ended(NodeId::new(5), 98),
            "another offset"
        );
        assert!(co.listing_surely_ended(NodeId::new(5), 99));
        assert!(
            !co.listing_surely_ended(NodeId::new(5), 99),
            "answered once"
        );

        // A name made through the mount, in any directory, after the listing was asked
        // for: before its reply came, or after.
        let (sent, names) = asked(&co);
        co.name_made(NodeId::new(6), b"made-meanwhile");
        co.listing_ended(NodeId::new(5), 99, sent, names);
        assert!(
            !co.listing_surely_ended(NodeId::new(5), 99),
            "made while the listing was on its way"
        );
        let (sent, names) = asked(&co);
        co.listing_ended(NodeId::new(5), 99, sent, names);
        co.name_made(NodeId::new(5), b"made-after");
        assert!(
            !co.listing_surely_ended(NodeId::new(5), 99),
            "made after the listing"
        );

        // The directory invalidated by a push: before the reply came, or after.
        let (sent, names) = asked(&co);
        push(&co, 1, &[Invalidation::Inode(NodeId::new(5))]);
        co.listing_ended(NodeId::new(5), 99, sent, names);
        assert!(
            !co.listing_surely_ended(NodeId::new(5), 99),
            "pushed while on its way"
        );
        let (sent, names) = asked(&co);
        co.listing_ended(NodeId::new(5), 99, sent, names);
        push(&co, 2, &[Invalidation::Inode(NodeId::new(5))]);
        assert!(!co.listing_surely_ended(NodeId::new(5), 99), "pushed after");

        // Not watched: no pushes would say when it changed.
        co.set_watched(NodeId::new(7), false);
        let (sent, names) = asked(&co);
        co.listing_ended(NodeId::new(7), 99, sent, names);
        assert!(
            !co.listing_surely_ended(NodeId::new(7), 99),
            "an unwatched directory"
        );

        // Too old.
        let (sent, names) = asked(&co);
        co.listing_ended(NodeId::new(5), 99, sent, names);
        std::thread::sleep(LISTING_END_FOR + Duration::from_millis(50));
        assert!(
            !co.listing_surely_ended(NodeId::new(5), 99),
            "a second later"
        );
    }

    #[test]
    fn a_reply_to_a_request_sent_before_an_invalidation_is_not_cached() {
        let co = Coherence::new();
        co.enable();
        co.set_watched(NodeId::new(7), true);
        co.set_watched(NodeId::new(8), true);
        let sent_before = co.now();
        push(
            &co,
            1,
            &[
                Invalidation::Inode(NodeId::new(7)),
                Invalidation::Entry {
                    parent: NodeId::new(8),
                    name: Bytes::from_static(b"x"),
                },
            ],
        );
        // Sent before the push: replies about 7 (or entries in 8) may predate the change.
        assert!(!co.fresh(NodeId::new(7), sent_before));
        assert!(!co.cacheable(NodeId::new(8), sent_before));
        // Sent after the push arrived: the server answered after seeing the change.
        let sent_after = co.now();
        assert_eq!(sent_after, 1);
        assert!(co.cacheable(NodeId::new(7), sent_after));
        assert!(co.cacheable(NodeId::new(8), sent_after));
        // Nodes not named by the push stay cacheable either way.
        co.set_watched(NodeId::new(9), true);
        assert!(co.cacheable(NodeId::new(9), sent_before));
    }

    #[test]
    fn unwatched_nodes_and_disabled_coherence_are_never_cached_indefinitely() {
        let co = Coherence::new();
        co.set_watched(NodeId::new(5), true);
        assert!(!co.cacheable(NodeId::new(5), 0), "coherence not negotiated");
        co.enable();
        co.set_watched(NodeId::new(5), false);
        assert!(!co.cacheable(NodeId::new(5), 0));
        assert_eq!(co.watch_counts(), (1, 1), "root watched, node 5 not");
        co.forget(NodeId::new(5));
        assert_eq!(co.watch_counts(), (1, 0));
    }

    /// tether-fsx with a guest watcher under CPU load: the kernel forgot a file while a
    /// LOOKUP of it was on its way, the forget dropped the file's invalidation, and the
    /// reply (or attributes known from before the host's change) was then cached for good.
    #[test]
    fn forgetting_a_node_does_not_make_older_replies_about_it_fresh() {
        let co = Coherence::new();
        co.enable();
        co.set_watched(NodeId::new(7), true);
        let sent_before = co.now();
        push(&co, 1, &[Invalidation::Inode(NodeId::new(7))]);
        co.forget(NodeId::new(7));
        co.set_watched(NodeId::new(7), true); // the racing LOOKUP's reply
        assert!(!co.fresh(NodeId::new(7), sent_before));
        assert!(co.fresh(NodeId::new(7), co.now()));
        // Other nodes: only replies to requests in flight at that push are doubted, not
        // what was kept from replies before it.
        co.set_watched(NodeId::new(9), true);
        assert!(!co.cacheable(NodeId::new(9), sent_before));
        assert!(co.cacheable(NodeId::new(9), co.now()));
        assert!(co.still_cacheable(NodeId::new(9), sent_before));
    }

    #[test]
    fn overflow_invalidates_everything_known() {
        let co = Coherence::new();
        co.enable();
        co.set_watched(NodeId::new(3), true);
        let sent = co.now();
        push(&co, 4, &[Invalidation::All]);
        assert!(!co.fresh(NodeId::new(3), sent));
        assert!(!co.fresh(ROOT_NODE, sent));
        assert_eq!(co.counters.pushes.load(Ordering::Relaxed), 1);
    }

    /// A pushed `inval_inode` is applied only if the kernel may hold something of the node
    /// given since the last one, or a reply about it is being decided.
    #[test]
    fn an_inval_is_needed_only_for_what_the_kernel_was_given_since_the_last() {
        let co = Coherence::new();
        co.enable();
        assert!(
            !co.kernel_holds_anything(NodeId::new(7)),
            "never given anything"
        );
        co.kernel_may_hold(NodeId::new(7)); // a READ, say
        assert!(co.kernel_holds_anything(NodeId::new(7)));
        assert!(
            !co.kernel_holds_anything(NodeId::new(7)),
            "dropped by the one before"
        );

        // A reply being decided: needed until it is done, and after it only if cached.
        let reply = co.caching(NodeId::new(7));
        assert!(co.kernel_holds_anything(NodeId::new(7)));
        assert!(
            co.kernel_holds_anything(NodeId::new(7)),
            "still being decided"
        );
        drop(reply);
        assert!(
            !co.kernel_holds_anything(NodeId::new(7)),
            "given with TTL 0"
        );
        let reply = co.caching(NodeId::new(7));
        reply.cached();
        drop(reply);
        assert!(co.kernel_holds_anything(NodeId::new(7)));
        assert!(!co.kernel_holds_anything(NodeId::new(7)));

        // A FORGET drops what was given, but not a reply racing it.
        co.kernel_may_hold(NodeId::new(7));
        co.forget(NodeId::new(7));
        assert!(!co.kernel_holds_anything(NodeId::new(7)), "forgotten");
        let reply = co.caching(NodeId::new(7));
        co.forget(NodeId::new(7));
        assert!(
            co.kernel_holds_anything(NodeId::new(7)),
            "a LOOKUP racing the FORGET"
        );
        reply.cached();
        drop(reply);
        assert!(co.kernel_holds_anything(NodeId::new(7)));
        assert!(co.kernel_holds.is_empty(), "nothing left behind");
    }

    #[test]
    fn a_barrier_waits_for_the_names_of_its_batches_also_while_they_are_applied() {
        let waiting = |batch| WaitingNames {
            batch,
            due: Instant::now(),
            names: Vec::new(),
        };
        let mut n = Names::default();
        assert!(n.applied_through(7), "nothing waits");
        n.waiting.extend([waiting(3), waiting(4)]);
        assert!(n.applied_through(2));
        assert!(!n.applied_through(3) && !n.applied_through(9));
        // Batches 3 and 4 taken out by one thread and being applied: still not done.
        n.waiting.clear();
        n.applying.push(3);
        n.waiting.push_back(waiting(5));
        assert!(n.applied_through(2));
        assert!(!n.applied_through(4) && !n.applied_through(5));
        n.applying.clear();
        assert!(n.applied_through(4) && !n.applied_through(5));
    }

    /// A distrust takes its sequence number before a push does, but records it after:
    /// the push's later number stays, and a reply to a request sent between the two is
    /// not fresh.
    #[test]
    fn an_invalidation_record_never_goes_back() {
        let co = Coherence::new();
        co.enable();
        co.set_watched(NodeId::new(7), true);
        let distrust_seq = co.next_seq();
        let sent_between = co.now();
        push(&co, 1, &[Invalidation::Inode(NodeId::new(7))]);
        co.mark_invalidated(NodeId::new(7), distrust_seq);
        assert_eq!(
            co.invalidated.get(&NodeId::new(7)).map(|s| *s),
            Some(distrust_seq + 1)
        );
        assert!(!co.fresh(NodeId::new(7), sent_between));
        // And an "everything" push keeps a later record too.
        co.mark_invalidated(NodeId::new(7), 10);
        co.invalidate_all(9);
        assert_eq!(co.invalidated.get(&NodeId::new(7)).map(|s| *s), Some(10));
    }
}
