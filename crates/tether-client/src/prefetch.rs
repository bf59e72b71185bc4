//! Directory listings ahead of LOOKUPs.
//!
//! A cold walk by known paths (a `stat` of every file of a tree, a build opening its
//! sources) makes the kernel send one LOOKUP per name, and each is a round trip through
//! the FUSE device, even when the client could answer it itself. After a second LOOKUP
//! that the kernel could not answer in the same directory within [`MISS_WINDOW`], a thread
//! of the client lists that directory through the mount (getdents, up to
//! [`LISTED_AT_MOST`] entries). The kernel asks READDIRPLUS for it and puts every entry of
//! the replies into its dentry cache, so the rest of the walk finds its names there
//! without any request.
//!
//! [`LISTERS`] threads list, so that while the kernel makes one directory's entries into
//! dentries (in the lister's `getdents`) the server already reads the next directory.
//!
//! Coherence: these are ordinary READDIRPLUS replies, cached and revoked like those of an
//! `ls` in the guest (coherence.rs); the kernel counts and forgets their lookups itself.
//! Guest watchers of the directory see it opened and closed.
//!
//! The directory is opened by its path, rebuilt from where the kernel was given each node
//! ([`Known::path_of`]); a rename racing that lists another directory or none, which only
//! wastes the listing.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use tether_proto::NodeId;

use crate::coherence::Coherence;
use crate::restore::Known;
use crate::writeback::MountDir;

/// Two LOOKUPs missing in one directory within this window start a listing.
const MISS_WINDOW: Duration = Duration::from_millis(500);
/// A directory listed is not listed again before this (the kernel keeps what it got).
const LISTED_FOR: Duration = Duration::from_secs(2);
/// Entries listed per directory at most: a lookup in a huge directory must not fetch it all.
const LISTED_AT_MOST: usize = 4096;
/// Threads listing at once. Two overlap the server's work on one directory with the
/// client's and the kernel's on another: `tether bench`'s cold `stat` of 100 directories
/// of 100 files took 0.23 s with one and 0.17 s with two (docs/benchmarks.md).
const LISTERS: usize = 2;
/// Directories waiting for a lister; one that finds the queue full is tried again at its
/// next misses.
const QUEUED_AT_MOST: usize = 256;

/// Per directory the kernel holds and looked up in (removed when it forgets it).
struct DirState {
    window_start: Instant,
    misses: u32,
    /// Listed (or queued) until then: not listed again before.
    listed_until: Option<Instant>,
}

pub struct Prefetch {
    co: Arc<Coherence>,
    dirs: DashMap<NodeId, DirState>,
    /// Set by [`Prefetch::start`]; until then nothing is listed.
    lister: OnceLock<SyncSender<NodeId>>,
}

impl Prefetch {
    pub fn new(co: Arc<Coherence>) -> Arc<Prefetch> {
        Arc::new(Prefetch {
            co,
            dirs: DashMap::new(),
            lister: OnceLock::new(),
        })
    }

    /// Starts the threads that list directories through the mount at `dir`, finding them
    /// by the places in `known`; they end when the mount is gone.
    pub fn start(self: &Arc<Self>, dir: Arc<MountDir>, known: Arc<Known>) {
        let (tx, rx) = sync_channel(QUEUED_AT_MOST);
        if self.lister.set(tx).is_err() {
            return;
        }
        let rx = Arc::new(Mutex::new(rx));
        for _ in 0..LISTERS {
            let (rx, dir, known, co) = (rx.clone(), dir.clone(), known.clone(), self.co.clone());
            let spawned = std::thread::Builder::new()
                .name("tether-prefetch".into())
                .spawn(move || list_loop(&rx, &dir, &known, &co));
            if let Err(e) = spawned {
                tracing::warn!("no thread to list directories ahead of lookups: {e}");
            }
        }
    }

    /// A LOOKUP in `dir` goes to the server: the second within [`MISS_WINDOW`] lists `dir`.
    pub fn missed(&self, dir: NodeId) {
        let Some(lister) = self.lister.get() else {
            return;
        };
        if !self.co.enabled() {
            return;
        }
        let now = Instant::now();
        let list = {
            let mut st = self.dirs.entry(dir).or_insert(DirState {
                window_start: now,
                misses: 0,
                listed_until: None,
            });
            if st.listed_until.is_some_and(|t| now < t) {
                false
            } else {
                if now.duration_since(st.window_start) > MISS_WINDOW {
                    st.window_start = now;
                    st.misses = 0;
                }
                st.misses += 1;
                if st.misses >= 2 {
                    st.listed_until = Some(now + LISTED_FOR);
                    st.misses = 0;
                }
                st.misses == 0
            }
        };
        if list {
            if let Err(TrySendError::Full(_)) = lister.try_send(dir) {
                // Not listed: the next misses may try again.
                if let Some(mut st) = self.dirs.get_mut(&dir) {
                    st.listed_until = None;
                }
            }
        }
    }

    /// The kernel forgot `node`, last seen in `parent`: what it listed there may be gone
    /// from its cache (memory pressure, drop_caches), so `parent` may be listed again.
    pub fn forgotten(&self, node: NodeId, parent: Option<NodeId>) {
        self.dirs.remove(&node);
        if let Some(mut d) = parent.and_then(|p| self.dirs.get_mut(&p)) {
            d.listed_until = None;
        }
    }
}

/// Lists the directories sent on `rx`, which the listers share, until the mount is gone.
fn list_loop(rx: &Mutex<Receiver<NodeId>>, mount: &MountDir, known: &Known, co: &Coherence) {
    loop {
        // The lock is held only while waiting for the next directory, not while listing.
        let next = rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
        let Ok(dir) = next else {
            return;
        };
        let Some(path) = known.path_of(dir) else {
            continue;
        };
        let listing = |root: BorrowedFd<'_>| {
            let c = &co.counters;
            let now = c.listing_now.fetch_add(1, Ordering::Relaxed) + 1;
            c.listing_most.fetch_max(now, Ordering::Relaxed);
            let listed = list(root, path.as_os_str().as_bytes());
            c.listing_now.fetch_sub(1, Ordering::Relaxed);
            listed
        };
        match mount.with_path(listing) {
            Some(Ok(n)) => {
                co.counters.listed.fetch_add(n as u64, Ordering::Relaxed);
            }
            Some(Err(e)) => tracing::debug!("listing {} ahead failed: {e}", path.display()),
            None => {} // paused or gone
        }
    }
}

/// Reads up to [`LISTED_AT_MOST`] entries of the directory at `path` below `root`.
fn list(root: BorrowedFd<'_>, path: &[u8]) -> io::Result<usize> {
    let c_path = std::ffi::CString::new(path).map_err(|_| io::ErrorKind::InvalidInput)?;
    // Opened below the root without following links, so the path cannot leave the mount.
    // SAFETY: a valid descriptor and a NUL-terminated path.
    let fd = unsafe {
        libc::openat(
            root.as_raw_fd(),
            c_path.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor we own.
    let dir = unsafe { OwnedFd::from_raw_fd(fd) };
    // Read through glibc's readdir (std's), whose 32 KiB buffer is the size the kernel
    // asks READDIRPLUS for; "." and ".." are not counted.
    let mut entries = 0;
    for entry in std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd()))? {
        entry?;
        entries += 1;
        if entries >= LISTED_AT_MOST {
            break;
        }
    }
    Ok(entries)
}
