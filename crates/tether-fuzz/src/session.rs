//! Target `session`: request frames executed by the server against a temporary export.
//!
//! Input: one configuration byte ([`config`]: a read-only export, the ownership mapping),
//! then frames, each `op` u16 LE, `flags` u8, `len` u16 LE and `len` body bytes (fewer at
//! the end of the input). Each frame goes to `tether_server::session::handle_frame` with ids 1, 2, 3, …;
//! a protocol error ends the sequence, as it ends a real session.
//!
//! Node ids are host inode numbers (or synthetic ids), which an input cannot know, so a request that decodes
//! has its node fields below [`REF_LIMIT`] replaced by nodes the session has handed out so
//! far (`0` the root, `k` the k-th node learned from a reply, modulo their number) and is
//! encoded again. A few values are capped so that one input cannot fill the disk or block.
//!
//! Every input starts from a fresh export (the directory is recreated, the `Export` reopened
//! and a new `ExportFs` built), so an input always does the same thing. Checked after every
//! frame and input: no panic; the reply is a well-formed reply to the request, which the
//! client can decode; no reply carries the bytes of `outside/secret` or names a node outside
//! the export; `outside/` and the directory above the export are unchanged (names, types,
//! modes, sizes, owners, link counts, inode numbers, mtimes and ctimes; the content of
//! `secret`); a read-only export is unchanged; memory stays bounded.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::os::unix::fs::{symlink, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use tether_proto::frame::FLAG_NO_REPLY;
use tether_proto::{
    FrameHeader, FrameKind, NodeId, Op, Reply, Request, WireErrno, FRAME_HEADER_LEN, MAX_FRAME_LEN,
    ROOT_NODE,
};
use tether_server::export::ExportFs;
use tether_server::session::handle_frame;
use tether_server::{Export, ExportOptions, IdMap};

use crate::alloc::MemScope;

/// Node fields below this value refer to nodes handed out so far (see the module docs).
pub const REF_LIMIT: u64 = 1024;
/// Caps on sizes that would otherwise write that many bytes to the disk.
const MAX_ALLOC_LEN: u64 = 1 << 20;
/// Node descriptors the export may hold at once: small, so eviction and reopening by name
/// are exercised.
const MAX_NODE_FDS: usize = 16;
/// Most nodes remembered for references.
const MAX_KNOWN: usize = 64;

/// Configuration bits (byte 0 of the input).
pub mod config {
    /// A read-only export.
    pub const READ_ONLY: u8 = 1;
    /// Ownership: host ids passed through (else squashed to the session's owner).
    pub const PASSTHROUGH_IDS: u8 = 2;
    /// Ownership: explicit tables (guest 1000:100 is host 0:0); wins over passthrough.
    pub const MAPPED_IDS: u8 = 4;
}

/// The guest owner the session's client names (HELLO's owner_uid, owner_gid).
pub const OWNER: (u32, u32) = (1000, 100);

fn id_map(conf: u8) -> IdMap {
    if conf & config::MAPPED_IDS != 0 {
        IdMap::Mapped {
            uids: vec![(OWNER.0, 0)],
            gids: vec![(OWNER.1, 0)],
        }
    } else if conf & config::PASSTHROUGH_IDS != 0 {
        IdMap::Passthrough
    } else {
        IdMap::Squash
    }
}

/// The content of `outside/secret`: no reply may ever carry it.
pub const SECRET: [u8; 32] = [
    0x5e, 0xc7, 0xe7, 0x3a, 0x91, 0x0f, 0xd2, 0x44, 0xb8, 0x6b, 0x1c, 0xe5, 0x7a, 0x29, 0xf3, 0x80,
    0x4d, 0xa6, 0x13, 0xcb, 0x62, 0x9e, 0x05, 0xf8, 0x37, 0xd9, 0x8a, 0x51, 0xbe, 0x2c, 0x74, 0xe1,
];

/// Files of the export at the start of every input (symlinks: name -> target).
pub const EXPORT_FILES: &[(&str, &[u8])] = &[
    ("file.txt", b"hello, tether\n"),
    ("empty", b""),
    ("dir/inner.txt", b"inner file\n"),
    ("dir/sub/deep.txt", b"deep\n"),
];
pub const EXPORT_SYMLINKS: &[(&str, &str)] = &[
    ("escape", "../outside/secret"),
    ("outlink", "../outside"),
    ("rootlink", "/"),
    ("dir/up", "../../outside/sub"),
];

/// The rolling hash of [`contains_secret`]: a hash comparison, not a byte comparison, so
/// that libFuzzer's comparison tracing never learns the secret's bytes.
const HASH_BASE: u64 = 0x100_0000_01b3;

fn secret_hash() -> (u64, u64) {
    let mut h = 0u64;
    let mut top = 1u64; // HASH_BASE^(len-1)
    for (i, &b) in SECRET.iter().enumerate() {
        h = h.wrapping_mul(HASH_BASE).wrapping_add(b as u64 + 1);
        if i > 0 {
            top = top.wrapping_mul(HASH_BASE);
        }
    }
    (h, top)
}

/// Whether `hay` contains the secret.
pub fn contains_secret(hay: &[u8]) -> bool {
    let n = SECRET.len();
    if hay.len() < n {
        return false;
    }
    let (want, top) = secret_hash();
    let mut h = 0u64;
    for &b in &hay[..n] {
        h = h.wrapping_mul(HASH_BASE).wrapping_add(b as u64 + 1);
    }
    for i in 0..=hay.len() - n {
        if i > 0 {
            h = h
                .wrapping_sub((hay[i - 1] as u64 + 1).wrapping_mul(top))
                .wrapping_mul(HASH_BASE)
                .wrapping_add(hay[i + n - 1] as u64 + 1);
        }
        if h == want && hay[i..i + n].iter().zip(SECRET).all(|(a, b)| *a == b) {
            return true;
        }
    }
    false
}

/// What the checks compare: everything but access times.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Meta {
    ino: u64,
    mode: u32,
    size: u64,
    nlink: u64,
    uid: u32,
    gid: u32,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

type Snapshot = BTreeMap<PathBuf, Meta>;

fn meta(path: &Path) -> Meta {
    let m = fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Meta {
        ino: m.ino(),
        mode: m.mode(),
        size: m.size(),
        nlink: m.nlink(),
        uid: m.uid(),
        gid: m.gid(),
        mtime: (m.mtime(), m.mtime_nsec()),
        ctime: (m.ctime(), m.ctime_nsec()),
    }
}

/// `path` and everything below it (without following symlinks), keyed by path.
fn snapshot_tree(path: &Path, into: &mut Snapshot) {
    let m = meta(path);
    let is_dir = m.mode & libc::S_IFMT == libc::S_IFDIR;
    into.insert(path.to_path_buf(), m);
    if is_dir {
        let entries = fs::read_dir(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for e in entries {
            snapshot_tree(&e.expect("a directory entry").path(), into);
        }
    }
}

/// Removes everything below `dir` (and `dir` itself), restoring permissions first should
/// an input have taken them away.
fn remove_tree(dir: &Path) {
    if fs::remove_dir_all(dir).is_ok() || !dir.exists() {
        return;
    }
    fn open_up(p: &Path) {
        let Ok(m) = fs::symlink_metadata(p) else {
            return;
        };
        if m.is_dir() {
            let _ = fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(0o700));
            if let Ok(rd) = fs::read_dir(p) {
                for e in rd.flatten() {
                    open_up(&e.path());
                }
            }
        }
    }
    open_up(dir);
    fs::remove_dir_all(dir).unwrap_or_else(|e| panic!("cannot reset {}: {e}", dir.display()));
}

struct Fixture {
    /// Holds the temporary directory (removed on drop).
    _tmp: tempfile::TempDir,
    root: PathBuf,
    export: PathBuf,
    outside: PathBuf,
    /// Inode numbers of everything outside the export: no entry may carry them.
    foreign_inos: HashSet<u64>,
    /// `outside/` and the directory above the export, at the start.
    outside_snapshot: Snapshot,
}

impl Fixture {
    fn new() -> Fixture {
        let base = std::env::var_os("TETHER_FUZZ_TMPDIR")
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir);
        let tmp = tempfile::Builder::new()
            .prefix("tether-fuzz-")
            .tempdir_in(&base)
            .unwrap_or_else(|e| panic!("temporary directory in {}: {e}", base.display()));
        let root = fs::canonicalize(tmp.path()).expect("canonical temporary directory");
        let export = root.join("export");
        let outside = root.join("outside");
        fs::create_dir_all(outside.join("sub")).expect("outside/sub");
        fs::write(outside.join("secret"), SECRET).expect("outside/secret");
        fs::write(outside.join("sub/note.txt"), b"outside note\n").expect("outside/sub/note.txt");
        let mut fx = Fixture {
            _tmp: tmp,
            root,
            export,
            outside,
            foreign_inos: HashSet::new(),
            outside_snapshot: Snapshot::new(),
        };
        fx.reset_export();
        fx.outside_snapshot = fx.outside_now();
        fx.foreign_inos = fx.outside_snapshot.values().map(|m| m.ino).collect();
        fx
    }

    /// `outside/` recursively, and the directory above the export (whose times change when
    /// the export is recreated: compared against its state after the reset).
    fn outside_now(&self) -> Snapshot {
        let mut s = Snapshot::new();
        snapshot_tree(&self.outside, &mut s);
        s.insert(self.root.clone(), meta(&self.root));
        s
    }

    /// Recreates the export directory with its initial content.
    fn reset_export(&self) {
        remove_tree(&self.export);
        fs::create_dir(&self.export).expect("export directory");
        fs::create_dir_all(self.export.join("dir/sub")).expect("export/dir/sub");
        for (name, content) in EXPORT_FILES {
            fs::write(self.export.join(name), content).expect("export file");
        }
        for (name, target) in EXPORT_SYMLINKS {
            symlink(target, self.export.join(name)).expect("export symlink");
        }
    }

    /// Panics if anything outside the export changed (`root` is the state of the directory
    /// above the export after the reset).
    fn check_outside(&mut self, root: Meta) {
        self.outside_snapshot.insert(self.root.clone(), root);
        let now = self.outside_now();
        if now != self.outside_snapshot {
            for (p, m) in &now {
                match self.outside_snapshot.get(p) {
                    None => eprintln!("new outside the export: {} {m:?}", p.display()),
                    Some(old) if old != m => {
                        eprintln!("changed: {} {old:?} -> {m:?}", p.display())
                    }
                    _ => {}
                }
            }
            for p in self.outside_snapshot.keys() {
                if !now.contains_key(p) {
                    eprintln!("gone outside the export: {}", p.display());
                }
            }
            panic!("the session changed files outside the export");
        }
        let secret = fs::read(self.outside.join("secret")).expect("outside/secret");
        assert!(
            secret.len() == SECRET.len() && contains_secret(&secret),
            "outside/secret's content changed"
        );
    }
}

thread_local! {
    static FIXTURE: RefCell<Option<Fixture>> = const { RefCell::new(None) };
}

/// Replaces node fields below [`REF_LIMIT`] by nodes handed out so far.
fn remap(req: &mut Request, known: &[NodeId]) {
    let m = |id: &mut NodeId| {
        // A small number from the fuzzer is a reference to a node handed out, not an id.
        let raw = id.get();
        if raw < REF_LIMIT {
            *id = known[raw as usize % known.len()];
        }
    };
    use Request::*;
    match req {
        Hello(_) | Auth { .. } | Ping | Sync => {}
        Forget { nodes } => nodes.iter_mut().for_each(|(id, _)| m(id)),
        Lookup { parent, .. }
        | Unlink { parent, .. }
        | Rmdir { parent, .. }
        | Mknod { parent, .. }
        | Mkdir { parent, .. }
        | Symlink { parent, .. }
        | Create { parent, .. }
        | Reclaim { parent, .. }
        | Spares { parent, .. } => m(parent),
        Bind { parent, node, .. } => {
            m(parent);
            m(node);
        }
        Rename {
            parent, new_parent, ..
        } => {
            m(parent);
            m(new_parent);
        }
        Link {
            node, new_parent, ..
        } => {
            m(node);
            m(new_parent);
        }
        CopyFileRange {
            node_in, node_out, ..
        } => {
            m(node_in);
            m(node_out);
        }
        Getattr { node, .. }
        | Setattr { node, .. }
        | Readlink { node }
        | Open { node, .. }
        | Read { node, .. }
        | Write { node, .. }
        | Statfs { node }
        | Release { node, .. }
        | Fsync { node, .. }
        | Setxattr { node, .. }
        | Getxattr { node, .. }
        | Listxattr { node, .. }
        | Removexattr { node, .. }
        | Flush { node, .. }
        | Opendir { node, .. }
        | Readdir { node, .. }
        | Releasedir { node, .. }
        | Fsyncdir { node, .. }
        | Access { node, .. }
        | Fallocate { node, .. }
        | Lseek { node, .. }
        | Reopen { node, .. }
        | Setlk { node, .. }
        | Getlk { node, .. }
        | LockRelease { node, .. } => m(node),
    }
}

/// Keeps one input from writing much to the disk or blocking the harness.
fn cap(req: &mut Request) {
    match req {
        Request::Fallocate { offset, length, .. } => {
            *offset = (*offset).min(MAX_ALLOC_LEN);
            *length = (*length).min(MAX_ALLOC_LEN);
        }
        Request::CopyFileRange { len, .. } => *len = (*len).min(MAX_ALLOC_LEN),
        _ => {}
    }
}

/// Whether to print every request and reply (`TETHER_FUZZ_TRACE=1`), to see what an
/// input does.
fn trace() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("TETHER_FUZZ_TRACE").is_some_and(|v| !v.is_empty()))
}

/// Size of one entry in the kernel's readdir buffer (as the server budgets it).
fn dirent_size(name_len: usize, plus: bool) -> usize {
    (if plus { 152 } else { 24 } + name_len).next_multiple_of(8)
}

struct Run<'a> {
    fx: &'a Fixture,
    fs: ExportFs,
    known: Vec<NodeId>,
}

impl Run<'_> {
    fn learn(&mut self, node: NodeId) {
        assert!(
            // Node ids of the export's own file system are host inode numbers.
            !self.fx.foreign_inos.contains(&node.get()),
            "a reply names node {node}, which is outside the export"
        );
        if !self.known.contains(&node) && self.known.len() < MAX_KNOWN {
            self.known.push(node);
        }
    }

    /// Checks a reply to `req` (None when the request did not decode: unknown op).
    fn check_reply(&mut self, h: &FrameHeader, req: Option<&Request>, frame: &[u8]) {
        assert!(
            frame.len() <= MAX_FRAME_LEN,
            "reply of {} bytes",
            frame.len()
        );
        let rh = FrameHeader::decode(
            frame[..FRAME_HEADER_LEN]
                .try_into()
                .expect("a reply header"),
            MAX_FRAME_LEN,
        )
        .expect("the reply header decodes");
        assert_eq!(
            (rh.kind, rh.flags, rh.op, rh.id),
            (FrameKind::Reply, 0, h.op, h.id)
        );
        assert_eq!(rh.body_len, frame.len() - FRAME_HEADER_LEN);
        assert!(
            !contains_secret(frame),
            "a reply carries the content of outside/secret"
        );
        let body = Bytes::copy_from_slice(&frame[FRAME_HEADER_LEN..]);
        let Some(req) = req else {
            assert_eq!(
                &body[..],
                &(WireErrno::ENOSYS.0 as i32).to_le_bytes(),
                "an unknown op gets ENOSYS"
            );
            return;
        };
        let decoded = Reply::decode(h.op, body);
        if trace() {
            eprintln!("  -> {decoded:?}");
        }
        let reply = match decoded {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => return,
            Err(e) => panic!("the client cannot decode the reply to {req:?}: {e}"),
        };
        match (&reply, req) {
            (Reply::Entry(e), _) | (Reply::Create { entry: e, .. }, _) => self.learn(e.node),
            (Reply::Data(d), Request::Read { size, .. }) => {
                assert!(d.len() <= *size as usize, "read {} > {size}", d.len())
            }
            (Reply::Dir { entries, .. }, Request::Readdir { size, plus, .. }) => {
                let used: usize = entries
                    .iter()
                    .map(|d| dirent_size(d.name.len(), *plus))
                    .sum();
                assert!(used <= *size as usize, "readdir {used} > {size}");
                for d in entries {
                    // The root's ".." too: it shows as the root itself.
                    assert!(
                        !self.fx.foreign_inos.contains(&d.ino.get()),
                        "a listing shows inode {} from outside the export ({:?})",
                        d.ino,
                        d.name
                    );
                    if let Some(e) = &d.entry {
                        self.learn(e.node);
                    }
                }
            }
            _ => {}
        }
    }

    /// Executes one frame; false when it was a protocol error (the session would end).
    fn frame(&mut self, id: u64, op: u16, flags: u8, raw: &[u8]) -> bool {
        let decoded = Request::decode(op, Bytes::copy_from_slice(raw));
        let (body, req) = match decoded {
            Ok((caller, mut req)) => {
                remap(&mut req, &self.known);
                cap(&mut req);
                let frame = req.to_frame(id, caller);
                (
                    Bytes::copy_from_slice(&frame[FRAME_HEADER_LEN..]),
                    Some(req),
                )
            }
            // Unknown op or malformed: sent as it is.
            Err(_) => (Bytes::copy_from_slice(raw), None),
        };
        if trace() {
            match &req {
                Some(r) => eprintln!("{id}: {r:?} (flags {flags})"),
                None => eprintln!("{id}: op {op}, {} undecodable bytes", raw.len()),
            }
        }
        let known_op = Op::from_u16(op).is_ok();
        let h = FrameHeader {
            kind: FrameKind::Request,
            flags,
            op,
            id,
            body_len: body.len(),
        };
        let no_reply = flags & FLAG_NO_REPLY != 0;
        match (handle_frame(&self.fs, &h, body), &req) {
            (Ok(reply), _) if known_op && req.is_none() => {
                panic!("a malformed request was executed: op {op}, reply {reply:?}")
            }
            (Ok(reply), req) => {
                assert_eq!(reply.is_none(), no_reply, "reply to a NO_REPLY frame");
                if let Some(frame) = reply {
                    self.check_reply(&h, req.as_ref(), &frame);
                }
                true
            }
            (Err(e), Some(req)) => panic!("a well-formed request {req:?} ended the session: {e}"),
            (Err(_), None) => {
                assert!(known_op, "an unknown op ended the session");
                false
            }
        }
    }
}

/// Runs the frames of `data` against a fresh temporary export (see the module docs).
pub fn session(data: &[u8]) {
    let Some((&conf, mut rest)) = data.split_first() else {
        return;
    };
    FIXTURE.with(|cell| {
        let mut slot = cell.borrow_mut();
        let fx = slot.get_or_insert_with(Fixture::new);
        fx.reset_export();
        let root_after_reset = meta(&fx.root);
        let read_only = conf & config::READ_ONLY != 0;
        let opts = ExportOptions {
            read_only,
            max_node_fds: MAX_NODE_FDS,
            id_map: id_map(conf),
            ..ExportOptions::default()
        };
        let export: Arc<Export> = Export::open(&fx.export, &opts).expect("open the export");
        let fs = ExportFs::new(export, false, false, OWNER).expect("a session view of the export");
        let before = read_only.then(|| {
            let mut s = Snapshot::new();
            snapshot_tree(&fx.export, &mut s);
            s
        });

        let mem = MemScope::start();
        let mut run = Run {
            fx,
            fs,
            known: vec![ROOT_NODE],
        };
        let mut id = 1;
        while let [o0, o1, flags, l0, l1, tail @ ..] = rest {
            let op = u16::from_le_bytes([*o0, *o1]);
            let len = (u16::from_le_bytes([*l0, *l1]) as usize).min(tail.len());
            let (body, next) = tail.split_at(len);
            rest = next;
            if !run.frame(id, op, *flags, body) {
                break;
            }
            id += 1;
        }
        drop(run);
        mem.check("session", 64 << 20, 2 * MAX_FRAME_LEN);

        fx.check_outside(root_after_reset);
        if let Some(before) = before {
            let mut after = Snapshot::new();
            snapshot_tree(&fx.export, &mut after);
            assert!(before == after, "a read-only export changed");
        }
    });
}

/// Encodes one frame of a `session` input.
pub fn session_frame(out: &mut Vec<u8>, op: u16, flags: u8, body: &[u8]) {
    let len = u16::try_from(body.len()).expect("a session frame body fits in u16");
    out.extend_from_slice(&op.to_le_bytes());
    out.push(flags);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(body);
}
