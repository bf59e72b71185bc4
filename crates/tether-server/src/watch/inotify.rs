//! inotify, for the Linux watcher (linux.rs): one instance per session, one watch per
//! directory node. A watch on a directory reports changes to the directory's entries and to
//! the content and attributes of the files in it, which is everything the guest caches.
//! Its records become [`WatchEvent`]s of the directories' nodes.

use std::collections::HashSet;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use dashmap::DashMap;
use tether_proto::NodeId;

use super::{Change, NameChange, WatchEvent};
use crate::backend::{linux_sys, sys};

/// What is watched on each directory.
const MASK: u32 = libc::IN_MODIFY
    | libc::IN_ATTRIB
    | libc::IN_CLOSE_WRITE
    | libc::IN_CREATE
    | libc::IN_DELETE
    | libc::IN_DELETE_SELF
    | libc::IN_MOVED_FROM
    | libc::IN_MOVED_TO
    | libc::IN_MOVE_SELF
    | libc::IN_ONLYDIR
    | libc::IN_EXCL_UNLINK;
// No IN_DONT_FOLLOW: the watch is added through the /proc/self/fd magic link, which must be
// followed to reach the directory the server holds (and only that directory).

/// An inotify instance and its watches, one per directory node: what the Linux watcher
/// ([`Inotify`]) and the portable watcher's Linux source (portable.rs) both stand on.
pub struct Watches {
    fd: OwnedFd,
    by_wd: DashMap<i32, NodeId>,
    by_node: DashMap<NodeId, i32>,
}

impl Watches {
    pub fn new() -> io::Result<Watches> {
        // SAFETY: inotify_init1 has no memory-safety preconditions.
        let fd = sys::new_fd(unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) })?;
        Ok(Watches {
            fd,
            by_wd: DashMap::new(),
            by_node: DashMap::new(),
        })
    }

    /// The descriptor to poll.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Watches directory `node` (`fd` is its descriptor) for the events in `mask`.
    pub fn add(&self, node: NodeId, fd: &OwnedFd, mask: u32) -> io::Result<()> {
        let path = linux_sys::proc_path(fd.as_fd());
        // SAFETY: valid C string; the watch follows the magic link to the directory itself.
        let wd = unsafe { libc::inotify_add_watch(self.fd.as_raw_fd(), path.as_ptr(), mask) };
        if wd < 0 {
            return Err(io::Error::last_os_error());
        }
        self.by_wd.insert(wd, node);
        self.by_node.insert(node, wd);
        Ok(())
    }

    /// Stops watching directory `node`.
    pub fn remove(&self, node: NodeId) {
        if let Some((_, wd)) = self.by_node.remove(&node) {
            self.by_wd.remove(&wd);
            // SAFETY: removing a watch descriptor of our own inotify instance.
            unsafe { libc::inotify_rm_watch(self.fd.as_raw_fd(), wd) };
        }
    }

    /// Reads every record queued now (never waits) through `buf`, handing each of a watched
    /// directory to `each` with that directory's node. False when the kernel dropped events.
    pub fn read_queued(&self, buf: &mut [u8], mut each: impl FnMut(NodeId, &Record<'_>)) -> bool {
        let mut complete = true;
        loop {
            // SAFETY: buf is writable for its length.
            let len =
                unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if len <= 0 {
                return complete;
            }
            for r in records(&buf[..len as usize]) {
                if r.mask & libc::IN_Q_OVERFLOW != 0 {
                    complete = false;
                    continue;
                }
                if r.mask & libc::IN_IGNORED != 0 {
                    if let Some((_, node)) = self.by_wd.remove(&r.wd) {
                        // Not a newer watch of a node with that id (another directory that
                        // took a deleted one's inode number).
                        self.by_node.remove_if(&node, |_, wd| *wd == r.wd);
                    }
                    continue;
                }
                if let Some(dir) = self.by_wd.get(&r.wd).map(|n| *n) {
                    each(dir, &r);
                }
            }
        }
    }
}

/// One session's inotify instance and its watches.
pub struct Inotify {
    watches: Watches,
    failed: AtomicUsize,
    /// Inode numbers of this session's spare files (SPARES) whose descriptor is still open.
    /// Events through it name the file "#INO" in the directory it was made in (the kernel's
    /// name for an unnamed file), whatever its name is by then: closing it (IN_CLOSE_WRITE,
    /// it is open for writing) is this session's own doing and names nothing.
    unnamed: Mutex<HashSet<u64>>,
}

impl Inotify {
    pub fn new() -> io::Result<Inotify> {
        Ok(Inotify {
            watches: Watches::new()?,
            failed: AtomicUsize::new(0),
            unnamed: Mutex::default(),
        })
    }

    /// The descriptor to poll.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.watches.fd()
    }

    /// Starts watching directory `node` (`fd` is its descriptor). False when the kernel
    /// refuses (watch limit reached): that directory falls back to revalidation.
    pub fn watch(&self, node: NodeId, fd: &OwnedFd) -> bool {
        let Err(err) = self.watches.add(node, fd, MASK) else {
            return true;
        };
        if self.failed.fetch_add(1, Ordering::Relaxed) == 0 {
            let hint = if err.raw_os_error() == Some(libc::ENOSPC) {
                " (the inotify watch limit is reached: raise fs.inotify.max_user_watches)"
            } else {
                ""
            };
            tracing::warn!(
                "cannot watch a directory: {err}{hint}; directories without a watch fall \
                 back to revalidation with the mount's --attr-timeout"
            );
        }
        false
    }

    /// Stops watching directory `node`.
    pub fn unwatch(&self, node: NodeId) {
        self.watches.remove(node);
    }

    /// This session made spare file `ino` and holds it open (see `unnamed`).
    pub fn made_unnamed(&self, ino: u64) {
        self.unnamed.lock().unwrap().insert(ino);
    }

    /// Whether `r` is an event through one of this session's spare files' descriptors:
    /// forgotten once it is the close, the last one.
    fn is_unnamed(&self, r: &Record<'_>) -> bool {
        let Some(ino) = r
            .name
            .strip_prefix(b"#")
            .and_then(|digits| std::str::from_utf8(digits).ok()?.parse::<u64>().ok())
        else {
            return false;
        };
        let names = libc::IN_CREATE | libc::IN_DELETE | libc::IN_MOVED_FROM | libc::IN_MOVED_TO;
        let mut unnamed = self.unnamed.lock().unwrap();
        if r.mask & names != 0 || !unnamed.contains(&ino) {
            return false;
        }
        if r.mask & libc::IN_CLOSE_WRITE != 0 {
            unnamed.remove(&ino);
        }
        true
    }

    /// Reads every event queued now (never waits) through `buf`; None when the kernel
    /// dropped events.
    pub fn read_queued(&self, buf: &mut [u8]) -> Option<Vec<WatchEvent>> {
        let mut events = Vec::new();
        let complete = self.watches.read_queued(buf, |dir, r| {
            if !self.is_unnamed(r) {
                events.push(event(dir, r));
            }
        });
        complete.then_some(events)
    }
}

/// The event record `r` reports in directory `dir`.
fn event(dir: NodeId, r: &Record<'_>) -> WatchEvent {
    let change = match name_change(r.mask) {
        Some(change) => Change::Name {
            change,
            cookie: r.cookie,
            is_dir: r.mask & libc::IN_ISDIR != 0,
        },
        None => Change::Content(changed_bits(r.mask)),
    };
    WatchEvent {
        dir,
        name: (!r.name.is_empty()).then(|| r.name.to_vec()),
        change,
    }
}

/// One `struct inotify_event` of a read buffer; `name` without its NUL padding (empty for
/// an event on the watched object itself).
pub struct Record<'a> {
    pub wd: i32,
    pub mask: u32,
    pub cookie: u32,
    pub name: &'a [u8],
}

/// The records in `buf`, as read(2) from an inotify descriptor returned it.
pub fn records(buf: &[u8]) -> impl Iterator<Item = Record<'_>> {
    let mut pos = 0;
    std::iter::from_fn(move || {
        let head = buf.get(pos..pos + 16)?;
        let field = |at: usize| u32::from_ne_bytes(head[at..at + 4].try_into().unwrap());
        let len = field(12) as usize;
        let raw = buf.get(pos + 16..pos + 16 + len)?;
        pos += 16 + len;
        let end = raw.iter().position(|&b| b == 0).unwrap_or(len);
        Some(Record {
            wd: field(0) as i32,
            mask: field(4),
            cookie: field(8),
            name: &raw[..end],
        })
    })
}

/// The name change an event reports, if it is one.
fn name_change(mask: u32) -> Option<NameChange> {
    if mask & libc::IN_CREATE != 0 {
        Some(NameChange::Created)
    } else if mask & libc::IN_DELETE != 0 {
        Some(NameChange::Deleted)
    } else if mask & libc::IN_MOVED_FROM != 0 {
        Some(NameChange::MovedFrom)
    } else if mask & libc::IN_MOVED_TO != 0 {
        Some(NameChange::MovedTo)
    } else {
        None
    }
}

/// The [`changed`](tether_proto::changed) bits of a content or attribute event.
fn changed_bits(mask: u32) -> u8 {
    use tether_proto::changed;
    let mut bits = 0;
    if mask & libc::IN_MODIFY != 0 {
        bits |= changed::MODIFY;
    }
    if mask & libc::IN_CLOSE_WRITE != 0 {
        bits |= changed::CLOSE_WRITE;
    }
    if mask & libc::IN_ATTRIB != 0 {
        bits |= changed::ATTRIB;
    }
    bits
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_through_a_spare_files_descriptor_are_dropped_until_its_close() {
        let w = Inotify::new().unwrap();
        let event = |mask, name: &'static [u8]| Record {
            wd: 1,
            mask,
            cookie: 0,
            name,
        };
        w.made_unnamed(123);
        assert!(w.is_unnamed(&event(libc::IN_ATTRIB, b"#123")));
        assert!(
            !w.is_unnamed(&event(libc::IN_CREATE, b"#123")),
            "a name made"
        );
        assert!(
            !w.is_unnamed(&event(libc::IN_MODIFY, b"#124")),
            "another file"
        );
        assert!(!w.is_unnamed(&event(libc::IN_MODIFY, b"#12a")));
        assert!(!w.is_unnamed(&event(libc::IN_MODIFY, b"123")));
        assert!(w.is_unnamed(&event(libc::IN_CLOSE_WRITE, b"#123")));
        // After its close the name is an ordinary one again (a host file called "#123").
        assert!(!w.is_unnamed(&event(libc::IN_MODIFY, b"#123")));
    }

    fn record(wd: i32, mask: u32, cookie: u32, name: &[u8], padded: usize) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend(wd.to_ne_bytes());
        v.extend(mask.to_ne_bytes());
        v.extend(cookie.to_ne_bytes());
        v.extend((padded as u32).to_ne_bytes());
        v.extend(name);
        v.resize(16 + padded, 0);
        v
    }

    #[test]
    fn records_are_split_and_names_unpadded() {
        let mut buf = record(3, libc::IN_MOVED_FROM, 77, b"a.txt", 16);
        buf.extend(record(4, libc::IN_ATTRIB, 0, b"", 0));
        let got: Vec<_> = records(&buf)
            .map(|r| (r.wd, r.mask, r.cookie, r.name.to_vec()))
            .collect();
        assert_eq!(
            got,
            vec![
                (3, libc::IN_MOVED_FROM, 77, b"a.txt".to_vec()),
                (4, libc::IN_ATTRIB, 0, Vec::new()),
            ]
        );
        // A cut record ends the iteration instead of reading past the buffer.
        assert_eq!(records(&buf[..20]).count(), 0);
        assert_eq!(records(&buf[..buf.len() - 1]).count(), 1);
    }
}
