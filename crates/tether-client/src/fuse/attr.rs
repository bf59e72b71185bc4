//! Attributes: GETATTR (answered from what the client knows when it can, after the writes
//! answered early when there are some), SETATTR (with a replay's or the fixer's re-statement
//! of the host's attributes), ACCESS, STATFS and READLINK. The GETATTR and SETATTR replies are
//! kept to answer the next GETATTR (cache/known_attrs.rs).

use std::sync::Arc;
use std::time::Duration;

use fuser::{AccessFlags, Errno, ReplyAttr, ReplyData, ReplyEmpty, ReplyStatfs, TimeOrNow};
use tether_proto::{setattr_valid, HandleId, NodeId, Reply, Request, SetAttr};

use super::answer::{on_outcome, ttl_for};
use super::fs::{Asked, TetherFs};
use super::reply::{file_attr, set_time};
use crate::cache::coherence::Coherence;
use crate::cache::known_attrs::KnownAttrs;

impl TetherFs {
    pub(super) fn on_getattr(
        &self,
        req: Asked<'_>,
        ino: NodeId,
        fh: Option<HandleId>,
        reply: ReplyAttr,
    ) {
        // Before the check: an invalidation after it shortens the answer's life.
        let now = self.co.now();
        if let Some(a) = self.known_attrs.get(ino, &self.co) {
            let ttl = ttl_for(&self.co, self.cache.attr_ttl, ino, None, now);
            reply.attr(&ttl, &file_attr(&a));
            return;
        }
        if self.write_behind.writing(ino) {
            return self.getattr_after_writes(req, ino, fh, reply);
        }
        self.attr_call(req, ino, Request::Getattr { node: ino, fh }, reply);
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn on_setattr(
        &self,
        req: Asked<'_>,
        ino: NodeId,
        (mode, uid, gid): (Option<u32>, Option<u32>, Option<u32>),
        size: Option<u64>,
        (atime, mtime): (Option<TimeOrNow>, Option<TimeOrNow>),
        fh: Option<HandleId>,
        reply: ReplyAttr,
    ) {
        let mut valid = 0;
        if mode.is_some() {
            valid |= setattr_valid::MODE;
        }
        if uid.is_some() {
            valid |= setattr_valid::UID;
        }
        if gid.is_some() {
            valid |= setattr_valid::GID;
        }
        if size.is_some() {
            valid |= setattr_valid::SIZE;
        }
        let set = SetAttr {
            valid,
            mode: mode.unwrap_or(0),
            uid: uid.unwrap_or(0),
            gid: gid.unwrap_or(0),
            size: size.unwrap_or(0),
            atime: set_time(atime),
            mtime: set_time(mtime),
        };
        let mut set = set;
        // KILLPRIV_V2: clearing set-user-ID is the server's job, on a truncation by a
        // caller other than root, and when the kernel sends nothing to set: it took out the
        // ATTR_KILL_SUID/SGID it had (a chown to -1:-1, or a writer about to write).
        let nothing = valid == 0 && atime.is_none() && mtime.is_none();
        if self.killpriv && ((size.is_some() && req.uid() != 0) || nothing) {
            set.valid |= setattr_valid::KILL_SUIDGID;
        }
        if req.origin.restates() {
            // Replayed truncate or chmod, or a fix of the kernel's size or mtime: the host
            // is already as it should be.
            if req.origin.overtaken() {
                reply.error(Errno::EAGAIN);
                return;
            }
            return self.attr_call(
                req,
                ino,
                Request::Getattr {
                    node: ino,
                    fh: None,
                },
                reply,
            );
        };
        let msg = Request::Setattr { node: ino, fh, set };
        if size.is_none() {
            return self.attr_call(req, ino, msg, reply);
        }
        // The data changes: a copy of it goes, and one starts again from a truncation to 0
        // (an O_TRUNC open, in no-open mode).
        self.written.drop_copy(ino);
        let answer = attr_answer(&self.co, &self.known_attrs, self.cache.attr_ttl, ino);
        let emptied = (size == Some(0) && self.keeps_written())
            .then(|| (self.written.clone(), self.co.clone(), self.co.now()));
        self.call(req, msg, reply, move |reply, r| {
            // Before the kernel hears: its next write to the file must find the copy.
            if let (true, Some((written, co, sent))) =
                (matches!(&r, Reply::Attr(a) if a.size == 0), emptied)
            {
                written.start(ino, sent, &co);
            }
            answer(reply, r)
        });
    }

    pub(super) fn on_readlink(&self, req: Asked<'_>, ino: NodeId, reply: ReplyData) {
        self.data_call(req, Request::Readlink { node: ino }, reply);
    }

    pub(super) fn on_statfs(&self, req: Asked<'_>, ino: NodeId, reply: ReplyStatfs) {
        self.call(
            req,
            Request::Statfs { node: ino },
            reply,
            |reply, r| match r {
                Reply::Statfs(s) => {
                    reply.statfs(
                        s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize,
                    );
                    Ok(())
                }
                _ => Err(reply),
            },
        );
    }

    pub(super) fn on_access(
        &self,
        req: Asked<'_>,
        ino: NodeId,
        mask: AccessFlags,
        reply: ReplyEmpty,
    ) {
        self.empty_call(
            req,
            Request::Access {
                node: ino,
                mask: mask.bits() as u32,
            },
            reply,
        );
    }

    /// A GETATTR or SETATTR of `node`. The client keeps the reply to answer the next
    /// GETATTR itself while nothing touches the node (cache/known_attrs.rs).
    fn attr_call(&self, req: Asked<'_>, node: NodeId, msg: Request, reply: ReplyAttr) {
        let answer = attr_answer(&self.co, &self.known_attrs, self.cache.attr_ttl, node);
        self.call(req, msg, reply, answer);
    }

    /// The kernel's GETATTR of `node` while writes answered early are on their way: their
    /// replies bring the attributes after them (WRITE_ATTR), so it is answered from those
    /// once they are in, and asked of the server only if they do not tell.
    fn getattr_after_writes(
        &self,
        req: Asked<'_>,
        node: NodeId,
        fh: Option<HandleId>,
        reply: ReplyAttr,
    ) {
        let (co, known_attrs) = (self.co.clone(), self.known_attrs.clone());
        let (fallback, conn, caller) = (self.cache.attr_ttl, self.conn.clone(), req.caller());
        let then = Box::new(move |_| {
            let now = co.now();
            if let Some(a) = known_attrs.get(node, &co) {
                let ttl = ttl_for(&co, fallback, node, None, now);
                reply.attr(&ttl, &file_attr(&a));
                return;
            }
            let answer = attr_answer(&co, &known_attrs, fallback, node);
            let msg = Request::Getattr { node, fh };
            // From another thread: this may run on the reply reader (Connection::defer).
            conn.defer(caller, msg, Some(Box::new(on_outcome(reply, answer))));
        });
        if let Err(then) = self.write_behind.after_writes(node, then) {
            then(None);
        }
    }
}

/// Answers a GETATTR or SETATTR of `node` from its reply, which the client keeps to answer
/// the next GETATTR itself while nothing touches the node (cache/known_attrs.rs). Counts the
/// request against the node: make it right before the request is sent.
fn attr_answer(
    co: &Arc<Coherence>,
    known_attrs: &Arc<KnownAttrs>,
    fallback: Duration,
    node: NodeId,
) -> impl FnOnce(ReplyAttr, Reply) -> Result<(), ReplyAttr> + Send + 'static {
    let (co, known_attrs, sent) = (co.clone(), known_attrs.clone(), co.now());
    let counted = known_attrs.asking(node);
    move |reply, r| match r {
        Reply::Attr(a) => {
            known_attrs.learn(node, counted, Some(&a), sent, &co);
            reply.attr(&ttl_for(&co, fallback, node, None, sent), &file_attr(&a));
            Ok(())
        }
        _ => Err(reply),
    }
}
