//! Thin, checked wrappers of the system calls the client makes on its own mount.

use std::ffi::CStr;
use std::io;
use std::os::fd::RawFd;

/// `statx(dir, path, flags, mask)`: the fields `mask` asks for, as the kernel holds them
/// (`AT_STATX_DONT_SYNC`) or asked of the file system (`AT_STATX_FORCE_SYNC`), as `flags`
/// say. Check `stx_mask` for fields a file system may not fill.
pub(crate) fn statx(
    dir: RawFd,
    path: &CStr,
    flags: libc::c_int,
    mask: u32,
) -> io::Result<libc::statx> {
    let mut stx = std::mem::MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: a C string and a statx buffer; a bad descriptor is an error, not UB.
    let rc = unsafe { libc::statx(dir, path.as_ptr(), flags, mask, stx.as_mut_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: statx succeeded and filled it.
    Ok(unsafe { stx.assume_init() })
}

/// Lowers the calling thread's scheduling priority to nice `nice`: for background work that
/// must not take the CPU from the threads that answer the kernel and apply invalidations
/// (a guest with one vCPU runs them all in turn). Best effort: a failure leaves it as it was.
pub(crate) fn lower_this_threads_priority(nice: libc::c_int) {
    // SAFETY: gettid has no preconditions; setpriority of our own thread id only.
    let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, nice) };
    if r != 0 {
        tracing::debug!("setpriority: {}", io::Error::last_os_error());
    }
}

pub mod mount_dir;
