//! Who changed a file: fanotify, beside the inotify watches (inotify.rs) of the Linux
//! watcher (linux.rs), reports the content and attribute changes of the files in each
//! watched directory together with the process that made them.
//!
//! The echo of a session's own change is recognised by the file's ctime (echo.rs): if
//! the ctime after the session's own write is the one the event finds, the client saw
//! everything. A host write in the moment between the session's write and its look at the
//! ctime leaves no trace in it (with multigrain timestamps it may not even change the
//! ctime), so its event was taken for the echo and the guest kept the old pages. fanotify
//! says which process wrote: any other process's change is pushed, whatever the ctime says.
//! (To a listener without CAP_SYS_ADMIN the kernel reports the pid only of its own events and
//! 0 for the others, which is all this needs.) Changes made by this process, through this
//! session or another one, are still told apart by the ctime.
//!
//! Best effort: without fanotify (an older kernel, a file system without file handles) a
//! directory is watched by inotify alone, as before.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use dashmap::DashMap;
use tether_proto::NodeId;

use super::ForeignChanged;
use crate::backend::{linux_sys, sys};

/// The changes reported: content, attributes, a close after writing; of the directory's
/// entries.
const MASK: u64 =
    libc::FAN_MODIFY | libc::FAN_ATTRIB | libc::FAN_CLOSE_WRITE | libc::FAN_EVENT_ON_CHILD;

/// name_to_handle_at's flag for the handle fanotify reports (Linux 6.5); without it the two
/// encodings are the same on file systems that can export handles.
const AT_HANDLE_FID: libc::c_int = 0x200;

/// Largest file handle the kernel makes (MAX_HANDLE_SZ).
const MAX_HANDLE_SZ: usize = 128;

/// A directory as fanotify names it: its file system's id and its file handle.
type DirKey = Vec<u8>;

pub struct ForeignChanges {
    fan: OwnedFd,
    dirs: DashMap<DirKey, NodeId>,
    keys: DashMap<NodeId, DirKey>,
    /// This process, as fanotify reports it.
    pid: i32,
}

/// What a drain of the queue found.
pub enum Drained {
    Changed(ForeignChanged),
    /// The kernel dropped events.
    Overflow,
}

impl ForeignChanges {
    pub fn new() -> io::Result<ForeignChanges> {
        let flags = libc::FAN_CLASS_NOTIF
            | libc::FAN_REPORT_DFID_NAME
            | libc::FAN_NONBLOCK
            | libc::FAN_CLOEXEC;
        // SAFETY: fanotify_init has no memory-safety preconditions.
        let fan =
            sys::new_fd(unsafe { libc::fanotify_init(flags, libc::O_RDONLY as libc::c_uint) })?;
        Ok(ForeignChanges {
            fan,
            dirs: DashMap::new(),
            keys: DashMap::new(),
            pid: std::process::id() as i32,
        })
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fan.as_fd()
    }

    /// Reports changes in directory `node` (`fd`). False if the kernel refuses.
    pub fn mark(&self, node: NodeId, fd: BorrowedFd<'_>) -> bool {
        let Some(key) = dir_key(fd) else {
            return false;
        };
        if !self.change_mark(libc::FAN_MARK_ADD, fd) {
            return false;
        }
        self.dirs.insert(key.clone(), node);
        self.keys.insert(node, key);
        true
    }

    /// Stops reporting directory `node`; `fd` (if the server still has it) removes the
    /// kernel's mark, which otherwise stays until the session ends.
    pub fn unmark(&self, node: NodeId, fd: Option<BorrowedFd<'_>>) {
        if let Some((_, key)) = self.keys.remove(&node) {
            self.dirs.remove(&key);
            if let Some(fd) = fd {
                self.change_mark(libc::FAN_MARK_REMOVE, fd);
            }
        }
    }

    fn change_mark(&self, how: libc::c_uint, fd: BorrowedFd<'_>) -> bool {
        // Through the /proc/self/fd link, as the inotify watch: fanotify_mark takes no O_PATH
        // descriptor.
        let path = linux_sys::proc_path(fd);
        // SAFETY: a valid C string.
        let r = unsafe {
            libc::fanotify_mark(
                self.fan.as_raw_fd(),
                how | libc::FAN_MARK_ONLYDIR,
                MASK,
                libc::AT_FDCWD,
                path.as_ptr(),
            )
        };
        r == 0
    }

    /// Reads every queued event (never waits) through `buf`: the files another process
    /// changed.
    pub fn drain(&self, buf: &mut [u8]) -> Drained {
        let mut changed = ForeignChanged::new();
        loop {
            // SAFETY: buf is writable for its length.
            let len =
                unsafe { libc::read(self.fan.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if len <= 0 {
                return Drained::Changed(changed);
            }
            for ev in events(&buf[..len as usize]) {
                if ev.mask & libc::FAN_Q_OVERFLOW != 0 {
                    return Drained::Overflow;
                }
                if ev.pid == self.pid {
                    continue;
                }
                if let Some((dir, name)) = ev.dir_and_name {
                    if let Some(node) = self.dirs.get(dir).map(|n| *n) {
                        changed.insert((node, name.to_vec()));
                    }
                }
            }
        }
    }
}

/// The key fanotify's events give directory `fd`: its file system id and handle, laid out
/// as in an event's information record.
fn dir_key(fd: BorrowedFd<'_>) -> Option<DirKey> {
    let fsid = linux_sys::fstatfs(fd).ok()?.f_fsid;
    // SAFETY: fsid_t is two plain ints.
    let fsid: [u8; 8] = unsafe { std::mem::transmute(fsid) };
    let mut handle = vec![0u8; 8 + MAX_HANDLE_SZ];
    handle[..4].copy_from_slice(&(MAX_HANDLE_SZ as u32).to_ne_bytes());
    let mut mount_id = 0;
    let mut encoded = |flags| {
        // SAFETY: `handle` is a struct file_handle with room for MAX_HANDLE_SZ bytes.
        unsafe {
            libc::name_to_handle_at(
                fd.as_raw_fd(),
                c"".as_ptr(),
                handle.as_mut_ptr().cast(),
                &mut mount_id,
                libc::AT_EMPTY_PATH | flags,
            )
        }
    };
    if encoded(AT_HANDLE_FID) != 0 && encoded(0) != 0 {
        return None;
    }
    let bytes = u32::from_ne_bytes(handle[..4].try_into().unwrap()) as usize;
    let mut key = fsid.to_vec();
    key.extend_from_slice(&handle[..8 + bytes.min(MAX_HANDLE_SZ)]);
    Some(key)
}

/// One fanotify event of a read buffer, as far as this module needs it.
struct Event<'a> {
    mask: u64,
    pid: i32,
    /// The directory key (fsid and handle) and the name of a DFID_NAME record.
    dir_and_name: Option<(&'a [u8], &'a [u8])>,
}

/// The events in `buf`, as read(2) from a fanotify descriptor (FAN_REPORT_DFID_NAME)
/// returned it.
fn events(buf: &[u8]) -> impl Iterator<Item = Event<'_>> {
    const METADATA_LEN: usize = std::mem::size_of::<libc::fanotify_event_metadata>();
    let mut pos = 0;
    std::iter::from_fn(move || {
        let head = buf.get(pos..pos + METADATA_LEN)?;
        let event_len = u32::from_ne_bytes(head[0..4].try_into().unwrap()) as usize;
        let metadata_len = u16::from_ne_bytes(head[6..8].try_into().unwrap()) as usize;
        if head[4] != libc::FANOTIFY_METADATA_VERSION || event_len < METADATA_LEN {
            return None;
        }
        let whole = buf.get(pos..pos + event_len)?;
        pos += event_len;
        let mut event = Event {
            mask: u64::from_ne_bytes(head[8..16].try_into().unwrap()),
            pid: i32::from_ne_bytes(head[20..24].try_into().unwrap()),
            dir_and_name: None,
        };
        let mut info = whole
            .get(metadata_len.max(METADATA_LEN)..)
            .unwrap_or_default();
        while info.len() >= 4 {
            let (kind, len) = (info[0], u16::from_ne_bytes([info[2], info[3]]) as usize);
            let Some(record) = info.get(..len).filter(|_| len >= 4) else {
                break;
            };
            info = &info[len..];
            if kind == libc::FAN_EVENT_INFO_TYPE_DFID_NAME {
                event.dir_and_name = dir_and_name(&record[4..]);
            }
        }
        Some(event)
    })
}

/// fsid (8 bytes), struct file_handle, NUL-terminated name: the key and the name.
fn dir_and_name(body: &[u8]) -> Option<(&[u8], &[u8])> {
    let bytes = u32::from_ne_bytes(body.get(8..12)?.try_into().unwrap()) as usize;
    let key_end = 16usize.checked_add(bytes)?;
    let key = body.get(..key_end)?;
    let rest = body.get(key_end..)?;
    let name = &rest[..rest.iter().position(|&b| b == 0)?];
    Some((key, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(mask: u64, pid: i32, key: &[u8], name: &[u8]) -> Vec<u8> {
        let mut info = vec![libc::FAN_EVENT_INFO_TYPE_DFID_NAME, 0, 0, 0];
        info.extend(key);
        info.extend(name);
        info.push(0);
        info.resize(info.len().div_ceil(8) * 8, 0);
        let len = info.len() as u16;
        info[2..4].copy_from_slice(&len.to_ne_bytes());
        let mut v = Vec::new();
        v.extend((24 + info.len() as u32).to_ne_bytes());
        v.extend([libc::FANOTIFY_METADATA_VERSION, 0]);
        v.extend(24u16.to_ne_bytes());
        v.extend(mask.to_ne_bytes());
        v.extend((-1i32).to_ne_bytes());
        v.extend(pid.to_ne_bytes());
        v.extend(info);
        v
    }

    #[test]
    fn events_are_split_with_their_directory_and_name() {
        // fsid, then a file handle of 8 bytes (type 1).
        let mut key = vec![7u8; 8];
        key.extend(8u32.to_ne_bytes());
        key.extend(1i32.to_ne_bytes());
        key.extend([1, 2, 3, 4, 5, 6, 7, 8]);
        let mut buf = event(libc::FAN_MODIFY, 42, &key, b"a.txt");
        buf.extend(event(libc::FAN_ATTRIB, 0, &key, b"b"));
        let got: Vec<_> = events(&buf)
            .map(|e| {
                (
                    e.mask,
                    e.pid,
                    e.dir_and_name.map(|(k, n)| (k.to_vec(), n.to_vec())),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (libc::FAN_MODIFY, 42, Some((key.clone(), b"a.txt".to_vec()))),
                (libc::FAN_ATTRIB, 0, Some((key.clone(), b"b".to_vec()))),
            ]
        );
        // A cut event ends the iteration instead of reading past the buffer.
        assert_eq!(events(&buf[..30]).count(), 0);
        assert_eq!(events(&buf[..buf.len() - 1]).count(), 1);
    }

    /// The key a mark is made with is the one the kernel's events carry: a write by another
    /// process is reported with the directory's node and the file's name; one by this
    /// process is not.
    #[test]
    fn another_process_s_write_is_reported_and_our_own_is_not() {
        let Ok(f) = ForeignChanges::new() else {
            eprintln!("skipped: no fanotify here");
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, b"one").unwrap();
        let dir_fd: OwnedFd = std::fs::File::open(dir.path()).unwrap().into();
        assert!(f.mark(NodeId::new(5), dir_fd.as_fd()), "mark refused");
        let mut buf = vec![0u8; 64 * 1024];
        std::fs::write(&file, b"own").unwrap();
        let Drained::Changed(own) = f.drain(&mut buf) else {
            panic!("overflow")
        };
        assert!(own.is_empty(), "{own:?}");
        let status = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("echo other >> {}", file.display()))
            .status()
            .unwrap();
        assert!(status.success());
        let Drained::Changed(foreign) = f.drain(&mut buf) else {
            panic!("overflow")
        };
        assert!(
            foreign.contains(&(NodeId::new(5), b"f".to_vec())),
            "{foreign:?}"
        );
        f.unmark(NodeId::new(5), Some(dir_fd.as_fd()));
    }
}
