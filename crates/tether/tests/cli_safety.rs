//! What a user may type by mistake: nothing loses a file, hangs, or goes unexplained.
//! A socket path that names a file, a mount inside its own export, signals while files are
//! open, unmounting what is not Tether, mounting over a mount, a peer that is no server.

mod common;

use std::fs;
use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{Mount, Server, TestMount, Tmpfs, TETHER};

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn tether(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(TETHER)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// Runs `cmd` to its end, or fails the test after `within` (killing it).
fn finishes(mut cmd: Command, within: Duration) -> Output {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(within) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            // SAFETY: signalling the child this test started.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            panic!("{cmd:?} did not finish within {within:?}");
        }
    }
}

fn wait_exit(child: &mut Child, within: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + within;
    loop {
        if let Ok(Some(s)) = child.try_wait() {
            return Some(s);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn serve_at(export: &Path, socket: &Path) -> Output {
    let mut cmd = Command::new(TETHER);
    cmd.arg("serve")
        .arg(export)
        .arg("--listen")
        .arg(format!("unix:{}", socket.display()));
    finishes(cmd, Duration::from_secs(10))
}

#[test]
fn serve_never_replaces_what_is_not_a_stale_socket() {
    let dir = tempfile::tempdir().unwrap();
    let export = dir.path().join("export");
    fs::create_dir(&export).unwrap();
    let precious = dir.path().join("precious.txt");
    fs::write(&precious, b"a week of work").unwrap();
    let out = serve_at(&export, &precious);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains(&precious.display().to_string()) && err.contains("a regular file"),
        "{err}"
    );
    assert_eq!(fs::read(&precious).unwrap(), b"a week of work");

    let sub = dir.path().join("a-directory");
    fs::create_dir(&sub).unwrap();
    fs::write(sub.join("inside"), b"x").unwrap();
    let err = stderr(&serve_at(&export, &sub));
    assert!(err.contains("a directory"), "{err}");
    assert!(sub.join("inside").exists());

    let link = dir.path().join("a-link");
    std::os::unix::fs::symlink(&precious, &link).unwrap();
    let err = stderr(&serve_at(&export, &link));
    assert!(err.contains("a symbolic link"), "{err}");
    assert!(fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());

    let fifo = dir.path().join("a-fifo");
    common::make_fifo(&fifo);
    let err = stderr(&serve_at(&export, &fifo));
    assert!(err.contains("a FIFO"), "{err}");
    assert!(fifo.exists());

    // A stale socket (its server died without removing it) is replaced.
    let stale = dir.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    assert!(stale.exists());
    let server = Server::start(&export, &format!("unix:{}", stale.display()), &[]);
    drop(server);
    // And removed when the server stops.
    assert!(!stale.exists());
}

/// Serving /a and mounting at /a/sub/mnt on the same machine: the server refuses to enter
/// its own mount (ELOOP there) instead of sending requests into it, which hung `ls`,
/// SIGTERM and `unmount --lazy` until kill -9.
#[test]
fn a_mount_inside_its_own_export_is_refused_not_hung() {
    require_mount!();
    let dir = tempfile::tempdir().unwrap();
    let export = dir.path().join("export");
    let mnt = export.join("sub/mnt");
    fs::create_dir_all(&mnt).unwrap();
    fs::write(export.join("f"), b"hello").unwrap();
    let address = format!("unix:{}", dir.path().join("s.sock").display());
    let log = dir.path().join("serve.log");
    let mut server = Server::start_logging_to(&export, &address, &[], &log);
    let mut mount = Mount::start(&address, &mnt, &[]);
    let within = Duration::from_secs(20);
    let hung = |what: &str, mount: &mut Mount| {
        // Free whatever waits on the mount before failing.
        let _ = mount.child.kill();
        panic!("{what} hung");
    };
    let mut ls = Command::new("ls");
    ls.arg("-la").arg(&mnt).arg(mnt.join("sub"));
    let out = finishes(ls, within);
    if !out.status.success() {
        hung("ls", &mut mount);
    }
    let listing = String::from_utf8_lossy(&out.stdout);
    assert!(listing.contains(" f\n"), "{listing}");
    let mut stat = Command::new("stat");
    stat.arg(mnt.join("sub/mnt"));
    let out = finishes(stat, within);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("Too many levels of symbolic links"),
        "{}",
        stderr(&out)
    );
    assert_eq!(fs::read(mnt.join("f")).unwrap(), b"hello");
    // SIGTERM ends the mount at once.
    // SAFETY: signalling our own child.
    unsafe { libc::kill(mount.child.id() as i32, libc::SIGTERM) };
    let status = wait_exit(&mut mount.child, within).expect("the mount stops on SIGTERM");
    assert!(status.success(), "{status}");
    assert!(!common::is_mounted(&mnt));
    server.stop_with(libc::SIGTERM);
    let log = fs::read_to_string(&log).unwrap();
    assert!(
        log.contains("is a Tether mount inside the export"),
        "the server says why: {log}"
    );
}

fn mount_logging(t_address: &str, mnt: &Path, log: &Path) -> Mount {
    Mount::start_logging_to(
        t_address,
        mnt,
        &[],
        Stdio::from(fs::File::create(log).unwrap()),
    )
}

/// The usual fixture, with the mount's stderr in a file, so that what it says can be read.
struct LoggedMount {
    t: TestMount,
    log: std::path::PathBuf,
}

fn logged_mount() -> LoggedMount {
    let dir = tempfile::tempdir().unwrap();
    let (export, mnt) = (dir.path().join("export"), dir.path().join("mnt"));
    fs::create_dir(&export).unwrap();
    fs::create_dir(&mnt).unwrap();
    let address = format!("unix:{}", dir.path().join("s.sock").display());
    let server = Server::start(&export, &address, &[]);
    let log = dir.path().join("mount.log");
    let mount = mount_logging(&address, &mnt, &log);
    LoggedMount {
        t: TestMount {
            mount,
            server,
            export,
            mnt,
            dir,
        },
        log,
    }
}

/// Waits until the log at `log` contains `text`.
fn said(log: &Path, text: &str) {
    common::wait_until(
        &format!("the log says {text:?}"),
        Duration::from_secs(10),
        || fs::read_to_string(log).unwrap().contains(text),
    );
}

/// A logged mount holding `held` (with `content`) open, sent `signal` once: it has said
/// that files are open.
fn signalled_with_a_file_open(content: &[u8], signal: i32) -> (LoggedMount, fs::File) {
    let m = logged_mount();
    fs::write(m.t.export.join("held"), content).unwrap();
    let held = fs::File::open(m.t.mnt.join("held")).unwrap();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(m.t.mount.child.id() as i32, signal) };
    said(&m.log, "files are open under");
    (m, held)
}

#[test]
fn a_signal_with_files_open_says_so_once_and_unmounts_when_they_close() {
    require_mount!();
    let (mut m, held) = signalled_with_a_file_open(b"x", libc::SIGINT);
    let t = &mut m.t;
    std::thread::sleep(Duration::from_millis(500));
    assert!(common::is_mounted(&t.mnt), "unmounted with a file open");
    drop(held);
    let status = wait_exit(&mut t.mount.child, Duration::from_secs(10))
        .expect("the mount stops once the file is closed");
    assert!(status.success(), "{status}");
    assert!(!common::is_mounted(&t.mnt));
    let log = fs::read_to_string(&m.log).unwrap();
    assert_eq!(log.matches("files are open under").count(), 1, "{log}");
    assert!(
        !log.contains("Unmounting") && !log.contains("Device or resource busy"),
        "{log}"
    );
}

#[test]
fn a_second_signal_detaches_lazily_and_open_files_keep_working() {
    require_mount!();
    let (mut m, mut held) = signalled_with_a_file_open(b"still readable", libc::SIGTERM);
    let t = &mut m.t;
    // SAFETY: signalling our own child.
    unsafe { libc::kill(t.mount.child.id() as i32, libc::SIGTERM) };
    common::wait_until("the mount is detached", Duration::from_secs(10), || {
        !common::is_mounted(&t.mnt)
    });
    let mut s = String::new();
    held.read_to_string(&mut s).unwrap();
    assert_eq!(s, "still readable");
    assert!(wait_exit(&mut t.mount.child, Duration::from_millis(300)).is_none());
    drop(held);
    let status = wait_exit(&mut t.mount.child, Duration::from_secs(10))
        .expect("the mount process ends once the file is closed");
    assert!(status.success(), "{status}");
}

#[test]
fn unmount_refuses_what_is_not_a_tether_mount() {
    require_mount!();
    let dir = tempfile::tempdir().unwrap();
    let at = dir.path().join("tmpfs");
    fs::create_dir(&at).unwrap();
    let tmpfs = Tmpfs::mount(&at, None);
    fs::write(at.join("keep"), b"x").unwrap();
    let out = tether(&["unmount".as_ref(), at.as_os_str()]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("not a Tether mount"),
        "{}",
        stderr(&out)
    );
    assert!(stderr(&out).contains("--force"), "{}", stderr(&out));
    assert!(common::is_mounted(&at));
    assert!(at.join("keep").exists());
    let out = tether(&["unmount".as_ref(), at.as_os_str(), "--force".as_ref()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!common::is_mounted(&at));
    drop(tmpfs);
    // A directory with nothing mounted on it: said in plain words.
    let out = tether(&["unmount".as_ref(), at.as_os_str()]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("is not mounted"), "{}", stderr(&out));
    assert!(!stderr(&out).contains("os error"), "{}", stderr(&out));
}

#[test]
fn mount_refuses_a_tether_mount_point_and_warns_on_a_non_empty_one() {
    require_mount!();
    let mut t = TestMount::start();
    let address = t.server.address.clone();
    // Onto the live mount: refused, naming the server mounted there.
    let mut cmd = Command::new(TETHER);
    cmd.arg("mount").arg(&address).arg(&t.mnt);
    let out = finishes(cmd, Duration::from_secs(20));
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("already a Tether mount of") && err.contains(&address),
        "{err}"
    );
    assert_eq!(
        fs::read_to_string("/proc/mounts")
            .unwrap()
            .lines()
            .filter(|l| l.split_whitespace().nth(1) == Some(&t.mnt.to_string_lossy()))
            .count(),
        1,
        "a second mount was stacked"
    );
    // Its client killed, the mount point is dead: the message says what to run.
    t.mount.child.kill().unwrap();
    t.mount.child.wait().unwrap();
    let mut cmd = Command::new(TETHER);
    cmd.arg("mount").arg(&address).arg(&t.mnt);
    let out = finishes(cmd, Duration::from_secs(20));
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains(&format!("tether unmount {}", t.mnt.display())),
        "{err}"
    );
    assert!(!err.contains("is not a directory"), "{err}");
    let out = tether(&["unmount".as_ref(), t.mnt.as_os_str()]);
    assert!(out.status.success(), "{}", stderr(&out));

    // A directory with files in it: mounted, with a note; --nonempty says nothing.
    fs::write(t.mnt.join("hidden"), b"x").unwrap();
    let log = t.dir.path().join("nonempty.log");
    let mut m = mount_logging(&address, &t.mnt, &log);
    assert!(
        fs::read_to_string(&log).unwrap().contains("is not empty"),
        "{}",
        fs::read_to_string(&log).unwrap()
    );
    m.stop();
    let quiet = t.dir.path().join("quiet.log");
    let mut m = Mount::start_logging_to(
        &address,
        &t.mnt,
        &["--nonempty"],
        Stdio::from(fs::File::create(&quiet).unwrap()),
    );
    assert!(!fs::read_to_string(&quiet).unwrap().contains("not empty"));
    m.stop();
    assert!(t.mnt.join("hidden").exists());
}

#[test]
fn a_peer_that_closes_during_the_handshake_is_explained() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("not-tether.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    std::thread::spawn(move || {
        for s in listener.incoming() {
            drop(s); // accept and hang up, as a server refusing us or no server at all
        }
    });
    let mut cmd = Command::new(TETHER);
    cmd.arg("check").arg(format!("unix:{}", path.display()));
    let out = finishes(cmd, Duration::from_secs(20));
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("closed the connection before it answered")
            && err.contains("not a Tether server"),
        "{err}"
    );
    assert!(!err.contains("failed to fill whole buffer"), "{err}");
}
