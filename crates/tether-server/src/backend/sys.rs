//! Thin, safe wrappers over the POSIX calls the server uses that exist on Linux and macOS
//! alike: both backends' (linux.rs, portable.rs) and the watchers'. The Linux-only ones
//! (O_PATH, statx, /proc/self/fd, OFD locks, renameat2, getdents64, setfsuid) are in
//! linux_sys.rs. Every call is relative to a descriptor the server holds; none of them
//! resolves a multi-component path from the guest.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use tether_proto::WireErrno;

use super::RangeLock;

/// A call's result: the errno goes to the guest as it is.
pub type SysResult<T> = Result<T, WireErrno>;

/// A name in a directory: the directory's descriptor and one checked component.
pub type At<'a> = (BorrowedFd<'a>, &'a CStr);

pub(super) fn last_errno() -> WireErrno {
    WireErrno::from_host(
        io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO),
    )
}

/// A syscall's return value: negative when it failed, with the error in errno.
pub(super) fn cvt<T: Default + PartialOrd>(ret: T) -> SysResult<T> {
    (ret >= T::default()).then_some(ret).ok_or_else(last_errno)
}

pub(super) fn cvt_isize(ret: isize) -> SysResult<usize> {
    cvt(ret).map(|n| n as usize)
}

/// The descriptor a call like inotify_init1 or fanotify_init just returned, or its error.
pub fn new_fd(ret: libc::c_int) -> io::Result<OwnedFd> {
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(ret) })
}

pub fn openat(dir: BorrowedFd<'_>, name: &CStr, flags: i32, mode: u32) -> SysResult<OwnedFd> {
    // SAFETY: `name` is a valid C string; the returned descriptor is fresh and owned by us.
    let fd = cvt(unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            flags | libc::O_CLOEXEC,
            mode,
        )
    })?;
    // SAFETY: openat returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

pub fn fstat(fd: BorrowedFd<'_>) -> SysResult<libc::stat> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: st points to writable memory of the right size.
    cvt(unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) })?;
    // SAFETY: fstat succeeded, so it filled st.
    Ok(unsafe { st.assume_init() })
}

pub fn fstatat_nofollow(dir: BorrowedFd<'_>, name: &CStr) -> SysResult<libc::stat> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: valid C string and writable stat buffer.
    cvt(unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            name.as_ptr(),
            st.as_mut_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    // SAFETY: fstatat succeeded, so it filled st.
    Ok(unsafe { st.assume_init() })
}

pub fn mkdirat(dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> SysResult<()> {
    // SAFETY: valid C string.
    cvt(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), mode as libc::mode_t) }).map(drop)
}

pub fn mknodat(dir: BorrowedFd<'_>, name: &CStr, mode: u32, rdev: u64) -> SysResult<()> {
    // SAFETY: valid C string.
    cvt(unsafe {
        libc::mknodat(
            dir.as_raw_fd(),
            name.as_ptr(),
            mode as libc::mode_t,
            rdev as libc::dev_t,
        )
    })
    .map(drop)
}

pub fn unlinkat(dir: BorrowedFd<'_>, name: &CStr, flags: i32) -> SysResult<()> {
    // SAFETY: valid C string.
    cvt(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), flags) }).map(drop)
}

pub fn symlinkat(target: &CStr, dir: BorrowedFd<'_>, name: &CStr) -> SysResult<()> {
    // SAFETY: valid C strings.
    cvt(unsafe { libc::symlinkat(target.as_ptr(), dir.as_raw_fd(), name.as_ptr()) }).map(drop)
}

/// A name in a directory as the *at calls take it.
pub(super) fn raw_at((dir, name): At<'_>) -> (RawFd, *const libc::c_char) {
    (dir.as_raw_fd(), name.as_ptr())
}

pub fn linkat(from: At<'_>, to: At<'_>, flags: i32) -> SysResult<()> {
    let ((old_dir, old), (new_dir, new)) = (raw_at(from), raw_at(to));
    // SAFETY: valid C strings.
    cvt(unsafe { libc::linkat(old_dir, old, new_dir, new, flags) }).map(drop)
}

pub fn fchmod(fd: BorrowedFd<'_>, mode: u32) -> SysResult<()> {
    // SAFETY: plain syscall on a valid descriptor.
    cvt(unsafe { libc::fchmod(fd.as_raw_fd(), mode as libc::mode_t) }).map(drop)
}

/// fchmodat(2); `flags` AT_SYMLINK_NOFOLLOW or 0.
pub fn fchmodat(dir: BorrowedFd<'_>, name: &CStr, mode: u32, flags: i32) -> SysResult<()> {
    let mode = mode as libc::mode_t;
    // SAFETY: valid C string.
    cvt(unsafe { libc::fchmodat(dir.as_raw_fd(), name.as_ptr(), mode, flags) }).map(drop)
}

pub fn ftruncate(fd: BorrowedFd<'_>, size: u64) -> SysResult<()> {
    // SAFETY: plain syscall on a valid descriptor.
    cvt(unsafe { libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) }).map(drop)
}

/// Repeats a positional read or write until `len` bytes are done, the file ends, or an
/// error comes after some progress (then the progress is returned, as read(2) would).
fn whole(len: usize, mut step: impl FnMut(usize) -> isize) -> SysResult<usize> {
    let mut done = 0;
    while done < len {
        match cvt_isize(step(done)) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(WireErrno::EINTR) => continue,
            Err(e) if done == 0 => return Err(e),
            Err(_) => break,
        }
    }
    Ok(done)
}

pub fn pread(fd: BorrowedFd<'_>, buf: &mut [u8], offset: u64) -> SysResult<usize> {
    let len = buf.len();
    whole(len, |done| {
        // SAFETY: the pointer and length describe the unfilled part of buf.
        unsafe {
            libc::pread(
                fd.as_raw_fd(),
                buf[done..].as_mut_ptr().cast(),
                len - done,
                (offset + done as u64) as libc::off_t,
            )
        }
    })
}

pub fn pwrite(fd: BorrowedFd<'_>, buf: &[u8], offset: u64) -> SysResult<usize> {
    whole(buf.len(), |done| {
        // SAFETY: the pointer and length describe the unwritten part of buf.
        unsafe {
            libc::pwrite(
                fd.as_raw_fd(),
                buf[done..].as_ptr().cast(),
                buf.len() - done,
                (offset + done as u64) as libc::off_t,
            )
        }
    })
}

pub fn fsync(fd: BorrowedFd<'_>, datasync: bool) -> SysResult<()> {
    // SAFETY: plain syscalls on a valid descriptor.
    // macOS has no fdatasync: fsync there.
    #[cfg(target_os = "linux")]
    let datasync_call = libc::fdatasync;
    #[cfg(not(target_os = "linux"))]
    let datasync_call = libc::fsync;
    cvt(unsafe {
        if datasync {
            datasync_call(fd.as_raw_fd())
        } else {
            libc::fsync(fd.as_raw_fd())
        }
    })
    .map(drop)
}

pub fn fstatvfs(fd: BorrowedFd<'_>) -> SysResult<libc::statvfs> {
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: writable buffer of the right size.
    cvt(unsafe { libc::fstatvfs(fd.as_raw_fd(), st.as_mut_ptr()) })?;
    // SAFETY: fstatvfs succeeded.
    Ok(unsafe { st.assume_init() })
}

pub fn lseek(fd: BorrowedFd<'_>, offset: i64, whence: i32) -> SysResult<u64> {
    // SAFETY: plain syscall on a valid descriptor.
    let r = unsafe { libc::lseek(fd.as_raw_fd(), offset, whence) };
    if r < 0 {
        Err(last_errno())
    } else {
        Ok(r as u64)
    }
}

/// faccessat(2); `flags` AT_SYMLINK_NOFOLLOW or 0.
pub fn faccessat(dir: BorrowedFd<'_>, name: &CStr, mask: i32, flags: i32) -> SysResult<()> {
    // SAFETY: valid C string.
    cvt(unsafe { libc::faccessat(dir.as_raw_fd(), name.as_ptr(), mask, flags) }).map(drop)
}

/// Raises the open-file soft limit to the hard limit and returns the new limit.
pub fn raise_nofile_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: lim is a valid rlimit to fill and then to set.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 1024;
        }
        lim.rlim_cur = lim.rlim_max;
        // macOS refuses more than OPEN_MAX (its hard limit is often "unlimited").
        #[cfg(target_os = "macos")]
        {
            lim.rlim_cur = lim.rlim_cur.min(10_240);
        }
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
    }
    lim.rlim_cur as u64
}

/// The fcntl(2) lock command `cmd` (F_SETLK, F_GETLK, and on Linux the F_OFD_ ones) on
/// `fd` for `l`; returns the lock as the call left it: for a GETLK, the first lock that
/// conflicts with `l`, or one of type F_UNLCK.
pub fn fcntl_lock(fd: BorrowedFd<'_>, cmd: i32, l: &RangeLock) -> SysResult<RangeLock> {
    // SAFETY: libc::flock is plain data; all-zero is a valid value (l_pid must be 0 for
    // the F_OFD_ commands).
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = l.typ as _;
    fl.l_whence = libc::SEEK_SET as _;
    fl.l_start = l.start;
    fl.l_len = l.len;
    // SAFETY: fl is a valid, writable flock structure that outlives the call.
    cvt(unsafe { libc::fcntl(fd.as_raw_fd(), cmd, &mut fl) })?;
    Ok(RangeLock {
        typ: fl.l_type as i16,
        start: fl.l_start,
        len: fl.l_len,
        pid: fl.l_pid,
    })
}

/// What a GETLK returned: the conflicting lock, or None for F_UNLCK.
pub fn conflicting(l: RangeLock) -> Option<RangeLock> {
    (l.typ as i32 != libc::F_UNLCK as i32).then_some(l)
}

/// flock(2) with LOCK_NB: never waits; EAGAIN when another open file description holds a
/// conflicting lock.
pub fn flock_nb(fd: BorrowedFd<'_>, op: i32) -> SysResult<()> {
    // SAFETY: flock takes a descriptor and flags only.
    // (EWOULDBLOCK is EAGAIN on Linux.)
    cvt(unsafe { libc::flock(fd.as_raw_fd(), op | libc::LOCK_NB) }).map(|_| ())
}

/// Where an xattr call writes: a null pointer for an empty buffer, which asks for the size.
pub fn xattr_out(buf: &mut [u8]) -> *mut libc::c_void {
    if buf.is_empty() {
        std::ptr::null_mut()
    } else {
        buf.as_mut_ptr().cast()
    }
}
