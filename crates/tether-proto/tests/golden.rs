//! Byte-exact golden tests of every Tether message, and of the decoder's failure paths.
//!
//! Each expected frame is written out by hand, field by field, from `docs/protocol.md`; none
//! of it is produced by the encoder under test. A case is checked both ways: the encoder must
//! produce exactly these bytes, and the decoder must turn them back into the original value.
//! The same frames then feed the truncation, trailing-byte and mutation tests.

use bytes::Bytes;
use tether_proto::frame::FLAG_NO_REPLY;
use tether_proto::handshake::features;
use tether_proto::*;

// ---------------------------------------------------------------------------------------------
// Shared literal pieces
// ---------------------------------------------------------------------------------------------

/// Every request below (except HELLO) is sent for this caller.
const CALLER: Caller = Caller {
    uid: 1000,
    gid: 100,
    pid: 4242,
};
const CALLER_BYTES: [u8; 12] = [
    0xe8, 0x03, 0, 0, // uid 1000
    0x64, 0, 0, 0, // gid 100
    0x92, 0x10, 0, 0, // pid 4242
];

/// A regular file's node id, used throughout.
const N: NodeId = NodeId::new(0x1234);

/// A handle, used throughout.
const FH: Option<HandleId> = HandleId::new(7);

fn b(s: &'static [u8]) -> Bytes {
    Bytes::from_static(s)
}

/// The attributes used in every Entry/Attr reply below.
fn attr() -> Attr {
    Attr {
        ino: N,
        size: 5000,
        blocks: 16,
        atime: Timespec {
            sec: 1_700_000_000,
            nsec: 123_456_789,
        },
        mtime: Timespec {
            sec: 1_700_000_001,
            nsec: 500_000_000,
        },
        ctime: Timespec {
            sec: -1,
            nsec: 999_999_999,
        },
        mode: 0o100644,
        nlink: 1,
        uid: 1000,
        gid: 100,
        rdev: 0,
        blksize: 4096,
        seq: 0x0102_0304_0506_0708,
    }
}

/// `attr()` on the wire: 96 bytes (the array length pins it).
const ATTR_BYTES: [u8; 96] = [
    0x34, 0x12, 0, 0, 0, 0, 0, 0, // +0  ino 0x1234
    0x88, 0x13, 0, 0, 0, 0, 0, 0, // +8  size 5000
    0x10, 0, 0, 0, 0, 0, 0, 0, // +16 blocks 16
    0x00, 0xf1, 0x53, 0x65, 0, 0, 0, 0, // +24 atime.sec 1_700_000_000
    0x15, 0xcd, 0x5b, 0x07, // +32 atime.nsec 123_456_789
    0x01, 0xf1, 0x53, 0x65, 0, 0, 0, 0, // +36 mtime.sec 1_700_000_001
    0x00, 0x65, 0xcd, 0x1d, // +44 mtime.nsec 500_000_000
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, // +48 ctime.sec -1 (i64)
    0xff, 0xc9, 0x9a, 0x3b, // +56 ctime.nsec 999_999_999
    0xa4, 0x81, 0, 0, // +60 mode 0o100644
    0x01, 0, 0, 0, // +64 nlink 1
    0xe8, 0x03, 0, 0, // +68 uid 1000
    0x64, 0, 0, 0, // +72 gid 100
    0, 0, 0, 0, 0, 0, 0, 0, // +76 rdev 0
    0x00, 0x10, 0, 0, // +84 blksize 4096
    0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, // +88 seq 0x0102030405060708
];

fn entry() -> Entry {
    Entry {
        node: N,
        generation: 3,
        flags: 0,
        attr: attr(),
    }
}

/// `entry()` on the wire: 116 bytes.
fn entry_bytes() -> Vec<u8> {
    [
        &[0x34, 0x12, 0, 0, 0, 0, 0, 0][..], // node 0x1234
        &[3, 0, 0, 0, 0, 0, 0, 0],           // generation 3
        &[0, 0, 0, 0],                       // flags 0
        &ATTR_BYTES,                         // attr (96 bytes)
    ]
    .concat()
}

/// Every operation with its code, little-endian as in the frame header.
const OPS: [(Op, [u8; 2]); 43] = [
    (Op::Hello, [1, 0]),
    (Op::Auth, [2, 0]),
    (Op::Lookup, [10, 0]),
    (Op::Forget, [11, 0]),
    (Op::Getattr, [12, 0]),
    (Op::Setattr, [13, 0]),
    (Op::Readlink, [14, 0]),
    (Op::Mknod, [15, 0]),
    (Op::Mkdir, [16, 0]),
    (Op::Unlink, [17, 0]),
    (Op::Rmdir, [18, 0]),
    (Op::Symlink, [19, 0]),
    (Op::Rename, [20, 0]),
    (Op::Link, [21, 0]),
    (Op::Open, [22, 0]),
    (Op::Read, [23, 0]),
    (Op::Write, [24, 0]),
    (Op::Statfs, [25, 0]),
    (Op::Release, [26, 0]),
    (Op::Fsync, [27, 0]),
    (Op::Setxattr, [28, 0]),
    (Op::Getxattr, [29, 0]),
    (Op::Listxattr, [30, 0]),
    (Op::Removexattr, [31, 0]),
    (Op::Flush, [32, 0]),
    (Op::Opendir, [33, 0]),
    (Op::Readdir, [34, 0]),
    (Op::Releasedir, [35, 0]),
    (Op::Fsyncdir, [36, 0]),
    (Op::Access, [37, 0]),
    (Op::Create, [38, 0]),
    (Op::Fallocate, [39, 0]),
    (Op::Lseek, [40, 0]),
    (Op::CopyFileRange, [41, 0]),
    (Op::Ping, [42, 0]),
    (Op::Reopen, [43, 0]),
    (Op::Reclaim, [44, 0]),
    (Op::Setlk, [45, 0]),
    (Op::Getlk, [46, 0]),
    (Op::LockRelease, [47, 0]),
    (Op::Spares, [48, 0]),
    (Op::Bind, [49, 0]),
    (Op::Sync, [50, 0]),
];

/// Compares two frames, showing both in hex and the first differing offset on failure.
fn assert_frame(what: &str, got: &[u8], expected: &[u8]) {
    if got != expected {
        let at = got
            .iter()
            .zip(expected)
            .position(|(a, b)| a != b)
            .unwrap_or(got.len().min(expected.len()));
        panic!(
            "{what}: frame differs at byte {at} (got {} bytes, expected {})\n     got: {:02x?}\nexpected: {:02x?}",
            got.len(),
            expected.len(),
            got,
            expected
        );
    }
}

/// Checks that `decode` refuses each prefix of `body` cut at `cuts`.
fn assert_prefixes_fail<T>(
    decode: impl Fn(Bytes) -> Result<T, DecodeError>,
    body: &Bytes,
    cuts: impl Iterator<Item = usize>,
) {
    for cut in cuts {
        assert!(
            decode(body.slice(..cut)).is_err(),
            "prefix of {cut} bytes decoded"
        );
    }
}

/// Parses a whole frame's header and returns it with the body.
fn split(frame: &[u8]) -> (FrameHeader, Bytes) {
    let h: [u8; FRAME_HEADER_LEN] = frame[..FRAME_HEADER_LEN].try_into().unwrap();
    let header = FrameHeader::decode(&h, MAX_FRAME_LEN).expect("header decodes");
    assert_eq!(header.body_len, frame.len() - FRAME_HEADER_LEN, "body_len");
    (header, Bytes::copy_from_slice(&frame[FRAME_HEADER_LEN..]))
}

// ---------------------------------------------------------------------------------------------
// Requests
// ---------------------------------------------------------------------------------------------

struct ReqCase {
    name: &'static str,
    id: u64,
    caller: Caller,
    req: Request,
    expected: Vec<u8>,
}

fn request_cases() -> Vec<ReqCase> {
    vec![
        ReqCase {
            name: "hello",
            id: 0,
            caller: Caller::default(),
            req: Request::Hello(Hello {
                min_version: 1,
                max_version: 1,
                features: features::PUSH_INVALIDATE | features::IO_BY_NODE,
                max_frame: MAX_FRAME_LEN as u32,
                owner_uid: 1000,
                owner_gid: 100,
                client_nonce: [7; 32],
                client_name: b"guest".to_vec(),
            }),
            expected: [
                &[0x57, 0, 0, 0][..],      // len: 87 bytes after this field
                &[1],                      // kind: request
                &[0],                      // flags: none
                &[1, 0],                   // op: 1 hello
                &[0, 0, 0, 0, 0, 0, 0, 0], // id 0
                &[0, 0, 0, 0],             // caller uid 0
                &[0, 0, 0, 0],             // caller gid 0
                &[0, 0, 0, 0],             // caller pid 0
                &[1, 0],                   // min_version 1
                &[1, 0],                   // max_version 1
                &[3, 0, 0, 0, 0, 0, 0, 0], // features: PUSH_INVALIDATE | IO_BY_NODE
                &[0x00, 0x10, 0x10, 0x00], // max_frame 0x101000 (1 MiB + 4 KiB)
                &[0xe8, 0x03, 0, 0],       // owner_uid 1000
                &[100, 0, 0, 0],           // owner_gid 100
                &[7; 32],                  // client_nonce (32 bytes)
                &[5, 0],                   // client_name length 5
                b"guest",                  // client_name
            ]
            .concat(),
        },
        ReqCase {
            name: "auth",
            id: 1,
            caller: Caller::default(),
            req: Request::Auth { proof: [9; 32] },
            expected: [
                &[0x38, 0, 0, 0][..],      // len: 56
                &[1],                      // kind: request
                &[0],                      // flags: none
                &[2, 0],                   // op: 2 auth
                &[1, 0, 0, 0, 0, 0, 0, 0], // id 1
                &[0; 12],                  // caller: zero before authentication
                &[9; 32],                  // proof (32 bytes)
            ]
            .concat(),
        },
        ReqCase {
            name: "lookup",
            id: 42,
            caller: CALLER,
            req: Request::Lookup {
                parent: ROOT_NODE,
                name: b(b"hello.txt"),
            },
            expected: [
                &[0x2b, 0, 0, 0][..],         // len: 43
                &[1],                         // kind: request
                &[0],                         // flags
                &[10, 0],                     // op: 10 lookup
                &[0x2a, 0, 0, 0, 0, 0, 0, 0], // id 42
                &CALLER_BYTES,                // caller: uid 1000, gid 100, pid 4242
                &[1, 0, 0, 0, 0, 0, 0, 0],    // parent: ROOT_NODE
                &[9, 0],                      // name length 9
                b"hello.txt",                 // name
            ]
            .concat(),
        },
        ReqCase {
            name: "forget",
            id: 43,
            caller: CALLER,
            req: Request::Forget {
                nodes: vec![(N, 1), (NodeId::new(0x8000_0000_0000_0001), 2)],
            },
            expected: [
                &[0x3c, 0, 0, 0][..],            // len: 60
                &[1],                            // kind: request
                &[1],                            // flags: NO_REPLY
                &[11, 0],                        // op: 11 forget
                &[0x2b, 0, 0, 0, 0, 0, 0, 0],    // id 43
                &CALLER_BYTES,                   // caller
                &[2, 0, 0, 0],                   // count: 2 items
                &[0x34, 0x12, 0, 0, 0, 0, 0, 0], // [0].node 0x1234
                &[1, 0, 0, 0, 0, 0, 0, 0],       // [0].nlookup 1
                &[0x01, 0, 0, 0, 0, 0, 0, 0x80], // [1].node 0x8000000000000001 (synthetic)
                &[2, 0, 0, 0, 0, 0, 0, 0],       // [1].nlookup 2
            ]
            .concat(),
        },
        ReqCase {
            name: "forget (empty)",
            id: 44,
            caller: CALLER,
            req: Request::Forget { nodes: vec![] },
            expected: [
                &[0x1c, 0, 0, 0][..],         // len: 28
                &[1],                         // kind: request
                &[1],                         // flags: NO_REPLY
                &[11, 0],                     // op: 11 forget
                &[0x2c, 0, 0, 0, 0, 0, 0, 0], // id 44
                &CALLER_BYTES,                // caller
                &[0, 0, 0, 0],                // count: 0 items
            ]
            .concat(),
        },
        ReqCase {
            name: "getattr",
            id: 42,
            caller: CALLER,
            req: Request::Getattr { node: N, fh: FH },
            expected: [
                &[0x28, 0, 0, 0][..],            // len: 40
                &[1],                            // kind: request
                &[0],                            // flags
                &[12, 0],                        // op: 12 getattr
                &[0x2a, 0, 0, 0, 0, 0, 0, 0],    // id 42
                &CALLER_BYTES,                   // caller
                &[0x34, 0x12, 0, 0, 0, 0, 0, 0], // node 0x1234
                &[7, 0, 0, 0, 0, 0, 0, 0],       // fh 7
            ]
            .concat(),
        },
        ReqCase {
            name: "setattr (omit, at)",
            id: 42,
            caller: CALLER,
            req: Request::Setattr {
                node: N,
                fh: FH,
                set: SetAttr {
                    valid: setattr_valid::MODE | setattr_valid::SIZE,
                    mode: 0o600,
                    uid: 0,
                    gid: 0,
                    size: 0x1_0000_0000,
                    atime: SetTime::Omit,
                    mtime: SetTime::At(Timespec {
                        sec: 1_700_000_000,
                        nsec: 123_456_789,
                    }),
                },
            },
            expected: [
                &[0x5a, 0, 0, 0][..],                  // len: 90
                &[1],                                  // kind: request
                &[0],                                  // flags
                &[13, 0],                              // op: 13 setattr
                &[0x2a, 0, 0, 0, 0, 0, 0, 0],          // id 42
                &CALLER_BYTES,                         // caller
                &[0x34, 0x12, 0, 0, 0, 0, 0, 0],       // node 0x1234
                &[7, 0, 0, 0, 0, 0, 0, 0],             // fh 7
                &[9, 0, 0, 0],                         // valid: MODE | SIZE
                &[0x80, 0x01, 0, 0],                   // mode 0o600
                &[0, 0, 0, 0],                         // uid 0 (not valid)
                &[0, 0, 0, 0],                         // gid 0 (not valid)
                &[0, 0, 0, 0, 1, 0, 0, 0],             // size 4 GiB
                &[0],                                  // atime tag: 0 omit
                &[0, 0, 0, 0, 0, 0, 0, 0],             // atime.sec (ignored, 0)
                &[0, 0, 0, 0],                         // atime.nsec (ignored, 0)
                &[2],                                  // mtime tag: 2 at
                &[0x00, 0xf1, 0x53, 0x65, 0, 0, 0, 0], // mtime.sec 1_700_000_000
                &[0x15, 0xcd, 0x5b, 0x07],             // mtime.nsec 123_456_789
            ]
            .concat(),
        },
        ReqCase {
            name: "setattr (now, now)",
            id: 42,
            caller: CALLER,
            req: Request::Setattr {
                node: N,
                fh: None,
                set: SetAttr {
                    valid: setattr_valid::UID | setattr_valid::GID,
                    mode: 0,
                    uid: 1001,
                    gid: 1001,
                    size: 0,
                    atime: SetTime::Now,
                    mtime: SetTime::Now,
                },
            },
            expected: [
                &[0x5a, 0, 0, 0][..],            // len: 90
                &[1],                            // kind: request
                &[0],                            // flags
                &[13, 0],                        // op: 13 setattr
                &[0x2a, 0, 0, 0, 0, 0, 0, 0],    // id 42
                &CALLER_BYTES,                   // caller
                &[0x34, 0x12, 0, 0, 0, 0, 0, 0], // node 0x1234
                &[0, 0, 0, 0, 0, 0, 0, 0],       // fh 0: none
                &[6, 0, 0, 0],                   // valid: UID | GID
                &[0, 0, 0, 0],                   // mode 0 (not valid)
                &[0xe9, 0x03, 0, 0],             // uid 1001
                &[0xe9, 0x03, 0, 0],             // gid 1001
                &[0, 0, 0, 0, 0, 0, 0, 0],       // size 0 (not valid)
                &[1],                            // atime tag: 1 now
                &[0, 0, 0, 0, 0, 0, 0, 0],       // atime.sec (ignored, 0)
                &[0, 0, 0, 0],                   // atime.nsec (ignored, 0)
                &[1],                            // mtime tag: 1 now
                &[0, 0, 0, 0, 0, 0, 0, 0],       // mtime.sec (ignored, 0)
                &[0, 0, 0, 0],                   // mtime.nsec (ignored, 0)
            ]
            .concat(),
        },
        ReqCase {
            name: "readlink",
            id: 42,
            caller: CALLER,
            req: Request::Readlink { node: N },
            expected: [
                &[0x20, 0, 0, 0][..],            // len: 32
                &[1],                            // kind: request
                &[0],                            // flags
                &[14, 0],                        // op: 14 readlink
                &[0x2a, 0, 0, 0, 0, 0, 0, 0],    // id 42
                &CALLER_BYTES,                   // caller
                &[0x34, 0x12, 0, 0, 0, 0, 0, 0], // node 0x1234
            ]
            .concat(),
        },
        ReqCase {
            name: "mknod",
            id: 42,
            caller: CALLER,
            req: Request::Mknod {
                parent: ROOT_NODE,
                name: b(b"fifo"),
                mode: 0o010644,
                rdev: 0x803,
                umask: 0o022,
            },
            expected: [
                &[0x36, 0, 0, 0][..],            // len: 54
                &[1],                            // kind: request
                &[0],                            // flags
                &[15, 0],                        // op: 15 mknod
                &[0x2a, 0, 0, 0, 0, 0, 0, 0],    // id 42
                &CALLER_BYTES,                   // caller
                &[1, 0, 0, 0, 0, 0, 0, 0],       // parent: ROOT_NODE
                &[4, 0],                         // name length 4
                b"fifo",                         // name
                &[0xa4, 0x11, 0, 0],             // mode 0o010644 (S_IFIFO | 0644)
                &[0x03, 0x08, 0, 0, 0, 0, 0, 0], // rdev 0x803
                &[0x12, 0, 0, 0],                // umask 0o022
            ]
            .concat(),
        },
        ReqCase {
            name: "mkdir",
            id: 42,
            caller: CALLER,
            req: Request::Mkdir {
                parent: ROOT_NODE,
                name: b(b"dir"),
                mode: 0o755,
                umask: 0o022,
            },
            expected: [
                &[0x2d, 0, 0, 0][..],         // len: 45
                &[1],                         // kind: request
                &[0],                         // flags
                &[16, 0],                     // op: 16 mkdir
                &[0x2a, 0, 0, 0, 0, 0, 0, 0], // id 42
                &CALLER_BYTES,                // caller
                &[1, 0, 0, 0, 0, 0, 0, 0],    // parent: ROOT_NODE
                &[3, 0],                      // name length 3
                b"dir",                       // name
                &[0xed, 0x01, 0, 0],          // mode 0o755
                &[0x12, 0, 0, 0],             // umask 0o022
            ]
            .concat(),
        },
        ReqCase {
            name: "unlink",
            id: 42,
            caller: CALLER,
            req: Request::Unlink {
                parent: N,
                name: b(b"a"),
            },
            expected: [
                &[0x23, 0, 0, 0][..],            // len: 35
                &[1],                            // kind: request
                &[0],                            // flags
                &[17, 0],                        // op: 17 unlink
                &[0x2a, 0, 0, 0, 0, 0, 0, 0],    // id 42
                &CALLER_BYTES,                   // caller
                &[0x34, 0x12, 0, 0, 0, 0, 0, 0], // parent 0x1234
                &[1, 0],                         // name length 1
                b"a",                            // name
            ]
            .concat(),
        },
        ReqCase {
            name: "rmdir",
            id: 42,
            caller: CALLER,
            req: Request::Rmdir {
                parent: ROOT_NODE,
                name: b(b"dir"),
            },
            expected: [
                &[0x25, 0, 0, 0][..],         // len: 37
                &[1],                         // kind: request
                &[0],                         // flags
                &[18, 0],                     // op: 18 rmdir
                &[0x2a, 0, 0, 0, 0, 0, 0, 0], // id 42
                &CALLER_BYTES,                // caller
                &[1, 0, 0, 0, 0, 0, 0, 0],    // parent: ROOT_NODE
                &[3, 0],                      // name length 3
                b"dir",                       // name
            ]
            .concat(),
        },
        ReqCase {
            name: "symlink",
            id: 42,
            caller: CALLER,
            req: Request::Symlink {
                parent: ROOT_NODE,
                name: b(b"ln"),
                target: b(b"../t"),
            },
            expected: [
                &[0x2c, 0, 0, 0][..],         // len: 44
                &[1],                         // kind: request
                &[0],                         // flags
                &[19, 0],                     // op: 19 symlink
                &[0x2a, 0, 0, 0, 0, 0, 0, 0], // id 42
                &CALLER_BYTES,                // caller
                &[1, 0, 0, 0, 0, 0, 0, 0],    // parent: ROOT_NODE
                &[2, 0],                      // name length 2
                b"ln",                        // name
                &[4, 0, 0, 0],                // target length 4 (blob: u32)
                b"../t",                      // target
            ]
            .concat(),
        },
        ReqCase {
            name: "rename",
            id: 42,
            caller: CALLER,
            req: Request::Rename {
                parent: ROOT_NODE,
                name: b(b"a"),
                new_parent: N,
                new_name: b(b"b"),
                flags: 1,
            },
            expected: [
                &[0x32, 0, 0, 0][..],            // len: 50
                &[1],                            // kind: request
                &[0],                            // flags
                &[20, 0],                        // op: 20 rename
                &[0x2a, 0, 0, 0, 0, 0, 0, 0],    // id 42
                &CALLER_BYTES,                   // caller
                &[1, 0, 0, 0, 0, 0, 0, 0],       // parent: ROOT_NODE
                &[1, 0],                         // name length 1
                b"a",                            // name
                &[0x34, 0x12, 0, 0, 0, 0, 0, 0], // new_parent 0x1234
                &[1, 0],                         // new_name length 1
                b"b",                            // new_name
                &[1, 0, 0, 0],                   // flags: RENAME_NOREPLACE
            ]
            .concat(),
        },
        ReqCase {
            name: "link",
            id: 42,
            caller: CALLER,
            req: Request::Link {
                node: N,
                new_parent: ROOT_NODE,
                new_name: b(b"hard"),
            },
            expected: [
                &[0x2e, 0, 0, 0][..],            // len: 46
                &[1],                            // kind: request
                &[0],                            // flags
                &[21, 0],                        // op: 21 link
                &[0x2a, 0, 0, 0, 0, 0, 0, 0],    // id 42
                &CALLER_BYTES,                   // caller
                &[0x34, 0x12, 0, 0, 0, 0, 0, 0], // node 0x1234
                &[1, 0, 0, 0, 0, 0, 0, 0],       // new_parent: ROOT_NODE
                &[4, 0],                         // new_name length 4
                b"hard",                         // new_name
            ]
            .concat(),
        },
        ReqCase {
            name: "open",
            id: 42,
            caller: CALLER,
            req: Request::Open {
                node: N,
                flags: 0x8002,
            },
            expected: [
                &[0x24, 0, 0, 0][..],            // len: 36
                &[1],                            // kind: request
                &[0],                            // flags
                &[22, 0],                        // op: 22 open
                &[0x2a, 0, 0, 0, 0, 0, 0, 0],    // id 42
                &CALLER_BYTES,                   // caller
                &[0x34, 0x12, 0, 0, 0, 0, 0, 0], // node 0x1234
                &[0x02, 0x80, 0, 0],             // flags: O_RDWR | O_LARGEFILE
            ]
            .concat(),
        },
        ReqCase {
            name: "read",
            id: 42,
            caller: CALLER,
            req: Request::Read {
                node: N,
                fh: FH,
                offset: 0x10000,
                size: 4096,
            },
            expected: [
                &[0x34, 0, 0, 0][..],            // len: 52
                &[1],                            // kind: request
                &[0],                            // flags
                &[23, 0],                        // op: 23 read
                &[0x2a, 0, 0, 0, 0, 0, 0, 0],    // id 42
                &CALLER_BYTES,                   // caller
                &[0x34, 0x12, 0, 0, 0, 0, 0, 0], // node 0x1234
                &[7, 0, 0, 0, 0, 0, 0, 0],       // fh 7
                &[0, 0, 1, 0, 0, 0, 0, 0],       // offset 0x10000
                &[0, 0x10, 0, 0],                // size 4096
            ]
            .concat(),
        },
        ReqCase {
            name: "write",
            id: 42,
            caller: CALLER,
            req: Request::Write {
                node: N,
                fh: FH,
                offset: 10,
                data: b(b"hello"),
            },
            expected: [
                &[0x35, 0, 0, 0][..],            // len: 53
                &[1],                            // kind: request
                &[0],                            // flags
                &[24, 0],                        // op: 24 write
                &[0x2a, 0, 0, 0, 0, 0, 0, 0],    // id 42
                &CALLER_BYTES,                   // caller
                &[0x34, 0x12, 0, 0, 0, 0, 0, 0], // node 0x1234
                &[7, 0, 0, 0, 0, 0, 0, 0],       // fh 7
                &[10, 0, 0, 0, 0, 0, 0, 0],      // offset 10
                b"hello",                        // data: the rest of the frame, no length
            ]
            .concat(),
        },
        ReqCase {
            name: "write (empty)",
            id: 42,
            caller: CALLER,
            req: Request::Write {
                node: N,
                fh: FH,
                offset: 0,
                data: Bytes::new(),
            },
            expected: [
                &[0x30, 0, 0, 0][..],            // len: 48
                &[1],                            // kind: request
                &[0],                            // flags
                &[24, 0],                        // op: 24 write
                &[0x2a, 0, 0, 0, 0, 0, 0, 0],    // id 42
                &CALLER_BYTES,                   // caller
                &[0x34, 0x12, 0, 0, 0, 0, 0, 0], // node 0x1234
                &[7, 0, 0, 0, 0, 0, 0, 0],       // fh 7
                &[0, 0, 0, 0, 0, 0, 0, 0],       // offset 0 (no data follows)
            ]
            .concat(),
        },
        ReqCase {
            name: "statfs",
            id: 42,
            caller: CALLER,
            req: Request::Statfs { node: ROOT_NODE },
            expected: [
                &[0x20, 0, 0, 0][..],         // len: 32
                &[1],                         // kind: request
                &[0],                         // flags
                &[25, 0],                     // op: 25 statfs
                &[0x2a, 0, 0, 0, 0, 0, 0, 0], // id 42
                &CALLER_BYTES,                // caller
                &[1, 0, 0, 0, 0, 0, 0, 0],    // node: ROOT_NODE
            ]
            .concat(),
        },
        ReqCase {
            name: "release",
            id: 42,
            caller: CALLER,
            req: Request::Release { node: N, fh: FH },
            expected: [
                &[0x28, 0, 0, 0][..],            // len: 40
                &[1],                            // kind: request
                &[0],                            // flags
                &[26, 0],                        // op: 26 release
                &[0x2a, 0, 0, 0, 0, 0, 0, 0],    // id 42
                &CALLER_BYTES,                   // caller
                &[0x34, 0x12, 0, 0, 0, 0, 0, 0], // node 0x1234
                &[7, 0, 0, 0, 0, 0, 0, 0],       // fh 7
            ]
            .concat(),
        },
        ReqCase {
            name: "fsync",
            id: 42,
            caller: CALLER,
            req: Request::Fsync {
                node: N,
                fh: FH,
                datasync: true,
            },
            expected: [
                &[0x29, 0, 0, 0][..],            // len: 41
                &[1],                            // kind: request
                &[0],                            // flags
                &[27, 0],                        // op: 27 fsync
                &[0x2a, 0, 0, 0, 0, 0, 0, 0],    // id 42
                &CALLER_BYTES,                   // caller
                &[0x34, 0x12, 0, 0, 0, 0, 0, 0], // node 0x1234
                &[7, 0, 0, 0, 0, 0, 0, 0],       // fh 7
                &[1],                            // datasync: true
            ]
            .concat(),
        },
        ReqCase {
            name: "setxattr",
            id: 42,
            caller: CALLER,
            req: Request::Setxattr {
                node: N,
                name: b(b"user.k"),
                value: b(b"v1"),
                flags: 1,
            },
            expected: [
                &[0x32, 0, 0, 0][..],            // len: 50
                &[1],                            // kind: request
                &[0],                            // flags
                &[28, 0],                        // op: 28 setxattr
                &[0x2a, 0, 0, 0, 0, 0, 0, 0],    // id 42
                &CALLER_BYTES,                   // caller
                &[0x34, 0x12, 0, 0, 0, 0, 0, 0], // node 0x1234
                &[6, 0],                         // name length 6
                b"user.k",                       // name
                &[1, 0, 0, 0],                   // flags: XATTR_CREATE (before the value)
                &[2, 0, 0, 0],                   // value length 2 (blob: u32)
                b"v1",                           // value
            ]
            .concat(),
        },
        ReqCase {
            name: "getxattr",
            id: 42,
            caller: CALLER,
            req: Request::Getxattr {
                node: N,
                name: b(b"user.k"),
                size: 0,
            },
            expected: [
                &[0x2c, 0, 0, 0][..],            // len: 44
                &[1],                            // kind: request
                &[0],                            // flags
                &[29, 0],                        // op: 29 getxattr
                &[0x2a, 0, 0, 0, 0, 0, 0, 0],    // id 42
                &CALLER_BYTES,                   // caller
                &[0x34, 0x12, 0, 0, 0, 0, 0, 0], // node 0x1234
                &[6, 0],                         // name length 6
                b"user.k",                       // name
                &[0, 0, 0, 0],                   // size 0: asking for the size
            ]
            .concat(),
        },
        ReqCase {
            name: "listxattr",
            id: 42,
            caller: CALLER,
            req: Request::Listxattr { node: N, size: 256 },
            expected: [
                &[0x24, 0, 0, 0][..],            // len: 36
                &[1],                            // kind: request
                &[0],                            // flags
                &[30, 0],                        // op: 30 listxattr
                &[0x2a, 0, 0, 0, 0, 0, 0, 0],    // id 42
                &CALLER_BYTES,                   // caller
                &[0x34, 0x12, 0, 0, 0, 0, 0, 0], // node 0x1234
                &[0, 1, 0, 0],                   // size 256
            ]
            .concat(),
        },
        ReqCase {
            name: "removexattr",
            id: 42,
            caller: CALLER,
            req: Request::Removexattr {
                node: N,
                name: b(b"user.k"),
            },
            expected: [
                &[0x28, 0, 0, 0][..],            // len: 40
                &[1],                            // kind: request
                &[0],                            // flags
                &[31, 0],                        // op: 31 removexattr
                &[0x2a, 0, 0, 0, 0, 0, 0, 0],    // id 42
                &CALLER_BYTES,                   // caller
                &[0x34, 0x12, 0, 0, 0, 0, 0, 0], // node 0x1234
                &[6, 0],                         // name length 6
                b"user.k",                       // name
            ]
            .concat(),
        },
        ReqCase {
            name: "flush",
            id: 42,
            caller: CALLER,
            req: Request::Flush {
                node: N,
                fh: FH,
                lock_owner: 0xdead_beef_cafe_f00d,
            },
            expected: [
                &[0x30, 0, 0, 0][..],                              // len: 48
                &[1],                                              // kind: request
                &[0],                                              // flags
                &[32, 0],                                          // op: 32 flush
                &[0x2a, 0, 0, 0, 0, 0, 0, 0],                      // id 42
                &CALLER_BYTES,                                     // caller
                &[0x34, 0x12, 0, 0, 0, 0, 0, 0],                   // node 0x1234
                &[7, 0, 0, 0, 0, 0, 0, 0],                         // fh 7
                &[0x0d, 0xf0, 0xfe, 0xca, 0xef, 0xbe, 0xad, 0xde], // lock_owner
            ]
            .concat(),
        },
        ReqCase {
            name: "opendir",
            id: 42,
            caller: CALLER,
            req: Request::Opendir {
                node: ROOT_NODE,
                flags: 0x10000,
            },
            expected: [
                &[0x24, 0, 0, 0][..],         // len: 36
                &[1],                         // kind: request
                &[0],                         // flags
                &[33, 0],                     // op: 33 opendir
                &[0x2a, 0, 0, 0, 0, 0, 0, 0], // id 42
                &CALLER_BYTES,                // caller
                &[1, 0, 0, 0, 0, 0, 0, 0],    // node: ROOT_NODE
                &[0, 0, 1, 0],                // flags: O_DIRECTORY
            ]
            .concat(),
        },
        ReqCase {
            name: "readdir",
            id: 42,
            caller: CALLER,
            req: Request::Readdir {
                node: ROOT_NODE,
                fh: HandleId::new(8),
                offset: 2,
                size: 4096,
                plus: false,
            },
            expected: [
                &[0x35, 0, 0, 0][..],         // len: 53
                &[1],                         // kind: request
                &[0],                         // flags
                &[34, 0],                     // op: 34 readdir
                &[0x2a, 0, 0, 0, 0, 0, 0, 0], // id 42
                &CALLER_BYTES,                // caller
                &[1, 0, 0, 0, 0, 0, 0, 0],    // node: ROOT_NODE
                &[8, 0, 0, 0, 0, 0, 0, 0],    // fh 8
                &[2, 0, 0, 0, 0, 0, 0, 0],    // offset (cookie) 2
                &[0, 0x10, 0, 0],             // size 4096
                &[0],                         // plus: false
            ]
            .concat(),
        },
        ReqCase {
            name: "readdir (plus)",
            id: 42,
            caller: CALLER,
            req: Request::Readdir {
                node: ROOT_NODE,
                fh: HandleId::new(8),
                offset: 0,
                size: 4096,
                plus: true,
            },
            expected: [
                &[0x35, 0, 0, 0][..],         // len: 53
                &[1],                         // kind: request
                &[0],                         // flags
                &[34, 0],                     // op: 34 readdir
                &[0x2a, 0, 0, 0, 0, 0, 0, 0], // id 42
                &CALLER_BYTES,                // caller
                &[1, 0, 0, 0, 0, 0, 0, 0],    // node: ROOT_NODE
                &[8, 0, 0, 0, 0, 0, 0, 0],    // fh 8
                &[0, 0, 0, 0, 0, 0, 0, 0],    // offset 0: from the start
                &[0, 0x10, 0, 0],             // size 4096
                &[1],                         // plus: true
            ]
            .concat(),
        },
        ReqCase {
            name: "releasedir",
            id: 42,
            caller: CALLER,
            req: Request::Releasedir {
                node: ROOT_NODE,
                fh: HandleId::new(8),
            },
            expected: [
                &[0x28, 0, 0, 0][..],         // len: 40
                &[1],                         // kind: request
                &[0],                         // flags
                &[35, 0],                     // op: 35 releasedir
                &[0x2a, 0, 0, 0, 0, 0, 0, 0], // id 42
                &CALLER_BYTES,                // caller
                &[1, 0, 0, 0, 0, 0, 0, 0],    // node: ROOT_NODE
                &[8, 0, 0, 0, 0, 0, 0, 0],    // fh 8
            ]
            .concat(),
        },
        ReqCase {
            name: "fsyncdir",
            id: 42,
            caller: CALLER,
            req: Request::Fsyncdir {
                node: ROOT_NODE,
                fh: HandleId::new(8),
                datasync: false,
            },
            expected: [
                &[0x29, 0, 0, 0][..],         // len: 41
                &[1],                         // kind: request
                &[0],                         // flags
                &[36, 0],                     // op: 36 fsyncdir
                &[0x2a, 0, 0, 0, 0, 0, 0, 0], // id 42
                &CALLER_BYTES,                // caller
                &[1, 0, 0, 0, 0, 0, 0, 0],    // node: ROOT_NODE
                &[8, 0, 0, 0, 0, 0, 0, 0],    // fh 8
                &[0],                         // datasync: false
            ]
            .concat(),
        },
        ReqCase {
            name: "access",
            id: 42,
            caller: CALLER,
            req: Request::Access { node: N, mask: 4 },
            expected: [
                &[0x24, 0, 0, 0][..],            // len: 36
                &[1],                            // kind: request
                &[0],                            // flags
                &[37, 0],                        // op: 37 access
                &[0x2a, 0, 0, 0, 0, 0, 0, 0],    // id 42
                &CALLER_BYTES,                   // caller
                &[0x34, 0x12, 0, 0, 0, 0, 0, 0], // node 0x1234
                &[4, 0, 0, 0],                   // mask: R_OK
            ]
            .concat(),
        },
        ReqCase {
            name: "create",
            id: 42,
            caller: CALLER,
            req: Request::Create {
                parent: ROOT_NODE,
                name: b(b"new"),
                mode: 0o100644,
                umask: 0o022,
                flags: 0x241,
            },
            expected: [
                &[0x31, 0, 0, 0][..],         // len: 49
                &[1],                         // kind: request
                &[0],                         // flags
                &[38, 0],                     // op: 38 create
                &[0x2a, 0, 0, 0, 0, 0, 0, 0], // id 42
                &CALLER_BYTES,                // caller
                &[1, 0, 0, 0, 0, 0, 0, 0],    // parent: ROOT_NODE
                &[3, 0],                      // name length 3
                b"new",                       // name
                &[0xa4, 0x81, 0, 0],          // mode 0o100644
                &[0x12, 0, 0, 0],             // umask 0o022
                &[0x41, 0x02, 0, 0],          // flags: O_WRONLY | O_CREAT | O_TRUNC
            ]
            .concat(),
        },
        ReqCase {
            name: "fallocate",
            id: 42,
            caller: CALLER,
            req: Request::Fallocate {
                node: N,
                fh: FH,
                offset: 0,
                length: 1 << 20,
                mode: 1,
            },
            expected: [
                &[0x3c, 0, 0, 0][..],            // len: 60
                &[1],                            // kind: request
                &[0],                            // flags
                &[39, 0],                        // op: 39 fallocate
                &[0x2a, 0, 0, 0, 0, 0, 0, 0],    // id 42
                &CALLER_BYTES,                   // caller
                &[0x34, 0x12, 0, 0, 0, 0, 0, 0], // node 0x1234
                &[7, 0, 0, 0, 0, 0, 0, 0],       // fh 7
                &[0, 0, 0, 0, 0, 0, 0, 0],       // offset 0
                &[0, 0, 0x10, 0, 0, 0, 0, 0],    // length 1 MiB
                &[1, 0, 0, 0],                   // mode: FALLOC_FL_KEEP_SIZE
            ]
            .concat(),
        },
        ReqCase {
            name: "lseek",
            id: 42,
            caller: CALLER,
            req: Request::Lseek {
                node: N,
                fh: FH,
                offset: -2,
                whence: 2,
            },
            expected: [
                &[0x34, 0, 0, 0][..],                              // len: 52
                &[1],                                              // kind: request
                &[0],                                              // flags
                &[40, 0],                                          // op: 40 lseek
                &[0x2a, 0, 0, 0, 0, 0, 0, 0],                      // id 42
                &CALLER_BYTES,                                     // caller
                &[0x34, 0x12, 0, 0, 0, 0, 0, 0],                   // node 0x1234
                &[7, 0, 0, 0, 0, 0, 0, 0],                         // fh 7
                &[0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff], // offset -2 (i64)
                &[2, 0, 0, 0],                                     // whence: SEEK_END
            ]
            .concat(),
        },
        ReqCase {
            name: "copy_file_range",
            id: 0x1122_3344_5566_7788,
            caller: CALLER,
            req: Request::CopyFileRange {
                node_in: N,
                fh_in: FH,
                offset_in: 0,
                node_out: NodeId::new(0x5678),
                fh_out: HandleId::new(9),
                offset_out: 4096,
                len: 0x10000,
                flags: 0,
            },
            expected: [
                &[0x54, 0, 0, 0][..],                              // len: 84
                &[1],                                              // kind: request
                &[0],                                              // flags
                &[41, 0],                                          // op: 41 copy_file_range
                &[0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11], // id 0x1122334455667788
                &CALLER_BYTES,                                     // caller
                &[0x34, 0x12, 0, 0, 0, 0, 0, 0],                   // node_in 0x1234
                &[7, 0, 0, 0, 0, 0, 0, 0],                         // fh_in 7
                &[0, 0, 0, 0, 0, 0, 0, 0],                         // offset_in 0
                &[0x78, 0x56, 0, 0, 0, 0, 0, 0],                   // node_out 0x5678
                &[9, 0, 0, 0, 0, 0, 0, 0],                         // fh_out 9
                &[0, 0x10, 0, 0, 0, 0, 0, 0],                      // offset_out 4096
                &[0, 0, 1, 0, 0, 0, 0, 0],                         // len 0x10000
                &[0, 0, 0, 0],                                     // flags 0
            ]
            .concat(),
        },
        ReqCase {
            name: "ping",
            id: 42,
            caller: CALLER,
            req: Request::Ping,
            expected: [
                &[0x18, 0, 0, 0][..],         // len: 24
                &[1],                         // kind: request
                &[0],                         // flags
                &[42, 0],                     // op: 42 ping
                &[0x2a, 0, 0, 0, 0, 0, 0, 0], // id 42
                &CALLER_BYTES,                // caller, and nothing else
            ]
            .concat(),
        },
        ReqCase {
            name: "sync",
            id: 42,
            caller: CALLER,
            req: Request::Sync,
            expected: [
                &[0x18, 0, 0, 0][..],         // len: 24
                &[1],                         // kind: request
                &[0],                         // flags
                &[50, 0],                     // op: 50 sync
                &[0x2a, 0, 0, 0, 0, 0, 0, 0], // id 42
                &CALLER_BYTES,                // caller, and nothing else
            ]
            .concat(),
        },
        ReqCase {
            name: "reopen",
            id: 42,
            caller: CALLER,
            req: Request::Reopen {
                node: N,
                fh: FH,
                flags: 2,
                dir: false,
            },
            expected: [
                &[0x2d, 0, 0, 0][..],            // len: 45
                &[1],                            // kind: request
                &[0],                            // flags
                &[43, 0],                        // op: 43 reopen
                &[0x2a, 0, 0, 0, 0, 0, 0, 0],    // id 42
                &CALLER_BYTES,                   // caller
                &[0x34, 0x12, 0, 0, 0, 0, 0, 0], // node 0x1234
                &[7, 0, 0, 0, 0, 0, 0, 0],       // fh 7, the number the client uses
                &[2, 0, 0, 0],                   // flags: O_RDWR
                &[0],                            // dir: false
            ]
            .concat(),
        },
        ReqCase {
            name: "reclaim",
            id: 42,
            caller: CALLER,
            req: Request::Reclaim {
                parent: ROOT_NODE,
                name: b(b"src"),
                lookups: 3,
            },
            expected: [
                &[0x2d, 0, 0, 0][..],         // len: 45
                &[1],                         // kind: request
                &[0],                         // flags
                &[44, 0],                     // op: 44 reclaim
                &[0x2a, 0, 0, 0, 0, 0, 0, 0], // id 42
                &CALLER_BYTES,                // caller
                &[1, 0, 0, 0, 0, 0, 0, 0],    // parent: ROOT_NODE
                &[3, 0],                      // name length 3
                b"src",                       // name
                &[3, 0, 0, 0, 0, 0, 0, 0],    // lookups the kernel holds
            ]
            .concat(),
        },
        ReqCase {
            name: "setlk",
            id: 42,
            caller: CALLER,
            req: Request::Setlk {
                node: N,
                lock: LockSpec {
                    owner: 0x0102_0304_0506_0708,
                    flock: false,
                    typ: lock_type::WRITE,
                    start: 100,
                    end: u64::MAX,
                },
                generation: 3,
            },
            expected: [
                &[0x42, 0, 0, 0][..],            // len: 66
                &[1],                            // kind: request
                &[0],                            // flags
                &[45, 0],                        // op: 45 setlk
                &[0x2a, 0, 0, 0, 0, 0, 0, 0],    // id 42
                &CALLER_BYTES,                   // caller
                &[0x34, 0x12, 0, 0, 0, 0, 0, 0], // node 0x1234
                &[8, 7, 6, 5, 4, 3, 2, 1],       // owner
                &[0],                            // flock: false (a POSIX or OFD lock)
                &[2],                            // type: write
                &[100, 0, 0, 0, 0, 0, 0, 0],     // start 100
                &[0xff; 8],                      // end: to the end of the file
                &[3, 0, 0, 0, 0, 0, 0, 0],       // generation 3
            ]
            .concat(),
        },
        ReqCase {
            name: "getlk",
            id: 42,
            caller: CALLER,
            req: Request::Getlk {
                node: N,
                lock: LockSpec {
                    owner: 9,
                    flock: true,
                    typ: lock_type::READ,
                    start: 0,
                    end: 9,
                },
            },
            expected: [
                &[0x3a, 0, 0, 0][..],            // len: 58
                &[1],                            // kind: request
                &[0],                            // flags
                &[46, 0],                        // op: 46 getlk
                &[0x2a, 0, 0, 0, 0, 0, 0, 0],    // id 42
                &CALLER_BYTES,                   // caller
                &[0x34, 0x12, 0, 0, 0, 0, 0, 0], // node 0x1234
                &[9, 0, 0, 0, 0, 0, 0, 0],       // owner
                &[1],                            // flock: true
                &[1],                            // type: read
                &[0, 0, 0, 0, 0, 0, 0, 0],       // start 0
                &[9, 0, 0, 0, 0, 0, 0, 0],       // end 9 (inclusive)
            ]
            .concat(),
        },
        ReqCase {
            name: "lock_release",
            id: 42,
            caller: CALLER,
            req: Request::LockRelease {
                node: N,
                owner: 9,
                generation: 3,
            },
            expected: [
                &[0x30, 0, 0, 0][..],            // len: 48
                &[1],                            // kind: request
                &[0],                            // flags
                &[47, 0],                        // op: 47 lock release
                &[0x2a, 0, 0, 0, 0, 0, 0, 0],    // id 42
                &CALLER_BYTES,                   // caller
                &[0x34, 0x12, 0, 0, 0, 0, 0, 0], // node 0x1234
                &[9, 0, 0, 0, 0, 0, 0, 0],       // owner
                &[3, 0, 0, 0, 0, 0, 0, 0],       // generation 3
            ]
            .concat(),
        },
        ReqCase {
            name: "spares",
            id: 42,
            caller: CALLER,
            req: Request::Spares {
                parent: N,
                count: 16,
            },
            expected: [
                &[0x24, 0, 0, 0][..],            // len: 36
                &[1],                            // kind: request
                &[0],                            // flags
                &[48, 0],                        // op: 48 spares
                &[0x2a, 0, 0, 0, 0, 0, 0, 0],    // id 42
                &CALLER_BYTES,                   // caller
                &[0x34, 0x12, 0, 0, 0, 0, 0, 0], // parent 0x1234
                &[16, 0, 0, 0],                  // count 16
            ]
            .concat(),
        },
        ReqCase {
            name: "bind",
            id: 42,
            caller: CALLER,
            req: Request::Bind {
                parent: ROOT_NODE,
                name: b(b"new"),
                node: N,
                mode: 0o100644,
                umask: 0o022,
                time: Timespec {
                    sec: 1_700_000_000,
                    nsec: 5,
                },
            },
            expected: [
                &[0x41, 0, 0, 0][..],                  // len: 65
                &[1],                                  // kind: request
                &[0],                                  // flags
                &[49, 0],                              // op: 49 bind
                &[0x2a, 0, 0, 0, 0, 0, 0, 0],          // id 42
                &CALLER_BYTES,                         // caller
                &[1, 0, 0, 0, 0, 0, 0, 0],             // parent: ROOT_NODE
                &[3, 0],                               // name length 3
                b"new",                                // name
                &[0x34, 0x12, 0, 0, 0, 0, 0, 0],       // node 0x1234: the spare
                &[0xa4, 0x81, 0, 0],                   // mode 0o100644
                &[0x12, 0, 0, 0],                      // umask 0o022
                &[0x00, 0xf1, 0x53, 0x65, 0, 0, 0, 0], // time: 1,700,000,000 s
                &[5, 0, 0, 0],                         //   and 5 ns
            ]
            .concat(),
        },
    ]
}

#[test]
fn golden_requests() {
    let cases = request_cases();
    for c in &cases {
        let frame = c.req.to_frame(c.id, c.caller);
        assert_frame(c.name, &frame, &c.expected);
        let (h, body) = split(&c.expected);
        assert_eq!(h.kind, FrameKind::Request, "{}", c.name);
        assert_eq!(h.op, c.req.op() as u16, "{}", c.name);
        assert_eq!(h.id, c.id, "{}", c.name);
        let no_reply = matches!(c.req, Request::Forget { .. });
        assert_eq!(
            h.flags,
            if no_reply { FLAG_NO_REPLY } else { 0 },
            "{}",
            c.name
        );
        assert_eq!(
            Request::decode(h.op, body),
            Ok((c.caller, c.req.clone())),
            "{}",
            c.name
        );
    }
    // Every operation has at least one golden request.
    for (op, _) in OPS {
        assert!(
            cases.iter().any(|c| c.req.op() == op),
            "no golden request for {op:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Replies
// ---------------------------------------------------------------------------------------------

struct ReplyCase {
    name: String,
    op: Op,
    id: u64,
    result: Result<Reply, WireErrno>,
    expected: Vec<u8>,
}

fn reply_cases() -> Vec<ReplyCase> {
    let mut cases = vec![
        ReplyCase {
            name: "hello".into(),
            op: Op::Hello,
            id: 0,
            result: Ok(Reply::Hello(HelloReply {
                version: 1,
                features: features::IO_BY_NODE,
                max_frame: MAX_FRAME_LEN as u32,
                max_in_flight: 256,
                instance: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
                read_only: true,
                id_mapping: IdMapping::Passthrough,
                challenge: None,
            })),
            expected: [
                &[0x35, 0, 0, 0][..],                                    // len: 53
                &[2],                                                    // kind: reply
                &[0],                                                    // flags
                &[1, 0],                                                 // op: 1 hello
                &[0, 0, 0, 0, 0, 0, 0, 0],                               // id 0
                &[0, 0, 0, 0],                                           // status: 0 ok
                &[1, 0],                                                 // version 1
                &[2, 0, 0, 0, 0, 0, 0, 0],                               // features: IO_BY_NODE
                &[0x00, 0x10, 0x10, 0x00],                               // max_frame 0x101000
                &[0, 1, 0, 0],                                           // max_in_flight 256
                &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15], // instance (16 bytes)
                &[1],                                                    // read_only: true
                &[1],                                                    // id_mapping: passthrough
                &[0],                                                    // challenge: none
            ]
            .concat(),
        },
        ReplyCase {
            name: "hello (challenge)".into(),
            op: Op::Hello,
            id: 0,
            result: Ok(Reply::Hello(HelloReply {
                version: 1,
                features: 0,
                max_frame: MAX_FRAME_LEN as u32,
                max_in_flight: 0,
                instance: [0; 16],
                read_only: false,
                id_mapping: IdMapping::Squash,
                challenge: Some(Challenge {
                    server_nonce: [5; 32],
                    server_proof: [6; 32],
                }),
            })),
            expected: [
                &[0x75, 0, 0, 0][..],      // len: 117
                &[2],                      // kind: reply
                &[0],                      // flags
                &[1, 0],                   // op: 1 hello
                &[0, 0, 0, 0, 0, 0, 0, 0], // id 0
                &[0, 0, 0, 0],             // status: 0 ok
                &[1, 0],                   // version 1
                &[0, 0, 0, 0, 0, 0, 0, 0], // features: none until authenticated
                &[0x00, 0x10, 0x10, 0x00], // max_frame 0x101000
                &[0, 0, 0, 0],             // max_in_flight 0
                &[0; 16],                  // instance: zero until authenticated
                &[0],                      // read_only: false
                &[0],                      // id_mapping: squash
                &[1],                      // challenge: present
                &[5; 32],                  // server_nonce (32 bytes)
                &[6; 32],                  // server_proof (32 bytes)
            ]
            .concat(),
        },
        ReplyCase {
            name: "auth".into(),
            op: Op::Auth,
            id: 1,
            result: Ok(Reply::Hello(HelloReply {
                version: 1,
                features: features::IO_BY_NODE,
                max_frame: MAX_FRAME_LEN as u32,
                max_in_flight: 256,
                instance: [3; 16],
                read_only: false,
                id_mapping: IdMapping::Squash,
                challenge: None,
            })),
            expected: [
                &[0x35, 0, 0, 0][..],      // len: 53
                &[2],                      // kind: reply
                &[0],                      // flags
                &[2, 0],                   // op: 2 auth
                &[1, 0, 0, 0, 0, 0, 0, 0], // id 1
                &[0, 0, 0, 0],             // status: 0 ok, then the real HELLO reply
                &[1, 0],                   // version 1
                &[2, 0, 0, 0, 0, 0, 0, 0], // features: IO_BY_NODE
                &[0x00, 0x10, 0x10, 0x00], // max_frame 0x101000
                &[0, 1, 0, 0],             // max_in_flight 256
                &[3; 16],                  // instance (16 bytes)
                &[0],                      // read_only: false
                &[0],                      // id_mapping: squash
                &[0],                      // challenge: none
            ]
            .concat(),
        },
        ReplyCase {
            name: "auth (refused)".into(),
            op: Op::Auth,
            id: 1,
            result: Err(WireErrno::EACCES),
            expected: [
                &[0x10, 0, 0, 0][..],      // len: 16
                &[2],                      // kind: reply
                &[0],                      // flags
                &[2, 0],                   // op: 2 auth
                &[1, 0, 0, 0, 0, 0, 0, 0], // id 1
                &[13, 0, 0, 0],            // status: 13 EACCES
            ]
            .concat(),
        },
        ReplyCase {
            name: "hello (refused)".into(),
            op: Op::Hello,
            id: 0,
            result: Err(WireErrno::EPROTO),
            expected: [
                &[0x10, 0, 0, 0][..],      // len: 16
                &[2],                      // kind: reply
                &[0],                      // flags
                &[1, 0],                   // op: 1 hello
                &[0, 0, 0, 0, 0, 0, 0, 0], // id 0
                &[0x47, 0, 0, 0],          // status: 71 EPROTO, nothing follows
            ]
            .concat(),
        },
        ReplyCase {
            name: "lookup (ENOENT)".into(),
            op: Op::Lookup,
            id: 42,
            result: Err(WireErrno::ENOENT),
            expected: [
                &[0x10, 0, 0, 0][..],         // len: 16
                &[2],                         // kind: reply
                &[0],                         // flags
                &[10, 0],                     // op: 10 lookup
                &[0x2a, 0, 0, 0, 0, 0, 0, 0], // id 42
                &[2, 0, 0, 0],                // status: 2 ENOENT, nothing follows
            ]
            .concat(),
        },
        ReplyCase {
            name: "statfs".into(),
            op: Op::Statfs,
            id: 42,
            result: Ok(Reply::Statfs(Statfs {
                blocks: 1_000_000,
                bfree: 500_000,
                bavail: 400_000,
                files: 65536,
                ffree: 60000,
                bsize: 4096,
                namelen: 255,
                frsize: 4096,
            })),
            expected: [
                &[0x44, 0, 0, 0][..],               // len: 68
                &[2],                               // kind: reply
                &[0],                               // flags
                &[25, 0],                           // op: 25 statfs
                &[0x2a, 0, 0, 0, 0, 0, 0, 0],       // id 42
                &[0, 0, 0, 0],                      // status: ok
                &[0x40, 0x42, 0x0f, 0, 0, 0, 0, 0], // blocks 1_000_000
                &[0x20, 0xa1, 0x07, 0, 0, 0, 0, 0], // bfree 500_000
                &[0x80, 0x1a, 0x06, 0, 0, 0, 0, 0], // bavail 400_000
                &[0, 0, 1, 0, 0, 0, 0, 0],          // files 65536
                &[0x60, 0xea, 0, 0, 0, 0, 0, 0],    // ffree 60000
                &[0, 0x10, 0, 0],                   // bsize 4096
                &[0xff, 0, 0, 0],                   // namelen 255
                &[0, 0x10, 0, 0],                   // frsize 4096
            ]
            .concat(),
        },
        ReplyCase {
            name: "getxattr (value)".into(),
            op: Op::Getxattr,
            id: 42,
            result: Ok(Reply::XattrData(b(b"v1"))),
            expected: [
                &[0x17, 0, 0, 0][..],         // len: 23
                &[2],                         // kind: reply
                &[0],                         // flags
                &[29, 0],                     // op: 29 getxattr
                &[0x2a, 0, 0, 0, 0, 0, 0, 0], // id 42
                &[0, 0, 0, 0],                // status: ok
                &[1],                         // tag: 1 data
                &[2, 0, 0, 0],                // value length 2 (blob)
                b"v1",                        // value
            ]
            .concat(),
        },
        ReplyCase {
            name: "listxattr (names)".into(),
            op: Op::Listxattr,
            id: 42,
            result: Ok(Reply::XattrData(b(b"user.k\0"))),
            expected: [
                &[0x1c, 0, 0, 0][..],         // len: 28
                &[2],                         // kind: reply
                &[0],                         // flags
                &[30, 0],                     // op: 30 listxattr
                &[0x2a, 0, 0, 0, 0, 0, 0, 0], // id 42
                &[0, 0, 0, 0],                // status: ok
                &[1],                         // tag: 1 data
                &[7, 0, 0, 0],                // list length 7 (blob)
                b"user.k\0",                  // NUL-terminated names
            ]
            .concat(),
        },
        ReplyCase {
            name: "readdir".into(),
            op: Op::Readdir,
            id: 42,
            result: Ok(Reply::Dir {
                entries: vec![
                    DirEntry {
                        ino: ROOT_NODE,
                        offset: 1,
                        kind: 4,
                        name: b(b"."),
                        entry: None,
                    },
                    DirEntry {
                        ino: N,
                        offset: 2,
                        kind: 8,
                        name: b(b"file"),
                        entry: None,
                    },
                ],
                end: false,
            }),
            expected: [
                &[0x41, 0, 0, 0][..],            // len: 65
                &[2],                            // kind: reply
                &[0],                            // flags
                &[34, 0],                        // op: 34 readdir
                &[0x2a, 0, 0, 0, 0, 0, 0, 0],    // id 42
                &[0, 0, 0, 0],                   // status: ok
                &[2, 0, 0, 0],                   // count: 2 entries
                &[1, 0, 0, 0, 0, 0, 0, 0],       // [0].ino 1
                &[1, 0, 0, 0, 0, 0, 0, 0],       // [0].offset (next cookie) 1
                &[4],                            // [0].kind DT_DIR
                &[1, 0],                         // [0].name length 1
                b".",                            // [0].name
                &[0],                            // [0].entry: absent
                &[0x34, 0x12, 0, 0, 0, 0, 0, 0], // [1].ino 0x1234
                &[2, 0, 0, 0, 0, 0, 0, 0],       // [1].offset 2
                &[8],                            // [1].kind DT_REG
                &[4, 0],                         // [1].name length 4
                b"file",                         // [1].name
                &[0],                            // [1].entry: absent
            ]
            .concat(),
        },
        ReplyCase {
            name: "readdir (plus)".into(),
            op: Op::Readdir,
            id: 42,
            result: Ok(Reply::Dir {
                entries: vec![
                    DirEntry {
                        ino: ROOT_NODE,
                        offset: 1,
                        kind: 4,
                        name: b(b".."),
                        entry: None,
                    },
                    DirEntry {
                        ino: N,
                        offset: 2,
                        kind: 8,
                        name: b(b"file"),
                        entry: Some(entry()),
                    },
                ],
                end: false,
            }),
            expected: [
                &[0xb6, 0, 0, 0][..],            // len: 182
                &[2],                            // kind: reply
                &[0],                            // flags
                &[34, 0],                        // op: 34 readdir
                &[0x2a, 0, 0, 0, 0, 0, 0, 0],    // id 42
                &[0, 0, 0, 0],                   // status: ok
                &[2, 0, 0, 0],                   // count: 2 entries
                &[1, 0, 0, 0, 0, 0, 0, 0],       // [0].ino 1
                &[1, 0, 0, 0, 0, 0, 0, 0],       // [0].offset 1
                &[4],                            // [0].kind DT_DIR
                &[2, 0],                         // [0].name length 2
                b"..",                           // [0].name
                &[0],                            // [0].entry: absent ("." and ".." never have one)
                &[0x34, 0x12, 0, 0, 0, 0, 0, 0], // [1].ino 0x1234
                &[2, 0, 0, 0, 0, 0, 0, 0],       // [1].offset 2
                &[8],                            // [1].kind DT_REG
                &[4, 0],                         // [1].name length 4
                b"file",                         // [1].name
                &[1],                            // [1].entry: present (counts one lookup)
                &entry_bytes(),                  // [1].entry (116 bytes)
            ]
            .concat(),
        },
        ReplyCase {
            name: "readdir (end of directory)".into(),
            op: Op::Readdir,
            id: 42,
            result: Ok(Reply::Dir {
                entries: vec![],
                end: false,
            }),
            expected: [
                &[0x14, 0, 0, 0][..],         // len: 20
                &[2],                         // kind: reply
                &[0],                         // flags
                &[34, 0],                     // op: 34 readdir
                &[0x2a, 0, 0, 0, 0, 0, 0, 0], // id 42
                &[0, 0, 0, 0],                // status: ok
                &[0, 0, 0, 0],                // count: 0 entries
            ]
            .concat(),
        },
        ReplyCase {
            name: "readdir (the last entries, feature DIR_END)".into(),
            op: Op::Readdir,
            id: 42,
            result: Ok(Reply::Dir {
                entries: vec![DirEntry {
                    ino: N,
                    offset: 2,
                    kind: 8,
                    name: b(b"file"),
                    entry: None,
                }],
                end: true,
            }),
            expected: [
                &[0x2d, 0, 0, 0][..],            // len: 45
                &[2],                            // kind: reply
                &[0],                            // flags
                &[34, 0],                        // op: 34 readdir
                &[0x2a, 0, 0, 0, 0, 0, 0, 0],    // id 42
                &[0, 0, 0, 0],                   // status: ok
                &[1, 0, 0, 0],                   // count: 1 entry
                &[0x34, 0x12, 0, 0, 0, 0, 0, 0], // [0].ino 0x1234
                &[2, 0, 0, 0, 0, 0, 0, 0],       // [0].offset 2
                &[8],                            // [0].kind DT_REG
                &[4, 0],                         // [0].name length 4
                b"file",                         // [0].name
                &[0],                            // [0].entry: absent
                &[1],                            // end: the directory has no more entries
            ]
            .concat(),
        },
        ReplyCase {
            name: "create".into(),
            op: Op::Create,
            id: 42,
            result: Ok(Reply::Create {
                entry: entry(),
                fh: FH,
                flags: open_flags::DIRECT_IO,
                dir: None,
            }),
            expected: [
                &[0x90, 0, 0, 0][..],         // len: 144
                &[2],                         // kind: reply
                &[0],                         // flags
                &[38, 0],                     // op: 38 create
                &[0x2a, 0, 0, 0, 0, 0, 0, 0], // id 42
                &[0, 0, 0, 0],                // status: ok
                &entry_bytes(),               // entry (116 bytes)
                &[7, 0, 0, 0, 0, 0, 0, 0],    // fh 7
                &[2, 0, 0, 0],                // open flags: DIRECT_IO
            ]
            .concat(),
        },
        ReplyCase {
            name: "create with the directory's attributes (DIR_ATTR)".into(),
            op: Op::Create,
            id: 42,
            result: Ok(Reply::Create {
                entry: entry(),
                fh: FH,
                flags: 0,
                dir: Some(Box::new(attr())),
            }),
            expected: [
                &[0xf0, 0, 0, 0][..],         // len: 240
                &[2],                         // kind: reply
                &[0],                         // flags
                &[38, 0],                     // op: 38 create
                &[0x2a, 0, 0, 0, 0, 0, 0, 0], // id 42
                &[0, 0, 0, 0],                // status: ok
                &entry_bytes(),               // entry (116 bytes)
                &[7, 0, 0, 0, 0, 0, 0, 0],    // fh 7
                &[0, 0, 0, 0],                // open flags: none
                &ATTR_BYTES,                  // the directory's attributes (96 bytes)
            ]
            .concat(),
        },
        ReplyCase {
            name: "bind (answered as a creation)".into(),
            op: Op::Bind,
            id: 42,
            result: Ok(Reply::Create {
                entry: entry(),
                fh: None,
                flags: 0,
                dir: Some(Box::new(attr())),
            }),
            expected: [
                &[0xf0, 0, 0, 0][..],         // len: 240
                &[2],                         // kind: reply
                &[0],                         // flags
                &[49, 0],                     // op: 49 bind
                &[0x2a, 0, 0, 0, 0, 0, 0, 0], // id 42
                &[0, 0, 0, 0],                // status: ok
                &entry_bytes(),               // entry (116 bytes)
                &[0, 0, 0, 0, 0, 0, 0, 0],    // fh 0
                &[0, 0, 0, 0],                // open flags: none
                &ATTR_BYTES,                  // the directory's attributes (96 bytes)
            ]
            .concat(),
        },
        ReplyCase {
            name: "spares".into(),
            op: Op::Spares,
            id: 42,
            result: Ok(Reply::Spares(vec![entry(), entry()])),
            expected: [
                &[0xfc, 0, 0, 0][..],         // len: 252
                &[2],                         // kind: reply
                &[0],                         // flags
                &[48, 0],                     // op: 48 spares
                &[0x2a, 0, 0, 0, 0, 0, 0, 0], // id 42
                &[0, 0, 0, 0],                // status: ok
                &[2, 0, 0, 0],                // 2 spare files
                &entry_bytes(),               // the first (116 bytes)
                &entry_bytes(),               // the second
            ]
            .concat(),
        },
        ReplyCase {
            name: "lseek".into(),
            op: Op::Lseek,
            id: 42,
            result: Ok(Reply::Lseek { offset: 4096 }),
            expected: [
                &[0x18, 0, 0, 0][..],         // len: 24
                &[2],                         // kind: reply
                &[0],                         // flags
                &[40, 0],                     // op: 40 lseek
                &[0x2a, 0, 0, 0, 0, 0, 0, 0], // id 42
                &[0, 0, 0, 0],                // status: ok
                &[0, 0x10, 0, 0, 0, 0, 0, 0], // offset 4096
            ]
            .concat(),
        },
        ReplyCase {
            name: "getlk".into(),
            op: Op::Getlk,
            id: 42,
            result: Ok(Reply::Lock {
                typ: lock_type::WRITE,
                start: 0,
                end: u64::MAX,
                pid: 4321,
            }),
            expected: [
                &[0x25, 0, 0, 0][..],         // len: 37
                &[2],                         // kind: reply
                &[0],                         // flags
                &[46, 0],                     // op: 46 getlk
                &[0x2a, 0, 0, 0, 0, 0, 0, 0], // id 42
                &[0, 0, 0, 0],                // status: ok
                &[2],                         // type: write
                &[0, 0, 0, 0, 0, 0, 0, 0],    // start 0
                &[0xff; 8],                   // end: to the end of the file
                &[0xe1, 0x10, 0, 0],          // host pid 4321
            ]
            .concat(),
        },
    ];

    // Replies shared by several operations: the same body under each op's header.
    for (op, code) in [
        (Op::Lookup, [10, 0]),
        (Op::Reclaim, [44, 0]),
        (Op::Mknod, [15, 0]),
        (Op::Mkdir, [16, 0]),
        (Op::Symlink, [19, 0]),
        (Op::Link, [21, 0]),
    ] {
        cases.push(ReplyCase {
            name: format!("{op:?} entry"),
            op,
            id: 42,
            result: Ok(Reply::Entry(entry())),
            expected: [
                &[0x84, 0, 0, 0][..],         // len: 132
                &[2],                         // kind: reply
                &[0],                         // flags
                &code,                        // op
                &[0x2a, 0, 0, 0, 0, 0, 0, 0], // id 42
                &[0, 0, 0, 0],                // status: ok
                &entry_bytes(),               // entry (116 bytes)
            ]
            .concat(),
        });
    }
    for (op, code) in [(Op::Getattr, [12, 0]), (Op::Setattr, [13, 0])] {
        cases.push(ReplyCase {
            name: format!("{op:?} attr"),
            op,
            id: 42,
            result: Ok(Reply::Attr(attr())),
            expected: [
                &[0x70, 0, 0, 0][..],         // len: 112
                &[2],                         // kind: reply
                &[0],                         // flags
                &code,                        // op
                &[0x2a, 0, 0, 0, 0, 0, 0, 0], // id 42
                &[0, 0, 0, 0],                // status: ok
                &ATTR_BYTES,                  // attr (96 bytes)
            ]
            .concat(),
        });
    }
    for (op, code) in [(Op::Readlink, [14, 0]), (Op::Read, [23, 0])] {
        cases.push(ReplyCase {
            name: format!("{op:?} data"),
            op,
            id: 42,
            result: Ok(Reply::Data(b(b"../t"))),
            expected: [
                &[0x18, 0, 0, 0][..],         // len: 24
                &[2],                         // kind: reply
                &[0],                         // flags
                &code,                        // op
                &[0x2a, 0, 0, 0, 0, 0, 0, 0], // id 42
                &[0, 0, 0, 0],                // status: ok
                &[4, 0, 0, 0],                // data length 4 (blob)
                b"../t",                      // data
            ]
            .concat(),
        });
        cases.push(ReplyCase {
            name: format!("{op:?} data (empty)"),
            op,
            id: 42,
            result: Ok(Reply::Data(Bytes::new())),
            expected: [
                &[0x14, 0, 0, 0][..],         // len: 20
                &[2],                         // kind: reply
                &[0],                         // flags
                &code,                        // op
                &[0x2a, 0, 0, 0, 0, 0, 0, 0], // id 42
                &[0, 0, 0, 0],                // status: ok
                &[0, 0, 0, 0],                // data length 0 (end of file)
            ]
            .concat(),
        });
    }
    for (op, code) in [
        (Op::Unlink, [17, 0]),
        (Op::Rmdir, [18, 0]),
        (Op::Rename, [20, 0]),
        (Op::Release, [26, 0]),
        (Op::Fsync, [27, 0]),
        (Op::Setxattr, [28, 0]),
        (Op::Removexattr, [31, 0]),
        (Op::Flush, [32, 0]),
        (Op::Releasedir, [35, 0]),
        (Op::Fsyncdir, [36, 0]),
        (Op::Access, [37, 0]),
        (Op::Fallocate, [39, 0]),
        (Op::Ping, [42, 0]),
        (Op::Sync, [50, 0]),
        (Op::Reopen, [43, 0]),
        (Op::Setlk, [45, 0]),
        (Op::LockRelease, [47, 0]),
    ] {
        cases.push(ReplyCase {
            name: format!("{op:?} empty"),
            op,
            id: 42,
            result: Ok(Reply::Empty),
            expected: [
                &[0x10, 0, 0, 0][..],         // len: 16
                &[2],                         // kind: reply
                &[0],                         // flags
                &code,                        // op
                &[0x2a, 0, 0, 0, 0, 0, 0, 0], // id 42
                &[0, 0, 0, 0],                // status: ok, nothing follows
            ]
            .concat(),
        });
    }
    for (op, code) in [(Op::Open, [22, 0]), (Op::Opendir, [33, 0])] {
        cases.push(ReplyCase {
            name: format!("{op:?} open"),
            op,
            id: 42,
            result: Ok(Reply::Open {
                fh: FH.unwrap(),
                flags: open_flags::KEEP_CACHE,
            }),
            expected: [
                &[0x1c, 0, 0, 0][..],         // len: 28
                &[2],                         // kind: reply
                &[0],                         // flags
                &code,                        // op
                &[0x2a, 0, 0, 0, 0, 0, 0, 0], // id 42
                &[0, 0, 0, 0],                // status: ok
                &[7, 0, 0, 0, 0, 0, 0, 0],    // fh 7
                &[1, 0, 0, 0],                // open flags: KEEP_CACHE
            ]
            .concat(),
        });
    }
    for (op, code) in [(Op::Write, [24, 0]), (Op::CopyFileRange, [41, 0])] {
        cases.push(ReplyCase {
            name: format!("{op:?} written"),
            op,
            id: 42,
            result: Ok(Reply::Written {
                size: 5,
                attr: None,
            }),
            expected: [
                &[0x18, 0, 0, 0][..],         // len: 24
                &[2],                         // kind: reply
                &[0],                         // flags
                &code,                        // op
                &[0x2a, 0, 0, 0, 0, 0, 0, 0], // id 42
                &[0, 0, 0, 0],                // status: ok
                &[5, 0, 0, 0, 0, 0, 0, 0],    // size 5
            ]
            .concat(),
        });
    }
    cases.push(ReplyCase {
        name: "write with the file's attributes (WRITE_ATTR)".into(),
        op: Op::Write,
        id: 42,
        result: Ok(Reply::Written {
            size: 5,
            attr: Some(Box::new(attr())),
        }),
        expected: [
            &[0x78, 0, 0, 0][..],         // len: 120
            &[2],                         // kind: reply
            &[0],                         // flags
            &[24, 0],                     // op: 24 write
            &[0x2a, 0, 0, 0, 0, 0, 0, 0], // id 42
            &[0, 0, 0, 0],                // status: ok
            &[5, 0, 0, 0, 0, 0, 0, 0],    // size 5
            &ATTR_BYTES,                  // the file's attributes (96 bytes)
        ]
        .concat(),
    });
    for (op, code) in [(Op::Getxattr, [29, 0]), (Op::Listxattr, [30, 0])] {
        cases.push(ReplyCase {
            name: format!("{op:?} size"),
            op,
            id: 42,
            result: Ok(Reply::XattrSize(17)),
            expected: [
                &[0x15, 0, 0, 0][..],         // len: 21
                &[2],                         // kind: reply
                &[0],                         // flags
                &code,                        // op
                &[0x2a, 0, 0, 0, 0, 0, 0, 0], // id 42
                &[0, 0, 0, 0],                // status: ok
                &[0],                         // tag: 0 size
                &[17, 0, 0, 0],               // size 17
            ]
            .concat(),
        });
    }
    // Any operation can fail (HELLO and lookup failures are above; forget has no reply).
    for (op, code) in OPS {
        if matches!(op, Op::Hello | Op::Lookup | Op::Forget) {
            continue;
        }
        cases.push(ReplyCase {
            name: format!("{op:?} EACCES"),
            op,
            id: 42,
            result: Err(WireErrno::EACCES),
            expected: [
                &[0x10, 0, 0, 0][..],         // len: 16
                &[2],                         // kind: reply
                &[0],                         // flags
                &code,                        // op
                &[0x2a, 0, 0, 0, 0, 0, 0, 0], // id 42
                &[0x0d, 0, 0, 0],             // status: 13 EACCES, nothing follows
            ]
            .concat(),
        });
    }
    cases
}

#[test]
fn golden_replies() {
    let cases = reply_cases();
    for c in &cases {
        let frame = reply_frame(c.op as u16, c.id, &c.result);
        assert_frame(&c.name, &frame, &c.expected);
        let (h, body) = split(&c.expected);
        assert_eq!(h.kind, FrameKind::Reply, "{}", c.name);
        assert_eq!(h.flags, 0, "{}", c.name);
        assert_eq!(h.op, c.op as u16, "{}", c.name);
        assert_eq!(h.id, c.id, "{}", c.name);
        assert_eq!(
            Reply::decode(h.op, body),
            Ok(c.result.clone()),
            "{}",
            c.name
        );
    }
    // Every operation that has a reply has a golden success and a golden error.
    for (op, _) in OPS {
        if op == Op::Forget {
            continue;
        }
        assert!(
            cases.iter().any(|c| c.op == op && c.result.is_ok()),
            "no success for {op:?}"
        );
        assert!(
            cases.iter().any(|c| c.op == op && c.result.is_err()),
            "no error for {op:?}"
        );
    }
}

#[test]
fn golden_data_reply_frame() {
    // read: the data is written straight into the frame; the blob length is patched in.
    let frame = data_reply_frame(Op::Read as u16, 42, 4096, |buf| {
        buf[..5].copy_from_slice(b"hello");
        Ok(5)
    });
    let expected: Vec<u8> = [
        &[0x19, 0, 0, 0][..],         // len: 25
        &[2],                         // kind: reply
        &[0],                         // flags
        &[23, 0],                     // op: 23 read
        &[0x2a, 0, 0, 0, 0, 0, 0, 0], // id 42
        &[0, 0, 0, 0],                // status: ok
        &[5, 0, 0, 0],                // data length 5
        b"hello",                     // data
    ]
    .concat();
    assert_frame("data_reply_frame read", &frame, &expected);
    let (h, body) = split(&frame);
    assert_eq!(Reply::decode(h.op, body), Ok(Ok(Reply::Data(b(b"hello")))));

    // readlink through the same path: identical to reply_frame's Data.
    let frame = data_reply_frame(Op::Readlink as u16, 42, 64, |buf| {
        buf[..4].copy_from_slice(b"../t");
        Ok(4)
    });
    let expected: Vec<u8> = [
        &[0x18, 0, 0, 0][..],         // len: 24
        &[2],                         // kind: reply
        &[0],                         // flags
        &[14, 0],                     // op: 14 readlink
        &[0x2a, 0, 0, 0, 0, 0, 0, 0], // id 42
        &[0, 0, 0, 0],                // status: ok
        &[4, 0, 0, 0],                // data length 4
        b"../t",                      // data
    ]
    .concat();
    assert_frame("data_reply_frame readlink", &frame, &expected);
    assert_eq!(
        frame,
        reply_frame(Op::Readlink as u16, 42, &Ok(Reply::Data(b(b"../t"))))
    );

    // An error replaces everything after the header with the errno.
    let frame = data_reply_frame(Op::Read as u16, 42, 4096, |_| Err(WireErrno::EBADF));
    let expected: Vec<u8> = [
        &[0x10, 0, 0, 0][..],         // len: 16
        &[2],                         // kind: reply
        &[0],                         // flags
        &[23, 0],                     // op: 23 read
        &[0x2a, 0, 0, 0, 0, 0, 0, 0], // id 42
        &[9, 0, 0, 0],                // status: 9 EBADF
    ]
    .concat();
    assert_frame("data_reply_frame error", &frame, &expected);

    // A fill that claims more than it was given is cut to the buffer.
    let frame = data_reply_frame(Op::Read as u16, 42, 3, |buf| {
        buf.copy_from_slice(b"abc");
        Ok(10)
    });
    let expected: Vec<u8> = [
        &[0x17, 0, 0, 0][..],         // len: 23
        &[2],                         // kind: reply
        &[0],                         // flags
        &[23, 0],                     // op: 23 read
        &[0x2a, 0, 0, 0, 0, 0, 0, 0], // id 42
        &[0, 0, 0, 0],                // status: ok
        &[3, 0, 0, 0],                // data length 3
        b"abc",                       // data
    ]
    .concat();
    assert_frame("data_reply_frame clamp", &frame, &expected);

    // A size beyond the frame limit is clamped: the frame is always one the peer accepts.
    let frame = data_reply_frame(Op::Read as u16, 42, usize::MAX, |buf| Ok(buf.len()));
    assert!(frame.len() <= MAX_FRAME_LEN, "{} bytes", frame.len());
    let (h, body) = split(&frame);
    match Reply::decode(h.op, body) {
        Ok(Ok(Reply::Data(d))) => assert_eq!(d.len(), MAX_FRAME_LEN - FRAME_HEADER_LEN - 8),
        other => panic!("{other:?}"),
    }
}

#[test]
fn unrepresentable_errnos_are_sent_as_eio() {
    // Status 0 would read as success, and anything above i32::MAX as a protocol error.
    for bad in [WireErrno(0), WireErrno(0x8000_0000), WireErrno(u32::MAX)] {
        let frame = reply_frame(Op::Unlink as u16, 42, &Err(bad));
        let expected: Vec<u8> = [
            &[0x10, 0, 0, 0][..],         // len: 16
            &[2],                         // kind: reply
            &[0],                         // flags
            &[17, 0],                     // op: 17 unlink
            &[0x2a, 0, 0, 0, 0, 0, 0, 0], // id 42
            &[5, 0, 0, 0],                // status: 5 EIO
        ]
        .concat();
        assert_frame(&format!("{bad:?}"), &frame, &expected);
        let frame = data_reply_frame(Op::Read as u16, 1, 16, |_| Err(bad));
        assert_eq!(&frame[16..], &[5, 0, 0, 0], "{bad:?}");
    }
    // An errno this build has no name for still travels as itself; the receiver maps it.
    let frame = reply_frame(Op::Unlink as u16, 42, &Err(WireErrno(9999)));
    assert_eq!(&frame[16..], &[0x0f, 0x27, 0, 0]);
    let (h, body) = split(&frame);
    assert_eq!(Reply::decode(h.op, body), Ok(Err(WireErrno(9999))));
    assert_eq!(WireErrno(9999).to_host(), libc_eio());
}

fn libc_eio() -> i32 {
    WireErrno::EIO.to_host()
}

// ---------------------------------------------------------------------------------------------
// Constants that are part of the wire format
// ---------------------------------------------------------------------------------------------

#[test]
fn wire_constants() {
    assert_eq!(MAGIC, [0x89, b'T', b'T', b'H', b'R', b'\r', b'\n', 0x1a]);
    assert_eq!(PROTOCOL_VERSION, 1);
    assert_eq!(FRAME_HEADER_LEN, 16);
    assert_eq!(MAX_FRAME_LEN, 1_052_672);
    assert_eq!(FLAG_NO_REPLY, 1);
    assert_eq!(ROOT_NODE.get(), 1);
    assert_eq!(Attr::WIRE_LEN, 96);
    assert_eq!(features::PUSH_INVALIDATE, 1);
    assert_eq!(features::IO_BY_NODE, 2);
    assert_eq!(features::HOST_EVENTS, 4);
    assert_eq!(features::DIR_ATTR, 8);
    assert_eq!(features::CREATE_NO_HANDLE, 16);
    assert_eq!(features::WRITE_ATTR, 32);
    assert_eq!(features::DIR_END, 64);
    assert_eq!(features::ORDERED_WRITES, 128);
    assert_eq!(features::SPARE_FILES, 256);
    assert_eq!(handshake::ORDERED_WRITE_MAX, 65536);
    // The server tells an ordered WRITE by its body length alone.
    let data = Bytes::from(vec![0u8; handshake::ORDERED_WRITE_MAX]);
    let frame = Request::Write {
        node: N,
        fh: None,
        offset: 0,
        data,
    }
    .to_frame(1, CALLER);
    assert_eq!(
        frame.len() - FRAME_HEADER_LEN,
        handshake::WRITE_BODY_FIXED + handshake::ORDERED_WRITE_MAX
    );
    assert_eq!(open_flags::KEEP_CACHE, 1);
    assert_eq!(open_flags::DIRECT_IO, 2);
    assert_eq!(
        [
            setattr_valid::MODE,
            setattr_valid::UID,
            setattr_valid::GID,
            setattr_valid::SIZE
        ],
        [1, 2, 4, 8]
    );
    for (op, code) in OPS {
        assert_eq!(op as u16, u16::from_le_bytes(code), "{op:?}");
        assert_eq!(Op::from_u16(u16::from_le_bytes(code)), Ok(op));
    }
    let mutating = [
        Op::Setattr,
        Op::Mknod,
        Op::Mkdir,
        Op::Unlink,
        Op::Rmdir,
        Op::Symlink,
        Op::Rename,
        Op::Link,
        Op::Write,
        Op::Setxattr,
        Op::Removexattr,
        Op::Create,
        Op::Fallocate,
        Op::CopyFileRange,
        Op::Spares,
        Op::Bind,
    ];
    for (op, _) in OPS {
        assert_eq!(op.mutates(), mutating.contains(&op), "{op:?}");
    }
}

/// The errno table of docs/protocol.md.
#[test]
fn errno_table() {
    let table: [(WireErrno, u32, &str); 41] = [
        (WireErrno::EPERM, 1, "EPERM"),
        (WireErrno::ENOENT, 2, "ENOENT"),
        (WireErrno::EINTR, 4, "EINTR"),
        (WireErrno::EIO, 5, "EIO"),
        (WireErrno::ENXIO, 6, "ENXIO"),
        (WireErrno::E2BIG, 7, "E2BIG"),
        (WireErrno::EBADF, 9, "EBADF"),
        (WireErrno::EAGAIN, 11, "EAGAIN"),
        (WireErrno::ENOMEM, 12, "ENOMEM"),
        (WireErrno::EACCES, 13, "EACCES"),
        (WireErrno::EFAULT, 14, "EFAULT"),
        (WireErrno::EBUSY, 16, "EBUSY"),
        (WireErrno::EEXIST, 17, "EEXIST"),
        (WireErrno::EXDEV, 18, "EXDEV"),
        (WireErrno::ENODEV, 19, "ENODEV"),
        (WireErrno::ENOTDIR, 20, "ENOTDIR"),
        (WireErrno::EISDIR, 21, "EISDIR"),
        (WireErrno::EINVAL, 22, "EINVAL"),
        (WireErrno::ENFILE, 23, "ENFILE"),
        (WireErrno::EMFILE, 24, "EMFILE"),
        (WireErrno::ETXTBSY, 26, "ETXTBSY"),
        (WireErrno::EFBIG, 27, "EFBIG"),
        (WireErrno::ENOSPC, 28, "ENOSPC"),
        (WireErrno::ESPIPE, 29, "ESPIPE"),
        (WireErrno::EROFS, 30, "EROFS"),
        (WireErrno::EMLINK, 31, "EMLINK"),
        (WireErrno::EPIPE, 32, "EPIPE"),
        (WireErrno::ERANGE, 34, "ERANGE"),
        (WireErrno::EDEADLK, 35, "EDEADLK"),
        (WireErrno::ENAMETOOLONG, 36, "ENAMETOOLONG"),
        (WireErrno::ENOLCK, 37, "ENOLCK"),
        (WireErrno::ENOSYS, 38, "ENOSYS"),
        (WireErrno::ENOTEMPTY, 39, "ENOTEMPTY"),
        (WireErrno::ELOOP, 40, "ELOOP"),
        (WireErrno::ENODATA, 61, "ENODATA"),
        (WireErrno::EPROTO, 71, "EPROTO"),
        (WireErrno::EOVERFLOW, 75, "EOVERFLOW"),
        (WireErrno::EOPNOTSUPP, 95, "EOPNOTSUPP"),
        (WireErrno::ETIMEDOUT, 110, "ETIMEDOUT"),
        (WireErrno::ESTALE, 116, "ESTALE"),
        (WireErrno::EDQUOT, 122, "EDQUOT"),
    ];
    for (e, n, name) in table {
        assert_eq!(e.0, n, "{name}");
        assert_eq!(e.name(), name);
        // Translation is by name, so every listed errno survives a trip through the host.
        assert_eq!(WireErrno::from_host(e.to_host()), e, "{name}");
    }
    assert_eq!(WireErrno(3).name(), "E?");
    assert_eq!(WireErrno(3).to_host(), libc_eio());
}

// ---------------------------------------------------------------------------------------------
// Failure paths
// ---------------------------------------------------------------------------------------------

fn body_of(frame: &[u8]) -> &[u8] {
    &frame[FRAME_HEADER_LEN..]
}

#[test]
fn every_truncation_is_reported_as_truncated() {
    for c in request_cases() {
        let body = body_of(&c.expected);
        let op = c.req.op() as u16;
        for n in 0..body.len() {
            let r = Request::decode(op, Bytes::copy_from_slice(&body[..n]));
            match &c.req {
                // Write's data runs to the end of the frame: once the fixed fields (caller
                // and 24 bytes) are there, any shorter frame is a shorter write.
                Request::Write {
                    node, fh, offset, ..
                } if n >= 36 => {
                    let want = Request::Write {
                        node: *node,
                        fh: *fh,
                        offset: *offset,
                        data: Bytes::copy_from_slice(&body[36..n]),
                    };
                    assert_eq!(r, Ok((c.caller, want)), "{} cut to {n}", c.name);
                }
                _ => assert!(
                    matches!(r, Err(DecodeError::Truncated { .. })),
                    "{} cut to {n} bytes: {r:?}",
                    c.name
                ),
            }
        }
    }
    for c in reply_cases() {
        let body = body_of(&c.expected);
        for n in 0..body.len() {
            let r = Reply::decode(c.op as u16, Bytes::copy_from_slice(&body[..n]));
            if let Ok(Ok(Reply::Create { dir: None, .. } | Reply::Written { attr: None, .. })) = &r
            {
                // A CREATE or WRITE reply cut right before the attributes it carries
                // (DIR_ATTR, WRITE_ATTR) is a whole reply without them.
                assert_eq!(n, body.len() - Attr::WIRE_LEN, "{}", c.name);
                continue;
            }
            if let (Ok(Ok(Reply::Dir { end: false, .. })), Ok(Reply::Dir { end: true, .. })) =
                (&r, &c.result)
            {
                // A listing's reply cut right before its end marker (DIR_END) is a whole
                // reply without it.
                assert_eq!(n, body.len() - 1, "{}", c.name);
                continue;
            }
            assert!(
                matches!(r, Err(DecodeError::Truncated { .. })),
                "{} cut to {n} bytes: {r:?}",
                c.name
            );
        }
    }
}

#[test]
fn truncation_reports_where_and_how_much() {
    // getattr: caller (12) + node (8) present, fh needs 8 more and 5 are there.
    let body = &request_body("getattr")[..25];
    assert_eq!(
        Request::decode(Op::Getattr as u16, Bytes::copy_from_slice(body)),
        Err(DecodeError::Truncated {
            offset: 20,
            needed: 3
        })
    );
    // A name whose length runs past the frame.
    let body: Vec<u8> = [
        &CALLER_BYTES[..],         // caller
        &[1, 0, 0, 0, 0, 0, 0, 0], // parent
        &[0xff, 0xff],             // name length 65535
        b"abc",                    // but only 3 bytes
    ]
    .concat();
    assert_eq!(
        Request::decode(Op::Lookup as u16, Bytes::from(body)),
        Err(DecodeError::Truncated {
            offset: 22,
            needed: 65532
        })
    );
    // A blob length of 4 GiB - 1 in a tiny frame: refused without allocating.
    let body: Vec<u8> = [
        &[0, 0, 0, 0][..],         // status ok
        &[0xff, 0xff, 0xff, 0xff], // data length u32::MAX
    ]
    .concat();
    assert!(matches!(
        Reply::decode(Op::Read as u16, Bytes::from(body)),
        Err(DecodeError::Truncated { offset: 8, .. })
    ));
    // A forget or readdir count of u32::MAX in a tiny frame: truncated, not allocated.
    let body: Vec<u8> = [&CALLER_BYTES[..], &[0xff, 0xff, 0xff, 0xff]].concat();
    assert!(matches!(
        Request::decode(Op::Forget as u16, Bytes::from(body)),
        Err(DecodeError::Truncated { .. })
    ));
    let body: Vec<u8> = [&[0, 0, 0, 0][..], &[0xff, 0xff, 0xff, 0xff]].concat();
    assert!(matches!(
        Reply::decode(Op::Readdir as u16, Bytes::from(body)),
        Err(DecodeError::Truncated { .. })
    ));
}

#[test]
fn trailing_bytes_are_refused() {
    for c in request_cases() {
        if matches!(c.req, Request::Write { .. }) {
            continue; // its data runs to the end of the frame
        }
        let mut body = body_of(&c.expected).to_vec();
        body.push(0);
        assert_eq!(
            Request::decode(c.req.op() as u16, Bytes::from(body.clone())),
            Err(DecodeError::Trailing(1)),
            "{}",
            c.name
        );
        body.extend_from_slice(&[0; 9]);
        assert_eq!(
            Request::decode(c.req.op() as u16, Bytes::from(body)),
            Err(DecodeError::Trailing(10)),
            "{}",
            c.name
        );
    }
    for c in reply_cases() {
        let mut body = body_of(&c.expected).to_vec();
        body.push(0);
        let r = Reply::decode(c.op as u16, Bytes::from(body));
        if let Ok(Reply::Create { dir: None, .. } | Reply::Written { attr: None, .. }) = &c.result {
            // Bytes after a CREATE or WRITE reply's fields are attributes (DIR_ATTR,
            // WRITE_ATTR): one byte of them is a truncated Attr.
            assert!(
                matches!(r, Err(DecodeError::Truncated { .. })),
                "{}: {r:?}",
                c.name
            );
            continue;
        }
        assert_eq!(r, Err(DecodeError::Trailing(1)), "{}", c.name);
    }
}

#[test]
fn unknown_ops_are_refused() {
    let body = Bytes::copy_from_slice(&CALLER_BYTES);
    for op in [0u16, 3, 9, 51, 100, 0x8000, u16::MAX] {
        assert_eq!(Op::from_u16(op), Err(DecodeError::UnknownOp(op)));
        assert_eq!(
            Request::decode(op, body.clone()),
            Err(DecodeError::UnknownOp(op))
        );
        assert_eq!(
            Request::decode(op, Bytes::new()),
            Err(DecodeError::UnknownOp(op))
        );
        assert_eq!(
            Reply::decode(op, Bytes::from_static(&[0, 0, 0, 0])),
            Err(DecodeError::UnknownOp(op))
        );
    }
}

#[test]
fn frame_headers() {
    let header = |len: [u8; 4], kind: u8| -> [u8; FRAME_HEADER_LEN] {
        let mut h = [0u8; FRAME_HEADER_LEN];
        h[..4].copy_from_slice(&len);
        h[4] = kind;
        h[5] = 0x80; // flags pass through undecoded
        h[6..8].copy_from_slice(&[0x34, 0x12]); // op 0x1234 (not checked here)
        h[8..].copy_from_slice(&[8, 7, 6, 5, 4, 3, 2, 1]); // id
        h
    };
    // The three kinds.
    for (k, kind) in [
        (1, FrameKind::Request),
        (2, FrameKind::Reply),
        (3, FrameKind::Push),
    ] {
        let h = FrameHeader::decode(&header([12, 0, 0, 0], k), MAX_FRAME_LEN).unwrap();
        assert_eq!(
            h,
            FrameHeader {
                kind,
                flags: 0x80,
                op: 0x1234,
                id: 0x0102_0304_0506_0708,
                body_len: 0
            }
        );
        let mut out = [0u8; FRAME_HEADER_LEN];
        h.encode(&mut out);
        assert_eq!(out, header([12, 0, 0, 0], k));
    }
    // Unknown kinds.
    for k in [0u8, 4, 0x7f, 0xff] {
        assert_eq!(
            FrameHeader::decode(&header([12, 0, 0, 0], k), MAX_FRAME_LEN),
            Err(DecodeError::UnknownKind(k))
        );
    }
    // Shorter than the 12 header bytes that follow the length field.
    for len in [0u8, 1, 11] {
        assert_eq!(
            FrameHeader::decode(&header([len, 0, 0, 0], 1), MAX_FRAME_LEN),
            Err(DecodeError::TooShort(len as u32))
        );
    }
    // Exactly MAX_FRAME_LEN bytes in all (len = 0x100ffc) is accepted; one more is not.
    let h = FrameHeader::decode(&header([0xfc, 0x0f, 0x10, 0], 2), MAX_FRAME_LEN).unwrap();
    assert_eq!(h.body_len, MAX_FRAME_LEN - FRAME_HEADER_LEN);
    assert_eq!(
        FrameHeader::decode(&header([0xfd, 0x0f, 0x10, 0], 2), MAX_FRAME_LEN),
        Err(DecodeError::TooLong(
            MAX_FRAME_LEN as u64 + 1,
            MAX_FRAME_LEN as u64
        ))
    );
    assert_eq!(
        FrameHeader::decode(&header([0xff, 0xff, 0xff, 0xff], 2), MAX_FRAME_LEN),
        Err(DecodeError::TooLong(
            u32::MAX as u64 + 4,
            MAX_FRAME_LEN as u64
        ))
    );
    // The limit is the caller's: a 64-byte limit refuses a 65-byte frame.
    assert_eq!(
        FrameHeader::decode(&header([61, 0, 0, 0], 1), 64),
        Err(DecodeError::TooLong(65, 64))
    );
    assert!(FrameHeader::decode(&header([60, 0, 0, 0], 1), 64).is_ok());
    // The length is checked before the kind.
    assert_eq!(
        FrameHeader::decode(&header([0xff, 0xff, 0xff, 0xff], 9), MAX_FRAME_LEN),
        Err(DecodeError::TooLong(
            u32::MAX as u64 + 4,
            MAX_FRAME_LEN as u64
        ))
    );
}

/// Returns the golden body of the named request case, for corrupting.
fn request_body(name: &str) -> Vec<u8> {
    let c = request_cases()
        .into_iter()
        .find(|c| c.name == name)
        .unwrap();
    body_of(&c.expected).to_vec()
}

fn reply_body(name: &str) -> Vec<u8> {
    let c = reply_cases().into_iter().find(|c| c.name == name).unwrap();
    body_of(&c.expected).to_vec()
}

fn invalid(field: &'static str, value: u64) -> DecodeError {
    DecodeError::Invalid { field, value }
}

#[test]
fn invalid_values_are_refused() {
    // bool: fsync's datasync is the last byte.
    let mut body = request_body("fsync");
    *body.last_mut().unwrap() = 2;
    assert_eq!(
        Request::decode(Op::Fsync as u16, Bytes::from(body)),
        Err(invalid("bool", 2))
    );
    // bool: readdir's plus.
    let mut body = request_body("readdir");
    *body.last_mut().unwrap() = 0xff;
    assert_eq!(
        Request::decode(Op::Readdir as u16, Bytes::from(body)),
        Err(invalid("bool", 0xff))
    );
    // bool: the HELLO reply's read_only (third byte from the end).
    let mut body = reply_body("hello");
    let n = body.len();
    body[n - 3] = 7;
    assert_eq!(
        Reply::decode(Op::Hello as u16, Bytes::from(body)),
        Err(invalid("bool", 7))
    );
    // The HELLO reply's id mapping and challenge tag.
    let mut body = reply_body("hello");
    body[n - 2] = 3;
    assert_eq!(
        Reply::decode(Op::Hello as u16, Bytes::from(body)),
        Err(invalid("id_mapping", 3))
    );
    let mut body = reply_body("hello");
    body[n - 1] = 2;
    assert_eq!(
        Reply::decode(Op::Hello as u16, Bytes::from(body)),
        Err(invalid("challenge", 2))
    );
    // bool: a directory entry's "entry present" tag (body offset 4 + 4 + 21 - 1 = 28).
    let mut body = reply_body("readdir");
    assert_eq!(body[28], 0);
    body[28] = 2;
    assert_eq!(
        Reply::decode(Op::Readdir as u16, Bytes::from(body)),
        Err(invalid("bool", 2))
    );

    // SetTime tag: setattr's atime tag is at body offset 12 + 40 = 52.
    let mut body = request_body("setattr (omit, at)");
    assert_eq!(body[52], 0);
    body[52] = 3;
    assert_eq!(
        Request::decode(Op::Setattr as u16, Bytes::from(body)),
        Err(invalid("settime", 3))
    );

    // nsec >= 1e9 in a SetTime::At: the mtime nsec is the last 4 bytes.
    let mut body = request_body("setattr (omit, at)");
    let n = body.len();
    body[n - 4..].copy_from_slice(&[0x00, 0xca, 0x9a, 0x3b]); // 1_000_000_000
    assert_eq!(
        Request::decode(Op::Setattr as u16, Bytes::from(body)),
        Err(invalid("nsec", 1_000_000_000))
    );
    // ... and in an Attr: atime.nsec is at body offset 4 + 32.
    let mut body = reply_body("Getattr attr");
    body[36..40].copy_from_slice(&[0xff, 0xff, 0xff, 0xff]);
    assert_eq!(
        Reply::decode(Op::Getattr as u16, Bytes::from(body)),
        Err(invalid("nsec", u32::MAX as u64))
    );
    // ... even where the time itself is ignored (SetTime::Omit).
    let mut body = request_body("setattr (omit, at)");
    body[61..65].copy_from_slice(&[0x00, 0xca, 0x9a, 0x3b]);
    assert_eq!(
        Request::decode(Op::Setattr as u16, Bytes::from(body)),
        Err(invalid("nsec", 1_000_000_000))
    );

    // Negative status.
    for (status, value) in [
        ([0xff, 0xff, 0xff, 0xff], u64::MAX),              // -1
        ([0x00, 0x00, 0x00, 0x80], 0xffff_ffff_8000_0000), // i32::MIN
    ] {
        assert_eq!(
            Reply::decode(Op::Getattr as u16, Bytes::copy_from_slice(&status)),
            Err(invalid("status", value))
        );
    }

    // xattr reply tag other than 0 (size) or 1 (data).
    for op in [Op::Getxattr, Op::Listxattr] {
        let body: Vec<u8> = [
            &[0, 0, 0, 0][..], // status ok
            &[2],              // tag 2: unknown
            &[17, 0, 0, 0],    // would be a size
        ]
        .concat();
        assert_eq!(
            Reply::decode(op as u16, Bytes::from(body)),
            Err(invalid("xattr reply tag", 2))
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Robustness: hostile input never panics
// ---------------------------------------------------------------------------------------------

/// xorshift64*: deterministic, good enough to generate junk.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// Decodes `body` as a request and as a reply of `op`. Whatever decodes must survive being
/// encoded and decoded again unchanged.
fn decode_both(op: u16, body: &[u8]) {
    if let Ok((caller, req)) = Request::decode(op, Bytes::copy_from_slice(body)) {
        assert_eq!(req.op() as u16, op);
        let frame = req.to_frame(1, caller);
        let (h, again) = split(&frame);
        assert_eq!(Request::decode(h.op, again), Ok((caller, req)));
    }
    if let Ok(result) = Reply::decode(op, Bytes::copy_from_slice(body)) {
        let frame = reply_frame(op, 1, &result);
        let (h, again) = split(&frame);
        assert_eq!(Reply::decode(h.op, again), Ok(result));
    }
}

#[test]
fn random_bodies_never_panic() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let ops: Vec<u16> = OPS
        .iter()
        .map(|(op, _)| *op as u16)
        .chain([0, 2, 43, u16::MAX])
        .collect();
    for &op in &ops {
        for _ in 0..2000 {
            let len = match rng.below(4) {
                0 => rng.below(16),
                1 => rng.below(64),
                2 => rng.below(256),
                _ => rng.below(1024),
            };
            let mut body = rng.bytes(len);
            // Make small lengths and counts likely, so decoding gets past them sometimes.
            if rng.below(2) == 0 {
                for b in body.iter_mut() {
                    if rng.below(3) == 0 {
                        *b = rng.below(3) as u8;
                    }
                }
            }
            decode_both(op, &body);
        }
    }
}

#[test]
fn mutated_golden_frames_never_panic() {
    let mut rng = Rng(0x0123_4567_89ab_cdef);
    let mut frames: Vec<(u16, Vec<u8>)> = request_cases()
        .into_iter()
        .map(|c| (c.req.op() as u16, body_of(&c.expected).to_vec()))
        .collect();
    frames.extend(
        reply_cases()
            .into_iter()
            .map(|c| (c.op as u16, body_of(&c.expected).to_vec())),
    );
    for (op, golden) in &frames {
        for _ in 0..500 {
            let mut body = golden.clone();
            for _ in 0..1 + rng.below(4) {
                match rng.below(5) {
                    // Overwrite a byte with anything.
                    0 | 1 if !body.is_empty() => {
                        let i = rng.below(body.len());
                        body[i] = rng.next() as u8;
                    }
                    // Overwrite a byte with a value that is often a valid tag or length.
                    2 if !body.is_empty() => {
                        let i = rng.below(body.len());
                        body[i] = [0, 1, 2, 3, 0xff][rng.below(5)];
                    }
                    // Cut the end off.
                    3 => {
                        let n = rng.below(body.len() + 1);
                        body.truncate(n);
                    }
                    // Append junk.
                    _ => {
                        let n = rng.below(8);
                        body.extend(rng.bytes(n));
                    }
                }
            }
            decode_both(*op, &body);
            // The same bytes under another op's code, too.
            decode_both(OPS[rng.below(OPS.len())].0 as u16, &body);
        }
    }
}

#[test]
fn random_headers_never_panic() {
    let mut rng = Rng(0xdead_beef_0bad_f00d);
    for i in 0..100_000 {
        let mut h: [u8; FRAME_HEADER_LEN] = rng.bytes(FRAME_HEADER_LEN).try_into().unwrap();
        if i % 2 == 0 {
            // Keep the length plausible half the time so the other checks are reached.
            h[2] = 0;
            h[3] = 0;
            h[4] = rng.below(5) as u8;
        }
        let max = if i % 3 == 0 { 64 } else { MAX_FRAME_LEN };
        if let Ok(header) = FrameHeader::decode(&h, max) {
            assert!(header.body_len + FRAME_HEADER_LEN <= max);
            let mut out = [0u8; FRAME_HEADER_LEN];
            header.encode(&mut out);
            assert_eq!(out, h);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Push frames
// ---------------------------------------------------------------------------------------------

#[test]
fn golden_invalidate_push() {
    let items = vec![
        Invalidation::Inode(N),
        Invalidation::Entry {
            parent: NodeId::new(7),
            name: b(b"ab"),
        },
        Invalidation::All,
    ];
    let got = invalidate_frame(9, &items, &[]);
    let expected: Vec<u8> = [
        &[0x27, 0, 0, 0][..],            // len: 39 bytes after this field
        &[3],                            // kind: push
        &[0],                            // flags
        &[100, 0],                       // op: INVALIDATE (100)
        &[9, 0, 0, 0, 0, 0, 0, 0],       // id: push sequence 9
        &[3, 0, 0, 0],                   // item count: 3
        &[1],                            // item 1 kind: inode
        &[0x34, 0x12, 0, 0, 0, 0, 0, 0], //   node 0x1234
        &[2],                            // item 2 kind: entry
        &[7, 0, 0, 0, 0, 0, 0, 0],       //   parent 7
        &[2, 0],                         //   name length 2
        b"ab",                           //   name
        &[3],                            // item 3 kind: all
    ]
    .concat();
    assert_frame("INVALIDATE push", &got, &expected);
    let (h, body) = split(&got);
    assert_eq!(
        (h.kind, h.op, h.id),
        (FrameKind::Push, push_op::INVALIDATE, 9)
    );
    assert_eq!(decode_invalidate(body.clone()).unwrap().items, items);
    // Every truncation fails cleanly, as do trailing bytes and an unknown item kind.
    assert_prefixes_fail(decode_invalidate, &body, 0..body.len());
    // A byte after the items starts an events list, which must then be whole.
    let mut longer = body.to_vec();
    longer.push(0);
    assert!(decode_invalidate(Bytes::from(longer)).is_err());
    let bad_kind = Bytes::from_static(&[1, 0, 0, 0, 4]);
    assert!(matches!(
        decode_invalidate(bad_kind),
        Err(DecodeError::Invalid { .. })
    ));
    // A huge count in a tiny frame is refused without allocating for it.
    let huge = Bytes::from_static(&[0xff, 0xff, 0xff, 0xff, 1]);
    assert!(decode_invalidate(huge).is_err());
}

#[test]
fn golden_lock_freed_push() {
    let got = lock_freed_frame(&[N, NodeId::new(7)]);
    let expected: Vec<u8> = [
        &[0x20, 0, 0, 0][..],            // len: 32 bytes after this field
        &[3],                            // kind: push
        &[0],                            // flags
        &[102, 0],                       // op: LOCK_FREED (102)
        &[0, 0, 0, 0, 0, 0, 0, 0],       // id: 0
        &[2, 0, 0, 0],                   // node count: 2
        &[0x34, 0x12, 0, 0, 0, 0, 0, 0], // node 0x1234
        &[7, 0, 0, 0, 0, 0, 0, 0],       // node 7
    ]
    .concat();
    assert_frame("LOCK_FREED push", &got, &expected);
    let (h, body) = split(&got);
    assert_eq!(
        (h.kind, h.op, h.id),
        (FrameKind::Push, push_op::LOCK_FREED, 0)
    );
    assert_eq!(
        decode_lock_freed(body.clone()).unwrap(),
        vec![N, NodeId::new(7)]
    );
    // Every truncation fails cleanly, as do trailing bytes.
    assert_prefixes_fail(decode_lock_freed, &body, 0..body.len());
    let mut longer = body.to_vec();
    longer.push(0);
    assert!(decode_lock_freed(Bytes::from(longer)).is_err());
    // A huge count in a tiny frame is refused without allocating for it.
    let huge = Bytes::from_static(&[0xff, 0xff, 0xff, 0xff, 1]);
    assert!(decode_lock_freed(huge).is_err());
}

#[test]
fn golden_invalidate_push_with_events() {
    let items = vec![Invalidation::Inode(NodeId::new(5))];
    let events = vec![
        HostEvent {
            dir: NodeId::new(5),
            dir_path: b(b"d"),
            name: b(b"x"),
            node: Some(NodeId::new(9)),
            file_type: S_IFREG,
            kind: EventKind::Changed(changed::MODIFY | changed::CLOSE_WRITE),
        },
        HostEvent {
            dir: NodeId::new(1),
            dir_path: b(b""),
            name: b(b"n"),
            node: Some(NodeId::new(9)),
            file_type: S_IFREG,
            kind: EventKind::Moved {
                from_dir: NodeId::new(5),
                from_path: b(b"d"),
                from_name: b(b"x"),
            },
        },
    ];
    let got = invalidate_frame(2, &items, &events);
    let expected: Vec<u8> = [
        &[0x67, 0, 0, 0][..],      // len: 103 bytes after this field
        &[3, 0, 100, 0],           // push, flags, INVALIDATE
        &[2, 0, 0, 0, 0, 0, 0, 0], // sequence 2
        &[1, 0, 0, 0],             // 1 item
        &[1, 5, 0, 0, 0, 0, 0, 0, 0],
        &[2, 0, 0, 0],             // 2 events
        &[3],                      // event 1: changed
        &[5, 0, 0, 0, 0, 0, 0, 0], //   dir 5
        &[1, 0, 0, 0],             //   dir path length 1
        b"d",                      //   dir path
        &[1, 0],                   //   name length 1
        b"x",                      //   name
        &[9, 0, 0, 0, 0, 0, 0, 0], //   node 9
        &[0, 0x80, 0, 0],          //   file type S_IFREG
        &[3],                      //   MODIFY | CLOSE_WRITE
        &[4],                      // event 2: moved
        &[1, 0, 0, 0, 0, 0, 0, 0], //   dir 1 (root)
        &[0, 0, 0, 0],             //   dir path: empty
        &[1, 0],                   //   name length 1
        b"n",                      //   name
        &[9, 0, 0, 0, 0, 0, 0, 0], //   node 9
        &[0, 0x80, 0, 0],          //   file type S_IFREG
        &[5, 0, 0, 0, 0, 0, 0, 0], //   from dir 5
        &[1, 0, 0, 0],             //   from path length 1
        b"d",                      //   from path
        &[1, 0],                   //   from name length 1
        b"x",                      //   from name
    ]
    .concat();
    assert_frame("INVALIDATE push with events", &got, &expected);
    let (_, body) = split(&got);
    let push = decode_invalidate(body.clone()).unwrap();
    assert_eq!((push.items, push.events), (items, events));
    // Cut after the items it is a valid push without events; every other cut fails.
    let cuts = (5..body.len()).filter(|&cut| cut != 13);
    assert_prefixes_fail(decode_invalidate, &body, cuts);
    // An unknown event kind is refused.
    let mut bad = body.to_vec();
    bad[17] = 9;
    assert!(decode_invalidate(Bytes::from(bad)).is_err());
}

/// S_IFREG (the tests of this I/O-free crate do not use libc).
const S_IFREG: u32 = 0o100000;

#[test]
fn large_pushes_are_cut_into_frames_in_order() {
    let items: Vec<Invalidation> = (0..30_000u64)
        .map(|i| Invalidation::Entry {
            parent: NodeId::new(i),
            name: Bytes::from(format!("name-{i}")),
        })
        .collect();
    let events: Vec<HostEvent> = (0..5_000u64)
        .map(|i| HostEvent {
            dir: NodeId::new(1),
            dir_path: Bytes::from(vec![b'p'; 200]),
            name: Bytes::from(format!("f{i}")),
            node: None,
            file_type: S_IFREG,
            kind: EventKind::Created,
        })
        .collect();
    let mut seq = 10;
    let frames = invalidate_frames(&mut seq, &items, &events);
    assert!(frames.len() > 2, "{} frames", frames.len());
    assert_eq!(seq, 10 + frames.len() as u64);
    let (mut got_items, mut got_events) = (Vec::new(), Vec::new());
    for (i, f) in frames.iter().enumerate() {
        assert!(
            f.len() <= 256 * 1024 + 64 * 1024,
            "frame {i} is {} bytes",
            f.len()
        );
        let (h, body) = split(f);
        assert_eq!(h.id, 11 + i as u64);
        let push = decode_invalidate(body).unwrap();
        // Invalidations all come before the first event.
        assert!(push.items.is_empty() || got_events.is_empty());
        got_items.extend(push.items);
        got_events.extend(push.events);
    }
    assert_eq!(got_items, items);
    assert_eq!(got_events, events);
    // An empty batch is still one frame (callers only push when there is something).
    let mut seq = 0;
    assert_eq!(invalidate_frames(&mut seq, &[], &[]).len(), 1);
}

#[test]
fn golden_goodbye_push() {
    let expected = [
        &[0x0c, 0, 0, 0][..],      // len: 12, a header and nothing else
        &[3],                      // kind: push
        &[0],                      // flags
        &[101, 0],                 // op: 101 goodbye
        &[0, 0, 0, 0, 0, 0, 0, 0], // id 0
    ]
    .concat();
    assert_frame("GOODBYE push", &tether_proto::goodbye_frame(), &expected);
}

#[test]
fn lock_types_map_to_fcntl_and_back() {
    for (wire, host) in [
        (lock_type::UNLOCK, libc::F_UNLCK),
        (lock_type::READ, libc::F_RDLCK),
        (lock_type::WRITE, libc::F_WRLCK),
    ] {
        assert_eq!(lock_type::to_fcntl(wire), host);
        assert_eq!(lock_type::from_fcntl(host), wire);
    }
}
