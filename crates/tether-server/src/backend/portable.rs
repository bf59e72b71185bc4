//! The portable backend: only calls macOS has as well, so that the code macOS runs is the
//! code the Linux test suites run (`tether serve --backend portable`).
//!
//! - **Node descriptors** are ordinary descriptors opened with O_NOFOLLOW: directories
//!   O_RDONLY|O_DIRECTORY, regular files O_RDONLY|O_NONBLOCK. Symlinks and special files
//!   (and files the server may not read) cannot be opened so: they are held by
//!   [`object`]'s handle, O_SYMLINK on macOS and, on Linux, O_PATH as its stand-in (the one
//!   place this backend uses a Linux-only flag, with the few calls such a handle needs).
//! - **Reopening** for I/O (no /proc/self/fd): a directory is reopened as "." relative to
//!   itself; a file by its current path (F_GETPATH on macOS; on Linux the /proc link's
//!   *text*, never the magic link), resolved one component at a time with O_NOFOLLOW from
//!   the root of the host (O_NOFOLLOW_ANY on macOS) and accepted only if it is the very
//!   file the node descriptor holds (same device and inode). A file deleted meanwhile can
//!   only be read through the node descriptor itself.
//! - **Status** from fstat/fstatat (birth times from `st_birthtime` on macOS, none on
//!   Linux without statx); access(2) from the mode bits (no ACLs).
//! - **Renames** with flags: renameatx_np(RENAME_EXCL, RENAME_SWAP) on macOS; EINVAL on
//!   Linux (renameat2 is the Linux backend's).
//! - **Byte-range locks** are kept by the server ([`Portable::setlk`]): macOS has no OFD
//!   locks, and POSIX process locks would make all of the server's owners one owner and
//!   vanish at the close of any descriptor of the file. Owners are open descriptors, their
//!   locks dropped when [`LockFd`](super::LockFd) closes them. Host processes see them
//!   through the lock helper ([`lock_helper`](super::lock_helper)), a process that holds
//!   their union with POSIX locks; its F_SETLK is also how a guest's lock is checked
//!   against the host's (F_GETLK without it). flock(2) is per open file description
//!   everywhere and used as it is.
//! - **Extended attributes**: only the `user.` name space; on macOS `user.x` is the host's
//!   `x` (so `com.apple.*` shows as `user.com.apple.*`); `security.`, `trusted.` and
//!   `system.` are not found (get) and refused with EOPNOTSUPP (set).
//! - **Directories** are read into a snapshot at offset 0 (readdir(3)); offsets are
//!   positions in it.
//! - **Case-insensitive** stand-in (tests only, `serve --case-insensitive`): a name not
//!   found as it is spelled is found by a scan of the directory ignoring case, as APFS
//!   does, so the guest meets the behaviour of a Mac's default file system on Linux.

use std::borrow::Cow;
use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Mutex;

use dashmap::DashMap;
use tether_proto::WireErrno;

use super::lock_helper::LockHelper;
use super::sys::{self, cvt};
use super::wire;
use super::{file_type, S_IFDIR, S_IFREG};
use super::{At, Backend, Birth, RangeLock, RawDirEntry, SysResult, TakeEntry};

/// A lock the server holds for one owner (an open descriptor), with an inclusive end.
#[derive(Debug, Clone, Copy)]
struct Held {
    owner: RawFd,
    typ: i16,
    start: u64,
    end: u64,
}

impl Held {
    /// Its part of the union the lock helper holds: (type, first byte, last byte).
    fn union_part(&self) -> (i16, u64, u64) {
        (self.typ, self.start, self.end)
    }
}

pub struct Portable {
    case_insensitive: bool,
    /// Byte-range locks by file (st_dev, st_ino).
    locks: Mutex<HashMap<(u64, u64), Vec<Held>>>,
    /// Holds the union of `locks` for host processes to see (`serve` starts it).
    helper: Option<LockHelper>,
    /// Directory snapshots by stream descriptor (see [`Portable::read_dir`]).
    listings: DashMap<RawFd, Vec<RawDirEntry>>,
}

impl Portable {
    pub fn new(case_insensitive: bool) -> Portable {
        Portable {
            case_insensitive,
            locks: Mutex::default(),
            helper: None,
            listings: DashMap::new(),
        }
    }

    /// Mirrors the guests' byte-range locks in `helper`, for host processes to see.
    pub fn with_lock_helper(mut self, helper: LockHelper) -> Portable {
        self.helper = Some(helper);
        self
    }

    /// A new open file description of the regular file `fd` is open on, for the lock
    /// helper: its own, as a duplicate would carry the guest's flock locks past their
    /// close; read-write where the server may (write locks need it), else read-only.
    fn lock_helper_fd(fd: BorrowedFd<'_>, st: &libc::stat) -> SysResult<OwnedFd> {
        if file_type(st) != S_IFREG {
            return Err(WireErrno::EINVAL);
        }
        let path = object::fd_path(fd)?;
        let flags = libc::O_NONBLOCK | libc::O_NOCTTY;
        open_path_nofollow(&path, libc::O_RDWR | flags, Some(st))
            .or_else(|_| open_path_nofollow(&path, libc::O_RDONLY | flags, Some(st)))
    }

    /// The name to use for `name` in `dir`: itself, or with the case-insensitive stand-in
    /// the name of an existing entry that differs only in case.
    fn fold<'a>(&self, dir: BorrowedFd<'_>, name: &'a CStr) -> SysResult<Cow<'a, CStr>> {
        if !self.case_insensitive || sys::fstatat_nofollow(dir, name).is_ok() {
            return Ok(Cow::Borrowed(name));
        }
        let want = fold_case(name.to_bytes());
        let mut found = None;
        scan_dir(dir, &mut |e| {
            if e.name != b"." && e.name != b".." && fold_case(&e.name) == want {
                found = Some(e.name);
                return false;
            }
            true
        })?;
        Ok(match found {
            Some(n) => Cow::Owned(CString::new(n).expect("a directory entry has no NUL")),
            None => Cow::Borrowed(name),
        })
    }

    /// A regular file's node descriptor `fd` opened again with `flags`, by its path.
    fn reopen_file(&self, fd: BorrowedFd<'_>, st: &libc::stat, flags: i32) -> SysResult<OwnedFd> {
        let mut last = WireErrno::ESTALE;
        for _ in 0..3 {
            let path = object::fd_path(fd)?;
            match open_path_nofollow(&path, flags, Some(st)) {
                Ok(f) => return Ok(f),
                // Renamed in between: its path changed; try the new one.
                Err(e) if e == WireErrno::ESTALE || e == WireErrno::ENOENT => last = e,
                Err(e) => return Err(e),
            }
        }
        // Deleted (or moving too fast): the node descriptor itself, if it allows the access
        // (shared with it, which positioned I/O does not mind; O_APPEND is not set on it).
        let held = fd_access(fd);
        let want = flags & libc::O_ACCMODE;
        if held == Some(libc::O_RDWR) || held == Some(want) {
            if let Ok(f) = dup(fd) {
                if flags & libc::O_TRUNC != 0 {
                    sys::ftruncate(f.as_fd(), 0)?;
                }
                return Ok(f);
            }
        }
        Err(if last == WireErrno::ENOENT {
            WireErrno::ESTALE
        } else {
            last
        })
    }
}

/// The directory holding the object `fd` and its name there, checked to be that object.
fn parent_of(fd: BorrowedFd<'_>) -> SysResult<(OwnedFd, CString)> {
    let st = sys::fstat(fd)?;
    let path = object::fd_path(fd)?;
    let (dir, name) = split_path(&path)?;
    let dir = open_path_nofollow(dir, libc::O_RDONLY | libc::O_DIRECTORY, None)?;
    let name = CString::new(name).map_err(|_| WireErrno::EINVAL)?;
    let now = sys::fstatat_nofollow(dir.as_fd(), &name)?;
    if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino) {
        return Err(WireErrno::ESTALE);
    }
    Ok((dir, name))
}

/// Names compared as a case-insensitive file system compares them (a stand-in: Unicode
/// lower case of UTF-8 names, bytes as they are otherwise; APFS also folds normalization).
pub fn fold_case(name: &[u8]) -> Vec<u8> {
    match std::str::from_utf8(name) {
        Ok(s) => s.to_lowercase().into_bytes(),
        Err(_) => name.to_ascii_lowercase(),
    }
}

/// Writes zeros from `from` up to `to`.
fn zero_fill(fd: BorrowedFd<'_>, from: u64, to: u64) -> SysResult<()> {
    let zeros = vec![0u8; 64 * 1024];
    let mut at = from;
    while at < to {
        let n = (to - at).min(zeros.len() as u64) as usize;
        sys::pwrite(fd, &zeros[..n], at)?;
        at += n as u64;
    }
    Ok(())
}

/// The access mode (O_RDONLY, O_WRONLY, O_RDWR) descriptor `fd` was opened with; None for
/// an object handle.
fn fd_access(fd: BorrowedFd<'_>) -> Option<i32> {
    if object::is_object(fd) {
        return None;
    }
    // SAFETY: F_GETFL on a valid descriptor.
    let fl = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    (fl >= 0).then_some(fl & libc::O_ACCMODE)
}

fn dup(fd: BorrowedFd<'_>) -> SysResult<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC returns a new descriptor that nothing else owns.
    let n = cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) })?;
    // SAFETY: as above.
    Ok(unsafe { OwnedFd::from_raw_fd(n) })
}

/// `path` split into its directory and last component.
fn split_path(path: &[u8]) -> SysResult<(&[u8], &[u8])> {
    let at = path
        .iter()
        .rposition(|&b| b == b'/')
        .ok_or(WireErrno::ESTALE)?;
    let name = &path[at + 1..];
    if name.is_empty() {
        return Err(WireErrno::ESTALE);
    }
    Ok((if at == 0 { b"/" } else { &path[..at] }, name))
}

/// Opens the absolute `path` with `flags` without following a symlink anywhere in it;
/// with `expect`, only if it is that file (else ESTALE).
fn open_path_nofollow(path: &[u8], flags: i32, expect: Option<&libc::stat>) -> SysResult<OwnedFd> {
    if path.first() != Some(&b'/') {
        return Err(WireErrno::ESTALE);
    }
    let (dir, name) = match split_path(path) {
        Ok(split) => split,
        // The root of the host itself.
        Err(_) => return sys::openat(cwd(), c"/", flags | libc::O_DIRECTORY, 0),
    };
    let name = CString::new(name).map_err(|_| WireErrno::EINVAL)?;
    let parent = open_dir_nofollow(dir)?;
    if let Some(st) = expect {
        // Never open what is not the file (a FIFO or a device moved there would answer).
        let now = sys::fstatat_nofollow(parent.as_fd(), &name)?;
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino) {
            return Err(WireErrno::ESTALE);
        }
    }
    let f = sys::openat(parent.as_fd(), &name, flags | libc::O_NOFOLLOW, 0)?;
    if let Some(st) = expect {
        let now = sys::fstat(f.as_fd())?;
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino) {
            return Err(WireErrno::ESTALE);
        }
    }
    Ok(f)
}

/// The directory at absolute `path`, no symlink followed on the way.
#[cfg(target_os = "macos")]
fn open_dir_nofollow(path: &[u8]) -> SysResult<OwnedFd> {
    let path = CString::new(path).map_err(|_| WireErrno::EINVAL)?;
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW_ANY;
    sys::openat(cwd(), &path, flags, 0)
}

/// The directory at absolute `path`, no symlink followed on the way: one component at a
/// time with O_NOFOLLOW (what O_NOFOLLOW_ANY does on macOS).
#[cfg(not(target_os = "macos"))]
fn open_dir_nofollow(path: &[u8]) -> SysResult<OwnedFd> {
    let mut dir = sys::openat(cwd(), c"/", libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
    for part in path.split(|&b| b == b'/').filter(|p| !p.is_empty()) {
        if part == b"." || part == b".." {
            return Err(WireErrno::ESTALE);
        }
        let part = CString::new(part).map_err(|_| WireErrno::EINVAL)?;
        let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
        dir = match sys::openat(dir.as_fd(), &part, flags, 0) {
            Ok(d) => d,
            // A directory the server may not read, only search.
            Err(WireErrno::EACCES) => object::open_dir_search(dir.as_fd(), &part)?,
            Err(e) => return Err(e),
        };
    }
    Ok(dir)
}

fn cwd() -> BorrowedFd<'static> {
    // SAFETY: AT_FDCWD is a valid "descriptor" for *at calls and is never closed.
    unsafe { BorrowedFd::borrow_raw(libc::AT_FDCWD) }
}

/// Calls `take` for every entry of directory `dir` (a descriptor of it) until it returns
/// false.
fn scan_dir(dir: BorrowedFd<'_>, take: &mut dyn FnMut(RawDirEntry) -> bool) -> SysResult<()> {
    let stream = sys::openat(dir, c".", libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
    // SAFETY: fdopendir takes over the descriptor (closed by closedir).
    let d = unsafe { libc::fdopendir(stream.as_raw_fd()) };
    if d.is_null() {
        return Err(sys::last_errno());
    }
    std::mem::forget(stream);
    let mut n = 0u64;
    loop {
        // SAFETY: d is an open DIR stream; readdir's entry lives until the next call.
        let e = unsafe { libc::readdir(d) };
        if e.is_null() {
            break;
        }
        n += 1;
        // SAFETY: readdir returned a valid entry with a NUL-terminated name.
        let (ino, kind, name) = unsafe {
            let e = &*e;
            let name = CStr::from_ptr(e.d_name.as_ptr()).to_bytes().to_vec();
            (e.d_ino as u64, e.d_type, name)
        };
        let entry = RawDirEntry {
            ino,
            next_offset: n,
            kind,
            name,
        };
        if !take(entry) {
            break;
        }
    }
    // SAFETY: d is open and closed once.
    unsafe { libc::closedir(d) };
    Ok(())
}

/// Whether the server may `mask` (access(2) bits) the object of status `st`, from its mode
/// bits and the server's credentials (no ACLs: portable hosts have different ones).
fn access_by_mode(st: &libc::stat, mask: i32) -> SysResult<()> {
    let mask = mask & (libc::R_OK | libc::W_OK | libc::X_OK);
    if mask == 0 {
        return Ok(());
    }
    let mode = st.st_mode as u32;
    // SAFETY: geteuid and getegid have no preconditions.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let allowed = if uid == 0 {
        // Root may read and write anything, and execute what someone may execute.
        let x = if mode & 0o111 != 0 || file_type(st) == S_IFDIR {
            libc::X_OK
        } else {
            0
        };
        libc::R_OK | libc::W_OK | x
    } else {
        let bits = if st.st_uid == uid {
            mode >> 6
        } else if st.st_gid == gid || in_groups(st.st_gid) {
            mode >> 3
        } else {
            mode
        };
        (bits & 7) as i32
    };
    if mask & !allowed != 0 {
        return Err(WireErrno::EACCES);
    }
    Ok(())
}

fn in_groups(gid: libc::gid_t) -> bool {
    let mut groups = vec![0 as libc::gid_t; 256];
    // SAFETY: groups is writable for its length.
    let n = unsafe { libc::getgroups(groups.len() as i32, groups.as_mut_ptr()) };
    n > 0 && groups[..n as usize].contains(&gid)
}

/// The lock range of `l` with an inclusive end.
fn range(l: &RangeLock) -> SysResult<(u64, u64)> {
    let start = u64::try_from(l.start).map_err(|_| WireErrno::EINVAL)?;
    let end = match l.len {
        0 => u64::MAX,
        n if n > 0 => start + (n as u64) - 1,
        _ => return Err(WireErrno::EINVAL),
    };
    Ok((start, end))
}

fn conflicts(a: &Held, typ: i16, (start, end): (u64, u64)) -> bool {
    a.start <= end
        && start <= a.end
        && (a.typ == libc::F_WRLCK as i16 || typ == libc::F_WRLCK as i16)
}

/// Removes `owner`'s locks in `start..=end` from `held`, keeping the parts outside it.
fn cut(held: &mut Vec<Held>, owner: RawFd, (start, end): (u64, u64)) {
    let mut out = Vec::with_capacity(held.len() + 1);
    for h in held.drain(..) {
        if h.owner != owner || h.end < start || h.start > end {
            out.push(h);
            continue;
        }
        if h.start < start {
            out.push(Held {
                end: start - 1,
                ..h
            });
        }
        if h.end > end {
            out.push(Held {
                start: end + 1,
                ..h
            });
        }
    }
    *held = out;
}

/// A host lock that conflicts with `lock`, held by another process (F_GETLK).
fn host_conflict(fd: BorrowedFd<'_>, lock: &RangeLock) -> SysResult<Option<RangeLock>> {
    sys::fcntl_lock(fd, libc::F_GETLK, lock).map(sys::conflicting)
}

impl Backend for Portable {
    fn open_node(&self, dir: BorrowedFd<'_>, name: &CStr) -> SysResult<OwnedFd> {
        let name = self.fold(dir, name)?;
        let st = sys::fstatat_nofollow(dir, &name)?;
        let fd = match file_type(&st) {
            S_IFDIR => {
                let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
                match sys::openat(dir, &name, flags, 0) {
                    Err(WireErrno::EACCES) => object::open_dir_search(dir, &name),
                    r => r,
                }
            }
            S_IFREG => {
                // Read-write where the server may: a file deleted on the host while the
                // guest has it open can then still be written (see `reopen_file`).
                let flags = libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY;
                match sys::openat(dir, &name, flags | libc::O_RDWR, 0) {
                    Err(WireErrno::EACCES | WireErrno::EROFS | WireErrno::ETXTBSY) => {
                        match sys::openat(dir, &name, flags | libc::O_RDONLY, 0) {
                            Err(WireErrno::EACCES) => object::open(dir, &name),
                            r => r,
                        }
                    }
                    r => r,
                }
            }
            _ => object::open(dir, &name),
        }?;
        let now = sys::fstat(fd.as_fd())?;
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino) {
            // Replaced between the two calls: as if looked up a moment later.
            return self.open_node(dir, &name);
        }
        Ok(fd)
    }

    fn open_dir_node(&self, dir: BorrowedFd<'_>, name: &CStr) -> SysResult<OwnedFd> {
        // The export root, by a path the host chose: symlinks in it are followed.
        sys::openat(dir, name, libc::O_RDONLY | libc::O_DIRECTORY, 0)
    }

    fn reopen(&self, fd: BorrowedFd<'_>, flags: i32) -> SysResult<OwnedFd> {
        let st = sys::fstat(fd)?;
        match file_type(&st) {
            S_IFDIR => sys::openat(fd, c".", flags | libc::O_DIRECTORY, 0),
            S_IFREG => self.reopen_file(fd, &st, flags),
            _ => Err(WireErrno::ENXIO),
        }
    }

    fn node_of_open(&self, fd: BorrowedFd<'_>) -> SysResult<OwnedFd> {
        // A descriptor of its own (not a duplicate sharing the guest's open flags).
        let st = sys::fstat(fd)?;
        if file_type(&st) == S_IFREG {
            // Read-write where it may, as `open_node` does.
            let flags = libc::O_NONBLOCK | libc::O_NOCTTY;
            for access in [libc::O_RDWR, libc::O_RDONLY] {
                if let Ok(f) = self.reopen_file(fd, &st, flags | access) {
                    return Ok(f);
                }
            }
        }
        dup(fd)
    }

    fn open_dir(&self, fd: BorrowedFd<'_>) -> SysResult<OwnedFd> {
        let stream = sys::openat(fd, c".", libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
        // A listing left by a closed stream of the same number.
        self.listings.remove(&stream.as_raw_fd());
        Ok(stream)
    }

    fn open_at(&self, (dir, name): At<'_>, flags: i32, mode: u32) -> SysResult<OwnedFd> {
        let name = self.fold(dir, name)?;
        sys::openat(dir, &name, flags, mode)
    }

    fn open_unnamed(&self, _dir: BorrowedFd<'_>, _mode: u32) -> SysResult<OwnedFd> {
        // No O_TMPFILE on macOS: the client makes its files one by one.
        Err(WireErrno::EOPNOTSUPP)
    }

    fn stat_born(&self, fd: BorrowedFd<'_>) -> SysResult<(libc::stat, Birth)> {
        let st = sys::fstat(fd)?;
        #[cfg(target_os = "macos")]
        let birth = Some((st.st_birthtime, st.st_birthtime_nsec as u32));
        #[cfg(not(target_os = "macos"))]
        let birth = None;
        Ok((st, birth))
    }

    fn stat_at(&self, dir: BorrowedFd<'_>, name: &CStr) -> SysResult<libc::stat> {
        let name = self.fold(dir, name)?;
        sys::fstatat_nofollow(dir, &name)
    }

    fn mount_root_device(&self, fd: BorrowedFd<'_>) -> SysResult<Option<(u32, u32)>> {
        object::mount_root_device(fd)
    }

    fn fd_path(&self, fd: BorrowedFd<'_>) -> SysResult<Vec<u8>> {
        object::fd_path(fd)
    }

    fn readlink(&self, fd: BorrowedFd<'_>) -> SysResult<Vec<u8>> {
        object::readlink(fd)
    }

    fn access(&self, fd: BorrowedFd<'_>, mask: i32) -> SysResult<()> {
        access_by_mode(&sys::fstat(fd)?, mask)
    }

    fn mkdir_at(&self, dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> SysResult<()> {
        sys::mkdirat(dir, &self.fold(dir, name)?, mode)
    }

    fn mknod_at(&self, dir: BorrowedFd<'_>, name: &CStr, mode: u32, rdev: u64) -> SysResult<()> {
        sys::mknodat(dir, &self.fold(dir, name)?, mode, rdev)
    }

    fn symlink_at(&self, target: &CStr, dir: BorrowedFd<'_>, name: &CStr) -> SysResult<()> {
        sys::symlinkat(target, dir, &self.fold(dir, name)?)
    }

    fn unlink_at(&self, dir: BorrowedFd<'_>, name: &CStr, flags: i32) -> SysResult<()> {
        sys::unlinkat(dir, &self.fold(dir, name)?, flags)
    }

    fn rename_at(
        &self,
        (from_dir, from): At<'_>,
        (to_dir, to): At<'_>,
        flags: u32,
    ) -> SysResult<()> {
        let from = self.fold(from_dir, from)?;
        let mut target = self.fold(to_dir, to)?;
        if let Cow::Owned(_) = target {
            // `to` differs from an existing name only in case: if that is the file being
            // renamed, the rename changes its case (the guest's spelling); else it replaces
            // the other file, as on APFS.
            let a = sys::fstatat_nofollow(from_dir, &from);
            let b = sys::fstatat_nofollow(to_dir, &target);
            if matches!((a, b), (Ok(a), Ok(b)) if (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)) {
                target = Cow::Borrowed(to);
            }
        }
        object::rename(from_dir, &from, to_dir, &target, flags)
    }

    fn link_open(&self, fd: BorrowedFd<'_>, dir: BorrowedFd<'_>, name: &CStr) -> SysResult<()> {
        let (from_dir, from) = parent_of(fd)?;
        let name = self.fold(dir, name)?;
        sys::linkat((from_dir.as_fd(), &from), (dir, &name), 0)
    }

    fn chmod_node(&self, fd: BorrowedFd<'_>, mode: u32) -> SysResult<()> {
        if object::is_object(fd) {
            return object::chmod(fd, mode);
        }
        sys::fchmod(fd, mode)
    }

    fn chown(&self, fd: BorrowedFd<'_>, uid: Option<u32>, gid: Option<u32>) -> SysResult<()> {
        if object::is_object(fd) {
            return object::chown(fd, uid, gid);
        }
        let (uid, gid) = (uid.unwrap_or(u32::MAX), gid.unwrap_or(u32::MAX));
        // SAFETY: a plain call on a valid descriptor.
        cvt(unsafe { libc::fchown(fd.as_raw_fd(), uid, gid) }).map(drop)
    }

    fn utimens(&self, fd: BorrowedFd<'_>, times: &[libc::timespec; 2]) -> SysResult<()> {
        if object::is_object(fd) {
            return object::utimens(fd, times);
        }
        // SAFETY: times points to two timespecs.
        cvt(unsafe { libc::futimens(fd.as_raw_fd(), times.as_ptr()) }).map(drop)
    }

    fn truncate_node(&self, fd: BorrowedFd<'_>, size: u64) -> SysResult<()> {
        let f = self.reopen(fd, libc::O_WRONLY | libc::O_NONBLOCK)?;
        sys::ftruncate(f.as_fd(), size)
    }

    /// Mode 0 makes the file at least `offset + len` long (macOS has no fallocate(2);
    /// F_PREALLOCATE there reserves the blocks too); KEEP_SIZE alone is a hint that may be
    /// ignored. Punching a hole or zeroing a range writes zeros (what reads then return;
    /// the blocks stay allocated). Anything else is EOPNOTSUPP.
    fn fallocate(&self, fd: BorrowedFd<'_>, mode: i32, offset: u64, len: u64) -> SysResult<()> {
        let end = offset.checked_add(len).ok_or(WireErrno::EFBIG)?;
        if len == 0 {
            return Err(WireErrno::EINVAL);
        }
        let keep = mode & wire::FALLOC_FL_KEEP_SIZE != 0;
        let size = sys::fstat(fd)?.st_size as u64;
        match mode & !wire::FALLOC_FL_KEEP_SIZE {
            0 => {
                object::preallocate(fd, offset, len);
                if !keep && size < end {
                    sys::ftruncate(fd, end)?;
                }
                Ok(())
            }
            wire::FALLOC_FL_PUNCH_HOLE if keep => zero_fill(fd, offset, end.min(size)),
            wire::FALLOC_FL_ZERO_RANGE => {
                zero_fill(fd, offset, if keep { end.min(size) } else { end })
            }
            _ => Err(WireErrno::EOPNOTSUPP),
        }
    }

    fn copy_file_range(
        &self,
        (fd_in, off_in): (BorrowedFd<'_>, u64),
        (fd_out, off_out): (BorrowedFd<'_>, u64),
        len: u64,
    ) -> SysResult<u64> {
        // Read and written here: at most 1 MiB a call, as copy_file_range may return less.
        let mut buf = vec![0u8; len.min(1 << 20) as usize];
        let n = sys::pread(fd_in, &mut buf, off_in)?;
        let w = sys::pwrite(fd_out, &buf[..n], off_out)?;
        Ok(w as u64)
    }

    /// Offset 0 reads the directory into a snapshot kept for this stream; later offsets
    /// are positions in it (readdir(3)'s telldir cookies are not portable).
    fn read_dir(&self, fd: BorrowedFd<'_>, offset: u64, take: &mut TakeEntry) -> SysResult<bool> {
        let key = fd.as_raw_fd();
        if offset == 0 || !self.listings.contains_key(&key) {
            let mut all = Vec::new();
            scan_dir(fd, &mut |e| {
                all.push(e);
                true
            })?;
            self.listings.insert(key, all);
        }
        let listing = self.listings.get(&key).ok_or(WireErrno::EBADF)?;
        for e in listing.iter().skip(offset as usize) {
            let entry = RawDirEntry {
                ino: e.ino,
                next_offset: e.next_offset,
                kind: e.kind,
                name: e.name.clone(),
            };
            if !take(entry) {
                return Ok(false);
            }
        }
        drop(listing);
        // Read to the end: the snapshot is not kept (a later call reads the directory
        // again), so closed streams leave none behind.
        self.listings.remove(&key);
        Ok(true)
    }

    fn readahead(&self, _fd: BorrowedFd<'_>, _len: usize) {}

    fn getxattr(&self, fd: BorrowedFd<'_>, name: &CStr, buf: &mut [u8]) -> SysResult<usize> {
        let host = xattr_name(name).map_err(|e| match e {
            // Other name spaces have nothing to find here.
            WireErrno::EPERM => WireErrno::ENODATA,
            e => e,
        })?;
        if object::is_object(fd) {
            return Err(WireErrno::ENODATA);
        }
        object::fgetxattr(fd, &host, buf)
    }

    fn listxattr(&self, fd: BorrowedFd<'_>, buf: &mut [u8]) -> SysResult<usize> {
        if object::is_object(fd) {
            return Ok(0);
        }
        let mut raw = vec![0u8; object::flistxattr(fd, &mut [])?];
        let n = object::flistxattr(fd, &mut raw)?;
        raw.truncate(n);
        let list = guest_xattr_list(&raw);
        if buf.is_empty() {
            return Ok(list.len());
        }
        if buf.len() < list.len() {
            return Err(WireErrno::ERANGE);
        }
        buf[..list.len()].copy_from_slice(&list);
        Ok(list.len())
    }

    fn setxattr(&self, fd: BorrowedFd<'_>, name: &CStr, value: &[u8], flags: i32) -> SysResult<()> {
        let host = xattr_name(name).map_err(|e| match e {
            WireErrno::EPERM => WireErrno::EOPNOTSUPP,
            e => e,
        })?;
        if object::is_object(fd) {
            // Linux allows user.* only on regular files and directories.
            return Err(WireErrno::EPERM);
        }
        object::fsetxattr(fd, &host, value, flags)
    }

    fn removexattr(&self, fd: BorrowedFd<'_>, name: &CStr) -> SysResult<()> {
        let host = xattr_name(name).map_err(|e| match e {
            WireErrno::EPERM => WireErrno::ENODATA,
            e => e,
        })?;
        if object::is_object(fd) {
            return Err(WireErrno::ENODATA);
        }
        object::fremovexattr(fd, &host)
    }

    fn setlk(&self, fd: BorrowedFd<'_>, lock: &RangeLock) -> SysResult<()> {
        let st = sys::fstat(fd)?;
        let key = (st.st_dev as u64, st.st_ino as u64);
        let owner = fd.as_raw_fd();
        let span = range(lock)?;
        let unlock = lock.typ as i32 == libc::F_UNLCK as i32;
        let mut all = self.locks.lock().unwrap();
        if !unlock {
            let held = all.get(&key).map_or(&[][..], |h| &h[..]);
            if (held.iter()).any(|h| h.owner != owner && conflicts(h, lock.typ, span)) {
                return Err(WireErrno::EAGAIN);
            }
            // The helper's F_SETLK checks the host's locks and shows them ours at once;
            // without it, F_GETLK.
            let open = || Self::lock_helper_fd(fd, &st);
            let helper = self.helper.as_ref();
            match helper.and_then(|h| h.lock(key, owner, held.is_empty(), open, lock.typ, span)) {
                Some(r) => r?,
                None if host_conflict(fd, lock)?.is_some() => return Err(WireErrno::EAGAIN),
                None => {}
            }
        }
        let held = all.entry(key).or_default();
        cut(held, owner, span);
        if unlock {
            if let Some(helper) = &self.helper {
                helper.restate(key, span, held.iter().map(Held::union_part));
            }
        } else {
            held.push(Held {
                owner,
                typ: lock.typ,
                start: span.0,
                end: span.1,
            });
        }
        if held.is_empty() {
            all.remove(&key);
        }
        Ok(())
    }

    fn getlk(&self, fd: BorrowedFd<'_>, lock: &RangeLock) -> SysResult<Option<RangeLock>> {
        let st = sys::fstat(fd)?;
        let key = (st.st_dev as u64, st.st_ino as u64);
        let owner = fd.as_raw_fd();
        let span = range(lock)?;
        let all = self.locks.lock().unwrap();
        let ours = all.get(&key).and_then(|held| {
            (held.iter()).find(|h| h.owner != owner && conflicts(h, lock.typ, span))
        });
        if let Some(h) = ours {
            let len = if h.end == u64::MAX {
                0
            } else {
                (h.end - h.start + 1) as i64
            };
            return Ok(Some(RangeLock {
                typ: h.typ,
                start: h.start as i64,
                len,
                pid: -1,
            }));
        }
        // The helper's own locks (the guests') are not the host's: it asks for the others.
        match (self.helper.as_ref()).and_then(|h| h.host_conflict(key, lock)) {
            Some(r) => r,
            None => host_conflict(fd, lock),
        }
    }

    fn lock_fd_closing(&self, fd: BorrowedFd<'_>) {
        let owner = fd.as_raw_fd();
        let Ok(st) = sys::fstat(fd) else {
            return;
        };
        let key = (st.st_dev as u64, st.st_ino as u64);
        let mut all = self.locks.lock().unwrap();
        if let Some(held) = all.get_mut(&key) {
            let mine = (held.iter()).filter(|h| h.owner == owner);
            let span = mine.fold(None, |s: Option<(u64, u64)>, h| {
                Some(s.map_or((h.start, h.end), |(a, b)| (a.min(h.start), b.max(h.end))))
            });
            held.retain(|h| h.owner != owner);
            if let (Some(helper), Some(span)) = (&self.helper, span) {
                helper.restate(key, span, held.iter().map(Held::union_part));
            }
            if held.is_empty() {
                all.remove(&key);
            }
        }
        if let Some(helper) = &self.helper {
            helper.owner_closing(key, owner);
        }
    }

    fn switch_creds(&self, uid: u32, gid: u32) -> (u32, u32) {
        object::switch_creds(uid, gid)
    }

    fn restore_creds(&self, old: (u32, u32)) {
        object::restore_creds(old)
    }
}

/// The host's name of the guest's extended attribute `name`: the `user.` name space only.
/// EPERM stands for another known name space (security., trusted., system.: not kept on
/// a portable host), EOPNOTSUPP for an unknown one, EINVAL for "user." alone.
fn xattr_name(name: &CStr) -> SysResult<CString> {
    let bytes = name.to_bytes();
    let Some(rest) = bytes.strip_prefix(b"user.") else {
        let known = [&b"security."[..], b"trusted.", b"system."];
        return Err(if known.iter().any(|k| bytes.starts_with(k)) {
            WireErrno::EPERM
        } else {
            WireErrno::EOPNOTSUPP
        });
    };
    if rest.is_empty() {
        return Err(WireErrno::EINVAL);
    }
    #[cfg(target_os = "macos")]
    return CString::new(rest).map_err(|_| WireErrno::EINVAL);
    #[cfg(not(target_os = "macos"))]
    Ok(name.to_owned())
}

/// The guest's list of names (NUL-separated) for the host's list `raw`.
fn guest_xattr_list(raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(raw.len());
    for name in raw.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        #[cfg(target_os = "macos")]
        {
            out.extend_from_slice(b"user.");
            out.extend_from_slice(name);
            out.push(0);
        }
        #[cfg(not(target_os = "macos"))]
        if name.starts_with(b"user.") {
            out.extend_from_slice(name);
            out.push(0);
        }
    }
    out
}

/// What differs between the hosts the portable backend runs on: handles of objects that
/// cannot be opened for reading (symlinks, special files), descriptor paths, xattr calls,
/// renames with flags, per-thread credentials.
#[cfg(target_os = "linux")]
mod object {
    use super::*;
    use crate::backend::linux_sys;

    /// A handle of an object that is not opened for I/O: O_PATH, the Linux stand-in for
    /// macOS's O_SYMLINK.
    pub fn open(dir: BorrowedFd<'_>, name: &CStr) -> SysResult<OwnedFd> {
        linux_sys::open_path(dir, name)
    }

    /// A directory the server may search but not read.
    pub fn open_dir_search(dir: BorrowedFd<'_>, name: &CStr) -> SysResult<OwnedFd> {
        sys::openat(
            dir,
            name,
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW,
            0,
        )
    }

    pub fn is_object(fd: BorrowedFd<'_>) -> bool {
        // SAFETY: F_GETFL on a valid descriptor.
        let fl = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
        fl >= 0 && fl & libc::O_PATH != 0
    }

    /// The descriptor's path: the text of its /proc link (macOS: F_GETPATH).
    pub fn fd_path(fd: BorrowedFd<'_>) -> SysResult<Vec<u8>> {
        linux_sys::fd_path(fd)
    }

    pub fn readlink(fd: BorrowedFd<'_>) -> SysResult<Vec<u8>> {
        linux_sys::readlink_fd(fd)
    }

    pub fn chmod(fd: BorrowedFd<'_>, mode: u32) -> SysResult<()> {
        let st = sys::fstat(fd)?;
        if file_type(&st) == super::super::S_IFLNK {
            return Err(WireErrno::EOPNOTSUPP);
        }
        // An O_PATH handle takes no fchmod: through the parent, by name.
        let (dir, name) = parent_of(fd)?;
        sys::fchmodat(dir.as_fd(), &name, mode, 0)
    }

    pub fn chown(fd: BorrowedFd<'_>, uid: Option<u32>, gid: Option<u32>) -> SysResult<()> {
        linux_sys::fchown_empty(fd, uid, gid)
    }

    pub fn utimens(fd: BorrowedFd<'_>, times: &[libc::timespec; 2]) -> SysResult<()> {
        linux_sys::utimens_empty(fd, times)
    }

    pub fn mount_root_device(fd: BorrowedFd<'_>) -> SysResult<Option<(u32, u32)>> {
        // Only Linux has Tether mounts (the client) to refuse inside an export.
        linux_sys::mount_root_device(fd)
    }

    pub fn rename(
        from_dir: BorrowedFd<'_>,
        from: &CStr,
        to_dir: BorrowedFd<'_>,
        to: &CStr,
        flags: u32,
    ) -> SysResult<()> {
        if flags != 0 {
            // renameat2 is the Linux backend's; macOS's renameatx_np is not here.
            return Err(WireErrno::EINVAL);
        }
        // SAFETY: valid C strings.
        let r = unsafe {
            libc::renameat(
                from_dir.as_raw_fd(),
                from.as_ptr(),
                to_dir.as_raw_fd(),
                to.as_ptr(),
            )
        };
        cvt(r).map(drop)
    }

    pub fn preallocate(_fd: BorrowedFd<'_>, _offset: u64, _len: u64) {}

    pub fn fgetxattr(fd: BorrowedFd<'_>, name: &CStr, buf: &mut [u8]) -> SysResult<usize> {
        let (o, len) = (sys::xattr_out(buf), buf.len());
        // SAFETY: `o` is null or writable for `len` bytes.
        sys::cvt_isize(unsafe { libc::fgetxattr(fd.as_raw_fd(), name.as_ptr(), o, len) })
    }

    pub fn flistxattr(fd: BorrowedFd<'_>, buf: &mut [u8]) -> SysResult<usize> {
        let (o, len) = (sys::xattr_out(buf), buf.len());
        // SAFETY: as for fgetxattr.
        sys::cvt_isize(unsafe { libc::flistxattr(fd.as_raw_fd(), o.cast(), len) })
    }

    pub fn fsetxattr(fd: BorrowedFd<'_>, name: &CStr, value: &[u8], flags: i32) -> SysResult<()> {
        let (v, len) = (value.as_ptr().cast(), value.len());
        // SAFETY: value is readable for its length.
        cvt(unsafe { libc::fsetxattr(fd.as_raw_fd(), name.as_ptr(), v, len, flags) }).map(drop)
    }

    pub fn fremovexattr(fd: BorrowedFd<'_>, name: &CStr) -> SysResult<()> {
        // SAFETY: valid C string.
        cvt(unsafe { libc::fremovexattr(fd.as_raw_fd(), name.as_ptr()) }).map(drop)
    }

    pub fn switch_creds(uid: u32, gid: u32) -> (u32, u32) {
        linux_sys::switch_fs_ids(uid, gid)
    }

    pub fn restore_creds(old: (u32, u32)) {
        linux_sys::restore_fs_ids(old)
    }
}

#[cfg(not(target_os = "linux"))]
mod object {
    use super::*;

    /// A handle of a symlink or a FIFO (O_SYMLINK opens the link itself; a FIFO is opened
    /// for reading without waiting). Sockets and devices are not opened (ENXIO).
    pub fn open(dir: BorrowedFd<'_>, name: &CStr) -> SysResult<OwnedFd> {
        let st = sys::fstatat_nofollow(dir, name)?;
        match file_type(&st) {
            super::super::S_IFLNK => sys::openat(dir, name, libc::O_SYMLINK | libc::O_RDONLY, 0),
            super::super::S_IFIFO => sys::openat(
                dir,
                name,
                libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOFOLLOW,
                0,
            ),
            // A file the server may not read: for events only.
            S_IFREG => sys::openat(dir, name, libc::O_EVTONLY | libc::O_NOFOLLOW, 0),
            _ => Err(WireErrno::ENXIO),
        }
    }

    pub fn open_dir_search(dir: BorrowedFd<'_>, name: &CStr) -> SysResult<OwnedFd> {
        let flags = libc::O_EVTONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
        sys::openat(dir, name, flags, 0)
    }

    /// Every descriptor here takes the f* calls (an O_SYMLINK one acts on the link).
    pub fn is_object(fd: BorrowedFd<'_>) -> bool {
        sys::fstat(fd).is_ok_and(|st| file_type(&st) == super::super::S_IFLNK)
    }

    pub fn fd_path(fd: BorrowedFd<'_>) -> SysResult<Vec<u8>> {
        let mut buf = vec![0u8; libc::PATH_MAX as usize];
        // SAFETY: F_GETPATH writes at most MAXPATHLEN bytes into buf.
        cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETPATH, buf.as_mut_ptr()) })?;
        let n = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        buf.truncate(n);
        Ok(buf)
    }

    pub fn readlink(fd: BorrowedFd<'_>) -> SysResult<Vec<u8>> {
        let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
        // SAFETY: buf is writable for its length.
        let n =
            cvt(unsafe { libc::freadlink(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) })?;
        buf.truncate(n as usize);
        Ok(buf)
    }

    pub fn chmod(fd: BorrowedFd<'_>, mode: u32) -> SysResult<()> {
        sys::fchmod(fd, mode)
    }

    pub fn chown(fd: BorrowedFd<'_>, uid: Option<u32>, gid: Option<u32>) -> SysResult<()> {
        let (uid, gid) = (uid.unwrap_or(u32::MAX), gid.unwrap_or(u32::MAX));
        // SAFETY: a plain call on a valid descriptor.
        cvt(unsafe { libc::fchown(fd.as_raw_fd(), uid, gid) }).map(drop)
    }

    pub fn utimens(fd: BorrowedFd<'_>, times: &[libc::timespec; 2]) -> SysResult<()> {
        // SAFETY: times points to two timespecs.
        cvt(unsafe { libc::futimens(fd.as_raw_fd(), times.as_ptr()) }).map(drop)
    }

    pub fn mount_root_device(_fd: BorrowedFd<'_>) -> SysResult<Option<(u32, u32)>> {
        // No Tether mount can be inside a macOS export (the client is Linux's).
        Ok(None)
    }

    pub fn rename(
        from_dir: BorrowedFd<'_>,
        from: &CStr,
        to_dir: BorrowedFd<'_>,
        to: &CStr,
        flags: u32,
    ) -> SysResult<()> {
        let mut host = 0;
        if flags & wire::RENAME_NOREPLACE != 0 {
            host |= libc::RENAME_EXCL;
        }
        if flags & wire::RENAME_EXCHANGE != 0 {
            host |= libc::RENAME_SWAP;
        }
        // SAFETY: valid C strings.
        let r = unsafe {
            libc::renameatx_np(
                from_dir.as_raw_fd(),
                from.as_ptr(),
                to_dir.as_raw_fd(),
                to.as_ptr(),
                host,
            )
        };
        cvt(r).map(drop)
    }

    /// F_PREALLOCATE: a hint; the size is set by the caller.
    pub fn preallocate(fd: BorrowedFd<'_>, offset: u64, len: u64) {
        let mut store = libc::fstore_t {
            fst_flags: libc::F_ALLOCATEALL,
            fst_posmode: libc::F_PEOFPOSMODE,
            fst_offset: 0,
            fst_length: (offset + len) as libc::off_t,
            fst_bytesalloc: 0,
        };
        // SAFETY: store is a valid fstore_t that outlives the call.
        unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_PREALLOCATE, &mut store) };
    }

    /// macOS says ENOATTR where Linux says ENODATA.
    fn nodata<T>(r: SysResult<T>) -> SysResult<T> {
        r.map_err(|e| {
            if e.to_host() == libc::ENOATTR {
                WireErrno::ENODATA
            } else {
                e
            }
        })
    }

    pub fn fgetxattr(fd: BorrowedFd<'_>, name: &CStr, buf: &mut [u8]) -> SysResult<usize> {
        let (o, len) = (sys::xattr_out(buf), buf.len());
        // SAFETY: `o` is null or writable for `len` bytes.
        nodata(sys::cvt_isize(unsafe {
            libc::fgetxattr(fd.as_raw_fd(), name.as_ptr(), o, len, 0, 0)
        }))
    }

    pub fn flistxattr(fd: BorrowedFd<'_>, buf: &mut [u8]) -> SysResult<usize> {
        let (o, len) = (sys::xattr_out(buf), buf.len());
        // SAFETY: as for fgetxattr.
        sys::cvt_isize(unsafe { libc::flistxattr(fd.as_raw_fd(), o.cast(), len, 0) })
    }

    pub fn fsetxattr(fd: BorrowedFd<'_>, name: &CStr, value: &[u8], flags: i32) -> SysResult<()> {
        let (v, len) = (value.as_ptr().cast(), value.len());
        let flags = wire::xattr_flags(flags);
        // SAFETY: value is readable for its length.
        nodata(cvt(unsafe {
            libc::fsetxattr(fd.as_raw_fd(), name.as_ptr(), v, len, 0, flags)
        }))
        .map(drop)
    }

    pub fn fremovexattr(fd: BorrowedFd<'_>, name: &CStr) -> SysResult<()> {
        // SAFETY: valid C string.
        nodata(cvt(unsafe {
            libc::fremovexattr(fd.as_raw_fd(), name.as_ptr(), 0)
        }))
        .map(drop)
    }

    extern "C" {
        /// Per-thread credentials (macOS, libSystem): what Apple's own file servers use.
        fn pthread_setugid_np(uid: libc::uid_t, gid: libc::gid_t) -> libc::c_int;
    }

    /// KAUTH_UID_NONE: back to the process's credentials.
    const KAUTH_UID_NONE: u32 = !0 - 100;

    pub fn switch_creds(uid: u32, gid: u32) -> (u32, u32) {
        // SAFETY: only this thread's credentials change.
        unsafe { pthread_setugid_np(uid, gid) };
        (KAUTH_UID_NONE, KAUTH_UID_NONE)
    }

    pub fn restore_creds(_old: (u32, u32)) {
        // SAFETY: as above.
        unsafe { pthread_setugid_np(KAUTH_UID_NONE, KAUTH_UID_NONE) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn cstr(s: &str) -> CString {
        CString::new(s).unwrap()
    }

    fn dir_fd(p: &std::path::Path) -> OwnedFd {
        let c = cstr(p.to_str().unwrap());
        sys::openat(cwd(), &c, libc::O_RDONLY | libc::O_DIRECTORY, 0).unwrap()
    }

    fn lock(typ: i32, start: i64, len: i64) -> RangeLock {
        RangeLock::request(typ, start, len)
    }

    /// Two owners (open descriptions) of one file exclude each other as OFD locks do; one
    /// owner's own locks never conflict; closing an owner drops its locks.
    #[test]
    fn byte_range_locks_are_per_owner_and_go_with_its_close() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("f"), b"0123456789").unwrap();
        let host: Arc<dyn Backend> = Arc::new(Portable::new(false));
        let dir = dir_fd(d.path());
        let node = host.open_node(dir.as_fd(), &cstr("f")).unwrap();
        let open = || {
            let fd = host.reopen(node.as_fd(), libc::O_RDWR).unwrap();
            super::super::LockFd::new(fd, host.clone())
        };
        let (a, b) = (open(), open());
        let w = libc::F_WRLCK as i32;
        let r = libc::F_RDLCK as i32;
        host.setlk(a.as_fd(), &lock(w, 0, 5)).unwrap();
        host.setlk(a.as_fd(), &lock(r, 0, 10)).unwrap(); // its own: converted
        assert_eq!(
            host.setlk(b.as_fd(), &lock(w, 4, 1)),
            Err(WireErrno::EAGAIN)
        );
        host.setlk(b.as_fd(), &lock(r, 0, 10)).unwrap(); // read locks share
        assert_eq!(host.setlk(a.as_fd(), &lock(w, 12, 1)), Ok(()));
        let c = host.getlk(b.as_fd(), &lock(w, 11, 0)).unwrap().unwrap();
        assert_eq!((c.typ as i32, c.start, c.len, c.pid), (w, 12, 1, -1));
        // Unlocking the middle of a range keeps its ends.
        host.setlk(b.as_fd(), &lock(libc::F_UNLCK as i32, 0, 0))
            .unwrap();
        host.setlk(a.as_fd(), &lock(libc::F_UNLCK as i32, 3, 2))
            .unwrap();
        assert!(host.getlk(b.as_fd(), &lock(w, 3, 2)).unwrap().is_none());
        assert!(host.getlk(b.as_fd(), &lock(w, 2, 1)).unwrap().is_some());
        assert!(host.getlk(b.as_fd(), &lock(w, 5, 1)).unwrap().is_some());
        drop(a);
        assert!(host.getlk(b.as_fd(), &lock(w, 0, 0)).unwrap().is_none());
        host.setlk(b.as_fd(), &lock(w, 0, 0)).unwrap();
    }

    /// With the lock helper, this process (the host's view) sees the union of the guests'
    /// byte-range locks, held by the helper's pid; a guest is refused what the host holds
    /// and asks the helper, not F_GETLK, who holds it; releases show at once. The host's
    /// locks here are OFD locks: the server's own opens and closes would drop POSIX ones.
    /// A dead helper leaves the guests excluding each other, and the host still seen.
    #[cfg(target_os = "linux")]
    #[test]
    fn the_lock_helper_shows_the_guests_locks_to_the_host() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("f");
        std::fs::write(&path, b"0123456789").unwrap();
        use super::super::lock_helper::tests::{fcntl_fl, helper};
        let helper = helper();
        let pid = helper.pid() as i32;
        let host: Arc<dyn Backend> = Arc::new(Portable::new(false).with_lock_helper(helper));
        let dir = dir_fd(d.path());
        let node = host.open_node(dir.as_fd(), &cstr("f")).unwrap();
        let open = || {
            let fd = host.reopen(node.as_fd(), libc::O_RDWR).unwrap();
            super::super::LockFd::new(fd, host.clone())
        };
        let (a, b) = (open(), open());
        let probe = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let seen = |typ: i32, start, len| {
            let (t, s, l, pid) = fcntl_fl(probe.as_fd(), libc::F_GETLK, typ as i16, start, len);
            (t as i32, s, l, pid)
        };
        let (w, r, u) = (
            libc::F_WRLCK as i32,
            libc::F_RDLCK as i32,
            libc::F_UNLCK as i32,
        );

        host.setlk(a.as_fd(), &lock(w, 0, 5)).unwrap();
        assert_eq!(seen(w, 0, 0), (w, 0, 5, pid));
        host.setlk(a.as_fd(), &lock(r, 0, 10)).unwrap();
        host.setlk(b.as_fd(), &lock(r, 0, 10)).unwrap();
        assert_eq!(seen(w, 0, 0), (r, 0, 10, pid));
        assert_eq!(seen(r, 0, 0).0, u);

        // The host's lock: refused to a guest, and reported as the host's.
        fcntl_fl(probe.as_fd(), libc::F_OFD_SETLK, r as i16, 20, 5);
        assert_eq!(
            host.setlk(a.as_fd(), &lock(w, 18, 3)),
            Err(WireErrno::EAGAIN)
        );
        host.setlk(a.as_fd(), &lock(r, 18, 2)).unwrap(); // read locks share

        // Releases: the union shrinks to what is left.
        host.setlk(b.as_fd(), &lock(u, 0, 0)).unwrap();
        host.setlk(a.as_fd(), &lock(u, 3, 2)).unwrap();
        assert_eq!(seen(w, 3, 2).0, u);
        assert_eq!(seen(w, 0, 20), (r, 0, 3, pid));
        assert_eq!(seen(w, 5, 13), (r, 5, 5, pid));
        // Only a holds locks now: the helper's (its) are not reported to it, the host's is.
        let c = host.getlk(a.as_fd(), &lock(w, 0, 0)).unwrap().unwrap();
        assert_eq!((c.typ as i32, c.start, c.len), (r, 20, 5));
        drop(a);
        assert_eq!(seen(w, 0, 20).0, u);

        // The helper dies: the guests still exclude each other and see the host's lock.
        // SAFETY: a signal to the helper this test started.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        std::thread::sleep(std::time::Duration::from_millis(100));
        host.setlk(b.as_fd(), &lock(w, 0, 5)).unwrap();
        let c = open();
        assert_eq!(
            host.setlk(c.as_fd(), &lock(w, 2, 1)),
            Err(WireErrno::EAGAIN)
        );
        assert_eq!(
            host.setlk(c.as_fd(), &lock(w, 21, 1)),
            Err(WireErrno::EAGAIN)
        );
        host.setlk(c.as_fd(), &lock(w, 6, 1)).unwrap();
    }

    /// A file is reopened by its path, checked by inode; once deleted, through the node
    /// descriptor; a rename in between is followed.
    #[test]
    fn files_are_reopened_by_path_and_after_deletion_through_the_node() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("f"), b"data").unwrap();
        let host = Portable::new(false);
        let dir = dir_fd(d.path());
        let node = host.open_node(dir.as_fd(), &cstr("f")).unwrap();
        std::fs::rename(d.path().join("f"), d.path().join("g")).unwrap();
        let f = host.reopen(node.as_fd(), libc::O_RDONLY).unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(host.pread(f.as_fd(), &mut buf, 0).unwrap(), 4);
        // Another file at the old name is never opened in its place.
        std::fs::write(d.path().join("f"), b"other").unwrap();
        std::fs::remove_file(d.path().join("g")).unwrap();
        let w = host.reopen(node.as_fd(), libc::O_WRONLY).unwrap();
        host.pwrite(w.as_fd(), b"DATA!", 0).unwrap();
        assert_eq!(host.pread(f.as_fd(), &mut buf, 0).unwrap(), 5);
        assert_eq!(&buf[..5], b"DATA!");
        assert_eq!(std::fs::read(d.path().join("f")).unwrap(), b"other");
    }

    /// Symlinks and FIFOs are nodes too; a symlink is never followed.
    #[test]
    fn symlinks_and_fifos_are_held_without_being_opened_through() {
        let d = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/etc/passwd", d.path().join("l")).unwrap();
        let fifo = cstr(d.path().join("p").to_str().unwrap());
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let host = Portable::new(false);
        let dir = dir_fd(d.path());
        let l = host.open_node(dir.as_fd(), &cstr("l")).unwrap();
        assert_eq!(host.readlink(l.as_fd()).unwrap(), b"/etc/passwd");
        assert_eq!(
            file_type(&host.stat(l.as_fd()).unwrap()),
            super::super::S_IFLNK
        );
        assert!(host.reopen(l.as_fd(), libc::O_RDONLY).is_err());
        let p = host.open_node(dir.as_fd(), &cstr("p")).unwrap();
        host.chmod_node(p.as_fd(), 0o640).unwrap();
        let mode = std::fs::symlink_metadata(d.path().join("p")).unwrap();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
            0o640
        );
    }

    #[cfg(not(target_os = "macos"))]
    #[test]
    fn xattr_name_spaces() {
        assert_eq!(xattr_name(&cstr("user.a")), Ok(cstr("user.a")));
        assert_eq!(xattr_name(&cstr("user.")), Err(WireErrno::EINVAL));
        assert_eq!(xattr_name(&cstr("security.selinux")), Err(WireErrno::EPERM));
        assert_eq!(xattr_name(&cstr("trusted.x")), Err(WireErrno::EPERM));
        assert_eq!(xattr_name(&cstr("other.x")), Err(WireErrno::EOPNOTSUPP));
        assert_eq!(
            guest_xattr_list(b"user.a\0security.b\0user.c\0"),
            b"user.a\0user.c\0"
        );
    }

    /// The case-insensitive stand-in finds a name in another case, prefers the exact one,
    /// and leaves a missing name as it is.
    #[test]
    fn case_insensitive_names_are_found_in_any_case() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("README"), b"r").unwrap();
        std::fs::write(d.path().join("Ünïcode"), b"u").unwrap();
        let host = Portable::new(true);
        let dir = dir_fd(d.path());
        let ino = |n: &str| host.stat_at(dir.as_fd(), &cstr(n)).map(|s| s.st_ino);
        assert_eq!(ino("readme"), ino("README"));
        assert_eq!(ino("üNÏCODE"), ino("Ünïcode"));
        assert_eq!(ino("nothere"), Err(WireErrno::ENOENT));
        assert_eq!(
            host.mkdir_at(dir.as_fd(), &cstr("Readme"), 0o755),
            Err(WireErrno::EEXIST)
        );
        host.unlink_at(dir.as_fd(), &cstr("readme"), 0).unwrap();
        assert!(!d.path().join("README").exists());
    }
}
