//! The workloads: what each one sets up (untimed), what it times, and the deterministic
//! content it uses. Every directory gets byte-for-byte the same files.

use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};

use crate::sys::{self, Interrupt, Rng};

/// How big the workloads are: full, or about a tenth for `--quick`.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct Sizes {
    pub tree_files: usize,
    pub tree_dirs: usize,
    pub small_files: usize,
    pub small_size: usize,
    pub dd_bytes: u64,
    pub make_targets: usize,
    pub c_files: usize,
}

impl Sizes {
    pub fn full() -> Sizes {
        Sizes {
            tree_files: 10_000,
            tree_dirs: 100,
            small_files: 2_000,
            small_size: 4096,
            dd_bytes: 160 << 20,
            make_targets: 2_000,
            c_files: 200,
        }
    }

    pub fn quick() -> Sizes {
        Sizes {
            tree_files: 1_000,
            tree_dirs: 10,
            small_files: 200,
            small_size: 4096,
            dd_bytes: 16 << 20,
            make_targets: 200,
            c_files: 20,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    TreeCreate,
    StatCold,
    StatWarm,
    ReadCold,
    ReadWarm,
    GrepWarm,
    CopyOut,
    GitStatus,
    NoopMake,
    SmallWrite,
    DdWrite(usize),
    DdRead(usize),
    CompileClean,
    CompileNoop,
}

#[derive(Debug)]
pub struct Workload {
    pub name: String,
    pub kind: Kind,
}

const DD_BLOCKS: [usize; 3] = [1024, 4096, 16384];

/// Every workload, in the order they run.
pub fn all() -> Vec<Workload> {
    let mut v = vec![
        Workload::new("tree_create", Kind::TreeCreate),
        Workload::new("stat_cold", Kind::StatCold),
        Workload::new("stat_warm", Kind::StatWarm),
        Workload::new("read_cold", Kind::ReadCold),
        Workload::new("read_warm", Kind::ReadWarm),
        Workload::new("grep_warm", Kind::GrepWarm),
        Workload::new("copy_out", Kind::CopyOut),
        Workload::new("git_status", Kind::GitStatus),
        Workload::new("noop_make", Kind::NoopMake),
        Workload::new("small_write", Kind::SmallWrite),
    ];
    for b in DD_BLOCKS {
        v.push(Workload::new(
            &format!("dd_write_{}k", b / 1024),
            Kind::DdWrite(b),
        ));
        v.push(Workload::new(
            &format!("dd_read_{}k", b / 1024),
            Kind::DdRead(b),
        ));
    }
    v.push(Workload::new("compile_clean", Kind::CompileClean));
    v.push(Workload::new("compile_noop", Kind::CompileNoop));
    v
}

impl Workload {
    fn new(name: &str, kind: Kind) -> Workload {
        Workload {
            name: name.to_string(),
            kind,
        }
    }

    /// What is timed, with the sizes in use.
    pub fn describe(&self, s: &Sizes) -> String {
        let mib = s.dd_bytes >> 20;
        match self.kind {
            Kind::TreeCreate => format!(
                "create {} files of 0.5-8 KB in {} directories",
                s.tree_files, s.tree_dirs
            ),
            Kind::StatCold => format!("stat {} files, caches dropped", s.tree_files),
            Kind::StatWarm => format!("stat {} files, second pass", s.tree_files),
            Kind::ReadCold => format!("read {} files, caches dropped", s.tree_files),
            Kind::ReadWarm => format!("read {} files, second pass", s.tree_files),
            Kind::GrepWarm => format!("grep -r over {} files, second pass", s.tree_files),
            Kind::CopyOut => format!("cp -r {} files to a native directory", s.tree_files),
            Kind::GitStatus => format!("git status, {} files, no changes", s.tree_files),
            Kind::NoopMake => format!("make with {} up-to-date targets", s.make_targets),
            Kind::SmallWrite => format!(
                "create {} files of {} KB",
                s.small_files,
                s.small_size / 1024
            ),
            Kind::DdWrite(b) => format!("write {mib} MiB in {} KiB write() calls", b / 1024),
            Kind::DdRead(b) => format!("read back {mib} MiB in {} KiB reads", b / 1024),
            Kind::CompileClean => format!("make -j2 of {} C files from clean", s.c_files),
            Kind::CompileNoop => format!("make -j2 of {} C files, nothing to do", s.c_files),
        }
    }

    /// Programs this workload runs, with the Debian package that provides each.
    pub fn tools(&self) -> &'static [(&'static str, &'static str)] {
        match self.kind {
            Kind::GrepWarm => &[("grep", "grep")],
            Kind::CopyOut => &[("cp", "coreutils")],
            Kind::GitStatus => &[("git", "git")],
            Kind::NoopMake => &[("make", "make"), ("cp", "coreutils")],
            Kind::CompileClean | Kind::CompileNoop => &[("make", "make"), ("gcc", "gcc")],
            _ => &[],
        }
    }

    pub fn is_cold(&self) -> bool {
        matches!(self.kind, Kind::StatCold | Kind::ReadCold)
    }
}

/// The files the workloads write, generated once and shared by every directory.
pub struct Data {
    pub sizes: Sizes,
    /// Tree directories, parents first, relative to the tree root.
    tree_dirs: Vec<PathBuf>,
    /// Tree files relative to the tree root, with their content.
    tree_files: Vec<(PathBuf, Vec<u8>)>,
    /// How many tree files contain [`NEEDLE`].
    needles: usize,
    small: Vec<Vec<u8>>,
    dd_block: Vec<u8>,
    make_files: Vec<(PathBuf, Vec<u8>)>,
    project: Vec<(PathBuf, Vec<u8>)>,
}

const NEEDLE: &str = "TETHER_NEEDLE_42";

const WORDS: &[&str] = &[
    "shared", "folder", "guest", "host", "cache", "page", "inode", "build", "compile", "link",
    "kernel", "fuse", "socket", "reply", "request", "latency", "stale", "fresh", "native", "speed",
    "vector", "buffer", "struct", "return", "value", "module", "header", "source",
];

impl Data {
    pub fn generate(sizes: Sizes) -> Data {
        let mut rng = Rng::new(0x7e7e_4e12);
        let top = (sizes.tree_dirs as f64).sqrt().ceil().max(1.0) as usize;
        let mut tree_dirs = Vec::new();
        let mut leaves = Vec::new();
        for i in 0..sizes.tree_dirs {
            let parent = PathBuf::from(format!("a{:02}", i / top));
            if i % top == 0 {
                tree_dirs.push(parent.clone());
            }
            let leaf = parent.join(format!("b{:02}", i % top));
            tree_dirs.push(leaf.clone());
            leaves.push(leaf);
        }
        let exts = ["c", "h", "txt", "json", "md"];
        let mut needles = 0;
        let tree_files = (0..sizes.tree_files)
            .map(|i| {
                let ext = exts[i % exts.len()];
                let path = leaves[i % leaves.len()].join(format!("f{i:05}.{ext}"));
                let size = rng.range(512, 8192) as usize;
                let needle = i % 50 == 7;
                needles += usize::from(needle);
                let content = if ext == "c" {
                    c_text(&mut rng, i, size, needle)
                } else {
                    prose(&mut rng, size, needle)
                };
                (path, content)
            })
            .collect();
        let small = (0..sizes.small_files)
            .map(|_| random_bytes(&mut rng, sizes.small_size))
            .collect();
        let dd_block = random_bytes(&mut rng, *DD_BLOCKS.iter().max().unwrap());
        Data {
            sizes,
            tree_dirs,
            tree_files,
            needles,
            small,
            dd_block,
            make_files: make_tree(sizes.make_targets),
            project: c_project(sizes.c_files),
        }
    }
}

fn random_bytes(rng: &mut Rng, n: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(n + 8);
    while v.len() < n {
        v.extend_from_slice(&rng.next_u64().to_le_bytes());
    }
    v.truncate(n);
    v
}

/// Words and line breaks, `size` bytes; with the needle in the middle if asked.
fn prose(rng: &mut Rng, size: usize, needle: bool) -> Vec<u8> {
    let mut s = String::with_capacity(size + 32);
    let mut n = 0;
    while s.len() < size {
        if needle && s.len() >= size / 2 && !s.contains(NEEDLE) {
            s.push_str(NEEDLE);
            s.push('\n');
            continue;
        }
        s.push_str(WORDS[(rng.next_u64() % WORDS.len() as u64) as usize]);
        n += 1;
        s.push(if n % 11 == 0 { '\n' } else { ' ' });
    }
    let mut v = s.into_bytes();
    v.truncate(size);
    v
}

/// C-looking text (not compiled), `size` bytes.
fn c_text(rng: &mut Rng, file: usize, size: usize, needle: bool) -> Vec<u8> {
    let mut s = format!("/* file {file}: generated by tether bench */\n#include \"common.h\"\n");
    let mut f = 0;
    while s.len() < size {
        if needle && s.len() >= size / 2 && !s.contains(NEEDLE) {
            s.push_str(&format!("#define {NEEDLE} 1\n"));
            continue;
        }
        let (a, b) = (rng.range(2, 99), rng.range(0, 7));
        s.push_str(&format!(
            "int f_{file}_{f}(int x) {{ return x * {a} + table_{file}[(x + {b}) & 7]; }}\n"
        ));
        f += 1;
    }
    let mut v = s.into_bytes();
    v.truncate(size);
    v
}

/// A Makefile with `targets` targets, each copied from its own source file.
fn make_tree(targets: usize) -> Vec<(PathBuf, Vec<u8>)> {
    let mut v = vec![(
        PathBuf::from("Makefile"),
        b"SRCS := $(wildcard src/*.src)\n\
          OUTS := $(patsubst src/%.src,out/%.out,$(SRCS))\n\
          all: $(OUTS)\n\
          out/%.out: src/%.src\n\tcp $< $@\n"
            .to_vec(),
    )];
    for i in 0..targets {
        v.push((
            PathBuf::from(format!("src/t{i:05}.src")),
            format!("source of target {i}\n").into_bytes(),
        ));
    }
    v
}

/// A C program of `n` modules (each a .c and a .h including a few others) and a main.c.
fn c_project(n: usize) -> Vec<(PathBuf, Vec<u8>)> {
    let mut v = Vec::new();
    v.push((
        PathBuf::from("Makefile"),
        b"CC := gcc\n\
          CFLAGS := -O2 -Wall -Iinclude -MMD -MP\n\
          SRCS := $(wildcard src/*.c)\n\
          OBJS := $(patsubst src/%.c,obj/%.o,$(SRCS))\n\
          app: $(OBJS)\n\t$(CC) -o $@ $(OBJS)\n\
          obj/%.o: src/%.c | obj\n\t$(CC) $(CFLAGS) -c -o $@ $<\n\
          obj:\n\tmkdir -p obj\n\
          clean:\n\trm -rf obj app\n\
          .PHONY: clean\n\
          -include $(OBJS:.o=.d)\n"
            .to_vec(),
    ));
    v.push((
        PathBuf::from("include/common.h"),
        b"#ifndef COMMON_H\n#define COMMON_H\n#include <stdint.h>\n#include <stddef.h>\n\
          #define COUNT_OF(a) (sizeof(a) / sizeof((a)[0]))\n\
          static inline int common_mix(int x) { return (int)(((uint32_t)x * 2654435761u) >> 16) & 0xff; }\n\
          #endif\n"
            .to_vec(),
    ));
    let mut rng = Rng::new(0xc0de);
    for i in 0..n {
        let h = format!(
            "#ifndef MOD_{i:03}_H\n#define MOD_{i:03}_H\n#include \"common.h\"\n\
             #define MOD_{i:03}_CONST {i}\n\
             struct mod_{i:03}_state {{ int count; long sum; char name[32]; }};\n\
             int mod_{i:03}_run(int n);\n#endif\n"
        );
        v.push((
            PathBuf::from(format!("include/mod_{i:03}.h")),
            h.into_bytes(),
        ));
        let (j, k) = ((i + 1) % n, (i * 7 + 3) % n);
        let mut c = format!(
            "#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n\
             #include \"common.h\"\n#include \"mod_{i:03}.h\"\n#include \"mod_{j:03}.h\"\n\
             #include \"mod_{k:03}.h\"\n\nstatic const int table[64] = {{"
        );
        for t in 0..64 {
            c.push_str(&format!(
                "{}{}",
                if t == 0 { "" } else { ", " },
                rng.range(1, 999)
            ));
        }
        c.push_str("};\n\n");
        let helpers = 8;
        for hlp in 0..helpers {
            let (a, b) = (rng.range(2, 97), rng.range(1000, 99_999));
            c.push_str(&format!(
                "static int helper_{hlp}(int x)\n{{\n    int acc = {hlp};\n\
                 \x20   for (int i = 0; i < x; i++) {{\n\
                 \x20       acc += table[(i * {a}) & 63] * (i ^ {hlp});\n\
                 \x20       if (acc > {b})\n            acc -= {b} - 1;\n\
                 \x20       switch (i & 3) {{\n\
                 \x20       case 0: acc ^= i; break;\n\
                 \x20       case 1: acc += common_mix(i); break;\n\
                 \x20       case 2: acc -= table[i & 63]; break;\n\
                 \x20       default: acc = acc * 3 / 2; break;\n        }}\n    }}\n\
                 \x20   return acc;\n}}\n\n"
            ));
        }
        c.push_str(&format!(
            "int mod_{i:03}_run(int n)\n{{\n    struct mod_{i:03}_state st;\n\
             \x20   memset(&st, 0, sizeof st);\n\
             \x20   snprintf(st.name, sizeof st.name, \"mod_%d\", MOD_{i:03}_CONST);\n\
             \x20   for (int k = 0; k < n; k++) {{\n        switch (k % {helpers}) {{\n"
        ));
        for hlp in 0..helpers {
            c.push_str(&format!(
                "        case {hlp}: st.sum += helper_{hlp}(k); break;\n"
            ));
        }
        c.push_str(&format!(
            "        }}\n        st.count++;\n    }}\n\
             \x20   return (int)(st.sum % 1000) + MOD_{j:03}_CONST + MOD_{k:03}_CONST \
             + common_mix(st.count) + (int)strlen(st.name);\n}}\n"
        ));
        v.push((PathBuf::from(format!("src/mod_{i:03}.c")), c.into_bytes()));
    }
    let mut m = String::from("#include <stdio.h>\n");
    for i in 0..n {
        m.push_str(&format!("#include \"mod_{i:03}.h\"\n"));
    }
    m.push_str("\nint main(void)\n{\n    long total = 0;\n");
    for i in 0..n {
        m.push_str(&format!("    total += mod_{i:03}_run({});\n", 10 + i % 7));
    }
    m.push_str("    printf(\"%ld\\n\", total);\n    return 0;\n}\n");
    v.push((PathBuf::from("src/main.c"), m.into_bytes()));
    v
}

/// One benchmarked directory: its working subdirectory and what has been set up in it.
///
/// Every run works in a fresh subdirectory (`run-N`) and nothing the workloads made is
/// deleted before the end of the bench: on a file system without a journal (ext4 here),
/// ext4 avoids reusing inodes freed in the last 30 seconds and scans past them, so creating
/// files right after deleting thousands made native file creation up to 16 times slower
/// (`tree_create` 0.22 s in a first run, 3.5 s in the next ones), which hid most of a
/// mount's own cost in its ratio.
pub struct Site {
    pub label: String,
    /// `DIR/.tether-bench-<pid>-<n>`: everything the bench creates lives here.
    pub root: PathBuf,
    /// `root/run-N`: the current run's work.
    pub work: PathBuf,
    run: u32,
    /// Tree files relative to the tree root, computed once so timing excludes path building.
    tree_files: Vec<PathBuf>,
    /// Absolute paths of the current run's tree files.
    tree_paths: Vec<PathBuf>,
    state: State,
}

#[derive(Default)]
struct State {
    tree: bool,
    git: bool,
    make_built: bool,
    project: bool,
    project_built: bool,
}

impl Site {
    pub fn new(label: String, root: PathBuf, data: &Data) -> Site {
        let tree_files = data.tree_files.iter().map(|(p, _)| p.clone()).collect();
        Site {
            label,
            work: root.join("run-0"),
            root,
            run: 0,
            tree_files,
            tree_paths: Vec::new(),
            state: State::default(),
        }
    }

    /// Starts run `run` in a new, empty working subdirectory (untimed); the previous run's
    /// files stay until the end of the bench.
    pub fn start_run(&mut self, run: u32) -> Result<()> {
        self.run = run;
        self.work = self.root.join(format!("run-{run}"));
        self.wipe()
    }

    /// Empties the current working subdirectory (after a failed step) and forgets what was
    /// set up.
    pub fn wipe(&mut self) -> Result<()> {
        self.state = State::default();
        if self.work.exists() {
            fs::remove_dir_all(&self.work)
                .with_context(|| format!("cannot remove {}", self.work.display()))?;
        }
        fs::create_dir_all(&self.work)
            .with_context(|| format!("cannot create {}", self.work.display()))?;
        let tree = self.tree();
        self.tree_paths = self.tree_files.iter().map(|p| tree.join(p)).collect();
        // Leave no deletion work pending for whatever is timed next.
        sys::sync();
        Ok(())
    }

    fn tree(&self) -> PathBuf {
        self.work.join("tree")
    }
}

/// What a step needs besides the directory.
pub struct Ctx<'a> {
    pub data: &'a Data,
    pub intr: &'a Interrupt,
    /// Whether the caches can be dropped before cold workloads.
    pub can_drop_caches: bool,
    /// A native directory for copy_out (`run-N/LABEL` for each run and directory
    /// benchmarked), removed at the end of the bench.
    pub copy_dest: &'a Path,
}

impl Ctx<'_> {
    fn cold(&self) -> Result<()> {
        if self.can_drop_caches {
            sys::drop_caches().context("cannot drop caches")?;
        } else {
            sys::sync();
        }
        Ok(())
    }
}

fn time(f: impl FnOnce() -> Result<()>) -> Result<f64> {
    let start = Instant::now();
    f()?;
    Ok(start.elapsed().as_secs_f64())
}

pub fn clear(p: &Path) -> Result<()> {
    match fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => {
            fs::remove_dir_all(p).with_context(|| format!("cannot remove {}", p.display()))
        }
        Ok(_) => fs::remove_file(p).with_context(|| format!("cannot remove {}", p.display())),
        Err(_) => Ok(()),
    }
}

/// Writes `files` (relative paths) under `root`, creating parent directories as needed.
fn write_files(root: &Path, files: &[(PathBuf, Vec<u8>)], intr: &Interrupt) -> Result<()> {
    for (rel, content) in files {
        intr.check()?;
        let p = root.join(rel);
        if let Some(parent) = p.parent() {
            fs::create_dir_all(parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
        }
        fs::write(&p, content).with_context(|| format!("cannot write {}", p.display()))?;
    }
    Ok(())
}

fn make(dir: &Path) -> Command {
    let mut c = Command::new("make");
    c.current_dir(dir)
        .env("LC_ALL", "C")
        .env_remove("MAKEFLAGS")
        .env_remove("MFLAGS")
        .env_remove("MAKELEVEL");
    c
}

fn git(dir: &Path) -> Command {
    let mut c = Command::new("git");
    c.current_dir(dir)
        .env("LC_ALL", "C")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE")
        .env_remove("GIT_INDEX_FILE")
        .env_remove("GIT_OBJECT_DIRECTORY")
        .args(["-c", "safe.directory=*"]);
    c
}

impl Site {
    fn create_tree(&mut self, ctx: &Ctx) -> Result<()> {
        let tree = self.tree();
        fs::create_dir(&tree).with_context(|| format!("cannot create {}", tree.display()))?;
        for d in &ctx.data.tree_dirs {
            ctx.intr.check()?;
            let p = tree.join(d);
            fs::create_dir(&p).with_context(|| format!("cannot create {}", p.display()))?;
        }
        for (p, (_, content)) in self.tree_paths.iter().zip(&ctx.data.tree_files) {
            ctx.intr.check()?;
            fs::write(p, content).with_context(|| format!("cannot write {}", p.display()))?;
        }
        self.state.tree = true;
        Ok(())
    }

    fn ensure_tree(&mut self, ctx: &Ctx) -> Result<()> {
        if !self.state.tree {
            clear(&self.tree())?;
            self.create_tree(ctx)?;
            sys::sync();
        }
        Ok(())
    }

    fn stat_tree(&self, ctx: &Ctx) -> Result<()> {
        for (p, (_, content)) in self.tree_paths.iter().zip(&ctx.data.tree_files) {
            ctx.intr.check()?;
            let m = fs::symlink_metadata(p).with_context(|| format!("stat {}", p.display()))?;
            ensure!(
                m.is_file() && m.len() == content.len() as u64,
                "{} has size {}, expected {}",
                p.display(),
                m.len(),
                content.len()
            );
        }
        Ok(())
    }

    fn read_tree(&self, ctx: &Ctx) -> Result<()> {
        let mut buf = vec![0u8; 16384];
        for (p, (_, content)) in self.tree_paths.iter().zip(&ctx.data.tree_files) {
            ctx.intr.check()?;
            let mut f = File::open(p).with_context(|| format!("open {}", p.display()))?;
            let mut total = 0;
            loop {
                let n = f.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                total += n;
            }
            ensure!(
                total == content.len(),
                "read {total} bytes from {}, expected {}",
                p.display(),
                content.len()
            );
        }
        Ok(())
    }

    fn grep(&self, ctx: &Ctx) -> Result<()> {
        let out = ctx.intr.run(
            Command::new("grep")
                .args(["-r", "-l", "-F", NEEDLE, "."])
                .current_dir(self.tree())
                .env("LC_ALL", "C"),
        )?;
        let found = out.stdout.iter().filter(|&&b| b == b'\n').count();
        ensure!(
            found == ctx.data.needles,
            "grep found {found} files, expected {}",
            ctx.data.needles
        );
        Ok(())
    }

    fn write_dd(&self, ctx: &Ctx, block: usize) -> Result<()> {
        let p = self.dd_path(block);
        let mut f = File::create(&p).with_context(|| format!("create {}", p.display()))?;
        let chunk = &ctx.data.dd_block[..block];
        let mut left = ctx.data.sizes.dd_bytes;
        while left > 0 {
            if left & ((1 << 20) - 1) == 0 {
                ctx.intr.check()?;
            }
            let n = chunk.len().min(left as usize);
            f.write_all(&chunk[..n])
                .with_context(|| format!("write {}", p.display()))?;
            left -= n as u64;
        }
        drop(f);
        Ok(())
    }

    fn dd_path(&self, block: usize) -> PathBuf {
        self.work.join(format!("dd-{}k", block / 1024))
    }

    fn ensure_project(&mut self, ctx: &Ctx) -> Result<PathBuf> {
        let proj = self.work.join("proj");
        if !self.state.project {
            clear(&proj)?;
            write_files(&proj, &ctx.data.project, ctx.intr)?;
            self.state.project = true;
            self.state.project_built = false;
            sys::sync();
        }
        Ok(proj)
    }

    /// Runs the untimed preparation, the timed part and the untimed aftermath of `w`;
    /// returns the timed seconds.
    pub fn step(&mut self, w: &Workload, ctx: &Ctx) -> Result<f64> {
        let secs = match w.kind {
            Kind::TreeCreate => {
                clear(&self.tree())?;
                self.state = State {
                    tree: false,
                    git: false,
                    ..std::mem::take(&mut self.state)
                };
                sys::sync();
                let t = time(|| self.create_tree(ctx))?;
                sys::sync();
                t
            }
            Kind::StatCold | Kind::StatWarm => {
                self.ensure_tree(ctx)?;
                if w.kind == Kind::StatCold {
                    ctx.cold()?;
                } else {
                    self.stat_tree(ctx)?;
                }
                time(|| self.stat_tree(ctx))?
            }
            Kind::ReadCold | Kind::ReadWarm => {
                self.ensure_tree(ctx)?;
                if w.kind == Kind::ReadCold {
                    ctx.cold()?;
                } else {
                    self.read_tree(ctx)?;
                }
                time(|| self.read_tree(ctx))?
            }
            Kind::GrepWarm => {
                self.ensure_tree(ctx)?;
                self.grep(ctx)?;
                time(|| self.grep(ctx))?
            }
            Kind::CopyOut => {
                self.ensure_tree(ctx)?;
                // Each directory copies to its own place in each run, and the copies are
                // removed only at the end of the bench (see `Site`).
                let dest = ctx
                    .copy_dest
                    .join(format!("run-{}", self.run))
                    .join(&self.label);
                clear(&dest)?;
                fs::create_dir_all(&dest)
                    .with_context(|| format!("cannot create {}", dest.display()))?;
                sys::sync();
                let t = time(|| {
                    ctx.intr
                        .run(
                            Command::new("cp")
                                .arg("-r")
                                .arg(self.tree())
                                .arg(dest.join("tree")),
                        )
                        .map(drop)
                });
                sys::sync();
                t?
            }
            Kind::GitStatus => {
                self.ensure_tree(ctx)?;
                let tree = self.tree();
                if !self.state.git {
                    clear(&tree.join(".git"))?;
                    ctx.intr
                        .run(git(&tree).args(["init", "-q", "-b", "main"]))?;
                    for (k, v) in [
                        ("user.name", "tether bench"),
                        ("user.email", "bench@tether.invalid"),
                        ("gc.auto", "0"),
                        ("maintenance.auto", "false"),
                        ("core.fsmonitor", "false"),
                        ("core.untrackedCache", "false"),
                    ] {
                        ctx.intr.run(git(&tree).args(["config", k, v]))?;
                    }
                    ctx.intr.run(git(&tree).args(["add", "-A"]))?;
                    ctx.intr
                        .run(git(&tree).args(["commit", "-q", "-m", "tree"]))?;
                    self.state.git = true;
                    sys::sync();
                }
                // One untimed status refreshes the index's stat data, as in a repository
                // in daily use.
                ctx.intr.run(git(&tree).arg("status"))?;
                let mut out = None;
                let t = time(|| {
                    out = Some(ctx.intr.run(git(&tree).arg("status"))?);
                    Ok(())
                })?;
                let stdout = String::from_utf8_lossy(&out.expect("ran").stdout).into_owned();
                ensure!(
                    stdout.contains("nothing to commit"),
                    "git status saw changes: {stdout}"
                );
                t
            }
            Kind::NoopMake => {
                let dir = self.work.join("make");
                if !self.state.make_built {
                    clear(&dir)?;
                    write_files(&dir, &ctx.data.make_files, ctx.intr)?;
                    fs::create_dir(dir.join("out"))?;
                    ctx.intr.run(make(&dir).args(["-s", "-j2"]))?;
                    self.state.make_built = true;
                    sys::sync();
                }
                let mut out = None;
                let t = time(|| {
                    out = Some(ctx.intr.run(&mut make(&dir))?);
                    Ok(())
                })?;
                let stdout = String::from_utf8_lossy(&out.expect("ran").stdout).into_owned();
                if stdout.contains("cp ") {
                    bail!("the no-op make rebuilt targets: {}", first_lines(&stdout));
                }
                t
            }
            Kind::SmallWrite => {
                let dir = self.work.join("small");
                clear(&dir)?;
                fs::create_dir(&dir)?;
                let paths: Vec<PathBuf> = (0..ctx.data.small.len())
                    .map(|i| dir.join(format!("s{i:05}")))
                    .collect();
                sys::sync();
                let t = time(|| {
                    for (p, content) in paths.iter().zip(&ctx.data.small) {
                        ctx.intr.check()?;
                        fs::write(p, content)
                            .with_context(|| format!("cannot write {}", p.display()))?;
                    }
                    Ok(())
                })?;
                sys::sync();
                t
            }
            Kind::DdWrite(block) => {
                clear(&self.dd_path(block))?;
                sys::sync();
                let t = time(|| self.write_dd(ctx, block))?;
                sys::sync();
                t
            }
            Kind::DdRead(block) => {
                let p = self.dd_path(block);
                if !p.exists() {
                    self.write_dd(ctx, block)?;
                }
                sys::sync();
                let want = ctx.data.sizes.dd_bytes;
                let t = time(|| {
                    let mut f = File::open(&p).with_context(|| format!("open {}", p.display()))?;
                    let mut buf = vec![0u8; block];
                    let mut total = 0u64;
                    loop {
                        if total & ((1 << 20) - 1) == 0 {
                            ctx.intr.check()?;
                        }
                        let n = f.read(&mut buf)?;
                        if n == 0 {
                            break;
                        }
                        total += n as u64;
                    }
                    ensure!(total == want, "read {total} bytes, expected {want}");
                    Ok(())
                });
                clear(&p)?;
                t?
            }
            Kind::CompileClean | Kind::CompileNoop => {
                let proj = self.ensure_project(ctx)?;
                if w.kind == Kind::CompileClean {
                    ctx.intr.run(make(&proj).args(["-s", "clean"]))?;
                } else if !self.state.project_built {
                    ctx.intr.run(make(&proj).args(["-s", "-j2"]))?;
                }
                self.state.project_built = false;
                sys::sync();
                let mut out = None;
                let t = time(|| {
                    out = Some(ctx.intr.run(make(&proj).arg("-j2"))?);
                    Ok(())
                })?;
                self.state.project_built = true;
                sys::sync();
                let stdout = String::from_utf8_lossy(&out.expect("ran").stdout).into_owned();
                if w.kind == Kind::CompileNoop && stdout.contains("gcc ") {
                    bail!("the no-op build recompiled: {}", first_lines(&stdout));
                }
                t
            }
        };
        Ok(secs)
    }
}

fn first_lines(s: &str) -> String {
    s.lines().take(3).collect::<Vec<_>>().join(" / ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_is_deterministic_and_sized() {
        let a = Data::generate(Sizes::quick());
        let b = Data::generate(Sizes::quick());
        assert_eq!(a.tree_files, b.tree_files);
        assert_eq!(a.tree_files.len(), 1000);
        assert_eq!(
            a.tree_dirs
                .iter()
                .filter(|d| d.components().count() == 2)
                .count(),
            10
        );
        assert!(a
            .tree_files
            .iter()
            .all(|(_, c)| (512..=8192).contains(&c.len())));
        let c_files = a
            .tree_files
            .iter()
            .filter(|(p, _)| p.extension().is_some_and(|e| e == "c"))
            .count();
        assert_eq!(c_files, 200);
        let with_needle = a
            .tree_files
            .iter()
            .filter(|(_, c)| c.windows(NEEDLE.len()).any(|w| w == NEEDLE.as_bytes()))
            .count();
        assert_eq!(with_needle, a.needles);
        assert!(a.needles > 0);
        assert_eq!(a.small.len(), 200);
        assert_eq!(a.make_files.len(), 201);
        // 20 modules (.c + .h), main.c, common.h, Makefile.
        assert_eq!(a.project.len(), 43);
    }

    #[test]
    fn a_new_run_works_in_a_new_subdirectory_and_keeps_the_last_runs_files() {
        let root = tempfile::tempdir().unwrap();
        let data = Data::generate(Sizes::quick());
        let mut site = Site::new("x".into(), root.path().join("site"), &data);
        site.start_run(1).unwrap();
        let first = site.tree_paths[0].clone();
        fs::create_dir_all(first.parent().unwrap()).unwrap();
        fs::write(&first, b"run 1").unwrap();
        site.start_run(2).unwrap();
        assert_eq!(site.work, root.path().join("site/run-2"));
        assert!(site.tree_paths[0].starts_with(&site.work));
        assert_eq!(fs::read_dir(&site.work).unwrap().count(), 0);
        // Deleting thousands of files right before timing new ones skews the timing.
        assert_eq!(fs::read(&first).unwrap(), b"run 1");
    }

    #[test]
    fn names_are_unique_and_describe_works() {
        let all = all();
        assert_eq!(all.len(), 18);
        let mut names: Vec<&str> = all.iter().map(|w| w.name.as_str()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), 18);
        for w in &all {
            assert!(!w.describe(&Sizes::full()).is_empty());
        }
    }
}
