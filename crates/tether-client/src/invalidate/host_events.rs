//! Inotify events in the guest for changes made on the host.
//!
//! No FUSE notification makes the guest kernel raise an inotify event (FUSE-FACTS.md), but
//! operations made through the mount do, even when the file system treats them as no-ops.
//! So for each host change the server reports (a [`HostEvent`]), the client's invalidation
//! thread *replays* it: it makes the same kind of change through the mount (mknod, unlink,
//! rename, truncate to the current size, chmod to the current mode, open for writing and
//! close), and the FUSE handlers recognise the replaying thread's requests by its thread id
//! and answer them without changing anything on the host: a creation is answered with the
//! entry that already exists, a removal or rename with success, a setattr with the current
//! attributes. The guest kernel then raises exactly the events the local change would have,
//! in every watcher's queue, and its dentries follow the host as a side effect.
//!
//! Replays happen only where someone in the guest watches (a scan of the inotify and
//! fanotify marks in /proc/*/fdinfo on this mount's device), so nothing is done when nobody
//! watches.
//!
//! Replays run late: after the host's later changes, and after the guest may have looked
//! the names up again (their invalidations do not wait for ever) or changed them itself.
//! A replay acts by name, so it must never act on what the guest has cached under the name
//! (moving such a dentry to the new name bound that name to another file, for good). So
//! the names a replay changes are invalidated before it, and their directories held (no
//! reply about their entries is cached meanwhile), so that the kernel looks them up from
//! the replaying thread and gets the state before the host's change; every answer about
//! them has a TTL of 0 and never names another file than the event's (a ghost instead),
//! and the names are invalidated again after the replay, so that nothing it left outlives
//! it: the next lookup of those names asks the host.

use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use fuser::Notifier;
use tether_proto::{changed, Attr, EventKind, HostEvent, NodeId};

use crate::kernel_ids::{ino_of, node_of_st_ino};
use crate::rpc::Connection;

/// Node ids from here up are ghosts: entries invented for the replaying thread to remove
/// (the host already removed them). Server ids stay below (foreign ids count up from 2^63).
pub const GHOST_BASE: NodeId = NodeId::new(0xC000_0000_0000_0000);

/// Most bytes of host events waiting for replay. A watcher's own inotify queue holds 16,384
/// events by default (fs.inotify.max_queued_events), so a watcher that falls that far
/// behind gets IN_Q_OVERFLOW from its kernel long before this.
pub const MAX_BACKLOG_BYTES: usize = 64 << 20;

/// How often a replay that raced with a guest lookup is retried after dropping the name.
const RETRIES: usize = 3;

/// What a lookup by the replaying thread must find, so that its operation goes through.
///
/// Every answer is for the replay alone: given with a TTL of 0, so that the kernel asks
/// again before anyone else uses it, and the names are invalidated again after the replay
/// (see `Replayer::with_names`).
#[derive(Debug, Clone)]
pub enum ReplayLookup {
    /// The name must look absent: it is a rename's target.
    Absent,
    /// The name must look absent, then be created as `node` of type `file_type`: the
    /// creation answers with that node if the host still has it under the name, else
    /// (or if `node` is unknown) with a ghost.
    Created {
        node: Option<NodeId>,
        file_type: u32,
    },
    /// The name must look present, as a ghost of type `file_type`: it is being removed
    /// (the host already removed it).
    Removed { file_type: u32 },
    /// The name must look present, as `node` if the host now has it under (`dir`,
    /// `name`), else (or if `node` is unknown) as a ghost of type `file_type`: it is a
    /// rename's source.
    Renamed {
        dir: NodeId,
        name: Bytes,
        node: Option<NodeId>,
        file_type: u32,
    },
}

impl ReplayLookup {
    /// The lookup finds nothing under the name.
    pub fn absent(&self) -> bool {
        matches!(self, ReplayLookup::Absent | ReplayLookup::Created { .. })
    }
}

#[derive(Default)]
struct Armed {
    names: Vec<(NodeId, Bytes, ReplayLookup)>,
    /// The replayed unlink, rmdir or rename is to be answered ESTALE once (see
    /// [`Replayer::revalidate_first`]).
    revalidate: bool,
}

/// What a replayed change of names does with what the kernel caches under its names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cached {
    /// Dropped before the operation, and looked up again by the operation itself under
    /// the directory locks (the first attempt is answered ESTALE: the kernel then tries
    /// again with LOOKUP_REVAL): a removal or a rename, which would otherwise act on a
    /// dentry a guest operation put under the name in between.
    Revalidated,
    /// Dropped before the operation: a creation (the kernel revalidates the name it
    /// creates anyway).
    Dropped,
    /// Kept: the removal of the very file the host removed ([`removed_for_good`]).
    Kept,
}

#[derive(Default)]
pub struct ReplayCounters {
    /// Host events replayed into the guest.
    pub replayed: AtomicU64,
    /// Host events nobody in the guest watched.
    pub unwatched: AtomicU64,
    /// Replays that failed (the guest's view had moved on); their events are lost.
    pub failed: AtomicU64,
    /// Host events dropped because the backlog was full.
    pub dropped: AtomicU64,
}

/// Host events waiting for replay, bounded in bytes.
#[derive(Default)]
pub struct Backlog {
    events: VecDeque<HostEvent>,
    bytes: usize,
}

impl Backlog {
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    fn pop(&mut self) -> Option<HostEvent> {
        let ev = self.events.pop_front()?;
        self.bytes -= event_bytes(&ev);
        Some(ev)
    }
}

fn event_bytes(ev: &HostEvent) -> usize {
    let from = match &ev.kind {
        EventKind::Moved {
            from_path,
            from_name,
            ..
        } => from_path.len() + from_name.len(),
        _ => 0,
    };
    std::mem::size_of::<HostEvent>() + ev.dir_path.len() + ev.name.len() + from
}

/// The same event, owning its bytes (decoded events share their whole push frame).
fn detached(ev: HostEvent) -> HostEvent {
    let own = |b: &Bytes| Bytes::copy_from_slice(b);
    HostEvent {
        dir_path: own(&ev.dir_path),
        name: own(&ev.name),
        kind: match &ev.kind {
            EventKind::Moved {
                from_dir,
                from_path,
                from_name,
            } => EventKind::Moved {
                from_dir: *from_dir,
                from_path: own(from_path),
                from_name: own(from_name),
            },
            k => k.clone(),
        },
        ..ev
    }
}

/// The mount's device: as stat reports it, and in the kernel's own encoding
/// (major << 20 | minor), which is how fdinfo prints a mark's device.
#[derive(Clone, Copy)]
struct MountDev {
    dev: u64,
    kdev: u64,
}

pub struct Replayer {
    mountpoint: PathBuf,
    /// Thread id of the replaying thread (0 until it starts).
    tid: AtomicI32,
    armed: Mutex<Armed>,
    /// Some names are armed: their directories are held (see [`Replayer::holds`]).
    holding: AtomicBool,
    next_ghost: AtomicU64,
    dev: OnceLock<Option<MountDev>>,
    /// Which descriptors of which process are inotify or fanotify groups, from the last
    /// scan (only the replaying thread scans).
    watcher_fds: Mutex<WatcherFds>,
    /// The server, to leave its process out of scans when it runs on this machine.
    server: OnceLock<Arc<Connection>>,
    pub counters: ReplayCounters,
}

impl Replayer {
    pub fn new(mountpoint: &Path) -> Replayer {
        Replayer {
            server: OnceLock::new(),
            mountpoint: mountpoint.to_path_buf(),
            tid: AtomicI32::new(0),
            armed: Mutex::new(Armed::default()),
            holding: AtomicBool::new(false),
            next_ghost: AtomicU64::new(GHOST_BASE.get()),
            dev: OnceLock::new(),
            watcher_fds: Mutex::default(),
            counters: ReplayCounters::default(),
        }
    }

    /// The connection to the server, whose process scans leave out.
    pub fn set_server(&self, conn: Arc<Connection>) {
        let _ = self.server.set(conn);
    }

    /// Called on the replaying thread before its first replay.
    pub fn bind_to_current_thread(&self) {
        // SAFETY: gettid has no preconditions.
        self.tid.store(unsafe { libc::gettid() }, Ordering::Relaxed);
    }

    /// True for requests the replaying thread caused (FUSE reports the caller's thread id).
    pub fn is_replay(&self, pid: u32) -> bool {
        let tid = self.tid.load(Ordering::Relaxed);
        tid != 0 && pid as i32 == tid
    }

    /// What the replaying thread's lookup of `name` in `parent` must find; None for a name
    /// it only passes through (answered as usual).
    pub fn lookup(&self, parent: NodeId, name: &[u8]) -> Option<ReplayLookup> {
        let armed = self.armed.lock().unwrap();
        armed
            .names
            .iter()
            .find(|(p, n, _)| *p == parent && n.as_ref() == name)
            .map(|(_, _, l)| l.clone())
    }

    /// For the replayed unlink, rmdir or rename: true the first time within a replay that
    /// asks for it (the handler answers ESTALE, and the kernel tries once more with
    /// LOOKUP_REVAL, looking every name up again under the directory locks); false after.
    pub fn revalidate_first(&self) -> bool {
        std::mem::take(&mut self.armed.lock().unwrap().revalidate)
    }

    /// True while a replay changes names in directory `dir`: no reply about an entry of
    /// `dir` may then be cached (Coherence::fresh), so that the replay's own lookups, not
    /// an answer given to someone else meanwhile, decide what its operation acts on.
    pub fn holds(&self, dir: NodeId) -> bool {
        self.holding.load(Ordering::Acquire)
            && self
                .armed
                .lock()
                .unwrap()
                .names
                .iter()
                .any(|(p, _, _)| *p == dir)
    }

    /// Attributes of a ghost: a fresh id, so the kernel never confuses it with a real node.
    pub fn ghost(&self, file_type: u32) -> Attr {
        // Counted up from GHOST_BASE, as a server counts its ids.
        let ino = NodeId::new(self.next_ghost.fetch_add(1, Ordering::Relaxed));
        let dir = file_type == libc::S_IFDIR;
        Attr {
            mode: file_type | if dir { 0o755 } else { 0o644 },
            nlink: if dir { 2 } else { 1 },
            blksize: 4096,
            ..Attr::of(ino)
        }
    }

    /// Queues `events` for replay, unless that would take the backlog past
    /// [`MAX_BACKLOG_BYTES`]: then those events are dropped (and counted).
    pub fn admit(&self, backlog: &mut Backlog, events: Vec<HostEvent>) {
        for ev in events {
            let ev = detached(ev);
            let size = event_bytes(&ev);
            if backlog.bytes + size > MAX_BACKLOG_BYTES {
                if self.counters.dropped.fetch_add(1, Ordering::Relaxed) == 0 {
                    tracing::warn!(
                        "more than {} MiB of host changes wait to be replayed as inotify \
                         events: dropping some (see `tether status`)",
                        MAX_BACKLOG_BYTES >> 20
                    );
                }
                continue;
            }
            backlog.bytes += size;
            backlog.events.push_back(ev);
        }
    }

    /// Replays events from the front of `backlog`, where the guest watches, for about
    /// `slice` (at least one); `notifier` drops a stale name when a guest lookup raced with
    /// the replay. Watches are read once per call, after the events arrived.
    pub fn replay(&self, backlog: &mut Backlog, notifier: &Notifier, slice: Duration) {
        let Some(dev) = *self.dev.get_or_init(|| self.mount_dev()) else {
            *backlog = Backlog::default();
            return;
        };
        let start = Instant::now();
        // A server on this machine (tests, containers) holds a descriptor per node, and
        // watches only the host's directories.
        let server_pid = self.server.get().and_then(|c| c.local_server_pid());
        let not_guests = [Some(std::process::id()), server_pid];
        let mut fds = self.watcher_fds.lock().unwrap();
        let watches = GuestWatches::scan(dev.kdev, &not_guests, &mut fds);
        drop(fds);
        tracing::trace!(
            target: "tether::lat",
            us = start.elapsed().as_micros() as u64,
            empty = watches.is_empty(),
            "replay: scanned guest watchers"
        );
        // Reading every process's descriptors can take milliseconds (a process with 10,000
        // files open): keep scans to a tenth of the time in a long backlog.
        let slice = slice.max(start.elapsed() * 10);
        while let Some(ev) = backlog.pop() {
            if let Err(e) = self.replay_watched(&ev, &watches, dev, notifier) {
                tracing::debug!("cannot open the mount root to replay host events: {e}");
                *backlog = Backlog::default();
                return;
            }
            if start.elapsed() >= slice {
                break;
            }
        }
    }

    /// Replays `ev` if the guest watches it; an error only if the mount root cannot be
    /// opened.
    fn replay_watched(
        &self,
        ev: &HostEvent,
        watches: &GuestWatches,
        dev: MountDev,
        notifier: &Notifier,
    ) -> io::Result<()> {
        let from_dir = match &ev.kind {
            EventKind::Moved { from_dir, .. } => Some(*from_dir),
            EventKind::Changed(0) => return Ok(()), // nothing to raise
            _ => None,
        };
        let watched = watches.covers(ev.dir)
            || ev.node.is_some_and(|n| watches.covers(n))
            || from_dir.is_some_and(|d| watches.covers(d));
        if !watched {
            self.counters.unwatched.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        // The mount root, opened for this event only: an open file keeps the mount busy,
        // and an unmount should not fail because replays are under way.
        let root = self.open_root(dev)?;
        for attempt in 0..=RETRIES {
            match self.replay_one(ev, &root, dev, notifier) {
                Ok(()) => {
                    self.counters.replayed.fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
                // A change of names raced with a guest operation on the same name between
                // the invalidation of the names (at every attempt) and the replay: again.
                // (A change of content that finds the name missing or showing another
                // file is late: the host has renamed the file since, and every name the
                // replays before it touched has been looked up again.)
                Err(e)
                    if attempt < RETRIES
                        && !matches!(ev.kind, EventKind::Changed(_))
                        && matches!(
                            e.raw_os_error(),
                            Some(libc::EEXIST | libc::ENOENT | libc::ENOTEMPTY)
                        ) => {}
                Err(e) => {
                    tracing::debug!(?ev, "replaying a host change failed: {e}");
                    break;
                }
            }
        }
        self.counters.failed.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Runs `op`, one replayed change of names, with `names` armed: the replaying thread's
    /// lookups of them find the state before the host's change ([`ReplayLookup`]), each
    /// answer with a TTL of 0.
    ///
    /// A replay runs late (after the host's later changes, after the guest may have looked
    /// the names up again or changed them itself) and acts by name on whatever the kernel
    /// has cached under them. So the names are invalidated before `op`, and their
    /// directories held until after it (no reply about their entries is cached meanwhile):
    /// `op` can act only on the replay's own answers, never on a dentry that is the guest's
    /// view of a newer state (moving that one to the new name bound the name to another
    /// file). And the names are invalidated again after `op`, so that nothing it left (the
    /// dentry it moved, the ghost it removed) outlives the replay: the next lookup of
    /// either name asks the host.
    ///
    /// The invalidation before `op` still leaves a moment in which a guest operation (a
    /// rename onto the name) can put a dentry of its own there, so a removal or rename
    /// also has the kernel look its names up again within the operation ([`Cached`]).
    fn with_names(
        &self,
        names: Vec<(NodeId, Bytes, ReplayLookup)>,
        cached: Cached,
        notifier: &Notifier,
        op: impl FnOnce() -> io::Result<()>,
    ) -> io::Result<()> {
        let touched: Vec<(NodeId, Bytes)> = names.iter().map(|(d, n, _)| (*d, n.clone())).collect();
        {
            let mut armed = self.armed.lock().unwrap();
            armed.names = names;
            armed.revalidate = cached == Cached::Revalidated;
            self.holding.store(true, Ordering::Release);
        }
        // Never while holding `armed`: the kernel may have to wait for a lookup reply,
        // whose TTL the RPC reader thread decides with `holds`.
        let invalidate = || {
            for (dir, name) in &touched {
                let _ = notifier.inval_entry(ino_of(*dir), OsStr::from_bytes(name));
            }
        };
        if cached != Cached::Kept {
            invalidate();
        }
        let result = op();
        invalidate();
        let mut armed = self.armed.lock().unwrap();
        armed.names.clear();
        armed.revalidate = false;
        self.holding.store(false, Ordering::Release);
        result
    }

    fn open_root(&self, dev: MountDev) -> io::Result<OwnedFd> {
        let path = cpath(&self.mountpoint)?;
        let root = openat(libc::AT_FDCWD, &path, libc::O_PATH | libc::O_DIRECTORY)?;
        let st = fstat(&root)?;
        if st.st_dev != dev.dev || node_of_st_ino(st.st_ino) != tether_proto::ROOT_NODE {
            return Err(io::Error::other(
                "the mount point no longer shows this mount",
            ));
        }
        Ok(root)
    }

    /// Opens directory `dir_path` (from the server) below the mount root one component at
    /// a time, never following a symlink or leaving the mount, and checks that it is node
    /// `dir`: a replay acts on that directory of this mount or not at all, whatever the
    /// host (or a hostile server) did to the path meanwhile.
    fn open_dir(
        &self,
        root: &OwnedFd,
        dev: MountDev,
        dir_path: &[u8],
        dir: NodeId,
    ) -> io::Result<OwnedFd> {
        let mut fd = openat(root.as_raw_fd(), c".", libc::O_PATH | libc::O_DIRECTORY)?;
        if !dir_path.is_empty() {
            for part in dir_path.split(|&b| b == b'/') {
                let part = component(part)?;
                fd = openat(
                    fd.as_raw_fd(),
                    &part,
                    libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW,
                )?;
            }
        }
        let st = fstat(&fd)?;
        if st.st_dev != dev.dev || node_of_st_ino(st.st_ino) != dir {
            return Err(io::Error::from_raw_os_error(libc::ESTALE));
        }
        Ok(fd)
    }

    fn replay_one(
        &self,
        ev: &HostEvent,
        root: &OwnedFd,
        dev: MountDev,
        notifier: &Notifier,
    ) -> io::Result<()> {
        let dir = self.open_dir(root, dev, &ev.dir_path, ev.dir)?;
        let name = component(&ev.name)?;
        let d = dir.as_raw_fd();
        match &ev.kind {
            EventKind::Created => {
                let created = ReplayLookup::Created {
                    node: ev.node,
                    file_type: ev.file_type,
                };
                self.with_names(
                    vec![(ev.dir, ev.name.clone(), created)],
                    Cached::Dropped,
                    notifier,
                    || {
                        // SAFETY (all three): valid descriptor and C strings.
                        check(match ev.file_type {
                            libc::S_IFDIR => unsafe { libc::mkdirat(d, name.as_ptr(), 0o755) },
                            // The target is not used: the handler answers with the host's symlink.
                            libc::S_IFLNK => unsafe {
                                libc::symlinkat(c".".as_ptr(), d, name.as_ptr())
                            },
                            t => unsafe { libc::mknodat(d, name.as_ptr(), t | 0o644, 0) },
                        })
                    },
                )
            }
            EventKind::Deleted => {
                let removed = ReplayLookup::Removed {
                    file_type: ev.file_type,
                };
                let flags = if ev.file_type == libc::S_IFDIR {
                    libc::AT_REMOVEDIR
                } else {
                    0
                };
                // Watchers of the removed file itself hear it go (IN_ATTRIB, IN_DELETE_SELF)
                // only if the removal acts on that file, not on a ghost.
                let cached = if removed_for_good(d, &name) {
                    Cached::Kept
                } else {
                    Cached::Revalidated
                };
                self.with_names(
                    vec![(ev.dir, ev.name.clone(), removed)],
                    cached,
                    notifier,
                    || {
                        // SAFETY: valid descriptor and C string.
                        check(unsafe { libc::unlinkat(d, name.as_ptr(), flags) })
                    },
                )
            }
            EventKind::Moved {
                from_dir,
                from_path,
                from_name,
            } => {
                let from = self.open_dir(root, dev, from_path, *from_dir)?;
                let from_c = component(from_name)?;
                let source = ReplayLookup::Renamed {
                    dir: ev.dir,
                    name: ev.name.clone(),
                    node: ev.node,
                    file_type: ev.file_type,
                };
                let names = vec![
                    (*from_dir, from_name.clone(), source),
                    (ev.dir, ev.name.clone(), ReplayLookup::Absent),
                ];
                self.with_names(names, Cached::Revalidated, notifier, || {
                    // SAFETY: valid descriptors and C strings.
                    check(unsafe {
                        libc::renameat(from.as_raw_fd(), from_c.as_ptr(), d, name.as_ptr())
                    })
                })
            }
            EventKind::Changed(bits) => replay_change(d, &name, *bits, ev.node),
        }
    }

    fn mount_dev(&self) -> Option<MountDev> {
        match std::fs::metadata(&self.mountpoint) {
            Ok(m) => Some(MountDev {
                dev: m.dev(),
                kdev: kernel_dev(m.dev()),
            }),
            Err(e) => {
                tracing::warn!(
                    "cannot stat the mount point ({e}): no inotify events for host changes"
                );
                None
            }
        }
    }
}

/// A name from the server, checked: one path component.
fn component(name: &[u8]) -> io::Result<CString> {
    if !tether_proto::is_component(name) {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    Ok(CString::new(name).expect("a component has no NUL"))
}

fn cpath(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn openat(dir: libc::c_int, name: &CStr, flags: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: valid C string; the descriptor is owned below.
    let fd = unsafe { libc::openat(dir, name.as_ptr(), flags | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn fstat(fd: &OwnedFd) -> io::Result<libc::stat> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: valid descriptor and writable buffer.
    check(unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) })?;
    // SAFETY: fstat succeeded.
    Ok(unsafe { st.assume_init() })
}

/// Whether the kernel has `name` in `dir` as a file that the host has removed for good
/// (its link count is 0, asked of the host): a replayed removal may then act on it, so
/// that watchers of the file itself hear it go. Nothing cached (the lookup asks the host,
/// which has no such name), a file the host still has under some name, an error: false,
/// and the removal acts on a ghost.
fn removed_for_good(dir: libc::c_int, name: &CStr) -> bool {
    let flags = libc::AT_SYMLINK_NOFOLLOW | libc::AT_STATX_FORCE_SYNC;
    crate::sys::statx(dir, name, flags, libc::STATX_NLINK)
        .is_ok_and(|stx| stx.stx_mask & libc::STATX_NLINK != 0 && stx.stx_nlink == 0)
}

/// Raises IN_OPEN, IN_MODIFY, IN_ATTRIB and IN_CLOSE_WRITE (as `bits` say, in the order a
/// local writer raises them) for `name` in directory `dir`, with operations that leave it
/// as it is and never follow a symlink: open for writing; set the mtime to itself (setting
/// the mtime alone is IN_MODIFY to inotify); set both times to themselves (IN_ATTRIB);
/// close. Only the open takes write access, and it is skipped for executable files: even a
/// moment of it would make a concurrent exec of the file fail with ETXTBSY. Nothing is
/// raised (ESTALE) if the name no longer shows the changed file `node` (if known).
fn replay_change(dir: libc::c_int, name: &CStr, bits: u8, node: Option<NodeId>) -> io::Result<()> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: valid descriptor, C string and writable buffer.
    check(unsafe {
        libc::fstatat(
            dir,
            name.as_ptr(),
            st.as_mut_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    // SAFETY: fstatat succeeded.
    let st = unsafe { st.assume_init() };
    if node.is_some_and(|n| node_of_st_ino(st.st_ino) != n) {
        return Err(io::Error::from_raw_os_error(libc::ESTALE));
    }
    let regular = st.st_mode & libc::S_IFMT == libc::S_IFREG;
    let executable = st.st_mode & 0o111 != 0;
    let writer = if bits & changed::CLOSE_WRITE != 0 && regular && !executable {
        Some(openat(
            dir,
            name,
            libc::O_WRONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK,
        )?)
    } else {
        None
    };
    let atime = libc::timespec {
        tv_sec: st.st_atime,
        tv_nsec: st.st_atime_nsec,
    };
    let mtime = libc::timespec {
        tv_sec: st.st_mtime,
        tv_nsec: st.st_mtime_nsec,
    };
    let omit = libc::timespec {
        tv_sec: 0,
        tv_nsec: libc::UTIME_OMIT,
    };
    let set_times = |times: [libc::timespec; 2]| {
        // SAFETY: valid descriptor, C string and two timespecs.
        check(unsafe {
            libc::utimensat(
                dir,
                name.as_ptr(),
                times.as_ptr(),
                libc::AT_SYMLINK_NOFOLLOW,
            )
        })
    };
    if bits & changed::MODIFY != 0 {
        set_times([omit, mtime])?;
    }
    if bits & changed::ATTRIB != 0 {
        set_times([atime, mtime])?;
    }
    drop(writer); // IN_CLOSE_WRITE
    Ok(())
}

/// The kernel's own number for device `dev` (as `stat` gives it), as /proc/*/fdinfo shows
/// it in `sdev:`.
fn kernel_dev(dev: u64) -> u64 {
    let major = ((dev >> 32) & 0xffff_f000) | ((dev >> 8) & 0xfff);
    let minor = ((dev >> 12) & 0xffff_ff00) | (dev & 0xff);
    (major << 20) | minor
}

/// Processes with fewer descriptors have them all read at every scan.
const KEEP_FDS_FROM: u64 = 512;

/// The inotify and fanotify descriptors of each process, with its count of descriptors
/// when they were found.
#[derive(Default)]
pub struct WatcherFds {
    by_pid: HashMap<u32, (u64, Vec<u32>)>,
}

/// The descriptors in `fd_dir` (/proc/PID/fd) that are inotify or fanotify groups.
fn watcher_fds_of(fd_dir: &Path) -> Vec<u32> {
    let Ok(fds) = std::fs::read_dir(fd_dir) else {
        return Vec::new();
    };
    fds.flatten()
        .filter(|fd| {
            std::fs::read_link(fd.path()).is_ok_and(|t| {
                let t = t.as_os_str().as_bytes();
                t == b"anon_inode:inotify" || t == b"anon_inode:[fanotify]"
            })
        })
        .filter_map(|fd| fd.file_name().to_str()?.parse().ok())
        .collect()
}

/// The inodes of one mount that processes in the guest watch.
pub struct GuestWatches {
    inodes: HashSet<NodeId>,
    /// A mark on the whole file system or mount (fanotify).
    everything: bool,
}

impl GuestWatches {
    pub fn covers(&self, node: NodeId) -> bool {
        self.everything || self.inodes.contains(&node)
    }

    pub fn is_empty(&self) -> bool {
        !self.everything && self.inodes.is_empty()
    }

    /// Reads every inotify and fanotify mark of every process (but `not_guests`) on device
    /// `kdev`. The kernel's inode numbers on a Tether mount are the node ids.
    ///
    /// Finding a process's watcher descriptors means reading the link of every descriptor
    /// it has: 60 ms for two processes with 6,000 each (a server on the same machine holds
    /// one per node), and every batch of host changes waited for it. So `fds` keeps each
    /// process's watcher descriptors with its count of descriptors (the size of
    /// /proc/PID/fd, Linux 6.2), and a process with many whose count did not change is
    /// not read again.
    pub fn scan(kdev: u64, not_guests: &[Option<u32>], fds: &mut WatcherFds) -> GuestWatches {
        let mut found = GuestWatches {
            inodes: HashSet::new(),
            everything: false,
        };
        let Ok(procs) = std::fs::read_dir("/proc") else {
            return found;
        };
        let mut seen = HashMap::new();
        for p in procs.flatten() {
            let Some(pid) = p.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            if not_guests.contains(&Some(pid)) {
                continue;
            }
            // A kernel thread (no memory map: no /proc/PID/exe) has no descriptors. One
            // readlink says so, where reading its empty descriptor directory takes five
            // system calls, and most processes of a small guest are kernel threads: in a
            // one-vCPU TCG guest each scan took about 20 ms, a third of the vCPU while the
            // host edited a file every 30 ms (bench/journal/2026-11-29-vm-push-latency.md).
            // (A zombie has none either; another user's process, unreadable, is read.)
            if std::fs::read_link(p.path().join("exe"))
                .is_err_and(|e| e.kind() == io::ErrorKind::NotFound)
            {
                continue;
            }
            let fd_dir = p.path().join("fd");
            // 0 where the kernel does not count them: read every time.
            let Ok(count) = std::fs::metadata(&fd_dir).map(|m| m.len()) else {
                continue;
            };
            // Only many descriptors are worth keeping: a process that closed one and made
            // a watcher in its place keeps its count, and few are quickly read again.
            let watchers = match fds.by_pid.remove(&pid) {
                Some((c, w)) if c == count && count >= KEEP_FDS_FROM => w,
                _ => watcher_fds_of(&fd_dir),
            };
            for fd in &watchers {
                let info = p.path().join("fdinfo").join(fd.to_string());
                if let Ok(text) = std::fs::read_to_string(info) {
                    found.add_marks(&text, kdev);
                }
            }
            seen.insert(pid, (count, watchers));
        }
        fds.by_pid = seen;
        found
    }

    /// Parses the mark lines of one fdinfo file:
    /// `inotify wd:1 ino:2a sdev:2e mask:...`, `fanotify ino:2a sdev:2e ...` (inode mark),
    /// `fanotify sdev:2e ...` (file system mark), `fanotify mnt_id:..` (mount mark).
    fn add_marks(&mut self, text: &str, kdev: u64) {
        for line in text.lines() {
            let Some(rest) = line
                .strip_prefix("inotify ")
                .or_else(|| line.strip_prefix("fanotify "))
            else {
                continue;
            };
            let field = |key: &str| {
                rest.split_whitespace()
                    .find_map(|f| f.strip_prefix(key))
                    .and_then(|v| u64::from_str_radix(v, 16).ok())
            };
            if field("mnt_id:").is_some() {
                self.everything = true;
                continue;
            }
            if field("sdev:") != Some(kdev) {
                continue;
            }
            match field("ino:") {
                Some(ino) => {
                    self.inodes.insert(node_of_st_ino(ino));
                }
                None => self.everything = true,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A watch added after a scan is found by the next one, through the kept list of a
    /// process's watcher descriptors or a new read of them when its count changed.
    #[test]
    fn scans_find_watches_added_since_the_last_one() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let meta = std::fs::metadata(dir.path()).unwrap();
        let kdev = kernel_dev(meta.dev());
        let watch = |path: &Path| {
            // SAFETY: plain syscalls on a new descriptor.
            let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
            assert!(fd >= 0);
            let c = CString::new(path.as_os_str().as_bytes()).unwrap();
            // SAFETY: a valid descriptor and C string.
            assert!(unsafe { libc::inotify_add_watch(fd, c.as_ptr(), libc::IN_MODIFY) } >= 0);
            // SAFETY: a new descriptor we own.
            unsafe { OwnedFd::from_raw_fd(fd) }
        };
        let mut fds = WatcherFds::default();
        let first = watch(dir.path());
        let found = GuestWatches::scan(kdev, &[], &mut fds);
        assert!(found.covers(NodeId::new(meta.ino())), "the first watch");
        // A second watch through the same descriptor: the process's count is unchanged.
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let sub = std::fs::metadata(dir.path().join("sub")).unwrap().ino();
        let c = CString::new(dir.path().join("sub").as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid descriptor and C string.
        let wd = unsafe { libc::inotify_add_watch(first.as_raw_fd(), c.as_ptr(), libc::IN_MODIFY) };
        assert!(wd >= 0);
        assert!(
            GuestWatches::scan(kdev, &[], &mut fds).covers(NodeId::new(sub)),
            "a watch added later"
        );
        // A new watcher descriptor changes the count: read again.
        let other = tempfile::tempdir_in(dir.path()).unwrap();
        let _second = watch(other.path());
        let ino = std::fs::metadata(other.path()).unwrap().ino();
        assert!(
            GuestWatches::scan(kdev, &[], &mut fds).covers(NodeId::new(ino)),
            "a new watcher"
        );
        // This process left out: none of it.
        let me = [Some(std::process::id())];
        assert!(!GuestWatches::scan(kdev, &me, &mut fds).covers(NodeId::new(ino)));
    }

    #[test]
    fn fdinfo_marks_are_parsed_for_this_device_only() {
        let mut w = GuestWatches {
            inodes: HashSet::new(),
            everything: false,
        };
        let text = "pos:\t0\nflags:\t00\nmnt_id:\t17\nino:\t1038\n\
            inotify wd:1 ino:98413f sdev:fe00000 mask:fff ignored_mask:0 fhandle-bytes:8\n\
            inotify wd:2 ino:1 sdev:2e mask:fff ignored_mask:0\n\
            inotify wd:3 ino:2a sdev:2e mask:fff ignored_mask:0\n";
        w.add_marks(text, 0x2e);
        assert!(w.covers(NodeId::new(1)) && w.covers(NodeId::new(0x2a)));
        assert!(!w.covers(NodeId::new(0x98413f)), "a mark on another device");
        assert!(!w.everything, "the fdinfo header's mnt_id is not a mark");
        w.add_marks("fanotify sdev:2e mflags:0 mask:1 ignored_mask:0\n", 0x2e);
        assert!(
            w.covers(NodeId::new(12345)),
            "a file system mark covers everything"
        );
    }

    #[test]
    fn replays_stay_on_the_named_directory_and_never_follow_symlinks() {
        let tmp = tempfile::tempdir().unwrap();
        let root_path = tmp.path().join("root");
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(root_path.join("sub")).unwrap();
        std::fs::create_dir(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, root_path.join("link")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", root_path.join("sub/file-link")).unwrap();
        let meta = |p: &Path| std::fs::symlink_metadata(p).unwrap();
        let dev = MountDev {
            dev: meta(&root_path).dev(),
            kdev: 0,
        };
        let r = Replayer::new(&root_path);
        let root = openat(
            libc::AT_FDCWD,
            &cpath(&root_path).unwrap(),
            libc::O_PATH | libc::O_DIRECTORY,
        )
        .unwrap();
        let sub_ino = meta(&root_path.join("sub")).ino();
        assert!(r.open_dir(&root, dev, b"sub", NodeId::new(sub_ino)).is_ok());
        // The right path to another directory than the event's.
        assert!(r
            .open_dir(&root, dev, b"sub", NodeId::new(sub_ino + 1))
            .is_err());
        // A symlink on the way, even to the very directory the event names.
        let outside_ino = meta(&outside).ino();
        assert!(r
            .open_dir(&root, dev, b"link", NodeId::new(outside_ino))
            .is_err());
        for bad in [
            &b"../outside"[..],
            b"/etc",
            b"sub/..",
            b"sub//x",
            b"sub/\0x",
            b".",
        ] {
            let e = r
                .open_dir(&root, dev, bad, NodeId::new(outside_ino))
                .unwrap_err();
            assert!(e.raw_os_error().is_some(), "{bad:?}: {e}");
        }
        for bad in [&b""[..], b".", b"..", b"a/b", b"a\0b"] {
            assert!(component(bad).is_err(), "{bad:?}");
        }
        // A content replay on a symlink changes the symlink's view only, never its target.
        let sub = r
            .open_dir(&root, dev, b"sub", NodeId::new(sub_ino))
            .unwrap();
        let before = meta(Path::new("/etc/passwd")).mtime_nsec();
        replay_change(sub.as_raw_fd(), c"file-link", changed::ALL, None).unwrap();
        assert_eq!(meta(Path::new("/etc/passwd")).mtime_nsec(), before);
    }

    #[test]
    fn ghosts_get_fresh_ids_above_every_server_id() {
        let r = Replayer::new(Path::new("/nonexistent"));
        let a = r.ghost(libc::S_IFREG);
        let b = r.ghost(libc::S_IFDIR);
        assert!(a.ino >= GHOST_BASE && b.ino > a.ino);
        assert_eq!(b.mode & libc::S_IFMT, libc::S_IFDIR);
        assert!(!r.is_replay(0), "no thread bound yet");
    }
}
