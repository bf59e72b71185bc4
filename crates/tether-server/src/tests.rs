//! Whole-session tests: requests executed against a watched export, and what the watcher
//! then pushes back (echo suppression, lookups overtaken by host changes).

use std::ffi::CString;
use std::os::fd::AsFd;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use tether_proto::{Caller, Invalidation, NodeId, Reply, Request, ROOT_NODE};

use crate::export::{Export, ExportFs, ExportOptions};
use crate::ops;

fn watched_session(dir: &Path) -> ExportFs {
    watched_session_with(dir, &ExportOptions::default())
}

fn watched_session_with(dir: &Path, opts: &ExportOptions) -> ExportFs {
    let export = Export::open(dir, opts).unwrap();
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
    match ops::dispatch(fs, caller, req).unwrap() {
        Reply::Entry(e) => e.node,
        other => panic!("lookup: {other:?}"),
    }
}

/// Every invalidation reported until the watcher has been quiet for 100 ms.
fn drain(fs: &ExportFs) -> Vec<Invalidation> {
    let mut all = Vec::new();
    loop {
        let c = fs
            .watch
            .as_ref()
            .unwrap()
            .changes(Duration::from_millis(100));
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
    host_write_just_before_a_rename(&watched_session, dir.path());
}

/// A host write to file `a` the session holds, then its rename to `b`: the file's node is
/// invalidated. Returns the invalidations the watcher made of both.
fn host_write_just_before_a_rename(
    session: &dyn Fn(&Path) -> ExportFs,
    dir: &Path,
) -> Vec<Invalidation> {
    let (a, b) = (dir.join("a"), dir.join("b"));
    std::fs::write(&a, b"old content").unwrap();
    let fs = session(dir);
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
    items
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
    let seen = fs.watch.as_ref().unwrap().batches_seen();
    let fd = fs.host().open_node(root_fd.as_fd(), &name).unwrap();
    let (before, birth) = fs.host().stat_born(fd.as_fd()).unwrap();
    assert_eq!(before.st_size, 0);
    std::fs::write(dir.path().join("f"), vec![b'x'; 4096]).unwrap();
    drain(&fs);
    meanwhile(&fs);
    let entry = ops::lookup::entry_for(&fs, ROOT_NODE, fd, (&before, birth), name, seen).unwrap();
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
        fh: None,
        offset: 8,
        data: Bytes::from_static(b"appended"),
    };
    let Reply::Written { size, attr } = ops::dispatch(&fs, caller, write).unwrap() else {
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
/// pages. fanotify names the writer (watch/fanotify.rs).
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
    if fs.watch.as_ref().is_some_and(|w| !w.tells_writers()) {
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
    let run = |req| ops::dispatch(&fs, caller, req).unwrap();
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

/// The same as `a_host_write_just_before_a_rename_invalidates_the_file`, with the portable
/// backend and its FSEvents-like watcher (paths only, no cookies).
#[test]
fn with_the_portable_watcher_a_host_write_before_a_rename_invalidates_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let portable = ExportOptions {
        backend: crate::export::BackendKind::Portable,
        ..ExportOptions::default()
    };
    let items =
        host_write_just_before_a_rename(&|d| watched_session_with(d, &portable), dir.path());
    assert!(items.contains(&Invalidation::Entry {
        parent: ROOT_NODE,
        name: Bytes::from_static(b"a"),
    }));
}

/// A watcher that reports the events it is given, once.
struct Scripted(std::sync::Mutex<Vec<crate::watch::WatchEvent>>);

impl crate::watch::Watcher for Scripted {
    fn watch_dir(&self, _node: NodeId, _fd: &std::os::fd::OwnedFd) -> bool {
        true
    }
    fn unwatch(&self, _node: NodeId, _fd: Option<&std::os::fd::OwnedFd>) {}
    fn wait(&self, _timeout: Duration) -> bool {
        true
    }
    fn drain(&self) -> std::io::Result<crate::watch::Batch> {
        let events = std::mem::take(&mut *self.0.lock().unwrap());
        Ok(crate::watch::Batch::Events(events, Default::default()))
    }
    fn tells_writers(&self) -> bool {
        false
    }
    fn made_unnamed(&self, _ino: u64) {}
}

/// FSEvents' "must scan subdirectories" for a directory invalidates everything the client
/// holds there and below: the directory, each name and each node.
#[test]
fn a_rescan_invalidates_everything_held_below_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("d/e")).unwrap();
    std::fs::write(dir.path().join("d/e/f"), b"x").unwrap();
    std::fs::write(dir.path().join("g"), b"x").unwrap();
    let fs = watched_session(dir.path());
    let caller = Caller {
        uid: 0,
        gid: 0,
        pid: 1,
    };
    let look = |parent, name: &'static [u8]| {
        let req = Request::Lookup {
            parent,
            name: Bytes::from_static(name),
        };
        match ops::dispatch(&fs, caller, req).unwrap() {
            Reply::Entry(e) => e.node,
            other => panic!("lookup: {other:?}"),
        }
    };
    let d = look(ROOT_NODE, b"d");
    let e = look(d, b"e");
    let f = look(e, b"f");
    let g = look(ROOT_NODE, b"g");
    let rescan = crate::watch::WatchEvent {
        dir: d,
        name: None,
        change: crate::watch::Change::Rescan,
    };
    let watch = crate::watch::coalesce::Watch::new(
        Box::new(Scripted(std::sync::Mutex::new(vec![rescan]))),
        fs.nodes.clone(),
        fs.export.host.clone(),
        false,
    );
    let items = watch.queued_changes().items;
    let entry = |parent, name: &'static [u8]| Invalidation::Entry {
        parent,
        name: Bytes::from_static(name),
    };
    for inv in [
        Invalidation::Inode(d),
        entry(d, b"e"),
        Invalidation::Inode(e),
        entry(e, b"f"),
        Invalidation::Inode(f),
    ] {
        assert!(items.contains(&inv), "{inv:?} missing from {items:?}");
    }
    // Nothing outside the directory.
    assert!(!items.contains(&Invalidation::Inode(g)), "{items:?}");
    assert!(!items.contains(&entry(ROOT_NODE, b"g")), "{items:?}");
}

/// A LOOKUP of a directory handled while its FORGET is (two workers) may find the node gone
/// and make a new one, which gets the directory's inotify watch back from the kernel (one
/// per inode): the FORGET must not remove that watch once it gets to it, or nothing in the
/// directory is pushed again while the client holds the new node.
#[test]
fn a_directory_looked_up_again_while_its_forget_is_handled_stays_watched() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("d")).unwrap();
    let fs = watched_session(dir.path());
    let old = lookup(&fs, b"d");
    // ops::entry::forget's two steps, with the LOOKUP between them.
    let gone = fs.nodes.forget(old, 1).expect("the only lookup forgotten");
    let again = lookup(&fs, b"d");
    assert_eq!(again, old, "the same directory, the same id");
    fs.watch.as_ref().unwrap().forgotten(&gone);
    drain(&fs);
    std::fs::write(dir.path().join("d/new"), b"x").unwrap();
    let items = drain(&fs);
    let created = Invalidation::Entry {
        parent: again,
        name: Bytes::from_static(b"new"),
    };
    assert!(
        items.contains(&created),
        "a creation in the directory looked up again was not pushed: {items:?}"
    );
}
