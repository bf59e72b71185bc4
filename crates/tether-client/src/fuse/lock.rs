//! Locks, the kernel's side: GETLK asked of the server, SETLK handed to the lock thread, which
//! waits for blocked locks (fuse/locks.rs), and INTERRUPT of a waiting SETLK.

use fuser::{Errno, LockOwner, ReplyEmpty, ReplyLock};
use tether_proto::{lock_type, LockSpec, NodeId, Reply, Request};

use super::fs::{Asked, TetherFs};
use crate::fuse::locks::LockRequest;

impl TetherFs {
    pub(super) fn on_getlk(
        &self,
        req: Asked<'_>,
        ino: NodeId,
        (lock_owner, start, end, typ): (LockOwner, u64, u64, i32),
        reply: ReplyLock,
    ) {
        let msg = Request::Getlk {
            node: ino,
            lock: lock_spec(lock_owner, false, typ, start, end),
        };
        self.call(req, msg, reply, |reply, r| match r {
            Reply::Lock {
                typ, start, end, ..
            } => {
                let typ = lock_type::to_fcntl(typ);
                // The holder may be on the host or in another guest: its pid means nothing
                // here, so none is given (as NFS does for remote holders).
                reply.locked(start, end.min(i64::MAX as u64), typ, 0);
                Ok(())
            }
            _ => Err(reply),
        });
    }

    pub(super) fn on_setlk(
        &self,
        req: Asked<'_>,
        ino: NodeId,
        (lock_owner, start, end, typ): (LockOwner, u64, u64, i32),
        (pid, sleep, flock): (u32, bool, bool),
        reply: ReplyEmpty,
    ) {
        let Some(locks) = &self.locks else {
            reply.error(Errno::ENOSYS);
            return;
        };
        let r = LockRequest {
            unique: req.unique().0,
            who: req.caller(),
            node: ino,
            lock: lock_spec(lock_owner, flock, typ, start, end),
            tgid: pid,
            wait: sleep,
            generation: 0,
        };
        locks.set(r, reply);
    }

    pub(super) fn on_interrupt(&self, unique: fuser::RequestId) {
        if let Some(l) = &self.locks {
            l.interrupt(unique.0);
        }
    }
}

/// A kernel lock request on the wire: fcntl's lock types, and OFFSET_MAX for "to the end".
fn lock_spec(owner: LockOwner, flock: bool, typ: i32, start: u64, end: u64) -> LockSpec {
    LockSpec {
        owner: owner.0,
        flock,
        typ: lock_type::from_fcntl(typ),
        start,
        end: if end >= i64::MAX as u64 {
            u64::MAX
        } else {
            end
        },
    }
}
