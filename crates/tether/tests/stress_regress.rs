//! Regressions found by stress-ng (`bench/stress.sh`), on a real server and mount.
//!
//! The server keeps a bounded number of node descriptors and closes the oldest when there
//! are more; a node without one is found again by the name it was last seen under. A file
//! the guest holds open after its name is gone (unlinked, replaced by a rename, or its
//! last-seen hard link removed) cannot be found that way, so it must keep its descriptor:
//! stress-ng's I/O stressors open a file, unlink it and work on it for minutes, and with
//! enough other files around every request on it failed with ESTALE.

mod common;

use std::fs::{self, File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;

use common::TestMount;

/// The fewest node descriptors the server accepts: a few dozen other files evict the rest.
fn small_server() -> TestMount {
    TestMount::start_with(&["--max-node-fds", "16"], &[])
}

/// Creates `n` other files through the mount: each is a node with a descriptor, so the
/// server closes the descriptors of older nodes.
fn churn(dir: &Path, n: usize) {
    let dir = dir.join("churn");
    fs::create_dir_all(&dir).unwrap();
    for i in 0..n {
        fs::write(dir.join(format!("f{i}")), b"x").unwrap();
    }
}

/// Drops the guest's cached pages of `f`, so the next read goes to the server.
fn drop_pages(f: &File) {
    // SAFETY: an advisory call on an open descriptor.
    let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(r, 0, "posix_fadvise");
}

/// Writes, syncs, truncates and reads `f` (which holds `before`), each of which reaches the
/// server, and checks what comes back.
fn use_file(f: &File, before: &[u8]) {
    let n = before.len() as u64;
    f.write_all_at(b"+more", n)
        .expect("write to the open file after its name is gone");
    f.sync_all().expect("fsync");
    drop_pages(f);
    let mut got = vec![0u8; before.len() + 5];
    f.read_exact_at(&mut got, 0).expect("read");
    assert_eq!(&got[..before.len()], before);
    assert_eq!(&got[before.len()..], b"+more");
    f.set_len(2).expect("ftruncate");
    assert_eq!(f.metadata().expect("fstat").len(), 2);
}

#[test]
fn unlinked_open_file_keeps_working() {
    require_mount!();
    let t = small_server();
    let path = t.mnt.join("victim");
    let f = OpenOptions::new()
        .create_new(true)
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    f.write_all_at(b"hello", 0).unwrap();
    fs::remove_file(&path).unwrap();
    churn(&t.mnt, 64);
    use_file(&f, b"hello");
}

#[test]
fn file_unlinked_on_the_host_keeps_working_while_open() {
    require_mount!();
    let t = small_server();
    fs::write(t.mnt.join("hostgone"), b"hello").unwrap();
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(t.mnt.join("hostgone"))
        .unwrap();
    // As on a local file system, a file removed by someone else stays usable while open.
    fs::remove_file(t.export.join("hostgone")).unwrap();
    churn(&t.mnt, 64);
    use_file(&f, b"hello");
}

#[test]
fn open_file_replaced_by_a_rename_keeps_working() {
    require_mount!();
    let t = small_server();
    let (old, new) = (t.mnt.join("target"), t.mnt.join("incoming"));
    fs::write(&old, b"old").unwrap();
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&old)
        .unwrap();
    fs::write(&new, b"new").unwrap();
    fs::rename(&new, &old).unwrap();
    churn(&t.mnt, 64);
    use_file(&f, b"old");
    // The writes went to the replaced file, not to the one now under its name.
    assert_eq!(fs::read(t.export.join("target")).unwrap(), b"new");
}

#[test]
fn open_file_whose_last_seen_link_is_removed_keeps_working() {
    require_mount!();
    let t = small_server();
    let (a, b) = (t.mnt.join("a"), t.mnt.join("b"));
    fs::write(&a, b"linked").unwrap();
    let f = OpenOptions::new().read(true).write(true).open(&a).unwrap();
    // The server last saw the file as "b"; once "b" is gone it is only "a".
    fs::hard_link(&a, &b).unwrap();
    fs::remove_file(&b).unwrap();
    churn(&t.mnt, 64);
    use_file(&f, b"linked");
    assert_eq!(fs::read(t.export.join("a")).unwrap(), b"li");
}

#[test]
fn files_without_a_name_do_not_lift_the_descriptor_limit() {
    require_mount!();
    let t = small_server();
    // 40 open files without names: more than the 16 node descriptors and the quarter more
    // that such files may keep.
    let files: Vec<File> = (0..40)
        .map(|i| {
            let path = t.mnt.join(format!("gone{i}"));
            let f = OpenOptions::new()
                .create_new(true)
                .read(true)
                .write(true)
                .open(&path)
                .unwrap();
            fs::remove_file(&path).unwrap();
            f
        })
        .collect();
    churn(&t.mnt, 64);
    let export = t.export.canonicalize().unwrap();
    let held = || {
        fs::read_dir(format!("/proc/{}/fd", t.server.child.id()))
            .unwrap()
            .filter_map(|e| fs::read_link(e.unwrap().path()).ok())
            .filter(|target| target.starts_with(&export))
            .count()
    };
    // The client releases the handles of its last creations asynchronously: allow them a
    // moment to go, then the count must be within the limit.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while held() > 20 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let held = held();
    assert!(
        held <= 20,
        "the server holds {held} descriptors in the export"
    );
    drop(files);
}
