//! `tether sync MOUNTPOINT`, the freshness barrier: after it returns, every change made on
//! the host (or through another mount) before it started is visible through the mount.
//! Without it a host change shows a few milliseconds later, so reading right after each
//! change is stale nearly every time unless the barrier holds.

mod common;

use std::fs;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{status, Mount, TestMount, TETHER};

/// Far longer than the test: nothing may become visible by a timeout.
const NO_TIMEOUT: &[&str] = &["--attr-timeout", "3600"];

/// Rounds of change, sync, read (TETHER_SYNC_ROUNDS to change).
fn rounds() -> u32 {
    std::env::var("TETHER_SYNC_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}

/// The file's content in round `r`: the same size every round.
fn content(r: u32) -> String {
    format!("round {r:08}\n")
}

fn exists(p: &Path) -> bool {
    fs::symlink_metadata(p).is_ok()
}

/// An inotify watch on a directory of the mount, drained every round: a guest watcher, so
/// that the host events behind each push are replayed (and the name invalidations wait for
/// those replays, which the barrier must wait for too).
struct GuestWatch(std::os::fd::OwnedFd);

impl GuestWatch {
    fn new(dir: &Path) -> GuestWatch {
        use std::os::fd::FromRawFd;
        use std::os::unix::ffi::OsStrExt;
        // SAFETY: no preconditions; the descriptor is owned below.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        assert!(
            fd >= 0,
            "inotify_init1: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: a fresh descriptor.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).unwrap();
        // SAFETY: valid descriptor and C string.
        let wd = unsafe {
            libc::inotify_add_watch(
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                path.as_ptr(),
                libc::IN_ALL_EVENTS,
            )
        };
        assert!(
            wd >= 0,
            "inotify_add_watch: {}",
            std::io::Error::last_os_error()
        );
        GuestWatch(fd)
    }

    fn drain(&self) {
        let mut buf = [0u8; 16384];
        // SAFETY: buf is writable for its length.
        while unsafe {
            libc::read(
                std::os::fd::AsRawFd::as_raw_fd(&self.0),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        } > 0
        {}
    }
}

/// What the mount showed stale right after a sync, by kind, with the first few rounds.
#[derive(Default)]
struct Stale {
    content: Vec<String>,
    names: Vec<String>,
}

impl Stale {
    fn check(&self, rounds: u32) {
        let first = |v: &Vec<String>| v.iter().take(5).cloned().collect::<Vec<_>>().join("; ");
        assert!(
            self.content.is_empty() && self.names.is_empty(),
            "stale after sync in {} of {rounds} rounds (content) and {} (names); first: {} | {}",
            self.content.len(),
            self.names.len(),
            first(&self.content),
            first(&self.names),
        );
    }
}

/// Each round the host rewrites a file in place (same size, new content) and renames
/// another from `name-{r-1}` to `name-{r}`; then `sync`; then the guest reads the file and
/// looks up both names, which it had cached (the old name present, the new one missing)
/// the round before. Nothing may be stale.
fn host_changes_are_visible_right_after_sync(mount_args: &[&str], watch_in_guest: bool) {
    let t = TestMount::start_with(&[], mount_args);
    let (host, guest) = (t.export.join("f"), t.mnt.join("f"));
    fs::write(&host, content(0)).unwrap();
    fs::write(t.export.join("name-0"), b"").unwrap();
    // The guest caches the starting state (and the server watches what it holds).
    tether_client::sync::sync(&t.mnt).unwrap();
    assert_eq!(fs::read_to_string(&guest).unwrap(), content(0));
    assert!(exists(&t.mnt.join("name-0")) && !exists(&t.mnt.join("name-1")));
    let watch = watch_in_guest.then(|| GuestWatch::new(&t.mnt));
    let writer = fs::OpenOptions::new().write(true).open(&host).unwrap();
    let rounds = rounds();
    let mut stale = Stale::default();
    let mut slowest = Duration::ZERO;
    for r in 1..=rounds {
        // In place: a truncating write would show an empty file for a moment.
        writer.write_all_at(content(r).as_bytes(), 0).unwrap();
        let (old, new) = (format!("name-{}", r - 1), format!("name-{r}"));
        fs::rename(t.export.join(&old), t.export.join(&new)).unwrap();
        let start = Instant::now();
        tether_client::sync::sync(&t.mnt).unwrap();
        slowest = slowest.max(start.elapsed());
        let got = fs::read_to_string(&guest).unwrap();
        if got != content(r) {
            stale.content.push(format!("round {r}: read {got:?}"));
        }
        let (shows_new, shows_old) = (exists(&t.mnt.join(&new)), exists(&t.mnt.join(&old)));
        if !shows_new || shows_old {
            stale.names.push(format!(
                "round {r}: {new} {}, {old} {}",
                if shows_new { "found" } else { "missing" },
                if shows_old { "still there" } else { "gone" },
            ));
        }
        // Cached as missing for the next round.
        assert!(!exists(&t.mnt.join(format!("name-{}", r + 1))));
        if let Some(w) = &watch {
            w.drain();
        }
    }
    eprintln!("{rounds} rounds; slowest sync {slowest:?}");
    stale.check(rounds);
}

#[test]
fn host_changes_are_visible_right_after_sync_with_guest_watchers() {
    require_mount!();
    host_changes_are_visible_right_after_sync(NO_TIMEOUT, true);
}

#[test]
fn host_changes_are_visible_right_after_sync_without_watch_events() {
    require_mount!();
    host_changes_are_visible_right_after_sync(
        &["--attr-timeout", "3600", "--no-watch-events"],
        false,
    );
}

/// A change written through a second mount of the same export is a host change to the
/// first: after a sync there it is visible.
#[test]
fn changes_through_another_mount_are_visible_right_after_sync() {
    require_mount!();
    let t = TestMount::start_with(&[], NO_TIMEOUT);
    let other = t.dir.path().join("other");
    fs::create_dir(&other).unwrap();
    let _b = Mount::start(&t.server.address, &other, NO_TIMEOUT);
    fs::write(t.export.join("f"), content(0)).unwrap();
    tether_client::sync::sync(&t.mnt).unwrap();
    assert_eq!(fs::read_to_string(t.mnt.join("f")).unwrap(), content(0));
    let rounds = rounds() / 5;
    let mut stale = Stale::default();
    for r in 1..=rounds {
        // On the host when close() returns (a write() may be answered before).
        fs::write(other.join("f"), content(r)).unwrap();
        tether_client::sync::sync(&t.mnt).unwrap();
        let got = fs::read_to_string(t.mnt.join("f")).unwrap();
        if got != content(r) {
            stale.content.push(format!("round {r}: read {got:?}"));
        }
    }
    stale.check(rounds);
}

/// The command: exits 0 and says how long it took, also given a directory inside the mount;
/// `tether status` still answers, also a client of an earlier version that sends no
/// request line.
#[test]
fn the_command_syncs_and_the_status_socket_still_reports() {
    require_mount!();
    let t = TestMount::start_with(&[], NO_TIMEOUT);
    fs::write(t.export.join("f"), b"one\n").unwrap();
    assert_eq!(fs::read(t.mnt.join("f")).unwrap(), b"one\n");
    fs::write(t.export.join("f"), b"two\n").unwrap();
    let out = Command::new(TETHER)
        .arg("sync")
        .arg(&t.mnt)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "tether sync failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.starts_with("synced "), "{stdout}");
    assert_eq!(fs::read(t.mnt.join("f")).unwrap(), b"two\n");
    let quiet = Command::new(TETHER)
        .args(["sync", "--quiet"])
        .arg(&t.mnt)
        .output()
        .unwrap();
    assert!(quiet.status.success() && quiet.stdout.is_empty());
    // A directory inside the mount names its mount.
    fs::create_dir(t.export.join("d")).unwrap();
    let inside = Command::new(TETHER)
        .arg("sync")
        .arg(t.mnt.join("d"))
        .output()
        .unwrap();
    assert!(
        inside.status.success(),
        "tether sync MNT/d failed: {}",
        String::from_utf8_lossy(&inside.stderr)
    );
    assert!(status(&t.mnt).starts_with("mount: "));
    // An earlier `tether status` connects and reads, writing nothing.
    use std::io::Read;
    let socket = tether_client::status::socket_path(&t.mnt);
    let mut s = std::os::unix::net::UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut report = String::new();
    s.read_to_string(&mut report).unwrap();
    assert!(report.starts_with("mount: "), "{report}");
}

/// A mount without pushed invalidations revalidates on a timer: sync refuses, saying so.
#[test]
fn a_mount_without_pushes_refuses_to_sync() {
    require_mount!();
    let t = TestMount::start_with(&[], &["--no-push"]);
    let out = Command::new(TETHER)
        .arg("sync")
        .arg(&t.mnt)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "sync succeeded on a --no-push mount");
    assert!(
        stderr.contains("--no-push") && stderr.contains("cannot promise"),
        "{stderr}"
    );
    let e = tether_client::sync::sync(&t.mnt).unwrap_err();
    assert!(e.to_string().contains("revalidates on a timer"), "{e}");
}
