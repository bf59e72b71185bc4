//! Seed inputs built from real encoded messages, for the corpus (`examples/gen_corpus.rs`
//! writes them to `fuzz/corpus/<target>/`) and for the smoke test.

use bytes::Bytes;
use tether_proto::auth::{NONCE_LEN, PROOF_LEN};
use tether_proto::frame::FLAG_NO_REPLY;
use tether_proto::handshake::features;
use tether_proto::{
    invalidate_frame, lock_freed_frame, reply_frame, setattr_valid, Attr, Caller, Challenge,
    DirEntry, Entry, EventKind, HandleId, Hello, HelloReply, HostEvent, IdMapping, InvalidatePush,
    Invalidation, NodeId, Op, Reply, Request, SetAttr, SetTime, Statfs, Timespec, WireErrno,
    FRAME_HEADER_LEN, MAGIC, MAX_FRAME_LEN, PROTOCOL_VERSION,
};

use crate::messages::{family, selector_for, OPS};
use crate::session::{config, session_frame};

fn b(s: &[u8]) -> Bytes {
    Bytes::copy_from_slice(s)
}

fn body(frame: &[u8]) -> &[u8] {
    &frame[FRAME_HEADER_LEN..]
}

const CALLER: Caller = Caller {
    uid: 1000,
    gid: 100,
    pid: 4242,
};

fn hello() -> Hello {
    Hello {
        min_version: PROTOCOL_VERSION,
        max_version: PROTOCOL_VERSION,
        features: features::PUSH_INVALIDATE | features::IO_BY_NODE | features::HOST_EVENTS,
        max_frame: MAX_FRAME_LEN as u32,
        owner_uid: 1000,
        owner_gid: 100,
        client_nonce: [0x11; NONCE_LEN],
        client_name: b"fuzz-seed".to_vec(),
    }
}

fn attr(ino: NodeId) -> Attr {
    let t = Timespec {
        sec: 1_700_000_000,
        nsec: 123_456_789,
    };
    Attr {
        ino,
        size: 14,
        blocks: 8,
        atime: t,
        mtime: t,
        ctime: t,
        mode: libc::S_IFREG | 0o644,
        nlink: 1,
        uid: 1000,
        gid: 100,
        rdev: 0,
        blksize: 4096,
        seq: 0,
    }
}

fn entry(node: NodeId) -> Entry {
    Entry {
        node,
        generation: 3,
        flags: 1,
        attr: attr(node),
    }
}

/// One request of every op, with plausible values.
pub fn requests() -> Vec<Request> {
    use Request::*;
    vec![
        Hello(hello()),
        Auth {
            proof: [0x44; PROOF_LEN],
        },
        Lookup {
            parent: NodeId::new(1),
            name: b(b"hello.txt"),
        },
        Forget {
            nodes: vec![(NodeId::new(5), 1), (NodeId::new(6), 2)],
        },
        Getattr {
            node: NodeId::new(5),
            fh: None,
        },
        Setattr {
            node: NodeId::new(5),
            fh: HandleId::new(2),
            set: SetAttr {
                valid: setattr_valid::MODE | setattr_valid::SIZE,
                mode: 0o600,
                uid: 0,
                gid: 0,
                size: 100,
                atime: SetTime::Now,
                mtime: SetTime::At(Timespec {
                    sec: 1_600_000_000,
                    nsec: 5,
                }),
            },
        },
        Readlink {
            node: NodeId::new(7),
        },
        Mknod {
            parent: NodeId::new(1),
            name: b(b"fifo"),
            mode: libc::S_IFIFO | 0o644,
            rdev: 0,
            umask: 0o022,
        },
        Mkdir {
            parent: NodeId::new(1),
            name: b(b"newdir"),
            mode: 0o755,
            umask: 0o022,
        },
        Unlink {
            parent: NodeId::new(1),
            name: b(b"old.txt"),
        },
        Rmdir {
            parent: NodeId::new(1),
            name: b(b"olddir"),
        },
        Symlink {
            parent: NodeId::new(1),
            name: b(b"link"),
            target: b(b"../target"),
        },
        Rename {
            parent: NodeId::new(1),
            name: b(b"a"),
            new_parent: NodeId::new(8),
            new_name: b(b"b"),
            flags: libc::RENAME_NOREPLACE,
        },
        Link {
            node: NodeId::new(5),
            new_parent: NodeId::new(1),
            new_name: b(b"hard"),
        },
        Open {
            node: NodeId::new(5),
            flags: libc::O_RDWR as u32,
        },
        Read {
            node: NodeId::new(5),
            fh: HandleId::new(2),
            offset: 0,
            size: 4096,
        },
        Write {
            node: NodeId::new(5),
            fh: HandleId::new(2),
            offset: 10,
            data: b(b"written data"),
        },
        Statfs {
            node: NodeId::new(1),
        },
        Release {
            node: NodeId::new(5),
            fh: HandleId::new(2),
        },
        Fsync {
            node: NodeId::new(5),
            fh: HandleId::new(2),
            datasync: true,
        },
        Setxattr {
            node: NodeId::new(5),
            name: b(b"user.tag"),
            value: b(b"value"),
            flags: 0,
        },
        Getxattr {
            node: NodeId::new(5),
            name: b(b"user.tag"),
            size: 64,
        },
        Listxattr {
            node: NodeId::new(5),
            size: 0,
        },
        Removexattr {
            node: NodeId::new(5),
            name: b(b"user.tag"),
        },
        Flush {
            node: NodeId::new(5),
            fh: HandleId::new(2),
            lock_owner: 0xdead,
        },
        Opendir {
            node: NodeId::new(1),
            flags: 0,
        },
        Readdir {
            node: NodeId::new(1),
            fh: HandleId::new(3),
            offset: 0,
            size: 4096,
            plus: true,
        },
        Releasedir {
            node: NodeId::new(1),
            fh: HandleId::new(3),
        },
        Fsyncdir {
            node: NodeId::new(1),
            fh: HandleId::new(3),
            datasync: false,
        },
        Access {
            node: NodeId::new(5),
            mask: libc::R_OK as u32,
        },
        Create {
            parent: NodeId::new(1),
            name: b(b"created"),
            mode: 0o644,
            umask: 0o022,
            flags: (libc::O_RDWR | libc::O_CREAT) as u32,
        },
        Fallocate {
            node: NodeId::new(5),
            fh: HandleId::new(2),
            offset: 0,
            length: 8192,
            mode: 0,
        },
        Lseek {
            node: NodeId::new(5),
            fh: HandleId::new(2),
            offset: -4,
            whence: libc::SEEK_END as u32,
        },
        CopyFileRange {
            node_in: NodeId::new(5),
            fh_in: HandleId::new(2),
            offset_in: 0,
            node_out: NodeId::new(9),
            fh_out: HandleId::new(4),
            offset_out: 0,
            len: 100,
            flags: 0,
        },
        Ping,
        Sync,
    ]
}

/// Replies of every shape, for their ops, and a few errors.
pub fn replies() -> Vec<(Op, Result<Reply, WireErrno>)> {
    let dir = vec![
        DirEntry {
            ino: NodeId::new(1),
            offset: 1,
            kind: libc::DT_DIR,
            name: b(b"."),
            entry: None,
        },
        DirEntry {
            ino: NodeId::new(5),
            offset: 2,
            kind: libc::DT_REG,
            name: b(b"hello.txt"),
            entry: Some(entry(NodeId::new(5))),
        },
        DirEntry {
            ino: NodeId::new(7),
            offset: 3,
            kind: libc::DT_LNK,
            name: b(b"link"),
            entry: None,
        },
    ];
    vec![
        (
            Op::Hello,
            Ok(Reply::Hello(HelloReply {
                version: PROTOCOL_VERSION,
                features: features::IO_BY_NODE,
                max_frame: MAX_FRAME_LEN as u32,
                max_in_flight: 256,
                instance: *b"0123456789abcdef",
                read_only: true,
                id_mapping: IdMapping::Mapped,
                challenge: None,
            })),
        ),
        (
            Op::Hello,
            Ok(Reply::Hello(HelloReply {
                version: PROTOCOL_VERSION,
                features: 0,
                max_frame: 4096,
                max_in_flight: 0,
                instance: [0; 16],
                read_only: false,
                id_mapping: IdMapping::Squash,
                challenge: Some(Challenge {
                    server_nonce: [0x22; NONCE_LEN],
                    server_proof: [0x33; PROOF_LEN],
                }),
            })),
        ),
        (Op::Auth, Err(WireErrno::EACCES)),
        (Op::Hello, Err(WireErrno::EPROTO)),
        (Op::Lookup, Ok(Reply::Entry(entry(NodeId::new(5))))),
        (Op::Lookup, Err(WireErrno::ENOENT)),
        (Op::Mkdir, Ok(Reply::Entry(entry(NodeId::new(8))))),
        (Op::Getattr, Ok(Reply::Attr(attr(NodeId::new(5))))),
        (Op::Setattr, Ok(Reply::Attr(attr(NodeId::new(5))))),
        (Op::Readlink, Ok(Reply::Data(b(b"../target")))),
        (Op::Read, Ok(Reply::Data(b(b"hello, tether\n")))),
        (Op::Read, Ok(Reply::Data(Bytes::new()))),
        (Op::Unlink, Ok(Reply::Empty)),
        (Op::Ping, Ok(Reply::Empty)),
        (Op::Sync, Ok(Reply::Empty)),
        (
            Op::Open,
            Ok(Reply::Open {
                fh: HandleId::new(2).unwrap(),
                flags: 1,
            }),
        ),
        (
            Op::Opendir,
            Ok(Reply::Open {
                fh: HandleId::new(3).unwrap(),
                flags: 0,
            }),
        ),
        (
            Op::Write,
            Ok(Reply::Written {
                size: 12,
                attr: None,
            }),
        ),
        (
            Op::CopyFileRange,
            Ok(Reply::Written {
                size: 100,
                attr: None,
            }),
        ),
        (
            Op::Statfs,
            Ok(Reply::Statfs(Statfs {
                blocks: 1000,
                bfree: 500,
                bavail: 400,
                files: 100,
                ffree: 50,
                bsize: 4096,
                namelen: 255,
                frsize: 4096,
            })),
        ),
        (Op::Getxattr, Ok(Reply::XattrSize(5))),
        (Op::Getxattr, Ok(Reply::XattrData(b(b"value")))),
        (Op::Listxattr, Ok(Reply::XattrData(b(b"user.a\0user.b\0")))),
        (Op::Getxattr, Err(WireErrno::ERANGE)),
        (
            Op::Readdir,
            Ok(Reply::Dir {
                entries: dir,
                end: false,
            }),
        ),
        (
            Op::Readdir,
            Ok(Reply::Dir {
                entries: Vec::new(),
                end: true,
            }),
        ),
        (
            Op::Create,
            Ok(Reply::Create {
                entry: entry(NodeId::new(9)),
                fh: HandleId::new(4),
                flags: 0,
                dir: None,
            }),
        ),
        (Op::Lseek, Ok(Reply::Lseek { offset: 10 })),
        (Op::Fsync, Err(WireErrno::EIO)),
    ]
}

/// INVALIDATE pushes: items only, with host events of every kind, everything at once.
pub fn pushes() -> Vec<InvalidatePush> {
    let items = vec![
        Invalidation::Inode(NodeId::new(5)),
        Invalidation::Entry {
            parent: NodeId::new(1),
            name: b(b"hello.txt"),
        },
        Invalidation::All,
    ];
    let ev = |kind| HostEvent {
        dir: NodeId::new(1),
        dir_path: b(b"sub/dir"),
        name: b(b"hello.txt"),
        node: Some(NodeId::new(5)),
        file_type: libc::S_IFREG,
        kind,
    };
    let events = vec![
        ev(EventKind::Created),
        ev(EventKind::Deleted),
        ev(EventKind::Changed(3)),
        ev(EventKind::Moved {
            from_dir: NodeId::new(8),
            from_path: b(b"old"),
            from_name: b(b"was.txt"),
        }),
    ];
    vec![
        InvalidatePush {
            items: items.clone(),
            events: Vec::new(),
        },
        InvalidatePush {
            items: vec![Invalidation::Inode(NodeId::new(1))],
            events: events.clone(),
        },
        InvalidatePush { items, events },
        InvalidatePush::default(),
    ]
}

fn push_frame(p: &InvalidatePush, seq: u64) -> Vec<u8> {
    invalidate_frame(seq, &p.items, &p.events)
}

/// Seeds for the `frame` target: single frames of every kind and streams of them.
pub fn frame() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let reqs: Vec<Vec<u8>> = requests()
        .iter()
        .enumerate()
        .map(|(i, r)| r.to_frame(i as u64 + 1, CALLER))
        .collect();
    let reps: Vec<Vec<u8>> = replies()
        .iter()
        .enumerate()
        .map(|(i, (op, r))| reply_frame(*op as u16, i as u64 + 1, r))
        .collect();
    let pushes: Vec<Vec<u8>> = pushes()
        .iter()
        .enumerate()
        .map(|(i, p)| push_frame(p, i as u64 + 1))
        .collect();
    out.extend(reqs.iter().cloned());
    out.extend(reps.iter().cloned());
    out.extend(pushes.iter().cloned());
    out.push(reqs.concat());
    out.push([reps.concat(), pushes.concat()].concat());
    // A connection start: magic, HELLO, LOOKUP.
    out.push([&MAGIC[..], &reqs[0], &reqs[1]].concat());
    // A frame cut short, a header announcing more than the limit, one too short.
    out.push(reqs[1][..reqs[1].len() - 3].to_vec());
    let mut long = reqs[1].clone();
    long[..4].copy_from_slice(&(MAX_FRAME_LEN as u32 - 3).to_le_bytes());
    out.push(long);
    let mut short = reqs[1].clone();
    short[..4].copy_from_slice(&11u32.to_le_bytes());
    out.push(short);
    out
}

/// Seeds for the `messages` target: `[family, op selector] + body` for every message.
pub fn messages() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for r in requests() {
        let f = r.to_frame(1, CALLER);
        out.push([&[family::REQUEST, selector_for(r.op())], body(&f)].concat());
    }
    for (op, r) in replies() {
        let f = reply_frame(op as u16, 1, &r);
        out.push([&[family::REPLY, selector_for(op)], body(&f)].concat());
    }
    for p in pushes() {
        out.push([&[family::PUSH, 0], body(&push_frame(&p, 1))].concat());
    }
    out.push(
        [
            &[family::PUSH, 0],
            body(&lock_freed_frame(&[NodeId::new(2), NodeId::new(3)])),
        ]
        .concat(),
    );
    let mut e = tether_proto::Encoder::default();
    hello().encode(&mut e);
    out.push([&[family::HELLO, 0], &e.buf[..]].concat());
    if let (Op::Hello, Ok(Reply::Hello(h))) = &replies()[0] {
        let mut e = tether_proto::Encoder::default();
        h.encode(&mut e);
        out.push([&[family::HELLO, 0], &e.buf[..]].concat());
    }
    // An unknown op, for requests and replies.
    out.push(vec![family::REQUEST, OPS.len() as u8 + 99, 0, 0, 0, 0]);
    out
}

/// A `session` input under construction. Node fields are references: 0 the root, k the
/// k-th node the session handed out.
struct Script(Vec<u8>);

const ROOT_CALLER: Caller = Caller {
    uid: 0,
    gid: 0,
    pid: 1,
};

impl Script {
    fn new(conf: u8) -> Script {
        Script(vec![conf])
    }
    fn req(&mut self, r: Request) -> &mut Self {
        let f = r.to_frame(0, ROOT_CALLER);
        session_frame(&mut self.0, r.op() as u16, f[5], body(&f));
        self
    }
    fn raw(&mut self, op: u16, flags: u8, body: &[u8]) -> &mut Self {
        session_frame(&mut self.0, op, flags, body);
        self
    }
    fn done(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.0)
    }
}

fn lookup(parent: NodeId, name: &[u8]) -> Request {
    Request::Lookup {
        parent,
        name: b(name),
    }
}

fn read(node: NodeId, fh: Option<HandleId>, size: u32) -> Request {
    Request::Read {
        node,
        fh,
        offset: 0,
        size,
    }
}

fn readdir(node: NodeId, fh: Option<HandleId>, plus: bool) -> Request {
    Request::Readdir {
        node,
        fh,
        offset: 0,
        size: 8192,
        plus,
    }
}

/// Seeds for the `session` target: scripts that use every op on the fixture's files,
/// including attempts to get out through its symlinks.
pub fn session() -> Vec<Vec<u8>> {
    use Request::*;
    let rdwr = libc::O_RDWR as u32;
    let file_io = |conf| {
        Script::new(conf)
            .req(lookup(NodeId::new(0), b"file.txt"))
            .req(Getattr {
                node: NodeId::new(1),
                fh: None,
            })
            .req(Open {
                node: NodeId::new(1),
                flags: rdwr,
            })
            .req(read(NodeId::new(1), HandleId::new(1), 4096))
            .req(Write {
                node: NodeId::new(1),
                fh: HandleId::new(1),
                offset: 5,
                data: b(b"XYZ"),
            })
            .req(Lseek {
                node: NodeId::new(1),
                fh: HandleId::new(1),
                offset: 0,
                whence: libc::SEEK_END as u32,
            })
            .req(Fsync {
                node: NodeId::new(1),
                fh: HandleId::new(1),
                datasync: false,
            })
            .req(Flush {
                node: NodeId::new(1),
                fh: HandleId::new(1),
                lock_owner: 1,
            })
            .req(Setattr {
                node: NodeId::new(1),
                fh: None,
                set: SetAttr {
                    valid: setattr_valid::SIZE | setattr_valid::MODE,
                    mode: 0o600,
                    uid: 0,
                    gid: 0,
                    size: 3,
                    atime: SetTime::Omit,
                    mtime: SetTime::Now,
                },
            })
            .req(Fallocate {
                node: NodeId::new(1),
                fh: HandleId::new(1),
                offset: 0,
                length: 8192,
                mode: 0,
            })
            .req(read(NodeId::new(1), None, 100))
            .req(Release {
                node: NodeId::new(1),
                fh: HandleId::new(1),
            })
            .req(Access {
                node: NodeId::new(1),
                mask: libc::R_OK as u32,
            })
            .req(Statfs {
                node: NodeId::new(0),
            })
            .req(Forget {
                nodes: vec![(NodeId::new(1), 1)],
            })
            .req(Getattr {
                node: NodeId::new(1),
                fh: None,
            })
            .done()
    };
    let dirs = Script::new(0)
        .req(lookup(NodeId::new(0), b"dir"))
        .req(Opendir {
            node: NodeId::new(1),
            flags: 0,
        })
        .req(readdir(NodeId::new(1), HandleId::new(1), true))
        .req(Releasedir {
            node: NodeId::new(1),
            fh: HandleId::new(1),
        })
        .req(readdir(NodeId::new(0), None, false))
        .req(readdir(NodeId::new(0), None, true))
        .req(Mkdir {
            parent: NodeId::new(0),
            name: b(b"newdir"),
            mode: 0o755,
            umask: 0o022,
        })
        .req(Rename {
            parent: NodeId::new(0),
            name: b(b"newdir"),
            new_parent: NodeId::new(1),
            new_name: b(b"moved"),
            flags: 0,
        })
        .req(Rename {
            parent: NodeId::new(0),
            name: b(b"file.txt"),
            new_parent: NodeId::new(0),
            new_name: b(b"empty"),
            flags: libc::RENAME_EXCHANGE,
        })
        .req(Rmdir {
            parent: NodeId::new(1),
            name: b(b"moved"),
        })
        .req(Fsyncdir {
            node: NodeId::new(1),
            fh: None,
            datasync: true,
        })
        .req(lookup(NodeId::new(1), b"sub"))
        .req(lookup(NodeId::new(2), b"deep.txt"))
        .done();
    let escape = |conf| {
        Script::new(conf)
            .req(lookup(NodeId::new(0), b"escape"))
            .req(Readlink {
                node: NodeId::new(1),
            })
            .req(Open {
                node: NodeId::new(1),
                flags: 0,
            })
            .req(read(NodeId::new(1), None, 4096))
            .req(Setattr {
                node: NodeId::new(1),
                fh: None,
                set: SetAttr {
                    valid: setattr_valid::SIZE,
                    mode: 0,
                    uid: 0,
                    gid: 0,
                    size: 0,
                    atime: SetTime::Now,
                    mtime: SetTime::Now,
                },
            })
            .req(Link {
                node: NodeId::new(1),
                new_parent: NodeId::new(0),
                new_name: b(b"hard"),
            })
            .req(lookup(NodeId::new(0), b"hard"))
            .req(lookup(NodeId::new(0), b"outlink"))
            .req(lookup(NodeId::new(2), b"secret"))
            .req(Opendir {
                node: NodeId::new(2),
                flags: 0,
            })
            .req(readdir(NodeId::new(2), None, true))
            .req(lookup(NodeId::new(0), b"rootlink"))
            .req(lookup(NodeId::new(3), b"etc"))
            .req(readdir(NodeId::new(3), None, false))
            .req(lookup(NodeId::new(0), b".."))
            .req(lookup(NodeId::new(0), b"../outside/secret"))
            .req(Getxattr {
                node: NodeId::new(1),
                name: b(b"user.x"),
                size: 0,
            })
            .req(lookup(NodeId::new(0), b"file.txt"))
            .req(CopyFileRange {
                node_in: NodeId::new(1),
                fh_in: None,
                offset_in: 0,
                node_out: NodeId::new(4),
                fh_out: None,
                offset_out: 0,
                len: 32,
                flags: 0,
            })
            .req(Create {
                parent: NodeId::new(0),
                name: b(b"escape"),
                mode: 0o644,
                umask: 0,
                flags: rdwr,
            })
            .req(Symlink {
                parent: NodeId::new(0),
                name: b(b"s2"),
                target: b(b"../outside/secret"),
            })
            .req(Rename {
                parent: NodeId::new(0),
                name: b(b"outlink"),
                new_parent: NodeId::new(0),
                new_name: b(b"dir"),
                flags: 0,
            })
            .req(lookup(NodeId::new(0), b"dir"))
            .req(lookup(NodeId::new(5), b"up"))
            .req(lookup(NodeId::new(6), b"note.txt"))
            .done()
    };
    let create = |conf| {
        Script::new(conf)
            .req(Create {
                parent: NodeId::new(0),
                name: b(b"new.txt"),
                mode: 0o644,
                umask: 0o022,
                flags: rdwr,
            })
            .req(Write {
                node: NodeId::new(1),
                fh: HandleId::new(1),
                offset: 0,
                data: b(b"some new data for the file"),
            })
            .req(CopyFileRange {
                node_in: NodeId::new(1),
                fh_in: HandleId::new(1),
                offset_in: 0,
                node_out: NodeId::new(1),
                fh_out: HandleId::new(1),
                offset_out: 100,
                len: 10,
                flags: 0,
            })
            .req(read(NodeId::new(1), HandleId::new(1), 200))
            .req(Link {
                node: NodeId::new(1),
                new_parent: NodeId::new(0),
                new_name: b(b"new-link"),
            })
            .req(Unlink {
                parent: NodeId::new(0),
                name: b(b"new.txt"),
            })
            .req(Symlink {
                parent: NodeId::new(0),
                name: b(b"sl"),
                target: b(b"file.txt"),
            })
            .req(Readlink {
                node: NodeId::new(2),
            })
            .req(Mknod {
                parent: NodeId::new(0),
                name: b(b"fifo"),
                mode: libc::S_IFIFO | 0o644,
                rdev: 0,
                umask: 0,
            })
            .req(Mknod {
                parent: NodeId::new(0),
                name: b(b"dev"),
                mode: libc::S_IFCHR | 0o644,
                rdev: 0x0103,
                umask: 0,
            })
            .req(Mknod {
                parent: NodeId::new(0),
                name: b(b"plain"),
                mode: libc::S_IFREG | 0o600,
                rdev: 0,
                umask: 0,
            })
            .req(Open {
                node: NodeId::new(3),
                flags: (libc::O_WRONLY | libc::O_TRUNC) as u32,
            })
            .done()
    };
    let xattrs = Script::new(0)
        .req(lookup(NodeId::new(0), b"file.txt"))
        .req(Setxattr {
            node: NodeId::new(1),
            name: b(b"user.tag"),
            value: b(b"value"),
            flags: 0,
        })
        .req(Getxattr {
            node: NodeId::new(1),
            name: b(b"user.tag"),
            size: 0,
        })
        .req(Getxattr {
            node: NodeId::new(1),
            name: b(b"user.tag"),
            size: 64,
        })
        .req(Listxattr {
            node: NodeId::new(1),
            size: 0,
        })
        .req(Listxattr {
            node: NodeId::new(1),
            size: 256,
        })
        .req(Removexattr {
            node: NodeId::new(1),
            name: b(b"user.tag"),
        })
        .req(Listxattr {
            node: NodeId::new(0),
            size: 256,
        })
        .done();
    let misc = Script::new(0)
        .req(Ping)
        .req(Sync)
        .req(Hello(hello()))
        .raw(99, 0, &[0; 12])
        .raw(3, FLAG_NO_REPLY, &[])
        .req(lookup(NodeId::new(0), b"dir"))
        .req(Forget {
            nodes: vec![
                (NodeId::new(1), 1),
                (NodeId::new(0), 1),
                (NodeId::new(5000), 3),
            ],
        })
        .req(Getattr {
            node: NodeId::new(1),
            fh: None,
        })
        // Truncated: a protocol error, which ends the session.
        .raw(Op::Lookup as u16, 0, &[0; 15])
        .req(Ping)
        .done();
    let mut out = vec![
        file_io(0),
        file_io(config::READ_ONLY),
        dirs,
        escape(0),
        escape(config::READ_ONLY),
        create(0),
        create(config::READ_ONLY),
        xattrs,
        misc,
        create(config::PASSTHROUGH_IDS),
        create(config::MAPPED_IDS),
        file_io(config::MAPPED_IDS),
    ];
    let all: Vec<u8> = out.iter().flat_map(|s| s[1..].to_vec()).collect();
    out.push([&[0u8][..], &all].concat());
    out
}

/// The seeds of a target by name (`frame`, `messages`, `session`).
pub fn for_target(target: &str) -> Vec<Vec<u8>> {
    match target {
        "frame" => frame(),
        "messages" => messages(),
        "session" => session(),
        other => panic!("unknown target {other}"),
    }
}
