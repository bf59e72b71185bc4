//! pjdfstest (third_party/pjdfstest), the POSIX file system test suite, in a default Tether
//! mount (the server passing host ids through, as pjdfstest changes owners as root): 238
//! files of 8,798 checks. Every failure must be one of the known ones, and each failing
//! file's first failure must be the creation of a block or character device, which the
//! server refuses by design (docs/security.md): the rest of such a file fails because the
//! node it goes on to use is not there.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use common::TestMount;

/// Files whose checks fail, and how many, all for want of a device node (measured
/// 2026-11-29; native ext4 passes every check).
const KNOWN: &[(&str, usize)] = &[
    ("chmod/00.t", 30),
    ("chmod/01.t", 6),
    ("chmod/11.t", 28),
    ("chown/00.t", 366),
    ("chown/01.t", 8),
    ("chown/07.t", 36),
    ("link/00.t", 64),
    ("link/01.t", 12),
    ("link/10.t", 4),
    ("mkdir/01.t", 6),
    ("mkdir/10.t", 9),
    ("mkfifo/01.t", 6),
    ("mkfifo/09.t", 4),
    ("mknod/01.t", 10),
    ("mknod/02.t", 6),
    ("mknod/03.t", 6),
    ("mknod/08.t", 8),
    ("mknod/11.t", 24),
    ("open/01.t", 8),
    ("open/22.t", 4),
    ("rename/00.t", 34),
    ("rename/09.t", 464),
    ("rename/10.t", 466),
    ("rename/12.t", 12),
    ("rename/13.t", 21),
    ("rename/14.t", 8),
    ("rename/20.t", 9),
    ("rename/23.t", 16),
    ("rmdir/06.t", 13),
    ("symlink/08.t", 4),
    ("unlink/00.t", 32),
    ("unlink/11.t", 64),
    ("utimensat/00.t", 10),
];

#[test]
fn pjdfstest_passes_but_for_device_nodes() {
    require_mount!();
    if unsafe { libc::geteuid() } != 0 {
        common::skip("pjdfstest changes owners: it needs root");
        return;
    }
    if let Some(tool) = common::first_missing(&[
        &["cc", "--version"],
        &["prove", "-V"],
        &["openssl", "version"],
    ]) {
        common::skip(&format!("no {tool} to build or run pjdfstest"));
        return;
    }
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../third_party/pjdfstest");
    let build = tempfile::tempdir().unwrap();
    let binary = build.path().join("pjdfstest");
    let cc = Command::new("cc")
        .args(["-O2", "-D_GNU_SOURCE", "-I"])
        .arg(&source)
        .arg("-o")
        .arg(&binary)
        .arg(source.join("pjdfstest.c"))
        .output()
        .unwrap();
    assert!(
        cc.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&cc.stderr)
    );
    // The tests find the binary next to their directory (misc.sh: ${dir}/../pjdfstest).
    let tests = build.path().join("tests");
    copy_dir(&source.join("tests"), &tests);

    let t = TestMount::start_with(&["--map-ids", "passthrough"], &[]);
    let out = Command::new("prove")
        .args(["-v", "-r"])
        .arg(&tests)
        .current_dir(&t.mnt)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let (failed, first) = failures(&stdout, &tests);
    let summary = stdout.lines().rev().take(4).collect::<Vec<_>>().join("\n");
    assert!(
        stdout.contains("Files=238, Tests=8798"),
        "pjdfstest did not run whole:\n{summary}"
    );
    for (file, line) in &first {
        assert!(
            is_device_creation(line),
            "{file}: its first failure is not a device node's creation: {line}"
        );
    }
    let known: BTreeMap<String, usize> = KNOWN.iter().map(|(f, n)| (f.to_string(), *n)).collect();
    assert_eq!(
        failed, known,
        "pjdfstest's failures differ from the known ones (left: now; right: known)"
    );
}

/// Per test file (relative to `tests`), the number of failed checks and its first failure.
fn failures(prove: &str, tests: &Path) -> (BTreeMap<String, usize>, BTreeMap<String, String>) {
    let prefix = format!("{}/", tests.display());
    let (mut failed, mut first) = (BTreeMap::new(), BTreeMap::new());
    let mut file = String::new();
    for line in prove.lines() {
        if let Some(rest) = line.strip_prefix(&prefix) {
            if let Some((name, _)) = rest.split_once(' ') {
                file = name.to_string();
            }
        } else if line.starts_with("not ok ") && !line.contains("# TODO") {
            // (A TODO check fails everywhere: prove does not count it either.)
            *failed.entry(file.clone()).or_insert(0) += 1;
            first
                .entry(file.clone())
                .or_insert_with(|| line.to_string());
        }
    }
    (failed, first)
}

/// Whether a "not ok" line is pjdfstest trying `mknod NAME b|c ...`.
fn is_device_creation(line: &str) -> bool {
    let Some((_, tried)) = line.split_once("tried '") else {
        return false;
    };
    let words: Vec<&str> = tried.split_whitespace().collect();
    words.first() == Some(&"mknod") && matches!(words.get(2), Some(&"b") | Some(&"c"))
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).unwrap();
        }
    }
}
