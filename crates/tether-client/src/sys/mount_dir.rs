//! The mount's root directory as the client's own helper threads use it (the prefetch's
//! listers, the lock thread, the writeback cache's fixer and flusher): short-lived
//! descriptors, paused around an unmount.
//!
//! Any descriptor open through the user's mount makes a plain umount(2) (busybox's or
//! util-linux's `umount`, which do not retry) fail with EBUSY, and the listers hold one
//! for the time of a listing, right after a walk: a guest's `umount` just after a `stat`
//! of a few directories' files failed 2 times in 15 (docs/vm.md). So where it can (as
//! root: CAP_SYS_ADMIN), the client opens what its helpers need through a detached clone
//! of the mount (`open_tree(OPEN_TREE_CLONE)`): the same file system, so the listers'
//! READDIRPLUS still fills the kernel's dentry cache for the user's mount, but another
//! mount, which the user's umount does not count. The clone keeps the file system alive,
//! so a thread watches the mount table and drops it when the user's mount is gone from it
//! (unmounted, lazily or not); the kernel then tears the file system down as it would
//! have at the umount, and the session ends.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

/// Short-lived descriptors of the mount's root. Any open descriptor on the mount makes a
/// plain umount fail with EBUSY, so none is kept between uses, and an unmount in this
/// process first pauses it ([`MountDir::pause`]); they are opened through a clone of the
/// mount where one can be made (module docs).
pub struct MountDir {
    path: PathBuf,
    /// The detached clone of the mount, once the mount is known to be there.
    clone: Mutex<Clone>,
    me: Weak<MountDir>,
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

/// The detached clone of the mount.
enum Clone {
    /// Not tried yet (the mount is not known to be there yet).
    Untried,
    Made(OwnedFd),
    /// open_tree refused (not root, an old kernel), or the mount is gone.
    None,
}

/// open_tree(2)'s flag for a detached copy of the mount at the path.
const OPEN_TREE_CLONE: libc::c_uint = 1;

/// How often the mount table is read again even without a change signalled (a safety net:
/// poll's POLLPRI on /proc/self/mountinfo signals every change in the namespace).
const MOUNT_TABLE_EVERY: Duration = Duration::from_secs(1);

impl MountDir {
    pub fn new(path: PathBuf) -> Arc<MountDir> {
        Arc::new_cyclic(|me| MountDir {
            path,
            clone: Mutex::new(Clone::Untried),
            me: me.clone(),
            state: RwLock::new(DirState::Open),
            dev: std::sync::OnceLock::new(),
        })
    }

    /// Opens the root with `flags`: through the clone if there is one, else by its path.
    /// Makes the clone the first time after the path led to the mount.
    fn open_root(&self, flags: i32) -> Option<std::fs::File> {
        let mut clone = self.clone.lock().unwrap();
        if matches!(*clone, Clone::Untried) && self.dev.get().is_none() {
            // Learn the device through a descriptor kept only for that moment, so that the
            // first use too (a listing right after the mount) goes through the clone: held
            // by path for the whole listing, it made a guest's umount right after its first
            // walk fail with EBUSY now and then (vm.rs's fstab test, once in two suite runs).
            // O_PATH: opening the root for reading would cost an OPENDIR and RELEASEDIR.
            let learn = libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC;
            if let Some(dir) = self.open_by_path(learn) {
                self.is_the_mount(dir.as_fd());
            }
        }
        if matches!(*clone, Clone::Untried) && self.dev.get().is_some() {
            *clone = self.make_clone();
        }
        if let Clone::Made(base) = &*clone {
            // SAFETY: openat on a descriptor we own, with a C string.
            let fd = unsafe { libc::openat(base.as_raw_fd(), c".".as_ptr(), flags) };
            if fd < 0 {
                return None;
            }
            // SAFETY: a new descriptor, owned from here.
            return Some(unsafe { std::fs::File::from_raw_fd(fd) });
        }
        drop(clone);
        self.open_by_path(flags)
    }

    /// Opens the root with `flags` through the user's mount, by its path.
    fn open_by_path(&self, flags: i32) -> Option<std::fs::File> {
        std::fs::File::options()
            .read(true)
            .custom_flags(flags)
            .open(&self.path)
            .ok()
    }

    /// A detached clone of the mount at the path, if it is this mount and open_tree is
    /// allowed; starts the thread that drops it when the mount is gone.
    fn make_clone(&self) -> Clone {
        let Ok(path) = std::ffi::CString::new(self.path.as_os_str().as_bytes()) else {
            return Clone::None;
        };
        // SAFETY: open_tree with a C string; the result is a new descriptor or -1.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_open_tree,
                libc::AT_FDCWD,
                path.as_ptr(),
                OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint,
            )
        };
        if fd < 0 {
            tracing::debug!(
                "no clone of the mount for the client's helpers (a plain umount may then \
                 find the mount busy for a moment): open_tree: {}",
                std::io::Error::last_os_error()
            );
            return Clone::None;
        }
        // SAFETY: a new descriptor, owned from here.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        let dev = *self.dev.get().expect("made after the mount was seen");
        if fstat_dev(fd.as_fd()) != Some(dev) {
            return Clone::None;
        }
        let me = self.me.clone();
        let spawned = std::thread::Builder::new()
            .name("tether-mounted".into())
            .spawn(move || watch_mount_table(me, dev));
        if spawned.is_err() {
            // Without the watcher the clone would outlive the mount: no clone.
            return Clone::None;
        }
        Clone::Made(fd)
    }

    /// The user's mount is gone: drops the clone (once no helper uses it), which lets the
    /// kernel end the file system.
    pub fn release(&self) {
        let mut state = self.state.write().unwrap();
        *state = DirState::Gone;
        *self.clone.lock().unwrap() = Clone::None;
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

    /// Like [`MountDir::with_path`], but the descriptor is always opened through the
    /// user's mount (its path), never the clone: for what must be the user's mount itself,
    /// such as its mount id, which the files of the guest's processes carry.
    pub fn with_user_mount<T>(&self, f: impl FnOnce(BorrowedFd<'_>) -> T) -> Option<T> {
        let state = self.state.read().unwrap();
        if *state != DirState::Open {
            return None;
        }
        let dir = self.open_by_path(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)?;
        if !self.is_the_mount(dir.as_fd()) {
            return None;
        }
        Some(f(dir.as_fd()))
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
        let dir = self.open_root(flags | libc::O_CLOEXEC)?;
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

/// Until the mount of device `dev` has left this namespace's mount table (or the
/// MountDir is dropped): then releases the MountDir's clone.
fn watch_mount_table(me: Weak<MountDir>, dev: u64) {
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    loop {
        // Opened anew each time: POLLPRI reports a change since the file was opened.
        let table = std::fs::File::open("/proc/self/mountinfo");
        let present = tether_sys::mountinfo::mount_of_device(major, minor);
        let Some(dir) = me.upgrade() else { return };
        if dir.is_gone() {
            return;
        }
        if matches!(present, Ok(None)) {
            tracing::debug!("the mount left the mount table: dropping the helpers' clone of it");
            dir.release();
            return;
        }
        drop(dir);
        match table {
            Ok(table) => {
                let mut pfd = libc::pollfd {
                    fd: table.as_raw_fd(),
                    events: libc::POLLPRI,
                    revents: 0,
                };
                // SAFETY: one pollfd for a descriptor open for the call.
                unsafe { libc::poll(&mut pfd, 1, MOUNT_TABLE_EVERY.as_millis() as i32) };
            }
            Err(_) => std::thread::sleep(MOUNT_TABLE_EVERY),
        }
    }
}
