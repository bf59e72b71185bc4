//! The wire's flag values and what they are on this host. The protocol carries the Linux
//! numbers the guest kernel gave its FUSE daemon (asm-generic values, as on x86_64); on a
//! Linux host they are the host's own and every translation here is the identity, so the
//! Linux server does nothing new. On macOS the open(2) flags, xattr flags and lseek's
//! SEEK_DATA/SEEK_HOLE have other numbers: ops/mod.rs translates a request's open flags
//! once, and the portable backend the rest where it makes the call.

/// renameat2(2)'s flags as the wire (and the [`Backend::rename_at`](super::Backend) seam)
/// carries them.
pub const RENAME_NOREPLACE: u32 = 1;
pub const RENAME_EXCHANGE: u32 = 2;

/// fallocate(2)'s mode bits as the wire carries them.
pub const FALLOC_FL_KEEP_SIZE: i32 = 1;
pub const FALLOC_FL_PUNCH_HOLE: i32 = 2;
pub const FALLOC_FL_ZERO_RANGE: i32 = 0x10;

/// setxattr(2)'s flags as the wire carries them.
pub const XATTR_CREATE: i32 = 1;
pub const XATTR_REPLACE: i32 = 2;

/// lseek(2)'s whence values for sparse files as the wire carries them.
pub const SEEK_DATA: i32 = 3;
pub const SEEK_HOLE: i32 = 4;

/// Host open flags that not every host has: 0 where it has none (a request with the bit
/// then simply does not get it).
#[cfg(target_os = "linux")]
pub mod host_oflag {
    pub const DIRECT: i32 = libc::O_DIRECT;
    pub const NOATIME: i32 = libc::O_NOATIME;
    pub const LARGEFILE: i32 = libc::O_LARGEFILE;
}
#[cfg(not(target_os = "linux"))]
pub mod host_oflag {
    pub const DIRECT: i32 = 0;
    pub const NOATIME: i32 = 0;
    pub const LARGEFILE: i32 = 0;
}

/// open(2) flags as the wire carries them (Linux, asm-generic: x86_64's; an aarch64 guest
/// sends other values for O_DIRECT, O_LARGEFILE, O_DIRECTORY and O_NOFOLLOW, which the
/// server does not pass on, O_DIRECT aside).
pub mod oflag {
    pub const ACCMODE: u32 = 0o3;
    pub const CREAT: u32 = 0o100;
    pub const EXCL: u32 = 0o200;
    pub const NOCTTY: u32 = 0o400;
    pub const TRUNC: u32 = 0o1000;
    pub const APPEND: u32 = 0o2000;
    pub const NONBLOCK: u32 = 0o4000;
    pub const DSYNC: u32 = 0o10000;
    pub const DIRECT: u32 = 0o40000;
    pub const LARGEFILE: u32 = 0o100000;
    pub const DIRECTORY: u32 = 0o200000;
    pub const NOFOLLOW: u32 = 0o400000;
    pub const NOATIME: u32 = 0o1000000;
    pub const CLOEXEC: u32 = 0o2000000;
    /// O_SYNC is this bit and DSYNC.
    pub const SYNC_BIT: u32 = 0o4000000;
}

/// The host's open(2) flags for the wire's `flags`.
#[cfg(target_os = "linux")]
pub fn open_flags(flags: u32) -> u32 {
    flags
}

/// The host's open(2) flags for the wire's `flags`; bits the host has no flag for are
/// dropped (O_DIRECT, O_NOATIME, O_LARGEFILE: hints on macOS).
#[cfg(not(target_os = "linux"))]
pub fn open_flags(flags: u32) -> u32 {
    let table: [(u32, libc::c_int); 11] = [
        (oflag::CREAT, libc::O_CREAT),
        (oflag::EXCL, libc::O_EXCL),
        (oflag::NOCTTY, libc::O_NOCTTY),
        (oflag::TRUNC, libc::O_TRUNC),
        (oflag::APPEND, libc::O_APPEND),
        (oflag::NONBLOCK, libc::O_NONBLOCK),
        (oflag::DSYNC, libc::O_DSYNC),
        (oflag::DIRECTORY, libc::O_DIRECTORY),
        (oflag::NOFOLLOW, libc::O_NOFOLLOW),
        (oflag::CLOEXEC, libc::O_CLOEXEC),
        (oflag::SYNC_BIT, libc::O_SYNC),
    ];
    let mut host = flags & oflag::ACCMODE;
    for (wire, bit) in table {
        if flags & wire != 0 {
            host |= bit as u32;
        }
    }
    host
}

/// The host's setxattr(2) flags for the wire's.
pub fn xattr_flags(flags: i32) -> i32 {
    #[cfg(target_os = "linux")]
    return flags;
    #[cfg(not(target_os = "linux"))]
    {
        let mut host = 0;
        if flags & XATTR_CREATE != 0 {
            host |= libc::XATTR_CREATE;
        }
        if flags & XATTR_REPLACE != 0 {
            host |= libc::XATTR_REPLACE;
        }
        host
    }
}

/// The host's lseek(2) whence for the wire's.
pub fn whence(whence: i32) -> i32 {
    match whence {
        SEEK_DATA => libc::SEEK_DATA,
        SEEK_HOLE => libc::SEEK_HOLE,
        w => w,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On Linux the wire's values are the host's: nothing is translated.
    #[cfg(target_os = "linux")]
    #[test]
    fn the_wire_is_linux() {
        assert_eq!(oflag::CREAT, libc::O_CREAT as u32);
        assert_eq!(oflag::EXCL, libc::O_EXCL as u32);
        assert_eq!(oflag::TRUNC, libc::O_TRUNC as u32);
        assert_eq!(oflag::APPEND, libc::O_APPEND as u32);
        assert_eq!(oflag::NONBLOCK, libc::O_NONBLOCK as u32);
        assert_eq!(oflag::NOCTTY, libc::O_NOCTTY as u32);
        assert_eq!(oflag::DSYNC, libc::O_DSYNC as u32);
        assert_eq!(oflag::SYNC_BIT | oflag::DSYNC, libc::O_SYNC as u32);
        assert_eq!(oflag::CLOEXEC, libc::O_CLOEXEC as u32);
        assert_eq!(oflag::NOATIME, libc::O_NOATIME as u32);
        assert_eq!(RENAME_NOREPLACE, libc::RENAME_NOREPLACE);
        assert_eq!(RENAME_EXCHANGE, libc::RENAME_EXCHANGE);
        assert_eq!(FALLOC_FL_KEEP_SIZE, libc::FALLOC_FL_KEEP_SIZE);
        assert_eq!(FALLOC_FL_PUNCH_HOLE, libc::FALLOC_FL_PUNCH_HOLE);
        assert_eq!(FALLOC_FL_ZERO_RANGE, libc::FALLOC_FL_ZERO_RANGE);
        assert_eq!(XATTR_CREATE, libc::XATTR_CREATE);
        assert_eq!(XATTR_REPLACE, libc::XATTR_REPLACE);
        assert_eq!(SEEK_DATA, libc::SEEK_DATA);
        assert_eq!(SEEK_HOLE, libc::SEEK_HOLE);
        let all = 0o7777777;
        assert_eq!(open_flags(all), all);
    }
}
