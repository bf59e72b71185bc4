//! Test fixture: a real `tether serve` process and a real `tether mount` process on a FUSE
//! mount, torn down (unmounted, processes stopped) even when a test fails.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const TETHER: &str = env!("CARGO_BIN_EXE_tether");

/// The tether binary where other users can run it: the build directory may sit under a
/// home directory they cannot enter. A hard link where the file system allows (no copy of
/// the binary left behind), a copy otherwise; one per build, and those of older builds
/// are removed.
pub fn tether_for_others() -> PathBuf {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    static COPY: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    COPY.get_or_init(|| {
        let meta = std::fs::metadata(TETHER).unwrap();
        let name = format!(
            "tether-test-bin-{}-{}",
            meta.size(),
            meta.mtime_nsec() ^ meta.mtime()
        );
        let tmp_dir = std::env::temp_dir();
        for old in std::fs::read_dir(&tmp_dir).into_iter().flatten().flatten() {
            let n = old.file_name().to_string_lossy().into_owned();
            if n.starts_with("tether-test-bin-") && n != name {
                let _ = std::fs::remove_dir_all(old.path());
            }
        }
        let dir = tmp_dir.join(name);
        let bin = dir.join("tether");
        if !bin.exists() {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
            let tmp = dir.join(format!("tether.{}", std::process::id()));
            if std::fs::hard_link(TETHER, &tmp).is_err() {
                std::fs::copy(TETHER, &tmp).unwrap();
            }
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).unwrap();
            std::fs::rename(&tmp, &bin).unwrap();
        }
        bin
    })
    .clone()
}

/// The log (standard error) of a process a fixture started: kept in a file and printed,
/// from the test's own thread, when the fixture is dropped. The test harness captures what
/// a test prints and shows it only for a failing test, so a passing run stays quiet.
pub struct ChildLog {
    path: PathBuf,
    /// The file's own temporary directory, removed with it (None: the caller's file).
    _dir: Option<tempfile::TempDir>,
}

impl ChildLog {
    /// A new log file, and the Stdio to give the process.
    pub fn new() -> (ChildLog, Stdio) {
        let dir = tempfile::Builder::new()
            .prefix("tether-test-log")
            .tempdir()
            .expect("a directory for a log");
        let path = dir.path().join("log");
        let file = std::fs::File::create(&path).expect("create a log");
        (
            ChildLog {
                path,
                _dir: Some(dir),
            },
            Stdio::from(file),
        )
    }

    /// The caller's file `path`, printed on drop too.
    pub fn at(path: &Path) -> (ChildLog, Stdio) {
        let file = std::fs::File::create(path).expect("create a log");
        (
            ChildLog {
                path: path.to_path_buf(),
                _dir: None,
            },
            Stdio::from(file),
        )
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Prints the log under a heading naming `what`.
    pub fn show(&self, what: &str) {
        if let Ok(text) = std::fs::read_to_string(&self.path) {
            if !text.is_empty() {
                eprintln!("----- log of {what} -----\n{text}----- end of {what} -----");
            }
        }
    }
}

/// Why real-mount tests cannot run here, if they cannot.
pub fn mount_unavailable() -> Option<String> {
    if !Path::new("/dev/fuse").exists() {
        return Some("no /dev/fuse".into());
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root (the tests mount with allow_other)".into());
    }
    None
}

/// The first of `commands` (a program and an argument that makes it print its version)
/// that cannot be run here: a test that needs it skips.
pub fn first_missing<'a>(commands: &[&[&'a str]]) -> Option<&'a str> {
    commands.iter().find_map(|c| {
        let ran = Command::new(c[0]).args(&c[1..]).output().is_ok();
        (!ran).then_some(c[0])
    })
}

/// Says that the calling test skips for `why` (the caller then returns). Where real mounts
/// can run (root with /dev/fuse, as on CI, where scripts/install-deps.sh installs every
/// tool), a missing tool or kernel feature is a failure, not a skip: it fails the test.
pub fn skip(why: &str) {
    if mount_unavailable().is_none() {
        panic!(
            "this test would skip ({why}), but real mounts run here (root with /dev/fuse, as \
             on CI): install what it needs (scripts/install-deps.sh)"
        );
    }
    eprintln!("SKIPPED: {why}");
}

/// Says that the calling test skips for `why`, a reason that holds on CI too (a chance
/// the test waits for did not come, the suite runs in a mode the test is not for).
pub fn skip_anywhere(why: &str) {
    eprintln!("SKIPPED (a reason that holds on CI too): {why}");
}

/// Skips the calling test with a printed reason when mounts are unavailable (not root, no
/// /dev/fuse): reasons that never hold where real mounts can run.
#[macro_export]
macro_rules! require_mount {
    () => {
        if let Some(why) = common::mount_unavailable() {
            eprintln!("SKIPPED: {why}");
            return;
        }
    };
}

/// Skips the calling test when one of `commands` (as for [`first_missing`]) cannot be run
/// here ([`skip`]: a failure where real mounts run).
#[macro_export]
macro_rules! require_tools {
    ($commands:expr) => {
        if let Some(p) = common::first_missing($commands) {
            common::skip(&format!("{p} is not installed"));
            return;
        }
    };
}

pub struct Server {
    pub child: Child,
    pub address: String,
    log: Option<ChildLog>,
}

impl Server {
    /// Starts `tether serve DIR --listen ADDRESS EXTRA...` and waits until it listens. Its
    /// log is shown if the test fails.
    pub fn start(dir: &Path, address: &str, extra: &[&str]) -> Server {
        let (log, stderr) = ChildLog::new();
        Self::spawn(Path::new(TETHER), dir, address, extra, Some(log), |cmd| {
            cmd.stderr(stderr);
        })
    }

    /// [`Server::start`] with the server's log (its stderr) going to the file `log`.
    pub fn start_logging_to(dir: &Path, address: &str, extra: &[&str], log: &Path) -> Server {
        let (log, stderr) = ChildLog::at(log);
        Self::spawn(Path::new(TETHER), dir, address, extra, Some(log), |cmd| {
            cmd.stderr(stderr);
        })
    }

    fn spawn(
        bin: &Path,
        dir: &Path,
        address: &str,
        extra: &[&str],
        log: Option<ChildLog>,
        adjust: impl FnOnce(&mut Command),
    ) -> Server {
        let mut cmd = Command::new(bin);
        // The whole suite with other server options, e.g. TETHER_TEST_SERVE_ARGS="--backend
        // portable" (scripts/test.sh runs the suites so: docs/macos.md).
        let more = std::env::var("TETHER_TEST_SERVE_ARGS").unwrap_or_default();
        cmd.arg("serve")
            .arg(dir)
            .args(["--listen", address])
            .args(extra)
            .args(more.split_whitespace())
            .stdin(Stdio::null())
            .stderr(Stdio::inherit());
        adjust(&mut cmd);
        let child = cmd.spawn().expect("start tether serve");
        let server = Server {
            child,
            address: address.to_string(),
            log,
        };
        server.wait_listening();
        server
    }

    /// A server for `dir` on `address` whose process starts now but serves only once
    /// [`PreparedServer::start`] says so: for a test that kills its server while it holds
    /// a file of the mount with writes in flight. Started then, a new process's exec would
    /// close its copy of that file, and a close waits for the server to have the writes.
    pub fn prepare(dir: &Path, address: &str) -> PreparedServer {
        let more = std::env::var("TETHER_TEST_SERVE_ARGS").unwrap_or_default();
        let child = Command::new("sh")
            .args(["-c", "read _ && exec \"$0\" \"$@\"", TETHER, "serve"])
            .arg(dir)
            .args(["--listen", address])
            .args(more.split_whitespace())
            .stdin(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start sh for tether serve");
        PreparedServer(Some(Server {
            child,
            address: address.to_string(),
            log: None,
        }))
    }

    fn wait_listening(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let ready = match self.address.split_once(':') {
                Some(("unix", p)) => std::os::unix::net::UnixStream::connect(p).is_ok(),
                Some(("tcp", a)) => std::net::TcpStream::connect(a).is_ok(),
                _ => panic!("bad address {}", self.address),
            };
            if ready {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "server did not start listening on {}",
                self.address
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A server process waiting to serve ([`Server::prepare`]); dropped unstarted, it ends.
pub struct PreparedServer(Option<Server>);

impl PreparedServer {
    /// Lets the server start (it execs `tether serve`) and waits until it listens.
    pub fn start(mut self) -> Server {
        let mut server = self.0.take().unwrap();
        let mut go = server.child.stdin.take().unwrap();
        std::io::Write::write_all(&mut go, b"go\n").expect("tell sh to start tether serve");
        drop(go);
        server.wait_listening();
        server
    }
}

impl Drop for PreparedServer {
    fn drop(&mut self) {
        if let Some(mut s) = self.0.take() {
            drop(s.child.stdin.take()); // `read` fails at end of input: sh exits
            let _ = s.child.wait();
        }
    }
}

impl Server {
    /// Sends `signal` to the server and waits until it has exited.
    pub fn stop_with(&mut self, signal: i32) {
        // A reaped child's pid may belong to another process by now.
        if matches!(self.child.try_wait(), Ok(None)) {
            // SAFETY: signalling our own, unreaped child process.
            unsafe { libc::kill(self.child.id() as i32, signal) };
        }
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop_with(libc::SIGTERM);
        if let Some(log) = &self.log {
            log.show(&format!("tether serve on {}", self.address));
        }
    }
}

/// Runs `tether ARGS...`, asserts it succeeded and returns its output.
pub fn tether_ok<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> String {
    let out = Command::new(TETHER).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Calls `done` every 10 ms until it holds (true) or `within` has passed (false).
pub fn poll_until(within: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    while !done() {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

/// A child process of the test stopped with SIGSTOP, continued with SIGCONT when dropped
/// (also when the test fails), unless it has exited meanwhile: its pid may then belong to a
/// later process, another test's stopped server among them, which must not be continued.
pub struct Stopped {
    pid: i32,
    /// The process's start time (/proc/PID/stat), which a later holder of the pid lacks.
    started: Option<String>,
}

impl Stopped {
    /// Stops our child `pid` and returns once every thread of it is stopped.
    pub fn stop(pid: i32) -> Stopped {
        let started = proc_stat_field(pid, 22);
        // SAFETY: signalling the test's own child; Drop continues it.
        unsafe { libc::kill(pid, libc::SIGSTOP) };
        let stopped = Stopped { pid, started };
        let all_stopped = || {
            let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
            tasks.map(|t| t.unwrap().path().join("stat")).all(|stat| {
                // "pid (comm) STATE ...": the state follows the last ')'.
                let s = std::fs::read_to_string(stat).unwrap_or_default();
                s.rsplit_once(") ")
                    .is_some_and(|(_, rest)| rest.starts_with('T'))
            })
        };
        wait_until("the process stops", Duration::from_secs(5), all_stopped);
        stopped
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        if self.started.is_some() && proc_stat_field(self.pid, 22) == self.started {
            // SAFETY: signalling the process this value stopped, seen still there.
            unsafe { libc::kill(self.pid, libc::SIGCONT) };
        }
    }
}

/// Field `n` (1-based, as proc(5) numbers them) of /proc/`pid`/stat.
fn proc_stat_field(pid: i32, n: usize) -> Option<String> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields 1 and 2 are "pid (comm)"; the comm may hold spaces and parentheses.
    let (_, rest) = s.rsplit_once(") ")?;
    rest.split_whitespace().nth(n - 3).map(str::to_string)
}

/// [`poll_until`] that fails the test, saying what did not happen within `within`.
pub fn wait_until(what: &str, within: Duration, done: impl FnMut() -> bool) {
    assert!(
        poll_until(within, done),
        "not done within {within:?}: {what}"
    );
}

/// From `tether status MNT`: host events (replayed, not watched in the guest, failed).
pub fn host_event_counts(mnt: &Path) -> (u64, u64, u64) {
    let s = status(mnt);
    let line = s
        .lines()
        .find_map(|l| l.strip_prefix("host events: on: "))
        .unwrap_or_else(|| panic!("no host event counters in: {s}"));
    let n: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter(|w| !w.is_empty())
        .map(|w| w.parse().unwrap())
        .collect();
    (n[0], n[1], n[2])
}

/// The report of `tether status MNT`.
pub fn status(mnt: &Path) -> String {
    // In this process, not by running `tether status`: a child's exec closes its copies of
    // the test's descriptors, and closing a file with writes in flight waits for the server
    // (FLUSH), which some tests hold stopped.
    tether_client::status::query(mnt).unwrap_or_else(|e| panic!("status of {}: {e}", mnt.display()))
}

/// How many requests of operation `op` (as `tether status` names it) the mount has sent,
/// from its status report.
pub fn sent(report: &str, op: &str) -> u64 {
    let line = report
        .lines()
        .find_map(|l| l.strip_prefix("requests sent: "))
        .unwrap_or_else(|| panic!("no request counts in status:\n{report}"));
    line.split(", ")
        .find_map(|c| c.strip_prefix(&format!("{op} ")))
        .map_or(0, |n| n.parse().unwrap())
}

/// Whether the suite runs every mount with `flag` (TETHER_TEST_MOUNT_ARGS).
pub fn suite_mounts_with(flag: &str) -> bool {
    let args = std::env::var("TETHER_TEST_MOUNT_ARGS").unwrap_or_default();
    args.split_whitespace().any(|a| a == flag)
}

/// Whether the suite runs every server with `flag` (TETHER_TEST_SERVE_ARGS).
pub fn suite_serves_with(flag: &str) -> bool {
    let args = std::env::var("TETHER_TEST_SERVE_ARGS").unwrap_or_default();
    args.split_whitespace().any(|a| a == flag)
}

/// Whether the suite's servers use the portable backend (`--backend portable`, the macOS
/// code paths): a test of something only the Linux backend does says so and is skipped.
/// The list of such differences, with reasons, is in docs/macos.md.
pub fn skipped_for_portable(why: &str) -> bool {
    let args = std::env::var("TETHER_TEST_SERVE_ARGS").unwrap_or_default();
    let portable = args.contains("--backend portable") || args.contains("--backend=portable");
    if portable {
        skip_anywhere(&format!("not for the portable backend: {why}"));
    }
    portable
}

/// [`suite_mounts_with`], saying that the calling test is skipped for it.
pub fn skipped_with(flag: &str) -> bool {
    let skip = suite_mounts_with(flag);
    if skip {
        skip_anywhere(&format!(
            "not for mounts with {flag} (TETHER_TEST_MOUNT_ARGS)"
        ));
    }
    skip
}

/// The number that follows `label: ` on a line of a status report.
pub fn counted(report: &str, label: &str) -> u64 {
    let rest = report
        .lines()
        .find_map(|l| l.strip_prefix(label)?.strip_prefix(": "))
        .unwrap_or_else(|| panic!("no \"{label}\" in status:\n{report}"));
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().unwrap()
}

pub fn is_mounted(mnt: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let want = mnt.to_string_lossy();
    mounts
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some(&want))
}

pub struct Mount {
    pub child: Child,
    pub path: PathBuf,
    log: Option<ChildLog>,
}

impl Mount {
    /// Starts `tether mount ADDRESS MNT EXTRA...` and waits until the mount is up. The
    /// environment's TETHER_TEST_MOUNT_ARGS (split at spaces, options written
    /// `--name=value`) are added, except options already in EXTRA: the whole suite can run in another mount mode.
    pub fn start(address: &str, mnt: &Path, extra: &[&str]) -> Mount {
        let (log, stderr) = ChildLog::new();
        let mut m = Self::start_logging_to(address, mnt, extra, stderr);
        m.log = Some(log);
        m
    }

    /// [`Mount::start`] with the client's log (its stderr) going to `log`.
    pub fn start_logging_to(address: &str, mnt: &Path, extra: &[&str], log: Stdio) -> Mount {
        Self::start_adjusted(address, mnt, extra, log, |_| {})
    }

    /// [`Mount::start_logging_to`], with the command changed by `adjust` before it runs
    /// (its environment, limits).
    pub fn start_adjusted(
        address: &str,
        mnt: &Path,
        extra: &[&str],
        log: Stdio,
        adjust: impl FnOnce(&mut Command),
    ) -> Mount {
        let more = std::env::var("TETHER_TEST_MOUNT_ARGS").unwrap_or_default();
        // An option in EXTRA wins over the same option (`--writes=...`) from the suite.
        let option = |a: &str| a.split('=').next().unwrap_or(a).to_string();
        let more = more
            .split_whitespace()
            .filter(|a| !extra.iter().any(|e| option(e) == option(a)));
        let mut cmd = Command::new(TETHER);
        cmd.arg("mount")
            .arg(address)
            .arg(mnt)
            .args(extra)
            .args(more)
            .stdin(Stdio::null())
            .stderr(log);
        adjust(&mut cmd);
        let mut child = cmd.spawn().expect("start tether mount");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !is_mounted(mnt) {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("tether mount exited early: {status}");
            }
            assert!(
                Instant::now() < deadline,
                "mount did not appear at {}",
                mnt.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Mount {
            child,
            path: mnt.to_path_buf(),
            log: None,
        }
    }

    /// Unmounts (like Ctrl-C) and waits for the client to exit.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = Command::new(TETHER)
                    .args(["unmount", "--lazy"])
                    .arg(&self.path)
                    .status();
                let _ = self.child.kill();
                return self.child.wait().expect("wait for mount");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.stop();
        }
        if is_mounted(&self.path) {
            let _ = Command::new(TETHER)
                .args(["unmount", "--lazy"])
                .arg(&self.path)
                .status();
        }
        if let Some(log) = &self.log {
            log.show(&format!("tether mount at {}", self.path.display()));
        }
    }
}

/// A fresh temporary directory with an empty `e` (to export) and `m` (to mount on) in it.
pub fn export_and_mount_point() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (export, mnt) = (dir.path().join("e"), dir.path().join("m"));
    std::fs::create_dir(&export).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    (dir, export, mnt)
}

/// An export directory served over a Unix socket and mounted: the usual test setup.
/// Field order matters: the mount is dropped (unmounted) before the server stops.
pub struct TestMount {
    pub mount: Mount,
    pub server: Server,
    pub export: PathBuf,
    pub mnt: PathBuf,
    pub dir: tempfile::TempDir,
}

impl TestMount {
    pub fn start() -> TestMount {
        Self::start_with(&[], &[])
    }

    pub fn start_with(serve_args: &[&str], mount_args: &[&str]) -> TestMount {
        Self::start_adjusted(serve_args, mount_args, |_| {})
    }

    /// [`TestMount::start_with`], with the mount's command changed by `adjust` (see
    /// [`Mount::start_adjusted`]).
    pub fn start_adjusted(
        serve_args: &[&str],
        mount_args: &[&str],
        adjust: impl FnOnce(&mut Command),
    ) -> TestMount {
        let dir = tempfile::Builder::new()
            .prefix("tether-test")
            .tempdir()
            .expect("tempdir");
        let export = dir.path().join("export");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&export).unwrap();
        std::fs::create_dir(&mnt).unwrap();
        let address = format!("unix:{}", dir.path().join("tether.sock").display());
        let server = Server::start(&export, &address, serve_args);
        let (log, stderr) = ChildLog::new();
        let mut mount = Mount::start_adjusted(&address, &mnt, mount_args, stderr, adjust);
        mount.log = Some(log);
        TestMount {
            mount,
            server,
            export,
            mnt,
            dir,
        }
    }
}

impl Server {
    /// Starts `tether serve DIR --listen ADDRESS EXTRA...` as user `uid`:`gid` (the test
    /// must be root) and waits until it listens.
    pub fn start_as(dir: &Path, address: &str, extra: &[&str], uid: u32, gid: u32) -> Server {
        use std::os::unix::process::CommandExt;
        let (log, stderr) = ChildLog::new();
        Self::spawn(
            &tether_for_others(),
            dir,
            address,
            extra,
            Some(log),
            |cmd| {
                cmd.uid(uid).gid(gid).stderr(stderr);
            },
        )
    }
}

/// A tmpfs mounted for a test (`size` as mount(8) takes it, or None for the default),
/// unmounted when dropped (also when the test fails). Needs root.
pub struct Tmpfs(PathBuf);

impl Tmpfs {
    pub fn mount(at: &Path, size: Option<&str>) -> Tmpfs {
        let mut cmd = Command::new("mount");
        cmd.args(["-t", "tmpfs"]);
        if let Some(size) = size {
            cmd.args(["-o", &format!("size={size}")]);
        }
        let ok = cmd.arg("tether-test-tmpfs").arg(at).status().unwrap();
        assert!(ok.success(), "cannot mount a tmpfs on {}", at.display());
        Tmpfs(at.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// A process pinned to CPU 0 (with `--io-uring`, the kernel queues its requests on CPU
/// 0's ring).
pub fn on_cpu0(program: &str) -> Command {
    let mut c = Command::new("taskset");
    c.args(["-c", "0", program]);
    c
}

/// A shell loop that keeps CPU 0 busy until the result is dropped. Waits until it runs:
/// a process at idle priority there would otherwise run in the meantime.
pub fn keep_cpu0_busy() -> Killed {
    let busy = Killed(vec![on_cpu0("sh")
        .args(["-c", "while :; do :; done"])
        .spawn()
        .unwrap()]);
    let pid = busy.0[0].id();
    wait_until("the busy loop runs", Duration::from_secs(10), || {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        comm.trim() == "sh" && wchan(pid) == "0"
    });
    busy
}

/// Where process `pid` sleeps in the kernel.
pub fn wchan(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/wchan")).unwrap_or_default()
}

/// Whether process `pid` sleeps waiting for the answer to a FUSE request.
pub fn waits_in_fuse(pid: u32) -> bool {
    wchan(pid) == "request_wait_answer"
}

/// Whether process `pid` sleeps opening a FIFO no one writes to yet.
pub fn waits_for_a_fifo(pid: u32) -> bool {
    wchan(pid) == "wait_for_partner"
}

pub fn make_fifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    let r = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
    assert_eq!(r, 0, "mkfifo: {}", std::io::Error::last_os_error());
}

/// Processes killed (and reaped) when this is dropped, however the test ends: a waiter
/// left blocked on the mount would keep it busy.
pub struct Killed(pub Vec<Child>);

impl Drop for Killed {
    fn drop(&mut self) {
        for c in self.0.iter_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
