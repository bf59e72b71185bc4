//! The export boundary, attacked through the protocol library (not through a kernel, which
//! would sanitize names) against a real `tether serve` process: crafted names, made-up node
//! ids and handles, symlinks that point out of the export, host-side swaps raced against
//! requests, and a read-only export asked to change.
//!
//! Every fixture is a temp dir laid out as
//!
//! ```text
//! ROOT/run/tether.sock
//! ROOT/outside/secret        marker content, xattr user.tether_marker = marker
//! ROOT/outside/sub/inner     marker content
//! ROOT/outside/<marker>      a file whose *name* is the marker (catches listings)
//! ROOT/export/               what is served (mode 0777)
//!     f  d/g  e/  unissued  xf (xattr user.keep)  race/r  victim  scratch  pad-00..39
//!     up -> ../outside/secret    abs -> ROOT/outside/secret    slash -> /
//!     updir -> ../outside        absdir -> ROOT/outside        nothere -> ../outside/nothere
//! ```
//!
//! Everything outside `export` is snapshotted after the server started (names, sizes, modes,
//! owners, link counts, inode numbers, mtimes, ctimes, content, link targets, xattrs; the
//! atimes of regular files are set in the past first, so that a read by the server would move
//! them) and compared at the end of each test. Every reply is checked for the marker (in data,
//! xattr values and listed names) and for the inode numbers of things outside the export.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use common::Server;
use tether_client::Connection;
use tether_proto::handshake::features;
use tether_proto::{
    setattr_valid, Caller, Entry, HandleId, NodeId, Reply, Request, SetAttr, SetTime, Timespec,
    WireErrno, ROOT_NODE,
};
use tether_transport::Address;

type R = Result<Reply, WireErrno>;

const ROOT_CALLER: Caller = Caller {
    uid: 0,
    gid: 0,
    pid: 4242,
};
const USER_CALLER: Caller = Caller {
    uid: 1000,
    gid: 1000,
    pid: 4243,
};
const CALLERS: [Caller; 2] = [ROOT_CALLER, USER_CALLER];

/// How long a single request may take before the test calls the server hung.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long each race runs.
const RACE_TIME: Duration = Duration::from_millis(2500);

/// A name or blob for a request field (whatever byte-string type the protocol uses).
fn nm<T: From<Vec<u8>>>(s: impl AsRef<[u8]>) -> T {
    T::from(s.as_ref().to_vec())
}

/// A short, printable description of a name for assertion messages.
fn show(name: &[u8]) -> String {
    if name.len() > 40 {
        format!(
            "<{} bytes starting {:?}>",
            name.len(),
            String::from_utf8_lossy(&name[..8])
        )
    } else {
        format!("{:?}", String::from_utf8_lossy(name))
    }
}

/// A request, printed short enough for a message (names may be 64 KiB).
fn short(req: &Request) -> String {
    let s = format!("{req:?}");
    if s.len() > 300 {
        let cut: String = s.chars().take(300).collect();
        format!("{cut}...")
    } else {
        s
    }
}

fn errname(r: &R) -> String {
    match r {
        Ok(reply) => format!("success {:?}", short_reply(reply)),
        Err(e) => e.to_string(),
    }
}

fn short_reply(reply: &Reply) -> String {
    let s = format!("{reply:?}");
    s.chars().take(300).collect()
}

#[track_caller]
fn expect_err(r: &R, want: WireErrno, what: &str) {
    assert_eq!(
        r.as_ref().err(),
        Some(&want),
        "{what}: expected {want}, got {}",
        errname(r)
    );
}

#[track_caller]
fn expect_any_err(r: &R, what: &str) {
    assert!(r.is_err(), "{what}: expected an error, got {}", errname(r));
}

fn no_set() -> SetAttr {
    SetAttr {
        valid: 0,
        mode: 0,
        uid: 0,
        gid: 0,
        size: 0,
        atime: SetTime::Omit,
        mtime: SetTime::Omit,
    }
}

/// One SETATTR of each kind.
fn setattr_kinds() -> Vec<(&'static str, SetAttr)> {
    let at = SetTime::At(Timespec { sec: 1, nsec: 0 });
    vec![
        (
            "truncate to 0",
            SetAttr {
                valid: setattr_valid::SIZE,
                ..no_set()
            },
        ),
        (
            "extend to 1 MiB",
            SetAttr {
                valid: setattr_valid::SIZE,
                size: 1 << 20,
                ..no_set()
            },
        ),
        (
            "chmod 4777",
            SetAttr {
                valid: setattr_valid::MODE,
                mode: 0o4777,
                ..no_set()
            },
        ),
        (
            "chown uid",
            SetAttr {
                valid: setattr_valid::UID,
                uid: 1000,
                ..no_set()
            },
        ),
        (
            "chown gid",
            SetAttr {
                valid: setattr_valid::GID,
                gid: 1000,
                ..no_set()
            },
        ),
        (
            "atime now",
            SetAttr {
                atime: SetTime::Now,
                ..no_set()
            },
        ),
        (
            "mtime at 1",
            SetAttr {
                mtime: at,
                ..no_set()
            },
        ),
        ("nothing", no_set()),
    ]
}

// ---------------------------------------------------------------------------------------
// Snapshots of the file tree.

#[derive(Debug, Clone, PartialEq, Eq)]
struct Meta {
    mode: u32,
    uid: u32,
    gid: u32,
    nlink: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
    /// Regular files only, and only where a read must not have happened.
    atime: Option<(i64, i64)>,
    content: Option<String>,
    target: Option<PathBuf>,
    xattrs: BTreeMap<String, String>,
}

type Snapshot = BTreeMap<PathBuf, Meta>;

/// Everything under `dir` (by path relative to it), except `skip` and what is below it.
fn snapshot(dir: &Path, skip: Option<&Path>, atimes: bool) -> Snapshot {
    let mut out = BTreeMap::new();
    walk(dir, dir, skip, atimes, &mut out);
    out
}

fn walk(base: &Path, path: &Path, skip: Option<&Path>, atimes: bool, out: &mut Snapshot) {
    if Some(path) == skip {
        return;
    }
    let md = fs::symlink_metadata(path).unwrap();
    let ft = md.file_type();
    let atime = (atimes && ft.is_file()).then(|| (md.atime(), md.atime_nsec()));
    let content = ft.is_file().then(|| {
        // O_NOATIME: the snapshot itself must not move the atimes it records.
        let data = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOATIME)
            .open(path)
            .and_then(|mut f| {
                let mut v = Vec::new();
                std::io::Read::read_to_end(&mut f, &mut v).map(|_| v)
            })
            .or_else(|_| fs::read(path))
            .unwrap();
        String::from_utf8_lossy(&data).into_owned()
    });
    let target = ft.is_symlink().then(|| fs::read_link(path).unwrap());
    let xattrs = if ft.is_symlink() {
        BTreeMap::new()
    } else {
        xattrs_of(path)
    };
    out.insert(
        path.strip_prefix(base).unwrap().to_path_buf(),
        Meta {
            mode: md.mode(),
            uid: md.uid(),
            gid: md.gid(),
            nlink: md.nlink(),
            ino: md.ino(),
            size: md.size(),
            mtime: (md.mtime(), md.mtime_nsec()),
            ctime: (md.ctime(), md.ctime_nsec()),
            atime,
            content,
            target,
            xattrs,
        },
    );
    if ft.is_dir() {
        let mut children: Vec<PathBuf> = fs::read_dir(path)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        children.sort();
        for child in children {
            walk(base, &child, skip, atimes, out);
        }
    }
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

/// All extended attributes of `path` (not following a symlink), as text.
fn xattrs_of(path: &Path) -> BTreeMap<String, String> {
    let p = cpath(path);
    let mut names = vec![0u8; 64 * 1024];
    // SAFETY: valid C string; the buffer is writable for its length.
    let n = unsafe { libc::llistxattr(p.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    let mut out = BTreeMap::new();
    if n <= 0 {
        return out;
    }
    for name in names[..n as usize]
        .split(|&b| b == 0)
        .filter(|n| !n.is_empty())
    {
        let cname = CString::new(name).unwrap();
        let mut value = vec![0u8; 64 * 1024];
        // SAFETY: valid C strings; the buffer is writable for its length.
        let m = unsafe {
            libc::lgetxattr(
                p.as_ptr(),
                cname.as_ptr(),
                value.as_mut_ptr().cast(),
                value.len(),
            )
        };
        let value = if m >= 0 {
            String::from_utf8_lossy(&value[..m as usize]).into_owned()
        } else {
            "<unreadable>".into()
        };
        out.insert(String::from_utf8_lossy(name).into_owned(), value);
    }
    out
}

fn set_xattr(path: &Path, name: &str, value: &[u8]) -> bool {
    let p = cpath(path);
    let n = CString::new(name).unwrap();
    // SAFETY: valid C strings; value is readable for its length.
    unsafe {
        libc::lsetxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        ) == 0
    }
}

/// Sets a file's atime to 2001 (before its mtime), so a later read moves it (relatime).
fn age_atime(path: &Path) {
    let p = cpath(path);
    let times = [
        libc::timespec {
            tv_sec: 1_000_000_000,
            tv_nsec: 0,
        },
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
    ];
    // SAFETY: valid C string and two timespecs.
    let r = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            p.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    assert_eq!(r, 0, "age atime of {}", path.display());
}

#[track_caller]
fn assert_same(what: &str, before: &Snapshot, after: &Snapshot) {
    if before == after {
        return;
    }
    let mut diffs = Vec::new();
    for (p, m) in before {
        match after.get(p) {
            None => diffs.push(format!("  {} removed", p.display())),
            Some(a) if a != m => {
                diffs.push(format!("  {} changed:\n    {m:?}\n -> {a:?}", p.display()))
            }
            _ => {}
        }
    }
    for p in after.keys().filter(|p| !before.contains_key(*p)) {
        diffs.push(format!("  {} appeared", p.display()));
    }
    panic!("{what} changed:\n{}", diffs.join("\n"));
}

// ---------------------------------------------------------------------------------------
// The fixture: a real server over a real tree.

/// What must never come back in a reply.
struct Guard {
    marker: Vec<u8>,
    /// Inode numbers of things outside the export (on the export's file system): node ids
    /// are host inode numbers, so one of these in a reply means something outside was stat'ed.
    outside_inos: HashSet<u64>,
}

impl Guard {
    fn has_marker(&self, data: &[u8]) -> bool {
        data.windows(self.marker.len()).any(|w| w == self.marker)
    }

    /// (The export's node ids are the host's inode numbers.)
    fn outside_ino(&self, ino: NodeId) -> bool {
        self.outside_inos.contains(&ino.get())
    }

    fn entry_leak(&self, e: &Entry) -> Option<String> {
        (self.outside_ino(e.node) || self.outside_ino(e.attr.ino))
            .then(|| format!("an entry for outside inode {} / {}", e.node, e.attr.ino))
    }

    /// Why `reply` crosses the boundary, if it does.
    fn leak(&self, reply: &Reply) -> Option<String> {
        match reply {
            Reply::Data(d) | Reply::XattrData(d) if self.has_marker(d) => {
                Some("data carrying the outside marker".into())
            }
            Reply::Entry(e) | Reply::Create { entry: e, .. } => self.entry_leak(e),
            Reply::Attr(a) if self.outside_ino(a.ino) => {
                Some(format!("attributes of outside inode {}", a.ino))
            }
            Reply::Dir { entries, .. } => entries.iter().find_map(|de| {
                if self.has_marker(&de.name) {
                    return Some("a listing of the outside directory".into());
                }
                // ".." of the export root is checked by its own test.
                if &de.name[..] != b".." && self.outside_ino(de.ino) {
                    return Some(format!("a directory entry of outside inode {}", de.ino));
                }
                de.entry.as_ref().and_then(|e| self.entry_leak(e))
            }),
            _ => None,
        }
    }
}

struct Fixture {
    /// Declared first: the server is stopped (by PID, in its Drop) before the tree goes.
    server: Server,
    root: PathBuf,
    export: PathBuf,
    outside: PathBuf,
    address: Address,
    guard: Arc<Guard>,
    /// Everything outside the export, taken once the server was up.
    before: Snapshot,
    _dir: tempfile::TempDir,
}

impl Fixture {
    fn new(serve_args: &[&str]) -> Fixture {
        Fixture::start(serve_args, None)
    }

    /// With `run_as` (uid, gid), the server runs as that user (the test must be root); the
    /// export's symlinks then belong to it, so that it may hard-link them.
    fn start(serve_args: &[&str], run_as: Option<(u32, u32)>) -> Fixture {
        let dir = tempfile::Builder::new()
            .prefix("tether-boundary")
            .tempdir()
            .unwrap();
        let root = dir.path().canonicalize().unwrap();
        let export = root.join("export");
        let outside = root.join("outside");
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let marker = format!("TETHER-OUTSIDE-MARKER-{}-{nanos}", std::process::id());

        // Outside: what must stay out of reach.
        fs::create_dir(&outside).unwrap();
        let secret = outside.join("secret");
        fs::write(&secret, format!("{marker}\nthe secret\n")).unwrap();
        fs::set_permissions(&secret, fs::Permissions::from_mode(0o600)).unwrap();
        // Best effort: a file system without user xattrs still runs every other check.
        set_xattr(&secret, "user.tether_marker", marker.as_bytes());
        set_xattr(&outside, "user.tether_marker", marker.as_bytes());
        fs::create_dir(outside.join("sub")).unwrap();
        fs::write(outside.join("sub/inner"), format!("{marker}\ninner\n")).unwrap();
        fs::write(outside.join(&marker), "named after the marker\n").unwrap();

        // The export.
        fs::create_dir(&export).unwrap();
        fs::set_permissions(&export, fs::Permissions::from_mode(0o777)).unwrap();
        fs::write(export.join("f"), "inside file\n").unwrap();
        fs::create_dir(export.join("d")).unwrap();
        fs::set_permissions(export.join("d"), fs::Permissions::from_mode(0o777)).unwrap();
        fs::write(export.join("d/g"), "g\n").unwrap();
        fs::create_dir(export.join("e")).unwrap();
        fs::write(export.join("unissued"), "never looked up\n").unwrap();
        fs::write(export.join("xf"), "has an xattr\n").unwrap();
        set_xattr(&export.join("xf"), "user.keep", b"kept");
        fs::create_dir(export.join("race")).unwrap();
        fs::set_permissions(export.join("race"), fs::Permissions::from_mode(0o777)).unwrap();
        fs::write(export.join("race/r"), "in the race dir\n").unwrap();
        fs::write(export.join("victim"), "victim data\n").unwrap();
        fs::write(export.join("scratch"), "").unwrap();
        fs::set_permissions(export.join("scratch"), fs::Permissions::from_mode(0o666)).unwrap();
        for i in 0..40 {
            fs::write(export.join(format!("pad-{i:02}")), "pad\n").unwrap();
        }
        symlink("../outside/secret", export.join("up")).unwrap();
        symlink(&secret, export.join("abs")).unwrap();
        symlink("/", export.join("slash")).unwrap();
        symlink("../outside", export.join("updir")).unwrap();
        symlink(&outside, export.join("absdir")).unwrap();
        symlink("../outside/nothere", export.join("nothere")).unwrap();

        // The socket gets a directory of its own, writable by the server's user.
        let run = root.join("run");
        fs::create_dir(&run).unwrap();
        let sock = run.join("tether.sock");
        let address_text = format!("unix:{}", sock.display());
        let server = match run_as {
            None => Server::start(&export, &address_text, serve_args),
            Some((uid, gid)) => {
                fs::set_permissions(&root, fs::Permissions::from_mode(0o755)).unwrap();
                // Outside is open to everyone: only the server's discipline protects it.
                for (p, mode) in [
                    (outside.clone(), 0o777),
                    (outside.join("sub"), 0o777),
                    (secret.clone(), 0o666),
                    (outside.join("sub/inner"), 0o666),
                    (outside.join(&marker), 0o666),
                ] {
                    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
                }
                std::os::unix::fs::chown(&run, Some(uid), Some(gid)).unwrap();
                for l in ["up", "abs", "slash", "updir", "absdir", "nothere"] {
                    std::os::unix::fs::lchown(export.join(l), Some(uid), Some(gid)).unwrap();
                }
                Server::start_as(&export, &address_text, serve_args, uid, gid)
            }
        };
        let address: Address = address_text.parse().unwrap();

        // Inode numbers outside the export, on its file system.
        let dev = fs::metadata(&export).unwrap().dev();
        let mut outside_inos = HashSet::new();
        let mut note = |p: &Path| {
            if let Ok(md) = fs::symlink_metadata(p) {
                if md.dev() == dev {
                    outside_inos.insert(md.ino());
                }
            }
        };
        note(&root);
        note(&sock);
        for p in ["/", "/etc", "/etc/passwd", "/tmp"] {
            note(Path::new(p));
        }
        for rel in snapshot(&outside, None, false).keys() {
            note(&outside.join(rel));
        }

        for p in [
            secret.clone(),
            outside.join("sub/inner"),
            outside.join(&marker),
        ] {
            age_atime(&p);
        }
        let before = snapshot(&root, Some(&export), true);
        Fixture {
            server,
            root,
            export,
            outside,
            address,
            guard: Arc::new(Guard {
                marker: marker.into_bytes(),
                outside_inos,
            }),
            before,
            _dir: dir,
        }
    }

    fn marker_name(&self) -> Vec<u8> {
        self.guard.marker.clone()
    }

    fn client(&self) -> Client {
        let stream = tether_transport::connect(&self.address).expect("connect to the server");
        let conn = Connection::start(stream, "boundary-test", None, false).expect("handshake");
        assert_ne!(
            conn.hello.features & features::IO_BY_NODE,
            0,
            "the server must grant IO_BY_NODE (these tests send I/O with handle 0)"
        );
        Client {
            conn,
            guard: self.guard.clone(),
        }
    }

    fn export_snapshot(&self) -> Snapshot {
        snapshot(&self.export, None, false)
    }

    #[track_caller]
    fn assert_outside_unchanged(&self) {
        let after = snapshot(&self.root, Some(&self.export), true);
        assert_same("the tree outside the export", &self.before, &after);
    }

    /// The end of every test: nothing outside changed, and the server still serves a new
    /// connection.
    #[track_caller]
    fn finish(mut self) {
        self.assert_outside_unchanged();
        assert!(
            matches!(self.server.child.try_wait(), Ok(None)),
            "the server process exited"
        );
        let c = self.client();
        expect_ok(
            &c.call(ROOT_CALLER, &Request::Ping),
            "ping on a fresh connection",
        );
        let f = c.lookup(ROOT_CALLER, ROOT_NODE, "f");
        let data = c.read(ROOT_CALLER, f.node, None);
        assert_eq!(data, b"inside file\n", "reading f on a fresh connection");
    }
}

#[track_caller]
fn expect_ok(r: &R, what: &str) {
    assert!(r.is_ok(), "{what}: expected success, got {}", errname(r));
}

/// One connection, every reply vetted by the guard.
struct Client {
    conn: Arc<Connection>,
    guard: Arc<Guard>,
}

impl Drop for Client {
    fn drop(&mut self) {
        self.conn.shut_down();
    }
}

impl Client {
    /// Sends `req` and waits (bounded) for the reply; panics if the reply crosses the boundary.
    #[track_caller]
    fn call(&self, caller: Caller, req: &Request) -> R {
        let (tx, rx) = mpsc::sync_channel(1);
        self.conn.call(caller, req, move |r| {
            let _ = tx.send(r);
        });
        let r = rx
            .recv_timeout(REPLY_TIMEOUT)
            .unwrap_or_else(|_| panic!("no reply within {REPLY_TIMEOUT:?} to {}", short(req)));
        if let Ok(reply) = &r {
            if let Some(why) = self.guard.leak(reply) {
                panic!(
                    "BOUNDARY CROSSED: {} by {:?} got {why}: {}",
                    short(req),
                    caller,
                    short_reply(reply)
                );
            }
        }
        r
    }

    #[track_caller]
    fn lookup(&self, caller: Caller, parent: NodeId, name: impl AsRef<[u8]>) -> Entry {
        let name = name.as_ref();
        match self.call(
            caller,
            &Request::Lookup {
                parent,
                name: nm(name),
            },
        ) {
            Ok(Reply::Entry(e)) => e,
            other => panic!("lookup {}: {}", show(name), errname(&other)),
        }
    }

    fn forget(&self, node: NodeId, n: u64) {
        self.conn.send_oneway(
            ROOT_CALLER,
            &Request::Forget {
                nodes: vec![(node, n)],
            },
        );
    }

    #[track_caller]
    fn open(&self, caller: Caller, node: NodeId, flags: i32) -> HandleId {
        match self.call(
            caller,
            &Request::Open {
                node,
                flags: flags as u32,
            },
        ) {
            Ok(Reply::Open { fh, .. }) => fh,
            other => panic!("open {node} {flags:#o}: {}", errname(&other)),
        }
    }

    #[track_caller]
    fn opendir(&self, caller: Caller, node: NodeId) -> HandleId {
        match self.call(caller, &Request::Opendir { node, flags: 0 }) {
            Ok(Reply::Open { fh, .. }) => fh,
            other => panic!("opendir {node}: {}", errname(&other)),
        }
    }

    fn release(&self, node: NodeId, fh: HandleId) {
        let _ = self.call(ROOT_CALLER, &Request::Release { node, fh: Some(fh) });
    }

    /// Reads up to 64 KiB at offset 0 through `fh` (None: by node).
    #[track_caller]
    fn read(&self, caller: Caller, node: NodeId, fh: Option<HandleId>) -> Vec<u8> {
        match self.call(
            caller,
            &Request::Read {
                node,
                fh,
                offset: 0,
                size: 64 * 1024,
            },
        ) {
            Ok(Reply::Data(d)) => d.to_vec(),
            other => panic!("read {node}/{fh:?}: {}", errname(&other)),
        }
    }

    /// Every name of directory `node` (by a listing addressed by node).
    #[track_caller]
    fn list(&self, node: NodeId) -> Vec<Vec<u8>> {
        match self.call(
            ROOT_CALLER,
            &Request::Readdir {
                node,
                fh: None,
                offset: 0,
                size: 1 << 20,
                plus: false,
            },
        ) {
            Ok(Reply::Dir { entries: v, .. }) => v.iter().map(|de| de.name.to_vec()).collect(),
            other => panic!("readdir {node}: {}", errname(&other)),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Crafted names.

/// Names no request may use as a new or looked-up name, with the errno docs/protocol.md §5
/// gives for each.
fn bad_names() -> Vec<(Vec<u8>, WireErrno)> {
    let mut v: Vec<(Vec<u8>, WireErrno)> = [
        &b".."[..],
        b".",
        b"",
        b"a/b",
        b"../outside",
        b"../outside/secret",
        b"../../../../../../../../../../etc/passwd",
        b"/etc/passwd",
        b"/",
        b"./f",
        b"d/",
        b"d/g",
        b"x\0y",
        b"\0",
        // A C string would stop at the NUL and name an existing file or directory.
        b"f\0",
        b"e\0",
        b"..\0",
        b"race\0/../../outside",
    ]
    .iter()
    .map(|n| (n.to_vec(), WireErrno::EINVAL))
    .collect();
    let mut dotdot_long = b"../".to_vec();
    dotdot_long.extend(std::iter::repeat_n(b'a', 300));
    v.push((dotdot_long, WireErrno::EINVAL));
    for len in [256, 4096, u16::MAX as usize] {
        v.push((vec![b'a'; len], WireErrno::ENAMETOOLONG));
    }
    v
}

/// Every request that takes a path component, with `name` in it (in `parent`, or as the
/// other end of a rename or link). `file` is a file node to link.
fn name_ops(parent: NodeId, file: NodeId, name: &[u8]) -> Vec<(&'static str, Request)> {
    use Request::*;
    let creat = (libc::O_RDWR | libc::O_CREAT) as u32;
    let creat_excl = (libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC) as u32;
    vec![
        (
            "lookup",
            Lookup {
                parent,
                name: nm(name),
            },
        ),
        (
            "mknod fifo",
            Mknod {
                parent,
                name: nm(name),
                mode: libc::S_IFIFO | 0o644,
                rdev: 0,
                umask: 0,
            },
        ),
        (
            "mknod regular",
            Mknod {
                parent,
                name: nm(name),
                mode: libc::S_IFREG | 0o644,
                rdev: 0,
                umask: 0,
            },
        ),
        (
            "mkdir",
            Mkdir {
                parent,
                name: nm(name),
                mode: 0o755,
                umask: 0,
            },
        ),
        (
            "unlink",
            Unlink {
                parent,
                name: nm(name),
            },
        ),
        (
            "rmdir",
            Rmdir {
                parent,
                name: nm(name),
            },
        ),
        (
            "symlink",
            Symlink {
                parent,
                name: nm(name),
                target: nm("../outside/secret"),
            },
        ),
        (
            "rename (old name)",
            Rename {
                parent,
                name: nm(name),
                new_parent: ROOT_NODE,
                new_name: nm("renamed"),
                flags: 0,
            },
        ),
        (
            "rename (new name)",
            Rename {
                parent: ROOT_NODE,
                name: nm("f"),
                new_parent: parent,
                new_name: nm(name),
                flags: 0,
            },
        ),
        (
            "rename noreplace (new name)",
            Rename {
                parent: ROOT_NODE,
                name: nm("f"),
                new_parent: parent,
                new_name: nm(name),
                flags: libc::RENAME_NOREPLACE,
            },
        ),
        (
            "rename exchange (new name)",
            Rename {
                parent: ROOT_NODE,
                name: nm("f"),
                new_parent: parent,
                new_name: nm(name),
                flags: libc::RENAME_EXCHANGE,
            },
        ),
        (
            "rename exchange (old name)",
            Rename {
                parent,
                name: nm(name),
                new_parent: ROOT_NODE,
                new_name: nm("f"),
                flags: libc::RENAME_EXCHANGE,
            },
        ),
        (
            "link (new name)",
            Link {
                node: file,
                new_parent: parent,
                new_name: nm(name),
            },
        ),
        (
            "create",
            Create {
                parent,
                name: nm(name),
                mode: libc::S_IFREG | 0o644,
                umask: 0,
                flags: creat,
            },
        ),
        (
            "create excl trunc",
            Create {
                parent,
                name: nm(name),
                mode: libc::S_IFREG | 0o644,
                umask: 0,
                flags: creat_excl,
            },
        ),
    ]
}

#[test]
fn crafted_names_are_refused_by_every_op_that_takes_one() {
    let fx = Fixture::new(&[]);
    let c = fx.client();
    let f = c.lookup(ROOT_CALLER, ROOT_NODE, "f");
    let d = c.lookup(ROOT_CALLER, ROOT_NODE, "d");
    let export_before = fx.export_snapshot();
    let mut sent = 0;
    for caller in CALLERS {
        for parent in [ROOT_NODE, d.node] {
            for (name, want) in bad_names() {
                for (op, req) in name_ops(parent, f.node, &name) {
                    let r = c.call(caller, &req);
                    let what = format!(
                        "{op} of {} in node {parent} as uid {}",
                        show(&name),
                        caller.uid
                    );
                    expect_err(&r, want, &what);
                    sent += 1;
                }
            }
        }
    }
    assert!(sent > 1000);
    assert_same("the export", &export_before, &fx.export_snapshot());

    // Control: the same operations with proper names work, so the refusals above are about
    // the names. (As root only: what an unprivileged caller may create depends on the
    // export's id mapping, and EINVAL/ENAMETOOLONG are never permission errors anyway.)
    for (caller, tag) in [(ROOT_CALLER, "r")] {
        let name = |s: &str| format!("ok-{tag}-{s}");
        for (req, what) in [
            (
                Request::Mkdir {
                    parent: d.node,
                    name: nm(name("dir")),
                    mode: 0o755,
                    umask: 0,
                },
                "mkdir",
            ),
            (
                Request::Symlink {
                    parent: d.node,
                    name: nm(name("link")),
                    target: nm("../outside/secret"),
                },
                "symlink",
            ),
            (
                Request::Link {
                    node: f.node,
                    new_parent: d.node,
                    new_name: nm(name("hard")),
                },
                "link",
            ),
            (
                Request::Mknod {
                    parent: d.node,
                    name: nm(name("fifo")),
                    mode: libc::S_IFIFO | 0o644,
                    rdev: 0,
                    umask: 0,
                },
                "mknod",
            ),
            (
                Request::Create {
                    parent: d.node,
                    name: nm(name("file")),
                    mode: libc::S_IFREG | 0o644,
                    umask: 0,
                    flags: (libc::O_RDWR | libc::O_CREAT | libc::O_EXCL) as u32,
                },
                "create",
            ),
            (
                Request::Rename {
                    parent: d.node,
                    name: nm(name("file")),
                    new_parent: d.node,
                    new_name: nm(name("renamed")),
                    // The portable backend takes no rename flags on Linux (docs/macos.md).
                    flags: if common::suite_serves_with("portable") {
                        0
                    } else {
                        libc::RENAME_NOREPLACE
                    },
                },
                "rename",
            ),
            (
                Request::Unlink {
                    parent: d.node,
                    name: nm(name("fifo")),
                },
                "unlink",
            ),
        ] {
            expect_ok(&c.call(caller, &req), what);
        }
    }
    let names = c.list(d.node);
    for want in ["ok-r-dir", "ok-r-link", "ok-r-hard", "ok-r-renamed"] {
        assert!(
            names.iter().any(|n| n == want.as_bytes()),
            "control {want} missing from {:?}",
            names.iter().map(|n| show(n)).collect::<Vec<_>>()
        );
    }
    fx.finish();
}

#[test]
fn device_nodes_whiteouts_and_bad_symlink_targets_are_refused() {
    let fx = Fixture::new(&[]);
    let c = fx.client();
    let export_before = fx.export_snapshot();
    let disk = fs::metadata(&fx.export).unwrap().dev();
    for caller in CALLERS {
        for (what, mode, rdev) in [
            (
                "char device 1:3",
                libc::S_IFCHR | 0o666,
                libc::makedev(1, 3),
            ),
            (
                "char device 1:1 (mem)",
                libc::S_IFCHR | 0o666,
                libc::makedev(1, 1),
            ),
            (
                "block device of the export's disk",
                libc::S_IFBLK | 0o666,
                disk,
            ),
            ("directory by mknod", libc::S_IFDIR | 0o755, 0),
            ("symlink by mknod", libc::S_IFLNK | 0o777, 0),
        ] {
            let r = c.call(
                caller,
                &Request::Mknod {
                    parent: ROOT_NODE,
                    name: nm("dev"),
                    mode,
                    rdev,
                    umask: 0,
                },
            );
            expect_err(&r, WireErrno::EPERM, what);
        }
        // A whiteout is a 0:0 character device made by rename.
        for flags in [libc::RENAME_WHITEOUT, u32::MAX, 1 << 31] {
            let r = c.call(
                caller,
                &Request::Rename {
                    parent: ROOT_NODE,
                    name: nm("f"),
                    new_parent: ROOT_NODE,
                    new_name: nm("g"),
                    flags,
                },
            );
            expect_err(
                &r,
                WireErrno::EINVAL,
                &format!("rename with flags {flags:#x}"),
            );
        }
        let long_target = vec![b'a'; 4096];
        for (target, want) in [
            (&b"../outside\0/secret"[..], WireErrno::EINVAL),
            (b"\0", WireErrno::EINVAL),
            (&long_target[..], WireErrno::ENAMETOOLONG),
        ] {
            let r = c.call(
                caller,
                &Request::Symlink {
                    parent: ROOT_NODE,
                    name: nm("sl"),
                    target: nm(target),
                },
            );
            expect_err(&r, want, &format!("symlink to {}", show(target)));
        }
    }
    assert_same("the export", &export_before, &fx.export_snapshot());
    fx.finish();
}

// ---------------------------------------------------------------------------------------
// Node ids and handles.

/// Every request that addresses a node, addressed to `n`. `file` is a valid file node
/// for the other end of two-node requests.
fn node_ops(n: NodeId, file: NodeId) -> Vec<(String, Request)> {
    use Request::*;
    let mut v: Vec<(String, Request)> = vec![
        ("getattr".into(), Getattr { node: n, fh: None }),
        ("readlink".into(), Readlink { node: n }),
        (
            "mknod".into(),
            Mknod {
                parent: n,
                name: nm("x"),
                mode: libc::S_IFREG | 0o644,
                rdev: 0,
                umask: 0,
            },
        ),
        (
            "mkdir".into(),
            Mkdir {
                parent: n,
                name: nm("x"),
                mode: 0o755,
                umask: 0,
            },
        ),
        (
            "lookup".into(),
            Lookup {
                parent: n,
                name: nm("secret"),
            },
        ),
        (
            "unlink".into(),
            Unlink {
                parent: n,
                name: nm("secret"),
            },
        ),
        (
            "rmdir".into(),
            Rmdir {
                parent: n,
                name: nm("sub"),
            },
        ),
        (
            "symlink".into(),
            Symlink {
                parent: n,
                name: nm("x"),
                target: nm("t"),
            },
        ),
        (
            "rename from".into(),
            Rename {
                parent: n,
                name: nm("secret"),
                new_parent: ROOT_NODE,
                new_name: nm("stolen"),
                flags: 0,
            },
        ),
        (
            "rename into".into(),
            Rename {
                parent: ROOT_NODE,
                name: nm("f"),
                new_parent: n,
                new_name: nm("planted"),
                flags: 0,
            },
        ),
        (
            "link of".into(),
            Link {
                node: n,
                new_parent: ROOT_NODE,
                new_name: nm("hard"),
            },
        ),
        (
            "link into".into(),
            Link {
                node: file,
                new_parent: n,
                new_name: nm("hard"),
            },
        ),
        (
            "read by node".into(),
            Read {
                node: n,
                fh: None,
                offset: 0,
                size: 4096,
            },
        ),
        (
            "write by node".into(),
            Write {
                node: n,
                fh: None,
                offset: 0,
                data: nm("pwned"),
            },
        ),
        ("statfs".into(), Statfs { node: n }),
        (
            "fsync".into(),
            Fsync {
                node: n,
                fh: None,
                datasync: false,
            },
        ),
        (
            "setxattr".into(),
            Setxattr {
                node: n,
                name: nm("user.pwned"),
                value: nm("1"),
                flags: 0,
            },
        ),
        (
            "getxattr".into(),
            Getxattr {
                node: n,
                name: nm("user.tether_marker"),
                size: 4096,
            },
        ),
        (
            "listxattr".into(),
            Listxattr {
                node: n,
                size: 4096,
            },
        ),
        (
            "removexattr".into(),
            Removexattr {
                node: n,
                name: nm("user.tether_marker"),
            },
        ),
        ("opendir".into(), Opendir { node: n, flags: 0 }),
        (
            "readdir by node".into(),
            Readdir {
                node: n,
                fh: None,
                offset: 0,
                size: 65536,
                plus: false,
            },
        ),
        (
            "readdirplus by node".into(),
            Readdir {
                node: n,
                fh: None,
                offset: 0,
                size: 65536,
                plus: true,
            },
        ),
        (
            "fsyncdir".into(),
            Fsyncdir {
                node: n,
                fh: None,
                datasync: true,
            },
        ),
        (
            "access".into(),
            Access {
                node: n,
                mask: libc::F_OK as u32,
            },
        ),
        (
            "create".into(),
            Create {
                parent: n,
                name: nm("x"),
                mode: libc::S_IFREG | 0o644,
                umask: 0,
                flags: libc::O_RDWR as u32,
            },
        ),
        (
            "fallocate by node".into(),
            Fallocate {
                node: n,
                fh: None,
                offset: 0,
                length: 4096,
                mode: 0,
            },
        ),
        (
            "lseek by node".into(),
            Lseek {
                node: n,
                fh: None,
                offset: 0,
                whence: libc::SEEK_END as u32,
            },
        ),
        (
            "copy_file_range from".into(),
            CopyFileRange {
                node_in: n,
                fh_in: None,
                offset_in: 0,
                node_out: file,
                fh_out: None,
                offset_out: 0,
                len: 4096,
                flags: 0,
            },
        ),
        (
            "copy_file_range to".into(),
            CopyFileRange {
                node_in: file,
                fh_in: None,
                offset_in: 0,
                node_out: n,
                fh_out: None,
                offset_out: 0,
                len: 4096,
                flags: 0,
            },
        ),
    ];
    for open in [
        libc::O_RDONLY,
        libc::O_WRONLY,
        libc::O_RDWR,
        libc::O_RDONLY | libc::O_TRUNC,
        libc::O_WRONLY | libc::O_TRUNC | libc::O_CREAT,
        libc::O_RDWR | libc::O_APPEND,
    ] {
        v.push((
            format!("open {open:#o}"),
            Open {
                node: n,
                flags: open as u32,
            },
        ));
    }
    for (what, set) in setattr_kinds() {
        v.push((
            format!("setattr {what}"),
            Setattr {
                node: n,
                fh: None,
                set,
            },
        ));
    }
    v
}

#[test]
fn node_ids_never_issued_or_forgotten_are_stale() {
    let fx = Fixture::new(&[]);
    let c = fx.client();
    let f = c.lookup(ROOT_CALLER, ROOT_NODE, "f");
    // A node that was issued, then forgotten.
    let gone = c.lookup(ROOT_CALLER, ROOT_NODE, "pad-00");
    c.forget(gone.node, 1);
    expect_ok(&c.call(ROOT_CALLER, &Request::Ping), "ping after forget");
    // Forgetting the root, however often, changes nothing.
    c.forget(ROOT_NODE, u64::MAX);
    // A node another session holds.
    let other = fx.client();
    let theirs = other.lookup(ROOT_CALLER, ROOT_NODE, "pad-01");

    let ino = |p: &Path| fs::symlink_metadata(p).unwrap().ino();
    let export_before = fx.export_snapshot();
    let bad: Vec<(String, NodeId)> = vec![
        ("0".into(), NodeId::new(0)),
        ("2".into(), NodeId::new(2)),
        ("u64::MAX".into(), NodeId::new(u64::MAX)),
        ("2^63 (first synthetic id)".into(), NodeId::new(1 << 63)),
        ("2^63 + 1".into(), NodeId::new((1 << 63) + 1)),
        (
            "the inode of outside/secret".into(),
            NodeId::new(ino(&fx.outside.join("secret"))),
        ),
        ("the inode of outside".into(), NodeId::new(ino(&fx.outside))),
        (
            "the inode of outside/sub".into(),
            NodeId::new(ino(&fx.outside.join("sub"))),
        ),
        (
            "the inode of the export's parent".into(),
            NodeId::new(ino(&fx.root)),
        ),
        (
            "the inode of the export root itself".into(),
            NodeId::new(ino(&fx.export)),
        ),
        ("the inode of /".into(), NodeId::new(ino(Path::new("/")))),
        (
            "a file never looked up".into(),
            NodeId::new(ino(&fx.export.join("unissued"))),
        ),
        ("a forgotten node".into(), gone.node),
        ("another session's node".into(), theirs.node),
    ];
    for caller in CALLERS {
        for (label, n) in &bad {
            for (op, req) in node_ops(*n, f.node) {
                let r = c.call(caller, &req);
                expect_err(&r, WireErrno::ESTALE, &format!("{op} on {label} ({n})"));
            }
        }
    }
    assert_same("the export", &export_before, &fx.export_snapshot());
    // The root survived being forgotten.
    let names = c.list(ROOT_NODE);
    assert!(names.iter().any(|n| n == b"f"));
    drop(other);
    fx.finish();
}

/// BIND sent again in a later session (a client reconnecting after its server restarted,
/// protocol.md §17): a spare the old session bound is found, one it never bound is made
/// anew under the same id (and found and written by it), a BIND already done is answered
/// again, and a name that holds another file is refused. Nothing outside changes.
#[test]
fn a_bind_sent_again_in_a_new_session_finds_makes_or_refuses_the_file() {
    if common::skipped_for_portable("spare files are O_TMPFILE files, which macOS has not") {
        return;
    }
    let fx = Fixture::new(&[]);
    let time = Timespec {
        sec: 1_000_000_000,
        nsec: 5,
    };
    let bind = |c: &Client, name: &str, node: NodeId| {
        c.call(
            ROOT_CALLER,
            &Request::Bind {
                parent: ROOT_NODE,
                name: nm(name),
                node,
                mode: 0o660,
                umask: 0o022,
                time,
            },
        )
    };
    let made = |r: R, what: &str| match r {
        Ok(Reply::Create { entry, .. }) => entry.node,
        other => panic!("{what}: {}", errname(&other)),
    };
    let old = fx.client();
    let spares = match old.call(
        ROOT_CALLER,
        &Request::Spares {
            parent: ROOT_NODE,
            count: 2,
        },
    ) {
        Ok(Reply::Spares(v)) if v.len() == 2 => v,
        other => panic!("spares: {}", errname(&other)),
    };
    let (bound, unbound) = (spares[0].node, spares[1].node);
    assert_eq!(made(bind(&old, "bound", bound), "first bind"), bound);
    drop(old);

    let c = fx.client();
    assert_eq!(made(bind(&c, "bound", bound), "bound before"), bound);
    assert_eq!(made(bind(&c, "again", unbound), "never bound"), unbound);
    let host = fx.export.join("again");
    let m = fs::metadata(&host).unwrap();
    assert!(m.is_file());
    assert_eq!(m.mode() & 0o7777, 0o640, "mode & !umask");
    assert_eq!((m.mtime(), m.mtime_nsec()), (time.sec, 5));
    assert_eq!(made(bind(&c, "again", unbound), "bound again"), unbound);
    assert_eq!(c.lookup(ROOT_CALLER, ROOT_NODE, "again").node, unbound);
    let write = Request::Write {
        node: unbound,
        fh: None,
        offset: 0,
        data: nm("written by node\n"),
    };
    expect_ok(&c.call(ROOT_CALLER, &write), "write to the file made anew");
    assert_eq!(fs::read(&host).unwrap(), b"written by node\n");
    // Another file has the name: refused, whatever the id.
    let export_before = fx.export_snapshot();
    let outside = ino_of(&fx.outside.join("secret"));
    for node in [NodeId::new(unbound.get() + 1_000_003), NodeId::new(outside)] {
        expect_err(&bind(&c, "f", node), WireErrno::EEXIST, "bind over f");
    }
    assert_same("the export", &export_before, &fx.export_snapshot());
    drop(c);
    fx.finish();
}

fn ino_of(p: &Path) -> u64 {
    fs::symlink_metadata(p).unwrap().ino()
}

#[test]
fn handles_never_issued_released_or_of_the_wrong_kind_are_refused() {
    let fx = Fixture::new(&[]);
    let c = fx.client();
    let f = c.lookup(ROOT_CALLER, ROOT_NODE, "f");
    let d = c.lookup(ROOT_CALLER, ROOT_NODE, "d");
    let released = c.open(ROOT_CALLER, f.node, libc::O_RDWR);
    c.release(f.node, released);
    let file_fh = c.open(ROOT_CALLER, f.node, libc::O_RDWR);
    let dir_fh = c.opendir(ROOT_CALLER, d.node);
    // Another session's handle: this one never issued it.
    let other = fx.client();
    let of = other.lookup(ROOT_CALLER, ROOT_NODE, "f");
    let their_fh = other.open(ROOT_CALLER, of.node, libc::O_RDWR);
    let fresh = fx.client();
    let ff = fresh.lookup(ROOT_CALLER, ROOT_NODE, "f");
    let fd = fresh.lookup(ROOT_CALLER, ROOT_NODE, "d");

    let export_before = fx.export_snapshot();
    let file_io = |node: NodeId, fh: HandleId| -> Vec<(&'static str, Request)> {
        use Request::*;
        vec![
            (
                "read",
                Read {
                    node,
                    fh: Some(fh),
                    offset: 0,
                    size: 4096,
                },
            ),
            (
                "write",
                Write {
                    node,
                    fh: Some(fh),
                    offset: 0,
                    data: nm("pwned"),
                },
            ),
            (
                "fallocate",
                Fallocate {
                    node,
                    fh: Some(fh),
                    offset: 0,
                    length: 1 << 20,
                    mode: 0,
                },
            ),
            (
                "lseek",
                Lseek {
                    node,
                    fh: Some(fh),
                    offset: 0,
                    whence: libc::SEEK_END as u32,
                },
            ),
            (
                "copy_file_range in",
                CopyFileRange {
                    node_in: node,
                    fh_in: Some(fh),
                    offset_in: 0,
                    node_out: node,
                    fh_out: None,
                    offset_out: 100,
                    len: 10,
                    flags: 0,
                },
            ),
            (
                "copy_file_range out",
                CopyFileRange {
                    node_in: node,
                    fh_in: None,
                    offset_in: 0,
                    node_out: node,
                    fh_out: Some(fh),
                    offset_out: 100,
                    len: 10,
                    flags: 0,
                },
            ),
        ]
    };
    for caller in CALLERS {
        for (label, fh) in [
            ("never issued", HandleId::new(12345).unwrap()),
            ("u64::MAX", HandleId::new(u64::MAX).unwrap()),
            ("released", released),
        ] {
            for (op, req) in file_io(f.node, fh) {
                expect_err(
                    &c.call(caller, &req),
                    WireErrno::EBADF,
                    &format!("{op} with a {label} handle"),
                );
            }
            let r = c.call(
                caller,
                &Request::Readdir {
                    node: d.node,
                    fh: Some(fh),
                    offset: 0,
                    size: 65536,
                    plus: true,
                },
            );
            expect_err(
                &r,
                WireErrno::EBADF,
                &format!("readdir with a {label} handle"),
            );
            let r = c.call(
                caller,
                &Request::Fsync {
                    node: f.node,
                    fh: Some(fh),
                    datasync: false,
                },
            );
            expect_err(
                &r,
                WireErrno::EBADF,
                &format!("fsync with a {label} handle"),
            );
        }
        // A handle number only another session issued.
        for (op, req) in file_io(ff.node, their_fh) {
            expect_err(
                &fresh.call(caller, &req),
                WireErrno::EBADF,
                &format!("{op} with another session's handle"),
            );
        }
        let r = fresh.call(
            caller,
            &Request::Readdir {
                node: fd.node,
                fh: Some(their_fh),
                offset: 0,
                size: 65536,
                plus: false,
            },
        );
        expect_err(
            &r,
            WireErrno::EBADF,
            "readdir with another session's handle",
        );
        // A directory handle as a file handle.
        for (op, req) in file_io(d.node, dir_fh) {
            expect_err(
                &c.call(caller, &req),
                WireErrno::EISDIR,
                &format!("{op} with a directory handle"),
            );
        }
        // A handle named with another node than the one it was opened on: what the reply
        // says would be about the wrong object.
        for (op, req) in file_io(f.node, dir_fh) {
            expect_err(
                &c.call(caller, &req),
                WireErrno::EBADF,
                &format!("{op} with the handle of another node"),
            );
        }
        for plus in [false, true] {
            let readdir = |node, fh| Request::Readdir {
                node,
                fh,
                offset: 0,
                size: 65536,
                plus,
            };
            // A file handle as a directory handle.
            let r = c.call(caller, &readdir(f.node, Some(file_fh)));
            expect_err(&r, WireErrno::ENOTDIR, "readdir with a file handle");
            let r = c.call(caller, &readdir(d.node, Some(file_fh)));
            expect_err(&r, WireErrno::EBADF, "readdir with another node's handle");
        }
    }
    assert_same("the export", &export_before, &fx.export_snapshot());
    c.release(f.node, file_fh);
    drop((other, fresh));
    fx.finish();
}

#[test]
fn operations_on_the_wrong_kind_of_node_fail() {
    let fx = Fixture::new(&[]);
    let c = fx.client();
    let f = c.lookup(ROOT_CALLER, ROOT_NODE, "f");
    let d = c.lookup(ROOT_CALLER, ROOT_NODE, "d");
    let export_before = fx.export_snapshot();
    use Request::*;
    for caller in CALLERS {
        // A file as a directory.
        for (op, req) in node_ops(f.node, f.node) {
            let want = match op.as_str() {
                "mknod"
                | "mkdir"
                | "lookup"
                | "unlink"
                | "rmdir"
                | "symlink"
                | "rename from"
                | "rename into"
                | "link into"
                | "create"
                | "opendir"
                | "readdir by node"
                | "readdirplus by node" => WireErrno::ENOTDIR,
                "readlink" => WireErrno::EINVAL,
                _ => continue,
            };
            expect_err(&c.call(caller, &req), want, &format!("{op} on a file"));
        }
        // A directory as a file.
        for (op, req) in node_ops(d.node, f.node) {
            let want = match op.as_str() {
                "read by node"
                | "write by node"
                | "fallocate by node"
                | "lseek by node"
                | "copy_file_range from"
                | "copy_file_range to"
                | "setattr truncate to 0"
                | "setattr extend to 1 MiB" => WireErrno::EISDIR,
                "open 0o1" | "open 0o2" | "open 0o1101" | "open 0o2002" => WireErrno::EISDIR,
                "readlink" => WireErrno::EINVAL,
                "link of" => WireErrno::EPERM,
                _ => continue,
            };
            expect_err(&c.call(caller, &req), want, &format!("{op} on a directory"));
        }
        // Opened read-only, a directory gives a handle that reads nothing.
        let fh = c.open(caller, d.node, libc::O_RDONLY);
        let r = c.call(
            caller,
            &Read {
                node: d.node,
                fh: Some(fh),
                offset: 0,
                size: 4096,
            },
        );
        expect_err(
            &r,
            WireErrno::EISDIR,
            "read through a directory opened as a file",
        );
        c.release(d.node, fh);
        for (req, want, what) in [
            (
                Unlink {
                    parent: ROOT_NODE,
                    name: nm("d"),
                },
                WireErrno::EISDIR,
                "unlink of a directory",
            ),
            (
                Rmdir {
                    parent: ROOT_NODE,
                    name: nm("f"),
                },
                WireErrno::ENOTDIR,
                "rmdir of a file",
            ),
            (
                Rmdir {
                    parent: ROOT_NODE,
                    name: nm("d"),
                },
                WireErrno::ENOTEMPTY,
                "rmdir of a full directory",
            ),
            (
                Rename {
                    parent: ROOT_NODE,
                    name: nm("d"),
                    new_parent: d.node,
                    new_name: nm("into-itself"),
                    flags: 0,
                },
                WireErrno::EINVAL,
                "rename of a directory into itself",
            ),
            (
                Link {
                    node: ROOT_NODE,
                    new_parent: d.node,
                    new_name: nm("root-again"),
                },
                WireErrno::EPERM,
                "link of the root",
            ),
        ] {
            expect_err(&c.call(caller, &req), want, what);
        }
    }
    assert_same("the export", &export_before, &fx.export_snapshot());
    fx.finish();
}

// ---------------------------------------------------------------------------------------
// Symlinks inside the export that point out of it.

#[test]
fn symlinks_pointing_outside_are_returned_as_symlinks_and_never_followed() {
    symlink_attacks(Fixture::new(&[]));
}

/// The same with a server that is not root: it lacks CAP_DAC_READ_SEARCH, so LINK goes
/// through /proc/self/fd with AT_SYMLINK_FOLLOW, and nothing is created as the caller.
#[test]
fn symlinks_pointing_outside_are_never_followed_by_an_unprivileged_server() {
    if let Some(why) = unprivileged_server_unavailable() {
        common::skip(&why);
        return;
    }
    symlink_attacks(Fixture::start(&[], Some((NOBODY, NOBODY))));
}

const NOBODY: u32 = 65534;

/// Why the server cannot be run as an unprivileged user here, if it cannot.
fn unprivileged_server_unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root: cannot start the server as another user".into());
    }
    // The binary it runs is common::tether_for_others(), in a directory anyone can
    // enter, wherever the build directory is.
    None
}

fn symlink_attacks(fx: Fixture) {
    let c = fx.client();
    let f = c.lookup(ROOT_CALLER, ROOT_NODE, "f");
    let links: Vec<(&str, PathBuf)> = vec![
        ("up", "../outside/secret".into()),
        ("abs", fx.outside.join("secret")),
        ("slash", "/".into()),
        ("updir", "../outside".into()),
        ("absdir", fx.outside.clone()),
    ];
    let marker_name = fx.marker_name();
    use Request::*;
    for caller in CALLERS {
        for (name, target) in &links {
            let e = c.lookup(caller, ROOT_NODE, name);
            let what = |op: &str| format!("{op} on symlink {name} -> {}", target.display());
            assert_eq!(
                e.attr.mode & libc::S_IFMT,
                libc::S_IFLNK,
                "{}",
                what("lookup")
            );
            assert_eq!(
                e.attr.size,
                target.as_os_str().len() as u64,
                "{}",
                what("lookup size")
            );
            // readlink gives the link text, nothing else.
            match c.call(caller, &Readlink { node: e.node }) {
                Ok(Reply::Data(d)) => {
                    assert_eq!(
                        &d[..],
                        target.as_os_str().as_bytes(),
                        "{}",
                        what("readlink")
                    )
                }
                other => panic!("{}: {}", what("readlink"), errname(&other)),
            }
            match c.call(
                caller,
                &Getattr {
                    node: e.node,
                    fh: None,
                },
            ) {
                Ok(Reply::Attr(a)) => assert_eq!(a.mode & libc::S_IFMT, libc::S_IFLNK),
                other => panic!("{}: {}", what("getattr"), errname(&other)),
            }

            // Everything that would need the target fails; what acts on the link itself
            // (chown, times, link) may succeed. The snapshot decides at the end.
            for (op, req) in node_ops(e.node, f.node) {
                let r = c.call(caller, &req);
                match op.as_str() {
                    "getattr" | "readlink" | "statfs" | "access" | "link of" => {}
                    "setattr chown uid" | "setattr chown gid" | "setattr atime now"
                    | "setattr mtime at 1" | "setattr nothing" => {}
                    "listxattr" => match r {
                        Ok(Reply::XattrData(d)) => {
                            assert!(d.is_empty(), "{}: {:?}", what(&op), d)
                        }
                        other => expect_ok(&other, &what(&op)),
                    },
                    "getxattr" => expect_err(&r, WireErrno::ENODATA, &what(&op)),
                    "setxattr" | "removexattr" => expect_err(&r, WireErrno::EPERM, &what(&op)),
                    "setattr chmod 4777" => expect_err(&r, WireErrno::EOPNOTSUPP, &what(&op)),
                    _ if op.starts_with("open ") => expect_err(&r, WireErrno::ELOOP, &what(&op)),
                    "mknod"
                    | "mkdir"
                    | "lookup"
                    | "unlink"
                    | "rmdir"
                    | "symlink"
                    | "rename from"
                    | "rename into"
                    | "link into"
                    | "create"
                    | "opendir"
                    | "readdir by node"
                    | "readdirplus by node" => expect_err(&r, WireErrno::ENOTDIR, &what(&op)),
                    _ => expect_any_err(&r, &what(&op)),
                }
            }
            for child in [&b"secret"[..], b"sub", &marker_name] {
                let r = c.call(
                    caller,
                    &Lookup {
                        parent: e.node,
                        name: nm(child),
                    },
                );
                expect_err(&r, WireErrno::ENOTDIR, &what("lookup of a child"));
            }
            // A hard link to the link is another link, not the target.
            let hard = format!("hard-{name}-{}", caller.uid);
            let r = c.call(
                caller,
                &Link {
                    node: e.node,
                    new_parent: ROOT_NODE,
                    new_name: nm(&hard),
                },
            );
            if let Ok(Reply::Entry(h)) = &r {
                assert_eq!(
                    h.attr.mode & libc::S_IFMT,
                    libc::S_IFLNK,
                    "{}",
                    what("link")
                );
            }
            c.forget(e.node, 1);
        }
    }
    // Listing the export shows the links as links.
    match c.call(
        ROOT_CALLER,
        &Readdir {
            node: ROOT_NODE,
            fh: None,
            offset: 0,
            size: 1 << 20,
            plus: true,
        },
    ) {
        Ok(Reply::Dir { entries, .. }) => {
            for de in entries {
                if links.iter().any(|(n, _)| n.as_bytes() == &de.name[..]) {
                    assert_eq!(
                        de.kind,
                        libc::DT_LNK,
                        "readdirplus kind of {}",
                        show(&de.name)
                    );
                    let e = de.entry.expect("readdirplus entry");
                    assert_eq!(e.attr.mode & libc::S_IFMT, libc::S_IFLNK);
                }
            }
        }
        other => panic!("readdirplus of the root: {}", errname(&other)),
    }
    // The links themselves still say what they said.
    for (name, target) in &links {
        assert_eq!(&fs::read_link(fx.export.join(name)).unwrap(), target);
    }
    fx.finish();
}

#[test]
fn access_through_a_symlink_does_not_probe_outside() {
    let fx = Fixture::new(&[]);
    let c = fx.client();
    let up = c.lookup(ROOT_CALLER, ROOT_NODE, "up");
    let nothere = c.lookup(ROOT_CALLER, ROOT_NODE, "nothere");
    for caller in CALLERS {
        for mask in [libc::F_OK, libc::R_OK, libc::W_OK, libc::R_OK | libc::W_OK] {
            let a = c.call(
                caller,
                &Request::Access {
                    node: up.node,
                    mask: mask as u32,
                },
            );
            let b = c.call(
                caller,
                &Request::Access {
                    node: nothere.node,
                    mask: mask as u32,
                },
            );
            assert_eq!(
                a.as_ref().err(),
                b.as_ref().err(),
                "access({mask}) tells a link to an existing outside file ({}) from one to a \
                 missing file ({})",
                errname(&a),
                errname(&b)
            );
        }
    }
    fx.finish();
}

// ---------------------------------------------------------------------------------------
// Host-side swaps raced against requests.

#[derive(Default)]
struct RaceStats {
    saw_dir: AtomicU64,
    saw_link: AtomicU64,
    done_inside: AtomicU64,
    /// Reads that returned file data (of the file inside).
    read_data: AtomicU64,
    requests: AtomicU64,
}

/// Pins 40 nodes on `c`, so that with `--max-node-fds 16` node descriptors are evicted all
/// the time and nodes are found again by name while the names are being swapped.
fn pin_pads(c: &Client) {
    for i in 0..40 {
        c.lookup(ROOT_CALLER, ROOT_NODE, format!("pad-{i:02}"));
    }
}

/// Looks up (and forgets again) 17 pinned nodes whose descriptors were evicted, so that
/// with `--max-node-fds 16` every other node's descriptor is evicted too.
fn churn(c: &Client) {
    for i in 0..17 {
        let e = c.lookup(ROOT_CALLER, ROOT_NODE, format!("pad-{i:02}"));
        c.forget(e.node, 1);
    }
}

/// Everything a client may try on a node it believes is a file.
fn poke_file(c: &Client, caller: Caller, node: NodeId, scratch: NodeId, stats: &RaceStats) {
    use Request::*;
    let mut ok = 0;
    let mut call = |req: Request| {
        stats.requests.fetch_add(1, Ordering::Relaxed);
        let r = c.call(caller, &req);
        if r.is_ok() {
            ok += 1;
        }
        r
    };
    for flags in [
        libc::O_RDONLY,
        libc::O_RDWR | libc::O_APPEND,
        libc::O_WRONLY | libc::O_TRUNC,
    ] {
        if let Ok(Reply::Open { fh, .. }) = call(Open {
            node,
            flags: flags as u32,
        }) {
            if let Ok(Reply::Data(d)) = call(Read {
                node,
                fh: Some(fh),
                offset: 0,
                size: 4096,
            }) {
                if !d.is_empty() {
                    stats.read_data.fetch_add(1, Ordering::Relaxed);
                }
            }
            if flags != libc::O_RDONLY {
                call(Write {
                    node,
                    fh: Some(fh),
                    offset: 0,
                    data: nm("pwned by handle\n"),
                })
                .ok();
            }
            call(Release { node, fh: Some(fh) }).ok();
        }
    }
    call(Read {
        node,
        fh: None,
        offset: 0,
        size: 4096,
    })
    .ok();
    call(Write {
        node,
        fh: None,
        offset: 0,
        data: nm("pwned by node\n"),
    })
    .ok();
    for (_, set) in setattr_kinds() {
        call(Setattr {
            node,
            fh: None,
            set,
        })
        .ok();
    }
    call(Setxattr {
        node,
        name: nm("user.pwned"),
        value: nm("1"),
        flags: 0,
    })
    .ok();
    call(Getxattr {
        node,
        name: nm("user.tether_marker"),
        size: 4096,
    })
    .ok();
    call(Listxattr { node, size: 4096 }).ok();
    call(Removexattr {
        node,
        name: nm("user.tether_marker"),
    })
    .ok();
    call(Fallocate {
        node,
        fh: None,
        offset: 0,
        length: 8192,
        mode: 0,
    })
    .ok();
    call(Lseek {
        node,
        fh: None,
        offset: 0,
        whence: libc::SEEK_END as u32,
    })
    .ok();
    call(Access {
        node,
        mask: (libc::R_OK | libc::W_OK) as u32,
    })
    .ok();
    call(Fsync {
        node,
        fh: None,
        datasync: false,
    })
    .ok();
    // Copy whatever it holds into a file inside, then read that back.
    call(CopyFileRange {
        node_in: node,
        fh_in: None,
        offset_in: 0,
        node_out: scratch,
        fh_out: None,
        offset_out: 0,
        len: 4096,
        flags: 0,
    })
    .ok();
    call(Read {
        node: scratch,
        fh: None,
        offset: 0,
        size: 65536,
    })
    .ok();
    call(CopyFileRange {
        node_in: scratch,
        fh_in: None,
        offset_in: 0,
        node_out: node,
        fh_out: None,
        offset_out: 0,
        len: 16,
        flags: 0,
    })
    .ok();
    if ok > 0 {
        stats.done_inside.fetch_add(1, Ordering::Relaxed);
    }
}

/// One client thread of the directory race: look up `race`, then work inside whatever came
/// back.
fn dir_race_client(c: &Client, tid: usize, deadline: Instant, marker: &[u8], stats: &RaceStats) {
    use Request::*;
    let f = c.lookup(ROOT_CALLER, ROOT_NODE, "f");
    let scratch = c.lookup(ROOT_CALLER, ROOT_NODE, "scratch");
    let mut i = 0u64;
    while Instant::now() < deadline {
        i += 1;
        let caller = CALLERS[(i % 2) as usize];
        let call = |req: Request| {
            stats.requests.fetch_add(1, Ordering::Relaxed);
            c.call(caller, &req)
        };
        let n = match call(Lookup {
            parent: ROOT_NODE,
            name: nm("race"),
        }) {
            Ok(Reply::Entry(e)) => e,
            _ => continue,
        };
        if n.attr.mode & libc::S_IFMT == libc::S_IFLNK {
            stats.saw_link.fetch_add(1, Ordering::Relaxed);
        } else {
            stats.saw_dir.fetch_add(1, Ordering::Relaxed);
        }
        let p = n.node;
        let tag = format!("{tid}-{i}");
        // Reach for what is outside.
        for name in [&b"secret"[..], b"sub", b"inner", marker] {
            if let Ok(Reply::Entry(e)) = call(Lookup {
                parent: p,
                name: nm(name),
            }) {
                // Found inside (a file renamed to that name below): poke it anyway.
                poke_file(c, caller, e.node, scratch.node, stats);
                c.forget(e.node, 1);
            }
        }
        // Make things in it.
        if let Ok(Reply::Create { entry, fh, .. }) = call(Create {
            parent: p,
            name: nm(format!("c-{tag}")),
            mode: libc::S_IFREG | 0o666,
            umask: 0,
            flags: libc::O_RDWR as u32,
        }) {
            stats.done_inside.fetch_add(1, Ordering::Relaxed);
            call(Write {
                node: entry.node,
                fh,
                offset: 0,
                data: nm("created in the race\n"),
            })
            .ok();
            call(Release {
                node: entry.node,
                fh,
            })
            .ok();
        }
        if call(Mkdir {
            parent: p,
            name: nm(format!("m-{tag}")),
            mode: 0o777,
            umask: 0,
        })
        .is_ok()
        {
            call(Rmdir {
                parent: p,
                name: nm(format!("m-{tag}")),
            })
            .ok();
        }
        // A socket, not a FIFO: a FIFO that inherits a poked node's inode number would
        // block a worker for good (see the FIFO and inode reuse tests below).
        call(Mknod {
            parent: p,
            name: nm(format!("n-{tag}")),
            mode: libc::S_IFSOCK | 0o644,
            rdev: 0,
            umask: 0,
        })
        .ok();
        call(Unlink {
            parent: p,
            name: nm(format!("n-{tag}")),
        })
        .ok();
        call(Symlink {
            parent: p,
            name: nm(format!("l-{tag}")),
            target: nm("../outside/secret"),
        })
        .ok();
        call(Unlink {
            parent: p,
            name: nm(format!("l-{tag}")),
        })
        .ok();
        call(Link {
            node: f.node,
            new_parent: p,
            new_name: nm(format!("h-{tag}")),
        })
        .ok();
        call(Unlink {
            parent: p,
            name: nm(format!("h-{tag}")),
        })
        .ok();
        // List it, by node and by handle.
        for plus in [false, true] {
            call(Readdir {
                node: p,
                fh: None,
                offset: 0,
                size: 16384,
                plus,
            })
            .ok();
        }
        if let Ok(Reply::Open { fh, .. }) = call(Opendir { node: p, flags: 0 }) {
            call(Readdir {
                node: p,
                fh: Some(fh),
                offset: 0,
                size: 16384,
                plus: true,
            })
            .ok();
            call(Releasedir {
                node: p,
                fh: Some(fh),
            })
            .ok();
        }
        // Its attributes and xattrs.
        call(Getxattr {
            node: p,
            name: nm("user.tether_marker"),
            size: 4096,
        })
        .ok();
        call(Listxattr {
            node: p,
            size: 4096,
        })
        .ok();
        call(Setxattr {
            node: p,
            name: nm("user.pwned"),
            value: nm("1"),
            flags: 0,
        })
        .ok();
        for (_, set) in setattr_kinds() {
            if set.valid & setattr_valid::SIZE == 0 {
                call(Setattr {
                    node: p,
                    fh: None,
                    set,
                })
                .ok();
            }
        }
        // Remove and move what is (or would be) outside.
        call(Unlink {
            parent: p,
            name: nm("secret"),
        })
        .ok();
        call(Rmdir {
            parent: p,
            name: nm("sub"),
        })
        .ok();
        call(Unlink {
            parent: p,
            name: nm(marker),
        })
        .ok();
        call(Rename {
            parent: p,
            name: nm("secret"),
            new_parent: ROOT_NODE,
            new_name: nm(format!("stolen-{tag}")),
            flags: 0,
        })
        .ok();
        call(Rename {
            parent: p,
            name: nm("sub"),
            new_parent: ROOT_NODE,
            new_name: nm(format!("stolen-sub-{tag}")),
            flags: libc::RENAME_NOREPLACE,
        })
        .ok();
        // Plant a "secret" inside, for the next round's lookups to find.
        call(Rename {
            parent: p,
            name: nm(format!("c-{tag}")),
            new_parent: p,
            new_name: nm("secret"),
            flags: 0,
        })
        .ok();
        c.forget(p, 1);
    }
}

#[test]
fn directory_swapped_for_a_symlink_during_requests_does_not_lead_outside() {
    let fx = Fixture::new(&["--max-node-fds", "16"]);
    let race = fx.export.join("race");
    let targets = [PathBuf::from("../outside"), fx.outside.clone()];
    let marker = fx.marker_name();
    let (swaps, stats) = race_swaps(&fx, &race, &targets, |c, n, deadline, stats| {
        dir_race_client(c, n, deadline, &marker, stats)
    });
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    eprintln!(
        "directory race: {} swaps, {} requests; lookups saw the directory {} times and the \
         symlink {} times; {} creations inside",
        load(&swaps),
        load(&stats.requests),
        load(&stats.saw_dir),
        load(&stats.saw_link),
        load(&stats.done_inside)
    );
    assert_race_happened(&swaps, &stats);
    assert!(fs::symlink_metadata(&race).unwrap().is_dir());
    fx.finish();
}

#[test]
fn file_swapped_for_a_symlink_during_requests_does_not_lead_outside() {
    let fx = Fixture::new(&["--max-node-fds", "16"]);
    let victim = fx.export.join("victim");
    let targets = [
        PathBuf::from("../outside/secret"),
        fx.outside.join("secret"),
    ];
    let (swaps, stats) = race_swaps(&fx, &victim, &targets, |c, n, deadline, stats| {
        let scratch = c.lookup(ROOT_CALLER, ROOT_NODE, "scratch");
        let mut i = 0u64;
        while Instant::now() < deadline {
            i += 1;
            let caller = CALLERS[(i % 2) as usize];
            stats.requests.fetch_add(1, Ordering::Relaxed);
            let e = match c.call(
                caller,
                &Request::Lookup {
                    parent: ROOT_NODE,
                    name: nm("victim"),
                },
            ) {
                Ok(Reply::Entry(e)) => e,
                _ => continue,
            };
            if e.attr.mode & libc::S_IFMT == libc::S_IFLNK {
                stats.saw_link.fetch_add(1, Ordering::Relaxed);
            } else {
                stats.saw_dir.fetch_add(1, Ordering::Relaxed);
            }
            // Open descriptors for 17 other nodes, so that the budget of 16
            // evicts the victim's: the server must find it again by name while
            // the name is being swapped.
            churn(c);
            poke_file(c, caller, e.node, scratch.node, stats);
            let hard = format!("hard-{n}-{i}");
            let linked = c.call(
                caller,
                &Request::Link {
                    node: e.node,
                    new_parent: ROOT_NODE,
                    new_name: nm(&hard),
                },
            );
            if linked.is_ok() {
                c.call(
                    caller,
                    &Request::Unlink {
                        parent: ROOT_NODE,
                        name: nm(&hard),
                    },
                )
                .ok();
            }
            c.forget(e.node, 1);
        }
    });
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    eprintln!(
        "file race: {} swaps, {} requests; lookups saw the file {} times and the symlink {} \
         times; {} pokes did something, {} reads returned data",
        load(&swaps),
        load(&stats.requests),
        load(&stats.saw_dir),
        load(&stats.saw_link),
        load(&stats.done_inside),
        load(&stats.read_data)
    );
    assert!(
        load(&stats.read_data) > 0,
        "the clients never read the file inside"
    );
    assert_race_happened(&swaps, &stats);
    assert!(fs::symlink_metadata(&victim).unwrap().is_file());
    fx.finish();
}

// ---------------------------------------------------------------------------------------
// serve --read-only

#[test]
fn read_only_export_refuses_every_mutation_whatever_the_client_sends() {
    let fx = Fixture::new(&["--read-only"]);
    let c = fx.client();
    assert!(
        c.conn.hello.read_only,
        "HELLO must say the export is read-only"
    );
    let f = c.lookup(ROOT_CALLER, ROOT_NODE, "f");
    let xf = c.lookup(ROOT_CALLER, ROOT_NODE, "xf");
    let d = c.lookup(ROOT_CALLER, ROOT_NODE, "d");
    let up = c.lookup(ROOT_CALLER, ROOT_NODE, "up");
    let rfh = c.open(ROOT_CALLER, f.node, libc::O_RDONLY);
    let dfh = c.opendir(ROOT_CALLER, d.node);
    let export_before = fx.export_snapshot();

    use Request::*;
    let mut reqs: Vec<(String, Request)> = Vec::new();
    for (node, label) in [(f.node, "file"), (d.node, "dir"), (up.node, "symlink")] {
        for (what, set) in setattr_kinds() {
            reqs.push((
                format!("setattr {what} on the {label}"),
                Setattr {
                    node,
                    fh: None,
                    set,
                },
            ));
        }
    }
    for (what, set) in setattr_kinds() {
        reqs.push((
            format!("setattr {what} by handle"),
            Setattr {
                node: f.node,
                fh: Some(rfh),
                set,
            },
        ));
    }
    for (what, mode) in [
        ("fifo", libc::S_IFIFO | 0o644),
        ("regular", libc::S_IFREG | 0o644),
        ("socket", libc::S_IFSOCK | 0o644),
        ("char device", libc::S_IFCHR | 0o644),
    ] {
        reqs.push((
            format!("mknod {what}"),
            Mknod {
                parent: ROOT_NODE,
                name: nm("new"),
                mode,
                rdev: 0,
                umask: 0,
            },
        ));
    }
    reqs.push((
        "mkdir".into(),
        Mkdir {
            parent: ROOT_NODE,
            name: nm("new"),
            mode: 0o755,
            umask: 0,
        },
    ));
    reqs.push((
        "unlink".into(),
        Unlink {
            parent: ROOT_NODE,
            name: nm("f"),
        },
    ));
    reqs.push((
        "unlink of a symlink".into(),
        Unlink {
            parent: ROOT_NODE,
            name: nm("up"),
        },
    ));
    reqs.push((
        "rmdir".into(),
        Rmdir {
            parent: ROOT_NODE,
            name: nm("e"),
        },
    ));
    reqs.push((
        "symlink".into(),
        Symlink {
            parent: ROOT_NODE,
            name: nm("new"),
            target: nm("f"),
        },
    ));
    for flags in [
        0,
        libc::RENAME_NOREPLACE,
        libc::RENAME_EXCHANGE,
        libc::RENAME_WHITEOUT,
    ] {
        reqs.push((
            format!("rename flags {flags}"),
            Rename {
                parent: ROOT_NODE,
                name: nm("f"),
                new_parent: d.node,
                new_name: nm("g"),
                flags,
            },
        ));
    }
    reqs.push((
        "link".into(),
        Link {
            node: f.node,
            new_parent: ROOT_NODE,
            new_name: nm("f2"),
        },
    ));
    for (label, fh) in [("by handle", Some(rfh)), ("by node", None)] {
        reqs.push((
            format!("write {label}"),
            Write {
                node: f.node,
                fh,
                offset: 0,
                data: nm("changed"),
            },
        ));
        reqs.push((
            format!("empty write {label}"),
            Write {
                node: f.node,
                fh,
                offset: 0,
                data: nm(""),
            },
        ));
        reqs.push((
            format!("fallocate {label}"),
            Fallocate {
                node: f.node,
                fh,
                offset: 0,
                length: 1 << 20,
                mode: 0,
            },
        ));
        reqs.push((
            format!("punch hole {label}"),
            Fallocate {
                node: f.node,
                fh,
                offset: 0,
                length: 4,
                mode: (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE) as u32,
            },
        ));
        reqs.push((
            format!("copy_file_range {label}"),
            CopyFileRange {
                node_in: xf.node,
                fh_in: None,
                offset_in: 0,
                node_out: f.node,
                fh_out: fh,
                offset_out: 0,
                len: 64,
                flags: 0,
            },
        ));
    }
    for (what, flags) in [
        ("create", libc::XATTR_CREATE),
        ("replace", libc::XATTR_REPLACE),
    ] {
        reqs.push((
            format!("setxattr {what}"),
            Setxattr {
                node: xf.node,
                name: nm("user.keep"),
                value: nm("changed"),
                flags: flags as u32,
            },
        ));
    }
    reqs.push((
        "setxattr new".into(),
        Setxattr {
            node: f.node,
            name: nm("user.new"),
            value: nm("1"),
            flags: 0,
        },
    ));
    reqs.push((
        "removexattr".into(),
        Removexattr {
            node: xf.node,
            name: nm("user.keep"),
        },
    ));
    for flags in [
        libc::O_RDONLY,
        libc::O_RDWR,
        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
    ] {
        for name in ["new", "f"] {
            reqs.push((
                format!("create {name} {flags:#o}"),
                Create {
                    parent: ROOT_NODE,
                    name: nm(name),
                    mode: libc::S_IFREG | 0o644,
                    umask: 0,
                    flags: flags as u32,
                },
            ));
        }
    }
    for flags in [
        libc::O_WRONLY,
        libc::O_RDWR,
        libc::O_ACCMODE,
        libc::O_RDONLY | libc::O_TRUNC,
        libc::O_WRONLY | libc::O_TRUNC,
        libc::O_WRONLY | libc::O_CREAT,
        libc::O_RDWR | libc::O_CREAT | libc::O_EXCL,
        libc::O_RDONLY | libc::O_CREAT | libc::O_TRUNC,
        libc::O_WRONLY | libc::O_APPEND,
    ] {
        reqs.push((
            format!("open {flags:#o}"),
            Open {
                node: f.node,
                flags: flags as u32,
            },
        ));
    }
    for caller in CALLERS {
        for (what, req) in &reqs {
            let r = c.call(caller, req);
            expect_err(
                &r,
                WireErrno::EROFS,
                &format!("{what} as uid {}", caller.uid),
            );
        }
    }
    // O_CREAT on OPEN of an existing node creates nothing; it may open read-only.
    if let Ok(Reply::Open { fh, .. }) = c.call(
        ROOT_CALLER,
        &Open {
            node: f.node,
            flags: (libc::O_RDONLY | libc::O_CREAT) as u32,
        },
    ) {
        let r = c.call(
            ROOT_CALLER,
            &Write {
                node: f.node,
                fh: Some(fh),
                offset: 0,
                data: nm("x"),
            },
        );
        expect_err(
            &r,
            WireErrno::EROFS,
            "write through an O_RDONLY|O_CREAT handle",
        );
        c.release(f.node, fh);
    }
    assert_same(
        "the read-only export",
        &export_before,
        &fx.export_snapshot(),
    );

    // Reads still work.
    assert_eq!(c.read(ROOT_CALLER, f.node, Some(rfh)), b"inside file\n");
    assert_eq!(c.read(USER_CALLER, f.node, None), b"inside file\n");
    let names = c.list(ROOT_NODE);
    for want in ["f", "d", "xf", "up"] {
        assert!(
            names.iter().any(|n| n == want.as_bytes()),
            "{want} not listed"
        );
    }
    match c.call(
        ROOT_CALLER,
        &Readdir {
            node: d.node,
            fh: Some(dfh),
            offset: 0,
            size: 65536,
            plus: true,
        },
    ) {
        Ok(Reply::Dir { entries: v, .. }) => assert!(v.iter().any(|de| &de.name[..] == b"g")),
        other => panic!("readdir by handle: {}", errname(&other)),
    }
    match c.call(ROOT_CALLER, &Readlink { node: up.node }) {
        Ok(Reply::Data(t)) => assert_eq!(&t[..], b"../outside/secret"),
        other => panic!("readlink: {}", errname(&other)),
    }
    if fx.export_snapshot()[Path::new("xf")]
        .xattrs
        .contains_key("user.keep")
    {
        match c.call(
            ROOT_CALLER,
            &Getxattr {
                node: xf.node,
                name: nm("user.keep"),
                size: 64,
            },
        ) {
            Ok(Reply::XattrData(v)) => assert_eq!(&v[..], b"kept"),
            other => panic!("getxattr: {}", errname(&other)),
        }
    }
    for (what, req) in [
        (
            "getattr",
            Getattr {
                node: f.node,
                fh: None,
            },
        ),
        ("statfs", Statfs { node: ROOT_NODE }),
        (
            "lseek",
            Lseek {
                node: f.node,
                fh: Some(rfh),
                offset: 0,
                whence: libc::SEEK_END as u32,
            },
        ),
        (
            "access",
            Access {
                node: f.node,
                mask: libc::R_OK as u32,
            },
        ),
        (
            "listxattr",
            Listxattr {
                node: xf.node,
                size: 0,
            },
        ),
        (
            "fsync",
            Fsync {
                node: f.node,
                fh: Some(rfh),
                datasync: false,
            },
        ),
    ] {
        expect_ok(&c.call(ROOT_CALLER, &req), what);
    }
    c.release(f.node, rfh);
    assert_same(
        "the read-only export",
        &export_before,
        &fx.export_snapshot(),
    );
    fx.finish();
}

// ---------------------------------------------------------------------------------------
// Odd corners.

#[test]
fn xattr_names_are_not_paths() {
    let fx = Fixture::new(&[]);
    let c = fx.client();
    let f = c.lookup(ROOT_CALLER, ROOT_NODE, "f");
    let up = c.lookup(ROOT_CALLER, ROOT_NODE, "up");
    use Request::*;
    for caller in CALLERS {
        for node in [f.node, up.node, ROOT_NODE] {
            for name in [
                "user.tether_marker",
                "../outside/secret",
                "/etc/passwd",
                "user./../../outside/secret",
                "user.tether_marker/../../outside/secret",
            ] {
                let r = c.call(
                    caller,
                    &Getxattr {
                        node,
                        name: nm(name),
                        size: 4096,
                    },
                );
                expect_any_err(&r, &format!("getxattr {name:?} of node {node}"));
                c.call(
                    caller,
                    &Setxattr {
                        node,
                        name: nm(name),
                        value: nm("pwned"),
                        flags: 0,
                    },
                )
                .ok();
                c.call(
                    caller,
                    &Removexattr {
                        node,
                        name: nm(name),
                    },
                )
                .ok();
            }
            for (name, want) in [
                (vec![], WireErrno::EINVAL),
                (
                    b"user.".iter().chain(&[b'a'; 300]).copied().collect(),
                    WireErrno::ERANGE,
                ),
            ] {
                let r = c.call(
                    caller,
                    &Getxattr {
                        node,
                        name: nm(&name),
                        size: 64,
                    },
                );
                expect_err(
                    &r,
                    want,
                    &format!("getxattr {} of node {node}", show(&name)),
                );
            }
        }
    }
    fx.finish();
}

#[test]
fn xattr_names_with_nul_are_refused_and_the_session_goes_on() {
    let fx = Fixture::new(&[]);
    let c = fx.client();
    let xf = c.lookup(ROOT_CALLER, ROOT_NODE, "xf");
    let export_before = fx.export_snapshot();
    use Request::*;
    // A C string would stop at the NUL and name user.keep.
    for (what, req) in [
        (
            "getxattr",
            Getxattr {
                node: xf.node,
                name: nm("user.keep\0x"),
                size: 64,
            },
        ),
        (
            "setxattr",
            Setxattr {
                node: xf.node,
                name: nm("user.keep\0x"),
                value: nm("changed"),
                flags: 0,
            },
        ),
        (
            "removexattr",
            Removexattr {
                node: xf.node,
                name: nm("user.keep\0x"),
            },
        ),
    ] {
        expect_any_err(&c.call(ROOT_CALLER, &req), what);
        expect_ok(&c.call(ROOT_CALLER, &Ping), &format!("ping after {what}"));
    }
    assert_same("the export", &export_before, &fx.export_snapshot());
    fx.finish();
}

#[test]
fn listing_the_export_root_does_not_reveal_its_host_parent() {
    let fx = Fixture::new(&[]);
    let c = fx.client();
    let parent_ino = fs::metadata(&fx.root).unwrap().ino();
    for plus in [false, true] {
        match c.call(
            ROOT_CALLER,
            &Request::Readdir {
                node: ROOT_NODE,
                fh: None,
                offset: 0,
                size: 1 << 20,
                plus,
            },
        ) {
            Ok(Reply::Dir { entries: v, .. }) => {
                let dotdot = v.iter().find(|de| &de.name[..] == b"..");
                if let Some(de) = dotdot {
                    assert_ne!(
                        de.ino.get(),
                        parent_ino,
                        "\"..\" of the export root carries the inode number of the host \
                         directory above the export"
                    );
                }
            }
            other => panic!("readdir of the root: {}", errname(&other)),
        }
    }
    fx.finish();
}

#[test]
fn io_addressed_to_a_fifo_does_not_block_the_server() {
    let fx = Fixture::new(&[]);
    let c = fx.client();
    use Request::*;
    let fifo = match c.call(
        ROOT_CALLER,
        &Mknod {
            parent: ROOT_NODE,
            name: nm("fifo"),
            mode: libc::S_IFIFO | 0o644,
            rdev: 0,
            umask: 0,
        },
    ) {
        Ok(Reply::Entry(e)) => e.node,
        other => panic!("mknod fifo: {}", errname(&other)),
    };
    let f = c.lookup(ROOT_CALLER, ROOT_NODE, "f");
    // Any answer will do, as long as there is one: a guest kernel handles FIFOs itself, so
    // only a hostile client sends these.
    for (what, req) in [
        (
            "fsync by node",
            Fsync {
                node: fifo,
                fh: None,
                datasync: false,
            },
        ),
        (
            "read by node",
            Read {
                node: fifo,
                fh: None,
                offset: 0,
                size: 16,
            },
        ),
        (
            "write by node",
            Write {
                node: fifo,
                fh: None,
                offset: 0,
                data: nm("x"),
            },
        ),
        (
            "fallocate by node",
            Fallocate {
                node: fifo,
                fh: None,
                offset: 0,
                length: 16,
                mode: 0,
            },
        ),
        (
            "lseek by node",
            Lseek {
                node: fifo,
                fh: None,
                offset: 0,
                whence: libc::SEEK_SET as u32,
            },
        ),
        (
            "copy_file_range from it",
            CopyFileRange {
                node_in: fifo,
                fh_in: None,
                offset_in: 0,
                node_out: f.node,
                fh_out: None,
                offset_out: 0,
                len: 16,
                flags: 0,
            },
        ),
        (
            "open read-only",
            Open {
                node: fifo,
                flags: libc::O_RDONLY as u32,
            },
        ),
        (
            "open write-only",
            Open {
                node: fifo,
                flags: libc::O_WRONLY as u32,
            },
        ),
    ] {
        let _ = c.call(ROOT_CALLER, &req);
        expect_ok(&c.call(ROOT_CALLER, &Ping), &format!("ping after {what}"));
    }
    fx.finish();
}

#[test]
fn a_reused_inode_number_is_a_new_node_generation() {
    let fx = Fixture::new(&["--max-node-fds", "16"]);
    let c = fx.client();
    pin_pads(&c);
    let old_path = fx.export.join("old");
    fs::write(&old_path, "old life\n").unwrap();
    let old = c.lookup(ROOT_CALLER, ROOT_NODE, "old");
    // The file goes on the host; the server's descriptor of it is evicted, so the inode is
    // free for the next file.
    fs::remove_file(&old_path).unwrap();
    churn(&c);
    let mut reused = None;
    for i in 0..500 {
        let p = fx.export.join(format!("new-{i}"));
        fs::write(&p, "new life\n").unwrap();
        if fs::metadata(&p).unwrap().ino() == old.node.get() {
            reused = Some(format!("new-{i}"));
            break;
        }
    }
    let Some(name) = reused else {
        common::skip_anywhere(&format!("the file system did not reuse inode {}", old.node));
        return;
    };
    let new = c.lookup(ROOT_CALLER, ROOT_NODE, &name);
    assert!(
        new.node != old.node || new.generation != old.generation,
        "{name} reuses the inode number of the deleted \"old\" and got the same node id and \
         generation: the client cannot tell the two files apart"
    );
    // Requests for the old node must not reach the new file.
    assert_eq!(
        c.call(
            ROOT_CALLER,
            &Request::Getattr {
                node: old.node,
                fh: None
            }
        )
        .map(|_| ()),
        Err(WireErrno::ESTALE),
        "the deleted file's node answers for {name}"
    );
    fx.finish();
}

/// Races host-side swaps of `path` for symlinks to `targets` against four client threads
/// (two per connection, each running `client(connection, thread number, deadline, stats)`)
/// for [`RACE_TIME`], with node descriptors evicted all the time. Returns the number of
/// swaps and what the clients saw.
fn race_swaps(
    fx: &Fixture,
    path: &Path,
    targets: &[PathBuf],
    client: impl Fn(&Client, usize, Instant, &RaceStats) + Sync,
) -> (AtomicU64, RaceStats) {
    let parked = path.with_extension("tmp");
    let stats = RaceStats::default();
    let clients: Vec<Client> = (0..2).map(|_| fx.client()).collect();
    for c in &clients {
        pin_pads(c);
    }
    let swaps = AtomicU64::new(0);
    let deadline = Instant::now() + RACE_TIME;
    thread::scope(|s| {
        s.spawn(|| swap_with_symlinks(path, &parked, targets, deadline, &swaps));
        for (k, c) in clients.iter().enumerate() {
            for t in 0..2 {
                let (stats, client) = (&stats, &client);
                s.spawn(move || client(c, k * 2 + t, deadline, stats));
            }
        }
    });
    (swaps, stats)
}

/// The host swapped, the clients saw both the real object and the symlink, and they did
/// work inside: a race that proves something.
fn assert_race_happened(swaps: &AtomicU64, stats: &RaceStats) {
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    assert!(load(swaps) > 10, "the host hardly swapped");
    assert!(
        load(&stats.saw_dir) > 0 && load(&stats.saw_link) > 0,
        "no race happened"
    );
    assert!(
        load(&stats.done_inside) > 0,
        "the clients never worked inside"
    );
}

/// Until `deadline`, swaps `path` for a symlink to each of `targets` in turn and back:
/// `mv path parked; ln -s TARGET path; ...; rm path; mv parked path`.
fn swap_with_symlinks(
    path: &Path,
    parked: &Path,
    targets: &[PathBuf],
    deadline: Instant,
    swaps: &AtomicU64,
) {
    let mut i = 0;
    while Instant::now() < deadline {
        fs::rename(path, parked).unwrap();
        symlink(&targets[i % targets.len()], path).unwrap();
        thread::sleep(Duration::from_micros(300));
        fs::remove_file(path).unwrap();
        fs::rename(parked, path).unwrap();
        thread::sleep(Duration::from_micros(200));
        i += 1;
        swaps.fetch_add(1, Ordering::Relaxed);
    }
}
