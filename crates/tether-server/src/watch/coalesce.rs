//! A session's [`Watch`]: a watching backend, and what turns its events into what the
//! client is told: the invalidations its caches need and, if it asked (HOST_EVENTS), the
//! host events behind them, so that it can raise the inotify events a local change would
//! have raised in the guest. Echoes of the session's own changes are left out of both
//! (echo.rs).

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use dashmap::DashMap;
use tether_proto::{changed, EventKind, HostEvent, Invalidation, NodeId, ROOT_NODE};

use super::echo::{self, Expected};
use super::{Batch, Change, NameChange, Watcher};
use crate::backend::{Backend, SysResult};
use crate::nodes::{Node, NodeTable};

/// Files with someone else's change not yet closed that are remembered at most (a writer
/// that never closes, or a file deleted first, is forgotten when the table is full).
const MAX_FOREIGN_WRITERS: usize = 65_536;

/// The longest events gather after the first one wakes the watcher during a burst. A guest
/// writing or creating files makes three or four events per file, each of which would wake
/// the watcher (and preempt the worker answering the guest) on its own; a `git checkout` on
/// the host makes thousands, each of which would be a push. Gathered, inotify also merges
/// repeats (a file's IN_MODIFY per write), and one push carries many.
const SETTLE: Duration = Duration::from_millis(2);

/// The first gathering of a burst; each wake-up that follows closely doubles it, up to
/// [`SETTLE`].
const SETTLE_FIRST: Duration = Duration::from_micros(250);

/// Events that come after the watch queues were empty this long are not part of a burst:
/// they are read and pushed at once (see [`Burst`]).
const QUIET: Duration = Duration::from_micros(200);

/// Wake-ups that follow closely (within [`QUIET`]) but are read at once, before gathering
/// starts: a single host change makes two or three (a write's IN_MODIFY, then its
/// IN_CLOSE_WRITE a moment later), and none of them should wait.
const QUICK_FOLLOWERS: u32 = 2;

/// A batch of this many events is a burst: the wake-up that follows it closely gathers for
/// [`SETTLE`] at once.
const BIG_BATCH: usize = 64;

/// More than this many wake-ups within [`RATE_WINDOW`] are a burst too, however far apart
/// (a host process writing a file every millisecond): the next ones gather for [`SETTLE`],
/// which keeps a steady stream of changes to about one push per [`SETTLE`] plus
/// `RATE_WAKES` per window, where it was one per [`SETTLE`] before.
const RATE_WAKES: usize = 16;
const RATE_WINDOW: Duration = Duration::from_millis(10);

/// Whether watch events come in a burst, and for how long to let them gather.
///
/// A single change after a quiet moment is read and pushed at once: its guest sees it
/// without waiting. Wake-ups that keep following each other closely (the queues never
/// stay empty for [`QUIET`]) are a burst, which gathers for longer and longer: after
/// [`QUICK_FOLLOWERS`] wake-ups read at once, [`SETTLE_FIRST`], doubled at each wake-up, up
/// to [`SETTLE`]; so is a big batch ([`BIG_BATCH`]) or a fast stream of wake-ups
/// ([`RATE_WAKES`]). A `git checkout` on the host or a guest writing many files so costs
/// about one push (and one wake-up of the watcher) per [`SETTLE`], as before.
#[derive(Debug, Default)]
struct Burst {
    /// Wake-ups in a row that came within [`QUIET`] of the last.
    level: u32,
    /// Events in the last batch taken from the backend.
    last_batch: usize,
    /// The last [`RATE_WAKES`] wake-ups.
    wakes: std::collections::VecDeque<Instant>,
}

impl Burst {
    /// Events woke the watcher at `now`, after the queues had been empty for `quiet`: how
    /// long to let more gather before reading them.
    fn woken(&mut self, now: Instant, quiet: Duration) -> Duration {
        let fast = self.wakes.len() >= RATE_WAKES
            && self.wakes.front().is_some_and(|&t| now - t < RATE_WINDOW);
        if self.wakes.len() >= RATE_WAKES {
            self.wakes.pop_front();
        }
        self.wakes.push_back(now);
        if quiet >= QUIET {
            self.level = 0;
            return if fast { SETTLE } else { Duration::ZERO };
        }
        self.level = self.level.saturating_add(1);
        if fast || self.last_batch >= BIG_BATCH {
            return SETTLE;
        }
        match self.level.checked_sub(QUICK_FOLLOWERS + 1) {
            None => Duration::ZERO,
            Some(doublings) => SETTLE_FIRST
                .saturating_mul(1 << doublings.min(16))
                .min(SETTLE),
        }
    }

    /// Nothing came for a whole wait.
    fn idle(&mut self) {
        self.level = 0;
    }
}

/// One batch of changes for the client.
#[derive(Debug, Default)]
pub struct Changes {
    pub items: Vec<Invalidation>,
    pub events: Vec<HostEvent>,
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        self.items.is_empty() && self.events.is_empty()
    }
}

/// Builds one batch: invalidations once each, events in order, content events of one name
/// merged, and the two halves of a rename joined.
#[derive(Default)]
struct Collector {
    out: Changes,
    seen: std::collections::HashSet<Invalidation>,
    /// (dir, name) -> index of its `Changed` event in this batch.
    changed_at: HashMap<(NodeId, Vec<u8>), usize>,
    /// rename cookie -> index of the provisional `Deleted` event its first half left.
    moved_from: HashMap<u32, usize>,
    /// For a watcher without cookies: (dir, name) -> index of its `Deleted` event, which a
    /// creation of the same file elsewhere in the batch turns into a rename.
    deleted_at: HashMap<(NodeId, Vec<u8>), usize>,
    /// Directory paths resolved in this batch, and the export root's own path.
    paths: HashMap<NodeId, Option<Bytes>>,
    root: Option<Option<Vec<u8>>>,
}

impl Collector {
    fn invalidate(&mut self, inv: Invalidation) {
        if self.seen.insert(inv.clone()) {
            self.out.items.push(inv);
        }
    }

    /// The name event `to` is the second half of a rename whose first half is the event at
    /// `at` in this batch: the two become one move, where the first half stood.
    fn moved_here(&mut self, at: usize, mut to: HostEvent) {
        let from = &self.out.events[at];
        to.kind = EventKind::Moved {
            from_dir: from.dir,
            from_path: from.dir_path.clone(),
            from_name: from.name.clone(),
        };
        self.out.events[at] = to;
    }
}

/// What a session watches with, and what it remembers to tell its own changes from others.
pub struct Watch {
    watcher: Box<dyn Watcher>,
    nodes: Arc<NodeTable>,
    host: Arc<dyn Backend>,
    /// The client also wants the host changes behind the invalidations (HOST_EVENTS).
    host_events: bool,
    /// Name changes of this session whose events are still to come.
    expected: Expected,
    /// Files (dev, ino) someone other than this session changed and has not closed yet.
    foreign_writers: DashMap<(u64, u64), ()>,
    /// Batches of events taken in hand so far, counted before any is looked at: a lookup
    /// during which it moved may have had its change told to nobody (ops/lookup.rs, `state_now`).
    batches_seen: AtomicU64,
    /// Held while a directory's watch is added ([`Watch::watch_dir`]) or a forgotten node's
    /// is dropped ([`Watch::forgotten`]).
    watching: Mutex<()>,
    /// Whether events come in a burst ([`Watch::wait`]).
    burst: Mutex<Burst>,
}

impl Watch {
    /// Watches with `watcher` for a session whose nodes are `nodes`; with `host_events`,
    /// changes come with the host events behind them.
    pub fn new(
        watcher: Box<dyn Watcher>,
        nodes: Arc<NodeTable>,
        host: Arc<dyn Backend>,
        host_events: bool,
    ) -> Watch {
        Watch {
            watcher,
            nodes,
            host,
            host_events,
            expected: Expected::default(),
            foreign_writers: DashMap::new(),
            batches_seen: AtomicU64::new(0),
            watching: Mutex::new(()),
            burst: Mutex::default(),
        }
    }

    pub fn host_events(&self) -> bool {
        self.host_events
    }

    /// Whether changes are reported with the process that made them.
    pub fn tells_writers(&self) -> bool {
        self.watcher.tells_writers()
    }

    /// Starts watching directory `node` (`fd` its descriptor) and marks it watched; it
    /// stays unwatched when the backend refuses.
    pub fn watch_dir(&self, node: &Node, fd: &OwnedFd) {
        let _watching = self.watching.lock().unwrap_or_else(|e| e.into_inner());
        if self.watcher.watch_dir(node.id, fd) {
            node.watched.store(true, Ordering::Relaxed);
        }
    }

    /// The client forgot `node`, which has left the node table: a watched directory is
    /// watched no more, unless a lookup has made a new node for it meanwhile.
    ///
    /// FORGET (ops/entry.rs) takes the node out of the table, then comes here; a LOOKUP or
    /// READDIRPLUS on another worker may find the directory in between and make a new node
    /// under the same id, whose `watch_dir` gets the same watch back (inotify keeps one per
    /// inode). Removing it then left a held node marked watched with no watch: nothing in
    /// that directory was pushed again, and the guest kept its listing and missing names
    /// for good (the likely cause of coherence.rs's second-mount test once never seeing
    /// its mkdir step in CI: the guest can look `sub` up again while the FORGET of its
    /// previous node is handled). A node in the table under this id keeps the watch;
    /// `watching` makes a lookup that comes after the check add a watch of its own once
    /// this one is gone.
    pub fn forgotten(&self, node: &Node) {
        if !node.watched.load(Ordering::Relaxed) {
            return;
        }
        let _watching = self.watching.lock().unwrap_or_else(|e| e.into_inner());
        if self
            .nodes
            .get(node.id)
            .is_ok_and(|now| !std::ptr::eq(&*now, node))
        {
            return;
        }
        // Not reopened for this: a forgotten node's reopened descriptor would stay in
        // the budget.
        self.watcher.unwatch(node.id, node.open_fd().as_deref());
    }

    /// This session made the file `ino` without a name and holds it open.
    pub fn made_unnamed(&self, ino: u64) {
        self.watcher.made_unnamed(ino);
    }

    /// Batches of events taken in hand so far (see `batches_seen`).
    pub fn batches_seen(&self) -> u64 {
        self.batches_seen.load(Ordering::SeqCst)
    }

    /// Records that this session is about to make `change` to `name` in `dir`.
    pub fn expect(&self, dir: NodeId, name: &[u8], change: NameChange) {
        self.expected.expect(dir, name, change);
    }

    /// Withdraws an expectation whose change did not happen.
    pub fn unexpect(&self, dir: NodeId, name: &[u8], change: NameChange) {
        self.expected.unexpect(dir, name, change);
    }

    /// Runs this session's own change of `nodes` ([`echo::own_changes`]).
    pub fn own_changes<T>(
        &self,
        nodes: Vec<(&Node, BorrowedFd<'_>)>,
        op: impl FnOnce() -> SysResult<T>,
        size_after: impl Fn(u64, &T) -> Option<u64>,
    ) -> (SysResult<T>, Vec<Option<libc::stat>>) {
        echo::own_changes(&*self.host, nodes, op, size_after)
    }

    /// Waits up to `timeout` for events and turns them into changes ([`Watch::queued_changes`]).
    pub fn changes(&self, timeout: Duration) -> Changes {
        if !self.wait(timeout) {
            return Changes::default();
        }
        self.queued_changes()
    }

    /// Waits up to `timeout` for watch events to be queued; true if there may be some to
    /// read. Reads nothing. Events after a quiet moment are there to read at once; events
    /// that keep coming in a burst are first given a moment for more to gather ([`Burst`]).
    pub fn wait(&self, timeout: Duration) -> bool {
        let start = Instant::now();
        let woken = self.watcher.wait(timeout);
        let quiet = start.elapsed();
        let settle = {
            let mut burst = self.burst.lock().unwrap_or_else(|e| e.into_inner());
            if !woken {
                burst.idle();
                return false;
            }
            burst.woken(Instant::now(), quiet)
        };
        tracing::trace!(
            quiet_us = quiet.as_micros() as u64,
            settle_us = settle.as_micros() as u64,
            "watch events"
        );
        if !settle.is_zero() {
            std::thread::sleep(settle);
        }
        true
    }

    /// Records a batch of `n` events just taken from the backend.
    fn took_batch(&self, n: usize) {
        self.burst
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .last_batch = n;
    }

    fn node_fd(&self, id: NodeId) -> SysResult<(Arc<Node>, Arc<OwnedFd>)> {
        self.nodes.node_fd(id)
    }

    fn changed_since_sync(&self, node: &Arc<Node>, named: Option<(BorrowedFd<'_>, &CStr)>) -> bool {
        echo::changed_since_sync(&*self.host, &self.nodes, node, named)
    }

    /// Whether a name event is the echo of this session's own change. A watcher that sees
    /// paths only reports the session's renames as a removal and a creation.
    fn is_own(&self, dir: NodeId, name: &[u8], change: NameChange) -> bool {
        if self.expected.is_own(dir, name, change) {
            return true;
        }
        let moved = match change {
            NameChange::Deleted => NameChange::MovedFrom,
            NameChange::Created => NameChange::MovedTo,
            _ => return false,
        };
        !self.watcher.pairs_renames() && self.expected.is_own(dir, name, moved)
    }

    /// Turns the watch events queued now into the invalidations (and host events) the
    /// client needs, leaving out the echoes of its own changes. Does not wait.
    pub fn queued_changes(&self) -> Changes {
        let (events, mut by_others) = match self.watcher.drain() {
            Ok(Batch::Events(e, foreign)) => {
                // Before any node is looked for (ops/lookup.rs, `state_now`).
                if !e.is_empty() || !foreign.is_empty() {
                    self.batches_seen.fetch_add(1, Ordering::SeqCst);
                    self.took_batch(e.len() + foreign.len());
                }
                (e, foreign)
            }
            Ok(Batch::Overflow) => {
                self.took_batch(usize::MAX);
                self.expected.forget();
                tracing::warn!("watch queue overflowed: invalidating everything the client holds");
                return Changes {
                    items: vec![Invalidation::All],
                    events: Vec::new(),
                };
            }
            Err(e) => {
                tracing::warn!("reading watch events failed: {e}");
                return Changes::default();
            }
        };
        let mut c = Collector::default();
        for ev in events {
            let Ok((dir, dir_fd)) = self.node_fd(ev.dir) else {
                continue;
            };
            match (&ev.name, ev.change) {
                (
                    Some(name),
                    Change::Name {
                        change,
                        cookie,
                        is_dir,
                    },
                ) => {
                    if matches!(change, NameChange::MovedTo | NameChange::Created) {
                        self.check_new_name(&mut c, &dir_fd, name);
                    }
                    if self.is_own(ev.dir, name, change) {
                        continue;
                    }
                    tracing::debug!(dir = %ev.dir, name = %String::from_utf8_lossy(name), ?change, "name changed by another: pushed");
                    c.invalidate(Invalidation::Entry {
                        parent: ev.dir,
                        name: Bytes::from(name.clone()),
                    });
                    c.invalidate(Invalidation::Inode(ev.dir));
                    if self.host_events {
                        let what = (change, cookie, is_dir);
                        self.name_event(&mut c, &dir_fd, ev.dir, name, what);
                    }
                }
                (Some(name), Change::Content(bits)) => {
                    // Content or attributes of an entry of the directory.
                    let Ok(cname) = CString::new(name.clone()) else {
                        continue;
                    };
                    let Ok(st) = self.host.stat_at(dir_fd.as_fd(), &cname) else {
                        continue;
                    };
                    let key = (ev.dir, name.clone());
                    let file = (st.st_dev as u64, st.st_ino);
                    let closing = bits & changed::CLOSE_WRITE != 0;
                    // Another process's change, whatever the ctime says (fanotify.rs).
                    let by_other = by_others.remove(&key);
                    let foreign = match self.nodes.find(st.st_dev as u64, st.st_ino) {
                        Some(child)
                            if self.changed_since_sync(&child, Some((dir_fd.as_fd(), &cname)))
                                || by_other =>
                        {
                            tracing::debug!(
                                node = %child.id, name = %String::from_utf8_lossy(name), bits,
                                by_other, "content changed by another: pushed"
                            );
                            c.invalidate(Invalidation::Inode(child.id));
                            true
                        }
                        // Unchanged since the client was last told: the echo of its own
                        // change, unless this batch already holds someone else's change to
                        // it or someone else's write to it is being closed.
                        Some(_) => {
                            c.changed_at.contains_key(&key)
                                || (closing && self.foreign_writers.contains_key(&file))
                        }
                        // The client holds no node for it, so the change cannot be its own.
                        None => true,
                    };
                    if foreign {
                        // Remember the writer until it closes: by then the content may look
                        // synced (a lookup in between), yet the close is still someone else's.
                        // Only a write opens such an entry: one opened by a chmod would
                        // outlive a deletion and pass to the next file on that inode number.
                        let writing = bits & changed::MODIFY != 0;
                        if closing {
                            self.foreign_writers.remove(&file);
                        } else if writing && self.foreign_writers.len() < MAX_FOREIGN_WRITERS {
                            self.foreign_writers.insert(file, ());
                        }
                    }
                    if foreign && self.host_events {
                        let node = self.nodes.id_for(st.st_dev as u64, st.st_ino);
                        let file_type = crate::backend::file_type(&st);
                        self.changed_event(&mut c, &dir_fd, ev.dir, key, node, file_type, bits);
                    }
                }
                (_, Change::Rescan) => {
                    // Everything the client holds at or below the directory.
                    c.invalidate(Invalidation::Inode(ev.dir));
                    for (node, parent, name) in self.nodes.below(ev.dir) {
                        c.invalidate(Invalidation::Entry {
                            parent,
                            name: Bytes::copy_from_slice(name.as_bytes()),
                        });
                        c.invalidate(Invalidation::Inode(node));
                    }
                }
                (None, _) => {
                    // The directory itself: its attributes, or it was deleted or moved.
                    // A deletion or move also shows in the parent's watch, which invalidates
                    // the name; here only the directory's own attributes matter.
                    if self.changed_since_sync(&dir, None) {
                        tracing::debug!(dir = %ev.dir, "directory changed by another: pushed");
                        c.invalidate(Invalidation::Inode(ev.dir));
                    }
                }
            }
        }
        // Other processes' changes whose inotify event is not in this batch: it was read with
        // the last one, a moment before their fanotify event was queued, or it comes with
        // the next one. The node's synced ctime is left alone: in the second case that
        // event must still be found foreign (the host event of a watched file).
        for (dir, name) in by_others {
            let (Ok((_, dir_fd)), Ok(name)) = (self.node_fd(dir), CString::new(name)) else {
                continue;
            };
            if let Some(child) = self.nodes.held_at(dir_fd.as_fd(), &name) {
                tracing::debug!(node = %child.id, ?name, "changed by another process (fanotify only): pushed");
                c.invalidate(Invalidation::Inode(child.id));
            }
        }
        c.out
    }

    /// The host event of `change` (a rename's `cookie`, whether the name `is_dir`) to `name`
    /// in `dir`.
    fn name_event(
        &self,
        c: &mut Collector,
        dir_fd: &OwnedFd,
        dir: NodeId,
        name: &[u8],
        (change, cookie, is_dir): (NameChange, u32, bool),
    ) {
        let Some(dir_path) = self.guest_path(c, dir, dir_fd) else {
            return;
        };
        // What is there now, for creations; removals only know whether it was a directory.
        let mut node = None;
        let mut file_type = if is_dir {
            crate::backend::S_IFDIR
        } else {
            crate::backend::S_IFREG
        };
        let mut was_at = None;
        if matches!(change, NameChange::Created | NameChange::MovedTo) {
            if let Ok(st) = CString::new(name)
                .map_err(|_| ())
                .and_then(|n| self.host.stat_at(dir_fd.as_fd(), &n).map_err(|_| ()))
            {
                node = Some(self.nodes.id_for(st.st_dev as u64, st.st_ino));
                file_type = crate::backend::file_type(&st);
                if !self.watcher.pairs_renames() {
                    was_at = (self.nodes.find(st.st_dev as u64, st.st_ino))
                        .and_then(|n| n.location())
                        .map(|(p, n)| (p, n.into_bytes()));
                }
            }
        }
        let mut event = HostEvent {
            dir,
            dir_path,
            name: Bytes::copy_from_slice(name),
            node,
            file_type,
            kind: EventKind::Created,
        };
        match change {
            NameChange::Created => {
                // Without cookies: the creation of a file whose old name this batch deleted
                // is its rename (FSEvents reports both paths of a rename, in that order).
                if let Some(at) = was_at.and_then(|key| c.deleted_at.remove(&key)) {
                    let from = &c.out.events[at];
                    if from.dir != dir || from.name.as_ref() != name {
                        c.moved_here(at, event);
                        return;
                    }
                }
            }
            NameChange::Deleted => {
                event.kind = EventKind::Deleted;
                if !self.watcher.pairs_renames() {
                    c.deleted_at
                        .insert((dir, name.to_vec()), c.out.events.len());
                }
            }
            NameChange::MovedFrom => {
                // Provisional: becomes the rename when its other half comes, else stays a
                // deletion (moved out of what the client holds).
                event.kind = EventKind::Deleted;
                c.moved_from.insert(cookie, c.out.events.len());
            }
            NameChange::MovedTo => {
                if let Some(at) = c.moved_from.remove(&cookie) {
                    c.moved_here(at, event);
                    return;
                }
            }
        }
        c.out.events.push(event);
    }

    #[allow(clippy::too_many_arguments)]
    fn changed_event(
        &self,
        c: &mut Collector,
        dir_fd: &OwnedFd,
        dir: NodeId,
        key: (NodeId, Vec<u8>),
        node: NodeId,
        file_type: u32,
        bits: u8,
    ) {
        if let Some(&at) = c.changed_at.get(&key) {
            if let EventKind::Changed(old) = &mut c.out.events[at].kind {
                *old |= bits;
            }
            return;
        }
        let Some(dir_path) = self.guest_path(c, dir, dir_fd) else {
            return;
        };
        c.changed_at.insert(key.clone(), c.out.events.len());
        c.out.events.push(HostEvent {
            dir,
            dir_path,
            name: Bytes::from(key.1),
            node: Some(node),
            file_type,
            kind: EventKind::Changed(bits),
        });
    }

    /// The directory's path below the export root as it is now, or None if it is no longer
    /// inside the export. The kernel keeps a descriptor's path current across renames.
    fn guest_path(&self, c: &mut Collector, dir: NodeId, dir_fd: &OwnedFd) -> Option<Bytes> {
        if dir == ROOT_NODE {
            return Some(Bytes::new());
        }
        if let Some(p) = c.paths.get(&dir) {
            return p.clone();
        }
        let root = c
            .root
            .get_or_insert_with(|| {
                let (_, root_fd) = self.node_fd(ROOT_NODE).ok()?;
                self.host.fd_path(root_fd.as_fd()).ok()
            })
            .clone();
        let resolved = (|| {
            let path = self.host.fd_path(dir_fd.as_fd()).ok()?;
            let rel = path.strip_prefix(root?.as_slice())?.strip_prefix(b"/")?;
            if rel.ends_with(b" (deleted)") {
                return None;
            }
            Some(Bytes::copy_from_slice(rel))
        })();
        c.paths.insert(dir, resolved.clone());
        resolved
    }

    /// A change of a file's content or attributes is reported under the name it had then.
    /// If the file was renamed (or linked and unlinked) before the event was read, that name
    /// no longer finds it and the change would be lost; so every name that now refers to a
    /// file (moved or created there) has that file checked too. Own renames are own changes
    /// of the moved node, so this finds only someone else's changes.
    fn check_new_name(&self, c: &mut Collector, dir_fd: &OwnedFd, name: &[u8]) {
        let Ok(cname) = CString::new(name) else {
            return;
        };
        let Ok(st) = self.host.stat_at(dir_fd.as_fd(), &cname) else {
            return;
        };
        if let Some(node) = self.nodes.find(st.st_dev as u64, st.st_ino) {
            if self.changed_since_sync(&node, Some((dir_fd.as_fd(), &cname))) {
                tracing::debug!(node = %node.id, ?cname, "a file at a new name changed by another: pushed");
                c.invalidate(Invalidation::Inode(node.id));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QUICK: Duration = Duration::from_micros(20);

    #[test]
    fn a_change_after_a_quiet_moment_is_read_at_once() {
        let mut b = Burst::default();
        let t = Instant::now();
        assert_eq!(b.woken(t, Duration::from_secs(1)), Duration::ZERO);
        // A write's IN_CLOSE_WRITE right after its IN_MODIFY: still at once.
        for i in 1..=QUICK_FOLLOWERS {
            assert_eq!(b.woken(t + QUICK * i, QUICK), Duration::ZERO);
        }
        // And the next change after a quiet moment, again.
        assert_eq!(b.woken(t + Duration::from_millis(1), QUIET), Duration::ZERO);
    }

    #[test]
    fn a_burst_gathers_longer_and_longer_up_to_settle() {
        let mut b = Burst::default();
        let t = Instant::now();
        let mut got = Vec::new();
        for i in 0..8 {
            got.push(b.woken(t + QUICK * i, if i == 0 { QUIET } else { QUICK }));
        }
        let us = |n| Duration::from_micros(n);
        assert_eq!(
            got,
            [0, 0, 0, 250, 500, 1000, 2000, 2000].map(us),
            "{got:?}"
        );
    }

    #[test]
    fn a_big_batch_or_a_fast_stream_gathers_for_settle() {
        let mut b = Burst::default();
        let t = Instant::now();
        b.last_batch = BIG_BATCH;
        assert_eq!(b.woken(t, QUICK), SETTLE);
        // Quiet moments between wake-ups, but more than RATE_WAKES within RATE_WINDOW.
        let mut b = Burst::default();
        let step = RATE_WINDOW / (RATE_WAKES as u32 + 1);
        let got: Vec<_> = (0..=RATE_WAKES as u32)
            .map(|i| b.woken(t + step * i, QUIET))
            .collect();
        assert!(got[..RATE_WAKES].iter().all(|d| d.is_zero()), "{got:?}");
        assert_eq!(got[RATE_WAKES], SETTLE);
        // The same wake-ups spread over more than the window: all at once.
        let mut b = Burst::default();
        let step = RATE_WINDOW / (RATE_WAKES as u32 - 1);
        assert!((0..=RATE_WAKES as u32 * 3).all(|i| b.woken(t + step * i, QUIET).is_zero()));
    }
}
