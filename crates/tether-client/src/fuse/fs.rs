//! The FUSE adapter: turns kernel requests into Tether requests and replies to the kernel
//! from the RPC reader thread when the server answers. No handler blocks on the network.
//!
//! Kernel node ids are the server's node ids (the host inode numbers), so st_ino in the
//! guest matches the host.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use fuser::{
    AccessFlags, CopyFileRangeFlags, Errno, FileHandle, Filesystem, FopenFlags, Generation,
    INodeNo, InitFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLock, ReplyLseek,
    ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request as FuseRequest, TimeOrNow, WriteFlags,
};
use tether_proto::{
    fuse_dirent_size, lock_type, setattr_valid, Attr, Caller, Entry, LockSpec, NodeId, Reply,
    Request, SetAttr, Timespec, WireErrno,
};

use super::reply::{errno, file_attr, kind_of_dtype, set_time};
use crate::cache::coherence::{Coherence, WATCHED_TTL};
use crate::cache::known::{Binding, Known, OpenHandle};
use crate::cache::known_attrs::KnownAttrs;
use crate::cache::partial_pages::PartialPages;
use crate::cache::prefetch::Prefetch;
use crate::cache::written_files::WrittenFiles;
use crate::fuse::locks::{LockRequest, Locks};
use crate::invalidate::fixer::AttrFixer;
use crate::invalidate::host_events::{ReplayLookup, Replayer, GHOST_BASE};
use crate::rpc::{Connection, ReplyResult};
use crate::write::behind::{self, WriteBehind};
use crate::write::mode::WriteMode;
use crate::write::spares::{self, PoolKey, Spares};

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
            writes: WriteMode::Through,
        }
    }
}

pub struct TetherFs {
    conn: Arc<Connection>,
    /// Timeouts for what the server does not watch.
    cache: CachePolicy,
    co: Arc<Coherence>,
    /// Replays host changes as inotify events; its thread's requests change nothing.
    replayer: Option<Arc<Replayer>>,
    /// The nodes and handles the kernel holds, for a reconnect to restore.
    known: Arc<Known>,
    /// Keeps the kernel's sizes and mtimes coherent if the writeback cache is granted.
    fixer: Option<Arc<AttrFixer>>,
    /// Waits for blocked locks and drops locks at close (fuse/locks.rs); without it, locks stay
    /// local to this guest's kernel.
    locks: Option<Locks>,
    /// Attributes from CREATE, GETATTR, SETATTR and WRITE replies (cache/known_attrs.rs).
    known_attrs: Arc<KnownAttrs>,
    /// Lists a cold walk's directories through the mount, into the kernel's dentry cache
    /// (cache/prefetch.rs).
    prefetch: Arc<Prefetch>,
    /// How much of a listing a READDIRPLUS asks the server for. fuser does not tell us the
    /// kernel's buffer size, which is the caller's getdents size (glibc's readdir: 32 KiB)
    /// on recent kernels and one page on older ones; entries that do not fit are given
    /// back, so after the first reply that overflows, the mount asks for what fitted.
    listing_bytes: Arc<AtomicU32>,
    /// Pages partly filled by writes, dropped when the kernel reads one (cache/partial_pages.rs).
    pages: Arc<PartialPages>,
    /// FUSE_HANDLE_KILLPRIV_V2 was granted: clearing set-user-ID and set-group-ID on write
    /// and truncation is the server's job, not the kernel's.
    killpriv: bool,
    /// Small written-through writes answered before the server's reply (write/behind.rs).
    write_behind: Arc<WriteBehind>,
    /// Files made ahead, for creations answered before the server named them (write/spares.rs).
    spares: Arc<Spares>,
    /// What this mount wrote to small files, to answer READs of them (cache/written_files.rs).
    written: Arc<WrittenFiles>,
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
    fn keeps_written(&self) -> bool {
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
struct Asked<'a> {
    req: &'a FuseRequest,
    origin: Origin<'a>,
}

impl Asked<'_> {
    /// The caller the server is told of.
    fn caller(self) -> Caller {
        Caller {
            uid: self.req.uid(),
            gid: self.req.gid(),
            pid: self.req.pid(),
        }
    }

    fn uid(self) -> u32 {
        self.req.uid()
    }

    fn gid(self) -> u32 {
        self.req.gid()
    }

    fn unique(self) -> fuser::RequestId {
        self.req.unique()
    }
}

/// Who caused a kernel request ([`TetherFs::origin`]): the mount's own helper threads act
/// through it too, and their requests are answered differently. (Not the protocol's
/// [`Caller`], the uid, gid and pid a request is made with on the host.)
#[derive(Clone, Copy)]
enum Origin<'a> {
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
    fn replay(self) -> Option<&'a Arc<Replayer>> {
        match self {
            Origin::Replay(r) => Some(r),
            _ => None,
        }
    }

    /// The request re-states the host's attributes to the kernel (a replay, or a fix step):
    /// it must be answered with them and change nothing on the host.
    fn restates(self) -> bool {
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
    fn overtaken(self) -> bool {
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

/// What [`TetherFs::call`] does with a request's outcome: `ok` answers the kernel; an error
/// is passed on, and a reply of the wrong shape (a server bug) becomes EIO.
fn on_outcome<R: KernelReply + Send + 'static>(
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

/// How long the kernel may keep a reply's view of `node` (found in `parent`), for a request
/// sent at push sequence `sent`: until revoked if watched, not at all if an invalidation
/// may have overtaken the reply, else the fallback timeout.
fn ttl_for(
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

/// Gives the kernel entry `e` in `parent`, from a reply to a request sent at push sequence
/// `sent` (cached as `ttl_for` allows). `Coherence::entry_given` must have seen it.
fn give_entry(
    co: &Coherence,
    fallback: Duration,
    parent: NodeId,
    e: &Entry,
    sent: u64,
    reply: ReplyEntry,
) {
    let ttl = ttl_for(co, fallback, e.node, Some(parent), sent);
    let generation = Generation(co.generation(e.node, e.generation));
    reply.entry_with_ttls(&ttl, &ttl, &file_attr(&e.attr), generation);
}

/// Tells the kernel the name does not exist, cached until revoked (node id 0), as for a
/// watched directory's ENOENT.
fn give_missing(reply: ReplyEntry) {
    let attr = file_attr(&Attr::default());
    reply.entry_with_ttls(&WATCHED_TTL, &WATCHED_TTL, &attr, Generation(0));
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

fn name(n: &OsStr) -> Bytes {
    Bytes::copy_from_slice(n.as_bytes())
}

/// Every fuser reply type can carry an error.
trait KernelReply: Send + 'static {
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
    fn call<R: KernelReply>(
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
    fn send(&self, req: Asked<'_>, msg: &Request, done: impl FnOnce(ReplyResult) + Send + 'static) {
        self.send_answering_first(req, msg, done, || {});
    }

    /// [`TetherFs::send`], answering the kernel with `first` before the request goes out
    /// ([`Connection::call_answering_first`]): for requests answered early.
    fn send_answering_first(
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

    /// For lookup, mknod, mkdir, symlink, link: an entry in `parent`.
    fn entry_call(&self, req: Asked<'_>, parent: NodeId, msg: Request, reply: ReplyEntry) {
        if let Some(r) = req.origin.replay() {
            return self.replay_entry(req, r, parent, msg, reply);
        }
        let negative_ok = matches!(msg, Request::Lookup { .. });
        self.send_entry(req, parent, msg, reply, negative_ok);
    }

    fn send_entry(
        &self,
        req: Asked<'_>,
        parent: NodeId,
        msg: Request,
        reply: ReplyEntry,
        negative_ok: bool,
    ) {
        let (co, fallback, sent) = (self.co.clone(), self.cache, self.co.now());
        let (known, entry_name) = (self.known.clone(), entry_name(&msg));
        let made = !matches!(msg, Request::Lookup { .. });
        let mkdir = matches!(msg, Request::Mkdir { .. });
        // A found node's attributes answer the GETATTR after the kernel forgets its atime.
        let looked_up = (!made).then(|| (self.known_attrs.clone(), self.known_attrs.looking()));
        self.send(req, &msg, move |res: ReplyResult| match res {
            Ok(Reply::Entry(e)) => {
                if let Some((known_attrs, since)) = &looked_up {
                    known_attrs.learn_entry(e.node, *since, &e.attr, sent, &co);
                }
                // First: whether it is watched decides what follows.
                let record = || {
                    co.entry_given(&e);
                    true
                };
                if let Some(name) = entry_name {
                    known.given(parent, &name, e.node, record);
                    if made {
                        co.name_made(parent, &name);
                    }
                } else {
                    record();
                }
                if mkdir {
                    co.dir_made(&e, sent);
                }
                give_entry(&co, fallback.attr_ttl, parent, &e, sent, reply);
            }
            Ok(_) => reply.error(Errno::EIO),
            // A missing name in a watched directory is cached too (node id 0): compilers
            // and git probe many names that do not exist; the host's create revokes it.
            Err(WireErrno::ENOENT) if negative_ok && co.cacheable(parent, sent) => {
                give_missing(reply);
            }
            Err(e) => reply.error(errno(e)),
        });
    }

    /// An entry request of the replaying thread (invalidate/host_events.rs). What it is given about
    /// the names it changes may not outlive the replay, so those answers have a TTL of 0
    /// (and the replay invalidates the names afterwards): a lookup of an armed name finds
    /// the state before the host's change, a creation the node the host created. Any other
    /// lookup (a directory on the way, the file of a content replay) is an ordinary one:
    /// the host's entry as it is now, cached as for anyone (a TTL of 0 there made every
    /// later replay ask again for each directory on its path). Other entry operations
    /// change nothing.
    fn replay_entry(
        &self,
        req: Asked<'_>,
        r: &Arc<Replayer>,
        parent: NodeId,
        msg: Request,
        reply: ReplyEntry,
    ) {
        match msg {
            Request::Lookup { name, .. } => match r.lookup(parent, &name) {
                Some(l) => self.replay_lookup(req, r, l, reply),
                None => {
                    let msg = Request::Lookup { parent, name };
                    self.send_entry(req, parent, msg, reply, true)
                }
            },
            // The replay of a creation: answer with what the host created.
            msg => match created_name(&msg).map(|name| (r.lookup(parent, &name), name)) {
                Some((Some(ReplayLookup::Created { node, file_type }), name)) => {
                    self.replay_host_entry(req, r, parent, name, (node, file_type), reply)
                }
                _ => reply.error(Errno::EPERM),
            },
        }
    }

    /// A lookup the replaying thread needs answered as the state before the host change.
    fn replay_lookup(&self, req: Asked<'_>, r: &Arc<Replayer>, l: ReplayLookup, reply: ReplyEntry) {
        match l {
            l if l.absent() => reply.error(Errno::ENOENT),
            ReplayLookup::Removed { file_type } => replay_ghost(r, file_type, reply),
            ReplayLookup::Renamed {
                dir,
                name,
                node,
                file_type,
            } => self.replay_host_entry(req, r, dir, name, (node, file_type), reply),
            _ => unreachable!("absent() covers the other lookups"),
        }
    }

    /// What the host has now under `name` in `dir`, for the replaying thread only (TTL 0),
    /// if it is `node`: anything else, or nothing, or an unknown node (0: the name was gone
    /// already when the server read the event), is answered with a ghost of `file_type`,
    /// so that a replay never gives the name another file, not even for the moment of the
    /// replay.
    fn replay_host_entry(
        &self,
        req: Asked<'_>,
        r: &Arc<Replayer>,
        dir: NodeId,
        name: Bytes,
        (node, file_type): (NodeId, u32),
        reply: ReplyEntry,
    ) {
        let (co, r, known, conn) = (
            self.co.clone(),
            r.clone(),
            self.known.clone(),
            self.conn.clone(),
        );
        if node == 0 {
            return replay_ghost(&r, file_type, reply);
        }
        let who = req.caller();
        let msg = Request::Lookup {
            parent: dir,
            name: name.clone(),
        };
        self.conn
            .call(who, &msg, move |res: ReplyResult| match res {
                Ok(Reply::Entry(e)) if e.node == node => {
                    known.given(dir, &name, e.node, || {
                        co.entry_given(&e);
                        true
                    });
                    let attr = file_attr(&e.attr);
                    let generation = Generation(co.generation(e.node, e.generation));
                    reply.entry(&Duration::ZERO, &attr, generation);
                }
                Ok(Reply::Entry(e)) => {
                    // Another file has the name now: the server counted a lookup the kernel
                    // never gets (sent from another thread: this is the reader's).
                    conn.defer(
                        who,
                        Request::Forget {
                            nodes: vec![(e.node, 1)],
                        },
                        None,
                    );
                    replay_ghost(&r, file_type, reply);
                }
                _ => replay_ghost(&r, file_type, reply),
            });
    }

    /// For unlink and rmdir: `name` goes from `parent` (a replay's went on the host already).
    fn name_call(&self, req: Asked<'_>, msg: Request, reply: ReplyEmpty) {
        if let Some(r) = req.origin.replay() {
            return replay_name_change(r, reply);
        }
        let (parent, name) = match &msg {
            Request::Unlink { parent, name } | Request::Rmdir { parent, name } => {
                (*parent, name.clone())
            }
            _ => unreachable!("name_call is for UNLINK and RMDIR"),
        };
        let co = self.co.clone();
        self.call(req, msg, reply, move |reply, r| match r {
            Reply::Empty => {
                co.name_removed(parent, &name);
                reply.ok();
                Ok(())
            }
            _ => Err(reply),
        });
    }

    fn empty_call(&self, req: Asked<'_>, msg: Request, reply: ReplyEmpty) {
        self.call(req, msg, reply, |reply, r| match r {
            Reply::Empty => {
                reply.ok();
                Ok(())
            }
            _ => Err(reply),
        });
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
    fn getattr_after_writes(&self, req: Asked<'_>, node: NodeId, fh: u64, reply: ReplyAttr) {
        let (co, known_attrs) = (self.co.clone(), self.known_attrs.clone());
        let (fallback, conn, caller) = (self.cache.attr_ttl, self.conn.clone(), req.caller());
        let then = Box::new(move || {
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
            then();
        }
    }

    /// For open and opendir. When the server watches, ENOSYS puts the kernel in "no open"
    /// mode: it stops sending OPEN/OPENDIR and RELEASE, keeps pages and listings
    /// (KEEP_CACHE and CACHE_DIR by default) and addresses I/O by node, so a cached
    /// open+read+close never leaves the guest; pushes revoke what went stale. Otherwise the
    /// server opens a handle and the kernel drops its pages at every open (close-to-open
    /// consistency, as NFS does).
    fn open_call(&self, req: Asked<'_>, msg: Request, reply: ReplyOpen) {
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
                reply.opened(FileHandle(fh), FopenFlags::empty());
                Ok(())
            }
            _ => Err(reply),
        });
    }

    fn xattr_call(&self, req: Asked<'_>, msg: Request, reply: ReplyXattr) {
        self.call(req, msg, reply, |reply, r| match r {
            Reply::XattrSize(n) => {
                reply.size(n);
                Ok(())
            }
            Reply::XattrData(d) => {
                reply.data(&d);
                Ok(())
            }
            _ => Err(reply),
        });
    }

    /// For readlink and read: bytes for the kernel.
    fn data_call(&self, req: Asked<'_>, msg: Request, reply: ReplyData) {
        self.call(req, msg, reply, |reply, r| match r {
            Reply::Data(d) => {
                reply.data(&d);
                Ok(())
            }
            _ => Err(reply),
        });
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

    /// Create-behind (write/spares.rs): answers the creation of `name` in `parent` with a spare
    /// file and sends BIND to name it, or gives `reply` back when it cannot (off, a durable
    /// or uncached open, no spare at hand, too much in flight).
    #[allow(clippy::too_many_arguments)]
    fn create_behind(
        &self,
        req: Asked<'_>,
        parent: NodeId,
        n: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) -> Result<(), ReplyCreate> {
        use tether_proto::handshake::features::SPARE_FILES;
        if !self.spares.on()
            || behind::durable_or_uncached(flags)
            || !self.co.enabled()
            || self.co.fixer().is_some()
            || !self.conn.grants(SPARE_FILES)
            // Spares go with their connection: none while it is being replaced.
            || !self.conn.is_up()
        {
            return Err(reply);
        }
        // A set-group-ID directory's files have its group: its spares are its own, so
        // its attributes must be known.
        let Some(dir_attr) = self.known_attrs.get(parent, &self.co) else {
            return Err(reply);
        };
        let set_group_id = dir_attr.mode & libc::S_ISGID != 0;
        let key = PoolKey::new(parent, set_group_id, req.uid(), req.gid());
        let session = self.conn.stats.reconnects.load(Ordering::Relaxed);
        ask_for_spares(&self.conn, &self.spares, key, parent, req.caller());
        let Some(mut entry) = self.spares.take(key, session) else {
            return Err(reply);
        };
        let node = entry.node;
        if !self.write_behind.begin_creation(node) {
            let forget = Request::Forget {
                nodes: vec![(node, 1)],
            };
            self.conn.send_oneway(req.caller(), &forget);
            return Err(reply);
        }
        // The kernel asks for the directory's attributes before its next creation there:
        // that waits for BIND's reply, which carries them (DIR_ATTR), as a write's GETATTR
        // waits for the write.
        let dir_tracked = self.write_behind.begin_creation(parent);
        // What the kernel is told: the file BIND will make, its times the guest's clock's
        // (BIND sets the host's atime and mtime to them; its ctime is the host's moment).
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let time = Timespec {
            sec: now.as_secs() as i64,
            nsec: now.subsec_nanos(),
        };
        let a = &mut entry.attr;
        a.mode = libc::S_IFREG | (mode & 0o7777 & !umask);
        (a.size, a.blocks, a.nlink) = (0, 0, 1);
        (a.atime, a.mtime, a.ctime) = (time, time, time);
        entry.flags = tether_proto::entry_flags::NEW_FILE;
        if self.co.watches(parent) {
            entry.flags |= tether_proto::entry_flags::WATCHED;
        }
        let created = name(n);
        let msg = Request::Bind {
            parent,
            name: created.clone(),
            node,
            mode,
            umask,
            time,
        };
        let sent = self.co.now();
        let (co, known_attrs, wb) = (
            self.co.clone(),
            self.known_attrs.clone(),
            self.write_behind.clone(),
        );
        let (dir_touch, file_touch) = (known_attrs.asking(parent), known_attrs.asking(node));
        let (spares, failed_name, known) =
            (self.spares.clone(), created.clone(), self.known.clone());
        // When BIND went out: after the directory was marked changed ([`Coherence::
        // changed_here`]), which its reply is not older than.
        let bind_sent = Arc::new(std::sync::atomic::AtomicU64::new(sent));
        let bind_sent_then = bind_sent.clone();
        let done = move |res: ReplyResult| {
            known.bound(node);
            let sent = bind_sent_then.load(Ordering::Acquire);
            let outcome = match res {
                Ok(Reply::Create {
                    entry: made, dir, ..
                }) => {
                    known_attrs.learn(parent, dir_touch, dir.as_deref(), sent, &co);
                    known_attrs.learn(node, file_touch, Some(&made.attr), sent, &co);
                    Ok(0)
                }
                Ok(_) => Err(WireErrno::EIO),
                Err(e) => Err(e),
            };
            if wb.finish(node, 0, outcome) {
                spares.counters.failed_later.fetch_add(1, Ordering::Relaxed);
                co.revoke_name(parent, failed_name, node);
            }
            // Never an error of the directory's own.
            if dir_tracked {
                wb.finish(parent, 0, Ok(0));
            }
        };
        let binding = Binding {
            caller: req.caller(),
            generation: entry.generation,
            mode,
            umask,
            time,
        };
        self.known.binding(node, binding);
        self.known.given(parent, &created, node, || {
            self.co.entry_given(&entry);
            self.co.created(&entry, sent);
            true
        });
        self.co.name_made(parent, &created);
        if self.keeps_written() {
            self.written.start(node, sent, &self.co);
        }
        let ttl = ttl_for(&self.co, self.cache.entry_ttl, node, Some(parent), sent);
        // The kernel hears of the file while BIND is about to go out: whatever it asks
        // next leaves after BIND.
        let answer = || {
            self.co.changed_here(parent);
            bind_sent.store(self.co.now(), Ordering::Release);
            reply.created(
                &ttl,
                &file_attr(&entry.attr),
                Generation(entry.generation),
                FileHandle(0),
                FopenFlags::FOPEN_KEEP_CACHE,
            )
        };
        self.send_answering_first(req, &msg, done, answer);
        self.spares
            .counters
            .answered_early
            .fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// Asks the server for spare files for `key`, made in `dir` as `who`, if its pool runs low
/// (write/spares.rs), and FORGETs the spares of a pool pushed out for it.
fn ask_for_spares(
    conn: &Arc<Connection>,
    spares: &Arc<Spares>,
    key: PoolKey,
    dir: NodeId,
    who: Caller,
) {
    let session = conn.stats.reconnects.load(Ordering::Relaxed);
    let Some(evicted) = spares.should_ask(key, session) else {
        return;
    };
    forget_spares(conn, who, evicted);
    let msg = Request::Spares {
        parent: dir,
        count: spares::ASK,
    };
    let (conn2, spares) = (conn.clone(), spares.clone());
    let done = move |res: ReplyResult| {
        let outcome = match res {
            Ok(Reply::Spares(files)) => Ok(files),
            Ok(_) => Err(WireErrno::EIO),
            Err(e) => Err(e),
        };
        let current = conn2.stats.reconnects.load(Ordering::Relaxed);
        let unused = spares.filled(key, (session, current), outcome);
        forget_spares(&conn2, who, unused);
    };
    conn.defer(who, msg, Some(Box::new(done)));
}

fn forget_spares(conn: &Arc<Connection>, who: Caller, nodes: Vec<NodeId>) {
    if !nodes.is_empty() {
        let nodes = nodes.into_iter().map(|n| (n, 1)).collect();
        conn.defer(who, Request::Forget { nodes }, None);
    }
}

impl Filesystem for TetherFs {
    fn init(&mut self, _req: &FuseRequest, config: &mut KernelConfig) -> std::io::Result<()> {
        // Not FUSE_ATOMIC_O_TRUNC: in no-open mode there is no OPEN to carry O_TRUNC, so the
        // kernel must truncate with SETATTR itself.
        // Always readdirplus (no _AUTO heuristic): a directory walk then fills the dentry
        // and attribute caches with one trip per page of entries, not one LOOKUP per name.
        let mut wanted = InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_ASYNC_DIO
            | InitFlags::FUSE_BIG_WRITES;
        // KILLPRIV_V2 on every mount: the kernel marks the superblock SB_NOSEC and asks for
        // `security.capability` once per file instead of before every write; the server
        // clears set-user-ID itself (after writes by non-root callers, and on SETATTR bit
        // KILL_SUIDGID). Written-through `dd` runs about 10% faster with it.
        wanted |= InitFlags::FUSE_HANDLE_KILLPRIV_V2;
        // The writeback cache only with pushed invalidations (the kernel would otherwise
        // never learn a host-side size or mtime) and a fixer to apply them (invalidate/fixer.rs).
        let writeback = InitFlags::FUSE_WRITEBACK_CACHE | InitFlags::FUSE_HANDLE_KILLPRIV_V2;
        let fixer = self.fixer.clone().filter(|_| {
            self.cache.writes.asks_writeback_cache()
                && self.co.enabled()
                && config.capabilities().contains(writeback)
        });
        if fixer.is_some() {
            wanted |= writeback;
        }
        // Locks go to the host's files (fuse/locks.rs); flock too, not emulated with POSIX locks.
        if self.locks.is_some() {
            wanted |= InitFlags::FUSE_POSIX_LOCKS | InitFlags::FUSE_FLOCK_LOCKS;
        }
        let supported = wanted & config.capabilities();
        let _ = config.add_capabilities(supported);
        self.killpriv = supported.contains(InitFlags::FUSE_HANDLE_KILLPRIV_V2);
        if let Some(f) = fixer {
            self.co.set_fixer(f);
        }
        let _ = config.set_max_write(1 << 20);
        let _ = config.set_max_background(64);
        Ok(())
    }

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
        let req = self.asked(req);
        let msg = Request::Getlk {
            node: ino.0,
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
        let req = self.asked(req);
        let Some(locks) = &self.locks else {
            reply.error(Errno::ENOSYS);
            return;
        };
        let r = LockRequest {
            unique: req.unique().0,
            who: req.caller(),
            node: ino.0,
            lock: lock_spec(lock_owner, flock, typ, start, end),
            tgid: pid,
            wait: sleep,
            generation: 0,
        };
        locks.set(r, reply);
    }

    fn interrupt(&self, _req: &FuseRequest, unique: fuser::RequestId) {
        if let Some(l) = &self.locks {
            l.interrupt(unique.0);
        }
    }

    fn destroy(&mut self) {
        // Writes answered early reach the server before the connection goes (a lost server
        // gets as long as any request waits for it).
        let left = self.write_behind.drain(self.conn.request_timeout());
        if left > 0 {
            tracing::error!("{left} write(s) answered early never reached the server");
        }
        for (node, e) in self.write_behind.unreported() {
            tracing::error!(node, "a write answered early failed ({e:?}) and no later write or fsync of the file was there to report it");
        }
        self.conn.shut_down();
    }

    fn lookup(&self, req: &FuseRequest, parent: INodeNo, n: &OsStr, reply: ReplyEntry) {
        let req = self.asked(req);
        if req.origin.replay().is_none() {
            if self.co.surely_absent(parent.0, n.as_bytes()) {
                give_missing(reply); // as the server's ENOENT would be
                return;
            }
            self.prefetch.missed(parent.0);
        }
        self.entry_call(
            req,
            parent.0,
            Request::Lookup {
                parent: parent.0,
                name: name(n),
            },
            reply,
        );
    }

    fn forget(&self, req: &FuseRequest, ino: INodeNo, nlookup: u64) {
        let req = self.asked(req);
        if ino.0 >= GHOST_BASE {
            return; // never known to the server
        }
        // Sent before the count drops: a reconnect's restore then either counts these
        // lookups and gets the FORGET after it, or counts none of them.
        self.conn.send_oneway(
            req.caller(),
            &Request::Forget {
                nodes: vec![(ino.0, nlookup)],
            },
        );
        self.known.forgotten(ino.0, nlookup, |parent| {
            self.co.forget(ino.0);
            self.prefetch.forgotten(ino.0, parent);
            self.pages.forget(ino.0);
            self.known_attrs.forget(ino.0);
            self.written.drop_copy(ino.0);
            // Only now: the server drops a node's locks when the kernel holds no lookup.
            if let Some(l) = &self.locks {
                l.forgotten(ino.0);
            }
        });
    }

    fn getattr(&self, req: &FuseRequest, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let req = self.asked(req);
        // Before the check: an invalidation after it shortens the answer's life.
        let now = self.co.now();
        if let Some(a) = self.known_attrs.get(ino.0, &self.co) {
            let ttl = ttl_for(&self.co, self.cache.attr_ttl, ino.0, None, now);
            reply.attr(&ttl, &file_attr(&a));
            return;
        }
        let fh = fh.map(|f| f.0).unwrap_or(0);
        if self.write_behind.writing(ino.0) {
            return self.getattr_after_writes(req, ino.0, fh, reply);
        }
        self.attr_call(req, ino.0, Request::Getattr { node: ino.0, fh }, reply);
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
        let req = self.asked(req);
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
        let fh = fh.map(|f| f.0).unwrap_or(0);
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
            return self.attr_call(req, ino.0, Request::Getattr { node: ino.0, fh: 0 }, reply);
        };
        let msg = Request::Setattr {
            node: ino.0,
            fh,
            set,
        };
        if size.is_none() {
            return self.attr_call(req, ino.0, msg, reply);
        }
        // The data changes: a copy of it goes, and one starts again from a truncation to 0
        // (an O_TRUNC open, in no-open mode).
        self.written.drop_copy(ino.0);
        let answer = attr_answer(&self.co, &self.known_attrs, self.cache.attr_ttl, ino.0);
        let emptied = (size == Some(0) && self.keeps_written())
            .then(|| (self.written.clone(), self.co.clone(), self.co.now()));
        self.call(req, msg, reply, move |reply, r| {
            // Before the kernel hears: its next write to the file must find the copy.
            if let (true, Some((written, co, sent))) =
                (matches!(&r, Reply::Attr(a) if a.size == 0), emptied)
            {
                written.start(ino.0, sent, &co);
            }
            answer(reply, r)
        });
    }

    fn readlink(&self, req: &FuseRequest, ino: INodeNo, reply: ReplyData) {
        let req = self.asked(req);
        self.data_call(req, Request::Readlink { node: ino.0 }, reply);
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
        let req = self.asked(req);
        let msg = Request::Mknod {
            parent: parent.0,
            name: name(n),
            mode,
            rdev: rdev as u64,
            umask,
        };
        self.entry_call(req, parent.0, msg, reply);
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
        let req = self.asked(req);
        self.entry_call(
            req,
            parent.0,
            Request::Mkdir {
                parent: parent.0,
                name: name(n),
                mode,
                umask,
            },
            reply,
        );
    }

    fn unlink(&self, req: &FuseRequest, parent: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        let req = self.asked(req);
        self.name_call(
            req,
            Request::Unlink {
                parent: parent.0,
                name: name(n),
            },
            reply,
        );
    }

    fn rmdir(&self, req: &FuseRequest, parent: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        let req = self.asked(req);
        self.name_call(
            req,
            Request::Rmdir {
                parent: parent.0,
                name: name(n),
            },
            reply,
        );
    }

    fn symlink(
        &self,
        req: &FuseRequest,
        parent: INodeNo,
        link: &OsStr,
        target: &std::path::Path,
        reply: ReplyEntry,
    ) {
        let req = self.asked(req);
        let msg = Request::Symlink {
            parent: parent.0,
            name: name(link),
            target: Bytes::copy_from_slice(target.as_os_str().as_bytes()),
        };
        self.entry_call(req, parent.0, msg, reply);
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
        let req = self.asked(req);
        let (from, to) = (name(n), name(new_name));
        let msg = Request::Rename {
            parent: parent.0,
            name: from.clone(),
            new_parent: new_parent.0,
            new_name: to.clone(),
            flags: flags.bits(),
        };
        if let Some(r) = req.origin.replay() {
            return replay_name_change(r, reply);
        }
        let known = self.known.clone();
        let exchange = flags.bits() & libc::RENAME_EXCHANGE != 0;
        // A whiteout takes the place of the old name.
        let whiteout = flags.bits() & libc::RENAME_WHITEOUT != 0;
        let co = self.co.clone();
        self.call(req, msg, reply, move |reply, r| match r {
            Reply::Empty => {
                known.renamed(parent.0, &from, new_parent.0, &to, exchange);
                if !exchange && !whiteout {
                    co.name_removed(parent.0, &from);
                }
                co.name_made(new_parent.0, &to);
                if exchange {
                    co.name_made(parent.0, &from);
                }
                reply.ok();
                Ok(())
            }
            _ => Err(reply),
        });
    }

    fn link(
        &self,
        req: &FuseRequest,
        ino: INodeNo,
        new_parent: INodeNo,
        new_name: &OsStr,
        reply: ReplyEntry,
    ) {
        let req = self.asked(req);
        let msg = Request::Link {
            node: ino.0,
            new_parent: new_parent.0,
            new_name: name(new_name),
        };
        self.entry_call(req, new_parent.0, msg, reply);
    }

    fn open(&self, req: &FuseRequest, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let req = self.asked(req);
        self.open_call(
            req,
            Request::Open {
                node: ino.0,
                flags: flags.0 as u32,
            },
            reply,
        );
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
        let req = self.asked(req);
        if self.keeps_written() {
            if let Some(data) = self.written.read(ino.0, offset, size, &self.co) {
                reply.data(&data);
                return;
            }
        }
        self.pages.reading(ino.0, offset, size.into());
        let msg = Request::Read {
            node: ino.0,
            fh: fh.0,
            offset,
            size,
        };
        self.data_call(req, msg, reply);
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
        let req = self.asked(req);
        if let Some(e) = self.write_behind.take_error(ino.0) {
            reply.error(errno(e));
            return;
        }
        // The kernel keeps the pages of pushed-invalidation mounts across opens; with the
        // writeback cache it reads a page before writing part of it.
        if self.co.enabled() && self.co.fixer().is_none() {
            self.pages.written(ino.0, offset, data.len() as u64);
        }
        let msg = Request::Write {
            node: ino.0,
            fh: fh.0,
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
            && fh.0 == 0
            && self
                .conn
                .grants(tether_proto::handshake::features::ORDERED_WRITES)
            && req.origin.replay().is_none()
            && behind::may_answer_early(data.len(), flags.0)
            && self.write_behind.begin(ino.0, data.len());
        if early {
            self.write_behind(req, ino.0, msg, data.len(), reply);
        } else {
            self.written_call(req, msg, reply);
        }
    }

    fn flush(
        &self,
        req: &FuseRequest,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // The kernel writes back a file's dirty pages itself at close() before it would send
        // FLUSH, and write errors come back to those writes: ENOSYS stops the kernel sending
        // FLUSH on every close().
        let _ = (req, ino, fh, lock_owner);
        reply.error(Errno::ENOSYS);
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
        let req = self.asked(req);
        if fh.0 == 0 {
            // No server handle (files the kernel does I/O on by node, see `create`): the
            // server has nothing to release.
            reply.ok();
            return;
        }
        self.known.released(fh.0);
        self.empty_call(
            req,
            Request::Release {
                node: ino.0,
                fh: fh.0,
            },
            reply,
        );
    }

    fn fsync(
        &self,
        req: &FuseRequest,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let req = self.asked(req);
        if matches!(req.origin, Origin::Fixer { .. }) {
            // invalidate/fixer.rs: the fixer only wants the kernel's dirty data sent, not the
            // host's disk flushed.
            reply.ok();
            return;
        }
        let msg = Request::Fsync {
            node: ino.0,
            fh: fh.0,
            datasync,
        };
        // The replies to earlier writes come first on the stream: an error of one answered
        // early is known by the time this one is answered, and it is the one to report
        // (a file whose creation failed then fails the fsync itself, with ESTALE).
        let wb = self.write_behind.clone();
        self.send(req, &msg, move |res: ReplyResult| {
            match (wb.take_error(ino.0), res) {
                (Some(e), _) | (None, Err(e)) => reply.error(errno(e)),
                (None, Ok(Reply::Empty)) => reply.ok(),
                (None, Ok(_)) => reply.error(Errno::EIO),
            }
        });
    }

    fn opendir(&self, req: &FuseRequest, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let req = self.asked(req);
        self.open_call(
            req,
            Request::Opendir {
                node: ino.0,
                flags: flags.0 as u32,
            },
            reply,
        );
    }

    fn readdir(
        &self,
        req: &FuseRequest,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectory,
    ) {
        let req = self.asked(req);
        if self.co.listing_surely_ended(ino.0, offset) {
            reply.ok();
            return;
        }
        // fuser does not tell us the kernel's buffer size; a page-sized answer always fits.
        let msg = Request::Readdir {
            node: ino.0,
            fh: fh.0,
            offset,
            size: 4096,
            plus: false,
        };
        let (co, sent, dir) = (self.co.clone(), self.co.now(), ino.0);
        let names = self.co.names_made();
        self.call(req, msg, reply, move |mut reply, r| match r {
            Reply::Dir { entries, end } => {
                let mut full = false;
                let last = entries.last().map(|e| e.offset);
                for e in entries {
                    full = reply.add(
                        INodeNo(e.ino),
                        e.offset,
                        kind_of_dtype(e.kind),
                        OsStr::from_bytes(&e.name),
                    );
                    if full {
                        break;
                    }
                }
                // Before the reply: the kernel asks for what follows as soon as it has it.
                if let (true, false, Some(last)) = (end, full, last) {
                    co.listing_ended(dir, last, sent, names);
                }
                reply.ok();
                Ok(())
            }
            _ => Err(reply),
        });
    }

    fn readdirplus(
        &self,
        req: &FuseRequest,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectoryPlus,
    ) {
        let req = self.asked(req);
        // The kernel asks for what follows the last entry before it sees the end.
        if self.co.listing_surely_ended(ino.0, offset) {
            reply.ok();
            return;
        }
        let msg = Request::Readdir {
            node: ino.0,
            fh: fh.0,
            offset,
            size: self.listing_bytes.load(Ordering::Relaxed),
            plus: true,
        };
        let listing_bytes = self.listing_bytes.clone();
        let (co, fallback, sent, dir) =
            (self.co.clone(), self.cache.entry_ttl, self.co.now(), ino.0);
        let names = self.co.names_made();
        let (conn, known) = (self.conn.clone(), self.known.clone());
        let (known_attrs, since) = (self.known_attrs.clone(), self.known_attrs.looking());
        let who = req.caller();
        self.call(req, msg, reply, move |mut reply, r| match r {
            Reply::Dir { entries, end } => {
                let last = entries.last().map(|e| e.offset);
                let mut unused: Vec<(u64, u64)> = Vec::new();
                let mut full = false;
                let mut fitted = 0;
                for e in entries {
                    let entry = e.entry.unwrap_or(Entry {
                        node: e.ino,
                        attr: Attr {
                            ino: e.ino,
                            mode: (e.kind as u32) << 12,
                            ..Attr::default()
                        },
                        ..Entry::default()
                    });
                    if !full {
                        // Returns whether the kernel got a lookup of the entry.
                        let mut give = || {
                            let before = co.last_given(entry.node);
                            if e.entry.is_some() {
                                co.entry_given(&entry);
                            }
                            let ttl = ttl_for(&co, fallback, entry.node, Some(dir), sent);
                            full = reply.add(
                                INodeNo(entry.node),
                                e.offset,
                                OsStr::from_bytes(&e.name),
                                &ttl,
                                &file_attr(&entry.attr),
                                Generation(co.generation(entry.node, entry.generation)),
                            );
                            if full && e.entry.is_some() && before.is_none() {
                                // It did not fit: the kernel never got it.
                                co.entry_not_given(entry.node);
                            }
                            if !full {
                                fitted += fuse_dirent_size(e.name.len(), true);
                                if e.entry.is_some() {
                                    let a = &entry.attr;
                                    known_attrs.learn_entry(entry.node, since, a, sent, &co);
                                }
                            }
                            !full && e.entry.is_some()
                        };
                        if e.entry.is_some() {
                            known.given(dir, &e.name, entry.node, give);
                        } else {
                            give();
                        }
                    }
                    // The server counted a lookup for each entry it sent; give back the ones
                    // the kernel never saw.
                    if full && e.entry.is_some() {
                        unused.push((entry.node, 1));
                    }
                }
                // Before the reply: the kernel asks for what follows as soon as it has it.
                if let (true, false, Some(last)) = (end, full, last) {
                    co.listing_ended(dir, last, sent, names);
                }
                reply.ok();
                if full {
                    // The kernel's buffer was smaller than asked for: ask for no more.
                    let fits = (fitted as u32).next_multiple_of(4096).max(4096);
                    listing_bytes.fetch_min(fits, Ordering::Relaxed);
                }
                if !unused.is_empty() {
                    conn.defer(who, Request::Forget { nodes: unused }, None);
                }
                Ok(())
            }
            _ => Err(reply),
        });
    }

    fn releasedir(
        &self,
        req: &FuseRequest,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        let req = self.asked(req);
        self.known.released(fh.0);
        self.empty_call(
            req,
            Request::Releasedir {
                node: ino.0,
                fh: fh.0,
            },
            reply,
        );
    }

    fn fsyncdir(
        &self,
        req: &FuseRequest,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let req = self.asked(req);
        self.empty_call(
            req,
            Request::Fsyncdir {
                node: ino.0,
                fh: fh.0,
                datasync,
            },
            reply,
        );
    }

    fn statfs(&self, req: &FuseRequest, ino: INodeNo, reply: ReplyStatfs) {
        let req = self.asked(req);
        self.call(
            req,
            Request::Statfs { node: ino.0 },
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
        let req = self.asked(req);
        self.co.xattrs_changing(ino.0);
        let msg = Request::Setxattr {
            node: ino.0,
            name: name(n),
            value: Bytes::copy_from_slice(value),
            flags: flags as u32,
        };
        self.empty_call(req, msg, reply);
    }

    fn getxattr(&self, req: &FuseRequest, ino: INodeNo, n: &OsStr, size: u32, reply: ReplyXattr) {
        let req = self.asked(req);
        if n.as_bytes() == b"security.capability" && self.co.known_without_capability(ino.0) {
            reply.error(Errno::ENODATA);
            return;
        }
        self.xattr_call(
            req,
            Request::Getxattr {
                node: ino.0,
                name: name(n),
                size,
            },
            reply,
        );
    }

    fn listxattr(&self, req: &FuseRequest, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let req = self.asked(req);
        self.xattr_call(req, Request::Listxattr { node: ino.0, size }, reply);
    }

    fn removexattr(&self, req: &FuseRequest, ino: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        let req = self.asked(req);
        self.co.xattrs_changing(ino.0);
        self.empty_call(
            req,
            Request::Removexattr {
                node: ino.0,
                name: name(n),
            },
            reply,
        );
    }

    fn access(&self, req: &FuseRequest, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let req = self.asked(req);
        self.empty_call(
            req,
            Request::Access {
                node: ino.0,
                mask: mask.bits() as u32,
            },
            reply,
        );
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
        let req = self.asked(req);
        let Err(reply) = self.create_behind(req, parent.0, n, mode, umask, flags, reply) else {
            return;
        };
        let msg = Request::Create {
            parent: parent.0,
            name: name(n),
            mode,
            umask,
            flags: flags as u32,
        };
        let (co, fallback, sent, dir) = (
            self.co.clone(),
            self.cache.entry_ttl,
            self.co.now(),
            parent.0,
        );
        let (conn, who, known) = (self.conn.clone(), req.caller(), self.known.clone());
        let created = name(n);
        let (known_attrs, touch) = (self.known_attrs.clone(), self.known_attrs.asking(dir));
        let written = self.keeps_written().then(|| self.written.clone());
        self.call(req, msg, reply, move |reply, r| match r {
            Reply::Create {
                entry,
                fh,
                dir: dir_attr,
                ..
            } => {
                known_attrs.learn(dir, touch, dir_attr.as_deref(), sent, &co);
                known.given(dir, &created, entry.node, || {
                    co.entry_given(&entry);
                    co.created(&entry, sent);
                    true
                });
                co.name_made(dir, &created);
                if let Some(written) = written.filter(|_| entry.attr.size == 0) {
                    written.start(entry.node, sent, &co);
                }
                let ttl = ttl_for(&co, fallback, entry.node, Some(dir), sent);
                // After what this reply itself tells is decided, before the kernel hears.
                co.changed_here(dir);
                let keep = if co.cacheable(entry.node, sent) {
                    FopenFlags::FOPEN_KEEP_CACHE
                } else {
                    FopenFlags::empty()
                };
                // In no-open mode the kernel does not always send RELEASE for a file made by
                // CREATE (not when it was created over a cached negative entry, as git's lock
                // files are), so a handle given to it could stay open on the server for good:
                // release it now and let the kernel do I/O on the new file by node.
                let kernel_fh = if co.enabled() {
                    // None to release when the server opened none (CREATE_NO_HANDLE).
                    if fh != 0 {
                        let release = Request::Release {
                            node: entry.node,
                            fh,
                        };
                        conn.defer(who, release, Some(Box::new(|_| {})));
                    }
                    0
                } else {
                    // Opened again without creating or truncating after a reconnect.
                    let flags = flags as u32 & !(libc::O_CREAT | libc::O_EXCL) as u32;
                    known.opened(
                        fh,
                        OpenHandle {
                            node: entry.node,
                            flags,
                            dir: false,
                        },
                    );
                    fh
                };
                reply.created(
                    &ttl,
                    &file_attr(&entry.attr),
                    Generation(co.generation(entry.node, entry.generation)),
                    FileHandle(kernel_fh),
                    keep,
                );
                Ok(())
            }
            _ => Err(reply),
        });
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
        let req = self.asked(req);
        self.written.drop_copy(ino.0);
        let msg = Request::Fallocate {
            node: ino.0,
            fh: fh.0,
            offset,
            length,
            mode: mode as u32,
        };
        self.empty_call(req, msg, reply);
    }

    /// No ioctl reaches the host: answered here as a local file system answers one it does
    /// not know (ENOTTY). The kernel asks for every ioctl of a file on the mount, and
    /// Python asks `isatty()` (TCGETS) of every file it opens: fuser's default answer (ENOSYS,
    /// which the caller saw) also logged a warning each time.
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
        reply.error(Errno::ENOTTY);
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
        let req = self.asked(req);
        let msg = Request::Lseek {
            node: ino.0,
            fh: fh.0,
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
                        fixer.write_back(ino.0);
                        conn.call(who, &msg, move |r| answer(reply, r));
                    });
                if let Err(e) = spawned {
                    tracing::warn!("no thread for an lseek: {e}");
                }
            }
            _ => self.send(req, &msg, move |r| answer(reply, r)),
        }
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
        let req = self.asked(req);
        let msg = Request::CopyFileRange {
            node_in: ino_in.0,
            fh_in: fh_in.0,
            offset_in,
            node_out: ino_out.0,
            fh_out: fh_out.0,
            offset_out,
            len,
            flags: flags.bits() as u32,
        };
        self.written_call(req, msg, reply);
    }
}

/// A replayed unlink, rmdir or rename: done already on the host. The first attempt of a
/// replay that asks for it is answered ESTALE, so that the kernel tries once more with
/// LOOKUP_REVAL: that looks up again, under the directory locks, every name the operation
/// acts on, so the replay's own answers decide it even if a guest operation put another
/// dentry under the name since the replay invalidated it (Replayer::revalidate_first).
fn replay_name_change(r: &Replayer, reply: ReplyEmpty) {
    if r.revalidate_first() {
        reply.error(Errno::ESTALE);
    } else {
        reply.ok();
    }
}

/// A ghost of type `file_type` for the replaying thread: a node the server never knew,
/// never cached.
fn replay_ghost(r: &Replayer, file_type: u32, reply: ReplyEntry) {
    reply.entry(
        &Duration::ZERO,
        &file_attr(&r.ghost(file_type)),
        Generation(0),
    );
}

/// The name an entry request gives its node in its parent.
fn entry_name(msg: &Request) -> Option<Bytes> {
    match msg {
        Request::Lookup { name, .. } | Request::Link { new_name: name, .. } => Some(name.clone()),
        _ => created_name(msg),
    }
}

/// The name a creating request makes, for answering its replay.
fn created_name(msg: &Request) -> Option<Bytes> {
    match msg {
        Request::Mknod { name, .. }
        | Request::Mkdir { name, .. }
        | Request::Symlink { name, .. } => Some(name.clone()),
        _ => None,
    }
}
