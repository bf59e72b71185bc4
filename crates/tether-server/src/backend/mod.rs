//! The seam between the operations and the host's file system calls: [`Backend`].
//!
//! The operations (ops/), the node table and the watchers' coalescing reach the host only
//! through this trait, never through libc: what a call means is said here, how a host does
//! it is the backend's business. Today there is one backend, [`linux::Linux`]: O_PATH node
//! descriptors, statx birth times, reopening through /proc/self/fd, OFD locks, renameat2
//! flags, O_TMPFILE. A portable one (only calls macOS has as well: `*at` calls with
//! O_NOFOLLOW instead of O_PATH, fstatat instead of statx, no openat2, no OFD locks, no
//! renameat2 flags) is meant to go beside it without touching the operations.
//!
//! Flags and modes are the host's (`libc`) values, which are also the wire's: the protocol
//! carries Linux's. Status is `libc::stat`, which every Unix has.

#[cfg(target_os = "linux")]
pub mod linux;
#[cfg(target_os = "linux")]
pub mod linux_sys;
pub mod lock_helper;
pub mod portable;
pub mod sys;
pub mod wire;

use std::ffi::CStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

/// File types (`st_mode & S_IFMT`) as u32 on every host (`mode_t` is u16 on macOS).
pub const S_IFMT: u32 = libc::S_IFMT as u32;
pub const S_IFDIR: u32 = libc::S_IFDIR as u32;
pub const S_IFREG: u32 = libc::S_IFREG as u32;
pub const S_IFLNK: u32 = libc::S_IFLNK as u32;
pub const S_IFIFO: u32 = libc::S_IFIFO as u32;
pub const S_IFSOCK: u32 = libc::S_IFSOCK as u32;

/// The file type bits of `st`.
pub fn file_type(st: &libc::stat) -> u32 {
    st.st_mode as u32 & S_IFMT
}

pub use sys::{At, SysResult};

/// A file's birth time (seconds, nanoseconds), where its file system records one.
pub type Birth = Option<(i64, u32)>;

/// What [`Backend::read_dir`] calls for each entry: false to stop there.
pub type TakeEntry<'a> = dyn FnMut(RawDirEntry) -> bool + 'a;

/// One entry read from a directory stream.
pub struct RawDirEntry {
    pub ino: u64,
    pub next_offset: u64,
    pub kind: u8,
    pub name: Vec<u8>,
}

/// One byte-range lock as fcntl describes it; `len` 0 runs to the end of the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RangeLock {
    /// F_RDLCK, F_WRLCK or F_UNLCK.
    pub typ: i16,
    pub start: i64,
    pub len: i64,
    /// The holder's pid for a conflicting process-owned lock; -1 for an open file
    /// description's lock.
    pub pid: i32,
}

impl RangeLock {
    /// A request (pid 0, as OFD locks need) for `len` bytes from `start` (0: to the end);
    /// `typ` is libc's F_RDLCK, F_WRLCK or F_UNLCK (i16 on macOS, i32 on Linux).
    pub fn request(typ: impl Into<i32>, start: i64, len: i64) -> RangeLock {
        let typ: i32 = typ.into();
        RangeLock {
            typ: typ as i16,
            start,
            len,
            pid: 0,
        }
    }
}

/// The host calls the server makes. A *node descriptor* is what the node table holds for a
/// node (it may not allow I/O: see [`Backend::reopen`]); an *open descriptor* allows the I/O
/// it was opened for. Every call is relative to a descriptor the server holds, with one
/// checked name at most, and never follows a final symlink unless it says so.
pub trait Backend: Send + Sync {
    // Descriptors.

    /// A node descriptor of `name` in `dir`.
    fn open_node(&self, dir: BorrowedFd<'_>, name: &CStr) -> SysResult<OwnedFd>;
    /// A node descriptor of directory `name` in `dir` (an absolute path or "."), following
    /// symlinks: the export root, never a guest's name.
    fn open_dir_node(&self, dir: BorrowedFd<'_>, name: &CStr) -> SysResult<OwnedFd>;
    /// The object behind node descriptor `fd` opened for I/O with open(2) `flags`.
    fn reopen(&self, fd: BorrowedFd<'_>, flags: i32) -> SysResult<OwnedFd>;
    /// A node descriptor of the object open descriptor `fd` refers to.
    fn node_of_open(&self, fd: BorrowedFd<'_>) -> SysResult<OwnedFd>;
    /// A readable stream of the entries of directory `fd` (a node descriptor).
    fn open_dir(&self, fd: BorrowedFd<'_>) -> SysResult<OwnedFd>;
    /// openat(2) of `name` in `dir` with `flags` (close-on-exec added) and `mode`.
    fn open_at(&self, at: At<'_>, flags: i32, mode: u32) -> SysResult<OwnedFd>;
    /// A new regular file without a name in directory `dir`, open for reading and writing,
    /// that can be linked later ([`Backend::link_open`]); EOPNOTSUPP where the host cannot.
    fn open_unnamed(&self, dir: BorrowedFd<'_>, mode: u32) -> SysResult<OwnedFd>;

    // Status.

    fn stat(&self, fd: BorrowedFd<'_>) -> SysResult<libc::stat> {
        sys::fstat(fd)
    }
    /// [`Backend::stat`] and the birth time, in one call where the host can.
    fn stat_born(&self, fd: BorrowedFd<'_>) -> SysResult<(libc::stat, Birth)>;
    /// The status of `name` in `dir`, not following a final symlink.
    fn stat_at(&self, dir: BorrowedFd<'_>, name: &CStr) -> SysResult<libc::stat>;
    fn statfs(&self, fd: BorrowedFd<'_>) -> SysResult<libc::statvfs> {
        sys::fstatvfs(fd)
    }
    /// The device (major, minor) of the file system mounted at `fd` if `fd` is the root of
    /// a mount, from what the kernel has cached: never a request to that file system.
    fn mount_root_device(&self, fd: BorrowedFd<'_>) -> SysResult<Option<(u32, u32)>>;
    /// The path the host knows for `fd` now (it follows renames).
    fn fd_path(&self, fd: BorrowedFd<'_>) -> SysResult<Vec<u8>>;
    /// The target of the symlink `fd` (a node descriptor).
    fn readlink(&self, fd: BorrowedFd<'_>) -> SysResult<Vec<u8>>;
    /// access(2) of the object behind `fd` for `mask`.
    fn access(&self, fd: BorrowedFd<'_>, mask: i32) -> SysResult<()>;

    // Names.

    fn mkdir_at(&self, dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> SysResult<()>;
    fn mknod_at(&self, dir: BorrowedFd<'_>, name: &CStr, mode: u32, rdev: u64) -> SysResult<()>;
    fn symlink_at(&self, target: &CStr, dir: BorrowedFd<'_>, name: &CStr) -> SysResult<()>;
    /// unlinkat(2); `flags` AT_REMOVEDIR for a directory.
    fn unlink_at(&self, dir: BorrowedFd<'_>, name: &CStr, flags: i32) -> SysResult<()>;
    /// renameat2(2) with the wire's RENAME_NOREPLACE and RENAME_EXCHANGE `flags`.
    fn rename_at(&self, from: At<'_>, to: At<'_>, flags: u32) -> SysResult<()>;
    /// Links the file `fd` refers to (which may have no name) into `dir` as `name`.
    fn link_open(&self, fd: BorrowedFd<'_>, dir: BorrowedFd<'_>, name: &CStr) -> SysResult<()>;

    // Attributes.

    /// chmod of the object behind node descriptor `fd`.
    fn chmod_node(&self, fd: BorrowedFd<'_>, mode: u32) -> SysResult<()>;
    /// fchmod(2) of open descriptor `fd`.
    fn chmod(&self, fd: BorrowedFd<'_>, mode: u32) -> SysResult<()> {
        sys::fchmod(fd, mode)
    }
    /// chown of the object behind `fd`, symlinks included; None leaves that id alone.
    fn chown(&self, fd: BorrowedFd<'_>, uid: Option<u32>, gid: Option<u32>) -> SysResult<()>;
    /// utimensat(2) of the object behind `fd`, symlinks included.
    fn utimens(&self, fd: BorrowedFd<'_>, times: &[libc::timespec; 2]) -> SysResult<()>;
    /// truncate of the file behind node descriptor `fd`.
    fn truncate_node(&self, fd: BorrowedFd<'_>, size: u64) -> SysResult<()>;
    /// ftruncate(2) of open descriptor `fd`.
    fn truncate(&self, fd: BorrowedFd<'_>, size: u64) -> SysResult<()> {
        sys::ftruncate(fd, size)
    }

    // Data.

    /// Reads until `buf` is full or the file ends.
    fn pread(&self, fd: BorrowedFd<'_>, buf: &mut [u8], offset: u64) -> SysResult<usize> {
        sys::pread(fd, buf, offset)
    }
    /// Writes all of `buf` unless an error comes after some progress.
    fn pwrite(&self, fd: BorrowedFd<'_>, buf: &[u8], offset: u64) -> SysResult<usize> {
        sys::pwrite(fd, buf, offset)
    }
    fn fsync(&self, fd: BorrowedFd<'_>, datasync: bool) -> SysResult<()> {
        sys::fsync(fd, datasync)
    }
    fn fallocate(&self, fd: BorrowedFd<'_>, mode: i32, offset: u64, len: u64) -> SysResult<()>;
    fn lseek(&self, fd: BorrowedFd<'_>, offset: i64, whence: i32) -> SysResult<u64> {
        sys::lseek(fd, offset, whence)
    }
    /// Copies `len` bytes from (descriptor, offset) `from` to `to`; returns how many.
    fn copy_file_range(
        &self,
        from: (BorrowedFd<'_>, u64),
        to: (BorrowedFd<'_>, u64),
        len: u64,
    ) -> SysResult<u64>;
    /// Reads directory entries from stream `fd` starting at `offset` (a cookie from an
    /// earlier entry, or 0), calling `take` for each until it returns false or the
    /// directory ends. Returns whether the directory ended (`take` took every entry).
    fn read_dir(&self, fd: BorrowedFd<'_>, offset: u64, take: &mut TakeEntry) -> SysResult<bool>;
    /// A hint: read the first `len` bytes of open file `fd` into the host's page cache.
    fn readahead(&self, fd: BorrowedFd<'_>, len: usize);

    // Extended attributes of the object behind a node descriptor. A getter given an
    // empty buffer returns the size it needs.

    fn getxattr(&self, fd: BorrowedFd<'_>, name: &CStr, buf: &mut [u8]) -> SysResult<usize>;
    fn listxattr(&self, fd: BorrowedFd<'_>, buf: &mut [u8]) -> SysResult<usize>;
    fn setxattr(&self, fd: BorrowedFd<'_>, name: &CStr, value: &[u8], flags: i32) -> SysResult<()>;
    fn removexattr(&self, fd: BorrowedFd<'_>, name: &CStr) -> SysResult<()>;

    // Locks owned by the open file description behind `fd`; none of them waits.

    /// Takes, changes or drops a byte-range lock; EAGAIN when another owner holds a
    /// conflicting one.
    fn setlk(&self, fd: BorrowedFd<'_>, lock: &RangeLock) -> SysResult<()>;
    /// The first lock that conflicts with `lock`, or None.
    fn getlk(&self, fd: BorrowedFd<'_>, lock: &RangeLock) -> SysResult<Option<RangeLock>>;
    /// flock(2) `op` without waiting; EAGAIN on a conflict.
    fn flock(&self, fd: BorrowedFd<'_>, op: i32) -> SysResult<()> {
        sys::flock_nb(fd, op)
    }
    /// `fd`, a descriptor [`Backend::setlk`] took locks on, is being closed ([`LockFd`]):
    /// a backend that keeps the locks itself drops its owner's.
    fn lock_fd_closing(&self, _fd: BorrowedFd<'_>) {}

    // Credentials.

    /// Makes this thread create files as `uid`:`gid`; returns the ids it had, for
    /// [`Backend::restore_creds`]. Use `<dyn Backend>::creds_as`.
    fn switch_creds(&self, uid: u32, gid: u32) -> (u32, u32);
    fn restore_creds(&self, old: (u32, u32));
    /// The group files get when made without switching credentials.
    fn effective_gid(&self) -> u32 {
        // SAFETY: getegid cannot fail.
        unsafe { libc::getegid() }
    }
}

impl dyn Backend + '_ {
    /// Creates files as `uid`:`gid` on this thread until the guard is dropped.
    pub fn creds_as(&self, uid: u32, gid: u32) -> CredsGuard<'_> {
        let old = self.switch_creds(uid, gid);
        CredsGuard { host: self, old }
    }
}

/// An open descriptor that carries locks: closing it drops them, whether the host keeps
/// them with the open file description (OFD locks, flock) or the backend keeps them.
pub struct LockFd {
    fd: OwnedFd,
    host: Arc<dyn Backend>,
}

impl LockFd {
    pub fn new(fd: OwnedFd, host: Arc<dyn Backend>) -> LockFd {
        LockFd { fd, host }
    }
}

impl AsFd for LockFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Drop for LockFd {
    fn drop(&mut self) {
        self.host.lock_fd_closing(self.fd.as_fd());
    }
}

/// The thread's credentials before `creds_as`, put back when dropped.
#[must_use]
pub struct CredsGuard<'a> {
    host: &'a dyn Backend,
    old: (u32, u32),
}

impl Drop for CredsGuard<'_> {
    fn drop(&mut self) {
        self.host.restore_creds(self.old);
    }
}
