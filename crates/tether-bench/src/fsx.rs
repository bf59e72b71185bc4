//! `tether-fsx`: a random-operation integrity tester in the manner of fsx.
//!
//! It runs a long, seeded sequence of mixed operations on a few files of one export, some
//! through the mount and some directly on the host, and checks every read against an
//! in-memory model of what the files must contain:
//!
//! - writes at random offsets and lengths (past the end too, leaving holes), reads,
//!   truncation to a smaller or larger size, open with `O_TRUNC`, reads and writes through
//!   a `MAP_SHARED` mapping (with or without `msync`), rename (to a free name or over
//!   another file), create, fsync/fdatasync, close, whole-file reads by path, stat and
//!   directory listings.
//! - Operations run in *segments* of random length on one side (the mount or the host).
//!   Within a segment every read must match the model exactly. Tether's coherence is
//!   asynchronous (a host change reaches the guest through a pushed invalidation), so at a
//!   switch of side the tester flushes the old side (`msync` of every mapping, some files
//!   closed, the others kept open) and then polls the new side (listing, stat of every
//!   name, whole content by path and through every still open descriptor and mapping)
//!   until it matches the model, within a bound. Not converging in time is a failure;
//!   the convergence times are reported.
//! - Only contents, sizes and names are compared: atime and mtime granularity are not
//!   coherent by design (docs/coherence.md).
//! - Writes through a shared mapping *on the host* are not reported by inotify, so Tether
//!   cannot see them (docs/coherence.md, known limits): the host side maps files for
//!   reading only unless `--host-mmap-writes` is given.
//!
//! The run is determined by the seed and the options (timing never feeds the random
//! sequence). On a mismatch it prints the seed, the difference, the last operations and
//! the command that replays the run up to the failing operation, and exits with 1.
//!
//! ```text
//! tether-fsx MOUNT/ HOST/ --seed 42 --ops 1000000
//! ```
//!
//! MOUNT and HOST are the same export seen through the mount and on the host; the tester
//! works in a subdirectory `tether-fsx-SEED` of it and removes it after a clean run.
//!
//! The `tether-fsx` binary (crates/tether/src/bin/tether-fsx.rs) parses [`FsxArgs`] and
//! calls [`run_fsx`].

use std::collections::{BTreeMap, VecDeque};
use std::ffi::c_void;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;

use crate::inotify::Watch;

/// `tether-fsx`: its arguments.
#[derive(Parser, Clone)]
#[command(
    name = "tether-fsx",
    about = "Random-operation integrity tester: mixed operations through a Tether mount and on the host, checked against an in-memory model"
)]
pub struct FsxArgs {
    /// The export as seen through the mount.
    mount: PathBuf,
    /// The same export on the host.
    host: PathBuf,
    /// Seed of the operation sequence (random if not given; printed either way).
    #[arg(long)]
    seed: Option<u64>,
    /// Number of operations.
    #[arg(long, default_value_t = 100_000)]
    ops: u64,
    /// Number of files.
    #[arg(long, default_value_t = 4)]
    files: usize,
    /// Largest file size in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    max_size: u64,
    /// Largest length of one read or write.
    #[arg(long, default_value_t = 64 << 10)]
    max_len: u64,
    /// Longest segment of operations on one side.
    #[arg(long, default_value_t = 200)]
    max_segment: u64,
    /// Share of segments run on the host, in percent (0: everything through the mount).
    #[arg(long, default_value_t = 50)]
    host_percent: u64,
    /// Also write through shared mappings on the host (not coherent by design: inotify
    /// does not report them).
    #[arg(long)]
    host_mmap_writes: bool,
    /// End every write through a mapping with msync, so that no dirty mapped page waits
    /// for write-back. The guest kernel's FUSE can lose a write() that extends a file
    /// within a page dirtied through a mapping when a close of another descriptor of the
    /// file writes that page back at the same moment (docs/coherence.md, "Shared mappings
    /// and a concurrent close"); a guest watcher's replays make such closes.
    #[arg(long)]
    always_msync: bool,
    /// How long a side may take to show the model after a switch, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    converge_timeout_ms: u64,
    /// Operations shown when a check fails.
    #[arg(long, default_value_t = 40)]
    log_tail: usize,
    /// Print every operation to stderr.
    #[arg(long)]
    verbose: bool,
    /// Print progress to stderr every N operations (0: never).
    #[arg(long, default_value_t = 0)]
    progress: u64,
    /// Keep the working directory after a clean run.
    #[arg(long)]
    keep: bool,
    /// Watch the working directory through the mount with inotify during the run (a guest
    /// file watcher: Tether then replays host changes through the mount as guest events).
    #[arg(long)]
    guest_watcher: bool,
    /// Self-test: after operation N, change one byte of a file behind the model's back
    /// (the run must then fail).
    #[arg(long)]
    inject_corruption_at: Option<u64>,
}

// ---------------------------------------------------------------------------------------
// Random numbers and data

/// xoshiro256**, seeded through splitmix64: small, fast, and the same on every build (the
/// seed must replay the same run whatever the version of any crate).
struct Rng {
    s: [u64; 4],
}

fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Rng {
    fn new(seed: u64) -> Rng {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            splitmix(x)
        };
        Rng {
            s: [next(), next(), next(), next()],
        }
    }

    fn next(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform in 0..n (0 when n is 0).
    fn below(&mut self, n: u64) -> u64 {
        ((self.next() as u128 * n as u128) >> 64) as u64
    }

    /// Uniform in lo..=hi.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    fn percent(&mut self, p: u64) -> bool {
        self.below(100) < p
    }
}

/// The byte operation `op` writes at file offset `off`: a function of both, so data left
/// by an earlier operation or put at the wrong offset is told apart, and the operation a
/// stray byte came from can be named.
fn pattern_word(op: u64, word: u64) -> u64 {
    splitmix(op.wrapping_mul(0xD6E8_FEB8_6659_FD93) ^ word)
}

fn pattern(op: u64, off: u64) -> u8 {
    (pattern_word(op, off >> 3) >> ((off & 7) * 8)) as u8
}

fn fill(op: u64, off: u64, buf: &mut [u8]) {
    let mut i = 0;
    while i < buf.len() {
        let o = off + i as u64;
        let bytes = pattern_word(op, o >> 3).to_le_bytes();
        let start = (o & 7) as usize;
        let n = (8 - start).min(buf.len() - i);
        buf[i..i + n].copy_from_slice(&bytes[start..start + n]);
        i += n;
    }
}

// ---------------------------------------------------------------------------------------
// Sides, open files and mappings

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Side {
    Mount = 0,
    Host = 1,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::Mount => "mount",
            Side::Host => "host",
        }
    }

    fn other(self) -> Side {
        match self {
            Side::Mount => Side::Host,
            Side::Host => Side::Mount,
        }
    }
}

/// A `MAP_SHARED` read-write mapping of `len` bytes (longer than the file may be: only
/// bytes below the file's size are ever touched).
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

impl Mapping {
    fn new(file: &File, len: usize) -> io::Result<Mapping> {
        // SAFETY: a fresh shared mapping of an open file descriptor; unmapped in Drop.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping {
            ptr: ptr.cast(),
            len,
        })
    }

    /// Bytes `off..off+len` of the mapping. The caller keeps them below the file's size.
    fn slice(&self, off: usize, len: usize) -> &[u8] {
        assert!(off + len <= self.len);
        // SAFETY: within the mapping, which lives as long as self.
        unsafe { std::slice::from_raw_parts(self.ptr.add(off), len) }
    }

    fn slice_mut(&mut self, off: usize, len: usize) -> &mut [u8] {
        assert!(off + len <= self.len);
        // SAFETY: within the mapping, which lives as long as self; &mut self is unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(off), len) }
    }

    fn msync(&self) -> io::Result<()> {
        // SAFETY: syncing our own mapping.
        if unsafe { libc::msync(self.ptr.cast::<c_void>(), self.len, libc::MS_SYNC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping what mmap returned.
        unsafe { libc::munmap(self.ptr.cast::<c_void>(), self.len) };
    }
}

/// A file held open on one side (`map` before `file`: unmapped before it is closed).
struct Handle {
    map: Option<Mapping>,
    file: File,
}

// ---------------------------------------------------------------------------------------
// The model and the log

struct MFile {
    /// Identity across renames (handles are keyed by it).
    id: u64,
    /// Index into the name pool.
    name: usize,
    data: Vec<u8>,
}

/// What an operation wrote, for naming the origin of unexpected bytes.
#[derive(Clone, Copy)]
struct Wrote {
    file: u64,
    off: u64,
    len: u64,
}

struct Entry {
    op: u64,
    text: String,
    wrote: Option<Wrote>,
}

struct Failure(String);

type Check = Result<(), Failure>;

fn fail<T>(msg: impl Into<String>) -> Result<T, Failure> {
    Err(Failure(msg.into()))
}

#[derive(Default)]
struct Convergence {
    times: Vec<Duration>,
    /// Switches whose first check already matched.
    immediate: u64,
}

impl Convergence {
    fn summary(&self) -> String {
        if self.times.is_empty() {
            return "no switches".into();
        }
        let mut t = self.times.clone();
        t.sort();
        let at = |q: f64| t[((t.len() - 1) as f64 * q).round() as usize];
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        format!(
            "{} switches, median {:.2} ms, p99 {:.2} ms, max {:.2} ms ({} matched at the first check)",
            t.len(),
            ms(at(0.5)),
            ms(at(0.99)),
            ms(*t.last().unwrap()),
            self.immediate
        )
    }
}

const KINDS: [&str; 14] = [
    "write",
    "read",
    "truncate",
    "open_trunc",
    "map_read",
    "map_write",
    "rename",
    "create",
    "fsync",
    "close",
    "read_all",
    "stat",
    "list",
    "skipped",
];

struct Fsx {
    args: FsxArgs,
    seed: u64,
    rng: Rng,
    /// The working directory on each side (index: Side).
    dirs: [PathBuf; 2],
    files: Vec<MFile>,
    next_id: u64,
    pool: usize,
    handles: [BTreeMap<u64, Handle>; 2],
    map_len: usize,
    side: Side,
    op: u64,
    log: VecDeque<Entry>,
    counts: [u64; KINDS.len()],
    side_ops: [u64; 2],
    segments: [u64; 2],
    /// Index: the side switched to.
    convergence: [Convergence; 2],
}

static CURRENT_OP: AtomicU64 = AtomicU64::new(0);
static SEED: AtomicU64 = AtomicU64::new(0);

fn name_of(i: usize) -> String {
    format!("f{i}")
}

impl Fsx {
    fn path(&self, side: Side, name: usize) -> PathBuf {
        self.dirs[side as usize].join(name_of(name))
    }

    fn note(&mut self, text: String, wrote: Option<Wrote>) {
        if self.args.verbose {
            eprintln!("#{} {}", self.op, text);
        }
        if self.log.len() == self.args.log_tail.max(1) {
            self.log.pop_front();
        }
        self.log.push_back(Entry {
            op: self.op,
            text,
            wrote,
        });
    }

    fn count(&mut self, kind: &str) {
        let i = KINDS.iter().position(|k| *k == kind).unwrap();
        self.counts[i] += 1;
    }

    fn label(&self, fi: usize) -> String {
        let f = &self.files[fi];
        format!("{}(#{})", name_of(f.name), f.id)
    }

    fn io_fail<T>(&self, what: &str, fi: usize, e: io::Error) -> Result<T, Failure> {
        fail(format!(
            "{} on the {} side, {}: {e}",
            what,
            self.side.name(),
            self.label(fi)
        ))
    }

    /// The handle of file `fi` on the current side, opened if need be.
    fn handle(&mut self, fi: usize) -> Result<&mut Handle, Failure> {
        let (side, id) = (self.side, self.files[fi].id);
        if !self.handles[side as usize].contains_key(&id) {
            let path = self.path(side, self.files[fi].name);
            let file = match OpenOptions::new().read(true).write(true).open(&path) {
                Ok(f) => f,
                Err(e) => return self.io_fail("open", fi, e),
            };
            self.handles[side as usize].insert(id, Handle { map: None, file });
        }
        Ok(self.handles[side as usize].get_mut(&id).unwrap())
    }

    fn mapping(&mut self, fi: usize) -> Result<&mut Mapping, Failure> {
        let map_len = self.map_len;
        let h = self.handle(fi)?;
        if h.map.is_none() {
            match Mapping::new(&h.file, map_len) {
                Ok(m) => h.map = Some(m),
                Err(e) => return fail(format!("mmap: {e}")),
            }
        }
        Ok(self.handle(fi)?.map.as_mut().unwrap())
    }

    /// Closes file `id` on `side` (msync of a mapping first, so a failure is reported).
    fn close(&mut self, side: Side, id: u64) -> Check {
        if let Some(h) = self.handles[side as usize].remove(&id) {
            if let Some(m) = &h.map {
                if let Err(e) = m.msync() {
                    return fail(format!("msync before close on the {}: {e}", side.name()));
                }
            }
        }
        Ok(())
    }

    /// Compares `got` with the model's bytes `off..` of file `fi`; on a difference says
    /// where, what, and which logged operation the unexpected bytes came from.
    fn compare(&self, what: &str, fi: usize, off: u64, expected: &[u8], got: &[u8]) -> Check {
        if expected == got {
            return Ok(());
        }
        let mut msg = format!(
            "{what} of {} on the {}: offset {off}, expected {} bytes, got {}",
            self.label(fi),
            self.side.name(),
            expected.len(),
            got.len()
        );
        let first = expected
            .iter()
            .zip(got)
            .position(|(a, b)| a != b)
            .unwrap_or(expected.len().min(got.len()));
        if first < expected.len().min(got.len()) {
            let run = expected[first..]
                .iter()
                .zip(&got[first..])
                .take_while(|(a, b)| a != b)
                .count();
            let bad = expected.iter().zip(got).filter(|(a, b)| a != b).count();
            let at = off + first as u64;
            let show = |b: &[u8]| {
                b.iter()
                    .take(16)
                    .map(|x| format!("{x:02x}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            msg += &format!(
                "\n  first difference at file offset {at} ({bad} bytes differ, the first run {run} long)\n  expected: {}\n  got:      {}\n  got bytes came from: {}",
                show(&expected[first..]),
                show(&got[first..]),
                self.origin(self.files[fi].id, at, &got[first..first + run.min(16)])
            );
        }
        fail(msg)
    }

    /// Which logged write produced `bytes` at file offset `at`.
    fn origin(&self, file: u64, at: u64, bytes: &[u8]) -> String {
        if bytes.iter().all(|&b| b == 0) {
            return "zeros (a hole, or a truncated range)".into();
        }
        let matches = |op: u64| {
            bytes
                .iter()
                .enumerate()
                .all(|(i, &b)| pattern(op, at + i as u64) == b)
        };
        for e in self.log.iter().rev() {
            if let Some(w) = e.wrote {
                if matches(e.op) {
                    let same = w.file == file && at >= w.off && at < w.off + w.len;
                    return format!(
                        "op #{} ({}{})",
                        e.op,
                        e.text,
                        if same { "" } else { ", which wrote elsewhere" }
                    );
                }
            }
        }
        // Further back than the log: search every operation so far.
        for op in (1..=self.op).rev().take(2_000_000) {
            if matches(op) {
                return format!("op #{op} (before the logged tail)");
            }
        }
        "no operation of this run".into()
    }

    // -----------------------------------------------------------------------------------
    // Operations

    fn pick_len(&mut self) -> u64 {
        let max = self.args.max_len;
        if self.rng.percent(50) {
            self.rng.range(1, max.min(4096))
        } else {
            self.rng.range(1, max)
        }
    }

    /// An offset: mostly inside the file, often around its end, sometimes anywhere.
    fn pick_offset(&mut self, size: u64) -> u64 {
        let max = self.args.max_size;
        let off = match self.rng.below(10) {
            0..=5 => self.rng.below(size + 1),
            6..=8 => size.saturating_sub(4096) + self.rng.below(4096 + 65536),
            _ => self.rng.below(max),
        };
        off.min(max - 1)
    }

    fn step(&mut self) -> Check {
        CURRENT_OP.store(self.op, Ordering::Relaxed);
        let side = self.side;
        let map_write_ok = side == Side::Mount || self.args.host_mmap_writes;
        let can_create = self.files.len() < self.args.files;
        let weights: [(&str, u64); 13] = [
            ("write", 24),
            ("read", 14),
            ("truncate", 8),
            ("open_trunc", 1),
            ("map_read", 8),
            ("map_write", if map_write_ok { 8 } else { 0 }),
            ("rename", 4),
            ("create", if can_create { 4 } else { 0 }),
            ("fsync", 3),
            ("close", 4),
            ("read_all", 3),
            ("stat", 5),
            ("list", 2),
        ];
        let total: u64 = weights.iter().map(|w| w.1).sum();
        let mut r = self.rng.below(total);
        let mut kind = weights[0].0;
        for (k, w) in weights {
            if r < w {
                kind = k;
                break;
            }
            r -= w;
        }
        let fi = self.rng.below(self.files.len() as u64) as usize;
        self.count(kind);
        match kind {
            "write" => self.op_write(fi),
            "read" => self.op_read(fi),
            "truncate" => self.op_truncate(fi),
            "open_trunc" => self.op_open_trunc(fi),
            "map_read" => self.op_map_read(fi),
            "map_write" => self.op_map_write(fi),
            "rename" => self.op_rename(fi),
            "create" => self.op_create(),
            "fsync" => self.op_fsync(fi),
            "close" => self.op_close(fi),
            "read_all" => self.op_read_all(fi),
            "stat" => self.op_stat(fi),
            "list" => self.op_list(),
            _ => unreachable!(),
        }?;
        if self.args.inject_corruption_at == Some(self.op) {
            self.inject();
        }
        Ok(())
    }

    fn op_write(&mut self, fi: usize) -> Check {
        let size = self.files[fi].data.len() as u64;
        let off = self.pick_offset(size);
        let len = self.pick_len().min(self.args.max_size - off);
        let text = format!(
            "{} write {} off={off} len={len} (size {size})",
            self.side.name(),
            self.label(fi)
        );
        let wrote = Wrote {
            file: self.files[fi].id,
            off,
            len,
        };
        self.note(text, Some(wrote));
        let mut buf = vec![0; len as usize];
        fill(self.op, off, &mut buf);
        if let Err(e) = self.handle(fi)?.file.write_all_at(&buf, off) {
            return self.io_fail("pwrite", fi, e);
        }
        let data = &mut self.files[fi].data;
        let end = (off + len) as usize;
        if data.len() < end {
            data.resize(end, 0);
        }
        data[off as usize..end].copy_from_slice(&buf);
        Ok(())
    }

    fn op_read(&mut self, fi: usize) -> Check {
        let size = self.files[fi].data.len() as u64;
        let off = self.pick_offset(size);
        let len = self.pick_len();
        let text = format!(
            "{} read {} off={off} len={len} (size {size})",
            self.side.name(),
            self.label(fi)
        );
        self.note(text, None);
        let got = match read_at(&self.handle(fi)?.file, off, len as usize) {
            Ok(g) => g,
            Err(e) => return self.io_fail("pread", fi, e),
        };
        let data = &self.files[fi].data;
        let lo = (off as usize).min(data.len());
        let hi = ((off + len) as usize).min(data.len());
        self.compare("pread", fi, off, &data[lo..hi], &got)
    }

    fn op_truncate(&mut self, fi: usize) -> Check {
        let size = self.files[fi].data.len() as u64;
        let max = self.args.max_size;
        let new = match self.rng.below(10) {
            0 => 0,
            1..=4 => self.rng.below(size + 1),
            5..=8 => self.rng.range(size, max),
            _ => (size + self.rng.below(8192)).saturating_sub(4096).min(max),
        };
        let text = format!(
            "{} truncate {} {size} -> {new}",
            self.side.name(),
            self.label(fi)
        );
        self.note(text, None);
        if let Err(e) = self.handle(fi)?.file.set_len(new) {
            return self.io_fail("ftruncate", fi, e);
        }
        self.files[fi].data.resize(new as usize, 0);
        Ok(())
    }

    fn op_open_trunc(&mut self, fi: usize) -> Check {
        let text = format!(
            "{} open O_TRUNC {} (size {})",
            self.side.name(),
            self.label(fi),
            self.files[fi].data.len()
        );
        self.note(text, None);
        let (side, id) = (self.side, self.files[fi].id);
        self.close(side, id)?;
        let path = self.path(side, self.files[fi].name);
        let file = match OpenOptions::new()
            .read(true)
            .write(true)
            .truncate(true)
            .open(&path)
        {
            Ok(f) => f,
            Err(e) => return self.io_fail("open O_TRUNC", fi, e),
        };
        self.handles[side as usize].insert(id, Handle { map: None, file });
        self.files[fi].data.clear();
        Ok(())
    }

    /// Checks through fstat that the open file has the model's size: bytes of a mapping
    /// beyond the size the kernel knows would raise SIGBUS.
    fn check_fstat(&mut self, fi: usize, what: &str) -> Check {
        let size = self.files[fi].data.len() as u64;
        let got = match self.handle(fi)?.file.metadata() {
            Ok(m) => m.len(),
            Err(e) => return self.io_fail("fstat", fi, e),
        };
        if got != size {
            return fail(format!(
                "fstat before {what} of {} on the {}: size {got}, the model has {size}",
                self.label(fi),
                self.side.name()
            ));
        }
        Ok(())
    }

    /// A range inside the file for a mapped access, or None for an empty file.
    fn mapped_range(&mut self, fi: usize) -> Option<(u64, u64)> {
        let size = self.files[fi].data.len() as u64;
        if size == 0 {
            return None;
        }
        let off = self.rng.below(size);
        let len = self.pick_len().min(size - off);
        Some((off, len))
    }

    fn op_map_read(&mut self, fi: usize) -> Check {
        let Some((off, len)) = self.mapped_range(fi) else {
            let text = format!("{} map_read {} (empty)", self.side.name(), self.label(fi));
            self.note(text, None);
            return Ok(());
        };
        let text = format!(
            "{} map_read {} off={off} len={len} (size {})",
            self.side.name(),
            self.label(fi),
            self.files[fi].data.len()
        );
        self.note(text, None);
        self.check_fstat(fi, "a mapped read")?;
        let got = self.mapping(fi)?.slice(off as usize, len as usize).to_vec();
        let want = &self.files[fi].data[off as usize..(off + len) as usize];
        self.compare("mapped read", fi, off, want, &got)
    }

    fn op_map_write(&mut self, fi: usize) -> Check {
        let Some((off, len)) = self.mapped_range(fi) else {
            let text = format!("{} map_write {} (empty)", self.side.name(), self.label(fi));
            self.note(text, None);
            return Ok(());
        };
        // The coin is tossed either way: a seed runs the same operations with the option.
        let sync = self.rng.percent(50) | self.args.always_msync;
        let text = format!(
            "{} map_write {} off={off} len={len}{} (size {})",
            self.side.name(),
            self.label(fi),
            if sync { " +msync" } else { "" },
            self.files[fi].data.len()
        );
        let wrote = Wrote {
            file: self.files[fi].id,
            off,
            len,
        };
        self.note(text, Some(wrote));
        self.check_fstat(fi, "a mapped write")?;
        let op = self.op;
        let map = self.mapping(fi)?;
        fill(op, off, map.slice_mut(off as usize, len as usize));
        if sync {
            if let Err(e) = map.msync() {
                return self.io_fail("msync", fi, e);
            }
        }
        let mut buf = vec![0; len as usize];
        fill(op, off, &mut buf);
        self.files[fi].data[off as usize..(off + len) as usize].copy_from_slice(&buf);
        Ok(())
    }

    fn op_rename(&mut self, fi: usize) -> Check {
        let used: Vec<usize> = self.files.iter().map(|f| f.name).collect();
        let free: Vec<usize> = (0..self.pool).filter(|n| !used.contains(n)).collect();
        // Over another file one time in five (when there is another file).
        let victim = if self.files.len() > 1 && self.rng.percent(20) {
            let mut v = self.rng.below(self.files.len() as u64 - 1) as usize;
            if v >= fi {
                v += 1;
            }
            Some(v)
        } else {
            None
        };
        let to = match victim {
            Some(v) => self.files[v].name,
            None => free[self.rng.below(free.len() as u64) as usize],
        };
        let text = format!(
            "{} rename {} -> {}{}",
            self.side.name(),
            self.label(fi),
            name_of(to),
            match victim {
                Some(v) => format!(" replacing {}", self.label(v)),
                None => String::new(),
            }
        );
        self.note(text, None);
        if let Some(v) = victim {
            // The replaced file is gone on both sides: close it everywhere first.
            let id = self.files[v].id;
            self.close(Side::Mount, id)?;
            self.close(Side::Host, id)?;
        }
        let from = self.path(self.side, self.files[fi].name);
        if let Err(e) = fs::rename(&from, self.path(self.side, to)) {
            return self.io_fail("rename", fi, e);
        }
        self.files[fi].name = to;
        if let Some(v) = victim {
            self.files.remove(v);
        }
        Ok(())
    }

    fn op_create(&mut self) -> Check {
        let used: Vec<usize> = self.files.iter().map(|f| f.name).collect();
        let free: Vec<usize> = (0..self.pool).filter(|n| !used.contains(n)).collect();
        let name = free[self.rng.below(free.len() as u64) as usize];
        let id = self.next_id;
        self.next_id += 1;
        let text = format!("{} create {}(#{id})", self.side.name(), name_of(name));
        self.note(text, None);
        let path = self.path(self.side, name);
        let file = match OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&path)
        {
            Ok(f) => f,
            Err(e) => {
                return fail(format!(
                    "create {} on the {}: {e}",
                    path.display(),
                    self.side.name()
                ))
            }
        };
        self.handles[self.side as usize].insert(id, Handle { map: None, file });
        self.files.push(MFile {
            id,
            name,
            data: Vec::new(),
        });
        Ok(())
    }

    fn op_fsync(&mut self, fi: usize) -> Check {
        let data_only = self.rng.percent(50);
        let text = format!(
            "{} {} {}",
            self.side.name(),
            if data_only { "fdatasync" } else { "fsync" },
            self.label(fi)
        );
        self.note(text, None);
        let h = self.handle(fi)?;
        let r = if data_only {
            h.file.sync_data()
        } else {
            h.file.sync_all()
        };
        if let Err(e) = r {
            return self.io_fail("fsync", fi, e);
        }
        Ok(())
    }

    fn op_close(&mut self, fi: usize) -> Check {
        let (side, id) = (self.side, self.files[fi].id);
        let open = self.handles[side as usize].contains_key(&id);
        let text = format!(
            "{} close {}{}",
            side.name(),
            self.label(fi),
            if open { "" } else { " (not open)" }
        );
        self.note(text, None);
        self.close(side, id)
    }

    fn op_read_all(&mut self, fi: usize) -> Check {
        let text = format!(
            "{} read_all {} (size {})",
            self.side.name(),
            self.label(fi),
            self.files[fi].data.len()
        );
        self.note(text, None);
        let got = match fs::read(self.path(self.side, self.files[fi].name)) {
            Ok(g) => g,
            Err(e) => return self.io_fail("read by path", fi, e),
        };
        self.compare("whole-file read by path", fi, 0, &self.files[fi].data, &got)
    }

    fn op_stat(&mut self, fi: usize) -> Check {
        let size = self.files[fi].data.len() as u64;
        let open = self.handles[self.side as usize].contains_key(&self.files[fi].id);
        let text = format!(
            "{} stat {}{} (size {size})",
            self.side.name(),
            self.label(fi),
            if open { " and fstat" } else { "" }
        );
        self.note(text, None);
        let got = match fs::symlink_metadata(self.path(self.side, self.files[fi].name)) {
            Ok(m) => m.len(),
            Err(e) => return self.io_fail("stat", fi, e),
        };
        if got != size {
            return fail(format!(
                "stat of {} on the {}: size {got}, the model has {size}",
                self.label(fi),
                self.side.name()
            ));
        }
        if open {
            self.check_fstat(fi, "nothing (stat)")?;
        }
        Ok(())
    }

    fn op_list(&mut self) -> Check {
        let text = format!("{} list", self.side.name());
        self.note(text, None);
        self.check_names(self.side)
    }

    /// Changes one byte of the largest file behind the model's back (self-test). Uses no
    /// random numbers, so the rest of the run is the one without injection.
    fn inject(&mut self) {
        let fi = (0..self.files.len())
            .max_by_key(|&i| self.files[i].data.len())
            .unwrap();
        let data = &self.files[fi].data;
        let (off, byte) = match data.len() {
            0 => (0, 0xff),
            n => (n / 2, !data[n / 2]),
        };
        let path = self.path(self.side, self.files[fi].name);
        let text = format!(
            "{} INJECTED corruption: {} offset {off} := {byte:02x}",
            self.side.name(),
            self.label(fi)
        );
        self.note(text, None);
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all_at(&[byte], off as u64).unwrap();
    }

    // -----------------------------------------------------------------------------------
    // Convergence

    fn check_names(&self, side: Side) -> Check {
        let dir = &self.dirs[side as usize];
        let mut got: Vec<String> = match fs::read_dir(dir) {
            Ok(rd) => rd
                .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
                .collect::<io::Result<_>>()
                .or_else(|e| fail(format!("readdir {}: {e}", dir.display())))?,
            Err(e) => return fail(format!("readdir {}: {e}", dir.display())),
        };
        got.sort();
        let mut want: Vec<String> = self.files.iter().map(|f| name_of(f.name)).collect();
        want.sort();
        if got != want {
            return fail(format!(
                "listing of the {}: {got:?}, the model has {want:?}",
                side.name()
            ));
        }
        for n in 0..self.pool {
            if self.files.iter().any(|f| f.name == n) {
                continue;
            }
            match fs::symlink_metadata(self.path(side, n)) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Ok(_) => {
                    return fail(format!(
                        "{} exists on the {}, the model has no such name",
                        name_of(n),
                        side.name()
                    ))
                }
                Err(e) => return fail(format!("stat {} on the {}: {e}", name_of(n), side.name())),
            }
        }
        Ok(())
    }

    /// Everything `side` (the current side) shows matches the model: names, sizes, contents by path and
    /// through every open descriptor and mapping of that side.
    fn check_all(&self, side: Side) -> Check {
        self.check_names(side)?;
        for (fi, f) in self.files.iter().enumerate() {
            let path = self.path(side, f.name);
            let label = self.label(fi);
            let meta = fs::symlink_metadata(&path)
                .or_else(|e| fail(format!("stat {label} on the {}: {e}", side.name())))?;
            if !meta.is_file() || meta.len() != f.data.len() as u64 {
                return fail(format!(
                    "stat {label} on the {}: size {} (regular file: {}), the model has {}",
                    side.name(),
                    meta.len(),
                    meta.is_file(),
                    f.data.len()
                ));
            }
            let got = fs::read(&path)
                .or_else(|e| fail(format!("read {label} on the {}: {e}", side.name())))?;
            self.compare("whole-file read by path", fi, 0, &f.data, &got)?;
            if let Some(h) = self.handles[side as usize].get(&f.id) {
                let size = h
                    .file
                    .metadata()
                    .or_else(|e| fail(format!("fstat {label} on the {}: {e}", side.name())))?
                    .len();
                if size != f.data.len() as u64 {
                    return fail(format!(
                        "fstat {label} (open) on the {}: size {size}, the model has {}",
                        side.name(),
                        f.data.len()
                    ));
                }
                let got = read_at(&h.file, 0, f.data.len() + 1)
                    .or_else(|e| fail(format!("pread {label} on the {}: {e}", side.name())))?;
                self.compare("whole-file pread of the open file", fi, 0, &f.data, &got)?;
                if let Some(m) = &h.map {
                    let got = m.slice(0, f.data.len());
                    self.compare("whole mapping of the open file", fi, 0, &f.data, got)?;
                }
            }
        }
        Ok(())
    }

    /// Leaves the current side (every mapping synced, some files closed) for `to`, and
    /// waits until `to` shows the model.
    fn switch(&mut self, to: Side) -> Check {
        let from = self.side;
        let text = format!("switch {} -> {}", from.name(), to.name());
        self.note(text, None);
        for h in self.handles[from as usize].values() {
            if let Some(m) = &h.map {
                if let Err(e) = m.msync() {
                    return fail(format!("msync on the {} at a switch: {e}", from.name()));
                }
            }
        }
        let ids: Vec<u64> = self.handles[from as usize].keys().copied().collect();
        for id in ids {
            if self.rng.percent(50) {
                self.close(from, id)?;
            }
        }
        self.side = to;
        let t = self.converge(to)?;
        let text = format!(
            "  {} converged in {:.2} ms",
            to.name(),
            t.as_secs_f64() * 1e3
        );
        self.note(text, None);
        Ok(())
    }

    fn converge(&mut self, side: Side) -> Result<Duration, Failure> {
        let start = Instant::now();
        let deadline = start + Duration::from_millis(self.args.converge_timeout_ms);
        let mut polls = 0u64;
        loop {
            polls += 1;
            match self.check_all(side) {
                Ok(()) => {
                    let t = start.elapsed();
                    let c = &mut self.convergence[side as usize];
                    c.times.push(t);
                    if polls == 1 {
                        c.immediate += 1;
                    }
                    return Ok(t);
                }
                Err(Failure(why)) if Instant::now() >= deadline => {
                    return fail(format!(
                        "the {} side did not show the model within {} ms of the switch ({polls} checks); the last check found:\n  {why}",
                        side.name(),
                        self.args.converge_timeout_ms
                    ))
                }
                Err(_) => std::thread::sleep(Duration::from_micros(500)),
            }
        }
    }

    // -----------------------------------------------------------------------------------
    // The run

    fn setup(&mut self) -> Result<(), String> {
        let host = &self.dirs[Side::Host as usize];
        if host.exists() {
            fs::remove_dir_all(host).map_err(|e| format!("remove {}: {e}", host.display()))?;
        }
        fs::create_dir(host).map_err(|e| format!("create {}: {e}", host.display()))?;
        for i in 0..self.args.files {
            let path = host.join(name_of(i));
            File::create(&path).map_err(|e| format!("create {}: {e}", path.display()))?;
            self.files.push(MFile {
                id: i as u64,
                name: i,
                data: Vec::new(),
            });
        }
        self.next_id = self.args.files as u64;
        Ok(())
    }

    fn run(&mut self) -> Check {
        self.side = Side::Host;
        loop {
            // The next segment is drawn even after the last operation, so that a run cut
            // short with --ops N ends with the switch (and its random closes) of the full run.
            let side = if self.rng.percent(self.args.host_percent) {
                Side::Host
            } else {
                Side::Mount
            };
            let len = if self.rng.percent(50) {
                self.rng.range(1, self.args.max_segment.min(10))
            } else {
                self.rng.range(1, self.args.max_segment)
            };
            if self.op == self.args.ops {
                break;
            }
            if side != self.side {
                self.switch(side)?;
            }
            self.segments[side as usize] += 1;
            for _ in 0..len {
                if self.op == self.args.ops {
                    break;
                }
                self.op += 1;
                self.side_ops[side as usize] += 1;
                self.step()?;
                if self.op.checked_rem(self.args.progress) == Some(0) {
                    eprintln!(
                        "tether-fsx: {} operations, {} switches",
                        self.op,
                        self.convergence[0].times.len() + self.convergence[1].times.len()
                    );
                }
            }
        }
        // The end: the current side must match at once, the other one after a switch (the
        // switch the full run would make if the segment drawn above is on the other side).
        let here = self.side;
        self.note(format!("final check on the {}", here.name()), None);
        self.check_all(here)?;
        self.switch(here.other())?;
        Ok(())
    }

    fn report_failure(&self, Failure(why): &Failure) {
        let a = &self.args;
        eprintln!(
            "tether-fsx: MISMATCH at operation {} of seed {}:\n  {why}",
            self.op, self.seed
        );
        eprintln!("last {} operations:", self.log.len());
        for e in &self.log {
            eprintln!("  #{} {}", e.op, e.text);
        }
        let mut extra = String::new();
        if a.host_mmap_writes {
            extra += " --host-mmap-writes";
        }
        if a.always_msync {
            extra += " --always-msync";
        }
        if a.guest_watcher {
            extra += " --guest-watcher";
        }
        if let Some(n) = a.inject_corruption_at {
            extra += &format!(" --inject-corruption-at {n}");
        }
        eprintln!(
            "replay: tether-fsx {} {} --seed {} --ops {} --files {} --max-size {} --max-len {} --max-segment {} --host-percent {}{extra} --log-tail {}",
            a.mount.display(),
            a.host.display(),
            self.seed,
            self.op.max(1),
            a.files,
            a.max_size,
            a.max_len,
            a.max_segment,
            a.host_percent,
            a.log_tail
        );
        eprintln!(
            "(the working directory {} is left as it was)",
            self.dirs[Side::Host as usize].display()
        );
    }

    fn report(&self, wall: Duration) {
        let a = &self.args;
        println!(
            "tether-fsx: OK: {} operations, seed {}, {} files up to {} bytes, {:.1} s",
            self.op,
            self.seed,
            a.files,
            a.max_size,
            wall.as_secs_f64()
        );
        println!(
            "  mount: {} segments, {} operations; host: {} segments, {} operations",
            self.segments[0], self.side_ops[0], self.segments[1], self.side_ops[1]
        );
        let counts: Vec<String> = KINDS
            .iter()
            .zip(self.counts)
            .filter(|(_, n)| *n > 0)
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        println!("  operations: {}", counts.join(", "));
        println!(
            "  convergence, host -> mount: {}",
            self.convergence[Side::Mount as usize].summary()
        );
        println!(
            "  convergence, mount -> host: {}",
            self.convergence[Side::Host as usize].summary()
        );
    }
}

/// Reads up to `len` bytes at `off` (fewer only at the end of the file).
fn read_at(file: &File, off: u64, len: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0; len];
    let mut done = 0;
    while done < len {
        match file.read_at(&mut buf[done..], off + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(done);
    Ok(buf)
}

/// A SIGBUS means a mapped access beyond the size the kernel believes the file has: a
/// failure, reported with what replays it (the log cannot be printed from a handler).
extern "C" fn on_sigbus(_: libc::c_int) {
    fn push(buf: &mut [u8], at: &mut usize, s: &[u8]) {
        let n = s.len().min(buf.len() - *at);
        buf[*at..*at + n].copy_from_slice(&s[..n]);
        *at += n;
    }
    fn push_num(buf: &mut [u8], at: &mut usize, mut v: u64) {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        push(buf, at, &digits[i..]);
    }
    let mut buf = [0u8; 256];
    let mut at = 0;
    let (op, seed) = (
        CURRENT_OP.load(Ordering::Relaxed),
        SEED.load(Ordering::Relaxed),
    );
    push(
        &mut buf,
        &mut at,
        b"tether-fsx: MISMATCH: SIGBUS (a mapped byte beyond the file's end) at operation ",
    );
    push_num(&mut buf, &mut at, op);
    push(&mut buf, &mut at, b" of seed ");
    push_num(&mut buf, &mut at, seed);
    push(&mut buf, &mut at, b"; replay with --seed ");
    push_num(&mut buf, &mut at, seed);
    push(&mut buf, &mut at, b" --ops ");
    push_num(&mut buf, &mut at, op);
    push(&mut buf, &mut at, b" --verbose to see the operations\n");
    // SAFETY: write(2) and _exit(2) are async-signal-safe; buf is ours.
    unsafe {
        libc::write(2, buf.as_ptr().cast(), at);
        libc::_exit(1);
    }
}

/// A guest file watcher: an inotify watch on `dir` (through the mount), its events read and
/// counted by a thread of their own until the process exits.
fn start_guest_watcher(dir: &std::path::Path, timeout: Duration) -> Result<Arc<AtomicU64>, String> {
    let deadline = Instant::now() + timeout;
    while !dir.is_dir() {
        if Instant::now() > deadline {
            return Err(format!(
                "{} did not appear through the mount",
                dir.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let watch =
        Watch::new(dir, false).map_err(|e| format!("cannot watch {}: {e}", dir.display()))?;
    let count = Arc::new(AtomicU64::new(0));
    let seen = count.clone();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 << 10];
        while let Some(events) = watch.read(&mut buf) {
            seen.fetch_add(events.len() as u64, Ordering::Relaxed);
        }
    });
    Ok(count)
}

/// Runs `tether-fsx`: exits with 0 after a clean run, 1 on a mismatch (its report on
/// standard error), 2 when it cannot set up.
pub fn run_fsx(args: FsxArgs) -> ExitCode {
    if args.files == 0 || args.max_size == 0 || args.max_len == 0 || args.max_segment == 0 {
        eprintln!("tether-fsx: --files, --max-size, --max-len and --max-segment must be positive");
        return ExitCode::from(2);
    }
    let seed = args.seed.unwrap_or_else(rand::random);
    SEED.store(seed, Ordering::Relaxed);
    // SAFETY: installing a handler that only calls async-signal-safe functions.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigbus as *const () as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut());
    }
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
    let work = format!("tether-fsx-{seed}");
    let mut fsx = Fsx {
        seed,
        rng: Rng::new(seed),
        dirs: [args.mount.join(&work), args.host.join(&work)],
        files: Vec::new(),
        next_id: 0,
        pool: args.files * 2,
        handles: [BTreeMap::new(), BTreeMap::new()],
        map_len: args.max_size.div_ceil(page).max(1) as usize * page as usize,
        side: Side::Host,
        op: 0,
        log: VecDeque::new(),
        counts: [0; KINDS.len()],
        side_ops: [0; 2],
        segments: [0; 2],
        convergence: Default::default(),
        args,
    };
    eprintln!(
        "tether-fsx: seed {seed}, {} operations, mount {}, host {}",
        fsx.args.ops,
        fsx.args.mount.display(),
        fsx.args.host.display()
    );
    if let Err(e) = fsx.setup() {
        eprintln!("tether-fsx: setup failed: {e}");
        return ExitCode::from(2);
    }
    let mut watched = None;
    if fsx.args.guest_watcher {
        let dir = fsx.dirs[Side::Mount as usize].clone();
        match start_guest_watcher(&dir, Duration::from_millis(fsx.args.converge_timeout_ms)) {
            Ok(c) => watched = Some(c),
            Err(e) => {
                eprintln!("tether-fsx: cannot start the guest watcher: {e}");
                return ExitCode::from(2);
            }
        }
    }
    let start = Instant::now();
    if let Err(f) = fsx.run() {
        fsx.report_failure(&f);
        return ExitCode::from(1);
    }
    let wall = start.elapsed();
    for side in [Side::Mount, Side::Host] {
        let ids: Vec<u64> = fsx.handles[side as usize].keys().copied().collect();
        for id in ids {
            if let Err(f) = fsx.close(side, id) {
                fsx.report_failure(&f);
                return ExitCode::from(1);
            }
        }
    }
    fsx.report(wall);
    if let Some(c) = watched {
        println!(
            "  guest watcher: {} inotify events",
            c.load(Ordering::Relaxed)
        );
    }
    if !fsx.args.keep {
        let host = &fsx.dirs[Side::Host as usize];
        if let Err(e) = fs::remove_dir_all(host) {
            eprintln!("tether-fsx: could not remove {}: {e}", host.display());
        }
    }
    ExitCode::SUCCESS
}
