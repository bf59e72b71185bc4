//! Name invalidations with host events on (the default): they wait for the replays of
//! their batch of host events (invalidate/host_events.rs), at most 200 ms, whatever the replay thread
//! is doing. In a test binary of its own: it slows down every scan for guest watchers on
//! the machine for a few seconds, which would upset the timing of the other watcher tests.

mod common;

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{status, TestMount};

/// Waits until the host's creation of a directory in the mount root has gone through the
/// replay thread and its name invalidation has been applied (see watch_events.rs).
fn settled_creation(mnt: &Path) {
    let start = Instant::now();
    let within = Duration::from_secs(30);
    while {
        let (replayed, unwatched, failed) = common::host_event_counts(mnt);
        replayed + unwatched + failed == 0
    } {
        assert!(start.elapsed() < within, "{}", status(mnt));
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(300));
}

/// Processes holding `n` descriptors (of /dev/null) between them: every scan of guest
/// watchers reads all of them, so they make each scan slow, as a machine full of busy
/// processes does.
struct ManyDescriptors(Vec<libc::pid_t>);

impl ManyDescriptors {
    /// More helpers, until reading their descriptors takes at least `at_least` (or they
    /// hold `most` descriptors); returns that time.
    fn grow(&mut self, at_least: Duration, most: u64) -> Duration {
        let mut held = 0;
        loop {
            let mut more = ManyDescriptors::start(200_000);
            held += 200_000;
            self.0.append(&mut more.0);
            let cost = (0..2).map(|_| self.read_cost()).max().unwrap();
            if cost >= at_least || held >= most {
                return cost;
            }
        }
    }

    fn start(n: u64) -> ManyDescriptors {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: a valid out pointer.
        unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
        let each = lim.rlim_max.min(1 << 20).saturating_sub(64).max(1);
        let mut hogs = ManyDescriptors(Vec::new());
        let mut left = n;
        let mut counts = Vec::new();
        while left > 0 {
            let k = left.min(each);
            hogs.0.push(Self::fork_one(k));
            counts.push(k);
            left -= k;
        }
        let start = Instant::now();
        for (pid, k) in hogs.0.iter().zip(counts) {
            let dir = format!("/proc/{pid}/fd");
            while fs::read_dir(&dir).map(|d| d.count() as u64).unwrap_or(0) < k {
                assert!(
                    start.elapsed() < Duration::from_secs(60),
                    "descriptors not opened"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        hogs
    }

    fn fork_one(n: u64) -> libc::pid_t {
        // SAFETY: the child only makes async-signal-safe system calls, then waits to be
        // killed; it never returns into the (multi-threaded) test harness.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            // SAFETY: plain system calls on the child's own descriptors and limits.
            unsafe {
                // Nothing of the parent's (another test's pipe kept open would hang it).
                libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
                let mut lim = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: 0,
                };
                libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
                lim.rlim_cur = lim.rlim_max;
                libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
                let fd = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY);
                for _ in 1..n {
                    if libc::dup(fd) < 0 {
                        break;
                    }
                }
                loop {
                    libc::pause();
                }
            }
        }
        pid
    }

    /// How long reading their descriptors takes (about what a scan pays for them).
    fn read_cost(&self) -> Duration {
        let start = Instant::now();
        for pid in &self.0 {
            for e in fs::read_dir(format!("/proc/{pid}/fd")).unwrap().flatten() {
                let _ = fs::read_link(e.path());
            }
        }
        start.elapsed()
    }
}

impl Drop for ManyDescriptors {
    fn drop(&mut self) {
        for &pid in &self.0 {
            // SAFETY: our own child, not yet reaped.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
        }
    }
}

/// Name invalidations wait for the replays of their batch of host events, at most 200 ms.
/// Before each batch the replay thread scans every process's descriptors for guest
/// watchers, and the names waited for that scan too, however long it took: on a machine
/// with many busy processes (a stress test, 70,000 descriptors) it took seconds, and a
/// name the host had renamed still showed in the guest 2 s later while the listing was
/// already right (tether-fsx, with nobody watching). The bound must hold whatever the
/// replay thread is doing.
#[test]
fn a_slow_scan_for_guest_watchers_does_not_delay_host_renames() {
    require_mount!();
    let t = TestMount::start();
    let (h, g) = (&t.export, &t.mnt);
    fs::create_dir(h.join("w")).unwrap();
    fs::write(h.join("w/x"), b"x").unwrap();
    settled_creation(g);
    assert_eq!(fs::read(g.join("w/x")).unwrap(), b"x");
    let mut hog = ManyDescriptors(Vec::new());
    let cost = hog.grow(Duration::from_secs(1), 2_000_000);
    eprintln!("reading the descriptors of the helpers takes {cost:?}");
    if cost < Duration::from_secs(1) {
        common::skip_anywhere("a scan is not slow enough here to tell");
        return;
    }
    fs::rename(h.join("w/x"), h.join("w/y")).unwrap();
    let start = Instant::now();
    while fs::symlink_metadata(g.join("w/x")).is_ok() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the host's rename never showed"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    let seen = start.elapsed();
    eprintln!("the host's rename showed after {seen:?}");
    assert_eq!(fs::read(g.join("w/y")).unwrap(), b"x");
    assert!(
        seen < cost / 2,
        "the host's rename showed only after {seen:?}: it waited for the scan of guest \
         watchers ({cost:?} for the helpers' descriptors)"
    );
}
