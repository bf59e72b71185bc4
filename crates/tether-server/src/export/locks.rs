//! Guest locks as real locks on the host's files (docs/protocol.md §16).
//!
//! Every guest lock owner (a process's file table for POSIX locks, an open file for flock and
//! OFD locks) gets its own open file description of the host file, and its locks are taken
//! on that: OFD locks (`F_OFD_SETLK`) for POSIX and OFD guest locks, flock(2) for flock. So two
//! guest owners exclude each other as two host processes would, host processes' POSIX, OFD
//! and flock locks exclude the guest's and back, and closing the description (LOCK_RELEASE,
//! FORGET of the node, the end of the session) drops everything that owner held.
//!
//! Nothing here waits: a conflicting request gets EAGAIN and the client retries a blocking
//! one, so a waiting lock never holds a server worker and can be interrupted in the guest.
//! A session refused a lock is told (push LOCK_FREED) when another session of the export
//! releases or downgrades one on the same file, so that its waiters need not wait for their
//! next try ([`LockWaits`]); a host process's release is not seen, and is found by polling.
//!
//! One exception to "locks pass straight through": SQLite's WAL index (`DB-shm`). WAL needs
//! every process using the database to share that file's memory, which a guest and the
//! host (or two guests) do not (coherence.md, "Locks"). So the first session to use a WAL
//! index takes it for itself: the server holds a write lock on the index's DMS byte
//! (128; SQLite takes a read lock there for as long as a connection has the index open)
//! while any process of the session does, and the session's own processes take their DMS
//! locks on another byte of the same file. A host process or another guest then gets
//! SQLITE_BUSY ("database is locked") opening the database, instead of corrupting it; and
//! a guest opening a database the host has open in WAL mode gets the same.

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};

use dashmap::DashMap;
use tether_proto::{lock_type, LockSpec, NodeId, Reply, WireErrno};

use super::ops::ExportFs;
use crate::backend::{Backend, RangeLock, SysResult};

/// The open file descriptions that carry each (node, guest owner)'s locks.
#[derive(Default)]
pub struct LockTable {
    owners: DashMap<(NodeId, u64), Arc<OwnerFd>>,
    /// The WAL indexes this session has taken, with the description holding the DMS byte.
    /// One mutex for all: taking and giving back must not interleave, and it is rare.
    wal_guards: Mutex<HashMap<NodeId, OwnedFd>>,
    /// WAL indexes this session was refused, so that the log says so once each.
    wal_refused: Mutex<HashSet<NodeId>>,
}

/// One owner's description, and the generation of its locks (protocol.md §16): a SETLK
/// of a later generation replaces it, a LOCK_RELEASE of an earlier one leaves it alone.
struct OwnerFd {
    fd: OwnedFd,
    generation: u64,
}

/// SQLite's WAL index, as its unix VFS locks it: the file's name ends so, and a connection
/// holds a read lock on the DMS byte while it has the index open.
const WAL_INDEX_SUFFIX: &[u8] = b"-shm";
const WAL_DMS: u64 = 128;
/// Where this session's processes take their DMS locks instead, among themselves: far past
/// anything SQLite uses, and past any WAL index's size.
const SESSION_DMS: u64 = 1 << 40;

impl LockTable {
    /// Gives back the WAL index `node` if no process of the session holds its DMS lock
    /// any more. Call with the guards locked.
    fn release_unused_guard(
        host: &dyn Backend,
        guards: &mut HashMap<NodeId, OwnedFd>,
        node: NodeId,
    ) {
        let Some(guard) = guards.get(&node) else {
            return;
        };
        let probe = RangeLock::request(libc::F_WRLCK, SESSION_DMS as i64, 1);
        // Only this session's owners lock SESSION_DMS (others cannot get the guard).
        if matches!(host.getlk(guard.as_fd(), &probe), Ok(None)) {
            guards.remove(&node);
        }
    }
}

/// A host file, as (st_dev, st_ino): sessions name files by their own node ids.
type FileKey = (u64, u64);

fn file_key(host: &dyn Backend, fd: BorrowedFd<'_>) -> Option<FileKey> {
    host.stat(fd).ok().map(|st| (st.st_dev, st.st_ino))
}

/// Most files with refused sessions remembered at once, across the export: past it, a
/// refused session's waiters find a release by polling only.
const MAX_WAITED_FILES: usize = 4096;

/// Where a session hears of locks freed by other sessions: its id, and the channel of the
/// thread that pushes LOCK_FREED to its client (session.rs). Only sessions that were
/// granted pushes have one.
pub struct LockWake {
    pub session: u64,
    pub tx: Sender<NodeId>,
}

/// Sessions refused a lock on a file, per file, shared by every session of the export.
/// Each entry is told of the next release by another session and then dropped: a waiter
/// refused again is entered again.
#[derive(Default)]
pub struct LockWaits {
    files: Mutex<HashMap<FileKey, Vec<Refused>>>,
}

/// A session refused a lock on a file: its id, its node of the file, its pusher's channel.
type Refused = (u64, NodeId, Sender<NodeId>);

impl LockWaits {
    fn refused(&self, key: FileKey, node: NodeId, wake: &LockWake) {
        let mut files = self.files.lock().unwrap();
        if files.len() >= MAX_WAITED_FILES && !files.contains_key(&key) {
            return;
        }
        let waiting = files.entry(key).or_default();
        if !waiting
            .iter()
            .any(|(s, n, _)| *s == wake.session && *n == node)
        {
            waiting.push((wake.session, node, wake.tx.clone()));
        }
    }

    /// Session `by` released or downgraded a lock on `key`: every other session refused
    /// there hears of it. (`by`'s own waiters are woken by its client.)
    fn freed(&self, key: FileKey, by: u64) {
        let Some(waiting) = self.files.lock().unwrap().remove(&key) else {
            return;
        };
        for (session, node, tx) in waiting {
            if session != by {
                let _ = tx.send(node);
            }
        }
    }

    fn is_empty(&self) -> bool {
        self.files.lock().unwrap().is_empty()
    }

    /// The session ended: nothing to tell it any more.
    pub fn end_session(&self, session: u64) {
        let mut files = self.files.lock().unwrap();
        files.retain(|_, waiting| {
            waiting.retain(|(s, _, _)| *s != session);
            !waiting.is_empty()
        });
    }
}

/// The host's byte range for a guest range with an inclusive end (`u64::MAX`: to the end).
fn host_range(lock: &LockSpec) -> SysResult<(i64, i64)> {
    let start = i64::try_from(lock.start).map_err(|_| WireErrno::EINVAL)?;
    if lock.end == u64::MAX {
        return Ok((start, 0));
    }
    let len = (lock.end - lock.start)
        .checked_add(1)
        .and_then(|l| i64::try_from(l).ok())
        .filter(|l| start.checked_add(*l).is_some())
        .ok_or(WireErrno::EINVAL)?;
    Ok((start, len))
}

impl ExportFs {
    /// The open file description for `owner`'s locks of `generation` on `node`, opened on
    /// first use or when an older generation's is still here (its locks go with it). Also
    /// says whether it was opened now: see [`Self::forget_if_unused`].
    fn lock_fd(
        &self,
        node: NodeId,
        owner: u64,
        generation: u64,
    ) -> SysResult<(Arc<OwnerFd>, bool)> {
        let current = self.locks.owners.get(&(node, owner)).map(|e| e.clone());
        match current {
            Some(e) if e.generation >= generation => return Ok((e, false)),
            Some(_) => {}
            None if self.locks.owners.len() >= self.export.max_handles => {
                return Err(WireErrno::ENOLCK)
            }
            None => {}
        }
        let new = Arc::new(OwnerFd {
            fd: self.lock_description(node)?,
            generation,
        });
        match self.locks.owners.entry((node, owner)) {
            dashmap::Entry::Occupied(o) if o.get().generation >= generation => {
                Ok((o.get().clone(), false))
            }
            dashmap::Entry::Occupied(mut o) => {
                o.insert(new.clone());
                Ok((new, true))
            }
            dashmap::Entry::Vacant(v) => {
                v.insert(new.clone());
                Ok((new, true))
            }
        }
    }

    /// A new open file description of `node` to hold locks. Write locks need a writable
    /// one; read-only where the server may not write (read-only export, file mode), so read
    /// locks still work.
    fn lock_description(&self, node: NodeId) -> SysResult<OwnedFd> {
        let (n, path_fd) = self.openable_node(node)?;
        if n.is_dir() {
            return self.reopen(&path_fd, libc::O_RDONLY | libc::O_DIRECTORY);
        }
        let read_only = libc::O_RDONLY | libc::O_NOCTTY | libc::O_NONBLOCK;
        if self.export.read_only {
            return self.reopen(&path_fd, read_only);
        }
        match self.reopen(&path_fd, libc::O_RDWR | libc::O_NOCTTY | libc::O_NONBLOCK) {
            Err(e) if [WireErrno::EACCES, WireErrno::EROFS, WireErrno::ETXTBSY].contains(&e) => {
                self.reopen(&path_fd, read_only)
            }
            r => r,
        }
    }

    /// After a failed first lock of an owner: closes the description opened for it, unless
    /// another request of the same owner uses it meanwhile. Else every refused `flock -n`
    /// of a new process would keep a descriptor until the guest forgets the file.
    fn forget_if_unused(&self, node: NodeId, owner: u64, fd: Arc<OwnerFd>) {
        // Under the map's lock: a request that got the description from the map holds a
        // third reference, and none can get it while this runs.
        self.locks.owners.remove_if(&(node, owner), |_, held| {
            Arc::ptr_eq(held, &fd) && Arc::strong_count(held) == 2
        });
    }

    /// SETLK: take, change or drop `lock` without waiting.
    pub(super) fn setlk(&self, node: NodeId, lock: LockSpec, generation: u64) -> SysResult<Reply> {
        if lock.typ == lock_type::UNLOCK {
            // An older generation's locks are released already, as far as the guest knows.
            (self.locks.owners).remove_if(&(node, lock.owner), |_, e| e.generation < generation);
            if !self.locks.owners.contains_key(&(node, lock.owner)) {
                // This owner holds nothing here: nothing to drop, no description to open.
                return Ok(Reply::Empty);
            }
        }
        if self.is_wal_dms(&lock) && self.is_wal_index(node)? {
            return self.wal_dms_lock(node, lock, generation);
        }
        let (owner_fd, new) = self.lock_fd(node, lock.owner, generation)?;
        let fd = &owner_fd.fd;
        let taken = if lock.flock {
            let op = match lock.typ {
                lock_type::READ => libc::LOCK_SH,
                lock_type::WRITE => libc::LOCK_EX,
                _ => libc::LOCK_UN,
            };
            self.host().flock(fd.as_fd(), op)
        } else {
            host_range(&lock).and_then(|(start, len)| {
                let l = RangeLock::request(lock_type::to_fcntl(lock.typ), start, len);
                self.host().setlk(fd.as_fd(), &l)
            })
        };
        if let Err(e) = taken {
            if e == WireErrno::EAGAIN {
                self.lock_refused(node, fd.as_fd());
            }
            if new {
                self.forget_if_unused(node, lock.owner, owner_fd);
            }
            return Err(e);
        }
        if lock.typ == lock_type::UNLOCK {
            // An unlock of the whole file also drops a WAL index's session DMS lock.
            let mut guards = self.locks.wal_guards.lock().unwrap();
            LockTable::release_unused_guard(self.host(), &mut guards, node);
        }
        // An unlock, or a read lock of an owner that held one here (maybe a write lock).
        if lock.typ == lock_type::UNLOCK || (lock.typ == lock_type::READ && !new) {
            self.locks_freed(self.waited_files([fd.as_fd()]));
        }
        Ok(Reply::Empty)
    }

    /// This session was refused a lock on `node` (open as `fd`): it hears when another
    /// session frees one there.
    fn lock_refused(&self, node: NodeId, fd: BorrowedFd<'_>) {
        if let (Some(wake), Some(key)) = (&self.lock_wake, file_key(self.host(), fd)) {
            self.export.lock_waits.refused(key, node, wake);
        }
    }

    /// The files open as `fds`, as [`LockWaits`] names them. None while no session waits
    /// for a lock anywhere: then a release costs no `fstat`.
    fn waited_files<'a>(&self, fds: impl IntoIterator<Item = BorrowedFd<'a>>) -> HashSet<FileKey> {
        if self.export.lock_waits.is_empty() {
            return HashSet::new();
        }
        (fds.into_iter())
            .filter_map(|fd| file_key(self.host(), fd))
            .collect()
    }

    /// This session released or downgraded locks on `files`: other sessions refused a lock
    /// on one of them hear of it.
    fn locks_freed(&self, files: HashSet<FileKey>) {
        let by = self.lock_wake.as_ref().map_or(0, |w| w.session);
        for key in files {
            self.export.lock_waits.freed(key, by);
        }
    }

    /// Drops the owners' descriptions `gone` (their locks go with them), then tells other
    /// sessions waiting on those files.
    fn drop_owners(&self, gone: Vec<Arc<OwnerFd>>) {
        let files = self.waited_files(gone.iter().map(|o| o.fd.as_fd()));
        drop(gone);
        self.locks_freed(files);
    }

    /// FORGET of `node`: the guest holds no file open on it, so no lock either.
    pub(super) fn forget_locks(&self, node: NodeId) {
        // Every FORGET comes here: with no owners there is nothing to drop.
        if self.locks.owners.is_empty() {
            return;
        }
        let mut gone = Vec::new();
        self.locks.owners.retain(|(n, _), o| {
            if *n == node {
                gone.push(o.clone());
            }
            *n != node
        });
        self.locks.wal_guards.lock().unwrap().remove(&node);
        self.drop_owners(gone);
    }

    /// The end of the session: every lock it holds goes.
    pub(super) fn release_all_locks(&self) {
        let gone: Vec<Arc<OwnerFd>> = self
            .locks
            .owners
            .iter()
            .map(|e| e.value().clone())
            .collect();
        self.locks.owners.clear();
        self.locks.wal_guards.lock().unwrap().clear();
        self.drop_owners(gone);
        if let Some(w) = &self.lock_wake {
            self.export.lock_waits.end_session(w.session);
        }
    }

    /// GETLK: the first lock another owner (in any guest or on the host) holds that would
    /// conflict with `lock`.
    pub(super) fn getlk(&self, node: NodeId, lock: LockSpec) -> SysResult<Reply> {
        // SQLite asks who holds a WAL index's DMS byte before it locks it: within a session
        // that holds the index, that is whoever holds the session's DMS byte.
        let session_dms =
            self.is_wal_dms(&lock) && self.locks.wal_guards.lock().unwrap().contains_key(&node);
        let lock = if session_dms {
            LockSpec {
                start: SESSION_DMS,
                end: SESSION_DMS,
                ..lock
            }
        } else {
            lock
        };
        let (start, len) = host_range(&lock)?;
        let free = Reply::Lock {
            typ: lock_type::UNLOCK,
            start: 0,
            end: 0,
            pid: 0,
        };
        if lock.typ == lock_type::UNLOCK {
            return Ok(free);
        }
        // The owner's own description, so that its own locks do not count as conflicts; a
        // temporary one when it holds nothing here.
        let own = self
            .locks
            .owners
            .get(&(node, lock.owner))
            .map(|o| o.clone());
        let temporary;
        let fd = match &own {
            Some(o) => o.fd.as_fd(),
            None => {
                temporary = self.lock_description(node)?;
                temporary.as_fd()
            }
        };
        let probe = RangeLock::request(lock_type::to_fcntl(lock.typ), start, len);
        Ok(match self.host().getlk(fd, &probe)? {
            None => free,
            Some(c) => Reply::Lock {
                typ: lock_type::from_fcntl(c.typ.into()),
                start: if session_dms { WAL_DMS } else { c.start as u64 },
                end: if session_dms {
                    WAL_DMS
                } else if c.len == 0 {
                    u64::MAX
                } else {
                    (c.start + c.len - 1) as u64
                },
                pid: c.pid.max(0) as u32,
            },
        })
    }

    /// Whether `lock` is on the DMS byte alone, as SQLite takes it on a WAL index.
    fn is_wal_dms(&self, lock: &LockSpec) -> bool {
        !lock.flock && lock.start == WAL_DMS && lock.end == WAL_DMS
    }

    fn is_wal_index(&self, node: NodeId) -> SysResult<bool> {
        Ok(self.nodes.get(node)?.name_ends_with(WAL_INDEX_SUFFIX))
    }

    /// A DMS lock on a WAL index (see the module's comment): taken or dropped on
    /// SESSION_DMS, with the session's hold on the index taken first or given back after.
    fn wal_dms_lock(&self, node: NodeId, lock: LockSpec, generation: u64) -> SysResult<Reply> {
        let mut guards = self.locks.wal_guards.lock().unwrap();
        if lock.typ != lock_type::UNLOCK && !guards.contains_key(&node) {
            let guard = self.lock_description(node)?;
            let dms = RangeLock::request(libc::F_WRLCK, WAL_DMS as i64, 1);
            if let Err(e) = self.host().setlk(guard.as_fd(), &dms) {
                if self.locks.wal_refused.lock().unwrap().insert(node) {
                    tracing::info!(
                        "a SQLite WAL index (node {node}) is in use on the host or by another \
                         guest: refused to this guest while it is ({e:?}); sharing it would \
                         corrupt the database"
                    );
                }
                return Err(e);
            }
            guards.insert(node, guard);
        }
        let own = RangeLock::request(lock_type::to_fcntl(lock.typ), SESSION_DMS as i64, 1);
        let r = (self.lock_fd(node, lock.owner, generation)).and_then(|(owner_fd, new)| {
            let r = self.host().setlk(owner_fd.fd.as_fd(), &own);
            if r.is_err() && new {
                self.forget_if_unused(node, lock.owner, owner_fd);
            }
            r
        });
        // Every way out: a guard no process of the session uses goes back.
        LockTable::release_unused_guard(self.host(), &mut guards, node);
        r.map(|_| Reply::Empty)
    }

    /// LOCK_RELEASE: closes `owner`'s description of `node`, which drops all its locks,
    /// unless it is for a later generation than `generation`.
    pub(super) fn lock_release(&self, node: NodeId, owner: u64, generation: u64) -> Reply {
        let gone = (self.locks.owners).remove_if(&(node, owner), |_, e| e.generation <= generation);
        {
            let mut guards = self.locks.wal_guards.lock().unwrap();
            LockTable::release_unused_guard(self.host(), &mut guards, node);
        }
        self.drop_owners(gone.into_iter().map(|(_, o)| o).collect());
        Reply::Empty
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(start: u64, end: u64) -> LockSpec {
        LockSpec {
            owner: 1,
            flock: false,
            typ: lock_type::WRITE,
            start,
            end,
        }
    }

    #[test]
    fn a_release_tells_the_other_sessions_refused_there_once() {
        let waits = LockWaits::default();
        let (tx1, rx1) = std::sync::mpsc::channel();
        let (tx2, rx2) = std::sync::mpsc::channel();
        let one = LockWake {
            session: 1,
            tx: tx1,
        };
        let two = LockWake {
            session: 2,
            tx: tx2,
        };
        waits.refused((1, 10), 5, &one);
        waits.refused((1, 10), 5, &one);
        waits.refused((1, 10), 7, &two);
        // Session 2's own release: its client wakes its waiters; session 1 hears, once.
        waits.freed((1, 10), 2);
        assert_eq!(rx1.try_iter().collect::<Vec<_>>(), vec![5]);
        assert!(rx2.try_recv().is_err());
        waits.freed((1, 10), 2);
        assert!(rx1.try_recv().is_err(), "told twice");
        // A session that ended hears nothing.
        waits.refused((1, 11), 6, &one);
        waits.end_session(1);
        waits.freed((1, 11), 2);
        assert!(rx1.try_recv().is_err());
        assert!(waits.files.lock().unwrap().is_empty());
    }

    #[test]
    fn guest_ranges_become_host_ranges() {
        assert_eq!(host_range(&spec(0, u64::MAX)), Ok((0, 0)));
        assert_eq!(host_range(&spec(10, 19)), Ok((10, 10)));
        assert_eq!(host_range(&spec(5, 5)), Ok((5, 1)));
        // Beyond what the host's off_t can name.
        assert_eq!(host_range(&spec(1 << 63, u64::MAX)), Err(WireErrno::EINVAL));
        assert_eq!(host_range(&spec(0, u64::MAX - 1)), Err(WireErrno::EINVAL));
        assert_eq!(
            host_range(&spec(i64::MAX as u64, i64::MAX as u64 + 5)),
            Err(WireErrno::EINVAL)
        );
    }
}
