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

use std::collections::{HashSet, VecDeque};
use std::ffi::{CString, OsStr};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use fuser::{INodeNo, Notifier};
use tether_proto::{changed, Attr, EventKind, HostEvent, NodeId};

/// Node ids from here up are ghosts: entries invented for the replaying thread to remove
/// (the host already removed them). Server ids stay below (foreign ids count up from 2^63).
pub const GHOST_BASE: NodeId = 0xC000_0000_0000_0000;

/// Most host events waiting for replay (about 100 bytes each). A watcher's own inotify
/// queue holds 16,384 events by default (fs.inotify.max_queued_events), so a watcher that
/// falls that far behind gets IN_Q_OVERFLOW from its kernel long before this.
pub const MAX_BACKLOG: usize = 1 << 20;

/// How often a replay that raced with a guest lookup is retried after dropping the name.
const RETRIES: usize = 3;

/// What a lookup by the replaying thread must find, so that its operation goes through.
#[derive(Debug, Clone)]
pub enum ReplayLookup {
    /// The name must look absent: it is being created (or is a rename's target).
    Absent,
    /// The name must look present, as the node now found under (`dir`, `name`), or as a
    /// ghost of type `file_type` when there is none: it is being removed or renamed.
    Present {
        dir: NodeId,
        name: Bytes,
        file_type: u32,
    },
}

#[derive(Default)]
struct Armed {
    names: Vec<(NodeId, Bytes, ReplayLookup)>,
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

pub struct Replayer {
    mountpoint: PathBuf,
    /// Thread id of the replaying thread (0 until it starts).
    tid: AtomicI32,
    armed: Mutex<Armed>,
    next_ghost: AtomicU64,
    /// The mount's device as fdinfo prints it (the kernel's encoding of s_dev).
    kdev: OnceLock<Option<u64>>,
    pub counters: ReplayCounters,
}

impl Replayer {
    pub fn new(mountpoint: &Path) -> Replayer {
        Replayer {
            mountpoint: mountpoint.to_path_buf(),
            tid: AtomicI32::new(0),
            armed: Mutex::new(Armed::default()),
            next_ghost: AtomicU64::new(GHOST_BASE),
            kdev: OnceLock::new(),
            counters: ReplayCounters::default(),
        }
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

    /// Attributes of a ghost: a fresh id, so the kernel never confuses it with a real node.
    pub fn ghost(&self, file_type: u32) -> Attr {
        let ino = self.next_ghost.fetch_add(1, Ordering::Relaxed);
        let dir = file_type == libc::S_IFDIR;
        Attr {
            ino,
            mode: file_type | if dir { 0o755 } else { 0o644 },
            nlink: if dir { 2 } else { 1 },
            blksize: 4096,
            ..Attr::default()
        }
    }

    /// Queues `events` for replay, unless the backlog is past [`MAX_BACKLOG`]: then those
    /// events are dropped (and counted), since memory must stay bounded.
    pub fn admit(&self, backlog: &mut VecDeque<HostEvent>, events: Vec<HostEvent>) {
        if backlog.len() + events.len() > MAX_BACKLOG {
            if self
                .counters
                .dropped
                .fetch_add(events.len() as u64, Ordering::Relaxed)
                == 0
            {
                tracing::warn!(
                    "more than {MAX_BACKLOG} host changes wait to be replayed as inotify \
                     events: dropping some (see `tether status`)"
                );
            }
            return;
        }
        backlog.extend(events);
    }

    /// Replays events from the front of `backlog`, where the guest watches, for about
    /// `slice` (at least one); `notifier` drops a stale name when a guest lookup raced with
    /// the replay. Watches are read once per call, after the events arrived.
    pub fn replay(&self, backlog: &mut VecDeque<HostEvent>, notifier: &Notifier, slice: Duration) {
        let Some(kdev) = *self.kdev.get_or_init(|| self.mount_kdev()) else {
            backlog.clear();
            return;
        };
        let start = Instant::now();
        let watches = GuestWatches::scan(kdev);
        // Reading every process's descriptors can take milliseconds (a process with 10,000
        // files open): keep scans to a tenth of the time in a long backlog.
        let slice = slice.max(start.elapsed() * 10);
        while let Some(ev) = backlog.pop_front() {
            self.replay_watched(&ev, &watches, notifier);
            if start.elapsed() >= slice {
                break;
            }
        }
        self.armed.lock().unwrap().names.clear();
    }

    fn replay_watched(&self, ev: &HostEvent, watches: &GuestWatches, notifier: &Notifier) {
        let from_dir = match &ev.kind {
            EventKind::Moved { from_dir, .. } => Some(*from_dir),
            _ => None,
        };
        let watched = watches.covers(ev.dir)
            || (ev.node != 0 && watches.covers(ev.node))
            || from_dir.is_some_and(|d| watches.covers(d));
        if !watched {
            self.counters.unwatched.fetch_add(1, Ordering::Relaxed);
            return;
        }
        for attempt in 0..=RETRIES {
            match self.replay_one(ev) {
                Ok(()) => {
                    self.counters.replayed.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                // The guest's dentry disagrees with the event (a guest lookup got the new
                // state first): drop the name(s) and try again.
                Err(e)
                    if attempt < RETRIES
                        && matches!(
                            e.raw_os_error(),
                            Some(libc::EEXIST | libc::ENOENT | libc::ENOTEMPTY)
                        ) =>
                {
                    let _ = notifier.inval_entry(INodeNo(ev.dir), OsStr::from_bytes(&ev.name));
                    if let EventKind::Moved {
                        from_dir,
                        from_name,
                        ..
                    } = &ev.kind
                    {
                        let _ =
                            notifier.inval_entry(INodeNo(*from_dir), OsStr::from_bytes(from_name));
                    }
                }
                Err(e) => {
                    tracing::debug!(?ev, "replaying a host change failed: {e}");
                    break;
                }
            }
        }
        self.counters.failed.fetch_add(1, Ordering::Relaxed);
    }

    fn path(&self, dir_path: &[u8], name: &[u8]) -> PathBuf {
        let mut p = self.mountpoint.clone();
        if !dir_path.is_empty() {
            p.push(OsStr::from_bytes(dir_path));
        }
        p.push(OsStr::from_bytes(name));
        p
    }

    fn arm(&self, names: Vec<(NodeId, Bytes, ReplayLookup)>) {
        self.armed.lock().unwrap().names = names;
    }

    fn replay_one(&self, ev: &HostEvent) -> std::io::Result<()> {
        let path = self.path(&ev.dir_path, &ev.name);
        let name = ev.name.clone();
        match &ev.kind {
            EventKind::Created => {
                self.arm(vec![(ev.dir, name, ReplayLookup::Absent)]);
                create_like(&path, ev.file_type)
            }
            EventKind::Deleted => {
                self.arm(vec![(
                    ev.dir,
                    name,
                    ReplayLookup::Present {
                        dir: 0,
                        name: Bytes::new(),
                        file_type: ev.file_type,
                    },
                )]);
                if ev.file_type == libc::S_IFDIR {
                    std::fs::remove_dir(&path)
                } else {
                    std::fs::remove_file(&path)
                }
            }
            EventKind::Moved {
                from_dir,
                from_path,
                from_name,
            } => {
                let from = self.path(from_path, from_name);
                self.arm(vec![
                    (
                        *from_dir,
                        from_name.clone(),
                        ReplayLookup::Present {
                            dir: ev.dir,
                            name: ev.name.clone(),
                            file_type: ev.file_type,
                        },
                    ),
                    (ev.dir, name, ReplayLookup::Absent),
                ]);
                std::fs::rename(&from, &path)
            }
            EventKind::Changed(bits) => {
                self.arm(Vec::new());
                replay_change(&path, *bits)
            }
        }
    }

    /// The mount's device in the kernel's own encoding (major << 20 | minor), which is how
    /// fdinfo prints a mark's device.
    fn mount_kdev(&self) -> Option<u64> {
        match std::fs::metadata(&self.mountpoint) {
            Ok(m) => {
                let dev = m.dev();
                let major = ((dev >> 32) & 0xffff_f000) | ((dev >> 8) & 0xfff);
                let minor = ((dev >> 12) & 0xffff_ff00) | (dev & 0xff);
                Some((major << 20) | minor)
            }
            Err(e) => {
                tracing::warn!(
                    "cannot stat the mount point ({e}): no inotify events for host changes"
                );
                None
            }
        }
    }
}

fn cpath(path: &Path) -> std::io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))
}

fn check(rc: libc::c_int) -> std::io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Creates `path` as a file of `file_type`; the handler answers with what the host made.
fn create_like(path: &Path, file_type: u32) -> std::io::Result<()> {
    match file_type {
        libc::S_IFDIR => std::fs::create_dir(path),
        // The target is not used: the handler answers with the host's symlink.
        libc::S_IFLNK => std::os::unix::fs::symlink(".", path),
        t => {
            let c = cpath(path)?;
            // SAFETY: valid C string.
            check(unsafe { libc::mknod(c.as_ptr(), t | 0o644, 0) })
        }
    }
}

/// Raises IN_OPEN, IN_MODIFY, IN_ATTRIB and IN_CLOSE_WRITE (as `bits` say, in the order a
/// local writer raises them) for `path`, with operations that leave it as it is: open for
/// writing, truncate to its size, chmod to its mode (lchown to its owner for a symlink),
/// close.
fn replay_change(path: &Path, bits: u8) -> std::io::Result<()> {
    let meta = std::fs::symlink_metadata(path)?;
    let c = cpath(path)?;
    let regular = meta.file_type().is_file();
    let size = meta.len() as libc::off_t;
    let fd = if bits & changed::CLOSE_WRITE != 0 && regular {
        // SAFETY: valid C string; the descriptor is closed below.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_WRONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor we own.
        Some(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
    } else {
        None
    };
    if bits & changed::MODIFY != 0 && regular {
        // SAFETY: valid C string / our own descriptor.
        check(unsafe {
            match &fd {
                Some(fd) => libc::ftruncate(fd.as_raw_fd(), size),
                None => libc::truncate(c.as_ptr(), size),
            }
        })?;
    }
    if bits & changed::ATTRIB != 0 {
        if meta.file_type().is_symlink() {
            // SAFETY: valid C string.
            check(unsafe { libc::lchown(c.as_ptr(), meta.uid(), meta.gid()) })?;
        } else {
            // SAFETY: valid C string.
            check(unsafe { libc::chmod(c.as_ptr(), meta.mode() & 0o7777) })?;
        }
    }
    drop(fd); // IN_CLOSE_WRITE
    Ok(())
}

/// The inodes of one mount that processes in the guest watch.
pub struct GuestWatches {
    inodes: HashSet<u64>,
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

    /// Reads every inotify and fanotify mark of every process (but this one) on device
    /// `kdev`. The kernel's inode numbers on a Tether mount are the node ids.
    pub fn scan(kdev: u64) -> GuestWatches {
        let mut found = GuestWatches {
            inodes: HashSet::new(),
            everything: false,
        };
        let me = std::process::id().to_string();
        let Ok(procs) = std::fs::read_dir("/proc") else {
            return found;
        };
        for p in procs.flatten() {
            let pid = p.file_name();
            let pid = pid.as_bytes();
            if pid.is_empty() || !pid.iter().all(u8::is_ascii_digit) || pid == me.as_bytes() {
                continue;
            }
            let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
                continue;
            };
            for fd in fds.flatten() {
                let Ok(target) = std::fs::read_link(fd.path()) else {
                    continue;
                };
                let target = target.as_os_str().as_bytes();
                if target != b"anon_inode:inotify" && target != b"anon_inode:[fanotify]" {
                    continue;
                }
                let info = p.path().join("fdinfo").join(fd.file_name());
                if let Ok(text) = std::fs::read_to_string(info) {
                    found.add_marks(&text, kdev);
                }
            }
        }
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
                    self.inodes.insert(ino);
                }
                None => self.everything = true,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(w.covers(1) && w.covers(0x2a));
        assert!(!w.covers(0x98413f), "a mark on another device");
        assert!(!w.everything, "the fdinfo header's mnt_id is not a mark");
        w.add_marks("fanotify sdev:2e mflags:0 mask:1 ignored_mask:0\n", 0x2e);
        assert!(w.covers(12345), "a file system mark covers everything");
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
