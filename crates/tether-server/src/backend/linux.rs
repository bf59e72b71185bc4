//! The Linux backend: node descriptors are O_PATH, objects are reopened for I/O (and
//! chmod, access, xattrs, truncate) through /proc/self/fd, status comes from statx with the
//! birth time, locks are OFD locks, renames take renameat2's flags, spare files are
//! O_TMPFILE. Each call is one wrapper of [`sys`].

use std::ffi::CStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use super::{linux_sys, sys};
use super::{At, Backend, Birth, RangeLock, SysResult, TakeEntry};
use tether_proto::WireErrno;

pub struct Linux {
    /// /proc/self/fd, to reopen O_PATH descriptors with real access modes.
    proc_fd: OwnedFd,
}

impl Linux {
    pub fn open() -> SysResult<Linux> {
        let proc_fd = sys::openat(
            // SAFETY: AT_FDCWD is a valid "descriptor" for *at calls and is never closed.
            unsafe { BorrowedFd::borrow_raw(libc::AT_FDCWD) },
            c"/proc/self/fd",
            libc::O_PATH | libc::O_DIRECTORY,
            0,
        )?;
        Ok(Linux { proc_fd })
    }
}

impl Backend for Linux {
    fn open_node(&self, dir: BorrowedFd<'_>, name: &CStr) -> SysResult<OwnedFd> {
        linux_sys::open_path(dir, name)
    }

    fn open_dir_node(&self, dir: BorrowedFd<'_>, name: &CStr) -> SysResult<OwnedFd> {
        sys::openat(dir, name, libc::O_PATH | libc::O_DIRECTORY, 0)
    }

    fn reopen(&self, fd: BorrowedFd<'_>, flags: i32) -> SysResult<OwnedFd> {
        sys::openat(self.proc_fd.as_fd(), &linux_sys::fd_name(fd), flags, 0)
    }

    fn node_of_open(&self, fd: BorrowedFd<'_>) -> SysResult<OwnedFd> {
        self.reopen(fd, libc::O_PATH)
    }

    fn open_dir(&self, fd: BorrowedFd<'_>) -> SysResult<OwnedFd> {
        sys::openat(fd, c".", libc::O_RDONLY | libc::O_DIRECTORY, 0)
    }

    fn open_at(&self, (dir, name): At<'_>, flags: i32, mode: u32) -> SysResult<OwnedFd> {
        sys::openat(dir, name, flags, mode)
    }

    fn open_unnamed(&self, dir: BorrowedFd<'_>, mode: u32) -> SysResult<OwnedFd> {
        // Not O_EXCL, so that it can be linked.
        let flags = libc::O_TMPFILE | libc::O_RDWR | libc::O_CLOEXEC;
        sys::openat(dir, c".", flags, mode)
    }

    fn stat_born(&self, fd: BorrowedFd<'_>) -> SysResult<(libc::stat, Birth)> {
        linux_sys::fstat_born(fd)
    }

    fn stat_at(&self, dir: BorrowedFd<'_>, name: &CStr) -> SysResult<libc::stat> {
        sys::fstatat_nofollow(dir, name)
    }

    fn mount_root_device(&self, fd: BorrowedFd<'_>) -> SysResult<Option<(u32, u32)>> {
        linux_sys::mount_root_device(fd)
    }

    fn fd_path(&self, fd: BorrowedFd<'_>) -> SysResult<Vec<u8>> {
        linux_sys::fd_path(fd)
    }

    fn readlink(&self, fd: BorrowedFd<'_>) -> SysResult<Vec<u8>> {
        linux_sys::readlink_fd(fd)
    }

    fn access(&self, fd: BorrowedFd<'_>, mask: i32) -> SysResult<()> {
        sys::faccessat(self.proc_fd.as_fd(), &linux_sys::fd_name(fd), mask, 0)
    }

    fn mkdir_at(&self, dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> SysResult<()> {
        sys::mkdirat(dir, name, mode)
    }

    fn mknod_at(&self, dir: BorrowedFd<'_>, name: &CStr, mode: u32, rdev: u64) -> SysResult<()> {
        sys::mknodat(dir, name, mode, rdev)
    }

    fn symlink_at(&self, target: &CStr, dir: BorrowedFd<'_>, name: &CStr) -> SysResult<()> {
        sys::symlinkat(target, dir, name)
    }

    fn unlink_at(&self, dir: BorrowedFd<'_>, name: &CStr, flags: i32) -> SysResult<()> {
        sys::unlinkat(dir, name, flags)
    }

    fn rename_at(&self, from: At<'_>, to: At<'_>, flags: u32) -> SysResult<()> {
        linux_sys::renameat2(from, to, flags)
    }

    fn link_open(&self, fd: BorrowedFd<'_>, dir: BorrowedFd<'_>, name: &CStr) -> SysResult<()> {
        sys::linkat((fd, c""), (dir, name), libc::AT_EMPTY_PATH).or_else(|e| {
            // Without CAP_DAC_READ_SEARCH, follow the /proc magic link instead.
            if e == WireErrno::ENOENT || e == WireErrno::EPERM {
                let proc_fd = self.proc_fd.as_fd();
                let flags = libc::AT_SYMLINK_FOLLOW;
                sys::linkat((proc_fd, &linux_sys::fd_name(fd)), (dir, name), flags)
            } else {
                Err(e)
            }
        })
    }

    fn chmod_node(&self, fd: BorrowedFd<'_>, mode: u32) -> SysResult<()> {
        sys::fchmodat(self.proc_fd.as_fd(), &linux_sys::fd_name(fd), mode, 0)
    }

    fn chown(&self, fd: BorrowedFd<'_>, uid: Option<u32>, gid: Option<u32>) -> SysResult<()> {
        linux_sys::fchown_empty(fd, uid, gid)
    }

    fn utimens(&self, fd: BorrowedFd<'_>, times: &[libc::timespec; 2]) -> SysResult<()> {
        linux_sys::utimens_empty(fd, times)
    }

    fn truncate_node(&self, fd: BorrowedFd<'_>, size: u64) -> SysResult<()> {
        linux_sys::truncate_path(&linux_sys::proc_path(fd), size)
    }

    fn fallocate(&self, fd: BorrowedFd<'_>, mode: i32, offset: u64, len: u64) -> SysResult<()> {
        linux_sys::fallocate(fd, mode, offset, len)
    }

    fn copy_file_range(
        &self,
        (fd_in, off_in): (BorrowedFd<'_>, u64),
        (fd_out, off_out): (BorrowedFd<'_>, u64),
        len: u64,
    ) -> SysResult<u64> {
        linux_sys::copy_file_range(fd_in, off_in, fd_out, off_out, len)
    }

    fn read_dir(&self, fd: BorrowedFd<'_>, offset: u64, take: &mut TakeEntry) -> SysResult<bool> {
        linux_sys::read_dir(fd, offset, take)
    }

    fn readahead(&self, fd: BorrowedFd<'_>, len: usize) {
        linux_sys::readahead(fd, len)
    }

    fn getxattr(&self, fd: BorrowedFd<'_>, name: &CStr, buf: &mut [u8]) -> SysResult<usize> {
        linux_sys::getxattr(&linux_sys::proc_path(fd), name, buf)
    }

    fn listxattr(&self, fd: BorrowedFd<'_>, buf: &mut [u8]) -> SysResult<usize> {
        linux_sys::listxattr(&linux_sys::proc_path(fd), buf)
    }

    fn setxattr(&self, fd: BorrowedFd<'_>, name: &CStr, value: &[u8], flags: i32) -> SysResult<()> {
        linux_sys::setxattr(&linux_sys::proc_path(fd), name, value, flags)
    }

    fn removexattr(&self, fd: BorrowedFd<'_>, name: &CStr) -> SysResult<()> {
        linux_sys::removexattr(&linux_sys::proc_path(fd), name)
    }

    fn setlk(&self, fd: BorrowedFd<'_>, lock: &RangeLock) -> SysResult<()> {
        linux_sys::ofd_setlk(fd, lock)
    }

    fn getlk(&self, fd: BorrowedFd<'_>, lock: &RangeLock) -> SysResult<Option<RangeLock>> {
        linux_sys::ofd_getlk(fd, lock)
    }

    fn switch_creds(&self, uid: u32, gid: u32) -> (u32, u32) {
        linux_sys::switch_fs_ids(uid, gid)
    }

    fn restore_creds(&self, old: (u32, u32)) {
        linux_sys::restore_fs_ids(old)
    }
}
