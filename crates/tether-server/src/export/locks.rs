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

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use dashmap::DashMap;
use tether_proto::{lock_type, LockSpec, NodeId, Reply, WireErrno};

use super::ops::ExportFs;
use super::sys::{self, RangeLock, SysResult};

/// The open file descriptions that carry each (node, guest owner)'s locks.
#[derive(Default)]
pub struct LockTable {
    owners: DashMap<(NodeId, u64), Arc<OwnedFd>>,
}

impl LockTable {
    /// Drops every lock held on `node` (the guest forgot it, so no guest file is open on it).
    pub fn forget_node(&self, node: NodeId) {
        if !self.owners.is_empty() {
            self.owners.retain(|(n, _), _| *n != node);
        }
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

fn fcntl_type(typ: u8) -> i16 {
    (match typ {
        lock_type::READ => libc::F_RDLCK,
        lock_type::WRITE => libc::F_WRLCK,
        _ => libc::F_UNLCK,
    }) as i16
}

impl ExportFs {
    /// The open file description for `owner`'s locks on `node`, opened on first use.
    fn lock_fd(&self, node: NodeId, owner: u64) -> SysResult<Arc<OwnedFd>> {
        if let Some(fd) = self.locks.owners.get(&(node, owner)) {
            return Ok(fd.clone());
        }
        if self.locks.owners.len() >= self.export.max_handles {
            return Err(WireErrno::ENOLCK);
        }
        let (n, path_fd) = self.openable_node(node)?;
        // Write locks need a writable description; fall back to read-only where the
        // server may not write (read-only export, file mode), so read locks still work.
        let fd = if n.is_dir() {
            self.reopen(&path_fd, libc::O_RDONLY | libc::O_DIRECTORY)?
        } else if self.export.read_only {
            self.reopen(&path_fd, libc::O_RDONLY)?
        } else {
            let flags = libc::O_RDWR | libc::O_NOCTTY | libc::O_NONBLOCK;
            match self.reopen(&path_fd, flags) {
                Err(e)
                    if [WireErrno::EACCES, WireErrno::EROFS, WireErrno::ETXTBSY].contains(&e) =>
                {
                    self.reopen(&path_fd, libc::O_RDONLY | libc::O_NONBLOCK)?
                }
                r => r?,
            }
        };
        Ok(self
            .locks
            .owners
            .entry((node, owner))
            .or_insert(Arc::new(fd))
            .clone())
    }

    /// SETLK: take, change or drop `lock` without waiting.
    pub(super) fn setlk(&self, node: NodeId, lock: LockSpec) -> SysResult<Reply> {
        if lock.typ == lock_type::UNLOCK && !self.locks.owners.contains_key(&(node, lock.owner)) {
            // This owner holds nothing here: nothing to drop, no description to open.
            return Ok(Reply::Empty);
        }
        let fd = self.lock_fd(node, lock.owner)?;
        if lock.flock {
            let op = match lock.typ {
                lock_type::READ => libc::LOCK_SH,
                lock_type::WRITE => libc::LOCK_EX,
                _ => libc::LOCK_UN,
            };
            sys::flock_nb(fd.as_fd(), op)?;
        } else {
            let (start, len) = host_range(&lock)?;
            let l = RangeLock {
                typ: fcntl_type(lock.typ),
                start,
                len,
                pid: 0,
            };
            sys::ofd_setlk(fd.as_fd(), &l)?;
        }
        Ok(Reply::Empty)
    }

    /// GETLK: the first lock another owner (in any guest or on the host) holds that would
    /// conflict with `lock`.
    pub(super) fn getlk(&self, node: NodeId, lock: LockSpec) -> SysResult<Reply> {
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
            .map(|f| f.clone());
        let fd = match own {
            Some(fd) => fd,
            None => {
                let (n, path_fd) = self.openable_node(node)?;
                let flags = if n.is_dir() {
                    libc::O_RDONLY | libc::O_DIRECTORY
                } else {
                    libc::O_RDONLY | libc::O_NONBLOCK
                };
                Arc::new(self.reopen(&path_fd, flags)?)
            }
        };
        let probe = RangeLock {
            typ: fcntl_type(lock.typ),
            start,
            len,
            pid: 0,
        };
        Ok(match sys::ofd_getlk(fd.as_fd(), &probe)? {
            None => free,
            Some(c) => Reply::Lock {
                typ: if c.typ == libc::F_WRLCK as i16 {
                    lock_type::WRITE
                } else {
                    lock_type::READ
                },
                start: c.start as u64,
                end: if c.len == 0 {
                    u64::MAX
                } else {
                    (c.start + c.len - 1) as u64
                },
                pid: c.pid.max(0) as u32,
            },
        })
    }

    /// LOCK_RELEASE: closes `owner`'s description of `node`, which drops all its locks.
    pub(super) fn lock_release(&self, node: NodeId, owner: u64) -> Reply {
        self.locks.owners.remove(&(node, owner));
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
