//! A case-insensitive host file system (APFS and HFS+ by default, NTFS) under a guest that
//! expects case-sensitive names: the behaviour docs/macos.md defines, tested on Linux
//! through the portable backend's stand-in (`serve --backend portable --case-insensitive`:
//! a name not found as spelled is found by a scan of its directory, ignoring case). This
//! kernel has no ext4 casefold; what only a Mac can confirm is listed in docs/macos.md.

mod common;

use std::fs;
use std::io::ErrorKind;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use common::TestMount;

/// A mount of an export served case-insensitively.
fn mount() -> TestMount {
    // The suite may run every server with --backend portable already.
    let args = std::env::var("TETHER_TEST_SERVE_ARGS").unwrap_or_default();
    let mut serve = vec!["--case-insensitive"];
    if !args.contains("--backend") {
        serve.extend(["--backend", "portable"]);
    }
    TestMount::start_with(&serve, &[])
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// `open("readme")` where the host has `README` finds that file, with its inode number,
/// so the guest's dentry cache holds one file under two spellings, never two files.
#[test]
fn another_case_finds_the_same_file() {
    require_mount!();
    let t = mount();
    fs::write(t.export.join("README"), "host text").unwrap();
    let host = fs::metadata(t.export.join("README")).unwrap();
    for spelling in ["README", "readme", "ReadMe"] {
        let m = fs::metadata(t.mnt.join(spelling)).unwrap();
        assert_eq!(m.ino(), host.ino(), "{spelling}");
        assert_eq!(
            fs::read_to_string(t.mnt.join(spelling)).unwrap(),
            "host text"
        );
    }
    // Written under one spelling, read under another, on both sides.
    fs::write(t.mnt.join("readme"), "guest text").unwrap();
    assert_eq!(
        fs::read_to_string(t.mnt.join("README")).unwrap(),
        "guest text"
    );
    assert_eq!(
        fs::read_to_string(t.export.join("README")).unwrap(),
        "guest text"
    );
    // Listings show the name as the host stores it, once.
    assert_eq!(names(&t.mnt), ["README"]);
}

/// Creating a name that exists in another case is creating that name: O_EXCL and mkdir
/// fail with EEXIST, a plain create opens the existing file.
#[test]
fn creating_another_case_of_an_existing_name_finds_it() {
    require_mount!();
    let t = mount();
    fs::write(t.mnt.join("Makefile"), "all:\n").unwrap();
    let e = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(t.mnt.join("makefile"))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AlreadyExists);
    fs::create_dir(t.mnt.join("Src")).unwrap();
    assert_eq!(
        fs::create_dir(t.mnt.join("src")).unwrap_err().kind(),
        ErrorKind::AlreadyExists
    );
    fs::write(t.mnt.join("src/main.c"), "int main;").unwrap();
    assert_eq!(
        fs::read_to_string(t.export.join("Src/main.c")).unwrap(),
        "int main;"
    );
    assert_eq!(names(&t.export), ["Makefile", "Src"]);
    assert_eq!(names(&t.mnt), ["Makefile", "Src"]);
}

/// Removing a name in another case removes the file; a rename to another case of the
/// same name is a no-op in the guest (Linux sees one file under both spellings and asks
/// nothing: docs/macos.md); a rename onto another case of another file replaces it.
#[test]
fn removing_and_renaming_across_cases() {
    require_mount!();
    let t = mount();
    fs::write(t.export.join("Notes.txt"), "n").unwrap();
    fs::write(t.export.join("Old.txt"), "o").unwrap();
    fs::remove_file(t.mnt.join("old.TXT")).unwrap();
    assert!(!t.export.join("Old.txt").exists());
    // Case only: nothing happens, and nothing fails.
    fs::rename(t.mnt.join("Notes.txt"), t.mnt.join("notes.txt")).unwrap();
    assert_eq!(names(&t.export), ["Notes.txt"]);
    fs::write(t.mnt.join("a"), "a").unwrap();
    fs::rename(t.mnt.join("a"), t.mnt.join("NOTES.txt")).unwrap();
    assert_eq!(names(&t.export), ["Notes.txt"]);
    assert_eq!(fs::read_to_string(t.export.join("Notes.txt")).unwrap(), "a");
    assert_eq!(fs::read_to_string(t.mnt.join("NOTES.txt")).unwrap(), "a");
}
