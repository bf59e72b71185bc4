//! Ending a mount: signals to the client, unmount with files open, and a client that dies
//! (the server must free everything that client held).

mod common;

use std::fs;
use std::io::Read;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{TestMount, Tmpfs, TETHER};

fn fd_count(pid: u32) -> usize {
    fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count()
}

fn wait_until(what: &str, done: impl FnMut() -> bool) {
    common::wait_until(what, Duration::from_secs(10), done)
}

fn unmount(mnt: &Path, lazy: bool) -> std::process::Output {
    let mut cmd = Command::new(TETHER);
    cmd.arg("unmount").arg(mnt);
    if lazy {
        cmd.arg("--lazy");
    }
    cmd.output().unwrap()
}

#[test]
fn sigterm_unmounts_cleanly() {
    require_mount!();
    let mut t = TestMount::start();
    fs::write(t.mnt.join("x"), b"x").unwrap();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(t.mount.child.id() as i32, libc::SIGTERM) };
    let status = t.mount.child.wait().unwrap();
    assert!(status.success(), "mount exited with {status}");
    assert!(!common::is_mounted(&t.mnt));
    assert_eq!(fs::read(t.export.join("x")).unwrap(), b"x");
}

/// A file still open for a moment after SIGTERM (a process finishing as the mount is
/// stopped): the client tries the unmount again meanwhile, then exits cleanly. (Until it
/// did, a SIGTERM that met a moment's EBUSY left the mount running.)
#[test]
fn sigterm_while_a_file_is_open_for_a_moment_still_unmounts() {
    require_mount!();
    let mut t = TestMount::start();
    let f = fs::File::create(t.mnt.join("x")).unwrap();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(t.mount.child.id() as i32, libc::SIGTERM) };
    std::thread::sleep(Duration::from_millis(300));
    assert!(common::is_mounted(&t.mnt), "unmounted with a file open");
    drop(f);
    wait_until("the client exits", || {
        matches!(t.mount.child.try_wait(), Ok(Some(_)))
    });
    let status = t.mount.child.wait().unwrap();
    assert!(status.success(), "mount exited with {status}");
    assert!(!common::is_mounted(&t.mnt));
}

#[test]
fn unmount_with_files_open_says_why_and_lazy_detaches() {
    require_mount!();
    let mut t = TestMount::start();
    fs::write(t.export.join("held"), b"still readable").unwrap();
    let mut held = fs::File::open(t.mnt.join("held")).unwrap();
    let out = unmount(&t.mnt, false);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("files or working directories are open") && err.contains("--lazy"),
        "{err}"
    );
    assert!(common::is_mounted(&t.mnt));
    // Lazy: the mount leaves the namespace at once, the open file keeps working, and the
    // client exits when the file is closed.
    let out = unmount(&t.mnt, true);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!common::is_mounted(&t.mnt));
    let mut s = String::new();
    held.read_to_string(&mut s).unwrap();
    assert_eq!(s, "still readable");
    drop(held);
    wait_until("the client exits", || {
        matches!(t.mount.child.try_wait(), Ok(Some(_)))
    });
}

fn mount_type(mnt: &Path) -> Option<String> {
    let mounts = fs::read_to_string("/proc/mounts").unwrap();
    let want = mnt.to_string_lossy();
    mounts
        .lines()
        .rfind(|l| l.split_whitespace().nth(1) == Some(&want))
        .and_then(|l| l.split_whitespace().nth(2).map(str::to_string))
}

/// After an unmount from outside, the client ends without unmounting again: what is
/// mounted at that path by then (here a tmpfs, put there while a file kept the detached
/// Tether mount alive) is someone else's.
#[test]
fn a_client_unmounted_from_outside_leaves_a_later_mount_alone() {
    require_mount!();
    let mut t = TestMount::start();
    fs::write(t.export.join("held"), b"x").unwrap();
    let held = fs::File::open(t.mnt.join("held")).unwrap();
    let out = unmount(&t.mnt, true);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tmpfs = Tmpfs::mount(&t.mnt, None);
    assert_eq!(mount_type(&t.mnt).as_deref(), Some("tmpfs"));
    // The last file closed: the kernel ends the Tether connection and the client exits.
    drop(held);
    wait_until("the client exits", || {
        matches!(t.mount.child.try_wait(), Ok(Some(_)))
    });
    let status = t.mount.child.wait().unwrap();
    assert!(status.success(), "mount exited with {status}");
    assert_eq!(
        mount_type(&t.mnt).as_deref(),
        Some("tmpfs"),
        "the ending client unmounted what was mounted after it"
    );
    drop(tmpfs);
}

#[test]
fn a_killed_client_leaves_nothing_held_on_the_server() {
    require_mount!();
    let mut t = TestMount::start();
    let server_pid = t.server.child.id();
    for i in 0..50 {
        fs::create_dir_all(t.export.join(format!("d{}", i % 5))).unwrap();
        fs::write(t.export.join(format!("d{}/f{i}", i % 5)), b"data").unwrap();
    }
    wait_until("the idle server settles", || fd_count(server_pid) > 0);
    let baseline_mounted = fd_count(server_pid);
    // Walk and read everything, and keep files open, so the server holds nodes and handles.
    let mut open = Vec::new();
    for i in 0..50 {
        let p = t.mnt.join(format!("d{}/f{i}", i % 5));
        assert_eq!(fs::read(&p).unwrap(), b"data");
        open.push(fs::OpenOptions::new().append(true).open(&p).unwrap());
    }
    let busy = fd_count(server_pid);
    assert!(
        busy > baseline_mounted + 20,
        "server holds {busy} descriptors"
    );
    t.mount.child.kill().unwrap();
    t.mount.child.wait().unwrap();
    drop(open);
    // The dead mount is cleared by tether unmount...
    let out = unmount(&t.mnt, false);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!common::is_mounted(&t.mnt));
    // ...and the server has dropped the session: everything but its listener and root is
    // closed again.
    wait_until("the server closes the dead client's descriptors", || {
        fd_count(server_pid) < baseline_mounted - 2
    });
    // The killed client could not remove its status socket; the next mount to start does
    // (once it is 5 s old: a starting mount's socket refuses connections for a moment).
    let stale = tether_client::status::socket_path(&t.mnt);
    assert!(stale.exists(), "{} is gone already", stale.display());
    let path = std::ffi::CString::new(stale.as_os_str().as_encoded_bytes()).unwrap();
    let a_minute_ago = libc::timespec {
        tv_sec: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64
            - 60,
        tv_nsec: 0,
    };
    // SAFETY: a valid path and two valid timespecs (a socket cannot be opened to set them).
    let r =
        unsafe { libc::utimensat(libc::AT_FDCWD, path.as_ptr(), [a_minute_ago; 2].as_ptr(), 0) };
    assert_eq!(r, 0, "utimensat: {}", std::io::Error::last_os_error());
    let _next = TestMount::start();
    assert!(!stale.exists(), "{} was left behind", stale.display());
}
