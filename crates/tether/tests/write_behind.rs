//! Write-behind (`mount --write-behind`, crates/tether-client/src/write_behind.rs): a small
//! written-through write() is answered once it is on its way to the server. What must hold: the next request sees
//! it, an error the server meets reaches the writer's next write or fsync (and the guest
//! then sees what the host has), and an unmount right after writing loses nothing.

mod common;

use std::fs::{self, File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Duration;

use common::{TestMount, Tmpfs};

/// Whether the suite runs every mount with `flag` (TETHER_TEST_MOUNT_ARGS): says so.
fn skipped_with(flag: &str) -> bool {
    let args = std::env::var("TETHER_TEST_MOUNT_ARGS").unwrap_or_default();
    let skip = args.split_whitespace().any(|a| a == flag);
    if skip {
        eprintln!("SKIPPED: not for mounts with {flag}");
    }
    skip
}

/// Write-behind is for written-through mounts: the writeback cache has nothing to check here.
fn skipped_with_the_writeback_cache() -> bool {
    skipped_with("--writeback")
}

/// The number after `label` in the mount's `write-behind:` status line.
fn write_behind_count(mnt: &Path, label: &str) -> u64 {
    let status = common::status(mnt);
    let line = status
        .lines()
        .find(|l| l.starts_with("write-behind:"))
        .unwrap_or_else(|| panic!("no write-behind line in:\n{status}"));
    let before = line
        .split(label)
        .next()
        .filter(|b| b.len() < line.len())
        .unwrap_or_else(|| panic!("no {label:?} in {line:?}"));
    before
        .trim_end()
        .rsplit([' ', ','])
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count before {label:?} in {line:?}"))
}

/// Each round writes a few bytes into the middle of a page, drops the guest's cached pages
/// of the file, then reads the page back: the kernel asks the server, which must have
/// applied the write it was sent just before (the write was answered before the server's
/// reply).
#[test]
fn a_write_answered_early_is_seen_by_the_next_request_and_reaches_the_host() {
    require_mount!();
    if skipped_with_the_writeback_cache() {
        return;
    }
    let t = TestMount::start_with(&[], &["--write-behind"]);
    let path = t.mnt.join("pages");
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    const PAGES: u64 = 64;
    let mut model = vec![0u8; (PAGES * 4096) as usize];
    f.write_all_at(&model, 0).unwrap();
    let mut seed = 0x9e37_79b9_u32;
    for round in 0..2000u32 {
        seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        let page = u64::from(seed >> 8) % PAGES;
        let at = page * 4096 + u64::from(seed % 3000) + 1;
        let data: Vec<u8> = (0..97).map(|i| (round as u8) ^ i).collect();
        f.write_all_at(&data, at).unwrap();
        model[at as usize..at as usize + data.len()].copy_from_slice(&data);
        // Written through, the guest's pages are never dirty: this drops them, and the read
        // below goes to the server.
        // SAFETY: fadvise on a descriptor this test owns.
        let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(r, 0);
        let mut back = vec![0u8; 4096];
        f.read_exact_at(&mut back, page * 4096).unwrap();
        let want = &model[(page * 4096) as usize..((page + 1) * 4096) as usize];
        assert!(
            back == want,
            "round {round}: page {page} read back without the write at {at}"
        );
    }
    drop(f);
    // The host has the last writes a moment later (the option's price).
    common::wait_until("the host has every write", Duration::from_secs(5), || {
        fs::read(t.export.join("pages")).unwrap() == model
    });
    assert!(
        write_behind_count(&t.mnt, "writes answered before") >= 2000,
        "the writes were not answered early:\n{}",
        common::status(&t.mnt)
    );
}

/// The export is a 512 KiB tmpfs (less than the 1 MiB the client lets be in flight) and the
/// guest writes 4 MiB into it: the writer must hear
/// ENOSPC (from a later write() or from fsync()), and the guest must then see the file as
/// the host has it, not with the data the server could not write.
#[test]
fn a_write_the_server_fails_after_answering_reaches_the_next_write_or_fsync() {
    require_mount!();
    if skipped_with_the_writeback_cache() {
        return;
    }
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED: mounting a tmpfs needs root");
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("tether-test")
        .tempdir()
        .unwrap();
    let export = dir.path().join("export");
    let mnt = dir.path().join("mnt");
    fs::create_dir(&export).unwrap();
    fs::create_dir(&mnt).unwrap();
    let _tmpfs = Tmpfs::mount(&export, Some("512k"));
    let address = format!("unix:{}", dir.path().join("tether.sock").display());
    let mut server = common::Server::start(&export, &address, &[]);
    let mut mount = common::Mount::start(&address, &mnt, &["--write-behind"]);

    let mut f = File::create(mnt.join("big")).unwrap();
    let chunk = vec![0x5au8; 4096];
    let mut written = 0u64;
    let mut error = None;
    for _ in 0..1024 {
        match std::io::Write::write(&mut f, &chunk) {
            Ok(n) => written += n as u64,
            Err(e) => {
                error = Some(e);
                break;
            }
        }
    }
    let error = error.or_else(|| f.sync_all().err());
    let error = error.expect("4 MiB went into a 512 KiB tmpfs without an error");
    assert_eq!(error.raw_os_error(), Some(libc::ENOSPC), "{error}");
    assert!(written < 4 << 20);
    drop(f);
    // The guest's copy of what the server could not write was dropped.
    let host_len = fs::metadata(export.join("big")).unwrap().len();
    assert!(host_len <= 512 << 10);
    common::wait_until(
        "the guest sees the host's size",
        Duration::from_secs(5),
        || fs::metadata(mnt.join("big")).map(|m| m.len()).ok() == Some(host_len),
    );
    assert_eq!(
        fs::read(mnt.join("big")).unwrap(),
        fs::read(export.join("big")).unwrap()
    );
    assert!(write_behind_count(&mnt, "of them failed there") >= 1);
    mount.stop();
    server.stop_with(libc::SIGTERM);
}

/// An unmount while writes answered early are still on their way (the server is stopped,
/// so they wait in the socket): the client's exit waits for the server to have every one.
#[test]
fn an_unmount_right_after_writing_loses_nothing() {
    require_mount!();
    if skipped_with_the_writeback_cache() {
        return;
    }
    let mut t = TestMount::start_with(&[], &["--write-behind"]);
    let mut f = File::create(t.mnt.join("last")).unwrap();
    let server = t.server.child.id() as i32;
    // SAFETY: signalling our own child; it is continued below, or killed by Drop.
    unsafe { libc::kill(server, libc::SIGSTOP) };
    let resume = Resume(server);
    let mut expected = Vec::new();
    for i in 0..25u32 {
        let block: Vec<u8> = (0..4096u32).map(|j| (i * 7 + j / 3) as u8).collect();
        std::io::Write::write_all(&mut f, &block).unwrap();
        expected.extend_from_slice(&block);
    }
    drop(f);
    assert!(
        write_behind_count(&t.mnt, "in flight") >= 20,
        "the writes did not wait for the stopped server:\n{}",
        common::status(&t.mnt)
    );
    let c = std::ffi::CString::new(t.mnt.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: c is a valid C string.
    let r = unsafe { libc::umount2(c.as_ptr(), 0) };
    assert_eq!(r, 0, "umount: {}", std::io::Error::last_os_error());
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        matches!(t.mount.child.try_wait(), Ok(None)),
        "the client ended with writes still waiting for the server"
    );
    drop(resume);
    common::wait_until("the client exits", Duration::from_secs(10), || {
        matches!(t.mount.child.try_wait(), Ok(Some(_)))
    });
    let got = fs::read(t.export.join("last")).unwrap();
    assert_eq!(
        got.len(),
        expected.len(),
        "the host has only part of the file"
    );
    assert!(got == expected, "the host's copy differs");
}

/// Continues a stopped process when dropped (also when the test fails).
struct Resume(i32);

impl Drop for Resume {
    fn drop(&mut self) {
        // SAFETY: signalling the test's own child.
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}

/// Without `--write-behind` every write waits for the server: the host has it when
/// write() returns.
#[test]
fn by_default_no_write_is_answered_early() {
    require_mount!();
    if skipped_with_the_writeback_cache() || skipped_with("--write-behind") {
        return;
    }
    let t = TestMount::start();
    let mut f = File::create(t.mnt.join("f")).unwrap();
    for i in 0..200u8 {
        std::io::Write::write_all(&mut f, &[i; 1000]).unwrap();
        let host = fs::metadata(t.export.join("f")).unwrap().len();
        assert_eq!(
            host,
            (u64::from(i) + 1) * 1000,
            "the host lags the guest's write()"
        );
    }
    let status = common::status(&t.mnt);
    assert!(
        status.contains("write-behind: off (every write() waits for the server"),
        "{status}"
    );
}
