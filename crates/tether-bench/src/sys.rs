//! What the benchmarks need from the system: interruption (SIGINT/SIGTERM) that stops
//! between steps and kills a running child, child processes, tool checks, dropping caches,
//! machine facts, and a deterministic random number generator.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

use anyhow::{bail, Context, Result};

/// The error a step returns when the run was interrupted; callers clean up and stop.
#[derive(Debug)]
pub struct Interrupted;

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("interrupted")
    }
}

impl std::error::Error for Interrupted {}

/// True if `e` (or anything in its chain) is an [`Interrupted`].
pub fn is_interrupted(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.is::<Interrupted>())
}

/// SIGINT/SIGTERM handling for a benchmark: the first signal sets a flag that every step
/// checks and kills the running child's process group; a second one exits at once.
pub struct Interrupt {
    flag: Arc<AtomicBool>,
    /// The process group of the running child, while it has not been reaped (so the id
    /// cannot have been reused when the signal thread kills it).
    child: Arc<Mutex<Option<i32>>>,
}

impl Interrupt {
    pub fn install() -> Result<Interrupt> {
        let flag = Arc::new(AtomicBool::new(false));
        for sig in [libc::SIGINT, libc::SIGTERM] {
            // Runs before the iterator below sees the signal: a no-op the first time, an
            // immediate exit the second time (the user insists).
            signal_hook::flag::register_conditional_shutdown(sig, 130, Arc::clone(&flag))?;
        }
        let child: Arc<Mutex<Option<i32>>> = Arc::new(Mutex::new(None));
        let mut signals = signal_hook::iterator::Signals::new([libc::SIGINT, libc::SIGTERM])?;
        {
            let flag = Arc::clone(&flag);
            let child = Arc::clone(&child);
            thread::spawn(move || {
                for _ in signals.forever() {
                    flag.store(true, Ordering::SeqCst);
                    if let Some(pgid) = *child.lock().unwrap_or_else(|e| e.into_inner()) {
                        // SAFETY: kill has no memory-safety preconditions; the group leader
                        // is not reaped while it is recorded here.
                        unsafe { libc::kill(-pgid, libc::SIGTERM) };
                    }
                }
            });
        }
        Ok(Interrupt { flag, child })
    }

    /// An interrupt that never fires (for code paths that do not install handlers).
    #[cfg(test)]
    pub fn none() -> Interrupt {
        Interrupt {
            flag: Arc::new(AtomicBool::new(false)),
            child: Arc::new(Mutex::new(None)),
        }
    }

    pub fn fired(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }

    /// `Err(Interrupted)` once a signal arrived.
    pub fn check(&self) -> Result<()> {
        if self.fired() {
            return Err(Interrupted.into());
        }
        Ok(())
    }

    /// Runs `cmd` to completion in its own process group with stdin closed and output
    /// captured. A non-zero exit is an error carrying the command's stderr.
    pub fn run(&self, cmd: &mut Command) -> Result<Output> {
        let out = self.run_status(cmd)?;
        if !out.status.success() {
            bail!(
                "{} failed ({}): {}",
                describe(cmd),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(out)
    }

    /// Like [`Interrupt::run`] but any exit status is returned, not an error.
    pub fn run_status(&self, cmd: &mut Command) -> Result<Output> {
        self.check()?;
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let mut child = cmd
            .spawn()
            .with_context(|| format!("cannot run {}", describe(cmd)))?;
        let pid = child.id() as i32;
        *self.child.lock().unwrap_or_else(|e| e.into_inner()) = Some(pid);
        let mut stdout = child.stdout.take().expect("piped");
        let mut stderr = child.stderr.take().expect("piped");
        let err_reader = thread::spawn(move || {
            let mut v = Vec::new();
            let _ = stderr.read_to_end(&mut v);
            v
        });
        let mut out_bytes = Vec::new();
        let _ = stdout.read_to_end(&mut out_bytes);
        // Wait for the exit without reaping, so the signal thread can still kill the group
        // safely; then forget the child and reap it.
        loop {
            // SAFETY: siginfo_t is plain data; waitid writes into it.
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            // SAFETY: a valid pointer to a siginfo_t; pid is our own child.
            let r = unsafe {
                libc::waitid(
                    libc::P_PID,
                    pid as libc::id_t,
                    &mut info,
                    libc::WEXITED | libc::WNOWAIT,
                )
            };
            if r == 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                break;
            }
        }
        *self.child.lock().unwrap_or_else(|e| e.into_inner()) = None;
        let status = child.wait()?;
        let err_bytes = err_reader.join().unwrap_or_default();
        self.check()?;
        Ok(Output {
            status,
            stdout: out_bytes,
            stderr: err_bytes,
        })
    }
}

fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    format!("`{s}`")
}

/// Finds `program` in `PATH`.
pub fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Flushes dirty data and drops the page, dentry and inode caches (`sync; echo 3 >
/// /proc/sys/vm/drop_caches`). Needs root.
pub fn drop_caches() -> std::io::Result<()> {
    sync();
    std::fs::write("/proc/sys/vm/drop_caches", "3\n")
}

pub fn sync() {
    // SAFETY: sync has no preconditions.
    unsafe { libc::sync() };
}

/// Facts about this machine for reports.
#[derive(serde::Serialize, Clone, Debug)]
pub struct Machine {
    pub nproc: usize,
    pub memory_mib: u64,
    pub kernel: String,
    pub tether_version: String,
}

pub fn machine() -> Machine {
    let memory_kib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .unwrap_or(0);
    Machine {
        nproc: thread::available_parallelism().map_or(1, |n| n.get()),
        memory_mib: memory_kib / 1024,
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_default(),
        tether_version: env!("CARGO_PKG_VERSION").to_string(),
    }
}

/// The file system type and source of the mount that holds `path` (from /proc/self/mounts:
/// the longest mount point that is a prefix of the canonical path).
pub fn fs_of(path: &Path) -> Option<(String, String)> {
    let canon = std::fs::canonicalize(path).ok()?;
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    let mut best: Option<(usize, String, String)> = None;
    for line in mounts.lines() {
        let mut f = line.split(' ');
        let (Some(src), Some(mp), Some(ty)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let mp = unescape_mount(mp);
        if canon.starts_with(&mp) && best.as_ref().is_none_or(|b| mp.len() >= b.0) {
            best = Some((mp.len(), ty.to_string(), unescape_mount(src)));
        }
    }
    best.map(|(_, ty, src)| (ty, src))
}

/// /proc/self/mounts escapes space, tab, newline and backslash as octal `\NNN`.
fn unescape_mount(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(u8::is_ascii_digit) {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// xorshift64*: small, fast, and the same sequence everywhere, so every directory gets the
/// same content.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform-enough in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_is_deterministic() {
        let a: Vec<u64> = {
            let mut r = Rng::new(7);
            (0..4).map(|_| r.next_u64()).collect()
        };
        let mut r = Rng::new(7);
        assert_eq!(a, (0..4).map(|_| r.next_u64()).collect::<Vec<_>>());
        assert!((0..1000).all(|_| (3..=9).contains(&r.range(3, 9))));
    }

    #[test]
    fn mount_names_unescape() {
        assert_eq!(unescape_mount("/a\\040b"), "/a b");
        assert_eq!(unescape_mount("/plain"), "/plain");
        assert_eq!(unescape_mount("/end\\04"), "/end\\04");
    }

    #[test]
    fn run_captures_output_and_fails_on_exit_status() {
        let i = Interrupt::none();
        let out = i.run(Command::new("sh").args(["-c", "echo hi"])).unwrap();
        assert_eq!(out.stdout, b"hi\n");
        let e = i
            .run(Command::new("sh").args(["-c", "echo oops >&2; exit 3"]))
            .unwrap_err();
        assert!(format!("{e:#}").contains("oops"), "{e:#}");
        assert!(fs_of(Path::new("/")).is_some());
    }
}
