//! The portable [`Watcher`]: what FSEvents gives, and the logic macOS runs on it.
//!
//! FSEvents reports *paths* with flags (created, removed, renamed, modified, metadata
//! changed, is a directory), coalesced, without inode cookies to pair the halves of a
//! rename, and sometimes only "must rescan subdirectories" (events were dropped, or the
//! watched root moved). This watcher works in those terms on every host:
//!
//! - a source gives [`PathEvent`]s: on macOS an FSEvents stream on the export root
//!   (`fsevents`, raw FFI, file-level events); on Linux inotify on each watched directory,
//!   each record cut down to what FSEvents would say (a path and flags: no cookie, no
//!   close-after-write), so that the rest is exercised by the Linux test suites
//!   (`tether serve --backend portable`);
//! - [`PortableWatcher::drain`] coalesces them by path, resolves each path to a watched
//!   directory's node and a name (a path outside what is watched is dropped), and looks at
//!   the host to tell what the flags mean now: a name that exists was created, one that
//!   does not was removed (both when the flags say both); renames are a removal and a
//!   creation; a "must rescan" becomes [`Change::Rescan`] of the directory, which
//!   invalidates everything the client holds below it.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use tether_proto::{changed, NodeId};

use super::{Batch, Change, ForeignChanged, NameChange, WatchEvent, Watcher};
use crate::backend::Backend;

/// What a [`PathEvent`] says, as FSEvents' item flags do.
pub mod flags {
    /// Events below this path were lost: everything under it must be looked at again.
    pub const MUST_SCAN: u32 = 1;
    pub const CREATED: u32 = 2;
    pub const REMOVED: u32 = 4;
    pub const RENAMED: u32 = 8;
    pub const MODIFIED: u32 = 16;
    /// Attributes: mode, owner, times, extended attributes.
    pub const META: u32 = 32;
    pub const IS_DIR: u32 = 64;
}

/// One change as FSEvents reports it: an absolute host path and [`flags`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathEvent {
    pub path: Vec<u8>,
    pub flags: u32,
}

/// How long events gather after the first one wakes the watcher (FSEvents adds its own
/// latency on macOS; see docs/macos.md). Always, not only in a burst: without close events
/// a write is told by its IN_MODIFYs alone (an `O_TRUNC` open's, then each write's), and
/// each batch that holds one becomes a replayed open and close in the guest; gathered,
/// one write is one IN_CLOSE_WRITE there, as it would be locally (watch_events.rs's burst
/// test counts them).
const SETTLE: Duration = Duration::from_millis(2);

/// Watched directories by path and by node.
#[derive(Default)]
struct Dirs {
    by_path: HashMap<Vec<u8>, NodeId>,
    /// The directory's path when last looked at, and a descriptor to look again.
    by_node: HashMap<NodeId, (Vec<u8>, OwnedFd)>,
    /// A directory was renamed or removed since the paths were last read.
    stale: bool,
}

impl Dirs {
    /// Reads every watched directory's path again (directories move).
    fn refresh(&mut self, host: &dyn Backend) {
        self.by_path.clear();
        for (node, (path, fd)) in self.by_node.iter_mut() {
            if let Ok(p) = host.fd_path(fd.as_fd()) {
                *path = p;
            }
            self.by_path.insert(path.clone(), *node);
        }
        self.stale = false;
    }

    fn find(&mut self, host: &dyn Backend, path: &[u8]) -> Option<NodeId> {
        if let Some(n) = self.by_path.get(path) {
            return Some(*n);
        }
        if self.stale {
            self.refresh(host);
            return self.by_path.get(path).copied();
        }
        None
    }
}

/// Events a source queued, and a wake-up for [`Watcher::wait`].
#[derive(Default)]
pub struct Queue {
    events: Mutex<Vec<PathEvent>>,
    ready: Condvar,
}

impl Queue {
    pub fn push(&self, batch: impl IntoIterator<Item = PathEvent>) {
        let mut q = self.events.lock().unwrap();
        q.extend(batch);
        if !q.is_empty() {
            self.ready.notify_all();
        }
    }

    pub fn wait(&self, timeout: Duration) -> bool {
        let q = self.events.lock().unwrap();
        let (q, _) = (self.ready)
            .wait_timeout_while(q, timeout, |q| q.is_empty())
            .unwrap();
        !q.is_empty()
    }

    fn take(&self) -> Vec<PathEvent> {
        std::mem::take(&mut *self.events.lock().unwrap())
    }
}

pub struct PortableWatcher {
    host: Arc<dyn Backend>,
    dirs: Mutex<Dirs>,
    queue: Arc<Queue>,
    source: source::Source,
}

impl PortableWatcher {
    pub fn new(host: Arc<dyn Backend>) -> io::Result<PortableWatcher> {
        let queue = Arc::new(Queue::default());
        Ok(PortableWatcher {
            source: source::Source::new(queue.clone())?,
            host,
            dirs: Mutex::default(),
            queue,
        })
    }
}

/// Path events merged by path, in the order each path first came.
pub fn coalesce(events: Vec<PathEvent>) -> Vec<PathEvent> {
    let mut at: HashMap<Vec<u8>, usize> = HashMap::new();
    let mut out: Vec<PathEvent> = Vec::new();
    for e in events {
        match at.get(&e.path) {
            Some(&i) => out[i].flags |= e.flags,
            None => {
                at.insert(e.path.clone(), out.len());
                out.push(e);
            }
        }
    }
    out
}

/// The directory and last component of `path`.
fn split(path: &[u8]) -> Option<(&[u8], &[u8])> {
    let at = path.iter().rposition(|&b| b == b'/')?;
    let name = &path[at + 1..];
    (!name.is_empty()).then_some((if at == 0 { b"/" } else { &path[..at] }, name))
}

impl PortableWatcher {
    /// The watch events of one coalesced path event, `exists` saying whether its path
    /// names something now.
    fn events_of(&self, dirs: &mut Dirs, e: &PathEvent, out: &mut Vec<WatchEvent>) {
        let host = &*self.host;
        if e.flags & flags::MUST_SCAN != 0 {
            // The path itself if it is watched, else its directory.
            let dir = dirs.find(host, &e.path).or_else(|| {
                let (parent, _) = split(&e.path)?;
                dirs.find(host, parent)
            });
            if let Some(dir) = dir {
                out.push(WatchEvent {
                    dir,
                    name: None,
                    change: Change::Rescan,
                });
            } else {
                // Below nothing watched, or the root itself: everything.
                out.push(WatchEvent {
                    dir: tether_proto::ROOT_NODE,
                    name: None,
                    change: Change::Rescan,
                });
            }
            return;
        }
        let is_dir = e.flags & flags::IS_DIR != 0;
        let named = e.flags & (flags::CREATED | flags::REMOVED | flags::RENAMED) != 0;
        if is_dir && named && e.flags & (flags::REMOVED | flags::RENAMED) != 0 {
            // A directory moved or went: watched paths below it changed.
            dirs.stale = true;
        }
        // FSEvents reports no close: a modification it reports (coalesced, once the writes
        // of a moment are done) is told as the writes and their close, which is what guest
        // tools wait for (inotify's CLOSE_WRITE).
        let bits = (if e.flags & flags::MODIFIED != 0 {
            changed::MODIFY | changed::CLOSE_WRITE
        } else {
            0
        }) | (if e.flags & flags::META != 0 {
            changed::ATTRIB
        } else {
            0
        });
        let Some((parent, name)) = split(&e.path) else {
            return;
        };
        let Some(dir) = dirs.find(host, parent) else {
            // Not in a watched directory; maybe a watched directory's own attributes.
            if bits != 0 {
                if let Some(dir) = dirs.find(host, &e.path) {
                    out.push(WatchEvent {
                        dir,
                        name: None,
                        change: Change::Content(bits),
                    });
                }
            }
            return;
        };
        let name = name.to_vec();
        if named {
            let exists = dirs
                .by_node
                .get(&dir)
                .and_then(|(_, fd)| {
                    let cname = std::ffi::CString::new(name.clone()).ok()?;
                    Some(host.stat_at(fd.as_fd(), &cname).is_ok())
                })
                .unwrap_or(false);
            let both = e.flags & flags::CREATED != 0 && e.flags & flags::REMOVED != 0;
            let name_event = |change| WatchEvent {
                dir,
                name: Some(name.clone()),
                change: Change::Name {
                    change,
                    cookie: 0,
                    is_dir,
                },
            };
            // Both when the flags say both (a name made and removed, or the other way round,
            // within one latency): the last one is what is there now.
            if exists {
                if both {
                    out.push(name_event(NameChange::Deleted));
                }
                out.push(name_event(NameChange::Created));
            } else {
                if both {
                    out.push(name_event(NameChange::Created));
                }
                out.push(name_event(NameChange::Deleted));
            }
        }
        if bits != 0 {
            out.push(WatchEvent {
                dir,
                name: Some(name),
                change: Change::Content(bits),
            });
        }
    }
}

impl Watcher for PortableWatcher {
    fn watch_dir(&self, node: NodeId, fd: &OwnedFd) -> bool {
        let Ok(path) = self.host.fd_path(fd.as_fd()) else {
            return false;
        };
        let Ok(own) = fd.try_clone() else {
            return false;
        };
        if !self.source.watch(node, fd, &path) {
            return false;
        }
        let mut dirs = self.dirs.lock().unwrap();
        dirs.by_path.insert(path.clone(), node);
        if let Some((old, _)) = dirs.by_node.insert(node, (path, own)) {
            if dirs.by_path.get(&old) == Some(&node) {
                dirs.by_path.remove(&old);
            }
        }
        true
    }

    fn unwatch(&self, node: NodeId, _fd: Option<&OwnedFd>) {
        self.source.unwatch(node);
        let mut dirs = self.dirs.lock().unwrap();
        if let Some((path, _)) = dirs.by_node.remove(&node) {
            if dirs.by_path.get(&path) == Some(&node) {
                dirs.by_path.remove(&path);
            }
        }
    }

    /// Waits for the source, then [`SETTLE`] for more to gather, even after a quiet moment
    /// (unlike the Linux watcher: see [`Watch::wait`]).
    ///
    /// [`Watch::wait`]: super::coalesce::Watch::wait
    fn wait(&self, timeout: Duration) -> bool {
        if !self.source.wait(&self.queue, timeout) {
            return false;
        }
        std::thread::sleep(SETTLE);
        true
    }

    fn drain(&self) -> io::Result<Batch> {
        let dirs_snapshot = {
            let dirs = self.dirs.lock().unwrap();
            dirs.by_node
                .iter()
                .map(|(n, (p, _))| (*n, p.clone()))
                .collect::<HashMap<_, _>>()
        };
        self.source.read(&self.queue, &dirs_snapshot);
        let events = coalesce(self.queue.take());
        let mut dirs = self.dirs.lock().unwrap();
        let mut out = Vec::new();
        for e in &events {
            self.events_of(&mut dirs, e, &mut out);
        }
        Ok(Batch::Events(out, ForeignChanged::new()))
    }

    fn tells_writers(&self) -> bool {
        false
    }

    fn pairs_renames(&self) -> bool {
        false
    }

    fn made_unnamed(&self, _ino: u64) {}
}

/// Linux: inotify on each watched directory, each record cut down to a path and FSEvents'
/// flags.
#[cfg(target_os = "linux")]
mod source {
    use std::os::fd::AsRawFd;

    use super::*;
    use crate::watch::inotify::Watches;

    const MASK: u32 = libc::IN_MODIFY
        | libc::IN_ATTRIB
        | libc::IN_CREATE
        | libc::IN_DELETE
        | libc::IN_MOVED_FROM
        | libc::IN_MOVED_TO
        | libc::IN_ONLYDIR;

    /// The same inotify watches as the Linux watcher's (inotify.rs), read differently.
    pub struct Source {
        watches: Watches,
    }

    impl Source {
        pub fn new(_queue: Arc<Queue>) -> io::Result<Source> {
            Ok(Source {
                watches: Watches::new()?,
            })
        }

        pub fn watch(&self, node: NodeId, fd: &OwnedFd, _path: &[u8]) -> bool {
            self.watches.add(node, fd, MASK).is_ok()
        }

        pub fn unwatch(&self, node: NodeId) {
            self.watches.remove(node);
        }

        pub fn wait(&self, _queue: &Queue, timeout: Duration) -> bool {
            let mut pfd = libc::pollfd {
                fd: self.watches.fd().as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&mut pfd, 1, timeout.as_millis() as i32) > 0 }
        }

        /// Reads the queued records into `queue` as path events: the directory's path as
        /// it is now (FSEvents reports current paths) and the name.
        pub fn read(&self, queue: &Queue, dirs: &HashMap<NodeId, Vec<u8>>) {
            let mut buf = vec![0u8; 64 * 1024];
            let mut out = Vec::new();
            let complete = self.watches.read_queued(&mut buf, |node, r| {
                let Some(dir) = dirs.get(&node) else {
                    return;
                };
                let mut path = dir.clone();
                if !r.name.is_empty() {
                    if path.last() != Some(&b'/') {
                        path.push(b'/');
                    }
                    path.extend_from_slice(r.name);
                }
                out.push(PathEvent {
                    path,
                    flags: fsevents_flags(r.mask),
                });
            });
            if !complete {
                // What FSEvents says when it dropped events.
                out.push(PathEvent {
                    path: b"/".to_vec(),
                    flags: flags::MUST_SCAN,
                });
            }
            queue.push(out);
        }
    }

    /// What FSEvents would say of an inotify record: no cookie, no close.
    fn fsevents_flags(mask: u32) -> u32 {
        let mut f = 0;
        if mask & libc::IN_CREATE != 0 {
            f |= flags::CREATED;
        }
        if mask & libc::IN_DELETE != 0 {
            f |= flags::REMOVED;
        }
        if mask & (libc::IN_MOVED_FROM | libc::IN_MOVED_TO) != 0 {
            f |= flags::RENAMED;
        }
        if mask & libc::IN_MODIFY != 0 {
            f |= flags::MODIFIED;
        }
        if mask & libc::IN_ATTRIB != 0 {
            f |= flags::META;
        }
        if mask & libc::IN_ISDIR != 0 {
            f |= flags::IS_DIR;
        }
        f
    }
}

/// macOS: one FSEvents stream per session on the export root (file-level events), through
/// raw declarations of CoreServices (no C toolchain needed to build).
#[cfg(target_os = "macos")]
mod source {
    use std::ffi::{c_void, CStr};
    use std::os::raw::{c_char, c_long};

    use super::*;

    type CFAllocatorRef = *const c_void;
    type CFArrayRef = *const c_void;
    type CFStringRef = *const c_void;
    type FSEventStreamRef = *mut c_void;
    type DispatchQueue = *mut c_void;

    #[repr(C)]
    struct FSEventStreamContext {
        version: c_long,
        info: *mut c_void,
        retain: *const c_void,
        release: *const c_void,
        copy_description: *const c_void,
    }

    type Callback =
        extern "C" fn(FSEventStreamRef, *mut c_void, usize, *mut c_void, *const u32, *const u64);

    #[link(name = "CoreServices", kind = "framework")]
    extern "C" {
        fn FSEventStreamCreate(
            allocator: CFAllocatorRef,
            callback: Callback,
            context: *const FSEventStreamContext,
            paths: CFArrayRef,
            since_when: u64,
            latency: f64,
            flags: u32,
        ) -> FSEventStreamRef;
        fn FSEventStreamSetDispatchQueue(stream: FSEventStreamRef, queue: DispatchQueue);
        fn FSEventStreamStart(stream: FSEventStreamRef) -> u8;
        fn FSEventStreamStop(stream: FSEventStreamRef);
        fn FSEventStreamInvalidate(stream: FSEventStreamRef);
        fn FSEventStreamRelease(stream: FSEventStreamRef);
    }

    #[link(name = "CoreFoundation", kind = "framework")]
    extern "C" {
        fn CFStringCreateWithBytes(
            alloc: CFAllocatorRef,
            bytes: *const u8,
            len: isize,
            encoding: u32,
            external: u8,
        ) -> CFStringRef;
        fn CFArrayCreate(
            alloc: CFAllocatorRef,
            values: *const *const c_void,
            len: isize,
            callbacks: *const c_void,
        ) -> CFArrayRef;
        fn CFRelease(cf: *const c_void);
        static kCFTypeArrayCallBacks: c_void;
    }

    extern "C" {
        fn dispatch_queue_create(label: *const c_char, attr: *const c_void) -> DispatchQueue;
        fn dispatch_release(object: DispatchQueue);
    }

    const UTF8: u32 = 0x0800_0100;
    const SINCE_NOW: u64 = u64::MAX;
    const FLAG_NO_DEFER: u32 = 0x02;
    const FLAG_WATCH_ROOT: u32 = 0x04;
    const FLAG_FILE_EVENTS: u32 = 0x10;
    /// FSEvents' own latency: how long it gathers before calling back.
    const LATENCY: f64 = 0.01;

    // Event flags (FSEvents.h).
    const MUST_SCAN_SUBDIRS: u32 = 0x01;
    const USER_DROPPED: u32 = 0x02;
    const KERNEL_DROPPED: u32 = 0x04;
    const ROOT_CHANGED: u32 = 0x20;
    const UNMOUNT: u32 = 0x80;
    const ITEM_CREATED: u32 = 0x100;
    const ITEM_REMOVED: u32 = 0x200;
    const ITEM_INODE_META_MOD: u32 = 0x400;
    const ITEM_RENAMED: u32 = 0x800;
    const ITEM_MODIFIED: u32 = 0x1000;
    const ITEM_FINDER_INFO_MOD: u32 = 0x2000;
    const ITEM_CHANGE_OWNER: u32 = 0x4000;
    const ITEM_XATTR_MOD: u32 = 0x8000;
    const ITEM_IS_DIR: u32 = 0x20000;

    pub struct Source {
        stream: Mutex<Option<(usize, usize)>>,
        /// The queue the callback pushes to (kept alive for the stream's context).
        queue: Arc<Queue>,
    }

    extern "C" fn on_events(
        _stream: FSEventStreamRef,
        info: *mut c_void,
        n: usize,
        paths: *mut c_void,
        event_flags: *const u32,
        _ids: *const u64,
    ) {
        // SAFETY: info is the Queue the stream was created with (alive while the stream
        // is); paths is an array of n C strings and event_flags of n flags (no
        // kFSEventStreamCreateFlagUseCFTypes).
        let (queue, paths, fl) = unsafe {
            (
                &*(info as *const Queue),
                std::slice::from_raw_parts(paths as *const *const c_char, n),
                std::slice::from_raw_parts(event_flags, n),
            )
        };
        let events = paths.iter().zip(fl).map(|(&p, &f)| PathEvent {
            // SAFETY: each path is a NUL-terminated string FSEvents owns for the call.
            path: unsafe { CStr::from_ptr(p) }.to_bytes().to_vec(),
            flags: to_flags(f),
        });
        queue.push(events);
    }

    fn to_flags(f: u32) -> u32 {
        let mut out = 0;
        let lost = MUST_SCAN_SUBDIRS | USER_DROPPED | KERNEL_DROPPED | ROOT_CHANGED | UNMOUNT;
        if f & lost != 0 {
            out |= flags::MUST_SCAN;
        }
        if f & ITEM_CREATED != 0 {
            out |= flags::CREATED;
        }
        if f & ITEM_REMOVED != 0 {
            out |= flags::REMOVED;
        }
        if f & ITEM_RENAMED != 0 {
            out |= flags::RENAMED;
        }
        if f & ITEM_MODIFIED != 0 {
            out |= flags::MODIFIED;
        }
        let meta = ITEM_INODE_META_MOD | ITEM_FINDER_INFO_MOD | ITEM_CHANGE_OWNER | ITEM_XATTR_MOD;
        if f & meta != 0 {
            out |= flags::META;
        }
        if f & ITEM_IS_DIR != 0 {
            out |= flags::IS_DIR;
        }
        out
    }

    impl Source {
        pub fn new(queue: Arc<Queue>) -> io::Result<Source> {
            Ok(Source {
                stream: Mutex::new(None),
                queue,
            })
        }

        /// The first watched directory is the export root: the stream watches all of it
        /// (what is not watched is dropped when resolved).
        pub fn watch(&self, _node: NodeId, _fd: &OwnedFd, path: &[u8]) -> bool {
            let mut stream = self.stream.lock().unwrap();
            if stream.is_some() {
                return true;
            }
            // SAFETY: CoreFoundation and FSEvents calls with valid arguments; the stream
            // and queue are released in Drop.
            unsafe {
                let s = CFStringCreateWithBytes(
                    std::ptr::null(),
                    path.as_ptr(),
                    path.len() as isize,
                    UTF8,
                    0,
                );
                if s.is_null() {
                    return false;
                }
                let values = [s];
                let array = CFArrayCreate(
                    std::ptr::null(),
                    values.as_ptr(),
                    1,
                    &kCFTypeArrayCallBacks as *const c_void,
                );
                CFRelease(s);
                let context = FSEventStreamContext {
                    version: 0,
                    info: Arc::as_ptr(&self.queue) as *mut c_void,
                    retain: std::ptr::null(),
                    release: std::ptr::null(),
                    copy_description: std::ptr::null(),
                };
                let flags = FLAG_NO_DEFER | FLAG_WATCH_ROOT | FLAG_FILE_EVENTS;
                let st = FSEventStreamCreate(
                    std::ptr::null(),
                    on_events,
                    &context,
                    array,
                    SINCE_NOW,
                    LATENCY,
                    flags,
                );
                CFRelease(array);
                if st.is_null() {
                    return false;
                }
                let q = dispatch_queue_create(c"tether.fsevents".as_ptr(), std::ptr::null());
                FSEventStreamSetDispatchQueue(st, q);
                if FSEventStreamStart(st) == 0 {
                    FSEventStreamInvalidate(st);
                    FSEventStreamRelease(st);
                    dispatch_release(q);
                    return false;
                }
                *stream = Some((st as usize, q as usize));
            }
            true
        }

        pub fn unwatch(&self, _node: NodeId) {}

        pub fn wait(&self, queue: &Queue, timeout: Duration) -> bool {
            queue.wait(timeout)
        }

        /// The callback has queued its events already.
        pub fn read(&self, _queue: &Queue, _dirs: &HashMap<NodeId, Vec<u8>>) {}
    }

    impl Drop for Source {
        fn drop(&mut self) {
            if let Some((st, q)) = self.stream.lock().unwrap().take() {
                // SAFETY: the stream and queue made in `watch`, released once.
                unsafe {
                    FSEventStreamStop(st as FSEventStreamRef);
                    FSEventStreamInvalidate(st as FSEventStreamRef);
                    FSEventStreamRelease(st as FSEventStreamRef);
                    dispatch_release(q as DispatchQueue);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_of_one_path_are_merged_in_first_seen_order() {
        let e = |p: &[u8], f| PathEvent {
            path: p.to_vec(),
            flags: f,
        };
        let got = coalesce(vec![
            e(b"/x/a", flags::CREATED),
            e(b"/x/b", flags::MODIFIED),
            e(b"/x/a", flags::MODIFIED),
            e(b"/x/a", flags::REMOVED),
        ]);
        assert_eq!(
            got,
            vec![
                e(b"/x/a", flags::CREATED | flags::MODIFIED | flags::REMOVED),
                e(b"/x/b", flags::MODIFIED),
            ]
        );
    }

    #[test]
    fn paths_split_into_directory_and_name() {
        assert_eq!(split(b"/a/b"), Some((&b"/a"[..], &b"b"[..])));
        assert_eq!(split(b"/b"), Some((&b"/"[..], &b"b"[..])));
        assert_eq!(split(b"/a/"), None);
    }
}
