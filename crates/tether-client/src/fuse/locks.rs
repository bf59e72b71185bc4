//! Guest locks (flock, POSIX fcntl, OFD) held on the host's files (docs/coherence.md, "Locks").
//!
//! The kernel sends SETLK/GETLK for every lock; the server takes each owner's locks on a host
//! open file description of its own, never waiting (protocol.md §16). This module does the
//! two things the server cannot:
//!
//! - **Waiting.** A blocking request (F_SETLKW, flock without LOCK_NB) that gets EAGAIN is
//!   tried again after a backoff (1 ms doubling to 20 ms) until it succeeds or the kernel
//!   interrupts it (a signal reached the caller): then it fails with EINTR. A lock released
//!   or downgraded through this mount has its waiters here tried again at once, once the
//!   server has answered the release, and so has one another mount released, when the
//!   server pushes LOCK_FREED; a release on the host is only found by the next try.
//! - **Dropping locks at close.** In no-open mode the kernel sends no RELEASE and Tether
//!   answers FLUSH with ENOSYS (a FLUSH round trip on every close would cost warm reads
//!   several times their time), so nothing in FUSE says when a locked file is closed. While
//!   this guest holds a lock, a fanotify mark on the mount reports every final close with the
//!   closing process, and the locks that close ends are dropped (LOCK_RELEASE); locks of
//!   processes that no longer exist are dropped by a sweep every second. The rules, and
//!   where they only approximate POSIX: docs/coherence.md, "Locks".
//! - **Ordering.** Every SETLK goes through the lock thread after it has read the close
//!   events queued so far, and carries the owner's release generation (protocol.md §16).
//!
//! All state lives on one thread, fed by a channel: the FUSE handlers, the reply callbacks
//! and the close waker never touch it, and the thread may block on the mount (opening its
//! root sends STATFS), which a handler or the RPC reader thread must never do.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use dashmap::DashSet;
use fuser::{Errno, Notifier, ReplyEmpty};
use tether_proto::{lock_type, Caller, LockSpec, NodeId, Reply, Request, WireErrno};

use crate::cache::coherence::Coherence;
use crate::fuse::reply::errno;
use crate::kernel_ids::{ino_of, node_of_st_ino};
use crate::known::Known;
use crate::rpc::{Connection, ReplyResult};
use crate::sys::mount_dir::MountDir;

/// First and longest wait between two tries of a blocking lock.
const FIRST_BACKOFF: Duration = Duration::from_millis(1);
const MAX_BACKOFF: Duration = Duration::from_millis(20);
/// Overrides MAX_BACKOFF (milliseconds): tests lengthen it to tell a waiter woken by a
/// release from one that found it by polling.
const MAX_BACKOFF_VAR: &str = "TETHER_LOCK_MAX_BACKOFF_MS";
/// How often locks of processes that have exited are looked for.
const SWEEP_EVERY: Duration = Duration::from_secs(1);
/// How long an interrupt for a request not (yet) known here is remembered.
const INTERRUPT_MEMORY: Duration = Duration::from_secs(5);

/// How many times a lock's grant asks for the file's size until the kernel keeps it.
const SIZE_SYNC_TRIES: usize = 8;

/// Files that SQLite keeps next to a database `DB` it locks: DB-journal, DB-wal, DB-shm.
const COMPANION_SUFFIXES: [&str; 3] = ["-journal", "-wal", "-shm"];

/// One lock request as the FUSE handler got it.
pub struct LockRequest {
    pub unique: u64,
    pub who: Caller,
    pub node: NodeId,
    pub lock: LockSpec,
    /// The process (thread group) the kernel says takes the lock.
    pub tgid: u32,
    pub wait: bool,
    /// Set by the lock thread when it sends the request (protocol.md §16).
    pub generation: u64,
}

enum Cmd {
    /// SETLK/SETLKW from the kernel, to send once earlier closes are accounted for.
    Set(LockRequest, ReplyEmpty),
    /// A blocking request was answered without the lock thread.
    Done(u64),
    /// The close watch has events to read.
    Drain,
    /// The server granted `req`: remember who holds what, then answer the kernel.
    Granted(LockRequest, ReplyEmpty),
    /// The server said EAGAIN to a blocking request: try again later.
    Wait(LockRequest, ReplyEmpty, Duration),
    /// A retry's answer came back.
    Retried(LockRequest, ReplyEmpty, Duration, ReplyResult),
    Interrupt(u64),
    /// The kernel forgot the node: no file is open on it and the server dropped its locks.
    Forgotten(NodeId),
    /// The server answered a release (or downgrade) of a lock on the node made through
    /// this mount, or pushed that another session made one: its waiters here may get
    /// theirs now.
    Freed(NodeId),
}

/// A blocking request's retry, at the server now.
struct InFlight {
    node: NodeId,
    /// A signal reached the caller meanwhile.
    interrupted: bool,
    /// A lock on the node was released meanwhile (here, or pushed): a refusal may predate
    /// it.
    released_since: bool,
}

/// A lock owner that holds (or held) something on a node.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Holder {
    owner: u64,
    tgid: u32,
    /// A flock (it belongs to an open file, which the process may share).
    flock: bool,
    /// The process's parent when the lock was granted (0: unknown).
    parent: u32,
}

/// The handle the FUSE adapter uses; cheap to clone.
#[derive(Clone)]
pub struct Locks {
    tx: Sender<Cmd>,
    session: Arc<OnceLock<Attached>>,
    granted: Arc<HeldLocks>,
    /// Nodes with lock state here: a FORGET of any other costs the lock thread nothing.
    locked: Arc<DashSet<NodeId>>,
}

/// What the lock thread needs of the FUSE session, once it exists.
struct Attached {
    notifier: Notifier,
    known: Arc<Known>,
    co: Arc<Coherence>,
}

impl Locks {
    /// Starts the lock thread for the mount at `dir`.
    pub fn start(conn: Arc<Connection>, dir: Arc<MountDir>) -> io::Result<Locks> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let session = Arc::new(OnceLock::new());
        let granted = Arc::new(HeldLocks::default());
        let locked = Arc::new(DashSet::new());
        let state = LockThread {
            conn: conn.clone(),
            dir,
            session: session.clone(),
            granted: granted.clone(),
            locked: locked.clone(),
            tx: tx.clone(),
            held: HashMap::new(),
            generations: HashMap::new(),
            mount_id: None,
            waiting: BTreeMap::new(),
            in_flight: HashMap::new(),
            woken: HashSet::new(),
            max_backoff: std::env::var(MAX_BACKOFF_VAR)
                .ok()
                .and_then(|v| v.parse().ok())
                .map_or(MAX_BACKOFF, Duration::from_millis),
            interrupted: HashMap::new(),
            blocking: HashSet::new(),
            watch: None,
            last_sweep: Instant::now(),
        };
        std::thread::Builder::new()
            .name("tether-locks".into())
            .spawn(move || state.run(rx))?;
        Ok(Locks {
            tx,
            session,
            granted,
            locked,
        })
    }

    /// What the server has granted, for a reconnect to take again.
    pub fn held(&self) -> Arc<HeldLocks> {
        self.granted.clone()
    }

    /// The session's notifier and known nodes, once the session exists: granted locks
    /// revalidate the cache.
    pub fn attach(&self, notifier: Notifier, known: Arc<Known>, co: Arc<Coherence>) {
        let tx = self.tx.clone();
        co.on_lock_freed(Box::new(move |node| {
            let _ = tx.send(Cmd::Freed(node));
        }));
        let _ = self.session.set(Attached {
            notifier,
            known,
            co,
        });
    }

    /// SETLK/SETLKW from the kernel.
    ///
    /// Through the lock thread, which reads the close events first: a process that closed
    /// a locked file and locks it again must have the release for the close counted before
    /// its new lock (the close event is queued before close() returns).
    pub fn set(&self, req: LockRequest, reply: ReplyEmpty) {
        if let Err(e) = self.tx.send(Cmd::Set(req, reply)) {
            if let Cmd::Set(_, reply) = e.into_inner() {
                reply.error(Errno::EIO);
            }
        }
    }

    pub fn interrupt(&self, unique: u64) {
        let _ = self.tx.send(Cmd::Interrupt(unique));
    }

    /// The kernel holds no lookup of `node` any more.
    pub fn forgotten(&self, node: NodeId) {
        if self.locked.contains(&node) {
            let _ = self.tx.send(Cmd::Forgotten(node));
        }
    }
}

/// What to do with the server's first answer to a SETLK (runs on the RPC reader thread, so it
/// only hands work on).
fn first_answer(tx: &Sender<Cmd>, req: LockRequest, reply: ReplyEmpty, res: ReplyResult) {
    let answered_here = !matches!(res, Ok(Reply::Empty) | Err(WireErrno::EAGAIN))
        || req.lock.typ == lock_type::UNLOCK;
    if req.wait && answered_here {
        let _ = tx.send(Cmd::Done(req.unique));
    }
    if matches!(res, Ok(Reply::Empty)) && req.lock.typ == lock_type::UNLOCK {
        let _ = tx.send(Cmd::Freed(req.node));
    }
    match res {
        Ok(Reply::Empty) if req.lock.typ == lock_type::UNLOCK => reply.ok(),
        Ok(Reply::Empty) => {
            if let Err(e) = tx.send(Cmd::Granted(req, reply)) {
                // The lock thread is gone (unmounting): the lock is held all the same.
                if let Cmd::Granted(_, reply) = e.into_inner() {
                    reply.ok();
                }
            }
        }
        Ok(_) => reply.error(Errno::EIO),
        Err(WireErrno::EAGAIN) if req.wait => {
            if let Err(e) = tx.send(Cmd::Wait(req, reply, FIRST_BACKOFF)) {
                if let Cmd::Wait(_, reply, _) = e.into_inner() {
                    reply.error(Errno::EINTR);
                }
            }
        }
        Err(e) => reply.error(errno(e)),
    }
}

struct LockThread {
    conn: Arc<Connection>,
    dir: Arc<MountDir>,
    session: Arc<OnceLock<Attached>>,
    granted: Arc<HeldLocks>,
    locked: Arc<DashSet<NodeId>>,
    tx: Sender<Cmd>,
    /// Who may hold locks on which node (owners are added when the server grants a lock and
    /// removed when their file is closed).
    held: HashMap<NodeId, Vec<Holder>>,
    /// How many times each (node, owner)'s locks were released: the generation its next
    /// SETLK carries (protocol.md §16).
    generations: HashMap<(NodeId, u64), u64>,
    /// The mount's id in /proc (found once).
    mount_id: Option<u64>,
    /// Blocking requests waiting for their next try, by when it is due.
    waiting: BTreeMap<(Instant, u64), (LockRequest, ReplyEmpty, Duration)>,
    /// Blocking requests whose retry is at the server now.
    in_flight: HashMap<u64, InFlight>,
    /// Blocking requests whose current try was sent because of a release (here, or pushed).
    woken: HashSet<u64>,
    /// The longest wait between two tries (MAX_BACKOFF unless overridden).
    max_backoff: Duration,
    /// Interrupts for requests not known here (yet), with when they came.
    interrupted: HashMap<u64, Instant>,
    /// Blocking requests not answered yet: an interrupt for one of them is kept however
    /// long its first answer takes (a reconnect may hold it for `mount --timeout`).
    blocking: HashSet<u64>,
    /// The fanotify group and its reader, present while something is held.
    watch: Option<CloseWatch>,
    last_sweep: Instant,
}

impl LockThread {
    fn run(mut self, rx: Receiver<Cmd>) {
        loop {
            let now = Instant::now();
            let next_retry = self.waiting.keys().next().map(|(at, _)| *at);
            let timeout = next_retry
                .map(|at| at.saturating_duration_since(now))
                .unwrap_or(SWEEP_EVERY)
                .min(SWEEP_EVERY);
            match rx.recv_timeout(timeout) {
                Ok(cmd) => self.handle(cmd),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
            self.retry_due();
            if self.last_sweep.elapsed() >= SWEEP_EVERY {
                self.last_sweep = Instant::now();
                self.sweep_exited();
                let cutoff = Instant::now() - INTERRUPT_MEMORY;
                let blocking = &self.blocking;
                (self.interrupted).retain(|u, at| *at > cutoff || blocking.contains(u));
            }
        }
    }

    fn handle(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Set(req, reply) => {
                if req.lock.typ == lock_type::UNLOCK {
                    self.write_back(req.node);
                }
                self.locked.insert(req.node);
                self.drain_closes();
                if req.wait {
                    if self.interrupted.remove(&req.unique).is_some() {
                        return reply.error(Errno::EINTR);
                    }
                    // An interrupt for it is kept until it is answered, however long that
                    // takes (a reconnect may hold it for `mount --timeout`).
                    self.blocking.insert(req.unique);
                }
                let tx = self.tx.clone();
                self.send(req, reply, move |req, reply, res| {
                    first_answer(&tx, req, reply, res)
                });
            }
            Cmd::Done(unique) => self.finished(unique),
            Cmd::Drain => {
                self.drain_closes();
                if let Some(w) = &self.watch {
                    let _ = w.drained.try_send(());
                }
            }
            Cmd::Granted(req, reply) => self.grant(req, reply),
            Cmd::Wait(req, reply, backoff) => {
                if self.interrupted.remove(&req.unique).is_some() {
                    self.finished(req.unique);
                    reply.error(Errno::EINTR);
                    return;
                }
                let due = Instant::now() + backoff;
                self.waiting
                    .insert((due, req.unique), (req, reply, backoff));
            }
            Cmd::Retried(req, reply, backoff, res) => {
                let flight = self.in_flight.remove(&req.unique);
                let interrupted = flight.as_ref().is_some_and(|f| f.interrupted);
                let released_since = flight.is_some_and(|f| f.released_since);
                let woken = self.woken.remove(&req.unique);
                if interrupted || !matches!(res, Err(WireErrno::EAGAIN)) {
                    self.finished(req.unique);
                }
                match res {
                    // Granted, even if a signal came meanwhile: the call succeeded first.
                    Ok(Reply::Empty) => {
                        if let (true, Some(s)) = (woken, self.session.get()) {
                            (s.co.counters.lock_waits_ended_by_release)
                                .fetch_add(1, Ordering::Relaxed);
                        }
                        self.grant(req, reply)
                    }
                    Err(WireErrno::EAGAIN) if interrupted => reply.error(Errno::EINTR),
                    // The server may have refused it before the release here: again, now.
                    Err(WireErrno::EAGAIN) if released_since => self.retry_now(req, reply),
                    Err(WireErrno::EAGAIN) => {
                        let next = (backoff * 2).min(self.max_backoff);
                        self.waiting
                            .insert((Instant::now() + next, req.unique), (req, reply, next));
                    }
                    Ok(_) => reply.error(Errno::EIO),
                    Err(e) => reply.error(errno(e)),
                }
            }
            Cmd::Interrupt(unique) => {
                if let Some(flight) = self.in_flight.get_mut(&unique) {
                    flight.interrupted = true;
                    return;
                }
                let key = self.waiting.keys().find(|(_, u)| *u == unique).copied();
                match key.and_then(|k| self.waiting.remove(&k)) {
                    Some((_, reply, _)) => {
                        self.finished(unique);
                        reply.error(Errno::EINTR)
                    }
                    // Not known yet (its first try is at the server) or not a lock at all.
                    None => {
                        self.interrupted.insert(unique, Instant::now());
                    }
                }
            }
            Cmd::Forgotten(node) => {
                self.locked.remove(&node);
                self.held.remove(&node);
                self.generations.retain(|(n, _), _| *n != node);
                self.granted.forget_node(node);
                self.unwatch_if_idle();
            }
            Cmd::Freed(node) => self.wake_waiters(node),
        }
    }

    /// A lock on `node` was released through this mount, or (pushed) another: its waiters
    /// here try again at once (the run loop sends what is due), and a retry at the server
    /// now that comes back refused is tried again too.
    fn wake_waiters(&mut self, node: NodeId) {
        let keys: Vec<(Instant, u64)> = (self.waiting.iter())
            .filter(|(_, (req, _, _))| req.node == node)
            .map(|(key, _)| *key)
            .collect();
        for key in keys {
            if let Some((req, reply, _)) = self.waiting.remove(&key) {
                self.retry_now(req, reply);
            }
        }
        for flight in self.in_flight.values_mut().filter(|f| f.node == node) {
            flight.released_since = true;
        }
    }

    /// Queues `req` to be tried again at once, because of a release, with its backoff
    /// starting over.
    fn retry_now(&mut self, req: LockRequest, reply: ReplyEmpty) {
        self.woken.insert(req.unique);
        let key = (Instant::now(), req.unique);
        self.waiting.insert(key, (req, reply, FIRST_BACKOFF));
    }

    /// Sends `req` to the server under its owner's current generation. A grant is recorded
    /// as its answer comes, on the reader thread (in the order the server granted them),
    /// then `then` gets the answer.
    fn send(
        &self,
        mut req: LockRequest,
        reply: ReplyEmpty,
        then: impl FnOnce(LockRequest, ReplyEmpty, ReplyResult) + Send + 'static,
    ) {
        req.generation = self.generation(req.node, req.lock.owner);
        let granted = self.granted.clone();
        let msg = Request::Setlk {
            node: req.node,
            lock: req.lock,
            generation: req.generation,
        };
        self.conn.call(req.who, &msg, move |res: ReplyResult| {
            if matches!(res, Ok(Reply::Empty)) {
                granted.granted(req.node, &req.lock, req.generation);
            }
            then(req, reply, res)
        });
    }

    /// The server granted `req`: remember who holds it, revalidate, answer the kernel.
    fn grant(&mut self, req: LockRequest, reply: ReplyEmpty) {
        self.finished(req.unique);
        // A read lock of an owner that held something here may have replaced its write
        // lock: waiting readers may get theirs now. (Not every read lock: each would set
        // every waiter on the file polling from 1 ms again.)
        let downgrade = req.lock.typ == lock_type::READ
            && (self.held.get(&req.node))
                .is_some_and(|hs| hs.iter().any(|h| h.owner == req.lock.owner));
        self.hold(&req);
        if downgrade {
            self.wake_waiters(req.node);
        }
        self.revalidate(req.node);
        reply.ok();
    }

    /// A blocking request got its final answer.
    fn finished(&mut self, unique: u64) {
        self.blocking.remove(&unique);
        self.interrupted.remove(&unique);
        self.woken.remove(&unique);
    }

    /// Sends every blocking request whose wait is over to the server again.
    fn retry_due(&mut self) {
        let now = Instant::now();
        while let Some(entry) = self.waiting.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let (req, reply, backoff) = entry.remove();
            let flight = InFlight {
                node: req.node,
                interrupted: false,
                released_since: false,
            };
            self.in_flight.insert(req.unique, flight);
            let tx = self.tx.clone();
            self.send(req, reply, move |req, reply, res| {
                if let Err(e) = tx.send(Cmd::Retried(req, reply, backoff, res)) {
                    if let Cmd::Retried(_, reply, _, _) = e.into_inner() {
                        reply.error(Errno::EINTR);
                    }
                }
            });
        }
    }

    /// Records that `req`'s owner holds a lock on its node; watches closes from now on.
    fn hold(&mut self, req: &LockRequest) {
        let h = Holder {
            owner: req.lock.owner,
            tgid: req.tgid,
            flock: req.lock.flock,
            parent: parent_of(req.tgid).unwrap_or(0),
        };
        let holders = self.held.entry(req.node).or_default();
        match holders
            .iter_mut()
            .find(|x| x.owner == h.owner && x.tgid == h.tgid)
        {
            // An open file can carry OFD locks and a flock: it counts as a flock only while
            // it has only ever had flocks (the closing rules keep fcntl locks longer).
            Some(x) => x.flock &= h.flock,
            None => holders.push(h),
        }
        if self.watch.is_none() {
            // Before the kernel hears "granted": a close right after it must be seen.
            self.watch = CloseWatch::start(&self.dir, self.tx.clone())
                .map_err(|e| {
                    tracing::warn!(
                        "cannot watch closes of locked files ({e}): their locks are dropped \
                         when the process exits or unlocks"
                    )
                })
                .ok();
        }
    }

    /// Drops the kernel's pages and attributes of a node just locked, before the locker hears
    /// "granted": whoever held the lock before (on the host, in another guest) may have
    /// written the file a moment ago, and the watcher's invalidation for that may still be
    /// on its way. Lock, then read, sees their writes: what databases (SQLite's rollback
    /// journal) and tools that lock a file to update it rely on. Here, not on a FUSE worker:
    /// invalidating may wait for a read in progress on the same file.
    ///
    /// The names of the lock's companion files go too: SQLite decides from whether
    /// `DB-journal` exists, right after locking `DB`, whether a crashed writer left a hot
    /// journal; a cached name another mount removed a moment ago would send it to roll
    /// back a journal that is not there.
    fn revalidate(&self, node: NodeId) {
        let Some(s) = self.session.get() else {
            return;
        };
        // The client's own records too, and replies on their way: else it could answer the
        // kernel's next GETATTR with the size it knew (cache/known_attrs.rs), and the locker would
        // read only that far (the size this mount's own last write left, before the other
        // holder's longer one).
        s.co.distrust(node);
        let _ = s.co.inval_inode(&s.notifier, node, 0, 0);
        match s.co.fixer() {
            // With the writeback cache the kernel keeps its own size: a holder reading only
            // as far as the old one would see part of the last holder's writes.
            Some(f) => f.fix_now(node),
            None => self.sync_size(s, node),
        }
        if let Some((parent, name)) = s.known.place_of(node) {
            for suffix in COMPANION_SUFFIXES {
                let companion = [&name[..], suffix.as_bytes()].concat();
                let _ = (s.notifier).inval_entry(ino_of(parent), OsStr::from_bytes(&companion));
            }
        }
    }

    /// Makes the kernel hold the size the host has now for `node`, a file just locked.
    ///
    /// The invalidation above makes the locker's next read ask for the size, but the kernel
    /// discards that reply if another invalidation of the file (a push for the last holder's
    /// earlier write) lands while it is on its way, and then reads only as far as the size
    /// it had: a counter at "200" read as "2". So the size is asked for here, through the
    /// mount (`AT_STATX_FORCE_SYNC`, a GETATTR), with invalidations held back meanwhile,
    /// and the kernel's copy checked afterwards (`AT_STATX_DONT_SYNC`); tried again if
    /// something else (a local write) moved it. Invalidations for the file that waited
    /// are applied after: they only make the kernel ask again.
    fn sync_size(&self, s: &Attached, node: NodeId) {
        let path = s.known.path_of(node);
        let Some(Ok(path)) = path.map(|p| CString::new(p.into_os_string().into_vec())) else {
            return;
        };
        let _held = s.co.hold_invalidations();
        // One descriptor of the mount's root for every try.
        let kept = self.dir.with_path(|root| {
            (0..SIZE_SYNC_TRIES).any(|_| {
                let asked = file_size(root, &path, node, true);
                // Gone, renamed, not a regular file: nothing to keep.
                asked.is_err() || file_size(root, &path, node, false).ok() == asked.ok()
            })
        });
        if kept == Some(false) {
            tracing::debug!(%node, "the kernel did not keep a locked file's size");
        }
    }

    /// With the writeback cache, the guest's writes under a lock reach the host before
    /// the lock is released (invalidate/fixer.rs).
    fn write_back(&self, node: NodeId) {
        if let Some(f) = self.session.get().and_then(|s| s.co.fixer()) {
            f.write_back(node);
        }
    }

    fn generation(&self, node: NodeId, owner: u64) -> u64 {
        self.generations.get(&(node, owner)).copied().unwrap_or(0)
    }

    /// Reads every close event queued so far and drops the locks the closes end.
    fn drain_closes(&mut self) {
        let mut closes = Vec::new();
        if let Some(w) = &mut self.watch {
            w.read_closes(&mut closes);
        }
        for (node, pid) in closes {
            let Some(holders) = self.held.get(&node) else {
                continue;
            };
            let gone: Vec<Holder> = holders
                .iter()
                .filter(|h| h.tgid == pid || !process_exists(h.tgid))
                .copied()
                .collect();
            for h in gone {
                if h.tgid != pid {
                    self.inherit_or_release(node, h);
                } else if h.flock || !self.still_open_by(pid, node) {
                    self.release(node, h);
                }
            }
        }
    }

    /// Drops `h`'s locks on `node`: the release carries the generation they were taken
    /// under, and later SETLKs of the owner the next one, so that the server drops these
    /// and never a later lock, whichever of the two it sees first.
    fn release(&mut self, node: NodeId, h: Holder) {
        let generation = self.generation(node, h.owner);
        self.generations.insert((node, h.owner), generation + 1);
        let msg = Request::LockRelease {
            node,
            owner: h.owner,
            generation,
        };
        let tx = self.tx.clone();
        self.conn
            .call(Caller::default(), &msg, move |_res: ReplyResult| {
                let _ = tx.send(Cmd::Freed(node));
            });
        self.granted.released(node, h.owner, generation);
        if let Some(holders) = self.held.get_mut(&node) {
            holders.retain(|x| *x != h);
            if holders.is_empty() {
                self.held.remove(&node);
            }
        }
        self.unwatch_if_idle();
    }

    /// Drops the locks of processes that exited without a close this thread saw (their last
    /// descriptor was closed by another process, or the event was lost).
    fn sweep_exited(&mut self) {
        let gone: Vec<(NodeId, Holder)> = self
            .held
            .iter()
            .flat_map(|(n, hs)| hs.iter().map(move |h| (*n, *h)))
            .filter(|(_, h)| !process_exists(h.tgid))
            .collect();
        for (node, h) in gone {
            self.inherit_or_release(node, h);
        }
    }

    /// `h`'s process is gone. A flock belongs to an open file, which the process may have
    /// shared with its parent: in a shell script's `exec 9>lock; flock 9`, flock(1) is a
    /// child that locks the script's descriptor and exits at once. While the parent still
    /// has the file open, the lock stays, now held by the parent (whose final close or exit
    /// drops it); otherwise it is released.
    fn inherit_or_release(&mut self, node: NodeId, h: Holder) {
        let heir = (h.flock && h.parent > 1)
            .then_some(h.parent)
            .filter(|p| self.still_open_by(*p, node));
        match heir {
            Some(parent) => {
                if let Some(x) =
                    (self.held.get_mut(&node)).and_then(|hs| hs.iter_mut().find(|x| **x == h))
                {
                    x.tgid = parent;
                    x.parent = parent_of(parent).unwrap_or(0);
                }
            }
            None => self.release(node, h),
        }
    }

    /// Whether process `pid` still has a descriptor of `node`. The kernel does not say
    /// which open file a close ended, nor whether a fcntl lock is a POSIX or an OFD one,
    /// so a process's fcntl locks on a file stay while it has the file open at all:
    /// closing one of two descriptors keeps them (POSIX would drop the POSIX ones), and an
    /// OFD lock on one descriptor survives the close of another (as it should). Not for
    /// flock: its owner is the open file, so a lock kept past its file's close would
    /// exclude the same process's next open of it forever.
    fn still_open_by(&mut self, pid: u32, node: NodeId) -> bool {
        self.mount_id().is_some_and(|m| has_open(pid, m, node))
    }

    /// The mount's id, as /proc/*/fdinfo gives it for its files.
    fn mount_id(&mut self) -> Option<u64> {
        if self.mount_id.is_none() {
            // The user's mount, not the clone the helpers open the root through.
            self.mount_id = (self.dir)
                .with_user_mount(|root| {
                    fdinfo_field(std::process::id(), root.as_raw_fd(), "mnt_id:")
                })
                .flatten();
        }
        self.mount_id
    }

    fn unwatch_if_idle(&mut self) {
        if self.held.is_empty() {
            // Dropping the group removes its mark: closes cost nothing again.
            self.watch = None;
        }
    }
}

/// The locks the server has granted this guest, per (node, owner): the POSIX/OFD ranges as
/// the host keeps them (a new lock replaces the owner's overlapping ranges) and the flock
/// mode. A new session holds no lock, so a reconnect takes these again (restore.rs).
#[derive(Default)]
pub struct HeldLocks {
    owners: Mutex<HashMap<(NodeId, u64), OwnerLocks>>,
}

#[derive(Default)]
struct OwnerLocks {
    /// The generation (protocol.md §16) these were granted under.
    generation: u64,
    /// flock mode (READ or WRITE), if held.
    flock: Option<u8>,
    /// POSIX/OFD locks: start -> (inclusive end, READ or WRITE), non-overlapping.
    ranges: BTreeMap<u64, (u64, u8)>,
}

impl OwnerLocks {
    fn is_empty(&self) -> bool {
        self.flock.is_none() && self.ranges.is_empty()
    }

    /// Sets `start..=end` to `typ` (UNLOCK: to nothing), keeping what lies outside it of
    /// the ranges it overlaps.
    fn set_range(&mut self, start: u64, end: u64, typ: u8) {
        let overlapping: Vec<(u64, u64, u8)> = (self.ranges.range(..=end))
            .filter(|(_, (e, _))| *e >= start)
            .map(|(s, (e, t))| (*s, *e, *t))
            .collect();
        for (s, e, t) in overlapping {
            self.ranges.remove(&s);
            if s < start {
                self.ranges.insert(s, (start - 1, t));
            }
            if e > end {
                self.ranges.insert(end + 1, (e, t));
            }
        }
        if typ != lock_type::UNLOCK {
            self.ranges.insert(start, (end, typ));
        }
    }
}

impl HeldLocks {
    /// The server granted `lock` (a lock or an unlock) on `node`, under `generation`.
    pub fn granted(&self, node: NodeId, lock: &LockSpec, generation: u64) {
        let mut owners = self.owners.lock().unwrap();
        let o = owners.entry((node, lock.owner)).or_default();
        if o.generation < generation {
            // What an older generation held was released.
            *o = OwnerLocks {
                generation,
                ..OwnerLocks::default()
            };
        } else if o.generation > generation {
            return; // released since; the server dropped it too
        }
        if lock.flock {
            o.flock = (lock.typ != lock_type::UNLOCK).then_some(lock.typ);
        } else {
            o.set_range(lock.start, lock.end, lock.typ);
        }
        if o.is_empty() {
            owners.remove(&(node, lock.owner));
        }
    }

    /// `owner`'s locks of `generation` (and before) on `node` were dropped.
    pub fn released(&self, node: NodeId, owner: u64, generation: u64) {
        let mut owners = self.owners.lock().unwrap();
        if owners
            .get(&(node, owner))
            .is_some_and(|o| o.generation <= generation)
        {
            owners.remove(&(node, owner));
        }
    }

    fn forget_node(&self, node: NodeId) {
        self.owners.lock().unwrap().retain(|(n, _), _| *n != node);
    }

    /// Every lock held, as the SETLKs (and their generations) that take it again.
    pub fn all(&self) -> Vec<(NodeId, LockSpec, u64)> {
        let owners = self.owners.lock().unwrap();
        let mut out = Vec::new();
        for ((node, owner), o) in owners.iter() {
            let spec = |flock, typ, start, end| LockSpec {
                owner: *owner,
                flock,
                typ,
                start,
                end,
            };
            if let Some(t) = o.flock {
                out.push((*node, spec(true, t, 0, u64::MAX), o.generation));
            }
            for (s, (e, t)) in &o.ranges {
                out.push((*node, spec(false, *t, *s, *e), o.generation));
            }
        }
        out
    }
}

fn process_exists(tgid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    let alive = unsafe { libc::kill(tgid as libc::pid_t, 0) } == 0;
    alive || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// A fanotify group reporting every final close on the mount. Only the lock thread reads
/// it (so that it can read everything queued before it sends a SETLK); a waker thread
/// tells it when events are waiting while it has nothing else to do.
struct CloseWatch {
    /// Dropping it closes the group, which removes the mark and ends the waker.
    group: Arc<OwnedFd>,
    /// The lock thread says here that it has read what was waiting.
    drained: Sender<()>,
    /// Where events are read (kept: the group is read before every SETLK).
    buf: Vec<u8>,
}

impl CloseWatch {
    fn start(dir: &MountDir, tx: Sender<Cmd>) -> io::Result<CloseWatch> {
        // SAFETY: plain syscall; the result is checked and owned below.
        let fd = unsafe {
            libc::fanotify_init(
                libc::FAN_CLASS_NOTIF | libc::FAN_CLOEXEC | libc::FAN_NONBLOCK,
                (libc::O_RDONLY | libc::O_LARGEFILE | libc::O_CLOEXEC) as u32,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a new descriptor that nothing else owns.
        let group = Arc::new(unsafe { OwnedFd::from_raw_fd(fd) });
        let marked = dir
            .with(|root| mark_filesystem(group.as_raw_fd(), root))
            .unwrap_or_else(|| Err(io::Error::from_raw_os_error(libc::ENOTCONN)));
        marked?;
        let (drained, drains) = crossbeam_channel::bounded(1);
        let watched = Arc::downgrade(&group);
        std::thread::Builder::new()
            .name("tether-lock-close".into())
            .spawn(move || wake_on_closes(watched, tx, drains))?;
        Ok(CloseWatch {
            group,
            drained,
            buf: vec![0; 16 * 1024],
        })
    }

    /// Reads the close events queued (without waiting): (node, closing process).
    fn read_closes(&mut self, out: &mut Vec<(NodeId, u32)>) {
        let meta_len = std::mem::size_of::<libc::fanotify_event_metadata>();
        loop {
            let (fd, buf) = (self.group.as_raw_fd(), &mut self.buf);
            // SAFETY: buf is writable for its length.
            let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                return; // EAGAIN: nothing more queued
            }
            let mut at = 0usize;
            while at + meta_len <= n as usize {
                // SAFETY: at least meta_len bytes of the kernel's event are in buf at `at`.
                let m: libc::fanotify_event_metadata =
                    unsafe { std::ptr::read_unaligned(buf[at..].as_ptr().cast()) };
                if (m.event_len as usize) < meta_len {
                    return;
                }
                at += m.event_len as usize;
                if m.fd < 0 {
                    continue;
                }
                // SAFETY: the kernel opened this descriptor for us; we own it.
                let file = unsafe { OwnedFd::from_raw_fd(m.fd) };
                if let Some(node) = inode_number(&file) {
                    out.push((node, m.pid as u32));
                }
            }
        }
    }
}

/// Asks the lock thread to read the group whenever it has events, until the group goes.
fn wake_on_closes(group: std::sync::Weak<OwnedFd>, tx: Sender<Cmd>, drained: Receiver<()>) {
    loop {
        let Some(fd) = group.upgrade() else { return };
        // Poll with a timeout so that a dropped group ends this thread.
        let mut pfd = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let ready = unsafe { libc::poll(&mut pfd, 1, 200) };
        drop(fd);
        if ready <= 0 {
            continue;
        }
        if tx.send(Cmd::Drain).is_err() {
            return;
        }
        // Until it has read them (or dropped the group): the events stay readable till then.
        if drained.recv_timeout(Duration::from_secs(1)).is_err() && group.strong_count() == 0 {
            return;
        }
    }
}

fn mark_filesystem(group: i32, root: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: a null path marks the object `root` refers to.
    let r = unsafe {
        libc::fanotify_mark(
            group,
            libc::FAN_MARK_ADD | libc::FAN_MARK_FILESYSTEM,
            libc::FAN_CLOSE_WRITE | libc::FAN_CLOSE_NOWRITE,
            root.as_raw_fd(),
            std::ptr::null(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The inode number (= node id) of an open file, from /proc (fstat could ask the server).
fn inode_number(file: &OwnedFd) -> Option<NodeId> {
    fdinfo_field(std::process::id(), file.as_raw_fd(), "ino:").map(node_of_st_ino)
}

/// A number from /proc/PID/fdinfo/FD (`ino:`, `mnt_id:`): no request to any file system.
fn fdinfo_field(pid: u32, fd: i32, field: &str) -> Option<u64> {
    let info = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")).ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().parse().ok())
}

/// Whether process `pid` has a descriptor open on `node` of the mount `mount_id`.
fn has_open(pid: u32, mount_id: u64, node: NodeId) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .any(|fd| {
            fdinfo_field(pid, fd, "mnt_id:") == Some(mount_id)
                && fdinfo_field(pid, fd, "ino:").map(node_of_st_ino) == Some(node)
        })
}

/// A process's parent, from /proc/PID/stat (the field after the parenthesised name).
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(1)?.parse().ok()
}

/// The size of regular file `node` at `path` below the mount's `root`: asked of the server
/// (`sync`), or as the kernel holds it. An error if the path leads elsewhere now.
fn file_size(root: BorrowedFd<'_>, path: &CStr, node: NodeId, sync: bool) -> io::Result<u64> {
    let how = if sync {
        libc::AT_STATX_FORCE_SYNC
    } else {
        libc::AT_STATX_DONT_SYNC
    };
    let mask = libc::STATX_TYPE | libc::STATX_INO | libc::STATX_SIZE;
    let stx = crate::sys::statx(
        root.as_raw_fd(),
        path,
        libc::AT_SYMLINK_NOFOLLOW | how,
        mask,
    )?;
    let regular = u32::from(stx.stx_mode) & libc::S_IFMT == libc::S_IFREG;
    if node_of_st_ino(stx.stx_ino) != node || !regular {
        return Err(io::Error::from_raw_os_error(libc::ESTALE));
    }
    Ok(stx.stx_size)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lock(owner: u64, typ: u8, start: u64, end: u64) -> LockSpec {
        LockSpec {
            owner,
            flock: false,
            typ,
            start,
            end,
        }
    }

    fn ranges(h: &HeldLocks) -> Vec<(u64, u8, u64, u64)> {
        let mut v: Vec<_> = (h.all().into_iter())
            .map(|(_, l, _)| (l.owner, l.typ, l.start, l.end))
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_new_range_replaces_the_owners_overlapping_ranges() {
        use lock_type::{READ, UNLOCK, WRITE};
        let h = HeldLocks::default();
        h.granted(NodeId::new(1), &lock(7, WRITE, 0, 99), 0);
        h.granted(NodeId::new(1), &lock(7, READ, 10, 19), 0);
        h.granted(NodeId::new(1), &lock(8, READ, 50, u64::MAX), 0);
        assert_eq!(
            ranges(&h),
            [
                (7, READ, 10, 19),
                (7, WRITE, 0, 9),
                (7, WRITE, 20, 99),
                (8, READ, 50, u64::MAX)
            ]
        );
        h.granted(NodeId::new(1), &lock(7, UNLOCK, 5, 24), 0);
        assert_eq!(
            ranges(&h),
            [
                (7, WRITE, 0, 4),
                (7, WRITE, 25, 99),
                (8, READ, 50, u64::MAX)
            ]
        );
        // Unlocking the whole file forgets the owner; flock is kept apart from ranges.
        h.granted(NodeId::new(1), &lock(7, UNLOCK, 0, u64::MAX), 0);
        h.granted(
            NodeId::new(1),
            &LockSpec {
                flock: true,
                ..lock(8, WRITE, 0, 0)
            },
            0,
        );
        assert_eq!(
            ranges(&h),
            [(8, READ, 50, u64::MAX), (8, WRITE, 0, u64::MAX)]
        );
        h.released(NodeId::new(1), 8, 0);
        assert!(h.all().is_empty());
        assert!(h.owners.lock().unwrap().is_empty());
    }

    #[test]
    fn a_release_drops_its_generation_and_never_a_later_one() {
        use lock_type::WRITE;
        let h = HeldLocks::default();
        h.granted(NodeId::new(1), &lock(7, WRITE, 0, 9), 0);
        // The owner closed the file (release of generation 0 on its way) and locked again.
        h.granted(NodeId::new(1), &lock(7, WRITE, 20, 29), 1);
        assert_eq!(ranges(&h), [(7, WRITE, 20, 29)]);
        h.released(NodeId::new(1), 7, 0);
        assert_eq!(ranges(&h), [(7, WRITE, 20, 29)]);
        // A grant of the old generation answered late changes nothing.
        h.granted(NodeId::new(1), &lock(7, WRITE, 40, 49), 0);
        assert_eq!(ranges(&h), [(7, WRITE, 20, 29)]);
        h.released(NodeId::new(1), 7, 1);
        assert!(h.all().is_empty());
    }
}
