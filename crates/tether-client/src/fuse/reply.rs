//! What the kernel is told in replies: errors as its errno, the protocol's attributes and
//! times as fuser's.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{Errno, FileAttr, FileType, TimeOrNow};
use tether_proto::{Attr, SetTime, Timespec, WireErrno};

use crate::kernel_ids::ino_of;

pub(crate) fn errno(e: WireErrno) -> Errno {
    Errno::from_i32(e.to_host())
}

pub(crate) fn time(t: Timespec) -> SystemTime {
    if t.sec >= 0 {
        UNIX_EPOCH + Duration::new(t.sec as u64, t.nsec)
    } else {
        UNIX_EPOCH - Duration::from_secs(t.sec.unsigned_abs()) + Duration::from_nanos(t.nsec as u64)
    }
}

pub(crate) fn set_time(t: Option<TimeOrNow>) -> SetTime {
    match t {
        None => SetTime::Omit,
        Some(TimeOrNow::Now) => SetTime::Now,
        Some(TimeOrNow::SpecificTime(st)) => {
            let ts = match st.duration_since(UNIX_EPOCH) {
                Ok(d) => Timespec {
                    sec: d.as_secs() as i64,
                    nsec: d.subsec_nanos(),
                },
                Err(e) => {
                    // fuser 0.18 decodes the kernel's (sec < 0, nsec) as EPOCH - (-sec + nsec)
                    // (see its time.rs TODO) instead of EPOCH - (-sec) + nsec; undo exactly
                    // that to recover the kernel's values.
                    let d = e.duration();
                    Timespec {
                        sec: -(d.as_secs() as i64),
                        nsec: d.subsec_nanos(),
                    }
                }
            };
            SetTime::At(ts)
        }
    }
}

pub(crate) fn kind_of_mode(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFSOCK => FileType::Socket,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

pub(crate) fn kind_of_dtype(t: u8) -> FileType {
    match t {
        libc::DT_DIR => FileType::Directory,
        libc::DT_LNK => FileType::Symlink,
        libc::DT_FIFO => FileType::NamedPipe,
        libc::DT_SOCK => FileType::Socket,
        libc::DT_CHR => FileType::CharDevice,
        libc::DT_BLK => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

pub fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: ino_of(a.ino),
        size: a.size,
        blocks: a.blocks,
        atime: time(a.atime),
        mtime: time(a.mtime),
        ctime: time(a.ctime),
        crtime: time(a.ctime),
        kind: kind_of_mode(a.mode),
        perm: (a.mode & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev as u32,
        blksize: a.blksize,
        flags: 0,
    }
}
