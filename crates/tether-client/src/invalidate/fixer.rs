//! The kernel's writeback cache, kept coherent.
//!
//! Guest writes first: they land in the guest's page cache and reach the server at
//! close(), fsync(), or when the [`Flusher`] syncs the mount (every 20 ms by default), so a
//! write through a descriptor that stays open shows on the host within that interval.
//!
//! Host changes:
//!
//! With the writeback cache (FUSE_WRITEBACK_CACHE) the guest kernel owns the size, mtime and
//! ctime of every regular file it caches: writes land in its page cache and reach the server
//! later, so it never takes those three from a server reply again (fs/fuse/inode.c,
//! `fuse_get_cache_mask`). An `inval_inode` still drops pages and the other attributes, but
//! a file the host appended to would keep its old size (reads cut short) and a file the host
//! edited would keep its old mtime (make would not rebuild it).
//!
//! The kernel does take them from two places: the size from the daemon's reply to a
//! truncating SETATTR, and the mtime from a SETATTR that sets times; and it makes an inode
//! it forgot anew from a lookup's attributes. So after a host change to a regular file the
//! kernel holds, the [`AttrFixer`] first drops the file's name: FUSE keeps no inode nobody
//! uses, so one that is not open, mapped or running is forgotten, and looked up afresh.
//! If the kernel still holds it, the fixer opens that very inode, read-only, through
//! `open_by_handle_at` (no path: nothing can be renamed under it), and if the kernel's size
//! or mtime differ from the host's, truncates the file to the host's size (by its
//! /proc/self/fd path) and sets the host's mtime. Its thread is known to the FUSE
//! handlers, which answer its SETATTRs with the server's current attributes and change
//! nothing on the host (as for replays, invalidate/host_events.rs). A process holding the file open
//! keeps its descriptor and sees the new size and content; nothing gets EIO.
//!
//! Costs: one GETATTR per changed file the kernel holds in use, and when something differs
//! two SETATTRs the client answers itself. Guest watchers of such a file also see the open,
//! truncate, attrib and close-without-write events of the fix (docs/coherence.md).

use std::collections::HashSet;
use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use fuser::Notifier;
use tether_proto::{Caller, NodeId, Reply, Request};

use crate::kernel_ids::ino_of;
use crate::known::Known;
use crate::rpc::Connection;
use crate::sys::mount_dir::MountDir;

/// fuse_encode_fh's type for a handle without the parent: node id (two u32) and generation.
const FUSE_FILEID_INO64_GEN: i32 = 0x81;

/// How long a fix waits before trying again after a guest write overtook it.
const RETRY_AFTER: Duration = Duration::from_millis(10);

/// How long the fix of an executable in use waits before trying again.
const RETRY_BUSY_AFTER: Duration = Duration::from_millis(100);

/// The size and mtime the kernel holds for a file.
type KernelAttrs = (u64, (i64, u32));

/// The kernel's size and mtime a fix step was decided on, and the descriptor to check them
/// through. The kernel holds the inode lock while it sends the step's SETATTR, so the
/// handler's check cannot race a guest write.
#[derive(Clone, Copy)]
struct Expected {
    fd: i32,
    attrs: KernelAttrs,
}

/// How a fix ended.
#[derive(PartialEq, Eq, Debug)]
enum Fix {
    /// The kernel already had the host's size and mtime, or no longer holds a file.
    Nothing,
    /// The kernel was given the host's size and mtime.
    Done,
    /// A guest write came in while the fix ran: to be tried again.
    Overtaken,
    /// The kernel forgot the file (nobody used it) once its names were dropped.
    Forgotten,
    /// An executable in use: to be tried again later.
    Busy,
}

/// The fixing thread's queue: nodes in order, each once, whether a fix is running, and
/// fixes to run later, with when.
#[derive(Default)]
struct Queue {
    nodes: Vec<NodeId>,
    set: HashSet<NodeId>,
    running: bool,
    later: Vec<(Instant, NodeId)>,
}

impl Queue {
    /// Queues `node` unless it is already queued.
    fn push(&mut self, node: NodeId) -> bool {
        let new = self.set.insert(node);
        if new {
            self.nodes.push(node);
        }
        new
    }
}

#[derive(Default)]
pub struct FixCounters {
    /// Files whose kernel size or mtime was set to the host's.
    pub fixed: AtomicU64,
    /// Files the kernel forgot when their names were dropped, to take the host's size and
    /// mtime at the next lookup.
    pub forgotten: AtomicU64,
    /// Fixes of executables in use put off (their truncation would make an exec fail with
    /// ETXTBSY).
    pub busy: AtomicU64,
    /// Fixes tried again because a guest write came in while they ran.
    pub overtaken: AtomicU64,
    pub failed: AtomicU64,
}

pub struct AttrFixer {
    conn: Arc<Connection>,
    /// The mount's root, for open_by_handle_at.
    dir: Arc<MountDir>,
    /// Threads that fix (bound with `bind_to_current_thread`).
    tids: DashMap<i32, ()>,
    /// Threads inside a fix's truncate or utimens, with the kernel state the fix was decided
    /// on: their SETATTRs only re-state the host's attributes. (Their other SETATTRs, the
    /// kernel writing back a dirty mtime, are real.)
    restating: DashMap<i32, Expected>,
    /// Regular files the kernel was given, with the generation it knows them by.
    files: DashMap<NodeId, u32>,
    /// Nodes waiting for the fixing thread, each once.
    queued: Mutex<Queue>,
    wake: Condvar,
    /// Signalled when the queue is empty and no fix runs.
    idle: Condvar,
    /// The kernel session, to drop a file's names.
    session: OnceLock<(Notifier, Arc<Known>)>,
    pub counters: FixCounters,
}

fn tid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

impl AttrFixer {
    pub fn new(conn: Arc<Connection>, dir: Arc<MountDir>) -> AttrFixer {
        AttrFixer {
            conn,
            dir,
            tids: DashMap::new(),
            restating: DashMap::new(),
            files: DashMap::new(),
            queued: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            idle: Condvar::new(),
            session: OnceLock::new(),
            counters: FixCounters::default(),
        }
    }

    /// Starts the fixing thread; it runs as long as the process.
    pub fn start(self: &Arc<Self>) {
        let me = self.clone();
        let spawned = std::thread::Builder::new()
            .name("tether-fix".into())
            .spawn(move || {
                me.bind_to_current_thread();
                loop {
                    let nodes = {
                        let mut q = me.queued.lock().unwrap();
                        q.running = false;
                        loop {
                            let now = Instant::now();
                            let (due, later): (Vec<_>, Vec<_>) =
                                q.later.drain(..).partition(|(at, _)| *at <= now);
                            q.later = later;
                            for (_, n) in due {
                                q.push(n);
                            }
                            if !q.nodes.is_empty() {
                                break;
                            }
                            me.idle.notify_all();
                            q = match q.later.iter().map(|(at, _)| *at).min() {
                                Some(at) => {
                                    let wait = at.saturating_duration_since(now);
                                    me.wake.wait_timeout(q, wait).unwrap().0
                                }
                                None => me.wake.wait(q).unwrap(),
                            };
                        }
                        q.running = true;
                        q.set.clear();
                        std::mem::take(&mut q.nodes)
                    };
                    for n in nodes {
                        if let Some(after) = me.fix(n) {
                            me.fix_after(n, after);
                        }
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::warn!("no fixing thread: {e}");
        }
    }

    /// The kernel session, once it exists: fixes drop the names of files nobody uses.
    pub fn attach(&self, notifier: Notifier, known: Arc<Known>) {
        let _ = self.session.set((notifier, known));
    }

    /// Queues a fix of `node` (see [`AttrFixer::fix`]), if the kernel holds it as a file.
    pub fn fix_later(&self, node: NodeId) {
        if !self.files.contains_key(&node) {
            return;
        }
        let mut q = self.queued.lock().unwrap();
        if q.push(node) {
            self.wake.notify_one();
        }
    }

    /// Queues a fix of `node` in `delay`: for a reply that may be older than a host change
    /// the kernel was told of (a LOOKUP answered while the host truncated the file), whose
    /// size a new inode would take. The kernel makes the inode after the reply is
    /// written, so a fix right away could find none.
    pub fn fix_soon(&self, node: NodeId) {
        if self.files.contains_key(&node) {
            self.fix_after(node, RETRY_AFTER);
        }
    }

    fn fix_after(&self, node: NodeId, delay: Duration) {
        let mut q = self.queued.lock().unwrap();
        q.later.push((Instant::now() + delay, node));
        self.wake.notify_one();
    }

    /// Waits (at most `limit`) until the fixes queued so far have run, so that a guest
    /// watcher told of a host change by a replay reads the new size.
    pub fn settle(&self, limit: Duration) {
        let q = self.queued.lock().unwrap();
        let _ = self
            .idle
            .wait_timeout_while(q, limit, |q| q.running || !q.nodes.is_empty());
    }

    /// The calling thread may call [`AttrFixer::fix`].
    pub fn bind_to_current_thread(&self) {
        self.tids.insert(tid(), ());
    }

    /// True for requests a fixing thread caused (FUSE reports the caller's thread id).
    pub fn is_fixer(&self, pid: u32) -> bool {
        !self.tids.is_empty() && self.tids.contains_key(&(pid as i32))
    }

    /// True for a SETATTR that re-states the host's attributes (see `apply`).
    pub fn is_restating(&self, pid: u32) -> bool {
        !self.restating.is_empty() && self.restating.contains_key(&(pid as i32))
    }

    /// For a SETATTR of a fix step (`is_restating`): whether the kernel's size and mtime are
    /// still those the step was decided on. A guest write that came in since (it extended
    /// the file, or dirtied it) would be undone by the step, which must then fail (EAGAIN)
    /// and be tried again. Runs on a FUSE handler while the fixing thread's truncate or
    /// utimens holds the inode lock.
    pub fn still_as_decided(&self, pid: u32) -> bool {
        let Some(e) = self.restating.get(&(pid as i32)).map(|e| *e) else {
            return true;
        };
        // SAFETY: the fixing thread keeps `fd` open until its step returns, which is after
        // this reply.
        let fd = unsafe { BorrowedFd::borrow_raw(e.fd) };
        kernel_size_and_mtime(fd).is_ok_and(|now| now == e.attrs)
    }

    /// The kernel was given `node` with `generation` and these attributes.
    pub fn entry_given(&self, node: NodeId, generation: u64, mode: u32) {
        if mode & libc::S_IFMT == libc::S_IFREG {
            // The kernel keeps the low 32 bits (struct inode's i_generation).
            self.files.insert(node, generation as u32);
        }
    }

    pub fn forget(&self, node: NodeId) {
        self.files.remove(&node);
    }

    /// The generation the kernel knows `node` by, if it was given it as a regular file.
    fn generation(&self, node: NodeId) -> Option<u32> {
        self.files.get(&node).map(|g| *g)
    }

    /// Makes the kernel's size and mtime of `node` the host's now, on the calling thread:
    /// for a lock just granted, whose holder must read the last holder's writes in full (an
    /// `inval_inode` leaves the kernel's size as it was). Not on a FUSE handler's thread.
    pub fn fix_now(&self, node: NodeId) {
        let Some(generation) = self.generation(node) else {
            return;
        };
        self.bind_to_current_thread();
        for _ in 0..3 {
            // The holder has the file open: it cannot be forgotten.
            let outcome = self.apply(node, generation, false);
            if self.account(node, outcome) != Some(RETRY_AFTER) {
                return; // done, or nothing to try again at once (an executable in use)
            }
        }
    }

    /// Writes the kernel's dirty pages of `node` to the server and waits for them: before
    /// an explicit unlock, so that the next holder (on the host, in another guest) reads
    /// what this one wrote, as it would from a write-through mount. (A close writes them
    /// back by itself.) Not on a FUSE handler's thread: the WRITEs need one.
    pub fn write_back(&self, node: NodeId) {
        let Some(generation) = self.generation(node) else {
            return;
        };
        let written = self.dir.with(|root| -> io::Result<()> {
            let file = open_by_node(root, node, generation)?;
            let how = libc::SYNC_FILE_RANGE_WAIT_BEFORE
                | libc::SYNC_FILE_RANGE_WRITE
                | libc::SYNC_FILE_RANGE_WAIT_AFTER;
            // SAFETY: a descriptor we own; the range 0..0 means the whole file.
            check(unsafe { libc::sync_file_range(file.as_raw_fd(), 0, 0, how) })
        });
        match written {
            Some(Err(e)) if !matches!(e.raw_os_error(), Some(libc::ESTALE | libc::ENOENT)) => {
                tracing::warn!("could not write node {node}'s cached pages back: {e}");
            }
            _ => {}
        }
    }

    /// Makes the kernel's size and mtime of `node` the host's, if the kernel holds it as a
    /// regular file. Runs on the fixing thread, never on a FUSE handler's. Returns when to
    /// try again, if it must be.
    fn fix(&self, node: NodeId) -> Option<Duration> {
        let generation = self.generation(node)?;
        let outcome = self.apply(node, generation, true);
        tracing::trace!(%node, ?outcome, "fix");
        self.account(node, outcome)
    }

    /// Counts a fix's `outcome` in `tether status`; returns when to try again, if it must
    /// be.
    fn account(&self, node: NodeId, outcome: io::Result<Fix>) -> Option<Duration> {
        let (counter, again) = match outcome {
            Ok(Fix::Nothing) => return None,
            Ok(Fix::Done) => (&self.counters.fixed, None),
            Ok(Fix::Forgotten) => (&self.counters.forgotten, None),
            Ok(Fix::Overtaken) => (&self.counters.overtaken, Some(RETRY_AFTER)),
            Ok(Fix::Busy) => (&self.counters.busy, Some(RETRY_BUSY_AFTER)),
            // The kernel no longer holds the inode: the next lookup reads fresh attributes.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ESTALE | libc::ENOENT)) => return None,
            Err(e) => {
                tracing::warn!("could not bring node {node}'s size and mtime up to date: {e}");
                (&self.counters.failed, None)
            }
        };
        counter.fetch_add(1, Ordering::Relaxed);
        again
    }

    /// The whole fix runs inside `MountDir::with`, so an unmount waits for the file to be
    /// closed (it failed with EBUSY when a fix ran then).
    fn apply(&self, node: NodeId, generation: u32, forget: bool) -> io::Result<Fix> {
        self.dir
            .with(|root| self.apply_on(root, node, generation, forget))
            .unwrap_or_else(|| Err(io::Error::from_raw_os_error(libc::ESTALE)))
    }

    /// `forget`: first try to have the kernel forget the file (below).
    fn apply_on(
        &self,
        root: BorrowedFd<'_>,
        node: NodeId,
        generation: u32,
        forget: bool,
    ) -> io::Result<Fix> {
        // For reading: a descriptor open for writing would make an exec of the file fail
        // with ETXTBSY while the fix runs, and its close would tell the guest's watchers of
        // a write (IN_CLOSE_WRITE) that the replay of the host's change already reported.
        // An inode nobody uses is forgotten by the kernel as soon as its names are dropped
        // (FUSE keeps no unused inodes), and the next lookup makes it anew with the host's
        // size and mtime: no write access, no events for the guest's watchers. Only a file
        // still in use (open, mapped, running) needs the steps below.
        if let Some((notifier, known)) = self.session.get().filter(|_| forget) {
            if let Some((parent, name)) = known.place_of(node) {
                let _ = notifier.inval_entry(ino_of(parent), OsStr::from_bytes(&name));
            }
        }
        let file = match open_by_node(root, node, generation) {
            Err(e) if e.raw_os_error() == Some(libc::ESTALE) => return Ok(Fix::Forgotten),
            file => file?,
        };
        let before = kernel_size_and_mtime(file.as_fd())?;
        // The guest's own unwritten data and mtime go to the server first (the client
        // answers this FSYNC itself: no disk flush on the host), so that the host's
        // attributes include them.
        // SAFETY: a descriptor we own.
        check(unsafe { libc::fsync(file.as_raw_fd()) })?;
        let me = Caller {
            uid: 0,
            gid: 0,
            pid: tid() as u32,
        };
        let host = match self
            .conn
            .call_wait(me, &Request::Getattr { node, fh: None })
        {
            Ok(Reply::Attr(a)) if a.mode & libc::S_IFMT == libc::S_IFREG => a,
            _ => return Ok(Fix::Nothing), // gone, or no longer a file: its name invalidation follows
        };
        // A guest write since `before` may not be in `host`: the steps below would undo it.
        // Each step checks again under the inode lock (`still_as_decided`).
        let (size, mtime) = kernel_size_and_mtime(file.as_fd())?;
        if (size, mtime) != before {
            return Ok(Fix::Overtaken);
        }
        if (size, mtime) == (host.size, (host.mtime.sec, host.mtime.nsec)) {
            return Ok(Fix::Nothing);
        }
        if size != host.size {
            if host.mode & 0o111 != 0 {
                // Truncating takes write access for a moment, and an exec of the file in
                // that moment fails with ETXTBSY: wait until nobody uses it.
                return Ok(Fix::Busy);
            }
            // The handler answers with the host's attributes, whose size the kernel takes.
            // By path, through the descriptor: no descriptor open for writing (above).
            let path = CString::new(format!("/proc/self/fd/{}", file.as_raw_fd()))
                .expect("no NUL in a number");
            let truncated = self.step(&file, before, || {
                // SAFETY: a valid C string.
                unsafe { libc::truncate(path.as_ptr(), host.size as libc::off_t) }
            })?;
            if truncated == Fix::Overtaken {
                return Ok(truncated);
            }
        }
        // After the truncation too, which set the kernel's mtime to now.
        let now = kernel_size_and_mtime(file.as_fd())?;
        let times = [
            libc::timespec {
                tv_sec: 0,
                tv_nsec: libc::UTIME_OMIT,
            },
            libc::timespec {
                tv_sec: host.mtime.sec as libc::time_t,
                tv_nsec: host.mtime.nsec as libc::c_long,
            },
        ];
        self.step(&file, now, || {
            // SAFETY: a descriptor we own and two valid timespecs.
            unsafe { libc::futimens(file.as_raw_fd(), times.as_ptr()) }
        })
    }

    /// Runs one fix step (a truncate or utimens of `file`) whose SETATTR the handlers
    /// answer with the host's attributes, if the kernel's size and mtime are still
    /// `decided_on` when it arrives (else the handler answers EAGAIN: `Overtaken`).
    fn step(
        &self,
        file: &OwnedFd,
        decided_on: KernelAttrs,
        call: impl FnOnce() -> libc::c_int,
    ) -> io::Result<Fix> {
        let expected = Expected {
            fd: file.as_raw_fd(),
            attrs: decided_on,
        };
        self.restating.insert(tid(), expected);
        let r = check(call());
        self.restating.remove(&tid());
        match r {
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => Ok(Fix::Overtaken),
            r => r.map(|()| Fix::Done),
        }
    }
}

fn check(r: libc::c_int) -> io::Result<()> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Opens for reading the inode the kernel holds for `node`, through FUSE's own file handle
/// format; ESTALE when the kernel does not hold it (we do not ask for export support, so
/// the kernel never looks a handle up on the server).
fn open_by_node(mount_fd: BorrowedFd<'_>, node: NodeId, generation: u32) -> io::Result<OwnedFd> {
    #[repr(C)]
    struct Handle {
        bytes: u32,
        kind: i32,
        words: [u32; 3],
    }
    let mut h = Handle {
        bytes: 12,
        kind: FUSE_FILEID_INO64_GEN,
        // FUSE's handle format: the inode number (the node id), high half first.
        words: [(node.get() >> 32) as u32, node.get() as u32, generation],
    };
    let flags = libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC;
    // SAFETY: `h` is laid out as struct file_handle with 12 bytes of handle.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_by_handle_at,
            mount_fd.as_raw_fd(),
            &mut h as *mut Handle,
            flags,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// The size and mtime the kernel holds, without asking the server.
fn kernel_size_and_mtime(file: BorrowedFd<'_>) -> io::Result<KernelAttrs> {
    let flags = libc::AT_EMPTY_PATH | libc::AT_STATX_DONT_SYNC;
    let mask = libc::STATX_SIZE | libc::STATX_MTIME;
    let stx = crate::sys::statx(file.as_raw_fd(), c"", flags, mask)?;
    Ok((stx.stx_size, (stx.stx_mtime.tv_sec, stx.stx_mtime.tv_nsec)))
}
