//! Guest locks as real locks on the host's files (docs/protocol.md §16): SETLK, GETLK,
//! LOCK_RELEASE. The session's lock state is export/locks.rs.
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
//! next try ([`LockWaits`](crate::export::locks::LockWaits)); a host process's release is
//! not seen, and is found by polling.
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

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use tether_proto::{lock_type, LockSpec, NodeId, Reply, WireErrno};

use crate::backend::{LockFd, RangeLock, SysResult};
use crate::export::fs::ExportFs;
use crate::export::locks::OwnerFd;

/// SQLite's WAL index, as its unix VFS locks it: the file's name ends so, and a connection
/// holds a read lock on the DMS byte while it has the index open.
const WAL_INDEX_SUFFIX: &[u8] = b"-shm";
const WAL_DMS: u64 = 128;
/// Where this session's processes take their DMS locks instead, among themselves: far past
/// anything SQLite uses, and past any WAL index's size.
const SESSION_DMS: u64 = 1 << 40;

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

/// Gives back the WAL index `node` if no process of the session holds its DMS lock
/// any more. Call with the guards locked.
fn release_unused_guard(fs: &ExportFs, guards: &mut HashMap<NodeId, LockFd>, node: NodeId) {
    let Some(guard) = guards.get(&node) else {
        return;
    };
    let probe = RangeLock::request(libc::F_WRLCK, SESSION_DMS as i64, 1);
    // Only this session's owners lock SESSION_DMS (others cannot get the guard).
    if matches!(fs.host().getlk(guard.as_fd(), &probe), Ok(None)) {
        guards.remove(&node);
    }
}

/// The open file description for `owner`'s locks of `generation` on `node`, opened on
/// first use or when an older generation's is still here (its locks go with it). Also
/// says whether it was opened now: see [`forget_if_unused`].
fn lock_fd(
    fs: &ExportFs,
    node: NodeId,
    owner: u64,
    generation: u64,
) -> SysResult<(Arc<OwnerFd>, bool)> {
    let current = fs.locks.owners.get(&(node, owner)).map(|e| e.clone());
    match current {
        Some(e) if e.generation >= generation => return Ok((e, false)),
        Some(_) => {}
        None if fs.locks.owners.len() >= fs.export.max_handles => return Err(WireErrno::ENOLCK),
        None => {}
    }
    let new = Arc::new(OwnerFd {
        fd: lock_description(fs, node)?,
        generation,
    });
    match fs.locks.owners.entry((node, owner)) {
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
fn lock_description(fs: &ExportFs, node: NodeId) -> SysResult<LockFd> {
    let fd = open_description(fs, node)?;
    Ok(LockFd::new(fd, fs.export.host.clone()))
}

fn open_description(fs: &ExportFs, node: NodeId) -> SysResult<OwnedFd> {
    let (n, path_fd) = fs.openable_node(node)?;
    if n.is_dir() {
        return fs.reopen(&path_fd, libc::O_RDONLY | libc::O_DIRECTORY);
    }
    let read_only = libc::O_RDONLY | libc::O_NOCTTY | libc::O_NONBLOCK;
    if fs.export.read_only {
        return fs.reopen(&path_fd, read_only);
    }
    match fs.reopen(&path_fd, libc::O_RDWR | libc::O_NOCTTY | libc::O_NONBLOCK) {
        Err(e) if [WireErrno::EACCES, WireErrno::EROFS, WireErrno::ETXTBSY].contains(&e) => {
            fs.reopen(&path_fd, read_only)
        }
        r => r,
    }
}

/// After a failed first lock of an owner: closes the description opened for it, unless
/// another request of the same owner uses it meanwhile. Else every refused `flock -n`
/// of a new process would keep a descriptor until the guest forgets the file.
fn forget_if_unused(fs: &ExportFs, node: NodeId, owner: u64, fd: Arc<OwnerFd>) {
    // Under the map's lock: a request that got the description from the map holds a
    // third reference, and none can get it while this runs.
    fs.locks.owners.remove_if(&(node, owner), |_, held| {
        Arc::ptr_eq(held, &fd) && Arc::strong_count(held) == 2
    });
}

/// SETLK: take, change or drop `lock` without waiting.
pub fn setlk(fs: &ExportFs, node: NodeId, lock: LockSpec, generation: u64) -> SysResult<Reply> {
    if lock.typ == lock_type::UNLOCK {
        // An older generation's locks are released already, as far as the guest knows.
        (fs.locks.owners).remove_if(&(node, lock.owner), |_, e| e.generation < generation);
        if !fs.locks.owners.contains_key(&(node, lock.owner)) {
            // This owner holds nothing here: nothing to drop, no description to open.
            return Ok(Reply::Empty);
        }
    }
    if is_wal_dms(&lock) && is_wal_index(fs, node)? {
        return wal_dms_lock(fs, node, lock, generation);
    }
    let (owner_fd, new) = lock_fd(fs, node, lock.owner, generation)?;
    let fd = &owner_fd.fd;
    let taken = if lock.flock {
        let op = match lock.typ {
            lock_type::READ => libc::LOCK_SH,
            lock_type::WRITE => libc::LOCK_EX,
            _ => libc::LOCK_UN,
        };
        fs.host().flock(fd.as_fd(), op)
    } else {
        host_range(&lock).and_then(|(start, len)| {
            let l = RangeLock::request(lock_type::to_fcntl(lock.typ), start, len);
            fs.host().setlk(fd.as_fd(), &l)
        })
    };
    if let Err(e) = taken {
        if e == WireErrno::EAGAIN {
            fs.locks.refused(node, fd.as_fd());
        }
        if new {
            forget_if_unused(fs, node, lock.owner, owner_fd);
        }
        return Err(e);
    }
    if lock.typ == lock_type::UNLOCK {
        // An unlock of the whole file also drops a WAL index's session DMS lock.
        let mut guards = fs.locks.wal_guards.lock().unwrap();
        release_unused_guard(fs, &mut guards, node);
    }
    // An unlock, or a read lock of an owner that held one here (maybe a write lock).
    if lock.typ == lock_type::UNLOCK || (lock.typ == lock_type::READ && !new) {
        fs.locks.freed(fs.locks.waited_files([fd.as_fd()]));
    }
    Ok(Reply::Empty)
}

/// GETLK: the first lock another owner (in any guest or on the host) holds that would
/// conflict with `lock`.
pub fn getlk(fs: &ExportFs, node: NodeId, lock: LockSpec) -> SysResult<Reply> {
    // SQLite asks who holds a WAL index's DMS byte before it locks it: within a session
    // that holds the index, that is whoever holds the session's DMS byte.
    let session_dms = is_wal_dms(&lock) && fs.locks.wal_guards.lock().unwrap().contains_key(&node);
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
    let own = fs.locks.owners.get(&(node, lock.owner)).map(|o| o.clone());
    let temporary;
    let fd = match &own {
        Some(o) => o.fd.as_fd(),
        None => {
            temporary = lock_description(fs, node)?;
            temporary.as_fd()
        }
    };
    let probe = RangeLock::request(lock_type::to_fcntl(lock.typ), start, len);
    Ok(match fs.host().getlk(fd, &probe)? {
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
fn is_wal_dms(lock: &LockSpec) -> bool {
    !lock.flock && lock.start == WAL_DMS && lock.end == WAL_DMS
}

fn is_wal_index(fs: &ExportFs, node: NodeId) -> SysResult<bool> {
    Ok(fs.nodes.get(node)?.name_ends_with(WAL_INDEX_SUFFIX))
}

/// A DMS lock on a WAL index (see the module's comment): taken or dropped on
/// SESSION_DMS, with the session's hold on the index taken first or given back after.
fn wal_dms_lock(fs: &ExportFs, node: NodeId, lock: LockSpec, generation: u64) -> SysResult<Reply> {
    let mut guards = fs.locks.wal_guards.lock().unwrap();
    if lock.typ != lock_type::UNLOCK && !guards.contains_key(&node) {
        let guard = lock_description(fs, node)?;
        let dms = RangeLock::request(libc::F_WRLCK, WAL_DMS as i64, 1);
        if let Err(e) = fs.host().setlk(guard.as_fd(), &dms) {
            if fs.locks.wal_refused.lock().unwrap().insert(node) {
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
    let r = (lock_fd(fs, node, lock.owner, generation)).and_then(|(owner_fd, new)| {
        let r = fs.host().setlk(owner_fd.fd.as_fd(), &own);
        if r.is_err() && new {
            forget_if_unused(fs, node, lock.owner, owner_fd);
        }
        r
    });
    // Every way out: a guard no process of the session uses goes back.
    release_unused_guard(fs, &mut guards, node);
    r.map(|_| Reply::Empty)
}

/// LOCK_RELEASE: closes `owner`'s description of `node`, which drops all its locks,
/// unless it is for a later generation than `generation`.
pub fn release(fs: &ExportFs, node: NodeId, owner: u64, generation: u64) -> SysResult<Reply> {
    let gone = (fs.locks.owners).remove_if(&(node, owner), |_, e| e.generation <= generation);
    {
        let mut guards = fs.locks.wal_guards.lock().unwrap();
        release_unused_guard(fs, &mut guards, node);
    }
    fs.locks
        .drop_owners(gone.into_iter().map(|(_, o)| o).collect());
    Ok(Reply::Empty)
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
