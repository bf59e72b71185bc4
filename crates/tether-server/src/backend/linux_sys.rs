//! Safe wrappers of the Linux-only calls: the [`Linux`](super::linux) backend's (O_PATH,
//! statx, /proc/self/fd, OFD locks, renameat2, getdents64, setfsuid, path-based xattrs) and
//! the Linux watchers' (inotify and fanotify take paths through /proc/self/fd). The calls
//! both hosts have are in sys.rs.

use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};

use tether_proto::WireErrno;

use super::sys::{
    conflicting, cvt, cvt_isize, fcntl_lock, fstat, lseek, openat, raw_at, xattr_out,
};
use super::{At, RangeLock, RawDirEntry, SysResult};

/// The /proc path of a descriptor, for the calls that take only a path (xattrs, truncate,
/// inotify); the magic link leads to exactly the object the descriptor holds.
pub fn proc_path(fd: BorrowedFd<'_>) -> CString {
    CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).expect("digits have no NUL")
}

/// Name of a descriptor inside /proc/self/fd, for the calls that must reopen or follow it.
pub fn fd_name(fd: BorrowedFd<'_>) -> CString {
    CString::new(fd.as_raw_fd().to_string()).expect("digits have no NUL")
}

/// Opens `name` in `dir` as an O_PATH descriptor without following a final symlink.
pub fn open_path(dir: BorrowedFd<'_>, name: &CStr) -> SysResult<OwnedFd> {
    openat(dir, name, libc::O_PATH | libc::O_NOFOLLOW, 0)
}

pub fn fstatfs(fd: BorrowedFd<'_>) -> SysResult<libc::statfs> {
    let mut st = std::mem::MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: valid fd and a statfs buffer.
    cvt(unsafe { libc::fstatfs(fd.as_raw_fd(), st.as_mut_ptr()) })?;
    // SAFETY: fstatfs succeeded.
    Ok(unsafe { st.assume_init() })
}

/// `fstat` and the inode's birth time, where the file system records one (with the inode
/// number it tells a file from a later one that got the same number), in one statx call:
/// a node first seen needs both.
pub fn fstat_born(fd: BorrowedFd<'_>) -> SysResult<(libc::stat, Option<(i64, u32)>)> {
    let mut stx = std::mem::MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: an empty path with AT_EMPTY_PATH names fd itself; stx is writable memory of
    // the right size.
    let r = cvt(unsafe {
        libc::statx(
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
            libc::STATX_BASIC_STATS | libc::STATX_BTIME,
            stx.as_mut_ptr(),
        )
    });
    if r.is_err() {
        // No statx (a kernel before 4.11, a seccomp filter that refuses it): fstat's
        // error, if any, is the one to report.
        return Ok((fstat(fd)?, None));
    }
    // SAFETY: statx succeeded (and the buffer was zeroed before).
    let x = unsafe { stx.assume_init() };
    let birth =
        (x.stx_mask & libc::STATX_BTIME != 0).then_some((x.stx_btime.tv_sec, x.stx_btime.tv_nsec));
    if x.stx_mask & libc::STATX_BASIC_STATS != libc::STATX_BASIC_STATS {
        // Not all of what fstat reports (a remote file system inside the export): ask fstat.
        return Ok((fstat(fd)?, birth));
    }
    // SAFETY: all-zero is a valid libc::stat; every field fstat fills is set below.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    st.st_dev = libc::makedev(x.stx_dev_major, x.stx_dev_minor);
    st.st_ino = x.stx_ino;
    st.st_nlink = x.stx_nlink as _;
    st.st_mode = x.stx_mode as _;
    st.st_uid = x.stx_uid;
    st.st_gid = x.stx_gid;
    st.st_rdev = libc::makedev(x.stx_rdev_major, x.stx_rdev_minor);
    st.st_size = x.stx_size as _;
    st.st_blksize = x.stx_blksize as _;
    st.st_blocks = x.stx_blocks as _;
    st.st_atime = x.stx_atime.tv_sec;
    st.st_atime_nsec = x.stx_atime.tv_nsec as _;
    st.st_mtime = x.stx_mtime.tv_sec;
    st.st_mtime_nsec = x.stx_mtime.tv_nsec as _;
    st.st_ctime = x.stx_ctime.tv_sec;
    st.st_ctime_nsec = x.stx_ctime.tv_nsec as _;
    Ok((st, birth))
}

/// The device of the file system mounted at `fd` (an O_PATH descriptor) if `fd` is the root
/// of a mount, read from what the kernel has cached: never a request to that file system,
/// which may be a FUSE mount that would have to answer (and, if it is served through this
/// very server, could not). `None` for anything that is not a mount root.
pub fn mount_root_device(fd: BorrowedFd<'_>) -> SysResult<Option<(u32, u32)>> {
    let mut stx = std::mem::MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: an empty path with AT_EMPTY_PATH names fd itself; stx is writable memory of
    // the right size.
    cvt(unsafe {
        libc::statx(
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW | libc::AT_STATX_DONT_SYNC,
            0,
            stx.as_mut_ptr(),
        )
    })?;
    // SAFETY: statx succeeded (and the buffer was zeroed before).
    let x = unsafe { stx.assume_init() };
    let root = libc::STATX_ATTR_MOUNT_ROOT as u64;
    Ok((x.stx_attributes & root != 0).then_some((x.stx_dev_major, x.stx_dev_minor)))
}

pub fn renameat2(from: At<'_>, to: At<'_>, flags: u32) -> SysResult<()> {
    let ((old_dir, old), (new_dir, new)) = (raw_at(from), raw_at(to));
    // The system call itself: the musl that Rust's static builds bundle (1.2.3) has no
    // renameat2 wrapper.
    // SAFETY: valid C strings; the kernel does not retain them.
    let r = unsafe { libc::syscall(libc::SYS_renameat2, old_dir, old, new_dir, new, flags) };
    cvt(r as libc::c_int).map(drop)
}

/// Reads the target of the symlink `fd` refers to (an O_PATH descriptor).
pub fn readlink_fd(fd: BorrowedFd<'_>) -> SysResult<Vec<u8>> {
    // An empty path means the descriptor itself.
    readlink_at(fd.as_raw_fd(), c"")
}

/// The path the kernel knows for a descriptor now (it follows renames), from /proc/self/fd.
pub fn fd_path(fd: BorrowedFd<'_>) -> SysResult<Vec<u8>> {
    readlink_at(libc::AT_FDCWD, &proc_path(fd))
}

/// chown of the object an O_PATH descriptor refers to, without following symlinks.
pub fn fchown_empty(fd: BorrowedFd<'_>, uid: Option<u32>, gid: Option<u32>) -> SysResult<()> {
    let uid = uid.unwrap_or(u32::MAX);
    let gid = gid.unwrap_or(u32::MAX);
    // SAFETY: empty C string with AT_EMPTY_PATH operates on the descriptor itself.
    cvt(unsafe {
        libc::fchownat(
            fd.as_raw_fd(),
            c"".as_ptr(),
            uid,
            gid,
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
    })
    .map(drop)
}

/// utimensat on the object an O_PATH descriptor refers to (symlinks included).
pub fn utimens_empty(fd: BorrowedFd<'_>, times: &[libc::timespec; 2]) -> SysResult<()> {
    // SAFETY: times points to two timespecs; empty path with AT_EMPTY_PATH is the fd itself.
    cvt(unsafe {
        libc::utimensat(
            fd.as_raw_fd(),
            c"".as_ptr(),
            times.as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
    })
    .map(drop)
}

pub fn truncate_path(path: &CStr, size: u64) -> SysResult<()> {
    // SAFETY: valid C string.
    cvt(unsafe { libc::truncate(path.as_ptr(), size as libc::off_t) }).map(drop)
}

/// readahead(2) of the first `len` bytes: a hint, whose result does not matter.
pub fn readahead(fd: BorrowedFd<'_>, len: usize) {
    // SAFETY: a valid descriptor; readahead only fills the page cache.
    unsafe { libc::readahead(fd.as_raw_fd(), 0, len) };
}

pub fn fallocate(fd: BorrowedFd<'_>, mode: i32, offset: u64, len: u64) -> SysResult<()> {
    // SAFETY: plain syscall on a valid descriptor.
    cvt(unsafe {
        libc::fallocate(
            fd.as_raw_fd(),
            mode,
            offset as libc::off_t,
            len as libc::off_t,
        )
    })
    .map(drop)
}

pub fn copy_file_range(
    fd_in: BorrowedFd<'_>,
    off_in: u64,
    fd_out: BorrowedFd<'_>,
    off_out: u64,
    len: u64,
) -> SysResult<u64> {
    let mut oi = off_in as libc::loff_t;
    let mut oo = off_out as libc::loff_t;
    // SAFETY: the offsets are local variables the kernel updates; descriptors are valid.
    let n = cvt_isize(unsafe {
        libc::copy_file_range(
            fd_in.as_raw_fd(),
            &mut oi,
            fd_out.as_raw_fd(),
            &mut oo,
            len as usize,
            0,
        )
    })?;
    Ok(n as u64)
}

pub fn getxattr(path: &CStr, name: &CStr, buf: &mut [u8]) -> SysResult<usize> {
    let (out, len) = (xattr_out(buf), buf.len());
    // SAFETY: `out` is null or writable for `len` bytes.
    cvt_isize(unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), out, len) })
}

pub fn listxattr(path: &CStr, buf: &mut [u8]) -> SysResult<usize> {
    let (out, len) = (xattr_out(buf), buf.len());
    // SAFETY: as for getxattr.
    cvt_isize(unsafe { libc::listxattr(path.as_ptr(), out.cast(), len) })
}

pub fn setxattr(path: &CStr, name: &CStr, value: &[u8], flags: i32) -> SysResult<()> {
    // SAFETY: value is readable for its length.
    cvt(unsafe {
        libc::setxattr(
            path.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            flags,
        )
    })
    .map(drop)
}

pub fn removexattr(path: &CStr, name: &CStr) -> SysResult<()> {
    // SAFETY: valid C strings.
    cvt(unsafe { libc::removexattr(path.as_ptr(), name.as_ptr()) }).map(drop)
}

/// Reads directory entries from `fd` starting at `offset` (a cookie from an earlier entry,
/// or 0), calling `take` for each until it returns false or the directory ends. Returns
/// whether the directory ended (`take` took every entry).
pub fn read_dir(
    fd: BorrowedFd<'_>,
    offset: u64,
    mut take: impl FnMut(RawDirEntry) -> bool,
) -> SysResult<bool> {
    lseek(fd, offset as i64, libc::SEEK_SET)?;
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        // SAFETY: buf is writable for its length; getdents64 fills it with linux_dirent64s.
        let n = cvt_isize(unsafe {
            libc::syscall(
                libc::SYS_getdents64,
                fd.as_raw_fd(),
                buf.as_mut_ptr(),
                buf.len(),
            ) as isize
        })?;
        if n == 0 {
            return Ok(true);
        }
        let mut pos = 0;
        while pos < n {
            // linux_dirent64: u64 ino, i64 off, u16 reclen, u8 type, name (NUL-terminated).
            let ino = u64::from_ne_bytes(buf[pos..pos + 8].try_into().unwrap());
            let off = i64::from_ne_bytes(buf[pos + 8..pos + 16].try_into().unwrap());
            let reclen = u16::from_ne_bytes(buf[pos + 16..pos + 18].try_into().unwrap()) as usize;
            let kind = buf[pos + 18];
            let name_area = &buf[pos + 19..pos + reclen];
            let len = name_area
                .iter()
                .position(|&b| b == 0)
                .unwrap_or(name_area.len());
            let entry = RawDirEntry {
                ino,
                next_offset: off as u64,
                kind,
                name: name_area[..len].to_vec(),
            };
            if !take(entry) {
                return Ok(false);
            }
            pos += reclen;
        }
    }
}

/// Switches this thread's filesystem uid and gid (Linux setfsuid/setfsgid are per thread),
/// so files the guest creates belong to the guest's caller; returns the previous ones, for
/// [`restore_fs_ids`].
pub fn switch_fs_ids(uid: u32, gid: u32) -> (u32, u32) {
    // SAFETY: setfsgid/setfsuid only change this thread's fs credentials and return
    // the previous values.
    unsafe {
        let old_gid = libc::setfsgid(gid) as u32;
        let old_uid = libc::setfsuid(uid) as u32;
        (old_uid, old_gid)
    }
}

/// Puts back what [`switch_fs_ids`] returned.
pub fn restore_fs_ids((old_uid, old_gid): (u32, u32)) {
    // SAFETY: restoring the values setfs*id returned.
    unsafe {
        libc::setfsuid(old_uid);
        libc::setfsgid(old_gid);
    }
}

/// Takes, changes or drops a lock owned by the open file description behind `fd`
/// (F_OFD_SETLK): never waits; EAGAIN when another owner holds a conflicting lock.
pub fn ofd_setlk(fd: BorrowedFd<'_>, l: &RangeLock) -> SysResult<()> {
    match fcntl_lock(fd, libc::F_OFD_SETLK, l) {
        Err(e) if e == WireErrno::EACCES => Err(WireErrno::EAGAIN),
        r => r.map(drop),
    }
}

/// The first lock that conflicts with `l` for the open file description behind `fd`
/// (F_OFD_GETLK), or None.
pub fn ofd_getlk(fd: BorrowedFd<'_>, l: &RangeLock) -> SysResult<Option<RangeLock>> {
    fcntl_lock(fd, libc::F_OFD_GETLK, l).map(conflicting)
}

fn readlink_at(dir: RawFd, path: &CStr) -> SysResult<Vec<u8>> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    // SAFETY: valid C string; buf is writable for its length.
    let n = cvt_isize(unsafe {
        libc::readlinkat(dir, path.as_ptr(), buf.as_mut_ptr().cast(), buf.len())
    })?;
    buf.truncate(n);
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn open_nofollow(path: &std::path::Path) -> OwnedFd {
        let c = CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        openat(
            // SAFETY: AT_FDCWD is valid for the call; the path is absolute.
            unsafe { BorrowedFd::borrow_raw(libc::AT_FDCWD) },
            &c,
            libc::O_PATH | libc::O_NOFOLLOW,
            0,
        )
        .unwrap()
    }

    /// fstat_born reports what fstat does, for every kind of object a node can be, and the
    /// birth time std reads.
    #[test]
    fn fstat_born_agrees_with_fstat() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, vec![7u8; 12345]).unwrap();
        // Distinct times, so that one read in the place of another shows.
        let times = std::fs::FileTimes::new()
            .set_accessed(std::time::UNIX_EPOCH + std::time::Duration::new(1_000, 111))
            .set_modified(std::time::UNIX_EPOCH + std::time::Duration::new(2_000, 222));
        std::fs::File::options()
            .write(true)
            .open(&file)
            .unwrap()
            .set_times(times)
            .unwrap();
        std::os::unix::fs::symlink("f", dir.path().join("l")).unwrap();
        let fifo = CString::new(dir.path().join("p").as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o640) }, 0);
        let paths = [
            dir.path().to_path_buf(),
            file,
            dir.path().join("l"),
            dir.path().join("p"),
            "/dev/null".into(),
        ];
        for p in paths {
            let fd = open_nofollow(&p);
            let (born, birth) = fstat_born(fd.as_fd()).unwrap();
            let st = fstat(fd.as_fd()).unwrap();
            let fields = |s: &libc::stat| {
                (
                    (
                        s.st_dev, s.st_ino, s.st_nlink, s.st_mode, s.st_uid, s.st_gid,
                    ),
                    (s.st_rdev, s.st_size, s.st_blksize, s.st_blocks),
                    (s.st_atime, s.st_atime_nsec, s.st_mtime, s.st_mtime_nsec),
                    (s.st_ctime, s.st_ctime_nsec),
                )
            };
            assert_eq!(fields(&born), fields(&st), "{}", p.display());
            let created = std::fs::symlink_metadata(&p).unwrap().created().ok();
            let created = created.map(|t| {
                let t = t.duration_since(std::time::UNIX_EPOCH).unwrap();
                (t.as_secs() as i64, t.subsec_nanos())
            });
            assert_eq!(birth, created, "{}", p.display());
        }
    }
}
