//! Reconnect: the mount stays up while the server restarts or is away, open files and
//! directories go on working, requests wait (at most `mount --timeout`, then EIO), and what
//! the host changed meanwhile is seen afterwards. Real server processes, real mounts.

mod common;

use std::ffi::CString;
use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{status, Server, TestMount};

/// Stops the server with `signal`, leaves it away for `away`, and starts it again with
/// the same export, address and `serve_args`.
fn restart_server(tm: &mut TestMount, signal: i32, away: Duration, serve_args: &[&str]) {
    tm.server.stop_with(signal);
    std::thread::sleep(away);
    let address = tm.server.address.clone();
    tm.server = Server::start(&tm.export, &address, serve_args);
}

/// Waits until `tether status` reports the connection up after `n` reconnects.
fn wait_reconnected(mnt: &Path, n: u64) {
    wait_state(mnt, &format!("connection: up ({n} reconnects"));
}

/// Waits until `tether status` contains `want`.
fn wait_state(mnt: &Path, want: &str) {
    let mut s = String::new();
    let seen = common::poll_until(Duration::from_secs(20), || {
        s = status(mnt);
        s.contains(want)
    });
    assert!(seen, "never {want:?}: {s}");
}

/// Asks the server about a name never looked up (the kernel cannot answer it) and checks
/// that the call fails with EIO after about `timeout` seconds: not sooner, and not much later.
fn assert_eio_after_the_timeout(mnt: &Path, timeout: f64) {
    let started = Instant::now();
    let err = fs::metadata(mnt.join("never-seen")).unwrap_err();
    let waited = started.elapsed();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    let timeout = Duration::from_secs_f64(timeout);
    assert!(
        waited >= timeout.mul_f64(0.9) && waited < timeout * 4,
        "failed after {waited:?}, the timeout is {timeout:?}"
    );
}

#[test]
fn open_files_survive_a_server_restart() {
    require_mount!();
    let mut tm = TestMount::start();
    fs::create_dir(tm.export.join("d")).unwrap();
    fs::write(tm.export.join("d/f"), b"before restart\n").unwrap();
    let mut f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(tm.mnt.join("d/f"))
        .unwrap();
    let mut s = String::new();
    f.read_to_string(&mut s).unwrap();
    assert_eq!(s, "before restart\n");

    restart_server(&mut tm, libc::SIGTERM, Duration::ZERO, &[]);

    // The same open file: written and read through the new session.
    f.write_all_at(b"after!", 0).unwrap();
    f.sync_all().unwrap();
    assert_eq!(
        fs::read(tm.export.join("d/f")).unwrap(),
        b"after! restart\n",
        "a write through the file opened before the restart reaches the host"
    );
    f.seek(SeekFrom::Start(0)).unwrap();
    s.clear();
    f.read_to_string(&mut s).unwrap();
    assert_eq!(s, "after! restart\n");
    // New names and the old tree.
    fs::write(tm.mnt.join("d/g"), b"new").unwrap();
    assert_eq!(fs::read(tm.export.join("d/g")).unwrap(), b"new");
    let mut names: Vec<_> = fs::read_dir(tm.mnt.join("d"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["f", "g"]);
    wait_reconnected(&tm.mnt, 1);
}

#[test]
fn open_handles_are_opened_again_after_a_restart() {
    require_mount!();
    // Without pushes the kernel opens handles on the server (no "no-open" mode).
    let mut tm = TestMount::start_with(&[], &["--no-push"]);
    fs::create_dir(tm.export.join("d")).unwrap();
    for name in ["a", "b", "c"] {
        fs::write(tm.export.join("d").join(name), name).unwrap();
    }
    fs::write(tm.export.join("file"), b"0123456789").unwrap();
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(tm.mnt.join("file"))
        .unwrap();
    let cdir = CString::new(tm.mnt.join("d").as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid C string; the stream is closed below.
    let dir = unsafe { libc::opendir(cdir.as_ptr()) };
    assert!(!dir.is_null());

    restart_server(&mut tm, libc::SIGTERM, Duration::ZERO, &[]);

    f.write_all_at(b"ab", 4).unwrap();
    let mut buf = [0u8; 10];
    f.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"0123ab6789");
    assert_eq!(fs::read(tm.export.join("file")).unwrap(), b"0123ab6789");
    let mut names = Vec::new();
    loop {
        // SAFETY: dir is an open stream; the entry is read before the next call.
        let e = unsafe { libc::readdir(dir) };
        if e.is_null() {
            break;
        }
        // SAFETY: d_name is NUL-terminated.
        let name = unsafe { std::ffi::CStr::from_ptr((*e).d_name.as_ptr()) };
        names.push(name.to_string_lossy().into_owned());
    }
    // SAFETY: closing the stream opened above.
    unsafe { libc::closedir(dir) };
    names.sort();
    assert_eq!(names, [".", "..", "a", "b", "c"]);
    let report = status(&tm.mnt);
    assert!(report.contains("(1 reconnects"), "{report}");
}

#[test]
fn host_changes_made_while_the_server_was_away_are_seen() {
    require_mount!();
    let mut tm = TestMount::start();
    fs::write(tm.export.join("same-length"), b"old!").unwrap();
    fs::write(tm.export.join("doomed"), b"x").unwrap();
    fs::create_dir(tm.export.join("dir")).unwrap();
    // Cache content, a name, a missing name and a listing in the guest. The second open
    // is answered by the kernel alone, from its pages.
    for _ in 0..2 {
        assert_eq!(fs::read(tm.mnt.join("same-length")).unwrap(), b"old!");
    }
    assert!(tm.mnt.join("doomed").exists());
    assert!(!tm.mnt.join("dir/later").exists());
    assert_eq!(fs::read_dir(tm.mnt.join("dir")).unwrap().count(), 0);

    tm.server.stop_with(libc::SIGTERM);
    fs::write(tm.export.join("same-length"), b"new!").unwrap();
    fs::remove_file(tm.export.join("doomed")).unwrap();
    fs::write(tm.export.join("dir/later"), b"born while away").unwrap();
    wait_state(&tm.mnt, "connection: reconnecting");
    // Once the mount knows the server is away, its caches are gone: a read waits for the
    // server instead of answering from pages the host has since changed.
    let path = tm.mnt.join("same-length");
    let during = std::thread::spawn(move || fs::read(path).unwrap());
    std::thread::sleep(Duration::from_millis(300));
    let address = tm.server.address.clone();
    tm.server = Server::start(&tm.export, &address, &[]);
    assert_eq!(
        during.join().unwrap(),
        b"new!",
        "read while the server was away"
    );
    // Requests after the reconnect see the host as it is now.
    assert!(!tm.mnt.join("doomed").exists(), "a name deleted while away");
    assert_eq!(
        fs::read(tm.mnt.join("dir/later")).unwrap(),
        b"born while away",
        "a name created while away, looked up as missing before"
    );
    assert_eq!(fs::read_dir(tm.mnt.join("dir")).unwrap().count(), 1);
}

#[test]
fn calls_fail_with_eio_after_the_timeout_and_work_again_when_the_server_is_back() {
    require_mount!();
    let mut tm = TestMount::start_with(&[], &["--timeout", "1.5"]);
    fs::write(tm.export.join("f"), b"x").unwrap();
    tm.server.stop_with(libc::SIGKILL);
    assert_eio_after_the_timeout(&tm.mnt, 1.5);
    let report = status(&tm.mnt);
    assert!(report.contains("connection: reconnecting"), "{report}");
    let address = tm.server.address.clone();
    tm.server = Server::start(&tm.export, &address, &[]);
    assert_eq!(fs::read(tm.mnt.join("f")).unwrap(), b"x");
    assert!(!tm.mnt.join("never-seen").exists());
}

#[test]
fn a_server_that_stops_answering_gives_eio_after_the_timeout() {
    require_mount!();
    let tm = TestMount::start_with(&[], &["--timeout", "1.5"]);
    fs::write(tm.export.join("f"), b"x").unwrap();
    // Continued below, also if the test fails.
    let resume = common::Stopped::stop(tm.server.child.id() as i32);
    // The connection stays open, but nothing answers: no endless hang.
    assert_eio_after_the_timeout(&tm.mnt, 1.5);
    drop(resume);
    assert_eq!(fs::read(tm.mnt.join("f")).unwrap(), b"x");
    wait_reconnected(&tm.mnt, 1);
}

#[test]
fn reads_go_on_while_the_server_is_killed_and_restarted() {
    require_mount!();
    // Without pushes every open goes to the server: the reads really cross the restarts.
    let mut tm = TestMount::start_with(&[], &["--no-push", "--attr-timeout", "0"]);
    let files: Vec<(String, Vec<u8>)> = (0..20)
        .map(|i| {
            (
                format!("f{i}"),
                format!("content of file {i}\n").repeat(i + 1).into_bytes(),
            )
        })
        .collect();
    for (name, data) in &files {
        fs::write(tm.export.join(name), data).unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let readers: Vec<_> = (0..2)
        .map(|t| {
            let (stop, reads, files, mnt) =
                (stop.clone(), reads.clone(), files.clone(), tm.mnt.clone());
            std::thread::spawn(move || {
                let mut i = t;
                while !stop.load(Ordering::Relaxed) {
                    let (name, data) = &files[i % files.len()];
                    let got = fs::read(mnt.join(name))
                        .unwrap_or_else(|e| panic!("read {name} across a restart: {e}"));
                    assert_eq!(&got, data, "{name}");
                    reads.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
            })
        })
        .collect();
    for round in 1..=3 {
        std::thread::sleep(Duration::from_millis(300));
        restart_server(&mut tm, libc::SIGKILL, Duration::from_millis(200), &[]);
        wait_reconnected(&tm.mnt, round);
    }
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.join().expect("a reader failed");
    }
    assert!(
        reads.load(Ordering::Relaxed) > 100,
        "the readers hardly ran"
    );
}

#[test]
fn a_build_completes_across_server_restarts() {
    require_mount!();
    require_tools!(&[&["make", "--version"], &["cc", "--version"]]);
    let mut tm = TestMount::start();
    let src = tm.mnt.join("proj");
    fs::create_dir_all(src.join("src")).unwrap();
    let n = 80;
    let mut main = String::from("#include <stdio.h>\n");
    for i in 0..n {
        main.push_str(&format!("int f{i}(void);\n"));
        fs::write(
            src.join(format!("src/f{i}.c")),
            format!("int f{i}(void) {{ return {i}; }}\n"),
        )
        .unwrap();
    }
    main.push_str("int main(void) { long s = 0;\n");
    for i in 0..n {
        main.push_str(&format!("s += f{i}();\n"));
    }
    main.push_str("printf(\"%ld\\n\", s); return 0; }\n");
    fs::write(src.join("src/main.c"), main).unwrap();
    fs::write(
        src.join("Makefile"),
        "SRCS := $(wildcard src/*.c)\n\
         OBJS := $(SRCS:src/%.c=out/%.o)\n\
         prog: $(OBJS)\n\tcc -o $@ $^\n\
         out/%.o: src/%.c | out\n\tcc -c -o $@ $<\n\
         out:\n\tmkdir -p out\n",
    )
    .unwrap();
    let mut build = Command::new("make")
        .args(["-j2", "-s"])
        .current_dir(&src)
        .spawn()
        .unwrap();
    let mut restarts_during_build = 0;
    let outcome = loop {
        std::thread::sleep(Duration::from_millis(250));
        if let Some(status) = build.try_wait().unwrap() {
            break status;
        }
        restart_server(&mut tm, libc::SIGTERM, Duration::from_millis(100), &[]);
        restarts_during_build += 1;
    };
    assert!(outcome.success(), "the build failed across restarts");
    assert!(
        restarts_during_build >= 2,
        "the build ended before the server was restarted twice"
    );
    let out = Command::new(src.join("prog")).output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        ((n - 1) * n / 2).to_string()
    );
    // The build is complete: nothing left to do.
    let again = Command::new("make")
        .args(["-q"])
        .current_dir(&src)
        .status()
        .unwrap();
    assert!(again.success(), "make -q: the tree is not up to date");
    let report = status(&tm.mnt);
    assert!(report.contains(" 0 failed)"), "{report}");
}
