//! From inotify events to what the client is told: the invalidations its caches need and,
//! if it asked (HOST_EVENTS), the host events behind them, so that it can raise the inotify
//! events a local change would have raised in the guest. Echoes of the session's own
//! changes are left out of both.

use std::collections::HashMap;
use std::ffi::CString;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tether_proto::{EventKind, HostEvent, Invalidation, NodeId, ROOT_NODE};

use super::nodes::Node;
use super::ops::ExportFs;
use super::watch::{changed_bits, name_change, Batch, NameChange};

/// Files with someone else's change not yet closed that are remembered at most (a writer
/// that never closes, or a file deleted first, is forgotten when the table is full).
const MAX_FOREIGN_WRITERS: usize = 65_536;

/// One batch of changes for the client.
#[derive(Debug, Default)]
pub struct Changes {
    pub items: Vec<Invalidation>,
    pub events: Vec<HostEvent>,
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        self.items.is_empty() && self.events.is_empty()
    }
}

/// Builds one batch: invalidations once each, events in order, content events of one name
/// merged, and the two halves of a rename joined.
#[derive(Default)]
struct Collector {
    out: Changes,
    seen: std::collections::HashSet<Invalidation>,
    /// (dir, name) -> index of its `Changed` event in this batch.
    changed_at: HashMap<(NodeId, Vec<u8>), usize>,
    /// rename cookie -> index of the provisional `Deleted` event its first half left.
    moved_from: HashMap<u32, usize>,
    /// Directory paths resolved in this batch, and the export root's own path.
    paths: HashMap<NodeId, Option<Bytes>>,
    root: Option<Option<Vec<u8>>>,
}

impl Collector {
    fn invalidate(&mut self, inv: Invalidation) {
        if self.seen.insert(inv.clone()) {
            self.out.items.push(inv);
        }
    }
}

impl ExportFs {
    /// Waits up to `timeout` for events and turns them into changes ([`ExportFs::queued_changes`]).
    pub fn changes(&self, timeout: Duration) -> Changes {
        if !self.wait_for_changes(timeout) {
            return Changes::default();
        }
        self.queued_changes()
    }

    /// Waits up to `timeout` for watch events to be queued (and a moment for more to
    /// gather); true if there may be some to read. Reads nothing.
    pub fn wait_for_changes(&self, timeout: Duration) -> bool {
        match &self.watcher {
            Some(w) => w.wait(timeout),
            None => {
                std::thread::sleep(timeout);
                false
            }
        }
    }

    /// Turns the watch events queued now into the invalidations (and host events) the
    /// client needs, leaving out the echoes of its own changes. Does not wait.
    pub fn queued_changes(&self) -> Changes {
        let Some(w) = &self.watcher else {
            return Changes::default();
        };
        let (events, mut by_others) = match w.read_queued() {
            Ok(Batch::Events(e, foreign)) => {
                // Before any node is looked for (ops.rs, `state_now`).
                if !e.is_empty() || !foreign.is_empty() {
                    self.batches_seen.fetch_add(1, Ordering::SeqCst);
                }
                (e, foreign)
            }
            Ok(Batch::Overflow) => {
                tracing::warn!("watch queue overflowed: invalidating everything the client holds");
                return Changes {
                    items: vec![Invalidation::All],
                    events: Vec::new(),
                };
            }
            Err(e) => {
                tracing::warn!("reading watch events failed: {e}");
                return Changes::default();
            }
        };
        let mut c = Collector::default();
        for ev in events {
            let Ok((dir, dir_fd)) = self.node_fd(ev.dir) else {
                continue;
            };
            match (&ev.name, name_change(ev.mask)) {
                (Some(name), Some(change)) => {
                    if matches!(change, NameChange::MovedTo | NameChange::Created) {
                        self.check_new_name(&mut c, &dir_fd, name);
                    }
                    if w.is_own(ev.dir, name, change) {
                        continue;
                    }
                    c.invalidate(Invalidation::Entry {
                        parent: ev.dir,
                        name: Bytes::from(name.clone()),
                    });
                    c.invalidate(Invalidation::Inode(ev.dir));
                    if self.host_events {
                        self.name_event(&mut c, &dir_fd, ev.dir, name, change, ev.mask, ev.cookie);
                    }
                }
                (Some(name), None) => {
                    // Content or attributes of an entry of the directory.
                    let Ok(cname) = CString::new(name.clone()) else {
                        continue;
                    };
                    let Ok(st) = self.host().stat_at(dir_fd.as_fd(), &cname) else {
                        continue;
                    };
                    let bits = changed_bits(ev.mask);
                    let key = (ev.dir, name.clone());
                    let file = (st.st_dev, st.st_ino);
                    let closing = ev.mask & libc::IN_CLOSE_WRITE != 0;
                    // Another process's change, whatever the ctime says (foreign.rs).
                    let by_other = by_others.remove(&key);
                    let foreign = match self.nodes.find(st.st_dev, st.st_ino) {
                        Some(child) if self.changed_since_sync(&child) || by_other => {
                            c.invalidate(Invalidation::Inode(child.id));
                            true
                        }
                        // Unchanged since the client was last told: the echo of its own
                        // change, unless this batch already holds someone else's change to
                        // it or someone else's write to it is being closed.
                        Some(_) => {
                            c.changed_at.contains_key(&key)
                                || (closing && self.foreign_writers.contains_key(&file))
                        }
                        // The client holds no node for it, so the change cannot be its own.
                        None => true,
                    };
                    if foreign {
                        // Remember the writer until it closes: by then the content may look
                        // synced (a lookup in between), yet the close is still someone else's.
                        // Only a write opens such an entry: one opened by a chmod would
                        // outlive a deletion and pass to the next file on that inode number.
                        let writing = ev.mask & libc::IN_MODIFY != 0;
                        if closing {
                            self.foreign_writers.remove(&file);
                        } else if writing && self.foreign_writers.len() < MAX_FOREIGN_WRITERS {
                            self.foreign_writers.insert(file, ());
                        }
                    }
                    if foreign && self.host_events {
                        let node = self.nodes.id_for(st.st_dev, st.st_ino);
                        let file_type = st.st_mode & libc::S_IFMT;
                        self.changed_event(&mut c, &dir_fd, ev.dir, key, node, file_type, bits);
                    }
                }
                (None, _) => {
                    // The directory itself: its attributes, or it was deleted or moved.
                    // A deletion or move also shows in the parent's watch, which invalidates
                    // the name; here only the directory's own attributes matter.
                    if self.changed_since_sync(&dir) {
                        c.invalidate(Invalidation::Inode(ev.dir));
                    }
                }
            }
        }
        // Other processes' changes whose inotify event is not in this batch: it was read with
        // the last one, a moment before their fanotify event was queued, or it comes with
        // the next one. The node's synced ctime is left alone: in the second case that
        // event must still be found foreign (the host event of a watched file).
        for (dir, name) in by_others {
            let (Ok((_, dir_fd)), Ok(name)) = (self.node_fd(dir), CString::new(name)) else {
                continue;
            };
            if let Some(child) = self.held_by_name(dir_fd.as_fd(), &name) {
                c.invalidate(Invalidation::Inode(child.id));
            }
        }
        c.out
    }

    #[allow(clippy::too_many_arguments)]
    fn name_event(
        &self,
        c: &mut Collector,
        dir_fd: &OwnedFd,
        dir: NodeId,
        name: &[u8],
        change: NameChange,
        mask: u32,
        cookie: u32,
    ) {
        let Some(dir_path) = self.guest_path(c, dir, dir_fd) else {
            return;
        };
        // What is there now, for creations; removals only know whether it was a directory.
        let mut node = 0;
        let mut file_type = if mask & libc::IN_ISDIR != 0 {
            libc::S_IFDIR
        } else {
            libc::S_IFREG
        };
        if matches!(change, NameChange::Created | NameChange::MovedTo) {
            if let Ok(st) = CString::new(name)
                .map_err(|_| ())
                .and_then(|n| self.host().stat_at(dir_fd.as_fd(), &n).map_err(|_| ()))
            {
                node = self.nodes.id_for(st.st_dev, st.st_ino);
                file_type = st.st_mode & libc::S_IFMT;
            }
        }
        let mut event = HostEvent {
            dir,
            dir_path,
            name: Bytes::copy_from_slice(name),
            node,
            file_type,
            kind: EventKind::Created,
        };
        match change {
            NameChange::Created => {}
            NameChange::Deleted => event.kind = EventKind::Deleted,
            NameChange::MovedFrom => {
                // Provisional: becomes the rename when its other half comes, else stays a
                // deletion (moved out of what the client holds).
                event.kind = EventKind::Deleted;
                c.moved_from.insert(cookie, c.out.events.len());
            }
            NameChange::MovedTo => {
                if let Some(at) = c.moved_from.remove(&cookie) {
                    let from = &c.out.events[at];
                    event.kind = EventKind::Moved {
                        from_dir: from.dir,
                        from_path: from.dir_path.clone(),
                        from_name: from.name.clone(),
                    };
                    c.out.events[at] = event;
                    return;
                }
            }
        }
        c.out.events.push(event);
    }

    #[allow(clippy::too_many_arguments)]
    fn changed_event(
        &self,
        c: &mut Collector,
        dir_fd: &OwnedFd,
        dir: NodeId,
        key: (NodeId, Vec<u8>),
        node: NodeId,
        file_type: u32,
        bits: u8,
    ) {
        if let Some(&at) = c.changed_at.get(&key) {
            if let EventKind::Changed(old) = &mut c.out.events[at].kind {
                *old |= bits;
            }
            return;
        }
        let Some(dir_path) = self.guest_path(c, dir, dir_fd) else {
            return;
        };
        c.changed_at.insert(key.clone(), c.out.events.len());
        c.out.events.push(HostEvent {
            dir,
            dir_path,
            name: Bytes::from(key.1),
            node,
            file_type,
            kind: EventKind::Changed(bits),
        });
    }

    /// The directory's path below the export root as it is now, or None if it is no longer
    /// inside the export. The kernel keeps a descriptor's path current across renames.
    fn guest_path(&self, c: &mut Collector, dir: NodeId, dir_fd: &OwnedFd) -> Option<Bytes> {
        if dir == ROOT_NODE {
            return Some(Bytes::new());
        }
        if let Some(p) = c.paths.get(&dir) {
            return p.clone();
        }
        let root = c
            .root
            .get_or_insert_with(|| {
                let (_, root_fd) = self.node_fd(ROOT_NODE).ok()?;
                self.host().fd_path(root_fd.as_fd()).ok()
            })
            .clone();
        let resolved = (|| {
            let path = self.host().fd_path(dir_fd.as_fd()).ok()?;
            let rel = path.strip_prefix(root?.as_slice())?.strip_prefix(b"/")?;
            if rel.ends_with(b" (deleted)") {
                return None;
            }
            Some(Bytes::copy_from_slice(rel))
        })();
        c.paths.insert(dir, resolved.clone());
        resolved
    }

    /// A change of a file's content or attributes is reported under the name it had then.
    /// If the file was renamed (or linked and unlinked) before the event was read, that name
    /// no longer finds it and the change would be lost; so every name that now refers to a
    /// file (moved or created there) has that file checked too. Own renames are own changes
    /// of the moved node, so this finds only someone else's changes.
    fn check_new_name(&self, c: &mut Collector, dir_fd: &OwnedFd, name: &[u8]) {
        let Ok(cname) = CString::new(name) else {
            return;
        };
        let Ok(st) = self.host().stat_at(dir_fd.as_fd(), &cname) else {
            return;
        };
        if let Some(node) = self.nodes.find(st.st_dev, st.st_ino) {
            if self.changed_since_sync(&node) {
                c.invalidate(Invalidation::Inode(node.id));
            }
        }
    }

    /// Whether the host state of `node` differs from what the client is coherent with; if
    /// so, the client is about to be told, so that state becomes the coherent one. The state
    /// is read under the node's lock, so it cannot interleave with an own change.
    fn changed_since_sync(&self, node: &Arc<Node>) -> bool {
        let mut synced = node.synced_ctime.lock().unwrap();
        let Ok(fd) = self.nodes.fd(node) else {
            return true;
        };
        let Ok(st) = self.host().stat(fd.as_fd()) else {
            return true;
        };
        let now = (st.st_ctime, st.st_ctime_nsec);
        if *synced == now {
            return false;
        }
        tracing::trace!(
            node = node.id,
            ?synced,
            ?now,
            "changed behind the client's back"
        );
        *synced = now;
        true
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use tether_proto::{Caller, Reply, Request};

    use super::*;
    use crate::export::{Export, ExportOptions};

    fn watched_session(dir: &Path) -> ExportFs {
        let export = Export::open(dir, &ExportOptions::default()).unwrap();
        ExportFs::new(export, true, false, (0, 0)).unwrap()
    }

    fn lookup(fs: &ExportFs, name: &'static [u8]) -> NodeId {
        let caller = Caller {
            uid: 0,
            gid: 0,
            pid: 1,
        };
        let req = Request::Lookup {
            parent: ROOT_NODE,
            name: Bytes::from_static(name),
        };
        match fs.dispatch(caller, req).unwrap() {
            Reply::Entry(e) => e.node,
            other => panic!("lookup: {other:?}"),
        }
    }

    /// Every invalidation reported until the watcher has been quiet for 100 ms.
    fn drain(fs: &ExportFs) -> Vec<Invalidation> {
        let mut all = Vec::new();
        loop {
            let c = fs.changes(Duration::from_millis(100));
            if c.is_empty() {
                return all;
            }
            all.extend(c.items);
        }
    }

    /// Found by tether-fsx: the write's event names "a", which no longer exists when it is
    /// read, so only the new name can lead to the changed file.
    #[test]
    fn a_host_write_just_before_a_rename_invalidates_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::write(&a, b"old content").unwrap();
        let fs = watched_session(dir.path());
        let node = lookup(&fs, b"a");
        drain(&fs);
        let f = std::fs::OpenOptions::new().write(true).open(&a).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, b"new", 0).unwrap();
        drop(f);
        std::fs::rename(&a, &b).unwrap();
        let items = drain(&fs);
        assert!(
            items.contains(&Invalidation::Inode(node)),
            "the renamed file's node {node} was not invalidated: {items:?}"
        );
    }

    /// The size a lookup of the empty file "f" answers with, when a host write of 4,096
    /// bytes lands after the lookup read the file's status and the watcher handles its
    /// event before the lookup records the node; `meanwhile` runs just before that.
    fn size_answered_after_a_write_overtakes(meanwhile: impl FnOnce(&ExportFs)) -> u64 {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), b"").unwrap();
        let fs = watched_session(dir.path());
        drain(&fs);
        let (_, root_fd) = fs.node_fd(ROOT_NODE).unwrap();
        let name = CString::new("f").unwrap();
        let seen = fs.batches_seen.load(Ordering::SeqCst);
        let fd = fs.host().open_node(root_fd.as_fd(), &name).unwrap();
        let (before, birth) = fs.host().stat_born(fd.as_fd()).unwrap();
        assert_eq!(before.st_size, 0);
        std::fs::write(dir.path().join("f"), vec![b'x'; 4096]).unwrap();
        drain(&fs);
        meanwhile(&fs);
        let entry = fs
            .entry_for(ROOT_NODE, fd, (&before, birth), name, seen)
            .unwrap();
        entry.attr.size
    }

    /// Nothing is pushed for a file the client does not hold, so the reply must carry the
    /// state after the write (seen about once in 25 loaded runs of fsx.rs's rename test as
    /// a first read of 0 bytes).
    #[test]
    fn a_lookup_that_a_host_write_overtakes_answers_with_the_write() {
        let size = size_answered_after_a_write_overtakes(|_| {});
        assert_eq!(size, 4096, "the reply has the size from before the write");
    }

    /// As above, with a second lookup of the file, made after the write, recording the node
    /// first: the late first reply must not carry the older size either, or the client
    /// keeps whichever comes last (the rename test again, once the client listed a
    /// directory with two threads at once).
    #[test]
    fn a_lookup_overtaken_by_a_write_and_another_lookup_answers_with_the_write() {
        let size = size_answered_after_a_write_overtakes(|fs| {
            lookup(fs, b"f");
        });
        assert_eq!(
            size, 4096,
            "the late reply has the size from before the write"
        );
    }

    /// WRITE_ATTR: the reply carries the state after the write, the one the echo check read
    /// (its size and ctime are the host's), and the write's echo is not pushed.
    #[test]
    fn a_write_reply_carries_the_state_the_echo_check_read() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), b"0123456789").unwrap();
        let mut fs = watched_session(dir.path());
        fs.write_attr = true;
        let node = lookup(&fs, b"f");
        drain(&fs);
        let caller = Caller {
            uid: 0,
            gid: 0,
            pid: 1,
        };
        let write = Request::Write {
            node,
            fh: 0,
            offset: 8,
            data: Bytes::from_static(b"appended"),
        };
        let Reply::Written { size, attr } = fs.dispatch(caller, write).unwrap() else {
            panic!("write")
        };
        let host = std::fs::metadata(dir.path().join("f")).unwrap();
        use std::os::unix::fs::MetadataExt;
        let a = attr.expect("the attributes after the write");
        assert_eq!((size, a.size), (8, 16));
        assert_eq!(
            (a.ctime.sec, a.ctime.nsec),
            (host.ctime(), host.ctime_nsec() as u32)
        );
        let items = drain(&fs);
        assert!(
            !items.contains(&Invalidation::Inode(node)),
            "the session's own write was pushed back: {items:?}"
        );
    }

    /// Found by tether-fsx with the writeback cache: a host write in the moment between a
    /// session's own write and its look at the ctime after it (which then includes the
    /// host's write) was taken for the echo of the own write, and the guest kept its old
    /// pages. fanotify names the writer (foreign.rs).
    #[test]
    fn a_host_write_during_an_own_write_is_pushed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"0123456789").unwrap();
        let fs = watched_session(dir.path());
        let node = lookup(&fs, b"f");
        drain(&fs);
        let (n, fd) = fs.node_fd(node).unwrap();
        let host_write = format!(
            "printf HOST | dd of={} bs=1 seek=5 conv=notrunc 2>/dev/null",
            path.display()
        );
        fs.own_change(
            &n,
            fd.as_fd(),
            || {
                let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
                std::os::unix::fs::FileExt::write_all_at(&f, b"own", 0).unwrap();
                let host = std::process::Command::new("sh")
                    .arg("-c")
                    .arg(&host_write)
                    .status();
                assert!(host.unwrap().success());
                Ok(())
            },
            |before, _| before,
        )
        .unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"own34HOST9");
        let items = drain(&fs);
        if fs.watcher.as_ref().is_some_and(|w| !w.tells_writers()) {
            eprintln!("skipped: no fanotify here, so such a host write goes unnoticed");
            return;
        }
        assert!(
            items.contains(&Invalidation::Inode(node)),
            "the host's write to node {node} was taken for the session's own: {items:?}"
        );
    }

    /// Found in CI under load: the watcher read the creation of "obj" only after the guest
    /// had created files in it, by which time obj's ctime had moved on. Those changes are
    /// this session's own, so nothing may be pushed however late the events are read.
    #[test]
    fn own_changes_in_a_new_directory_are_not_echoed_when_read_late() {
        let dir = tempfile::tempdir().unwrap();
        let fs = watched_session(dir.path());
        let caller = Caller {
            uid: 0,
            gid: 0,
            pid: 1,
        };
        let run = |req| fs.dispatch(caller, req).unwrap();
        let name = Bytes::from_static;
        let mkdir = |parent, dir: &'static [u8]| {
            let req = Request::Mkdir {
                parent,
                name: name(dir),
                mode: 0o755,
                umask: 0,
            };
            match run(req) {
                Reply::Entry(e) => e.node,
                other => panic!("mkdir: {other:?}"),
            }
        };
        let obj = mkdir(ROOT_NODE, b"obj");
        for file in [&b"a"[..], b"b", b"c"] {
            let Reply::Create { fh, entry, .. } = run(Request::Create {
                parent: obj,
                name: Bytes::copy_from_slice(file),
                mode: 0o644,
                umask: 0,
                flags: libc::O_WRONLY as u32,
            }) else {
                panic!("create")
            };
            run(Request::Release {
                node: entry.node,
                fh,
            });
            if file == b"c" {
                run(Request::Link {
                    node: entry.node,
                    new_parent: obj,
                    new_name: name(b"c-link"),
                });
            }
        }
        let sub = mkdir(obj, b"sub");
        run(Request::Rename {
            parent: obj,
            name: name(b"a"),
            new_parent: sub,
            new_name: name(b"a"),
            flags: 0,
        });
        run(Request::Rename {
            parent: obj,
            name: name(b"b"),
            new_parent: obj,
            new_name: name(b"c"),
            flags: 0,
        });
        run(Request::Unlink {
            parent: sub,
            name: name(b"a"),
        });
        run(Request::Rmdir {
            parent: obj,
            name: name(b"sub"),
        });
        let items = drain(&fs);
        assert!(items.is_empty(), "own changes came back: {items:?}");
    }
}
