//! Tether installed like a file system: `mount.tether` (mount(8)'s helper convention, run
//! here through a symbolic link of that name, as /sbin/mount.tether would be), `tether
//! mount --background`, and the help and version a user installing it reads.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::{Server, TETHER};

/// `mount.tether`, a symbolic link to the tether binary in `dir`.
fn helper_in(dir: &Path) -> PathBuf {
    let link = dir.join("mount.tether");
    std::os::unix::fs::symlink(TETHER, &link).unwrap();
    link
}

fn run(program: &Path, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// The pid of the process serving the mount at `mnt` (its command line names it).
fn mount_process(mnt: &Path) -> Option<u32> {
    let want = mnt.to_str().unwrap();
    fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmdline = fs::read(e.path().join("cmdline")).ok()?;
        let words: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let is_it = words.contains(&&b"mount"[..]) && words.contains(&want.as_bytes());
        is_it.then_some(pid)
    })
}

/// The session id of process `pid` (field 6 of /proc/PID/stat).
fn session_of(pid: u32) -> i64 {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after_name = &stat[stat.rfind(')').unwrap() + 2..];
    after_name.split(' ').nth(3).unwrap().parse().unwrap()
}

/// Unmounts `mnt` with `tether unmount` and waits until its mount process `pid` is gone.
fn unmount_and_wait(mnt: &Path, pid: u32) {
    let out = run(Path::new(TETHER), &["unmount", mnt.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!common::is_mounted(mnt));
    common::wait_until(
        "the background mount process exits after the unmount",
        Duration::from_secs(10),
        || !Path::new(&format!("/proc/{pid}")).exists() || is_zombie(pid),
    );
}

fn is_zombie(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s[s.rfind(')').unwrap() + 2..].starts_with('Z'))
        .unwrap_or(true)
}

/// Unmounts whatever a failed test left at `mnt`.
struct Cleanup(PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        if common::is_mounted(&self.0) {
            let _ = Command::new(TETHER)
                .args(["unmount", "--lazy"])
                .arg(&self.0)
                .status();
        }
    }
}

/// `mount.tether SOURCE DIR -o ...` as mount(8) runs it: returns only once the mount is
/// up, in a detached process that serves it until it is unmounted.
#[test]
fn mount_tether_mounts_in_the_background_with_fstab_options() {
    require_mount!();
    let (dir, export, mnt) = common::export_and_mount_point();
    fs::write(export.join("f"), b"from fstab").unwrap();
    let sock = dir.path().join("s.sock");
    let addr = format!("unix:{}", sock.display());
    let _server = Server::start(&export, &addr, &[]);
    let helper = helper_in(dir.path());
    let log = dir.path().join("mount.log");
    let _cleanup = Cleanup(mnt.clone());

    let options = format!(
        "_netdev,nofail,defaults,rw,auto,x-systemd.automount,comment=x,attr-timeout=2,\
         timeout=30,writes=through,local-locks,log={}",
        log.display()
    );
    // mount(8)'s argument order: SOURCE DIR, then flags (-n: no mtab), then -o.
    let out = run(
        &helper,
        &[&addr, mnt.to_str().unwrap(), "-n", "-o", &options],
    );
    assert!(
        out.status.success(),
        "mount.tether failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Mounted when it returned: no waiting.
    assert!(
        common::is_mounted(&mnt),
        "not mounted when mount.tether returned"
    );
    let mounts = fs::read_to_string("/proc/mounts").unwrap();
    let line = mounts
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some(mnt.to_str().unwrap()))
        .unwrap();
    assert!(
        line.starts_with(&format!("tether:{addr} {} fuse.tether ", mnt.display())),
        "{line}"
    );
    assert_eq!(fs::read(mnt.join("f")).unwrap(), b"from fstab");
    fs::write(mnt.join("g"), b"back").unwrap();
    assert_eq!(fs::read(export.join("g")).unwrap(), b"back");

    // Detached: its own session, its log in the file.
    let pid = mount_process(&mnt).expect("a process serving the mount");
    assert_eq!(
        session_of(pid),
        pid as i64,
        "the mount process did not setsid"
    );
    let logged = fs::read_to_string(&log).unwrap();
    assert!(logged.contains("mounted"), "log: {logged}");
    // Its working directory is /, so it keeps no directory of the caller's busy.
    assert_eq!(
        fs::read_link(format!("/proc/{pid}/cwd")).unwrap(),
        Path::new("/")
    );

    unmount_and_wait(&mnt, pid);
}

/// A failed background mount fails the command with the mount process's own reason, and
/// mount(8)'s exit status; mistakes in the options are named before anything runs.
#[test]
fn mount_tether_fails_with_the_reason() {
    require_mount!();
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("m");
    fs::create_dir(&mnt).unwrap();
    let helper = helper_in(dir.path());
    let _cleanup = Cleanup(mnt.clone());
    let m = mnt.to_str().unwrap();

    // No server at the socket: the child's error comes back through the parent.
    let gone = format!("unix:{}", dir.path().join("nobody.sock").display());
    let out = run(&helper, &[&gone, m, "-o", "_netdev"]);
    assert_eq!(out.status.code(), Some(32), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("mount.tether: cannot connect to") && err.contains("nobody.sock"),
        "{err}"
    );
    assert!(!common::is_mounted(&mnt));

    // An unknown option is named; nothing is mounted.
    let out = run(&helper, &[&gone, m, "-o", "nofail,colour=blue"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown option \"colour=blue\""), "{err}");

    // -f (fake) checks and mounts nothing.
    let out = run(&helper, &[&gone, m, "-f", "-o", "ro"]);
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("would run: tether mount --background --read-only"),
        "{err}"
    );
    assert!(!common::is_mounted(&mnt));

    // The same through `tether mount --background`: exit status 1, the reason on stderr.
    let out = run(Path::new(TETHER), &["mount", "--background", &gone, m]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot connect to"), "{err}");
}

/// `tether mount -b` from a script: returns once mounted; relative paths work although the
/// mount process leaves the caller's directory.
#[test]
fn background_mount_returns_once_mounted() {
    require_mount!();
    let (dir, export, mnt) = common::export_and_mount_point();
    fs::write(export.join("f"), b"bg").unwrap();
    let sock = dir.path().join("s.sock");
    let addr = format!("unix:{}", sock.display());
    let _server = Server::start(&export, &addr, &[]);
    let _cleanup = Cleanup(mnt.clone());
    let out = Command::new(TETHER)
        .args(["mount", "-b", &addr, "m"])
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(common::is_mounted(&mnt));
    assert_eq!(fs::read(mnt.join("f")).unwrap(), b"bg");
    let pid = mount_process(Path::new("m"))
        .or_else(|| mount_process(&mnt))
        .expect("a process serving the mount");
    unmount_and_wait(&mnt, pid);
}

#[test]
fn version_and_help_show_what_installing_needs() {
    let out = run(Path::new(TETHER), &["--version"]);
    assert!(out.status.success());
    let v = String::from_utf8_lossy(&out.stdout);
    assert!(
        v.starts_with(&format!("tether {}", env!("CARGO_PKG_VERSION"))),
        "{v}"
    );
    let out = run(Path::new(TETHER), &["mount", "--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    for want in [
        "vsock:2:7070",
        "mount -t tether",
        "fstab",
        "--background",
        "_netdev",
    ] {
        assert!(help.contains(want), "mount --help lacks {want:?}:\n{help}");
    }
    let out = run(Path::new(TETHER), &["serve", "--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    for want in ["--listen vsock:7070", "vsock-unix:", "Firecracker"] {
        assert!(help.contains(want), "serve --help lacks {want:?}:\n{help}");
    }
}
