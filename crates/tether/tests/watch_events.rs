//! Guest file watchers hear host edits: a process watching the mount with inotify (the
//! inotifywait tool, and Python's watchdog library) receives the events a local change would
//! have produced, for changes made on the host and through another mount; the guest's own
//! changes are not echoed; the host's files are left exactly as the host made them.

mod common;

use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, UNIX_EPOCH};

use common::{status, Mount, TestMount};

/// Far longer than the 50 ms the issue asks at p99 (the bench measures that); long enough
/// for a loaded CI machine.
const DEADLINE: Duration = Duration::from_secs(3);

/// A watcher process whose output lines are collected by a thread.
struct Watcher {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    what: &'static str,
}

impl Watcher {
    /// Starts `program args...`; waits until it prints (on stdout or stderr) `ready`.
    fn start(what: &'static str, program: &str, args: &[&str], ready: &str) -> Watcher {
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {program}: {e}"));
        let lines = Arc::new(Mutex::new(Vec::new()));
        for out in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let lines = lines.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    lines.lock().unwrap().push(line);
                }
            });
        }
        let w = Watcher { child, lines, what };
        w.wait_for(&format!("{what} to start"), |l| l.contains(ready));
        w
    }

    fn inotifywait(dir: &Path) -> Watcher {
        let dir = dir.to_str().unwrap();
        Watcher::start(
            "inotifywait",
            "inotifywait",
            &["-m", "-r", "--format", "%e %c %w%f", dir],
            "Watches established",
        )
    }

    fn count(&self, pred: impl Fn(&str) -> bool) -> usize {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter(|l| pred(l))
            .count()
    }

    fn wait_for(&self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        self.wait_for_n(what, 1, &pred);
        let lines = self.lines.lock().unwrap();
        lines.iter().rev().find(|l| pred(l)).unwrap().clone()
    }

    fn wait_for_n(&self, what: &str, n: usize, pred: &dyn Fn(&str) -> bool) {
        let start = Instant::now();
        while self.count(pred) < n {
            if start.elapsed() > DEADLINE {
                let lines = self.lines.lock().unwrap();
                let tail: Vec<_> = lines.iter().rev().take(40).rev().collect();
                panic!(
                    "{}: {what}: {} of {n} within {DEADLINE:?}; last lines: {tail:#?}",
                    self.what,
                    self.count_locked(&lines, pred)
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn count_locked(&self, lines: &[String], pred: &dyn Fn(&str) -> bool) -> usize {
        lines.iter().filter(|l| pred(l)).count()
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An inotifywait line "EVENTS COOKIE PATH": does it report `event` for `path`?
fn is(line: &str, event: &str, path: &Path) -> bool {
    let mut parts = line.splitn(3, ' ');
    let (Some(events), Some(_cookie), Some(p)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    p == path.to_str().unwrap() && events.split(',').any(|e| e == event)
}

fn cookie(line: &str) -> &str {
    line.split(' ').nth(1).unwrap()
}

fn inotifywait_available() -> bool {
    Command::new("inotifywait")
        .arg("--help")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

macro_rules! require_inotifywait {
    () => {
        if !inotifywait_available() {
            common::skip("inotifywait not installed (apt install inotify-tools)");
            return;
        }
    };
}

/// Each kind of host change raises, in a guest watcher, the events the same change made
/// locally would; the host's files stay exactly as the host left them.
#[test]
fn inotifywait_hears_every_kind_of_host_change() {
    require_mount!();
    require_inotifywait!();
    let t = TestMount::start();
    let (h, g) = (&t.export, &t.mnt);
    let w = Watcher::inotifywait(g);

    fs::write(h.join("a.txt"), b"one").unwrap();
    for ev in ["CREATE", "MODIFY", "CLOSE_WRITE"] {
        w.wait_for(&format!("{ev} of a new file"), |l| {
            is(l, ev, &g.join("a.txt"))
        });
    }
    assert_eq!(fs::read(g.join("a.txt")).unwrap(), b"one");

    // Append: a second MODIFY and CLOSE_WRITE, and the watcher reads the new content.
    fs::OpenOptions::new()
        .append(true)
        .open(h.join("a.txt"))
        .and_then(|mut f| std::io::Write::write_all(&mut f, b" two"))
        .unwrap();
    w.wait_for_n("append", 2, &|l| is(l, "CLOSE_WRITE", &g.join("a.txt")));
    assert_eq!(fs::read(g.join("a.txt")).unwrap(), b"one two");

    fs::set_permissions(h.join("a.txt"), fs::Permissions::from_mode(0o600)).unwrap();
    w.wait_for("chmod", |l| is(l, "ATTRIB", &g.join("a.txt")));
    let mtime = UNIX_EPOCH + Duration::from_secs(1_000_000_000);
    // Both times: setting only the mtime is IN_MODIFY to inotify, both are IN_ATTRIB.
    let times = fs::FileTimes::new().set_accessed(mtime).set_modified(mtime);
    fs::File::open(h.join("a.txt"))
        .unwrap()
        .set_times(times)
        .unwrap();
    w.wait_for_n("utimes", 2, &|l| is(l, "ATTRIB", &g.join("a.txt")));
    // The replays changed nothing on the host.
    let m = fs::metadata(h.join("a.txt")).unwrap();
    assert_eq!(m.mode() & 0o7777, 0o600);
    assert_eq!(m.modified().unwrap(), mtime);
    assert_eq!(fs::read(h.join("a.txt")).unwrap(), b"one two");
    let gm = fs::metadata(g.join("a.txt")).unwrap();
    assert_eq!((gm.mode() & 0o7777, gm.modified().unwrap()), (0o600, mtime));

    // Rename within a directory: MOVED_FROM and MOVED_TO with one cookie.
    fs::rename(h.join("a.txt"), h.join("b.txt")).unwrap();
    let from = w.wait_for("rename from", |l| is(l, "MOVED_FROM", &g.join("a.txt")));
    let to = w.wait_for("rename to", |l| is(l, "MOVED_TO", &g.join("b.txt")));
    assert_eq!(cookie(&from), cookie(&to), "{from} / {to}");
    assert_ne!(cookie(&from), "0");

    fs::create_dir(h.join("d")).unwrap();
    w.wait_for("mkdir", |l| {
        is(l, "CREATE", &g.join("d")) && l.contains("ISDIR")
    });
    // inotifywait -r adds a watch on the new directory; make sure it is in place.
    let _ = fs::metadata(g.join("d")).unwrap();
    std::thread::sleep(Duration::from_millis(100));

    // Rename across directories.
    fs::rename(h.join("b.txt"), h.join("d/c.txt")).unwrap();
    let from = w.wait_for("move from", |l| is(l, "MOVED_FROM", &g.join("b.txt")));
    let to = w.wait_for("move to", |l| is(l, "MOVED_TO", &g.join("d/c.txt")));
    assert_eq!(cookie(&from), cookie(&to), "{from} / {to}");

    fs::remove_file(h.join("d/c.txt")).unwrap();
    w.wait_for("delete", |l| is(l, "DELETE", &g.join("d/c.txt")));
    fs::remove_dir(h.join("d")).unwrap();
    w.wait_for("rmdir", |l| {
        is(l, "DELETE", &g.join("d")) && l.contains("ISDIR")
    });
    assert!(fs::metadata(g.join("d")).is_err());

    std::os::unix::fs::symlink("target", h.join("lnk")).unwrap();
    w.wait_for("symlink", |l| is(l, "CREATE", &g.join("lnk")));
    assert_eq!(
        fs::read_link(g.join("lnk")).unwrap(),
        Path::new("target"),
        "the replayed creation did not replace the host's symlink"
    );
    assert_eq!(fs::read_link(h.join("lnk")).unwrap(), Path::new("target"));

    // The guest's own change raises its local events once: nothing is echoed back.
    fs::write(g.join("own.txt"), b"mine").unwrap();
    w.wait_for("own close", |l| is(l, "CLOSE_WRITE", &g.join("own.txt")));
    std::thread::sleep(Duration::from_millis(500));
    for ev in ["CREATE", "MODIFY", "CLOSE_WRITE"] {
        assert_eq!(
            w.count(|l| is(l, ev, &g.join("own.txt"))),
            1,
            "{ev} of the guest's own write"
        );
    }
    // Nor after the guest renamed or hard-linked its file (both change its ctime).
    fs::rename(g.join("own.txt"), g.join("own2.txt")).unwrap();
    fs::hard_link(g.join("own2.txt"), g.join("own-link")).unwrap();
    fs::remove_file(g.join("own-link")).unwrap();
    fs::OpenOptions::new()
        .append(true)
        .open(g.join("own2.txt"))
        .and_then(|mut f| std::io::Write::write_all(&mut f, b" more"))
        .unwrap();
    w.wait_for("own append", |l| is(l, "CLOSE_WRITE", &g.join("own2.txt")));
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        w.count(|l| is(l, "MODIFY", &g.join("own2.txt"))),
        1,
        "MODIFY of the guest's own append after a rename and a link"
    );
    let (replayed, _, failed) = common::host_event_counts(g);
    assert!(
        replayed >= 11,
        "{replayed} replayed: one per host change above"
    );
    assert_eq!(failed, 0);
}

/// A change made through a second mount of the same export reaches a watcher of the first.
#[test]
fn changes_through_another_mount_are_heard() {
    require_mount!();
    require_inotifywait!();
    let t = TestMount::start();
    let other = t.dir.path().join("other");
    fs::create_dir(&other).unwrap();
    let address = format!("unix:{}", t.dir.path().join("tether.sock").display());
    let _second = Mount::start(&address, &other, &[]);
    let g = &t.mnt;
    let w = Watcher::inotifywait(g);
    fs::write(other.join("x"), b"from the other guest").unwrap();
    w.wait_for("create", |l| is(l, "CREATE", &g.join("x")));
    w.wait_for("close", |l| is(l, "CLOSE_WRITE", &g.join("x")));
    assert_eq!(fs::read(g.join("x")).unwrap(), b"from the other guest");
    fs::remove_file(other.join("x")).unwrap();
    w.wait_for("delete", |l| is(l, "DELETE", &g.join("x")));
}

/// A common watcher library, Python's watchdog (inotify backend), sees host changes.
#[test]
fn python_watchdog_hears_host_changes() {
    require_mount!();
    let python = ["/usr/bin/python3", "python3"].into_iter().find(|p| {
        Command::new(p)
            .args(["-c", "import watchdog.observers.inotify"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    let Some(python) = python else {
        common::skip("Python's watchdog is not installed (apt install python3-watchdog)");
        return;
    };
    let t = TestMount::start();
    let (h, g) = (&t.export, &t.mnt);
    fs::create_dir(h.join("src")).unwrap();
    let script = r#"
import sys, time
from watchdog.observers.inotify import InotifyObserver
from watchdog.events import FileSystemEventHandler
class H(FileSystemEventHandler):
    def on_any_event(self, e):
        print(e.event_type, "dir" if e.is_directory else "file", e.src_path, getattr(e, "dest_path", ""), flush=True)
o = InotifyObserver()
o.schedule(H(), sys.argv[1], recursive=True)
o.start()
print("ready", flush=True)
while True:
    time.sleep(1)
"#;
    let w = Watcher::start(
        "watchdog",
        python,
        &["-u", "-c", script, g.to_str().unwrap()],
        "ready",
    );
    let p = |rel: &str| g.join(rel).to_str().unwrap().to_string();
    let has = |kind: &str, path: String| {
        let want = format!("{kind} file {path}");
        move |l: &str| l.starts_with(&want)
    };
    fs::write(h.join("src/app.js"), b"v1").unwrap();
    w.wait_for("created", has("created", p("src/app.js")));
    w.wait_for("closed", has("closed", p("src/app.js")));
    fs::write(h.join("src/app.js"), b"v2").unwrap();
    w.wait_for("modified", has("modified", p("src/app.js")));
    // chmod and utimes (both times) are IN_ATTRIB, which watchdog reports as "modified".
    let modified = |w: &Watcher| w.count(has("modified", p("src/app.js")));
    let before = modified(&w);
    fs::set_permissions(h.join("src/app.js"), fs::Permissions::from_mode(0o600)).unwrap();
    w.wait_for_n("chmod", before + 1, &has("modified", p("src/app.js")));
    let t = UNIX_EPOCH + Duration::from_secs(1_234_567_890);
    // Counted before the change: its event may arrive before the wait starts.
    let before = modified(&w);
    fs::File::open(h.join("src/app.js"))
        .unwrap()
        .set_times(fs::FileTimes::new().set_accessed(t).set_modified(t))
        .unwrap();
    w.wait_for_n("utimes", before + 1, &has("modified", p("src/app.js")));
    fs::create_dir(h.join("src/lib")).unwrap();
    w.wait_for("mkdir", |l: &str| {
        l.starts_with(&format!("created dir {}", p("src/lib")))
    });
    fs::remove_dir(h.join("src/lib")).unwrap();
    w.wait_for("rmdir", |l: &str| {
        l.starts_with(&format!("deleted dir {}", p("src/lib")))
    });
    fs::rename(h.join("src/app.js"), h.join("src/main.js")).unwrap();
    w.wait_for("moved", |l: &str| {
        l == format!("moved file {} {}", p("src/app.js"), p("src/main.js"))
    });
    fs::remove_file(h.join("src/main.js")).unwrap();
    w.wait_for("deleted", has("deleted", p("src/main.js")));
}

/// A burst of host rewrites (a `git checkout` of 2,000 files) reaches the watcher whole,
/// and a mount without watchers replays nothing.
#[test]
fn a_burst_of_host_rewrites_loses_nothing() {
    require_mount!();
    require_inotifywait!();
    let t = TestMount::start();
    let (h, g) = (&t.export, &t.mnt);
    fs::create_dir(h.join("tree")).unwrap();
    const N: usize = 2000;
    for i in 0..N {
        fs::write(h.join(format!("tree/f{i}")), b"old").unwrap();
    }
    // Nobody watches yet: host changes are not replayed at all.
    assert_eq!(fs::read_dir(g.join("tree")).unwrap().count(), N);
    let (_, unwatched, _) = common::host_event_counts(g);
    fs::write(h.join("tree/f0"), b"unwatched").unwrap();
    let start = Instant::now();
    while common::host_event_counts(g).1 == unwatched {
        assert!(start.elapsed() < DEADLINE, "{}", status(g));
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        common::host_event_counts(g).0,
        0,
        "replayed with nobody watching"
    );

    let w = Watcher::inotifywait(&g.join("tree"));
    for i in 0..N {
        fs::write(h.join(format!("tree/f{i}")), b"new content").unwrap();
    }
    let tree = g.join("tree");
    let prefix = format!("{}/", tree.to_str().unwrap());
    w.wait_for_n("CLOSE_WRITE of every rewritten file", N, &|l: &str| {
        l.starts_with("CLOSE_WRITE") && l.contains(&prefix)
    });
    for i in [0, N / 2, N - 1] {
        let name = tree.join(format!("f{i}"));
        assert_eq!(w.count(|l| is(l, "CLOSE_WRITE", &name)), 1, "f{i}");
        assert_eq!(fs::read(&name).unwrap(), b"new content");
        assert_eq!(
            fs::read(h.join(format!("tree/f{i}"))).unwrap(),
            b"new content"
        );
    }
    assert!(
        w.count(|l| l.contains("Q_OVERFLOW")) == 0,
        "the watcher's queue overflowed"
    );
}

/// `--no-watch-events` turns replays off; invalidation still works.
#[test]
fn no_watch_events_turns_it_off() {
    require_mount!();
    require_inotifywait!();
    let t = TestMount::start_with(&[], &["--no-watch-events"]);
    let (h, g) = (&t.export, &t.mnt);
    let w = Watcher::inotifywait(g);
    fs::write(h.join("quiet"), b"q").unwrap();
    let start = Instant::now();
    while fs::metadata(g.join("quiet")).is_err() {
        assert!(start.elapsed() < DEADLINE, "host create not visible");
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(300));
    // (stat raises no events; only a replay could have.)
    assert_eq!(w.count(|l| l.contains("quiet")), 0);
    assert!(status(g).contains("host events: off"), "{}", status(g));
}

/// Replays never take write access to an executable: a guest running a script the host
/// keeps changing must never get ETXTBSY.
#[test]
fn replays_do_not_make_exec_fail() {
    require_mount!();
    require_inotifywait!();
    let t = TestMount::start();
    let (h, g) = (&t.export, &t.mnt);
    fs::write(h.join("run.sh"), b"#!/bin/sh\nexit 0\n").unwrap();
    fs::set_permissions(h.join("run.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    let w = Watcher::inotifywait(g);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let host = {
        let (path, stop) = (h.join("run.sh"), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let mut f = fs::OpenOptions::new().append(true).open(&path).unwrap();
                std::io::Write::write_all(&mut f, b"# more\n").unwrap();
                n += 1;
                std::thread::sleep(Duration::from_millis(2));
            }
            n
        })
    };
    let script = g.join("run.sh");
    let (mut runs, mut busy) = (0, 0);
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(2) {
        match Command::new(&script).status() {
            Ok(s) => assert!(s.success()),
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) => busy += 1,
            Err(e) => panic!("exec: {e}"),
        }
        runs += 1;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let appends = host.join().unwrap();
    assert!(appends > 10 && runs > 10, "{appends} appends, {runs} runs");
    assert_eq!(busy, 0, "{busy} of {runs} execs failed with ETXTBSY");
    // The watcher still heard the changes (as IN_MODIFY).
    assert!(w.count(|l| is(l, "MODIFY", &script)) > 0);
}

/// An inotify watch on each of `paths`, held through the mount for as long as the value
/// lives: a guest watcher without an external tool.
struct RawWatch {
    fd: std::os::fd::OwnedFd,
    wds: Vec<i32>,
    /// (watch index, mask) of every event read so far.
    seen: Mutex<Vec<(usize, u32)>>,
}

impl RawWatch {
    fn new(paths: &[&Path]) -> RawWatch {
        use std::os::fd::{AsRawFd, FromRawFd};
        use std::os::unix::ffi::OsStrExt;
        // SAFETY: inotify_init1 has no memory-safety preconditions.
        let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC | libc::IN_NONBLOCK) };
        assert!(
            fd >= 0,
            "inotify_init1: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: a fresh descriptor, owned from here on.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        let mut wds = Vec::new();
        for path in paths {
            let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
            // SAFETY: a valid descriptor and C string.
            let wd =
                unsafe { libc::inotify_add_watch(fd.as_raw_fd(), c.as_ptr(), libc::IN_ALL_EVENTS) };
            assert!(
                wd >= 0,
                "inotify_add_watch: {}",
                std::io::Error::last_os_error()
            );
            wds.push(wd);
        }
        RawWatch {
            fd,
            wds,
            seen: Mutex::new(Vec::new()),
        }
    }

    /// Reads events until one has `mask` on the watch of `paths[watch]`, for at most
    /// DEADLINE; returns every (watch index, mask) read so far.
    fn wait_for(&self, watch: usize, mask: u32) -> Vec<(usize, u32)> {
        use std::os::fd::AsRawFd;
        let mut seen = self.seen.lock().unwrap();
        let start = Instant::now();
        let mut buf = vec![0u8; 64 << 10];
        loop {
            // SAFETY: reading into our own buffer from our own descriptor.
            let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            let mut at = 0;
            while n > 0 && at + 16 <= n as usize {
                let wd = i32::from_ne_bytes(buf[at..at + 4].try_into().unwrap());
                let m = u32::from_ne_bytes(buf[at + 4..at + 8].try_into().unwrap());
                let len = u32::from_ne_bytes(buf[at + 12..at + 16].try_into().unwrap());
                let i = self.wds.iter().position(|w| *w == wd).unwrap_or(usize::MAX);
                seen.push((i, m));
                at += 16 + len as usize;
            }
            if seen.iter().any(|&(i, m)| i == watch && m & mask != 0) {
                return seen.clone();
            }
            assert!(
                start.elapsed() < DEADLINE,
                "no event {mask:#x} on watch {watch} within {DEADLINE:?}; read: {seen:x?}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Waits until the host's creation of a directory in the mount root has gone through the
/// replay thread (replayed, or not watched), which then applies its name invalidation:
/// that invalidation drops whatever the guest caches below the directory, so only what
/// the guest looks up after this stays cached until the host changes it.
fn settled_creation(mnt: &Path) {
    // Long: the replay thread's scan of every process may take seconds on a busy machine.
    const DEADLINE: Duration = Duration::from_secs(30);
    let start = Instant::now();
    while {
        let (replayed, unwatched, failed) = common::host_event_counts(mnt);
        replayed + unwatched + failed == 0
    } {
        assert!(start.elapsed() < DEADLINE, "{}", status(mnt));
        std::thread::sleep(Duration::from_millis(5));
    }
    // The names are applied right after the replay thread's pass over its backlog.
    let applied = || {
        let s = status(mnt);
        let n = s
            .lines()
            .find_map(|l| l.strip_prefix("invalidations applied: "));
        n.unwrap_or_else(|| panic!("no invalidation count in: {s}"))
            .parse::<u64>()
            .unwrap()
    };
    let mut last = applied();
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let now = applied();
        if now == last {
            return;
        }
        assert!(start.elapsed() < DEADLINE, "{}", status(mnt));
        last = now;
    }
}

/// Waits until `n` host events have been replayed or have failed; returns both counts.
fn replays_done(mnt: &Path, n: u64, within: Duration) -> (u64, u64) {
    let start = Instant::now();
    loop {
        let (replayed, _, failed) = common::host_event_counts(mnt);
        if replayed + failed >= n {
            return (replayed, failed);
        }
        assert!(
            start.elapsed() < within,
            "replays not done: {}",
            status(mnt)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Replays run late: a burst of host changes keeps the replay thread busy while the
/// guest, whose names were revoked meanwhile, already sees (and caches) the host's newer
/// state. A late replay of `p -> r` then found the guest's current `p`, which is another
/// file (`q`'s, moved there after), and moved that dentry to `r` with a long TTL: `r` showed
/// and took writes for the wrong file (tether-fsx: "a guest write to f4 landed in f3").
/// Replays must leave every name as the host has it.
#[test]
fn late_replays_never_bind_a_name_to_another_file() {
    require_mount!();
    let t = TestMount::start();
    let (h, g) = (&t.export, &t.mnt);
    fs::create_dir(h.join("w")).unwrap();
    fs::write(h.join("w/p"), b"file P").unwrap();
    fs::write(h.join("w/q"), b"file Q").unwrap();
    fs::write(h.join("w/gone"), b"removed on the host").unwrap();
    // Cached in the guest, and left alone until the host changes them.
    settled_creation(g);
    for name in ["p", "q", "gone"] {
        assert!(fs::read(g.join("w").join(name)).is_ok());
    }
    // A burst of host changes that are cheap for the host and the server but slow to
    // replay (each replay opens the directory one component at a time, 400 deep): it
    // keeps the replay thread busy for a second or more. Its files are made before the
    // guest first lists their directory, so that nothing about them is reported before.
    const BURST: usize = 3000;
    let deep = (0..400).fold(std::path::PathBuf::from("w"), |p, _| p.join("d"));
    fs::create_dir_all(h.join(&deep)).unwrap();
    for i in 0..BURST {
        fs::File::create(h.join(&deep).join(format!("b{i}"))).unwrap();
    }
    assert_eq!(fs::read_dir(g.join(&deep)).unwrap().count(), BURST);
    let _watch = RawWatch::new(&[&g.join("w"), &g.join(&deep)]);
    let then = UNIX_EPOCH + Duration::from_secs(1_000_000_000);
    for i in 0..BURST {
        fs::File::open(h.join(&deep).join(format!("b{i}")))
            .unwrap()
            .set_times(fs::FileTimes::new().set_accessed(then).set_modified(then))
            .unwrap();
    }
    // Then, on the host: p -> r, q -> p, and a file removed.
    let ino = |p: &Path| fs::symlink_metadata(p).unwrap().ino();
    fs::rename(h.join("w/p"), h.join("w/r")).unwrap();
    fs::rename(h.join("w/q"), h.join("w/p")).unwrap();
    fs::remove_file(h.join("w/gone")).unwrap();
    let (ino_p, ino_r) = (ino(&h.join("w/p")), ino(&h.join("w/r")));
    // The guest sees the new names once their invalidations are applied (at most 200 ms
    // after the push, replays or not), and caches what it looks up after that.
    let start = Instant::now();
    while fs::symlink_metadata(g.join("w/p")).map(|m| m.ino()).ok() != Some(ino_p)
        || fs::symlink_metadata(g.join("w/gone")).is_ok()
    {
        assert!(
            start.elapsed() < DEADLINE,
            "the guest never saw the renames"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let seen_after = start.elapsed();
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(fs::read(g.join("w/p")).unwrap(), b"file Q");
    assert_eq!(fs::read(g.join("w/r")).unwrap(), b"file P");
    assert!(fs::symlink_metadata(g.join("w/q")).is_err());
    let (replayed, _, _) = common::host_event_counts(g);
    eprintln!(
        "the guest saw the renames {seen_after:?} after the host made them; {replayed} of {} \
         replayed when it looked the names up",
        BURST + 3
    );
    assert!(
        (replayed as usize) < BURST,
        "the replays were done before the guest looked the new names up ({replayed} \
         replayed): this test needs them late"
    );
    // Every touch, both renames and the removal.
    let (replayed, failed) = replays_done(g, BURST as u64 + 3, Duration::from_secs(120));
    eprintln!("{replayed} replayed, {failed} failed");
    // Every name as the host has it: the same file, the same content, no name the host
    // removed, and a write through a name reaches that name's file on the host.
    for name in ["p", "r"] {
        let (gp, hp) = (g.join("w").join(name), h.join("w").join(name));
        assert_eq!(ino(&gp), ino(&hp), "{name}: another file");
        assert_eq!(fs::read(&gp).unwrap(), fs::read(&hp).unwrap(), "{name}");
    }
    assert_eq!((ino(&g.join("w/p")), ino(&g.join("w/r"))), (ino_p, ino_r));
    for name in ["q", "gone"] {
        let err = fs::symlink_metadata(g.join("w").join(name)).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOENT), "{name} came back");
    }
    fs::write(g.join("w/r"), b"written through r").unwrap();
    assert_eq!(fs::read(h.join("w/r")).unwrap(), b"written through r");
    assert_eq!(fs::read(h.join("w/p")).unwrap(), b"file Q");
    let mut host: Vec<_> = fs::read_dir(h.join("w"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    let mut guest: Vec<_> = fs::read_dir(g.join("w"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    host.sort();
    guest.sort();
    assert_eq!(guest, host);
}

/// A watch on a file the host removes hears it go (IN_DELETE_SELF), besides the watch on
/// its directory (IN_DELETE): the replayed removal acts on that very file when the guest
/// caches it and the host confirms it is gone, not on a stand-in.
#[test]
fn a_watch_on_a_file_the_host_removes_hears_it_go() {
    require_mount!();
    let t = TestMount::start();
    let (h, g) = (&t.export, &t.mnt);
    fs::create_dir(h.join("w")).unwrap();
    fs::write(h.join("w/z"), b"soon gone").unwrap();
    settled_creation(g);
    assert_eq!(fs::read(g.join("w/z")).unwrap(), b"soon gone");
    let watch = RawWatch::new(&[&g.join("w"), &g.join("w/z")]);
    fs::remove_file(h.join("w/z")).unwrap();
    watch.wait_for(0, libc::IN_DELETE);
    let seen = watch.wait_for(1, libc::IN_DELETE_SELF);
    assert!(
        seen.iter()
            .any(|&(i, m)| i == 1 && m & libc::IN_ATTRIB != 0),
        "{seen:x?}"
    );
    let err = fs::symlink_metadata(g.join("w/z")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOENT));
}

/// A host chmod is another process's change, but not a write: it must not leave the file
/// marked "being written by someone else until closed". Else the guest's own write and
/// close of that file later (or of a new file given its inode number once the host
/// deleted it) came back to the guest's watchers as a second, replayed CLOSE_WRITE.
#[test]
fn a_guests_own_write_after_a_host_chmod_is_heard_once() {
    require_mount!();
    require_inotifywait!();
    let t = TestMount::start();
    let (h, g) = (&t.export, &t.mnt);
    let w = Watcher::inotifywait(g);
    let f = g.join("c");
    fs::write(h.join("c"), b"host").unwrap();
    w.wait_for("the host's close", |l| is(l, "CLOSE_WRITE", &f));
    fs::set_permissions(h.join("c"), fs::Permissions::from_mode(0o600)).unwrap();
    w.wait_for("the host's chmod", |l| is(l, "ATTRIB", &f));
    let start = Instant::now();
    while fs::metadata(&f).unwrap().mode() & 0o777 != 0o600 {
        assert!(
            start.elapsed() < DEADLINE,
            "the chmod is not seen in the guest"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let closes_before = w.count(|l| is(l, "CLOSE_WRITE", &f));
    fs::write(&f, b"the guest's own").unwrap();
    w.wait_for_n("the guest's close", closes_before + 1, &|l| {
        is(l, "CLOSE_WRITE", &f)
    });
    // Long past the watcher's latency: a replayed close would be here by now.
    std::thread::sleep(Duration::from_millis(500));
    let closes = w.count(|l| is(l, "CLOSE_WRITE", &f)) - closes_before;
    assert_eq!(closes, 1, "the guest's own close, heard {closes} times");
    assert_eq!(fs::read(h.join("c")).unwrap(), b"the guest's own");
}
