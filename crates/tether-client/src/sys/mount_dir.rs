//! The mount's root directory as the client's own helper threads use it (the prefetch's
//! listers, the lock thread, the writeback cache's fixer and flusher): short-lived
//! descriptors, paused around an unmount.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::RwLock;

/// Short-lived descriptors of the mount's root. Any open descriptor on the mount makes a
/// plain umount fail with EBUSY, so none is kept between uses, and an unmount in this
/// process first pauses it ([`MountDir::pause`]).
pub struct MountDir {
    path: PathBuf,
    /// Read-locked by each use of a descriptor (several at once: the prefetch's listers and
    /// the flusher), write-locked to change it, so that a pause waits for them all.
    state: RwLock<DirState>,
    /// The mount's device number, once known.
    dev: std::sync::OnceLock<u64>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum DirState {
    Open,
    Paused,
    Gone,
}

/// The device number of the file system `fd` is on.
fn fstat_dev(fd: BorrowedFd<'_>) -> Option<u64> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: a valid descriptor and a stat buffer.
    if unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: fstat succeeded.
    Some(unsafe { st.assume_init() }.st_dev)
}

/// statfs's f_type of a FUSE mount.
const FUSE_SUPER_MAGIC: u64 = 0x6573_5546;

/// Whether `fd` is on a FUSE file system.
fn is_fuse(fd: BorrowedFd<'_>) -> bool {
    let mut sfs = std::mem::MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: a valid descriptor and a statfs buffer.
    if unsafe { libc::fstatfs(fd.as_raw_fd(), sfs.as_mut_ptr()) } != 0 {
        return false;
    }
    // SAFETY: fstatfs succeeded.
    // f_type is signed with glibc and unsigned with musl: compared as the bits it holds.
    unsafe { sfs.assume_init() }.f_type as u64 == FUSE_SUPER_MAGIC
}

impl MountDir {
    pub fn new(path: PathBuf) -> MountDir {
        MountDir {
            path,
            state: RwLock::new(DirState::Open),
            dev: std::sync::OnceLock::new(),
        }
    }

    /// Runs `f` with a descriptor of the mount's root (open_by_handle_at refuses O_PATH
    /// ones), or returns None if the mount is paused, gone, or not (yet) there: the path
    /// must lead to this FUSE file system, never to the directory beneath it.
    pub fn with<T>(&self, f: impl FnOnce(BorrowedFd<'_>) -> T) -> Option<T> {
        self.with_root(libc::O_DIRECTORY, f)
    }

    /// Like [`MountDir::with`], with an `O_PATH` descriptor (usable as `openat`'s base),
    /// and without a round trip: opening the root for reading sends OPENDIR and RELEASEDIR.
    pub fn with_path<T>(&self, f: impl FnOnce(BorrowedFd<'_>) -> T) -> Option<T> {
        self.with_root(libc::O_PATH | libc::O_DIRECTORY, f)
    }

    /// Whether `fd` is the mount's root: on a FUSE file system the first time (fstatfs, a
    /// STATFS round trip), then on the device number learned then (no round trip; the
    /// flusher asks 50 times a second).
    fn is_the_mount(&self, fd: BorrowedFd<'_>) -> bool {
        if let Some(dev) = self.dev.get() {
            return fstat_dev(fd) == Some(*dev);
        }
        is_fuse(fd) && fstat_dev(fd).is_some_and(|dev| *self.dev.get_or_init(|| dev) == dev)
    }

    /// Opens the root with `flags` while the mount is open and holds the state's lock
    /// (so that [`MountDir::pause`] waits), checks that it is the mount, runs `f` on it.
    fn with_root<T>(&self, flags: i32, f: impl FnOnce(BorrowedFd<'_>) -> T) -> Option<T> {
        let state = self.state.read().unwrap();
        if *state != DirState::Open {
            return None;
        }
        let dir = std::fs::File::options()
            .read(true)
            .custom_flags(flags | libc::O_CLOEXEC)
            .open(&self.path)
            .ok()?;
        if !self.is_the_mount(dir.as_fd()) {
            return None;
        }
        let r = f(dir.as_fd());
        drop(dir);
        drop(state);
        Some(r)
    }

    /// No descriptor is open once this returns, and none will be until [`MountDir::resume`].
    pub fn pause(&self) {
        self.set(DirState::Paused);
    }

    /// The unmount did not happen (files open): go on.
    pub fn resume(&self) {
        let mut state = self.state.write().unwrap();
        if *state == DirState::Paused {
            *state = DirState::Open;
        }
    }

    /// The mount is gone for good.
    pub fn gone(&self) {
        self.set(DirState::Gone);
    }

    pub fn is_gone(&self) -> bool {
        *self.state.read().unwrap() == DirState::Gone
    }

    fn set(&self, to: DirState) {
        let mut state = self.state.write().unwrap();
        if *state != DirState::Gone {
            *state = to;
        }
    }
}
