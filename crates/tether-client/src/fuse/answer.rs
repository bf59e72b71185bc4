//! What the areas' handlers share: sending a kernel request's Tether request, and answering
//! the kernel from its reply ([`TetherFs::call`] and its kinds), for how long the kernel may
//! keep what it is told ([`ttl_for`]), and names in the protocol's terms. Kept in one place
//! so that every request goes out, and every reply is judged, the same way.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::time::Duration;

use bytes::Bytes;
use fuser::{
    Errno, FopenFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus,
    ReplyEmpty, ReplyEntry, ReplyLock, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr,
};
use tether_proto::{NodeId, Reply, Request};

use super::fs::{Asked, TetherFs};
use super::reply::errno;
use crate::cache::coherence::{Coherence, WATCHED_TTL};
use crate::kernel_ids::kernel_fh;
use crate::known::OpenHandle;
use crate::rpc::ReplyResult;

/// What [`TetherFs::call`] does with a request's outcome: `ok` answers the kernel; an error
/// is passed on, and a reply of the wrong shape (a server bug) becomes EIO.
pub(super) fn on_outcome<R: KernelReply + Send + 'static>(
    reply: R,
    ok: impl FnOnce(R, Reply) -> Result<(), R> + Send + 'static,
) -> impl FnOnce(ReplyResult) + Send + 'static {
    move |res: ReplyResult| match res {
        Ok(r) => {
            if let Err(reply) = ok(reply, r) {
                reply.fail(Errno::EIO);
            }
        }
        Err(e) => reply.fail(errno(e)),
    }
}

/// How long the kernel may keep a reply's view of `node` (found in `parent`), for a request
/// sent at push sequence `sent`: until revoked if watched, not at all if an invalidation
/// may have overtaken the reply, else the fallback timeout.
pub(super) fn ttl_for(
    co: &Coherence,
    fallback: Duration,
    node: NodeId,
    parent: Option<NodeId>,
    sent: u64,
) -> Duration {
    // Before the freshness check: a push recorded after it must be applied (cache/coherence.rs).
    let caching = co.caching(node);
    let parent_fresh = parent.map(|p| co.fresh(p, sent)).unwrap_or(true);
    let ttl = ttl_unless_overtaken(co, fallback, node, parent_fresh, sent);
    if !ttl.is_zero() {
        caching.cached();
    }
    ttl
}

/// [`ttl_for`]'s rule, once the parent's freshness is known.
fn ttl_unless_overtaken(
    co: &Coherence,
    fallback: Duration,
    node: NodeId,
    parent_fresh: bool,
    sent: u64,
) -> Duration {
    if !co.fresh(node, sent) {
        // With the writeback cache a new inode keeps this reply's size for good: have it
        // checked against the host's once the kernel has it (invalidate/fixer.rs).
        if let Some(f) = co.fixer() {
            f.fix_soon(node);
        }
        Duration::ZERO
    } else if !parent_fresh {
        Duration::ZERO
    } else if co.watches(node) {
        WATCHED_TTL
    } else {
        fallback
    }
}

/// The node whose pages (or listing) the kernel may fill or change with `msg` and its
/// answer, and keep until an invalidation drops them.
fn kernel_keeps_pages_of(msg: &Request) -> Option<NodeId> {
    match msg {
        Request::Read { node, .. }
        | Request::Write { node, .. }
        | Request::Readdir { node, .. }
        | Request::Setattr { node, .. }
        | Request::Fallocate { node, .. } => Some(*node),
        Request::CopyFileRange { node_out, .. } => Some(*node_out),
        _ => None,
    }
}

pub(super) fn name(n: &OsStr) -> Bytes {
    Bytes::copy_from_slice(n.as_bytes())
}

/// Every fuser reply type can carry an error.
pub(super) trait KernelReply: Send + 'static {
    fn fail(self, e: Errno);
}

macro_rules! kernel_reply {
    ($($t:ty),*) => { $(impl KernelReply for $t { fn fail(self, e: Errno) { self.error(e) } })* };
}
kernel_reply!(
    ReplyLock,
    ReplyEntry,
    ReplyAttr,
    ReplyData,
    ReplyEmpty,
    ReplyOpen,
    ReplyWrite,
    ReplyStatfs,
    ReplyXattr,
    ReplyDirectory,
    ReplyDirectoryPlus,
    ReplyCreate,
    ReplyLseek
);

impl TetherFs {
    /// Sends `req`; on success `ok` answers the kernel, on error the errno is passed on.
    /// A reply of the wrong shape is a server bug and becomes EIO.
    pub(super) fn call<R: KernelReply>(
        &self,
        req: Asked<'_>,
        msg: Request,
        reply: R,
        ok: impl FnOnce(R, Reply) -> Result<(), R> + Send + 'static,
    ) {
        if msg.op().mutates() && req.origin.replay().is_some() {
            // A replay only imitates a change the host already made (invalidate/host_events.rs).
            reply.fail(Errno::EPERM);
            return;
        }
        self.send(req, &msg, on_outcome(reply, ok));
    }

    /// Sends `msg` for the kernel's `req`; `done` runs with the outcome. A change to a
    /// directory counts when sent and when answered (cache/known_attrs.rs).
    pub(super) fn send(
        &self,
        req: Asked<'_>,
        msg: &Request,
        done: impl FnOnce(ReplyResult) + Send + 'static,
    ) {
        self.send_answering_first(req, msg, done, || {});
    }

    /// [`TetherFs::send`], answering the kernel with `first` before the request goes out
    /// ([`Connection::call_answering_first`](crate::rpc::Connection::call_answering_first)):
    /// for requests answered early.
    pub(super) fn send_answering_first(
        &self,
        req: Asked<'_>,
        msg: &Request,
        done: impl FnOnce(ReplyResult) + Send + 'static,
        first: impl FnOnce(),
    ) {
        if let Some(node) = kernel_keeps_pages_of(msg) {
            self.co.kernel_may_hold(node);
        }
        let touch = self.known_attrs.touching(msg);
        // Names made or removed in directories: replies about them sent before may predate
        // the change ([`Coherence::changed_here`]). Marked on the reader thread, which also
        // hands the kernel every other reply, right after this one's. (Cloned only for
        // those: every request passes here.)
        let names = touch.as_ref().and_then(|t| t.name_changes());
        let co = names.map(|_| self.co.clone());
        let done = move |res: ReplyResult| {
            if let Some(t) = &touch {
                t.answered();
            }
            done(res);
            if let (Some(dirs), Some(co)) = (names, &co) {
                dirs.into_iter().for_each(|dir| co.changed_here(dir));
            }
        };
        self.conn
            .call_answering_first(req.caller(), msg, done, first);
    }

    pub(super) fn empty_call(&self, req: Asked<'_>, msg: Request, reply: ReplyEmpty) {
        self.call(req, msg, reply, |reply, r| match r {
            Reply::Empty => {
                reply.ok();
                Ok(())
            }
            _ => Err(reply),
        });
    }

    /// For open and opendir. When the server watches, ENOSYS puts the kernel in "no open"
    /// mode: it stops sending OPEN/OPENDIR and RELEASE, keeps pages and listings
    /// (KEEP_CACHE and CACHE_DIR by default) and addresses I/O by node, so a cached
    /// open+read+close never leaves the guest; pushes revoke what went stale. Otherwise the
    /// server opens a handle and the kernel drops its pages at every open (close-to-open
    /// consistency, as NFS does).
    pub(super) fn open_call(&self, req: Asked<'_>, msg: Request, reply: ReplyOpen) {
        if self.co.enabled() {
            reply.error(Errno::ENOSYS);
            return;
        }
        let (known, handle) = match msg {
            Request::Open { node, flags } => (self.known.clone(), (node, flags, false)),
            Request::Opendir { node, flags } => (self.known.clone(), (node, flags, true)),
            _ => unreachable!("open_call is for OPEN and OPENDIR"),
        };
        self.call(req, msg, reply, move |reply, r| match r {
            Reply::Open { fh, .. } => {
                let (node, flags, dir) = handle;
                known.opened(fh, OpenHandle { node, flags, dir });
                reply.opened(kernel_fh(Some(fh)), FopenFlags::empty());
                Ok(())
            }
            _ => Err(reply),
        });
    }

    /// For readlink and read: bytes for the kernel.
    pub(super) fn data_call(&self, req: Asked<'_>, msg: Request, reply: ReplyData) {
        self.call(req, msg, reply, |reply, r| match r {
            Reply::Data(d) => {
                reply.data(&d);
                Ok(())
            }
            _ => Err(reply),
        });
    }
}
