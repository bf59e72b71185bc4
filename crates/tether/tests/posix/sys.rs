//! Thin syscall wrappers returning `Result<T, Errno>`. All file descriptors are opened with
//! O_CLOEXEC so they never leak into child processes (setpriv, exec cases).

use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

pub(crate) type Stat = libc::stat;
/// (seconds, nanoseconds)
pub(crate) type Ts = (i64, i64);
pub(crate) type Fd = OwnedFd;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Errno(pub i32);

impl std::fmt::Display for Errno {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&errno_name(self.0))
    }
}

pub(crate) type Res<T> = Result<T, Errno>;

pub(crate) fn errno_name(e: i32) -> String {
    let s = match e {
        0 => "OK(errno 0)",
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::ESRCH => "ESRCH",
        libc::EINTR => "EINTR",
        libc::EIO => "EIO",
        libc::ENXIO => "ENXIO",
        libc::E2BIG => "E2BIG",
        libc::ENOEXEC => "ENOEXEC",
        libc::EBADF => "EBADF",
        libc::ECHILD => "ECHILD",
        libc::EAGAIN => "EAGAIN",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EFAULT => "EFAULT",
        libc::ENOTBLK => "ENOTBLK",
        libc::EBUSY => "EBUSY",
        libc::EEXIST => "EEXIST",
        libc::EXDEV => "EXDEV",
        libc::ENODEV => "ENODEV",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::EINVAL => "EINVAL",
        libc::ENFILE => "ENFILE",
        libc::EMFILE => "EMFILE",
        libc::ENOTTY => "ENOTTY",
        libc::ETXTBSY => "ETXTBSY",
        libc::EFBIG => "EFBIG",
        libc::ENOSPC => "ENOSPC",
        libc::ESPIPE => "ESPIPE",
        libc::EROFS => "EROFS",
        libc::EMLINK => "EMLINK",
        libc::EPIPE => "EPIPE",
        libc::EDOM => "EDOM",
        libc::ERANGE => "ERANGE",
        libc::EDEADLK => "EDEADLK",
        libc::ENAMETOOLONG => "ENAMETOOLONG",
        libc::ENOLCK => "ENOLCK",
        libc::ENOSYS => "ENOSYS",
        libc::ENOTEMPTY => "ENOTEMPTY",
        libc::ELOOP => "ELOOP",
        libc::ENOMSG => "ENOMSG",
        libc::ENODATA => "ENODATA",
        libc::ENOSTR => "ENOSTR",
        libc::ETIME => "ETIME",
        libc::EOVERFLOW => "EOVERFLOW",
        libc::EBADFD => "EBADFD",
        libc::EILSEQ => "EILSEQ",
        libc::ENOTSOCK => "ENOTSOCK",
        libc::EMSGSIZE => "EMSGSIZE",
        libc::EPROTOTYPE => "EPROTOTYPE",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::EADDRINUSE => "EADDRINUSE",
        libc::ECONNREFUSED => "ECONNREFUSED",
        libc::ENOTCONN => "ENOTCONN",
        libc::ETIMEDOUT => "ETIMEDOUT",
        libc::ESTALE => "ESTALE",
        libc::EDQUOT => "EDQUOT",
        libc::ECANCELED => "ECANCELED",
        libc::ENOKEY => "ENOKEY",
        libc::EUCLEAN => "EUCLEAN",
        _ => return format!("errno{e}"),
    };
    s.to_string()
}

fn last() -> Errno {
    Errno(
        std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO),
    )
}

fn cvt(r: libc::c_int) -> Res<libc::c_int> {
    if r < 0 {
        Err(last())
    } else {
        Ok(r)
    }
}

fn cvt_l(r: i64) -> Res<i64> {
    if r < 0 {
        Err(last())
    } else {
        Ok(r)
    }
}

fn cvt_s(r: isize) -> Res<usize> {
    if r < 0 {
        Err(last())
    } else {
        Ok(r as usize)
    }
}

pub(crate) fn cs(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("path with NUL")
}

fn cstr(s: &str) -> CString {
    CString::new(s).expect("string with NUL")
}

pub(crate) fn from_io(e: &std::io::Error) -> Errno {
    Errno(e.raw_os_error().unwrap_or(libc::EIO))
}

// --- open / read / write ----------------------------------------------------------------------

pub(crate) fn open(p: &Path, flags: i32, mode: u32) -> Res<Fd> {
    let c = cs(p);
    let fd = cvt(unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC, mode as libc::c_uint) })?;
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

pub(crate) fn raw(fd: &Fd) -> RawFd {
    fd.as_raw_fd()
}

pub(crate) fn dup(fd: &Fd) -> Res<Fd> {
    let n = cvt(unsafe { libc::fcntl(raw(fd), libc::F_DUPFD_CLOEXEC, 0) })?;
    Ok(unsafe { OwnedFd::from_raw_fd(n) })
}

/// One read(2) call of at most `n` bytes.
pub(crate) fn read(fd: &Fd, n: usize) -> Res<Vec<u8>> {
    let mut buf = vec![0u8; n];
    let r = cvt_s(unsafe { libc::read(raw(fd), buf.as_mut_ptr() as *mut _, n) })?;
    buf.truncate(r);
    Ok(buf)
}

/// Reads until EOF.
pub(crate) fn read_to_end(fd: &Fd) -> Res<Vec<u8>> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let r = cvt_s(unsafe { libc::read(raw(fd), buf.as_mut_ptr() as *mut _, buf.len()) })?;
        if r == 0 {
            return Ok(out);
        }
        out.extend_from_slice(&buf[..r]);
    }
}

/// pread(2) looping until `n` bytes or EOF.
pub(crate) fn pread(fd: &Fd, n: usize, off: i64) -> Res<Vec<u8>> {
    let mut buf = vec![0u8; n];
    let mut got = 0;
    while got < n {
        let r = cvt_s(unsafe {
            libc::pread(
                raw(fd),
                buf[got..].as_mut_ptr() as *mut _,
                n - got,
                off + got as i64,
            )
        })?;
        if r == 0 {
            break;
        }
        got += r;
    }
    buf.truncate(got);
    Ok(buf)
}

/// One write(2) call.
pub(crate) fn write(fd: &Fd, data: &[u8]) -> Res<usize> {
    cvt_s(unsafe { libc::write(raw(fd), data.as_ptr() as *const _, data.len()) })
}

/// write(2) looping until everything is written.
pub(crate) fn write_all(fd: &Fd, data: &[u8]) -> Res<usize> {
    let mut done = 0;
    while done < data.len() {
        let r = cvt_s(unsafe {
            libc::write(
                raw(fd),
                data[done..].as_ptr() as *const _,
                data.len() - done,
            )
        })?;
        if r == 0 {
            return Err(Errno(libc::EIO));
        }
        done += r;
    }
    Ok(done)
}

/// pwrite(2) looping until everything is written.
pub(crate) fn pwrite(fd: &Fd, data: &[u8], off: i64) -> Res<usize> {
    let mut done = 0;
    loop {
        let r = cvt_s(unsafe {
            libc::pwrite(
                raw(fd),
                data[done..].as_ptr() as *const _,
                data.len() - done,
                off + done as i64,
            )
        })?;
        done += r;
        if done >= data.len() || r == 0 {
            return Ok(done);
        }
    }
}

pub(crate) fn lseek(fd: &Fd, off: i64, whence: i32) -> Res<i64> {
    cvt_l(unsafe { libc::lseek(raw(fd), off, whence) })
}

/// ioctl(TCGETS), what isatty() asks.
pub(crate) fn tcgets(fd: &Fd) -> Res<()> {
    let mut t = std::mem::MaybeUninit::<libc::termios>::zeroed();
    cvt(unsafe { libc::ioctl(raw(fd), libc::TCGETS, t.as_mut_ptr()) }).map(|_| ())
}

/// ioctl(FIONREAD): bytes left to read.
pub(crate) fn fionread(fd: &Fd) -> Res<libc::c_int> {
    let mut n: libc::c_int = 0;
    cvt(unsafe { libc::ioctl(raw(fd), libc::FIONREAD, &mut n) }).map(|_| n)
}

pub(crate) fn fsync(fd: &Fd) -> Res<()> {
    cvt(unsafe { libc::fsync(raw(fd)) }).map(|_| ())
}

pub(crate) fn fdatasync(fd: &Fd) -> Res<()> {
    cvt(unsafe { libc::fdatasync(raw(fd)) }).map(|_| ())
}

pub(crate) fn syncfs(fd: &Fd) -> Res<()> {
    cvt(unsafe { libc::syncfs(raw(fd)) }).map(|_| ())
}

pub(crate) fn ftruncate(fd: &Fd, len: i64) -> Res<()> {
    cvt(unsafe { libc::ftruncate(raw(fd), len) }).map(|_| ())
}

pub(crate) fn truncate(p: &Path, len: i64) -> Res<()> {
    let c = cs(p);
    cvt(unsafe { libc::truncate(c.as_ptr(), len) }).map(|_| ())
}

pub(crate) fn fallocate(fd: &Fd, mode: i32, off: i64, len: i64) -> Res<()> {
    cvt(unsafe { libc::fallocate(raw(fd), mode, off, len) }).map(|_| ())
}

pub(crate) fn copy_file_range(
    fdin: &Fd,
    off_in: Option<&mut i64>,
    fdout: &Fd,
    off_out: Option<&mut i64>,
    len: usize,
) -> Res<usize> {
    let pin = off_in.map_or(std::ptr::null_mut(), |x| x as *mut i64);
    let pout = off_out.map_or(std::ptr::null_mut(), |x| x as *mut i64);
    let r = unsafe {
        libc::syscall(
            libc::SYS_copy_file_range,
            raw(fdin),
            pin,
            raw(fdout),
            pout,
            len,
            0u32,
        )
    };
    cvt_l(r).map(|n| n as usize)
}

/// Whole file content (open O_RDONLY + read to end).
pub(crate) fn read_file(p: &Path) -> Res<Vec<u8>> {
    let fd = open(p, libc::O_RDONLY, 0)?;
    read_to_end(&fd)
}

/// Create/truncate with mode 0644 and write everything.
pub(crate) fn write_file(p: &Path, data: &[u8]) -> Res<()> {
    let fd = open(p, libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC, 0o644)?;
    write_all(&fd, data)?;
    Ok(())
}

// --- metadata ---------------------------------------------------------------------------------

pub(crate) fn stat(p: &Path) -> Res<Stat> {
    let c = cs(p);
    let mut st: Stat = unsafe { std::mem::zeroed() };
    cvt(unsafe { libc::stat(c.as_ptr(), &mut st) })?;
    Ok(st)
}

pub(crate) fn lstat(p: &Path) -> Res<Stat> {
    let c = cs(p);
    let mut st: Stat = unsafe { std::mem::zeroed() };
    cvt(unsafe { libc::lstat(c.as_ptr(), &mut st) })?;
    Ok(st)
}

pub(crate) fn fstat(fd: &Fd) -> Res<Stat> {
    let mut st: Stat = unsafe { std::mem::zeroed() };
    cvt(unsafe { libc::fstat(raw(fd), &mut st) })?;
    Ok(st)
}

pub(crate) fn atime(st: &Stat) -> Ts {
    (st.st_atime, st.st_atime_nsec)
}
pub(crate) fn mtime(st: &Stat) -> Ts {
    (st.st_mtime, st.st_mtime_nsec)
}
pub(crate) fn ctime(st: &Stat) -> Ts {
    (st.st_ctime, st.st_ctime_nsec)
}

pub(crate) fn now() -> Ts {
    let mut t: libc::timespec = unsafe { std::mem::zeroed() };
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut t) };
    (t.tv_sec, t.tv_nsec)
}

pub(crate) fn chmod(p: &Path, mode: u32) -> Res<()> {
    let c = cs(p);
    cvt(unsafe { libc::chmod(c.as_ptr(), mode) }).map(|_| ())
}

pub(crate) fn fchmod(fd: &Fd, mode: u32) -> Res<()> {
    cvt(unsafe { libc::fchmod(raw(fd), mode) }).map(|_| ())
}

/// uid/gid of u32::MAX means "unchanged" (-1).
pub(crate) fn chown(p: &Path, uid: u32, gid: u32) -> Res<()> {
    let c = cs(p);
    cvt(unsafe { libc::chown(c.as_ptr(), uid, gid) }).map(|_| ())
}

pub(crate) fn lchown(p: &Path, uid: u32, gid: u32) -> Res<()> {
    let c = cs(p);
    cvt(unsafe { libc::lchown(c.as_ptr(), uid, gid) }).map(|_| ())
}

pub(crate) fn fchown(fd: &Fd, uid: u32, gid: u32) -> Res<()> {
    cvt(unsafe { libc::fchown(raw(fd), uid, gid) }).map(|_| ())
}

pub(crate) fn mk_ts(t: Ts) -> libc::timespec {
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    ts.tv_sec = t.0;
    ts.tv_nsec = t.1;
    ts
}

/// utimensat(AT_FDCWD, p, times, flags); `times == None` passes NULL.
pub(crate) fn utimens(p: &Path, times: Option<[Ts; 2]>, flags: i32) -> Res<()> {
    let c = cs(p);
    let ts = times.map(|t| [mk_ts(t[0]), mk_ts(t[1])]);
    let ptr = ts.as_ref().map_or(std::ptr::null(), |t| t.as_ptr());
    cvt(unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), ptr, flags) }).map(|_| ())
}

pub(crate) fn futimens(fd: &Fd, times: [Ts; 2]) -> Res<()> {
    let ts = [mk_ts(times[0]), mk_ts(times[1])];
    cvt(unsafe { libc::futimens(raw(fd), ts.as_ptr()) }).map(|_| ())
}

pub(crate) fn access(p: &Path, mode: i32) -> Res<()> {
    let c = cs(p);
    cvt(unsafe { libc::access(c.as_ptr(), mode) }).map(|_| ())
}

pub(crate) fn statvfs(p: &Path) -> Res<libc::statvfs> {
    let c = cs(p);
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    cvt(unsafe { libc::statvfs(c.as_ptr(), &mut s) })?;
    Ok(s)
}

pub(crate) fn fstatvfs(fd: &Fd) -> Res<libc::statvfs> {
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    cvt(unsafe { libc::fstatvfs(raw(fd), &mut s) })?;
    Ok(s)
}

// --- namespace --------------------------------------------------------------------------------

pub(crate) fn mkdir(p: &Path, mode: u32) -> Res<()> {
    let c = cs(p);
    cvt(unsafe { libc::mkdir(c.as_ptr(), mode) }).map(|_| ())
}

pub(crate) fn rmdir(p: &Path) -> Res<()> {
    let c = cs(p);
    cvt(unsafe { libc::rmdir(c.as_ptr()) }).map(|_| ())
}

pub(crate) fn unlink(p: &Path) -> Res<()> {
    let c = cs(p);
    cvt(unsafe { libc::unlink(c.as_ptr()) }).map(|_| ())
}

pub(crate) fn unlinkat_dir(p: &Path) -> Res<()> {
    let c = cs(p);
    cvt(unsafe { libc::unlinkat(libc::AT_FDCWD, c.as_ptr(), libc::AT_REMOVEDIR) }).map(|_| ())
}

pub(crate) fn rename(a: &Path, b: &Path) -> Res<()> {
    let (ca, cb) = (cs(a), cs(b));
    cvt(unsafe { libc::rename(ca.as_ptr(), cb.as_ptr()) }).map(|_| ())
}

pub(crate) fn renameat2(a: &Path, b: &Path, flags: u32) -> Res<()> {
    let (ca, cb) = (cs(a), cs(b));
    let r = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            ca.as_ptr(),
            libc::AT_FDCWD,
            cb.as_ptr(),
            flags,
        )
    };
    cvt_l(r).map(|_| ())
}

pub(crate) fn link(a: &Path, b: &Path) -> Res<()> {
    let (ca, cb) = (cs(a), cs(b));
    cvt(unsafe { libc::link(ca.as_ptr(), cb.as_ptr()) }).map(|_| ())
}

pub(crate) fn linkat_flags(a: &Path, b: &Path, flags: i32) -> Res<()> {
    let (ca, cb) = (cs(a), cs(b));
    cvt(unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            ca.as_ptr(),
            libc::AT_FDCWD,
            cb.as_ptr(),
            flags,
        )
    })
    .map(|_| ())
}

/// linkat(fd, "", AT_FDCWD, b, AT_EMPTY_PATH)
pub(crate) fn link_fd(fd: &Fd, b: &Path) -> Res<()> {
    let cb = cs(b);
    let empty = cstr("");
    cvt(unsafe {
        libc::linkat(
            raw(fd),
            empty.as_ptr(),
            libc::AT_FDCWD,
            cb.as_ptr(),
            libc::AT_EMPTY_PATH,
        )
    })
    .map(|_| ())
}

pub(crate) fn symlink(target: &[u8], p: &Path) -> Res<()> {
    let ct = CString::new(target).expect("target with NUL");
    let cp = cs(p);
    cvt(unsafe { libc::symlink(ct.as_ptr(), cp.as_ptr()) }).map(|_| ())
}

/// readlink with a buffer of `bufsize` bytes; returns what the kernel wrote.
pub(crate) fn readlink_buf(p: &Path, bufsize: usize) -> Res<Vec<u8>> {
    let c = cs(p);
    let mut buf = vec![0u8; bufsize];
    let r = cvt_s(unsafe { libc::readlink(c.as_ptr(), buf.as_mut_ptr() as *mut _, bufsize) })?;
    buf.truncate(r);
    Ok(buf)
}

pub(crate) fn readlink(p: &Path) -> Res<Vec<u8>> {
    readlink_buf(p, 8192)
}

pub(crate) fn mknod(p: &Path, mode: u32, dev: u64) -> Res<()> {
    let c = cs(p);
    cvt(unsafe { libc::mknod(c.as_ptr(), mode, dev) }).map(|_| ())
}

pub(crate) fn mkfifo(p: &Path, mode: u32) -> Res<()> {
    let c = cs(p);
    cvt(unsafe { libc::mkfifo(c.as_ptr(), mode) }).map(|_| ())
}

// --- directories ------------------------------------------------------------------------------

pub(crate) struct Dir(*mut libc::DIR);

impl Drop for Dir {
    fn drop(&mut self) {
        unsafe { libc::closedir(self.0) };
    }
}

impl Dir {
    pub(crate) fn open(p: &Path) -> Res<Dir> {
        let c = cs(p);
        let d = unsafe { libc::opendir(c.as_ptr()) };
        if d.is_null() {
            Err(last())
        } else {
            Ok(Dir(d))
        }
    }

    /// Next entry (name, d_type), including . and ..; None at end.
    pub(crate) fn next(&mut self) -> Res<Option<(Vec<u8>, u8)>> {
        unsafe { *libc::__errno_location() = 0 };
        let e = unsafe { libc::readdir64(self.0) };
        if e.is_null() {
            let err = unsafe { *libc::__errno_location() };
            return if err == 0 { Ok(None) } else { Err(Errno(err)) };
        }
        let e = unsafe { &*e };
        let name = unsafe { CStr::from_ptr(e.d_name.as_ptr()) }
            .to_bytes()
            .to_vec();
        Ok(Some((name, e.d_type)))
    }

    pub(crate) fn tell(&mut self) -> i64 {
        unsafe { libc::telldir(self.0) as i64 }
    }

    pub(crate) fn seek(&mut self, pos: i64) {
        unsafe { libc::seekdir(self.0, pos as _) }
    }

    pub(crate) fn rewind(&mut self) {
        unsafe { libc::rewinddir(self.0) }
    }
}

/// Sorted listing (by name bytes) without . and ..
pub(crate) fn list_dir(p: &Path) -> Res<Vec<(Vec<u8>, u8)>> {
    let mut d = Dir::open(p)?;
    let mut v = Vec::new();
    while let Some((n, t)) = d.next()? {
        if n == b"." || n == b".." {
            continue;
        }
        v.push((n, t));
    }
    v.sort();
    Ok(v)
}

// --- xattrs -----------------------------------------------------------------------------------

pub(crate) fn setxattr(p: &Path, name: &str, value: &[u8], flags: i32) -> Res<()> {
    let (c, n) = (cs(p), cstr(name));
    cvt(unsafe {
        libc::setxattr(
            c.as_ptr(),
            n.as_ptr(),
            value.as_ptr() as *const _,
            value.len(),
            flags,
        )
    })
    .map(|_| ())
}

pub(crate) fn lsetxattr(p: &Path, name: &str, value: &[u8], flags: i32) -> Res<()> {
    let (c, n) = (cs(p), cstr(name));
    cvt(unsafe {
        libc::lsetxattr(
            c.as_ptr(),
            n.as_ptr(),
            value.as_ptr() as *const _,
            value.len(),
            flags,
        )
    })
    .map(|_| ())
}

pub(crate) fn fsetxattr(fd: &Fd, name: &str, value: &[u8], flags: i32) -> Res<()> {
    let n = cstr(name);
    cvt(unsafe {
        libc::fsetxattr(
            raw(fd),
            n.as_ptr(),
            value.as_ptr() as *const _,
            value.len(),
            flags,
        )
    })
    .map(|_| ())
}

/// getxattr with a buffer of `size` bytes (size 0 = size query, returns empty vec + length).
pub(crate) fn getxattr(p: &Path, name: &str, size: usize) -> Res<(usize, Vec<u8>)> {
    let (c, n) = (cs(p), cstr(name));
    let mut buf = vec![0u8; size];
    let ptr = if size == 0 {
        std::ptr::null_mut()
    } else {
        buf.as_mut_ptr() as *mut _
    };
    let r = cvt_s(unsafe { libc::getxattr(c.as_ptr(), n.as_ptr(), ptr, size) })?;
    buf.truncate(r.min(size));
    Ok((r, buf))
}

pub(crate) fn lgetxattr(p: &Path, name: &str, size: usize) -> Res<(usize, Vec<u8>)> {
    let (c, n) = (cs(p), cstr(name));
    let mut buf = vec![0u8; size];
    let ptr = if size == 0 {
        std::ptr::null_mut()
    } else {
        buf.as_mut_ptr() as *mut _
    };
    let r = cvt_s(unsafe { libc::lgetxattr(c.as_ptr(), n.as_ptr(), ptr, size) })?;
    buf.truncate(r.min(size));
    Ok((r, buf))
}

pub(crate) fn fgetxattr(fd: &Fd, name: &str, size: usize) -> Res<(usize, Vec<u8>)> {
    let n = cstr(name);
    let mut buf = vec![0u8; size];
    let ptr = if size == 0 {
        std::ptr::null_mut()
    } else {
        buf.as_mut_ptr() as *mut _
    };
    let r = cvt_s(unsafe { libc::fgetxattr(raw(fd), n.as_ptr(), ptr, size) })?;
    buf.truncate(r.min(size));
    Ok((r, buf))
}

/// listxattr with a buffer of `size` bytes; returns (length, raw list).
pub(crate) fn listxattr_raw(p: &Path, size: usize) -> Res<(usize, Vec<u8>)> {
    let c = cs(p);
    let mut buf = vec![0u8; size];
    let ptr = if size == 0 {
        std::ptr::null_mut()
    } else {
        buf.as_mut_ptr() as *mut _
    };
    let r = cvt_s(unsafe { libc::listxattr(c.as_ptr(), ptr, size) })?;
    buf.truncate(r.min(size));
    Ok((r, buf))
}

pub(crate) fn llistxattr_raw(p: &Path, size: usize) -> Res<(usize, Vec<u8>)> {
    let c = cs(p);
    let mut buf = vec![0u8; size];
    let ptr = if size == 0 {
        std::ptr::null_mut()
    } else {
        buf.as_mut_ptr() as *mut _
    };
    let r = cvt_s(unsafe { libc::llistxattr(c.as_ptr(), ptr, size) })?;
    buf.truncate(r.min(size));
    Ok((r, buf))
}

/// Sorted xattr names.
pub(crate) fn split_names(raw: &[u8]) -> Vec<String> {
    let mut v: Vec<String> = raw
        .split(|&b| b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect();
    v.sort();
    v
}

pub(crate) fn removexattr(p: &Path, name: &str) -> Res<()> {
    let (c, n) = (cs(p), cstr(name));
    cvt(unsafe { libc::removexattr(c.as_ptr(), n.as_ptr()) }).map(|_| ())
}

pub(crate) fn fremovexattr(fd: &Fd, name: &str) -> Res<()> {
    let n = cstr(name);
    cvt(unsafe { libc::fremovexattr(raw(fd), n.as_ptr()) }).map(|_| ())
}

// --- locks ------------------------------------------------------------------------------------

pub(crate) fn flock(fd: &Fd, op: i32) -> Res<()> {
    cvt(unsafe { libc::flock(raw(fd), op) }).map(|_| ())
}

pub(crate) fn fcntl_lock(fd: &Fd, cmd: i32, ltype: i32, start: i64, len: i64) -> Res<libc::flock> {
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = ltype as _;
    fl.l_whence = libc::SEEK_SET as _;
    fl.l_start = start;
    fl.l_len = len;
    fl.l_pid = 0;
    cvt(unsafe { libc::fcntl(raw(fd), cmd, &mut fl) })?;
    Ok(fl)
}
