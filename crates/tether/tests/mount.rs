//! Real server, real FUSE mount, real files: the behaviours the POSIX comparison suite cannot
//! express (changes on the host side, transports, the command line, descriptor bounds).

mod common;

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::process::Command;
use std::time::Duration;

use common::{Mount, Server, TestMount, TETHER};

/// Waits until `f` holds (host-side changes show through the mount after the attribute
/// timeout until pushed invalidation lands).
fn eventually(what: &str, f: impl FnMut() -> bool) {
    common::wait_until(what, Duration::from_secs(5), f)
}

#[test]
fn host_files_show_through_and_guest_writes_land_on_host() {
    require_mount!();
    let t = TestMount::start();
    fs::write(t.export.join("host.txt"), b"from host").unwrap();
    assert_eq!(fs::read(t.mnt.join("host.txt")).unwrap(), b"from host");
    fs::write(t.mnt.join("guest.txt"), b"from guest").unwrap();
    assert_eq!(fs::read(t.export.join("guest.txt")).unwrap(), b"from guest");
    // st_ino in the guest is the host inode number.
    assert_eq!(
        fs::metadata(t.mnt.join("guest.txt")).unwrap().ino(),
        fs::metadata(t.export.join("guest.txt")).unwrap().ino()
    );
    // A host-side rewrite is seen once the short attribute timeout has passed.
    fs::write(t.export.join("host.txt"), b"changed on host!").unwrap();
    eventually("host rewrite visible", || {
        fs::read(t.mnt.join("host.txt")).ok().as_deref() == Some(&b"changed on host!"[..])
    });
}

/// Python asks `isatty()` (ioctl TCGETS) of every file it opens. The client answers ENOTTY
/// itself; fuser's default answer wrote a warning to the mount's log at every call.
#[test]
fn isatty_of_a_file_is_answered_quietly() {
    require_mount!();
    let dir = tempfile::tempdir().unwrap();
    let (export, mnt) = (dir.path().join("e"), dir.path().join("m"));
    fs::create_dir(&export).unwrap();
    fs::create_dir(&mnt).unwrap();
    fs::write(export.join("f"), b"not a terminal").unwrap();
    let address = format!("unix:{}", dir.path().join("s.sock").display());
    let _server = Server::start(&export, &address, &[]);
    let log_path = dir.path().join("mount.log");
    let log = fs::File::create(&log_path).unwrap();
    let mut mount = Mount::start_logging_to(&address, &mnt, &[], log.into());
    for _ in 0..3 {
        let f = fs::File::open(mnt.join("f")).unwrap();
        // SAFETY: a descriptor we own.
        let tty = unsafe { libc::isatty(std::os::fd::AsRawFd::as_raw_fd(&f)) };
        let errno = std::io::Error::last_os_error().raw_os_error();
        assert_eq!((tty, errno), (0, Some(libc::ENOTTY)));
    }
    assert!(mount.stop().success());
    let log = fs::read_to_string(&log_path).unwrap();
    assert!(
        !log.contains("ioctl"),
        "the mount logged the ioctls:\n{log}"
    );
}

/// `tether status MNT | head -1`: the reader leaves early, and that is no error (the
/// standard library's print! panicked on the broken pipe).
#[test]
fn status_into_a_pipe_closed_early_is_not_an_error() {
    require_mount!();
    let t = TestMount::start();
    let mut child = Command::new(TETHER)
        .arg("status")
        .arg(&t.mnt)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take()); // closed before anything is written
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn open_file_survives_unlink_and_rename_on_the_host() {
    require_mount!();
    let t = TestMount::start();
    fs::write(t.export.join("u"), b"0123456789").unwrap();
    fs::write(t.export.join("r"), b"abcdef").unwrap();
    fs::create_dir(t.export.join("sub")).unwrap();
    let mut fu = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(t.mnt.join("u"))
        .unwrap();
    let mut fr = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(t.mnt.join("r"))
        .unwrap();

    fs::remove_file(t.export.join("u")).unwrap();
    fs::rename(t.export.join("r"), t.export.join("sub/r2")).unwrap();

    let mut s = String::new();
    fu.read_to_string(&mut s).unwrap();
    assert_eq!(s, "0123456789");
    fu.write_all(b"more").unwrap();
    fu.seek(SeekFrom::Start(0)).unwrap();
    s.clear();
    fu.read_to_string(&mut s).unwrap();
    assert_eq!(s, "0123456789more");
    assert_eq!(fu.metadata().unwrap().len(), 14);

    fr.seek(SeekFrom::End(0)).unwrap();
    fr.write_all(b"gh").unwrap();
    fr.sync_all().unwrap();
    assert_eq!(fs::read(t.export.join("sub/r2")).unwrap(), b"abcdefgh");
    assert_eq!(fr.metadata().unwrap().len(), 8);
    eventually("renamed file visible under its new name", || {
        fs::read(t.mnt.join("sub/r2")).ok().as_deref() == Some(&b"abcdefgh"[..])
    });
}

#[test]
fn tcp_loopback_mount_works() {
    require_mount!();
    let (dir, export, mnt) = common::export_and_mount_point();
    fs::write(export.join("f"), b"over tcp").unwrap();
    // Find a free port, then serve on it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("tcp:127.0.0.1:{port}");
    // TCP peers must know the server's secret (never the real ~/.config one in tests).
    let secret = dir.path().join("secret");
    fs::write(&secret, "0123456789abcdef0123456789abcdef\n").unwrap();
    fs::set_permissions(&secret, fs::Permissions::from_mode(0o600)).unwrap();
    let secret_arg = ["--secret-file", secret.to_str().unwrap()];
    let _server = Server::start(&export, &addr, &secret_arg);
    let mut m = Mount::start(&addr, &mnt, &secret_arg);
    assert_eq!(fs::read(mnt.join("f")).unwrap(), b"over tcp");
    fs::write(mnt.join("g"), b"back").unwrap();
    assert_eq!(fs::read(export.join("g")).unwrap(), b"back");
    assert!(m.stop().success());
    assert!(!common::is_mounted(&mnt));
}

#[test]
fn ctrl_c_unmounts_cleanly() {
    require_mount!();
    let mut t = TestMount::start();
    fs::write(t.mnt.join("x"), b"x").unwrap();
    let status = t.mount.stop();
    assert!(status.success(), "mount exited with {status}");
    assert!(!common::is_mounted(&t.mnt));
    assert_eq!(fs::read(t.export.join("x")).unwrap(), b"x");
}

#[test]
fn unmount_command_clears_a_mount_whose_client_was_killed() {
    require_mount!();
    let mut t = TestMount::start();
    t.mount.child.kill().unwrap();
    t.mount.child.wait().unwrap();
    assert!(
        common::is_mounted(&t.mnt),
        "a killed client leaves its mount behind"
    );
    common::tether_ok(&[std::path::Path::new("unmount"), &t.mnt]);
    assert!(!common::is_mounted(&t.mnt));
}

fn run_tether(args: &[&str]) -> (bool, String) {
    let out = Command::new(TETHER).args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_command_lines_get_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();

    // A secret others can read is no secret: refused, on both sides.
    let loose = dir.path().join("loose-secret");
    fs::write(&loose, "0123456789abcdef0123456789abcdef").unwrap();
    fs::set_permissions(&loose, fs::Permissions::from_mode(0o644)).unwrap();
    let loose = loose.to_str().unwrap();
    let (ok, err) = run_tether(&[
        "serve",
        d,
        "--listen",
        "tcp:127.0.0.1:0",
        "--secret-file",
        loose,
    ]);
    assert!(!ok);
    assert!(
        err.contains("readable by others") && err.contains("chmod 600"),
        "{err}"
    );
    let (ok, err) = run_tether(&["check", "tcp:127.0.0.1:1", "--secret-file", loose]);
    assert!(!ok);
    assert!(err.contains("readable by others"), "{err}");
    let (ok, err) = run_tether(&["serve", d, "--listen", "tcp:127.0.0.1:0", "--map-ids", "x"]);
    assert!(!ok);
    assert!(err.contains("uid:GUEST:HOST"), "{err}");

    let (ok, err) = run_tether(&["serve", d, "--listen", "/no/scheme.sock"]);
    assert!(!ok);
    assert!(err.contains("unix:") && err.contains("tcp:"), "{err}");

    let (ok, err) = run_tether(&[
        "serve",
        &format!("{d}/missing"),
        "--listen",
        &format!("unix:{d}/s"),
    ]);
    assert!(!ok);
    assert!(
        err.contains("cannot export") && err.contains("missing"),
        "{err}"
    );

    let (ok, err) = run_tether(&["mount", &format!("unix:{d}/nobody.sock"), d]);
    assert!(!ok);
    assert!(err.contains("cannot connect"), "{err}");

    let (ok, err) = run_tether(&["mount", &format!("unix:{d}/s"), &format!("{d}/nodir")]);
    assert!(!ok);
    assert!(err.contains("nodir does not exist"), "{err}");

    fs::write(format!("{d}/a-file"), b"x").unwrap();
    let (ok, err) = run_tether(&["mount", &format!("unix:{d}/s"), &format!("{d}/a-file")]);
    assert!(!ok);
    assert!(err.contains("a-file is not a directory"), "{err}");
}

#[test]
fn a_client_that_is_not_tether_is_refused_and_the_server_keeps_serving() {
    require_mount!();
    let t = TestMount::start();
    let sock = t.dir.path().join("tether.sock");
    let mut s = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    s.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = Vec::new();
    // The server sends its magic, then closes on the garbage.
    let _ = s.read_to_end(&mut buf);
    assert!(
        buf.len() <= 8,
        "server answered garbage with {} bytes",
        buf.len()
    );
    fs::write(t.mnt.join("still"), b"serving").unwrap();
    assert_eq!(fs::read(t.export.join("still")).unwrap(), b"serving");
}

/// A listener that accepts and then never completes a greeting (not a tether server, or a
/// stuck one): here it trickles a byte of noise every 200 ms, which a per-read timeout would
/// never catch. The client gives up after its handshake limit, in all, with a message.
#[test]
fn a_server_that_never_answers_fails_the_handshake_instead_of_hanging() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("silent.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let holder = std::thread::spawn(move || {
        // Until the client hangs up (or a minute has passed, so the test cannot hang).
        let (mut c, _) = listener.accept().unwrap();
        for _ in 0..300 {
            if c.write_all(b"x").is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    });
    let started = std::time::Instant::now();
    let out = Command::new(TETHER)
        .arg("check")
        .arg(format!("unix:{}", sock.display()))
        .output()
        .unwrap();
    let took = started.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("no answer to the handshake"), "{err}");
    assert!(took < Duration::from_secs(30), "took {took:?}");
    holder.join().unwrap();
}

fn count_fds(pid: u32) -> usize {
    fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

#[test]
fn descriptors_stay_bounded_while_walking_a_large_tree() {
    require_mount!();
    let t = TestMount::start_with(&["--max-node-fds", "64"], &[]);
    for d in 0..20 {
        let dir = t.export.join(format!("d{d}"));
        fs::create_dir(&dir).unwrap();
        for f in 0..100 {
            fs::write(dir.join(format!("f{f}")), format!("{d}/{f}")).unwrap();
        }
    }
    let mut max_fds = 0;
    // Walk twice: the second walk revisits nodes whose descriptors were evicted.
    for _ in 0..2 {
        for d in 0..20 {
            for f in 0..100 {
                let p = t.mnt.join(format!("d{d}/f{f}"));
                assert_eq!(fs::read_to_string(&p).unwrap(), format!("{d}/{f}"));
            }
            max_fds = max_fds.max(count_fds(t.server.child.id()));
        }
    }
    assert!(
        max_fds < 64 + 32,
        "server held {max_fds} descriptors with a budget of 64"
    );
    // Renames made through the mount keep evicted nodes findable.
    fs::rename(t.mnt.join("d0"), t.mnt.join("renamed")).unwrap();
    assert_eq!(fs::read_to_string(t.mnt.join("renamed/f5")).unwrap(), "0/5");
}

#[test]
fn creating_files_does_not_leak_server_handles() {
    require_mount!();
    // git's lock-file pattern: probe a missing name (a cached negative entry), then create
    // exclusively and rename over the target. The kernel sends no RELEASE for such a create
    // in no-open mode; a handle kept for it would stay open until the session ran out.
    let t = TestMount::start();
    let before = count_open_files(t.server.child.id(), &t.export);
    for i in 0..200 {
        let dir = t.mnt.join(format!("d{i}"));
        fs::create_dir(&dir).unwrap();
        for _ in 0..3 {
            assert!(fs::File::open(dir.join("config")).is_err() || dir.join("config").exists());
            let mut f = fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o666)
                .open(dir.join("config.lock"))
                .unwrap();
            f.write_all(b"[core]").unwrap();
            drop(f);
            fs::rename(dir.join("config.lock"), dir.join("config")).unwrap();
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    let after = count_open_files(t.server.child.id(), &t.export);
    assert!(
        after < before + 20,
        "server handles grew from {before} to {after}"
    );
    assert_eq!(fs::read(t.export.join("d199/config")).unwrap(), b"[core]");
}

/// Descriptors the server holds on files under `dir` opened for I/O (handles), not the
/// O_PATH descriptors its nodes hold.
fn count_open_files(pid: u32, dir: &std::path::Path) -> usize {
    let Ok(entries) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return 0;
    };
    entries
        .filter_map(|e| e.ok())
        .filter(|e| {
            fs::read_link(e.path())
                // Not spare files made ahead (`--writes=create-behind`): "DIR/#INO (deleted)".
                .map(|t| t.starts_with(dir) && !t.to_string_lossy().contains("/#"))
                .unwrap_or(false)
        })
        .filter(|e| {
            let fdinfo = format!("/proc/{pid}/fdinfo/{}", e.file_name().to_string_lossy());
            let flags = fs::read_to_string(fdinfo)
                .unwrap_or_default()
                .lines()
                .find_map(|l| l.strip_prefix("flags:").map(|f| f.trim().to_string()))
                .and_then(|f| u32::from_str_radix(&f, 8).ok())
                .unwrap_or(0);
            flags & libc::O_PATH as u32 == 0
        })
        .count()
}

/// Writes by node go through a descriptor the server keeps open for a moment (writers.rs):
/// it must close soon after the guest's last write, or the host could not run a program
/// the guest just built (ETXTBSY).
#[test]
fn the_host_can_run_a_file_the_guest_just_wrote() {
    require_mount!();
    let t = TestMount::start();
    let script = t.mnt.join("built.sh");
    let mut f = fs::File::create(&script).unwrap();
    f.write_all(b"#!/bin/sh\n").unwrap();
    for _ in 0..100 {
        f.write_all(b"# padding written in many small writes\n")
            .unwrap();
    }
    f.write_all(b"exit 7\n").unwrap();
    drop(f);
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
    let host_copy = t.export.join("built.sh");
    let ran = common::poll_until(Duration::from_secs(5), || {
        Command::new(&host_copy)
            .status()
            .is_ok_and(|s| s.code() == Some(7))
    });
    assert!(
        ran,
        "the host could not run a file the guest wrote (ETXTBSY?)"
    );
}
