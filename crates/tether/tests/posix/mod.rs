//! POSIX behaviour test suite.
//!
//! Every case runs in a fresh subdirectory of the root given to [`run_all`] and records
//! *observations*: deterministic strings describing what happened (errno names, modes, sizes,
//! contents, relations between inode numbers and times). Two runs — one on a native directory and
//! one on a Tether mount — can then be compared with [`diff`].
//!
//! Observations never contain inode numbers, device numbers, absolute times (except times the
//! case set explicitly) or absolute paths.

#![allow(dead_code)]

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

mod cases_dir;
mod cases_io;
mod cases_meta;
mod cases_misc;
pub mod known;
mod sys;

use sys::*;

pub struct CaseResult {
    pub name: &'static str,
    pub observations: Vec<String>,
}

type CaseFn = fn(&mut Ctx);

/// All cases, in execution order.
fn all_cases() -> Vec<(&'static str, CaseFn)> {
    let mut v: Vec<(&'static str, CaseFn)> = Vec::new();
    v.extend_from_slice(cases_meta::CASES);
    v.extend_from_slice(cases_dir::CASES);
    v.extend_from_slice(cases_io::CASES);
    v.extend_from_slice(cases_misc::CASES);
    v
}

/// Names of all cases, in execution order.
pub fn case_names() -> Vec<&'static str> {
    all_cases().into_iter().map(|(n, _)| n).collect()
}

/// Runs every case, each in a fresh subdirectory of `root` named after the case. Never panics on
/// a failing syscall: failures are recorded as observations (e.g. "rename(a,b,NOREPLACE) = EEXIST").
pub fn run_all(root: &Path) -> Vec<CaseResult> {
    run_selected(root, |_| true)
}

/// Like [`run_all`], but only runs the cases for which `filter(name)` is true.
pub fn run_selected(root: &Path, filter: impl Fn(&str) -> bool) -> Vec<CaseResult> {
    // The umask is process-global; every run sets the same value so concurrent runs agree.
    unsafe { libc::umask(0o022) };
    let mut out = Vec::new();
    for (name, f) in all_cases() {
        if !filter(name) {
            continue;
        }
        let dir = root.join(name);
        if std::fs::symlink_metadata(&dir).is_ok() {
            let _ = std::fs::remove_dir_all(&dir);
        }
        let mut cx = Ctx {
            dir: dir.clone(),
            obs: Vec::new(),
        };
        if let Err(e) = mkdir(&dir, 0o755).and_then(|_| chmod(&dir, 0o755)) {
            cx.obs.push(format!("setup: mkdir(case dir) = {e}"));
        } else {
            let r = catch_unwind(AssertUnwindSafe(|| f(&mut cx)));
            if let Err(p) = r {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "?".into());
                cx.obs.push(format!("PANIC in case: {msg}"));
            }
        }
        out.push(CaseResult {
            name,
            observations: cx.obs,
        });
    }
    out
}

/// Maximum number of differing observations reported per case.
const MAX_DIFFS_PER_CASE: usize = 25;

/// Compares two runs case by case; returns a human-readable list of differences (empty = equal).
pub fn diff(native: &[CaseResult], other: &[CaseResult]) -> Vec<String> {
    let mut out = Vec::new();
    for n in native {
        let Some(o) = other.iter().find(|o| o.name == n.name) else {
            out.push(format!("{}: case missing in other run", n.name));
            continue;
        };
        let (a, b) = (&n.observations, &o.observations);
        if a.len() != b.len() {
            out.push(format!(
                "{}: {} observations natively vs {} in other run",
                n.name,
                a.len(),
                b.len()
            ));
        }
        let mut count = 0;
        for i in 0..a.len().max(b.len()) {
            let (x, y) = (a.get(i), b.get(i));
            if x == y {
                continue;
            }
            count += 1;
            if count > MAX_DIFFS_PER_CASE {
                continue;
            }
            let show = |s: Option<&String>| match s {
                Some(s) => format!("{s:?}"),
                None => "<missing>".to_string(),
            };
            out.push(format!(
                "{}[{}]: native {} vs other {}",
                n.name,
                i,
                show(x),
                show(y)
            ));
        }
        if count > MAX_DIFFS_PER_CASE {
            out.push(format!(
                "{}: ... and {} more differing observations",
                n.name,
                count - MAX_DIFFS_PER_CASE
            ));
        }
    }
    for o in other {
        if !native.iter().any(|n| n.name == o.name) {
            out.push(format!("{}: case only in other run", o.name));
        }
    }
    out
}

/// Renders results as text, one observation per line (for debugging output).
pub fn render(results: &[CaseResult]) -> String {
    let mut s = String::new();
    for r in results {
        s.push_str(&format!(
            "== {} ({} observations)\n",
            r.name,
            r.observations.len()
        ));
        for (i, o) in r.observations.iter().enumerate() {
            s.push_str(&format!("  [{i}] {o}\n"));
        }
    }
    s
}

// ---------------------------------------------------------------------------------------------
// Case context and recording helpers
// ---------------------------------------------------------------------------------------------

pub(crate) struct Ctx {
    /// The case's own directory (absolute; never recorded).
    pub dir: PathBuf,
    pub obs: Vec<String>,
}

impl Ctx {
    /// Path of `rel` inside the case directory.
    pub fn p(&self, rel: &str) -> PathBuf {
        if rel.is_empty() {
            self.dir.clone()
        } else {
            self.dir.join(rel)
        }
    }

    /// Path of a raw byte name inside the case directory.
    pub fn pb(&self, rel: &[u8]) -> PathBuf {
        use std::os::unix::ffi::OsStrExt;
        self.dir.join(std::ffi::OsStr::from_bytes(rel))
    }

    /// Records an observation.
    pub fn o(&mut self, s: impl Into<String>) {
        self.obs.push(s.into());
    }

    /// Records "label = ok" or "label = ERRNO", returns the value on success.
    pub fn ok<T>(&mut self, label: &str, r: Res<T>) -> Option<T> {
        match r {
            Ok(v) => {
                self.o(format!("{label} = ok"));
                Some(v)
            }
            Err(e) => {
                self.o(format!("{label} = {e}"));
                None
            }
        }
    }

    /// Records "label = VALUE" or "label = ERRNO", returns the value on success.
    pub fn val<T: std::fmt::Display>(&mut self, label: &str, r: Res<T>) -> Option<T> {
        match r {
            Ok(v) => {
                self.o(format!("{label} = {v}"));
                Some(v)
            }
            Err(e) => {
                self.o(format!("{label} = {e}"));
                None
            }
        }
    }

    /// Performs a setup step: records only on failure (so the failure is visible in diffs).
    pub fn setup<T>(&mut self, label: &str, r: Res<T>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                self.o(format!("setup {label} = {e}"));
                None
            }
        }
    }

    /// Records `stat(rel)` as a description (type, mode, nlink, uid, gid, size).
    pub fn stat(&mut self, rel: &str) -> Option<Stat> {
        let r = stat(&self.p(rel));
        self.record_stat(&format!("stat({rel})"), r)
    }

    /// Records `lstat(rel)` as a description.
    pub fn lstat(&mut self, rel: &str) -> Option<Stat> {
        let r = lstat(&self.p(rel));
        self.record_stat(&format!("lstat({rel})"), r)
    }

    /// Records `fstat(fd)` as a description.
    pub fn fstat(&mut self, label: &str, fd: &Fd) -> Option<Stat> {
        let r = fstat(fd);
        self.record_stat(&format!("fstat({label})"), r)
    }

    pub fn record_stat(&mut self, label: &str, r: Res<Stat>) -> Option<Stat> {
        match r {
            Ok(st) => {
                self.o(format!("{label} = {}", describe(&st)));
                Some(st)
            }
            Err(e) => {
                self.o(format!("{label} = {e}"));
                None
            }
        }
    }

    /// Records the mode (octal incl. file type) of `rel` (lstat).
    pub fn mode(&mut self, rel: &str) -> Option<u32> {
        match lstat(&self.p(rel)) {
            Ok(st) => {
                self.o(format!("mode({rel}) = 0{:o}", st.st_mode));
                Some(st.st_mode)
            }
            Err(e) => {
                self.o(format!("mode({rel}) = {e}"));
                None
            }
        }
    }

    /// Records the size of `rel` (lstat).
    pub fn size(&mut self, rel: &str) -> Option<i64> {
        match lstat(&self.p(rel)) {
            Ok(st) => {
                self.o(format!("size({rel}) = {}", st.st_size));
                Some(st.st_size)
            }
            Err(e) => {
                self.o(format!("size({rel}) = {e}"));
                None
            }
        }
    }

    /// Records the whole content of file `rel`.
    pub fn content(&mut self, rel: &str) -> Option<Vec<u8>> {
        let r = read_file(&self.p(rel));
        match r {
            Ok(b) => {
                self.o(format!("content({rel}) = {}", show_bytes(&b)));
                Some(b)
            }
            Err(e) => {
                self.o(format!("content({rel}) = {e}"));
                None
            }
        }
    }

    /// Records the sorted listing of directory `rel` (without . and ..) as one observation.
    pub fn listing(&mut self, rel: &str) -> Option<Vec<(Vec<u8>, u8)>> {
        match list_dir(&self.p(rel)) {
            Ok(v) => {
                let s: Vec<String> = v
                    .iter()
                    .map(|(n, t)| format!("{}:{}", esc(n), dtype_name(*t)))
                    .collect();
                self.o(format!("listing({rel}) = [{}]", s.join(", ")));
                Some(v)
            }
            Err(e) => {
                self.o(format!("listing({rel}) = {e}"));
                None
            }
        }
    }

    /// Records whether `a` and `b` (stat, following symlinks) refer to the same inode.
    pub fn same_ino(&mut self, a: &str, b: &str) {
        let ra = stat(&self.p(a));
        let rb = stat(&self.p(b));
        match (ra, rb) {
            (Ok(x), Ok(y)) => self.o(format!(
                "{a} and {b} same ino: {}",
                x.st_ino == y.st_ino && x.st_dev == y.st_dev
            )),
            (x, y) => self.o(format!(
                "{a} and {b} same ino: stat failed ({}, {})",
                x.err().map(|e| e.to_string()).unwrap_or("ok".into()),
                y.err().map(|e| e.to_string()).unwrap_or("ok".into())
            )),
        }
    }

    /// Writes a whole file (create/truncate, mode 0644) as a setup step.
    pub fn put(&mut self, rel: &str, data: &[u8]) -> bool {
        let r = write_file(&self.p(rel), data);
        self.setup(&format!("write_file({rel})"), r).is_some()
    }

    /// Runs a command as uid/gid 65534 with the case dir as the working directory and records
    /// exit status, stdout and the errno text of the first stderr line. The child drops to
    /// nobody itself (std's `uid` and `gid`: setgid, setgroups(0), setuid before the exec, as
    /// `setpriv --reuid --regid --clear-groups` does), so no util-linux is needed: the VM
    /// tests run the suite in a busybox guest, whose setpriv has no such options.
    pub fn as_nobody(&mut self, label: &str, argv: &[&str]) {
        use std::os::unix::process::CommandExt;
        let mut cmd = std::process::Command::new(argv[0]);
        cmd.args(&argv[1..])
            .uid(65534)
            .gid(65534)
            .current_dir(&self.dir)
            .env("LC_ALL", "C")
            .env("LANG", "C")
            .stdin(std::process::Stdio::null());
        match cmd.output() {
            Ok(out) => {
                let code = match out.status.code() {
                    Some(c) => c.to_string(),
                    None => "signal".to_string(),
                };
                let stdout = String::from_utf8_lossy(&out.stdout).trim_end().to_string();
                let stderr = String::from_utf8_lossy(&out.stderr);
                let first = stderr.lines().next().unwrap_or("");
                let err = match first.rfind(": ") {
                    Some(i) => first[i + 2..].to_string(),
                    None => first.to_string(),
                };
                self.o(format!(
                    "nobody {label}: exit={code} stdout={stdout:?} err={err:?}"
                ));
            }
            Err(e) => self.o(format!("nobody {label}: spawn failed: {e}")),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Formatting helpers
// ---------------------------------------------------------------------------------------------

pub(crate) fn ftype(mode: u32) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFREG => "reg",
        libc::S_IFDIR => "dir",
        libc::S_IFLNK => "lnk",
        libc::S_IFIFO => "fifo",
        libc::S_IFSOCK => "sock",
        libc::S_IFCHR => "chr",
        libc::S_IFBLK => "blk",
        _ => "?",
    }
}

pub(crate) fn dtype_name(t: u8) -> &'static str {
    match t {
        libc::DT_REG => "reg",
        libc::DT_DIR => "dir",
        libc::DT_LNK => "lnk",
        libc::DT_FIFO => "fifo",
        libc::DT_SOCK => "sock",
        libc::DT_CHR => "chr",
        libc::DT_BLK => "blk",
        libc::DT_UNKNOWN => "unknown",
        _ => "?",
    }
}

/// Type, mode, nlink, owner and (for non-directories) size. Directory sizes are file system
/// internals (and depend on history), so they are left out.
pub(crate) fn describe(st: &Stat) -> String {
    let mut s = format!(
        "{} mode=0{:o} nlink={} uid={} gid={}",
        ftype(st.st_mode),
        st.st_mode,
        st.st_nlink,
        st.st_uid,
        st.st_gid
    );
    if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
        s.push_str(&format!(" size={}", st.st_size));
    }
    s
}

/// Escapes bytes for display.
pub(crate) fn esc(b: &[u8]) -> String {
    b.escape_ascii().to_string()
}

/// Short byte strings are shown escaped; long ones as length + FNV-1a hash.
pub(crate) fn show_bytes(b: &[u8]) -> String {
    if b.len() <= 96 {
        format!("\"{}\"", esc(b))
    } else {
        format!("len={} fnv={:016x}", b.len(), fnv(b))
    }
}

/// FNV-1a 64-bit hash.
pub(crate) fn fnv(b: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for &x in b {
        h ^= x as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

/// Deterministic pseudo-random bytes.
pub(crate) fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407)
        | 1;
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let bytes = x.to_le_bytes();
        let n = (len - v.len()).min(8);
        v.extend_from_slice(&bytes[..n]);
    }
    v
}

/// Formats a timestamp that a case set explicitly. Such values are never close to the current
/// time, so a value within a minute of now (e.g. because a file system ignored the explicit time)
/// is shown as "~now" to keep observations deterministic.
pub(crate) fn show_time(t: Ts) -> String {
    if (t.0 - now().0).abs() < 60 {
        "~now".to_string()
    } else {
        ts_str(t)
    }
}

/// Formats (sec, nsec) as a decimal number of seconds, e.g. "-0.000000001".
pub(crate) fn ts_str(t: Ts) -> String {
    let total = t.0 as i128 * 1_000_000_000 + t.1 as i128;
    let sign = if total < 0 { "-" } else { "" };
    let a = total.abs();
    format!("{sign}{}.{:09}", a / 1_000_000_000, a % 1_000_000_000)
}

pub(crate) fn sleep_ms(ms: u64) {
    std::thread::sleep(std::time::Duration::from_millis(ms));
}
