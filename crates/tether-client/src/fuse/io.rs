//! File contents: OPEN (refused with ENOSYS for the kernel's "no open" mode when the server
//! pushes invalidations), READ (answered from this mount's own writes when it can), WRITE
//! (written through, or answered early: write/behind.rs), FLUSH, RELEASE, FSYNC, FALLOCATE,
//! LSEEK, COPY_FILE_RANGE and IOCTL.

use bytes::Bytes;
use fuser::{
    CopyFileRangeFlags, Errno, OpenFlags, ReplyData, ReplyEmpty, ReplyLseek, ReplyOpen, ReplyWrite,
};
use tether_proto::{HandleId, NodeId, Reply, Request, WireErrno};

use super::fs::{Asked, Origin, TetherFs};
use super::reply::errno;
use crate::rpc::ReplyResult;
use crate::write::behind;

impl TetherFs {
    pub(super) fn on_open(&self, req: Asked<'_>, ino: NodeId, flags: OpenFlags, reply: ReplyOpen) {
        self.open_call(
            req,
            Request::Open {
                node: ino,
                flags: flags.0 as u32,
            },
            reply,
        );
    }

    pub(super) fn on_read(
        &self,
        req: Asked<'_>,
        ino: NodeId,
        fh: Option<HandleId>,
        offset: u64,
        size: u32,
        reply: ReplyData,
    ) {
        if self.keeps_written() {
            if let Some(data) = self.written.read(ino, offset, size, &self.co) {
                reply.data(&data);
                return;
            }
        }
        self.pages.reading(ino, offset, size.into());
        let msg = Request::Read {
            node: ino,
            fh,
            offset,
            size,
        };
        self.data_call(req, msg, reply);
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn on_write(
        &self,
        req: Asked<'_>,
        ino: NodeId,
        fh: Option<HandleId>,
        offset: u64,
        data: &[u8],
        flags: OpenFlags,
        reply: ReplyWrite,
    ) {
        if let Some(e) = self.write_behind.take_error(ino) {
            reply.error(errno(e));
            return;
        }
        // The kernel keeps the pages of pushed-invalidation mounts across opens; with the
        // writeback cache it reads a page before writing part of it.
        if self.co.enabled() && self.co.fixer().is_none() {
            self.pages.written(ino, offset, data.len() as u64);
        }
        let msg = Request::Write {
            node: ino,
            fh,
            offset,
            data: Bytes::copy_from_slice(data),
        };
        // FUSE_WRITE_KILL_SUIDGID needs nothing more: the server clears set-user-ID after
        // every write by a caller other than root.
        // Written through only: with the writeback cache the kernel's own write-back and the
        // fixer expect each WRITE done when answered.
        // By node only (fh 0): a server handle may be released, and not restored after a
        // reconnect, before the write is sent again.
        // The server must execute small writes in order (checked per write: a reconnect may
        // reach a server that does not).
        let early = self.write_behind.on()
            && self.co.fixer().is_none()
            && fh.is_none()
            && self
                .conn
                .grants(tether_proto::handshake::features::ORDERED_WRITES)
            && req.origin.replay().is_none()
            && behind::may_answer_early(data.len(), flags.0)
            && self.write_behind.begin(ino, data.len());
        if early {
            self.write_behind(req, ino, msg, data.len(), reply);
        } else {
            self.written_call(req, msg, reply);
        }
    }

    pub(super) fn on_release(
        &self,
        req: Asked<'_>,
        ino: NodeId,
        fh: Option<HandleId>,
        reply: ReplyEmpty,
    ) {
        let Some(handle) = fh else {
            // No server handle (files the kernel does I/O on by node, see `create`): the
            // server has nothing to release.
            reply.ok();
            return;
        };
        self.known.released(handle);
        self.empty_call(req, Request::Release { node: ino, fh }, reply);
    }

    pub(super) fn on_fsync(
        &self,
        req: Asked<'_>,
        ino: NodeId,
        fh: Option<HandleId>,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        if matches!(req.origin, Origin::Fixer { .. }) {
            // invalidate/fixer.rs: the fixer only wants the kernel's dirty data sent, not the
            // host's disk flushed.
            reply.ok();
            return;
        }
        let msg = Request::Fsync {
            node: ino,
            fh,
            datasync,
        };
        // The replies to earlier writes come first on the stream: an error of one answered
        // early is known by the time this one is answered, and it is the one to report
        // (a file whose creation failed then fails the fsync itself, with ESTALE).
        let wb = self.write_behind.clone();
        self.send(req, &msg, move |res: ReplyResult| {
            match (wb.take_error(ino), res) {
                (Some(e), _) | (None, Err(e)) => reply.error(errno(e)),
                (None, Ok(Reply::Empty)) => reply.ok(),
                (None, Ok(_)) => reply.error(Errno::EIO),
            }
        });
    }

    pub(super) fn on_fallocate(
        &self,
        req: Asked<'_>,
        ino: NodeId,
        fh: Option<HandleId>,
        (offset, length): (u64, u64),
        mode: i32,
        reply: ReplyEmpty,
    ) {
        self.written.drop_copy(ino);
        let msg = Request::Fallocate {
            node: ino,
            fh,
            offset,
            length,
            mode: mode as u32,
        };
        self.empty_call(req, msg, reply);
    }

    pub(super) fn on_lseek(
        &self,
        req: Asked<'_>,
        ino: NodeId,
        fh: Option<HandleId>,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        let msg = Request::Lseek {
            node: ino,
            fh,
            offset,
            whence: whence as u32,
        };
        let answer = |reply: ReplyLseek, r: ReplyResult| match r {
            Ok(Reply::Lseek { offset }) => reply.offset(offset as i64),
            Ok(_) => reply.error(Errno::EIO),
            Err(e) => reply.error(errno(e)),
        };
        let finds_data = matches!(whence, libc::SEEK_DATA | libc::SEEK_HOLE);
        match self.co.fixer() {
            // The server knows where the data is once the kernel's cached writes are there
            // (the kernel does not write them back for an lseek). Writing them back needs
            // FUSE workers, so not on this one.
            Some(fixer) if finds_data => {
                let (fixer, conn, who) = (fixer.clone(), self.conn.clone(), req.caller());
                let spawned = std::thread::Builder::new()
                    .name("tether-seek".into())
                    .spawn(move || {
                        fixer.write_back(ino);
                        conn.call(who, &msg, move |r| answer(reply, r));
                    });
                if let Err(e) = spawned {
                    tracing::warn!("no thread for an lseek: {e}");
                }
            }
            _ => self.send(req, &msg, move |r| answer(reply, r)),
        }
    }

    pub(super) fn on_copy_file_range(
        &self,
        req: Asked<'_>,
        (ino_in, fh_in, offset_in): (NodeId, Option<HandleId>, u64),
        (ino_out, fh_out, offset_out): (NodeId, Option<HandleId>, u64),
        len: u64,
        flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        let msg = Request::CopyFileRange {
            node_in: ino_in,
            fh_in,
            offset_in,
            node_out: ino_out,
            fh_out,
            offset_out,
            len,
            flags: flags.bits() as u32,
        };
        self.written_call(req, msg, reply);
    }

    /// close(): with writes answered early, FLUSH is where the guest's close() waits until
    /// the host has every write to the file sent before it (and its creation, when that was
    /// answered early), and where an error of one of them is reported: the contract NFS
    /// users rely on (write/behind.rs). Answered here, without a request to the server: the
    /// replies to those writes are what it waits for.
    pub(super) fn on_flush(&self, ino: NodeId, reply: ReplyEmpty) {
        if !self.write_behind.on() {
            // Every write waited for the server, or the kernel's writeback cache writes a
            // file's dirty pages back itself at close() before it would send FLUSH (and
            // write errors come back to those writes): ENOSYS stops the kernel sending FLUSH
            // on every close().
            reply.error(Errno::ENOSYS);
            return;
        }
        self.write_behind
            .when_written(ino, move |error| match error {
                Some(e) => reply.error(errno(e)),
                None => reply.ok(),
            });
    }

    /// No ioctl reaches the host: answered here as a local file system answers one it does
    /// not know (ENOTTY). The kernel asks for every ioctl of a file on the mount, and
    /// Python asks `isatty()` (TCGETS) of every file it opens: fuser's default answer (ENOSYS,
    /// which the caller saw) also logged a warning each time.
    pub(super) fn on_ioctl(&self, reply: fuser::ReplyIoctl) {
        reply.error(Errno::ENOTTY);
    }

    /// For write and copy_file_range. A WRITE's reply may carry the file's attributes
    /// after it (feature WRITE_ATTR), which the client keeps to answer the kernel's next
    /// GETATTR of the file itself (cache/known_attrs.rs).
    fn written_call(&self, req: Asked<'_>, msg: Request, reply: ReplyWrite) {
        let (written, kept) = match &msg {
            Request::Write {
                node, offset, data, ..
            } => {
                let kept = (self.keeps_written().then(|| self.written.writing(*node)))
                    .flatten()
                    .map(|w| (w, *offset, data.clone()));
                (Some(*node), kept)
            }
            Request::CopyFileRange { node_out, .. } => {
                self.written.drop_copy(*node_out);
                (None, None)
            }
            _ => (None, None),
        };
        let (co, sent, known_attrs) = (self.co.clone(), self.co.now(), self.known_attrs.clone());
        let counted = written.map(|node| (node, known_attrs.asking(node)));
        self.call(req, msg, reply, move |reply, r| match r {
            Reply::Written { size, attr } => {
                if let Some((node, counted)) = counted {
                    known_attrs.learn(node, counted, attr.as_deref(), sent, &co);
                }
                if let Some((writing, offset, data)) = kept {
                    let whole = size == data.len() as u64;
                    writing.finished(offset, &data, whole, &co);
                }
                reply.written(size.min(u32::MAX as u64) as u32);
                Ok(())
            }
            _ => Err(reply),
        });
    }

    /// A WRITE of `len` bytes to `node` counted in flight by `WriteBehind::begin`: the
    /// kernel hears "written" once it is on the wire; the server's reply is kept as for
    /// any write, and a failure goes to the file's next write or fsync (write/behind.rs).
    fn write_behind(
        &self,
        req: Asked<'_>,
        node: NodeId,
        msg: Request,
        len: usize,
        reply: ReplyWrite,
    ) {
        let kept = match &msg {
            Request::Write { offset, data, .. } if self.keeps_written() => {
                let copy = self.written.writing(node);
                copy.map(|w| (w, *offset, data.clone(), self.co.clone()))
            }
            _ => None,
        };
        let (co, sent, known_attrs) = (self.co.clone(), self.co.now(), self.known_attrs.clone());
        let counted = known_attrs.asking(node);
        let wb = self.write_behind.clone();
        // The copy takes the write as the kernel does, when it hears "written": one the
        // server then fails is revoked (`co.revoke`), which ends the copy too.
        let done = move |res: ReplyResult| {
            let outcome = match res {
                Ok(Reply::Written { size, attr }) => {
                    known_attrs.learn(node, counted, attr.as_deref(), sent, &co);
                    Ok(size)
                }
                Ok(_) => Err(WireErrno::EIO),
                Err(e) => Err(e),
            };
            if wb.finish(node, len, outcome) {
                co.revoke(node);
            }
        };
        self.send_answering_first(req, &msg, done, || {
            if let Some((writing, offset, data, co)) = kept {
                writing.finished(offset, &data, true, &co);
            }
            reply.written(len as u32)
        });
    }
}
