//! The FUSE adapter: turns kernel requests into Tether requests and replies to the kernel
//! from the RPC reader thread when the server answers. No handler blocks on the network.
//!
//! Kernel node ids are the server's node ids (the host inode numbers), so st_ino in the
//! guest matches the host; `impl Filesystem` turns the kernel's numbers into node and handle
//! ids (kernel_ids.rs) before any handler sees them.
//!
//! This file holds the file system's state ([`TetherFs`]) and the door every kernel request
//! comes in by: `impl Filesystem`, which tells who caused the request (`Origin`, once, in
//! `TetherFs::asked`) and hands it to the area that owns it: fuse/entry.rs (names),
//! attr.rs, io.rs (file contents), dir.rs, xattr.rs, lock.rs, init.rs (start and end); what
//! they share is in fuse/answer.rs.

use std::ffi::OsStr;
use std::sync::atomic::AtomicU32;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fuser::{
    AccessFlags, CopyFileRangeFlags, FileHandle, Filesystem, INodeNo, KernelConfig, LockOwner,
    OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus,
    ReplyEmpty, ReplyEntry, ReplyLock, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr,
    Request as FuseRequest, TimeOrNow, WriteFlags,
};
use tether_proto::Caller;

use crate::kernel_ids::{handle_of, node_of};

use crate::cache::coherence::Coherence;
use crate::cache::known_attrs::KnownAttrs;
use crate::cache::partial_pages::PartialPages;
use crate::cache::prefetch::Prefetch;
use crate::cache::written_files::WrittenFiles;
use crate::fuse::locks::Locks;
use crate::invalidate::fixer::AttrFixer;
use crate::invalidate::host_events::Replayer;
use crate::known::Known;
use crate::rpc::Connection;
use crate::write::behind::WriteBehind;
use crate::write::mode::WriteMode;
use crate::write::spares::Spares;

/// What a READDIRPLUS asks the server for at most: glibc's readdir buffer (the kernel's,
/// since Linux 6.x, is the caller's getdents size).
const LISTING_BYTES: u32 = 32 * 1024;

/// How long the kernel may trust what it caches. Until the server pushes invalidations
/// (the coherence work), these must be short for the guest to see host changes.
#[derive(Debug, Clone, Copy)]
pub struct CachePolicy {
    pub attr_ttl: Duration,
    pub entry_ttl: Duration,
    /// How writes are sent (write/mode.rs).
    pub writes: WriteMode,
}

impl Default for CachePolicy {
    fn default() -> Self {
        CachePolicy {
            attr_ttl: Duration::from_secs(1),
            entry_ttl: Duration::from_secs(1),
            writes: WriteMode::default(),
        }
    }
}

pub struct TetherFs {
    pub(super) conn: Arc<Connection>,
    /// Timeouts for what the server does not watch.
    pub(super) cache: CachePolicy,
    pub(super) co: Arc<Coherence>,
    /// Replays host changes as inotify events; its thread's requests change nothing.
    replayer: Option<Arc<Replayer>>,
    /// The nodes and handles the kernel holds, for a reconnect to restore.
    pub(super) known: Arc<Known>,
    /// Keeps the kernel's sizes and mtimes coherent if the writeback cache is granted.
    pub(super) fixer: Option<Arc<AttrFixer>>,
    /// Waits for blocked locks and drops locks at close (fuse/locks.rs); without it, locks stay
    /// local to this guest's kernel.
    pub(super) locks: Option<Locks>,
    /// Attributes from CREATE, GETATTR, SETATTR and WRITE replies (cache/known_attrs.rs).
    pub(super) known_attrs: Arc<KnownAttrs>,
    /// Lists a cold walk's directories through the mount, into the kernel's dentry cache
    /// (cache/prefetch.rs).
    pub(super) prefetch: Arc<Prefetch>,
    /// How much of a listing a READDIRPLUS asks the server for. fuser does not tell us the
    /// kernel's buffer size, which is the caller's getdents size (glibc's readdir: 32 KiB)
    /// on recent kernels and one page on older ones; entries that do not fit are given
    /// back, so after the first reply that overflows, the mount asks for what fitted.
    pub(super) listing_bytes: Arc<AtomicU32>,
    /// Pages partly filled by writes, dropped when the kernel reads one (cache/partial_pages.rs).
    pub(super) pages: Arc<PartialPages>,
    /// FUSE_HANDLE_KILLPRIV_V2 was granted: clearing set-user-ID and set-group-ID on write
    /// and truncation is the server's job, not the kernel's.
    pub(super) killpriv: bool,
    /// Small written-through writes answered before the server's reply (write/behind.rs).
    pub(super) write_behind: Arc<WriteBehind>,
    /// Files made ahead, for creations answered before the server named them (write/spares.rs).
    pub(super) spares: Arc<Spares>,
    /// What this mount wrote to small files, to answer READs of them (cache/written_files.rs).
    pub(super) written: Arc<WrittenFiles>,
}

impl TetherFs {
    pub fn new(
        conn: Arc<Connection>,
        cache: CachePolicy,
        co: Arc<Coherence>,
        replayer: Option<Arc<Replayer>>,
        fixer: Option<Arc<AttrFixer>>,
        locks: Option<Locks>,
        (write_behind, spares): (Arc<WriteBehind>, Arc<Spares>),
    ) -> Self {
        let prefetch = Prefetch::new(co.clone());
        TetherFs {
            conn,
            cache,
            co,
            known_attrs: Arc::default(),
            prefetch,
            listing_bytes: Arc::new(AtomicU32::new(LISTING_BYTES)),
            replayer,
            known: Arc::default(),
            fixer,
            locks,
            pages: Arc::default(),
            killpriv: false,
            write_behind,
            spares,
            written: Arc::default(),
        }
    }

    /// Whether what this mount writes to small files is kept to answer READs
    /// (cache/written_files.rs): the server pushes invalidations, and the kernel is told of each
    /// write by the client (not with the writeback cache, where it writes back by itself).
    pub(super) fn keeps_written(&self) -> bool {
        self.co.enabled() && self.co.fixer().is_none()
    }

    pub fn known(&self) -> Arc<Known> {
        self.known.clone()
    }

    pub fn prefetch(&self) -> Arc<Prefetch> {
        self.prefetch.clone()
    }

    pub fn partial_pages(&self) -> Arc<PartialPages> {
        self.pages.clone()
    }

    /// `req` as the handlers see it, with who caused it: told once, where the request comes
    /// in.
    fn asked<'a>(&'a self, req: &'a FuseRequest) -> Asked<'a> {
        Asked {
            req,
            origin: self.origin(req.pid()),
        }
    }

    /// Who caused a request, from the thread id FUSE reports as its pid. The replay thread is
    /// told first; a fix step (restating) runs on a fixing thread, as `AttrFixer::apply` only
    /// runs on threads bound to the fixer.
    fn origin(&self, pid: u32) -> Origin<'_> {
        if let Some(r) = self.replayer.as_ref().filter(|r| r.is_replay(pid)) {
            return Origin::Replay(r);
        }
        match self.co.fixer() {
            Some(fixer) if fixer.is_fixer(pid) => Origin::Fixer {
                fixer,
                pid,
                restating: fixer.is_restating(pid),
            },
            _ => Origin::Guest,
        }
    }
}

/// A kernel request as the handlers see it ([`TetherFs::asked`]): fuser's request, and who
/// caused it.
#[derive(Clone, Copy)]
pub(super) struct Asked<'a> {
    req: &'a FuseRequest,
    pub(super) origin: Origin<'a>,
}

impl Asked<'_> {
    /// The caller the server is told of.
    pub(super) fn caller(self) -> Caller {
        Caller {
            uid: self.req.uid(),
            gid: self.req.gid(),
            pid: self.req.pid(),
        }
    }

    pub(super) fn uid(self) -> u32 {
        self.req.uid()
    }

    pub(super) fn gid(self) -> u32 {
        self.req.gid()
    }

    pub(super) fn unique(self) -> fuser::RequestId {
        self.req.unique()
    }
}

/// Who caused a kernel request ([`TetherFs::origin`]): the mount's own helper threads act
/// through it too, and their requests are answered differently. (Not the protocol's
/// [`Caller`], the uid, gid and pid a request is made with on the host.)
#[derive(Clone, Copy)]
pub(super) enum Origin<'a> {
    /// Anyone else: an application in the guest.
    Guest,
    /// The replay thread (invalidate/host_events.rs), imitating through the mount a change
    /// the host already made, for the guest's inotify watches: it changes nothing.
    Replay(&'a Arc<Replayer>),
    /// A thread of the writeback cache's fixer (invalidate/fixer.rs), making the kernel's
    /// sizes and mtimes the host's. `restating`: inside a fix step's truncate or utimens,
    /// whose SETATTR re-states the host's attributes (its other SETATTRs, the kernel writing
    /// back a dirty mtime, are real).
    Fixer {
        fixer: &'a Arc<AttrFixer>,
        pid: u32,
        restating: bool,
    },
}

impl<'a> Origin<'a> {
    /// The replayer, for a request of its thread.
    pub(super) fn replay(self) -> Option<&'a Arc<Replayer>> {
        match self {
            Origin::Replay(r) => Some(r),
            _ => None,
        }
    }

    /// The request re-states the host's attributes to the kernel (a replay, or a fix step):
    /// it must be answered with them and change nothing on the host.
    pub(super) fn restates(self) -> bool {
        matches!(
            self,
            Origin::Replay(_)
                | Origin::Fixer {
                    restating: true,
                    ..
                }
        )
    }

    /// A fix step's SETATTR that a guest write has overtaken since the step was decided
    /// (`AttrFixer::still_as_decided`, which reads the kernel's attributes: asked only here).
    pub(super) fn overtaken(self) -> bool {
        match self {
            Origin::Fixer {
                fixer,
                pid,
                restating: true,
            } => !fixer.still_as_decided(pid),
            _ => false,
        }
    }
}

/// The door: each kernel request goes to the area that owns it.
impl Filesystem for TetherFs {
    // Start and end of the session (fuse/init.rs).

    fn init(&mut self, _req: &FuseRequest, config: &mut KernelConfig) -> std::io::Result<()> {
        self.on_init(config)
    }

    fn destroy(&mut self) {
        self.on_destroy()
    }

    // Names (fuse/entry.rs).

    fn lookup(&self, req: &FuseRequest, parent: INodeNo, n: &OsStr, reply: ReplyEntry) {
        self.on_lookup(self.asked(req), node_of(parent), n, reply)
    }

    fn forget(&self, req: &FuseRequest, ino: INodeNo, nlookup: u64) {
        self.on_forget(self.asked(req), node_of(ino), nlookup)
    }

    fn mknod(
        &self,
        req: &FuseRequest,
        parent: INodeNo,
        n: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        self.on_mknod(
            self.asked(req),
            (node_of(parent), n),
            (mode, umask),
            rdev,
            reply,
        )
    }

    fn mkdir(
        &self,
        req: &FuseRequest,
        parent: INodeNo,
        n: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        self.on_mkdir(self.asked(req), (node_of(parent), n), (mode, umask), reply)
    }

    fn unlink(&self, req: &FuseRequest, parent: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        self.on_unlink(self.asked(req), node_of(parent), n, reply)
    }

    fn rmdir(&self, req: &FuseRequest, parent: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        self.on_rmdir(self.asked(req), node_of(parent), n, reply)
    }

    fn symlink(
        &self,
        req: &FuseRequest,
        parent: INodeNo,
        link: &OsStr,
        target: &std::path::Path,
        reply: ReplyEntry,
    ) {
        self.on_symlink(self.asked(req), node_of(parent), link, target, reply)
    }

    fn rename(
        &self,
        req: &FuseRequest,
        parent: INodeNo,
        n: &OsStr,
        new_parent: INodeNo,
        new_name: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        self.on_rename(
            self.asked(req),
            (node_of(parent), n),
            (node_of(new_parent), new_name),
            flags,
            reply,
        )
    }

    fn link(
        &self,
        req: &FuseRequest,
        ino: INodeNo,
        new_parent: INodeNo,
        new_name: &OsStr,
        reply: ReplyEntry,
    ) {
        self.on_link(
            self.asked(req),
            node_of(ino),
            node_of(new_parent),
            new_name,
            reply,
        )
    }

    fn create(
        &self,
        req: &FuseRequest,
        parent: INodeNo,
        n: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        self.on_create(
            self.asked(req),
            (node_of(parent), n),
            (mode, umask),
            flags,
            reply,
        )
    }

    // Attributes (fuse/attr.rs).

    fn getattr(&self, req: &FuseRequest, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        self.on_getattr(self.asked(req), node_of(ino), fh.and_then(handle_of), reply)
    }

    fn setattr(
        &self,
        req: &FuseRequest,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let (owner, times) = ((mode, uid, gid), (atime, mtime));
        let fh = fh.and_then(handle_of);
        self.on_setattr(self.asked(req), node_of(ino), owner, size, times, fh, reply)
    }

    fn access(&self, req: &FuseRequest, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        self.on_access(self.asked(req), node_of(ino), mask, reply)
    }

    fn statfs(&self, req: &FuseRequest, ino: INodeNo, reply: ReplyStatfs) {
        self.on_statfs(self.asked(req), node_of(ino), reply)
    }

    fn readlink(&self, req: &FuseRequest, ino: INodeNo, reply: ReplyData) {
        self.on_readlink(self.asked(req), node_of(ino), reply)
    }

    // File contents (fuse/io.rs).

    fn open(&self, req: &FuseRequest, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.on_open(self.asked(req), node_of(ino), flags, reply)
    }

    fn read(
        &self,
        req: &FuseRequest,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.on_read(
            self.asked(req),
            node_of(ino),
            handle_of(fh),
            offset,
            size,
            reply,
        )
    }

    fn write(
        &self,
        req: &FuseRequest,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        self.on_write(
            self.asked(req),
            node_of(ino),
            handle_of(fh),
            offset,
            data,
            flags,
            reply,
        )
    }

    fn flush(
        &self,
        _req: &FuseRequest,
        ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.on_flush(node_of(ino), reply)
    }

    fn release(
        &self,
        req: &FuseRequest,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.on_release(self.asked(req), node_of(ino), handle_of(fh), reply)
    }

    fn fsync(
        &self,
        req: &FuseRequest,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.on_fsync(
            self.asked(req),
            node_of(ino),
            handle_of(fh),
            datasync,
            reply,
        )
    }

    fn fallocate(
        &self,
        req: &FuseRequest,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        self.on_fallocate(
            self.asked(req),
            node_of(ino),
            handle_of(fh),
            (offset, length),
            mode,
            reply,
        )
    }

    fn lseek(
        &self,
        req: &FuseRequest,
        ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        self.on_lseek(
            self.asked(req),
            node_of(ino),
            handle_of(fh),
            offset,
            whence,
            reply,
        )
    }

    fn copy_file_range(
        &self,
        req: &FuseRequest,
        ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        let from = (node_of(ino_in), handle_of(fh_in), offset_in);
        let to = (node_of(ino_out), handle_of(fh_out), offset_out);
        self.on_copy_file_range(self.asked(req), from, to, len, flags, reply)
    }

    fn ioctl(
        &self,
        _req: &FuseRequest,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        self.on_ioctl(reply)
    }

    // Directories (fuse/dir.rs).

    fn opendir(&self, req: &FuseRequest, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.on_opendir(self.asked(req), node_of(ino), flags, reply)
    }

    fn readdir(
        &self,
        req: &FuseRequest,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectory,
    ) {
        self.on_readdir(self.asked(req), node_of(ino), handle_of(fh), offset, reply)
    }

    fn readdirplus(
        &self,
        req: &FuseRequest,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectoryPlus,
    ) {
        self.on_readdirplus(self.asked(req), node_of(ino), handle_of(fh), offset, reply)
    }

    fn releasedir(
        &self,
        req: &FuseRequest,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.on_releasedir(self.asked(req), node_of(ino), handle_of(fh), reply)
    }

    fn fsyncdir(
        &self,
        req: &FuseRequest,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.on_fsyncdir(
            self.asked(req),
            node_of(ino),
            handle_of(fh),
            datasync,
            reply,
        )
    }

    // Extended attributes (fuse/xattr.rs).

    fn setxattr(
        &self,
        req: &FuseRequest,
        ino: INodeNo,
        n: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        self.on_setxattr(self.asked(req), node_of(ino), n, value, flags, reply)
    }

    fn getxattr(&self, req: &FuseRequest, ino: INodeNo, n: &OsStr, size: u32, reply: ReplyXattr) {
        self.on_getxattr(self.asked(req), node_of(ino), n, size, reply)
    }

    fn listxattr(&self, req: &FuseRequest, ino: INodeNo, size: u32, reply: ReplyXattr) {
        self.on_listxattr(self.asked(req), node_of(ino), size, reply)
    }

    fn removexattr(&self, req: &FuseRequest, ino: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        self.on_removexattr(self.asked(req), node_of(ino), n, reply)
    }

    // Locks (fuse/lock.rs; the waiting is fuse/locks.rs's).

    fn getlk(
        &self,
        req: &FuseRequest,
        ino: INodeNo,
        _fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        _pid: u32,
        reply: ReplyLock,
    ) {
        self.on_getlk(
            self.asked(req),
            node_of(ino),
            (lock_owner, start, end, typ),
            reply,
        )
    }

    fn setlk(
        &self,
        req: &FuseRequest,
        ino: INodeNo,
        _fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        sleep: bool,
        flock: bool,
        reply: ReplyEmpty,
    ) {
        self.on_setlk(
            self.asked(req),
            node_of(ino),
            (lock_owner, start, end, typ),
            (pid, sleep, flock),
            reply,
        )
    }

    fn interrupt(&self, _req: &FuseRequest, unique: fuser::RequestId) {
        self.on_interrupt(unique)
    }
}
