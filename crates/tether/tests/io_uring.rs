//! `tether mount --io-uring`: kernel requests come through FUSE over io_uring, one queue
//! per CPU (vendor/fuser/src/uring.rs). The whole suite also runs in this mode with
//! `TETHER_TEST_MOUNT_ARGS=--io-uring`; these tests check what is particular to it.

mod common;

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{poll_until, status, wait_until, TestMount};

const PARAM: &str = "/sys/module/fuse/parameters/enable_uring";

/// Skips the calling test when mounts or FUSE over io_uring are unavailable.
macro_rules! require_uring {
    () => {
        if let Some(why) = common::mount_unavailable() {
            eprintln!("SKIPPED: {why}");
            return;
        }
        if !Path::new(PARAM).exists() {
            eprintln!("SKIPPED: this kernel has no FUSE over io_uring (no {PARAM})");
            return;
        }
    };
}

/// The number of requests `tether status` says came through the rings; panics unless the
/// mount uses them.
fn uring_requests(mnt: &Path) -> u64 {
    let report = status(mnt);
    let line = report
        .lines()
        .find(|l| l.starts_with("io_uring:"))
        .unwrap_or_else(|| panic!("no io_uring line in:\n{report}"));
    let n = line
        .strip_prefix("io_uring: on: ")
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok());
    n.unwrap_or_else(|| panic!("the mount does not use io_uring: {line}"))
}

#[test]
fn files_made_read_and_changed_through_the_rings_are_the_hosts() {
    require_uring!();
    let mut t = TestMount::start_with(&[], &["--io-uring"]);
    let before = uring_requests(&t.mnt);

    // A write larger than one ring entry's payload (1 MiB) arrives as several WRITEs.
    let big: Vec<u8> = (0..3 * 1024 * 1024 + 123)
        .map(|i| (i * 7 % 251) as u8)
        .collect();
    std::fs::create_dir(t.mnt.join("d")).unwrap();
    std::fs::write(t.mnt.join("d/big"), &big).unwrap();
    for i in 0..200 {
        std::fs::write(t.mnt.join(format!("d/f{i}")), format!("file {i}\n")).unwrap();
    }
    std::fs::rename(t.mnt.join("d/f0"), t.mnt.join("d/renamed")).unwrap();
    std::fs::remove_file(t.mnt.join("d/f1")).unwrap();
    std::os::unix::fs::symlink("renamed", t.mnt.join("d/link")).unwrap();
    std::fs::set_permissions(t.mnt.join("d/f2"), std::fs::Permissions::from_mode(0o600)).unwrap();

    // What the host has.
    assert_eq!(std::fs::read(t.export.join("d/big")).unwrap(), big);
    assert_eq!(
        std::fs::read_to_string(t.export.join("d/renamed")).unwrap(),
        "file 0\n"
    );
    assert!(!t.export.join("d/f1").exists());
    assert_eq!(
        std::fs::read_link(t.export.join("d/link")).unwrap(),
        Path::new("renamed")
    );
    let mode = std::fs::metadata(t.export.join("d/f2"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);

    // What the guest reads back, and a listing.
    let mut read = Vec::new();
    std::fs::File::open(t.mnt.join("d/big"))
        .unwrap()
        .read_to_end(&mut read)
        .unwrap();
    assert!(read == big, "the big file read back differs");
    let mut names: Vec<String> = std::fs::read_dir(t.mnt.join("d"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names.len(), 201, "{names:?}");
    assert!(names.contains(&"link".to_string()) && !names.contains(&"f1".to_string()));

    // A host change still reaches the guest (pushed invalidations use /dev/fuse).
    std::fs::write(t.export.join("d/f3"), "changed on the host\n").unwrap();
    wait_until(
        "the host's change shows through the mount",
        Duration::from_secs(2),
        || std::fs::read_to_string(t.mnt.join("d/f3")).unwrap() == "changed on the host\n",
    );

    let after = uring_requests(&t.mnt);
    assert!(
        after >= before + 400,
        "only {} requests came through the rings",
        after - before
    );

    // The client ends when the mount does: no queue waits for an entry the kernel released.
    let started = Instant::now();
    let exit = t.mount.stop();
    assert!(
        exit.success() && started.elapsed() < Duration::from_secs(5),
        "the mount process ended with {exit} after {:?}",
        started.elapsed()
    );
}

/// A process pinned to CPU 0 (the kernel queues its requests on CPU 0's ring).
fn on_cpu0(program: &str) -> Command {
    let mut c = Command::new("taskset");
    c.args(["-c", "0", program]);
    c
}

fn kill_all(children: &mut [Child]) {
    for c in children.iter_mut() {
        let _ = c.kill();
        let _ = c.wait();
    }
}

#[test]
fn more_blocked_lock_waiters_than_a_queue_starts_with_leave_its_cpu_served() {
    require_uring!();
    if let Some(p) = common::first_missing(&[&["taskset", "-V"], &["flock", "-V"]]) {
        eprintln!("SKIPPED: {p} (util-linux) is not installed");
        return;
    }
    let t = TestMount::start_with(&[], &["--io-uring"]);
    std::fs::write(t.export.join("lock"), "").unwrap();
    std::fs::write(t.export.join("other"), "still served\n").unwrap();

    // The host holds the lock until it is killed.
    // The holder is the process that holds the descriptor (killing `flock CMD` would
    // leave CMD holding it).
    let mut host = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "exec 9>>'{}'; flock 9; exec sleep 600",
            t.export.join("lock").display()
        ))
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));

    // 40 guest processes on CPU 0 wait for it: each holds a ring entry of CPU 0's queue,
    // which starts with 8.
    const WAITERS: usize = 40;
    let mut waiters: Vec<Child> = (0..WAITERS)
        .map(|_| {
            on_cpu0("flock")
                .arg(t.mnt.join("lock"))
                .arg("true")
                .stdout(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    let waiting = poll_until(Duration::from_secs(10), || {
        status(&t.mnt)
            .lines()
            .find(|l| l.starts_with("requests sent:"))
            .and_then(|l| {
                l.split("SETLK ")
                    .nth(1)?
                    .split([',', ' '])
                    .next()?
                    .parse::<usize>()
                    .ok()
            })
            .is_some_and(|n| n >= WAITERS)
    });
    if !waiting {
        kill_all(&mut waiters);
        let _ = host.kill();
        panic!(
            "the waiters' lock requests did not all reach the server:\n{}",
            status(&t.mnt)
        );
    }
    for w in waiters.iter_mut() {
        assert!(
            matches!(w.try_wait(), Ok(None)),
            "a waiter got a lock the host holds"
        );
    }

    // Another request from CPU 0 is still served.
    let mut cat = on_cpu0("cat")
        .arg(t.mnt.join("other"))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let served = poll_until(Duration::from_secs(5), || {
        matches!(cat.try_wait(), Ok(Some(_)))
    });
    if !served {
        kill_all(&mut waiters);
        kill_all(std::slice::from_mut(&mut cat));
        let _ = host.kill();
        panic!("a read from CPU 0 waited behind the blocked lock waiters");
    }
    let mut out = String::new();
    cat.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    assert_eq!(out, "still served\n");

    // The host lets go: every waiter gets the lock in turn and ends.
    host.kill().unwrap();
    host.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    for w in waiters.iter_mut() {
        loop {
            if let Some(status) = w.try_wait().unwrap() {
                assert!(status.success(), "a waiter failed: {status}");
                break;
            }
            if Instant::now() > deadline {
                kill_all(&mut waiters);
                panic!("the waiters did not all get the lock after the host let go");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let _ = std::io::stdout().flush();
}
