//! Write-behind (`mount --writes=behind`, crates/tether-client/src/write/behind.rs): a small
//! written-through write() is answered once it is on its way to the server; with
//! `--writes=create-behind` (write/spares.rs) a creation too. What must hold: the next request sees
//! it, an error the server meets reaches the writer's next write or fsync (and the guest
//! then sees what the host has), and an unmount right after writing loses nothing.

mod common;

use std::fs::{self, File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Duration;

use common::{skipped_with, TestMount, Tmpfs};

/// These tests hold files of a mount open while a server fails. A process another test of
/// this binary starts meanwhile is forked with copies of those descriptors, and their close
/// at its exec is a close of the file (a FLUSH), which may take the error meant for the
/// test's own close() or fsync() (docs/coherence.md, "Write-behind"): one test at a time.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Write-behind is for written-through mounts: the writeback cache has nothing to check here.
fn skipped_with_the_writeback_cache() -> bool {
    skipped_with("--writes=writeback")
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
    let _one_at_a_time = one_at_a_time();
    if skipped_with_the_writeback_cache() {
        return;
    }
    let t = TestMount::start_with(&[], &["--writes=behind"]);
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
    // Creations are answered early only with --writes=create-behind.
    let status = common::status(&t.mnt);
    if !common::suite_mounts_with("--writes=create-behind") {
        assert!(
            status.contains("file creations wait for the server"),
            "{status}"
        );
    }
}

/// The export is a 512 KiB tmpfs (less than the 1 MiB the client lets be in flight) and the
/// guest writes 4 MiB into it: the writer must hear
/// ENOSPC (from a later write() or from fsync()), and the guest must then see the file as
/// the host has it, not with the data the server could not write.
#[test]
fn a_write_the_server_fails_after_answering_reaches_the_next_write_or_fsync() {
    require_mount!();
    let _one_at_a_time = one_at_a_time();
    if skipped_with_the_writeback_cache() {
        return;
    }
    if unsafe { libc::geteuid() } != 0 {
        common::skip("mounting a tmpfs needs root");
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
    let mut mount = common::Mount::start(&address, &mnt, &["--writes=behind"]);

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

/// close() waits until the host has every write answered early (FLUSH, fuse/io.rs): with
/// the server stopped the writes wait in the socket, and close() does not return until the
/// server, continued, has written them; the host has the whole file when it returns, and an
/// unmount then loses nothing.
#[test]
fn close_returns_once_the_host_has_every_write_answered_early() {
    require_mount!();
    let _one_at_a_time = one_at_a_time();
    if skipped_with_the_writeback_cache() || skipped_with("--writes=through") {
        return;
    }
    let mut t = TestMount::start_with(&[], &["--writes=behind"]);
    let f = File::create(t.mnt.join("last")).unwrap();
    let server = t.server.child.id() as i32;
    let resume = common::Stopped::stop(server);
    // Answered early: they return while the server is stopped.
    let expected = write_blocks(&f, 25);
    let (closed_tx, closed) = std::sync::mpsc::channel();
    let closer = std::thread::spawn(move || closed_tx.send(close(f)).unwrap());
    assert!(
        closed.recv_timeout(Duration::from_millis(500)).is_err(),
        "close() returned before the stopped server had the writes"
    );
    drop(resume);
    let outcome = closed
        .recv_timeout(Duration::from_secs(20))
        .expect("close() did not return once the server was continued");
    closer.join().unwrap();
    assert_eq!(outcome, Ok(()), "close() failed");
    let got = fs::read(t.export.join("last")).unwrap();
    assert!(
        got == expected,
        "the host lacks writes when close() returned: {} of {} bytes",
        got.len(),
        expected.len()
    );
    t.mount.stop();
    assert_eq!(fs::read(t.export.join("last")).unwrap(), expected);
}

/// The server is killed between a guest's write()s, answered early, and its close(), and
/// does not come back: close() reports the error (EIO once `--timeout` has passed) instead
/// of returning as if the data were on the host, and the guest then sees the host's file.
#[test]
fn a_server_killed_between_write_and_close_makes_close_fail() {
    require_mount!();
    let _one_at_a_time = one_at_a_time();
    if skipped_with_the_writeback_cache() || skipped_with("--writes=through") {
        return;
    }
    let mut t = TestMount::start_with(&[], &["--timeout", "2", "--writes=behind"]);
    let (f, next_server, _resume) = open_and_stop_the_server(&t, b"host\n");
    write_blocks(&f, 4);
    t.server.stop_with(libc::SIGKILL);
    let started = std::time::Instant::now();
    let outcome = close(f);
    assert_eq!(
        outcome,
        Err(libc::EIO),
        "close() after writes the server never had (after {:?})",
        started.elapsed()
    );
    assert_eq!(fs::read(t.export.join("f")).unwrap(), b"host\n");
    t.server = next_server.start();
    common::wait_until(
        "the guest sees the host's file",
        Duration::from_secs(10),
        || fs::read(t.mnt.join("f")).ok().as_deref() == Some(b"host\n"),
    );
}

/// The same, but the server comes back before the timeout: the client sends the writes
/// again, and close() returns with the host holding every one.
#[test]
fn writes_answered_early_reach_a_restarted_server_before_close_returns() {
    require_mount!();
    let _one_at_a_time = one_at_a_time();
    if skipped_with_the_writeback_cache() || skipped_with("--writes=through") {
        return;
    }
    let mut t = TestMount::start_with(&[], &["--writes=behind"]);
    let (f, next_server, _resume) = open_and_stop_the_server(&t, b"host\n");
    // Over the host's 5 bytes, and past them.
    let expected = write_blocks(&f, 8);
    t.server.stop_with(libc::SIGKILL);
    t.server = next_server.start();
    assert_eq!(close(f), Ok(()));
    assert!(
        fs::read(t.export.join("f")).unwrap() == expected,
        "the restarted server does not have the writes close() waited for"
    );
}

/// Makes the host file `f` with `content` (not empty), readies the server that will
/// replace `t`'s (before the file is open: see `Server::prepare`), opens `f` for writing
/// through the mount and stops the server: writes through the file are then answered early
/// and wait.
fn open_and_stop_the_server(
    t: &TestMount,
    content: &[u8],
) -> (File, common::PreparedServer, common::Stopped) {
    fs::write(t.export.join("f"), content).unwrap();
    let next_server = common::Server::prepare(&t.export, &t.server.address);
    let f = OpenOptions::new()
        .write(true)
        .open(t.mnt.join("f"))
        .unwrap();
    // The kernel's first write to a file asks whether it has a capability to drop
    // (GETXATTR security.capability), which for a file the host made goes to the server:
    // asked now, with the same content written again and synced, and not by the first
    // write under test, which would wait for the stopped server's timeout and reconnect.
    std::os::unix::fs::FileExt::write_all_at(&f, content, 0).unwrap();
    f.sync_all().unwrap();
    let resume = common::Stopped::stop(t.server.child.id() as i32);
    (f, next_server, resume)
}

/// Writes `n` 4 KiB blocks of a pattern through `f`, returning what was written.
fn write_blocks(mut f: &File, n: u32) -> Vec<u8> {
    let mut expected = Vec::new();
    for i in 0..n {
        let block: Vec<u8> = (0..4096u32).map(|j| (i * 7 + j / 3) as u8).collect();
        std::io::Write::write_all(&mut f, &block).unwrap();
        expected.extend_from_slice(&block);
    }
    expected
}

/// close(2) of `f`, with its error (which dropping a `File` would discard).
fn close(f: File) -> Result<(), i32> {
    use std::os::fd::IntoRawFd;
    let fd = f.into_raw_fd();
    // SAFETY: `fd` was owned by `f` and is closed once here.
    match unsafe { libc::close(fd) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0)),
    }
}

/// By default (`--writes=through`) every write waits for the server: the host has it when
/// write() returns.
#[test]
fn by_default_no_write_is_answered_early() {
    require_mount!();
    let _one_at_a_time = one_at_a_time();
    if skipped_with_the_writeback_cache()
        || skipped_with("--writes=behind")
        || skipped_with("--writes=create-behind")
    {
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

/// Creations answered with spare files (crates/tether-client/src/write/spares.rs): the host gets
/// each file under its name, with the content, permissions, owner, group, inode number and
/// modification time the guest was told; in a set-group-ID directory the directory's group.
#[test]
fn files_created_before_the_server_named_them_are_on_the_host_as_the_guest_saw_them() {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
    require_mount!();
    let _one_at_a_time = one_at_a_time();
    if skipped_with_the_writeback_cache() {
        return;
    }
    // Host ids as they are, so that the guest's owner and group can be compared.
    let t = TestMount::start_with(&["--map-ids", "passthrough"], &["--writes=create-behind"]);
    let plain = t.mnt.join("plain");
    let shared = t.mnt.join("shared");
    fs::create_dir(&plain).unwrap();
    fs::create_dir(&shared).unwrap();
    // A set-group-ID directory of another group (root may give it any).
    let setgid = unsafe { libc::geteuid() } == 0;
    if setgid {
        std::os::unix::fs::chown(t.export.join("shared"), None, Some(4242)).unwrap();
        fs::set_permissions(t.export.join("shared"), fs::Permissions::from_mode(0o2777)).unwrap();
        common::wait_until("the guest sees the change", Duration::from_secs(5), || {
            let m = fs::metadata(&shared).unwrap();
            m.gid() == 4242 && m.mode() & 0o7777 == 0o2777
        });
    }
    let mut made = Vec::new();
    for i in 0..300u32 {
        let dir = if i % 3 == 0 { &shared } else { &plain };
        let path = dir.join(format!("f{i}"));
        let mode = if i % 2 == 0 { 0o640 } else { 0o755 };
        let f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&path)
            .unwrap();
        // Every fifth stays empty (touch, lock files).
        if i % 5 != 0 {
            f.write_all_at(format!("content {i}\n").as_bytes(), 0)
                .unwrap();
        }
        drop(f);
        // The server names the file before it reads the listing asked for next.
        if i % 10 == 9 {
            let listed = fs::read_dir(dir)
                .unwrap()
                .any(|e| e.unwrap().path() == path);
            assert!(
                listed,
                "{} is missing from a listing right after",
                path.display()
            );
        }
        made.push((path, mode, i % 5 != 0));
    }
    let early = write_behind_count(&t.mnt, "file creations answered");
    assert!(
        early >= 200,
        "only {early} of 300 creations were answered with spare files:\n{}",
        common::status(&t.mnt)
    );
    for (path, mode, written) in &made {
        let host = t.export.join(path.strip_prefix(&t.mnt).unwrap());
        common::wait_until("the host has the file", Duration::from_secs(10), || {
            host.exists()
        });
        let (g, h) = (fs::metadata(path).unwrap(), fs::metadata(&host).unwrap());
        let name = path.display();
        assert_eq!(g.ino(), h.ino(), "{name}: inode number");
        // The umask takes bits away, never the owner's here.
        assert_eq!(g.mode() & 0o700, mode & 0o700, "{name}: guest mode");
        assert_eq!(g.mode() & 0o7777 & !mode, 0, "{name}: guest mode");
        assert_eq!(h.mode() & 0o7777, g.mode() & 0o7777, "{name}: host mode");
        assert_eq!(g.uid(), h.uid(), "{name}: owner");
        assert_eq!(g.gid(), h.gid(), "{name}: group");
        if setgid && path.starts_with(&shared) {
            assert_eq!(h.gid(), 4242, "{name}: the set-group-ID directory's group");
        }
        assert_eq!(h.nlink(), 1, "{name}: links");
        if *written {
            assert_eq!(fs::read(&host).unwrap(), fs::read(path).unwrap(), "{name}");
        } else {
            assert_eq!(h.len(), 0, "{name}");
            // Nothing refreshed the guest's attributes: the time it was told is the host's.
            assert_eq!(
                (g.mtime(), g.mtime_nsec()),
                (h.mtime(), h.mtime_nsec()),
                "{name}: modification time"
            );
        }
    }
    assert_eq!(write_behind_count(&t.mnt, "of those failed there"), 0);
    // Listings agree.
    for dir in ["plain", "shared"] {
        let names = |d: &Path| {
            let mut v: Vec<_> = fs::read_dir(d)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            v.sort();
            v
        };
        assert_eq!(names(&t.mnt.join(dir)), names(&t.export.join(dir)));
    }
}

/// Makes directory `d` in the mount with spares at hand for it, then stops the server
/// (SIGSTOP). Returns the directory, and what continues the server when dropped.
fn stop_the_server_with_spares_at_hand(t: &TestMount) -> (std::path::PathBuf, common::Stopped) {
    let dir = t.mnt.join("d");
    fs::create_dir(&dir).unwrap();
    // The first creations ask for spares: wait until they came and the last creation's
    // BIND is answered.
    for i in 0..4 {
        fs::write(dir.join(format!("warm{i}")), b"w").unwrap();
    }
    common::wait_until("spares at hand", Duration::from_secs(5), || {
        write_behind_count(&t.mnt, "at hand") >= 4 && write_behind_count(&t.mnt, "in flight") == 0
    });
    // The guest's kernel asks for the directory's attributes before its next creation:
    // have it do so now, while the server still answers.
    let _ = fs::metadata(dir.join("x"));
    let server = t.server.child.id() as i32;
    (dir, common::Stopped::stop(server))
}

/// Opens `path` with `open` (a creation) and writes `data` to it on a thread of its own,
/// while the server is stopped: returns once both were answered with a spare file and
/// early, with the thread, which returns the file.
fn create_and_write_early(
    t: &TestMount,
    open: OpenOptions,
    path: &Path,
    data: &'static [u8],
) -> std::thread::JoinHandle<File> {
    let before = write_behind_count(&t.mnt, "file creations answered");
    let (tx, rx) = std::sync::mpsc::channel();
    let path = path.to_path_buf();
    let writer = std::thread::spawn(move || {
        let mut f = open.open(&path).unwrap();
        std::io::Write::write_all(&mut f, data).unwrap();
        tx.send(()).unwrap();
        f
    });
    rx.recv_timeout(Duration::from_secs(5))
        .expect("the creation or the write waited for the stopped server");
    assert_eq!(
        write_behind_count(&t.mnt, "file creations answered"),
        before + 1
    );
    writer
}

/// A name the host takes while the server is stopped, created in the guest meanwhile: the
/// creation is answered with a spare (the guest's kernel could not know), BIND then fails,
/// fsync() reports EEXIST, and the guest sees the host's file, not its own.
#[test]
fn a_creation_the_server_refuses_after_answering_reports_it_and_shows_the_hosts_file() {
    require_mount!();
    let _one_at_a_time = one_at_a_time();
    if skipped_with_the_writeback_cache() {
        return;
    }
    let t = TestMount::start_with(&[], &["--writes=create-behind"]);
    let (dir, resume) = stop_the_server_with_spares_at_hand(&t);
    fs::write(t.export.join("d/y"), b"the host's\n").unwrap();
    let mut open = OpenOptions::new();
    open.write(true).create(true).truncate(true);
    let writer = create_and_write_early(&t, open, &dir.join("y"), b"the guest's\n");
    drop(resume);
    let f = writer.join().unwrap();
    let err = f
        .sync_all()
        .expect_err("fsync after a refused creation succeeded");
    assert_eq!(err.raw_os_error(), Some(libc::EEXIST), "{err}");
    drop(f);
    assert_eq!(write_behind_count(&t.mnt, "of those failed there"), 1);
    assert_eq!(fs::read(t.export.join("d/y")).unwrap(), b"the host's\n");
    common::wait_until(
        "the guest sees the host's file",
        Duration::from_secs(5),
        || fs::read(dir.join("y")).ok().as_deref() == Some(b"the host's\n"),
    );
}

/// A creation answered with a spare file while the server was stopped, which was then
/// killed before it named the file (its spare went with it): the reconnect makes the file
/// anew under the node id the guest's kernel holds, the write answered early reaches it,
/// and the file the guest still has open goes on working.
#[test]
fn a_creation_the_server_was_killed_before_naming_is_made_after_the_restart() {
    use std::io::Write;
    require_mount!();
    let _one_at_a_time = one_at_a_time();
    if skipped_with_the_writeback_cache() {
        return;
    }
    let mut t = TestMount::start_with(&[], &["--writes=create-behind"]);
    let next_server = common::Server::prepare(&t.export, &t.server.address);
    let (dir, resume) = stop_the_server_with_spares_at_hand(&t);
    let mut open = OpenOptions::new();
    open.write(true).create_new(true);
    let writer = create_and_write_early(&t, open, &dir.join("y"), b"before the restart\n");
    // Killed while stopped: neither the BIND nor the write was executed.
    std::mem::forget(resume);
    t.server.stop_with(libc::SIGKILL);
    assert!(!t.export.join("d/y").exists());
    t.server = next_server.start();
    let mut f = writer.join().unwrap();
    f.write_all(b"after it\n").unwrap();
    f.sync_all().expect("fsync of the file made again");
    // The file made anew is another host file than the spare: the kernel knows the node by
    // the spare's generation, and a node it is given under another one is "reused": it
    // marks its inode bad, and every use of a descriptor open on it fails with EIO. The
    // reconnect dropped the cached listing: this one comes from the server.
    let listed: Vec<_> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(listed.iter().any(|n| n == "y"), "{listed:?}");
    f.write_all(b"and after a listing\n")
        .expect("a write through the descriptor kept open");
    f.sync_all().expect("fsync after a listing");
    drop(f);
    let want = b"before the restart\nafter it\nand after a listing\n";
    assert_eq!(fs::read(t.export.join("d/y")).unwrap(), want);
    assert_eq!(fs::read(dir.join("y")).unwrap(), want);
    assert_eq!(write_behind_count(&t.mnt, "of those failed there"), 0);
    // By the reconnect's restore, before the write waiting for it was sent again.
    assert_eq!(
        write_behind_count(&t.mnt, "named again after a reconnect"),
        1
    );
    assert!(
        common::status(&t.mnt).contains("connection: up (1 reconnects"),
        "{}",
        common::status(&t.mnt)
    );
}
