//! Directory listings ahead of LOOKUPs.
//!
//! A cold walk by known paths (a `stat` of every file of a tree, a build opening its
//! sources) makes the kernel send one LOOKUP per name, and each is a round trip through
//! the FUSE device, even when the client could answer it itself. After a second LOOKUP
//! that the kernel could not answer in the same directory within [`MISS_WINDOW`], a thread
//! of the client lists that directory through the mount (getdents, up to
//! [`LISTED_AT_MOST`] entries). The kernel asks READDIRPLUS for it and puts every entry of
//! the replies into its dentry cache, so the rest of the walk finds its names there
//! without any request.
//!
//! A walk in sorted order (git's index, tar, `cp -r`, a build's file list) goes on to the
//! directories after that one in sorted depth-first order, so the listers then list a few
//! of those ahead of it ([`Plan`], from the subdirectories their listings showed): four at
//! first, twice as many each time the walk misses where the last plan led, up to
//! [`AHEAD_MOST`], as readahead grows for a sequential read. A miss elsewhere starts a new
//! plan of four. A directory whose own listing is not in yet is passed for its siblings,
//! so that the listers never wait for each other; a walk that then goes into it misses
//! there and starts a plan of its own.
//!
//! [`LISTERS`] threads list, so that while the kernel makes one directory's entries into
//! dentries (in the lister's `getdents`) the server already reads the next directory.
//!
//! Coherence: these are ordinary READDIRPLUS replies, cached and revoked like those of an
//! `ls` in the guest (cache/coherence.rs); the kernel counts and forgets their lookups itself.
//! Guest watchers of the directory see it opened and closed.
//!
//! The directory is opened by its path, rebuilt from where the kernel was given each node
//! ([`Known::path_of`]); a rename racing that lists another directory or none, which only
//! wastes the listing.

use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::OsString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use tether_proto::NodeId;

use crate::cache::coherence::Coherence;
use crate::known::Known;
use crate::sys::mount_dir::MountDir;

/// Two LOOKUPs missing in one directory within this window start a listing.
const MISS_WINDOW: Duration = Duration::from_millis(500);
/// A directory listed is not listed again before this (the kernel keeps what it got).
const LISTED_FOR: Duration = Duration::from_secs(2);
/// Entries listed per directory at most: a lookup in a huge directory must not fetch it all.
const LISTED_AT_MOST: usize = 4096;
/// Threads listing at once. Two overlap the server's work on one directory with the
/// client's and the kernel's on another: `tether bench`'s cold `stat` of 100 directories
/// of 100 files took 0.23 s with one and 0.17 s with two (bench/journal/2026-11-25-cold-walk-listers-race.md).
const LISTERS: usize = 2;
/// Directories waiting for a lister, of each kind; one a walk missed in that finds the
/// queue full is tried again at its next misses.
const QUEUED_AT_MOST: usize = 256;
/// Directories listed ahead of a walk after one it missed in, at first.
const AHEAD_FIRST: usize = 4;
/// Directories listed ahead at most, after misses where each plan led.
const AHEAD_MOST: usize = 64;
/// Entries listed per directory the walk has not reached: guesses fetch less.
const AHEAD_AT_MOST: usize = 1024;
/// Directories remembered as listed ahead; more and the stale ones are dropped.
const REMEMBERED_AT_MOST: usize = 4096;

/// Per directory the kernel holds and looked up in (removed when it forgets it).
struct DirState {
    window_start: Instant,
    misses: u32,
    /// Listed (or queued) until then: not listed again before.
    listed_until: Option<Instant>,
}

pub struct Prefetch {
    co: Arc<Coherence>,
    dirs: DashMap<NodeId, DirState>,
    listers: Arc<Listers>,
    /// Set by [`Prefetch::start`]; until then nothing is listed.
    started: OnceLock<()>,
}

impl Prefetch {
    pub fn new(co: Arc<Coherence>) -> Arc<Prefetch> {
        Arc::new(Prefetch {
            co,
            dirs: DashMap::new(),
            listers: Arc::new(Listers::default()),
            started: OnceLock::new(),
        })
    }

    /// Starts the threads that list directories through the mount at `dir`, finding them
    /// by the places in `known`; they end when the mount is gone.
    pub fn start(self: &Arc<Self>, dir: Arc<MountDir>, known: Arc<Known>) {
        if self.started.set(()).is_err() {
            return;
        }
        for _ in 0..LISTERS {
            let (listers, dir, known, co) = (
                self.listers.clone(),
                dir.clone(),
                known.clone(),
                self.co.clone(),
            );
            let spawned = std::thread::Builder::new()
                .name("tether-prefetch".into())
                .spawn(move || list_loop(&listers, &dir, &known, &co));
            if let Err(e) = spawned {
                tracing::warn!("no thread to list directories ahead of lookups: {e}");
            }
        }
    }

    /// A LOOKUP in `dir` goes to the server: the second within [`MISS_WINDOW`] lists `dir`.
    pub fn missed(&self, dir: NodeId) {
        if self.started.get().is_none() || !self.co.enabled() {
            return;
        }
        let now = Instant::now();
        let list = {
            let mut st = self.dirs.entry(dir).or_insert(DirState {
                window_start: now,
                misses: 0,
                listed_until: None,
            });
            if st.listed_until.is_some_and(|t| now < t) {
                false
            } else {
                if now.duration_since(st.window_start) > MISS_WINDOW {
                    st.window_start = now;
                    st.misses = 0;
                }
                st.misses += 1;
                if st.misses >= 2 {
                    st.listed_until = Some(now + LISTED_FOR);
                    st.misses = 0;
                }
                st.misses == 0
            }
        };
        if list && !self.listers.missed(dir) {
            // Not listed: the next misses may try again.
            if let Some(mut st) = self.dirs.get_mut(&dir) {
                st.listed_until = None;
            }
        }
    }

    /// The kernel forgot `node`, last seen in `parent`: what it listed there may be gone
    /// from its cache (memory pressure, drop_caches), so `parent` may be listed again.
    pub fn forgotten(&self, node: NodeId, parent: Option<NodeId>) {
        self.dirs.remove(&node);
        if let Some(mut d) = parent.and_then(|p| self.dirs.get_mut(&p)) {
            if d.listed_until.take().is_some() {
                self.listers.forgot();
            }
        }
    }
}

impl Drop for Prefetch {
    fn drop(&mut self) {
        self.listers.close();
    }
}

/// What a lister does next.
enum Job {
    /// List a directory a walk missed names in, and plan what follows it.
    Missed(NodeId),
    /// List a directory the walk has not reached yet.
    Ahead(PathBuf),
}

/// A directory listed (or being listed) ahead of a walk, by path.
struct Listed {
    at: Instant,
    /// [`Listers::forgets`] then: if the kernel forgot names since, they may be gone.
    forgets: u64,
    /// Its subdirectories, sorted; None while it is being listed.
    subdirs: Option<Arc<Vec<OsString>>>,
}

impl Listed {
    /// Listed within [`LISTED_FOR`], and the kernel forgot no listed name since.
    fn fresh(&self, forgets: u64) -> bool {
        self.forgets == forgets && self.at.elapsed() < LISTED_FOR
    }
}

/// Directories to list ahead of a walk, in sorted order after the one it last missed in
/// (depth first where listings showed subdirectories): the order of git's index, of tar
/// and `cp -r`, of most file lists.
struct Plan {
    /// The directory planned last; the next one follows it in that order.
    cursor: PathBuf,
    /// Directories still to list.
    left: usize,
    /// Steps through directories already listed, still allowed (a walk through a tree
    /// listed lately must not hold the lock for long).
    steps: usize,
    /// Directories it reached; a miss in one means the walk goes this way.
    planned: HashSet<PathBuf>,
    /// How many directories it was to list.
    window: usize,
}

impl Plan {
    /// Whether a walk that missed in `dir` went the way this plan led: into a directory
    /// it reached, or just past them (a later sibling of the last one).
    fn leads_to(&self, dir: &Path) -> bool {
        self.planned.contains(dir)
            || dir
                .parent()
                .is_some_and(|p| self.planned.contains(p) || Some(p) == self.cursor.parent())
    }
}

/// Where a plan goes next.
enum Next {
    Dir(PathBuf),
    /// `.0` must be listed first, to know its subdirectories.
    List(PathBuf),
    /// Another lister is listing what the next step needs.
    Wait,
    End,
}

#[derive(Default)]
struct Jobs {
    /// Directories a walk waits for, first.
    missed: VecDeque<NodeId>,
    /// The plan after the last miss, kept when done to tell whether the next miss follows.
    plan: Option<Plan>,
    closed: bool,
    recent: HashMap<PathBuf, Listed>,
}

impl Jobs {
    fn fresh(&self, path: &Path, forgets: u64) -> Option<&Listed> {
        self.recent.get(path).filter(|l| l.fresh(forgets))
    }

    /// Records `path` as being listed now.
    fn claim(&mut self, path: &Path, forgets: u64) {
        if self.recent.len() >= REMEMBERED_AT_MOST {
            self.recent.retain(|_, l| l.fresh(forgets));
        }
        let listed = Listed {
            at: Instant::now(),
            forgets,
            subdirs: None,
        };
        self.recent.insert(path.to_path_buf(), listed);
    }

    /// The directory after `from` in sorted order, from what listings said: its first
    /// subdirectory if its listing is in, else its next sibling (or its parent's...).
    fn after(&self, from: &Path, forgets: u64) -> Next {
        let subdirs = |p: &Path| match self.fresh(p, forgets) {
            None => Err(Next::List(p.to_path_buf())),
            Some(Listed { subdirs: None, .. }) => Err(Next::Wait),
            Some(Listed {
                subdirs: Some(s), ..
            }) => Ok(s.clone()),
        };
        // Into `from` if its listing showed subdirectories; if it is not listed yet, on to
        // its siblings rather than wait: most directories have none, and waiting for each
        // would list one directory at a time.
        if let Ok(s) = subdirs(from) {
            if let Some(first) = s.first() {
                return Next::Dir(from.join(first));
            }
        }
        let mut cur = from;
        loop {
            let (Some(parent), Some(name)) = (cur.parent(), cur.file_name()) else {
                return Next::End;
            };
            if parent.as_os_str().is_empty() {
                return Next::End;
            }
            let s = match subdirs(parent) {
                Err(next) => return next,
                Ok(s) => s,
            };
            let i = s.partition_point(|n| n.as_os_str() <= name);
            if let Some(n) = s.get(i) {
                return Next::Dir(parent.join(n));
            }
            cur = parent;
        }
    }

    /// The next directory the plan lists, or why none now.
    fn plan_next(&mut self, forgets: u64) -> Option<Next> {
        loop {
            let plan = self.plan.as_ref()?;
            if plan.left == 0 || plan.steps == 0 {
                return None;
            }
            let next = self.after(&plan.cursor, forgets);
            let plan = self.plan.as_mut()?;
            plan.steps -= 1;
            match next {
                Next::Dir(d) => {
                    plan.cursor = d.clone();
                    plan.planned.insert(d.clone());
                    if self.fresh(&d, forgets).is_none() {
                        self.plan.as_mut()?.left -= 1;
                        return Some(Next::Dir(d));
                    }
                }
                Next::List(d) => {
                    plan.left -= 1;
                    return Some(Next::List(d));
                }
                Next::Wait => return Some(Next::Wait),
                Next::End => {
                    plan.left = 0;
                    return None;
                }
            }
        }
    }
}

/// The listers' shared work.
#[derive(Default)]
struct Listers {
    jobs: Mutex<Jobs>,
    wake: Condvar,
    /// Bumped whenever the kernel forgets a name in a directory listed ahead.
    forgets: AtomicU64,
}

impl Listers {
    fn lock(&self) -> std::sync::MutexGuard<'_, Jobs> {
        self.jobs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues a directory a walk missed in; false if the queue is full.
    fn missed(&self, dir: NodeId) -> bool {
        let mut jobs = self.lock();
        if jobs.missed.len() >= QUEUED_AT_MOST {
            return false;
        }
        jobs.missed.push_back(dir);
        self.wake.notify_all();
        true
    }

    fn forgot(&self) {
        self.forgets.fetch_add(1, Ordering::Relaxed);
    }

    fn close(&self) {
        self.lock().closed = true;
        self.wake.notify_all();
    }

    /// The next job, missed directories first; None once the mount is gone.
    fn next(&self) -> Option<Job> {
        let mut jobs = self.lock();
        loop {
            if jobs.closed {
                return None;
            }
            if let Some(dir) = jobs.missed.pop_front() {
                return Some(Job::Missed(dir));
            }
            let forgets = self.forgets.load(Ordering::Relaxed);
            match jobs.plan_next(forgets) {
                Some(Next::Dir(d) | Next::List(d)) => {
                    jobs.claim(&d, forgets);
                    return Some(Job::Ahead(d));
                }
                // Woken when that listing is in.
                Some(Next::Wait) | None | Some(Next::End) => {}
            }
            jobs = self.wake.wait(jobs).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// A walk missed names in `path`, which is listed now: plan the directories after it,
    /// more of them if the walk went where the last plan led.
    fn walked_into(&self, path: &Path) {
        let forgets = self.forgets.load(Ordering::Relaxed);
        let mut jobs = self.lock();
        let window = match &jobs.plan {
            Some(p) if p.leads_to(path) => (p.window * 2).min(AHEAD_MOST),
            _ => AHEAD_FIRST,
        };
        jobs.claim(path, forgets);
        let planned = HashSet::from([path.to_path_buf()]);
        jobs.plan = Some(Plan {
            cursor: path.to_path_buf(),
            left: window,
            steps: window * 8,
            planned,
            window,
        });
    }

    /// `path` was listed (or could not be): wake listers waiting for its subdirectories.
    fn listed(&self, path: &Path, subdirs: Vec<OsString>) {
        if let Some(l) = self.lock().recent.get_mut(path) {
            l.subdirs = Some(Arc::new(subdirs));
        }
        self.wake.notify_all();
    }
}

/// Runs the listers' jobs until the mount is gone.
fn list_loop(listers: &Listers, mount: &MountDir, known: &Known, co: &Coherence) {
    let list_at = |path: &Path, at_most: usize| {
        let listing = |root: BorrowedFd<'_>| {
            let c = &co.counters;
            let now = c.listing_now.fetch_add(1, Ordering::Relaxed) + 1;
            c.listing_most.fetch_max(now, Ordering::Relaxed);
            let listed = list(root, path.as_os_str().as_bytes(), at_most);
            c.listing_now.fetch_sub(1, Ordering::Relaxed);
            listed
        };
        let subdirs = match mount.with_path(listing) {
            Some(Ok((n, subdirs))) => {
                co.counters.listed.fetch_add(n as u64, Ordering::Relaxed);
                subdirs
            }
            Some(Err(e)) => {
                tracing::debug!("listing {} ahead failed: {e}", path.display());
                Vec::new()
            }
            None => Vec::new(), // paused or gone
        };
        listers.listed(path, subdirs);
    };
    while let Some(job) = listers.next() {
        match job {
            Job::Missed(dir) => {
                if let Some(path) = known.path_of(dir) {
                    // Listed even if listed ahead lately: its misses say the kernel lacks
                    // names there.
                    listers.walked_into(&path);
                    list_at(&path, LISTED_AT_MOST);
                }
            }
            Job::Ahead(path) => list_at(&path, AHEAD_AT_MOST),
        }
    }
}

/// Reads up to `at_most` entries of the directory at `path` below `root`: how many, and
/// the names of its subdirectories, sorted.
fn list(root: BorrowedFd<'_>, path: &[u8], at_most: usize) -> io::Result<(usize, Vec<OsString>)> {
    let c_path = std::ffi::CString::new(path).map_err(|_| io::ErrorKind::InvalidInput)?;
    // Opened below the root without following links, so the path cannot leave the mount.
    // SAFETY: a valid descriptor and a NUL-terminated path.
    let fd = unsafe {
        libc::openat(
            root.as_raw_fd(),
            c_path.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor we own.
    let dir = unsafe { OwnedFd::from_raw_fd(fd) };
    // Read through glibc's readdir (std's), whose 32 KiB buffer is the size the kernel
    // asks READDIRPLUS for; "." and ".." are not counted.
    let mut entries = 0;
    let mut subdirs = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd()))? {
        let entry = entry?;
        // The type comes with the entry (READDIRPLUS): no stat.
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            subdirs.push(entry.file_name());
        }
        entries += 1;
        if entries >= at_most {
            break;
        }
    }
    subdirs.sort();
    Ok((entries, subdirs))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Jobs that know `tree`'s directories, each with its subdirectories as listed.
    fn listed(tree: &[(&str, &[&str])]) -> Jobs {
        let mut jobs = Jobs::default();
        for (dir, subdirs) in tree {
            jobs.claim(Path::new(dir), 0);
            let subdirs = subdirs.iter().map(OsString::from).collect();
            jobs.recent.get_mut(Path::new(dir)).unwrap().subdirs = Some(Arc::new(subdirs));
        }
        jobs
    }

    fn dir(next: Next) -> String {
        match next {
            Next::Dir(d) => d.display().to_string(),
            Next::List(d) => format!("list {}", d.display()),
            Next::Wait => "wait".into(),
            Next::End => "end".into(),
        }
    }

    #[test]
    fn a_plan_goes_in_sorted_depth_first_order() {
        let jobs = listed(&[
            (".", &["a", "b"]),
            ("./a", &["x", "y"]),
            ("./a/x", &[]),
            ("./a/y", &["deep"]),
            ("./a/y/deep", &[]),
            ("./b", &[]),
        ]);
        let order = ["./a", "./a/x", "./a/y", "./a/y/deep", "./b"];
        for w in order.windows(2) {
            assert_eq!(dir(jobs.after(Path::new(w[0]), 0)), w[1], "after {}", w[0]);
        }
        assert_eq!(dir(jobs.after(Path::new("./b"), 0)), "end");
        // A directory not listed yet, or being listed, is passed for its siblings; a parent
        // not listed yet is listed first, one being listed waited for.
        let mut jobs = listed(&[(".", &["a", "b"]), ("./a", &["x", "y"])]);
        assert_eq!(dir(jobs.after(Path::new("./a/x"), 0)), "./a/y");
        jobs.claim(Path::new("./a/x"), 0);
        assert_eq!(dir(jobs.after(Path::new("./a/x"), 0)), "./a/y");
        assert_eq!(dir(jobs.after(Path::new("./c/z"), 0)), "list ./c");
        jobs.claim(Path::new("./c"), 0);
        assert_eq!(dir(jobs.after(Path::new("./c/z"), 0)), "wait");
        // A forget since the listings makes them unknown.
        assert_eq!(dir(jobs.after(Path::new("./a/x"), 1)), "list ./a");
    }

    #[test]
    fn a_plan_lists_what_is_not_listed_and_grows_while_the_walk_follows_it() {
        let listers = Listers::default();
        let subdirs: Vec<String> = (0..40).map(|i| format!("d{i:02}")).collect();
        let names: Vec<&str> = subdirs.iter().map(String::as_str).collect();
        {
            let mut jobs = listers.lock();
            *jobs = listed(&[(".", &["t"]), ("./t", &names)]);
        }
        let take = |listers: &Listers| {
            let mut got = Vec::new();
            let forgets = listers.forgets.load(Ordering::Relaxed);
            loop {
                let next = listers.lock().plan_next(forgets);
                let Some(Next::Dir(d) | Next::List(d)) = next else {
                    break;
                };
                listers.lock().claim(&d, forgets);
                got.push(d.display().to_string());
                listers.listed(&d, Vec::new());
            }
            got
        };
        listers.walked_into(Path::new("./t/d00"));
        listers.listed(Path::new("./t/d00"), Vec::new());
        assert_eq!(take(&listers), ["./t/d01", "./t/d02", "./t/d03", "./t/d04"]);
        // The walk misses just past the plan: twice as many next.
        listers.walked_into(Path::new("./t/d05"));
        listers.listed(Path::new("./t/d05"), Vec::new());
        assert_eq!(take(&listers).len(), 8);
        // Directories listed lately are passed over, not listed again.
        listers.walked_into(Path::new("./t/d10"));
        listers.listed(Path::new("./t/d10"), Vec::new());
        assert_eq!(take(&listers)[0], "./t/d14");
        // A miss elsewhere starts small again.
        listers.walked_into(Path::new("./elsewhere"));
        listers.listed(Path::new("./elsewhere"), Vec::new());
        let got = take(&listers);
        assert!(got.len() <= AHEAD_FIRST, "{got:?}");
    }
}
