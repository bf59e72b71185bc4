//! Runs the POSIX behaviour suite twice on native (ext4) directories and checks that both runs
//! observe exactly the same things, plus sanity checks that the suite really observes behaviour.
//!
//! Set `POSIX_DUMP=1` to print all observations.

mod posix;

use posix::{diff, run_all, CaseResult};

fn fresh_dir() -> tempfile::TempDir {
    let d = tempfile::tempdir().expect("tempdir");
    // Not strictly needed (unprivileged commands run with the case dir as cwd), but harmless.
    std::fs::set_permissions(
        d.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod tempdir");
    d
}

fn find<'a>(results: &'a [CaseResult], name: &str) -> &'a CaseResult {
    results
        .iter()
        .find(|r| r.name == name)
        .unwrap_or_else(|| panic!("case {name} missing"))
}

fn has(results: &[CaseResult], case: &str, needle: &str) -> bool {
    find(results, case)
        .observations
        .iter()
        .any(|o| o.contains(needle))
}

#[test]
fn native_runs_agree() {
    let a = fresh_dir();
    let b = fresh_dir();
    let ra = run_all(a.path());
    let rb = run_all(b.path());
    if std::env::var_os("POSIX_DUMP").is_some() {
        println!("{}", posix::render(&ra));
    }
    let d = diff(&ra, &rb);
    if !d.is_empty() {
        panic!(
            "two native runs differ ({} differences):\n{}",
            d.len(),
            d.join("\n")
        );
    }
}

#[test]
fn suite_observes_things() {
    let dir = fresh_dir();
    let r = run_all(dir.path());
    let names: Vec<&str> = r.iter().map(|c| c.name).collect();
    assert_eq!(names, posix::case_names(), "every case ran, in order");
    assert!(r.len() >= 40, "expected many cases, got {}", r.len());

    let mut problems = Vec::new();
    for c in &r {
        if c.observations.len() < 3 {
            problems.push(format!(
                "{}: only {} observations",
                c.name,
                c.observations.len()
            ));
        }
        for o in &c.observations {
            if o.starts_with("PANIC") || o.starts_with("setup") {
                problems.push(format!("{}: {o}", c.name));
            }
        }
    }

    let expect: &[(&str, &str)] = &[
        ("umask", "umask = 022"),
        ("umask", "mode(f) = 0100644"),
        ("umask", "mode(d) = 040755"),
        ("lookup_stat", "stat(missing) = ENOENT"),
        ("lookup_stat", "stat(f/x) = ENOTDIR"),
        ("lookup_stat", "lstat(sl_f) = lnk mode=0120777"),
        ("lookup_stat", "f and sl_f same ino: true"),
        ("chmod", "mode(f) = 0104755"),
        (
            "chown",
            "lstat(sl) = lnk mode=0120777 nlink=1 uid=1001 gid=1002",
        ),
        ("chown_clears_suid", "mode(suid) = 0100755"),
        ("truncate", "truncate(d, 0) = EISDIR"),
        (
            "utimens",
            "stat(f): atime=1000000000.123456789 mtime=1200000000.987654321",
        ),
        ("utimens", "atime still T1: true"),
        (
            "utimens_symlink",
            "lstat(sl): atime=1200000000.987654321 mtime=1300000000.000000001",
        ),
        ("access_root", "access(f[0644], X_OK) = EACCES"),
        ("times_update", "after write: file mtime changed: true"),
        ("readdir_many", "count = 300"),
        ("readdir_many", "e004_sock sock"),
        ("readdir_many", "d_type/lstat mismatches = 0"),
        (
            "readdir_seek",
            "rest after seekdir(telldir) identical: true",
        ),
        (
            "name_too_long",
            "open(256-byte name, O_CREAT) = ENAMETOOLONG",
        ),
        ("name_too_long", "open(255-byte name, O_CREAT) = ok"),
        ("mkdir", "mkdir(existing dir) = EEXIST"),
        ("mkdir", "mkdir(missing/x) = ENOENT"),
        ("setgid_dir", "stat(d/sub) = dir mode=042755"),
        ("mknod", "lstat(fifo) = fifo mode=010644"),
        ("mknod", "lstat(sock) = sock mode=0140640"),
        ("unlink", "unlink(d) = EISDIR"),
        ("rmdir", "rmdir(d) non-empty = ENOTEMPTY"),
        ("rmdir", "rmdir(f) = ENOTDIR"),
        ("rmdir", "rmdir(.) = EINVAL"),
        ("rename_basic", "rename(c, d) file over dir = EISDIR"),
        (
            "rename_dirs",
            "rename(src, full) over non-empty dir = ENOTEMPTY",
        ),
        ("rename_dirs", "rename(src, afile) dir over file = ENOTDIR"),
        (
            "rename_dirs",
            "rename(src, src/inner/x) into own subdir = EINVAL",
        ),
        ("rename_noreplace", "renameat2(a, b, NOREPLACE) = EEXIST"),
        ("rename_noreplace", "renameat2(a, c, NOREPLACE) = ok"),
        (
            "rename_exchange",
            "renameat2(f, missing, EXCHANGE) = ENOENT",
        ),
        ("rename_exchange", "inodes swapped: true"),
        ("rename_exchange", "content(f/child) = \"child-content\""),
        ("symlink", "readlink(target) non-symlink = EINVAL"),
        ("symlink", "open(loop1) = ELOOP"),
        ("symlink", "open(rel2, O_NOFOLLOW) = ELOOP"),
        ("symlink", "readlink(long) equal = len=1000 true"),
        ("hardlink", "nlink(a) after link d/c = 3"),
        ("hardlink", "nlink(a) after unlink b = 2"),
        ("hardlink", "link(d, e) dir = EPERM"),
        ("hardlink", "link(x, d/c) existing = EEXIST"),
        ("many_files", "count = 2000"),
        ("many_files", "removed = 2000"),
        ("create", "open(f, O_CREAT|O_EXCL) existing = EEXIST"),
        ("create", "open(dangling, O_CREAT|O_EXCL) = EEXIST"),
        ("create", "open(f, O_DIRECTORY) = ENOTDIR"),
        ("create", "open(d, O_WRONLY) = EISDIR"),
        ("append", "content(f) = \"start:A0B0-A1B1-A2B2-A3B3-XP\""),
        ("rw_basic", "write(O_RDONLY fd) = EBADF"),
        ("rw_basic", "odd-size reads equal: true"),
        ("large_write", "chunked read equal: true"),
        ("fsync", "fsync(dir) = ok"),
        ("ioctl", "ioctl(file, TCGETS) = ENOTTY"),
        ("ioctl", "ioctl(dir, TCGETS) = ENOTTY"),
        ("ioctl", "ioctl(file, FIONREAD) = 14"),
        (
            "fallocate",
            "fstat(f) = reg mode=0100644 nlink=1 uid=0 gid=0 size=65536",
        ),
        ("fallocate", "4096..8192 all zero: true"),
        ("seek_data_hole", "lseek(SEEK_HOLE 0) = 4096"),
        ("seek_data_hole", "lseek(SEEK_DATA 4096) = 1048576"),
        ("seek_data_hole", "lseek(SEEK_DATA 1MiB+4096 (EOF)) = ENXIO"),
        ("copy_file_range", "dst == src: true"),
        (
            "copy_file_range",
            "dst after partial copy as expected: true",
        ),
        (
            "open_unlink",
            "fstat(fd after unlink) = reg mode=0100644 nlink=0",
        ),
        ("open_unlink_recreate", "read(old fd) = \"old content\""),
        ("open_rename", "content(other/h) = \"0123ABCD89XY\""),
        ("large_sparse", "size(big) = 8589934724"),
        ("large_sparse", "lseek(SEEK_DATA, 0) = 5368709120"),
        ("statfs", "f_namemax = 255"),
        ("xattr", "getxattr(user.missing) = ENODATA"),
        ("xattr", "setxattr(user.b, XATTR_CREATE) existing = EEXIST"),
        (
            "xattr",
            "setxattr(user.new, XATTR_REPLACE) missing = ENODATA",
        ),
        ("xattr", "getxattr(user.b, size 3) too small = ERANGE"),
        ("xattr", "getxattr(user.b, size 0) = 7"),
        ("xattr", "getxattr(user.empty) = len=0 value=\"\""),
        (
            "xattr_dir",
            "getxattr(d, user.x) = len=9 value=\"dir-value\"",
        ),
        (
            "eacces_nobody",
            "nobody cat secret: exit=1 stdout=\"\" err=\"Permission denied\"",
        ),
        (
            "eacces_nobody",
            "nobody cat public: exit=0 stdout=\"public\" err=\"\"",
        ),
        ("eacces_nobody", "nobody ls private: exit=2"),
        (
            "nobody_create",
            "stat(open/newfile) = reg mode=0100644 nlink=1 uid=65534 gid=65534",
        ),
        (
            "sticky_dir",
            "nobody rm tmp/rootfile: exit=1 stdout=\"\" err=\"Operation not permitted\"",
        ),
        ("write_clears_suid", "mode(suid) = 0100777"),
        (
            "exec",
            "exec script.sh: exit=Some(3) stdout=\"script ran with arg1\"",
        ),
        (
            "exec",
            "exec echo-copy: exit=Some(0) stdout=\"hello from copy\"",
        ),
    ];
    for (case, needle) in expect {
        if !has(&r, case, needle) {
            problems.push(format!(
                "{case}: expected an observation containing {needle:?}; got:\n    {}",
                find(&r, case).observations.join("\n    ")
            ));
        }
    }
    if !problems.is_empty() {
        panic!("{} problems:\n{}", problems.len(), problems.join("\n"));
    }
}

#[test]
fn diff_reports_differences() {
    let a = vec![
        CaseResult {
            name: "x",
            observations: vec!["one".into(), "two".into()],
        },
        CaseResult {
            name: "only_native",
            observations: vec![],
        },
    ];
    let b = vec![
        CaseResult {
            name: "x",
            observations: vec!["one".into(), "TWO".into(), "three".into()],
        },
        CaseResult {
            name: "only_other",
            observations: vec![],
        },
    ];
    let d = diff(&a, &b);
    assert_eq!(
        d,
        vec![
            "x: 2 observations natively vs 3 in other run".to_string(),
            "x[1]: native \"two\" vs other \"TWO\"".to_string(),
            "x[2]: native <missing> vs other \"three\"".to_string(),
            "only_native: case missing in other run".to_string(),
            "only_other: case only in other run".to_string(),
        ]
    );
    assert!(diff(&a, &a).is_empty());
}

/// Manual tool: compares a native run with a run in the directory named by `POSIX_OTHER_DIR`
/// (e.g. a FUSE mount) and prints the differences. Run with
/// `POSIX_OTHER_DIR=/mnt/x cargo test -p tether --test posix_native -- --ignored --nocapture`.
#[test]
#[ignore]
fn compare_with_dir_from_env() {
    let Some(other) = std::env::var_os("POSIX_OTHER_DIR") else {
        eprintln!("POSIX_OTHER_DIR not set; nothing to do");
        return;
    };
    let native = fresh_dir();
    let rn = run_all(native.path());
    let ro = run_all(std::path::Path::new(&other));
    if std::env::var_os("POSIX_DUMP").is_some() {
        println!("{}", posix::render(&ro));
    }
    let d = diff(&rn, &ro);
    println!("{} differences:\n{}", d.len(), d.join("\n"));
}
