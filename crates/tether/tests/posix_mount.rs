//! The POSIX behaviour suite run against a native directory and against a Tether mount of
//! another directory on the same file system: every observation must match.

mod common;
mod posix;

use common::TestMount;
use posix::known::{check, KNOWN_DIFFERENCES};

/// Cases that differ when the server squashes ownership (its default): every file is the
/// guest owner's, so giving one away is refused (docs/security.md, "Ownership").
const SQUASH_DIFFERENCES: &[(&str, &str)] = &[
    (
        "chown",
        "chown to anyone but the guest owner is EPERM under --map-ids squash",
    ),
    (
        "chown_clears_suid",
        "its chowns to uid/gid 1000 are EPERM (the guest owner here is root)",
    ),
    (
        "open_unlink",
        "its fchown to 1000 is EPERM (the guest owner here is root)",
    ),
    (
        "setgid_dir",
        "its chgrp of the directory is EPERM, so nothing inherits the group",
    ),
    (
        "nobody_create",
        "files nobody creates still appear to be the guest owner's (root here), so nobody \
         cannot then chmod or utime them",
    ),
    (
        "sticky_dir",
        "files nobody creates appear to be root's, so the sticky bit keeps nobody from \
         renaming or removing them",
    ),
];

/// Cases that differ when the suite runs with the portable backend on Linux
/// (TETHER_TEST_SERVE_ARGS="--backend portable": the calls macOS has; docs/macos.md).
const PORTABLE_DIFFERENCES: &[(&str, &str)] = &[
    (
        "rename_noreplace",
        "RENAME_NOREPLACE is renameatx_np(RENAME_EXCL) on macOS; on Linux the portable \
         backend does not use renameat2, and refuses the flag with EINVAL",
    ),
    (
        "rename_exchange",
        "RENAME_EXCHANGE is renameatx_np(RENAME_SWAP) on macOS; on Linux the portable \
         backend does not use renameat2, and refuses the flag with EINVAL",
    ),
];

/// `known`, and the portable backend's differences when the suite runs with it.
fn with_portable(known: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
    let mut all = known.to_vec();
    let args = std::env::var("TETHER_TEST_SERVE_ARGS").unwrap_or_default();
    if args.contains("--backend portable") {
        all.extend_from_slice(PORTABLE_DIFFERENCES);
    }
    all
}

/// The host ids as they are: the mode in which Tether must match a local file system.
#[test]
fn mount_behaves_like_a_local_file_system() {
    require_mount!();
    let t = TestMount::start_with(&["--map-ids", "passthrough"], &[]);
    compare_with_native(&t, &with_portable(KNOWN_DIFFERENCES));
}

/// The default mode (run as root in the guest, by root, so owner and creator coincide):
/// everything but chown behaves as locally.
#[test]
fn squashed_mount_differs_only_in_chown() {
    require_mount!();
    let t = TestMount::start();
    let known: Vec<_> = KNOWN_DIFFERENCES
        .iter()
        .chain(SQUASH_DIFFERENCES)
        .copied()
        .collect();
    compare_with_native(&t, &with_portable(&known));
}

fn compare_with_native(t: &TestMount, known: &[(&str, &str)]) {
    let native_dir = tempfile::Builder::new()
        .prefix("tether-native")
        .tempdir()
        .unwrap();
    let native = posix::run_all(native_dir.path());
    let mounted = posix::run_all(&t.mnt);
    let diffs = posix::diff(&native, &mounted);
    if let Err(e) = check(&diffs, known) {
        panic!("{e}");
    }
}
