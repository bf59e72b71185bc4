//! `tether mount --io-uring`: kernel requests come through FUSE over io_uring, one queue
//! per CPU (vendor/fuser/src/uring.rs). The whole suite also runs in this mode with
//! `TETHER_TEST_MOUNT_ARGS=--io-uring`; these tests check what is particular to it.

mod common;

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{
    keep_cpu0_busy, make_fifo, on_cpu0, status, wait_until, waits_for_a_fifo, waits_in_fuse,
    Killed, TestMount,
};

const PARAM: &str = "/sys/module/fuse/parameters/enable_uring";

/// Skips the calling test when mounts or FUSE over io_uring are unavailable.
macro_rules! require_uring {
    () => {
        if let Some(why) = common::mount_unavailable() {
            eprintln!("SKIPPED: {why}");
            return;
        }
        if !Path::new(PARAM).exists() {
            common::skip(&format!(
                "this kernel has no FUSE over io_uring (no {PARAM})"
            ));
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

/// The largest address space process `pid` has had, in bytes.
fn peak_address_space(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmPeak:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no VmPeak in:\n{status}"));
    kib * 1024
}

/// Writes, reads back and lists a few files through `mnt`.
fn use_a_little(mnt: &Path) {
    for i in 0..20 {
        let f = mnt.join(format!("f{i}"));
        std::fs::write(&f, format!("file {i}\n")).unwrap();
        assert_eq!(std::fs::read_to_string(&f).unwrap(), format!("file {i}\n"));
    }
    assert_eq!(std::fs::read_dir(mnt).unwrap().count(), 20);
}

/// The rings' payload buffers take 256 MiB of address space a CPU. Where that is refused
/// (strict overcommit; here a `RLIMIT_AS` just above what a `/dev/fuse` mount uses), the
/// mount goes on through `/dev/fuse` and says so; it used to abort ("memory allocation of
/// 1048576 bytes failed") and leave a dead mount behind.
#[test]
fn a_mount_refused_memory_for_its_rings_serves_through_dev_fuse() {
    require_uring!();
    // It measures a /dev/fuse mount.
    if common::skipped_with("--io-uring") {
        return;
    }
    // One malloc arena, so that the address space depends on threads and buffers only.
    let one_arena = |cmd: &mut Command| {
        cmd.env("MALLOC_ARENA_MAX", "1");
    };

    // What a /dev/fuse mount doing the same work needs.
    let mut t = TestMount::start_adjusted(&[], &[], one_arena);
    use_a_little(&t.mnt);
    let needed = peak_address_space(t.mount.child.id());
    assert!(t.mount.stop().success());
    for f in std::fs::read_dir(&t.export).unwrap() {
        std::fs::remove_file(f.unwrap().path()).unwrap();
    }

    // 160 MiB more: room for 80 more thread stacks, but not for one CPU's ring buffers.
    let limit = needed + (160 << 20);
    let log_path = t.dir.path().join("mount.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let address = t.server.address.clone();
    let mut limited =
        common::Mount::start_adjusted(&address, &t.mnt, &["--io-uring"], log.into(), |cmd| {
            use std::os::unix::process::CommandExt;
            one_arena(cmd);
            // SAFETY: only setrlimit, async-signal-safe, between fork and exec.
            unsafe {
                cmd.pre_exec(move || {
                    let lim = libc::rlimit {
                        rlim_cur: limit,
                        rlim_max: limit,
                    };
                    if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        });
    use_a_little(&t.mnt);
    let report = status(&t.mnt);
    assert!(
        report.lines().any(|l| l == "io_uring: off (/dev/fuse)"),
        "{report}"
    );
    let stopped = limited.stop();
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(stopped.success(), "the mount ended with {stopped}:\n{log}");
    assert!(
        log.contains("io_uring not used: cannot map"),
        "the log does not say why io_uring is off:\n{log}"
    );
}

/// Starves the thread serving CPU 0's ring queue in the mount process: it is scheduled
/// only when CPU 0 has nothing else to run, and a process keeps CPU 0 busy until this is
/// dropped.
fn starve_queue_thread_of_cpu0(mount: &common::Mount) -> Killed {
    let pid = mount.child.id();
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
    let queue_thread = tasks
        .filter_map(|t| t.ok())
        .find(|t| {
            let read = |f: &str| std::fs::read_to_string(t.path().join(f)).unwrap_or_default();
            read("comm").trim() == "fuser-uring"
                && read("status")
                    .lines()
                    .any(|l| l.split_whitespace().eq(["Cpus_allowed_list:", "0"]))
        })
        .and_then(|t| t.file_name().to_str()?.parse::<i32>().ok())
        .expect("the mount has a ring thread pinned to CPU 0");
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: a plain system call on a thread id with a valid parameter block.
    let r = unsafe { libc::sched_setscheduler(queue_thread, libc::SCHED_IDLE, &param) };
    assert_eq!(r, 0, "SCHED_IDLE: {}", std::io::Error::last_os_error());
    keep_cpu0_busy()
}

#[test]
fn lock_waiters_that_come_all_at_once_leave_their_cpu_served() {
    require_uring!();
    require_tools!(&[&["taskset", "-V"], &["flock", "-V"]]);
    let t = TestMount::start_with(&[], &["--io-uring"]);
    std::fs::write(t.export.join("lock"), "").unwrap();
    std::fs::write(t.export.join("other"), "still served\n").unwrap();

    // The host holds the lock until it is killed.
    // The holder is the process that holds the descriptor (killing `flock CMD` would
    // leave CMD holding it).
    let host = Killed(vec![Command::new("bash")
        .arg("-c")
        .arg(format!(
            "exec 9>>'{}'; flock 9; exec sleep 600",
            t.export.join("lock").display()
        ))
        .spawn()
        .unwrap()]);
    std::thread::sleep(Duration::from_millis(200));

    // 40 guest processes on CPU 0 open the file, then all ask for the lock at once, while
    // the thread serving CPU 0's ring queue is starved: each request takes a ring entry
    // and, blocked, holds it. A request that finds every entry busy waits in the kernel
    // for the next commit, which blocked waiters never make.
    const WAITERS: usize = 40;
    let go = t.dir.path().join("go");
    make_fifo(&go);
    let mut waiters = Killed(
        (0..WAITERS)
            .map(|_| {
                on_cpu0("bash")
                    .arg("-c")
                    .arg(r#"exec 9<"$1"; : < "$2"; exec flock 9"#)
                    .arg("waiter")
                    .arg(t.mnt.join("lock"))
                    .arg(&go)
                    .spawn()
                    .unwrap()
            })
            .collect(),
    );
    wait_until(
        "every waiter opened the file and waits to go",
        Duration::from_secs(10),
        || waiters.0.iter().all(|w| waits_for_a_fifo(w.id())),
    );
    let starved = starve_queue_thread_of_cpu0(&t.mount);
    // Opening the FIFO for writing, then closing it, lets every waiter on.
    drop(std::fs::OpenOptions::new().write(true).open(&go).unwrap());
    wait_until(
        "every waiter waits for the lock in a FUSE request",
        Duration::from_secs(10),
        || waiters.0.iter().all(|w| waits_in_fuse(w.id())),
    );
    for w in waiters.0.iter_mut() {
        assert!(
            matches!(w.try_wait(), Ok(None)),
            "a waiter got a lock the host holds"
        );
    }

    // Another request from CPU 0 is still served.
    let mut cat = Killed(vec![on_cpu0("cat")
        .arg(t.mnt.join("other"))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()]);
    wait_until(
        "a read from CPU 0 is served while the lock waiters block",
        Duration::from_secs(5),
        || matches!(cat.0[0].try_wait(), Ok(Some(_))),
    );
    let mut out = String::new();
    let mut stdout = cat.0[0].stdout.take().unwrap();
    stdout.read_to_string(&mut out).unwrap();
    assert_eq!(out, "still served\n");
    drop(starved);

    // The host lets go: every waiter gets the lock in turn and ends.
    drop(host);
    let deadline = Instant::now() + Duration::from_secs(20);
    for w in waiters.0.iter_mut() {
        loop {
            if let Some(status) = w.try_wait().unwrap() {
                assert!(status.success(), "a waiter failed: {status}");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the waiters did not all get the lock after the host let go"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let _ = std::io::stdout().flush();
}
