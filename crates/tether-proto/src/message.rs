//! Requests, replies and pushed messages, with their byte layouts.
//!
//! Every request body starts with the caller (uid, gid, pid: 12 bytes), then the op's fields.
//! Every reply body starts with an i32 status: 0 for success followed by the op's result,
//! or a positive wire errno and nothing else. Layouts are in docs/protocol.md.

use bytes::Bytes;

use crate::codec::{DecodeError, Decoder, Encoder};
use crate::errno::WireErrno;
use crate::frame::{FrameBuilder, FrameKind, FLAG_NO_REPLY, FRAME_HEADER_LEN, MAX_FRAME_LEN};
use crate::handshake::{Hello, HelloReply};
use crate::{HandleId, NodeId};

/// Operation codes (the `op` field of request and reply frames).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Op {
    Hello = 1,
    /// The client's proof of the shared secret, after a HELLO reply with a challenge.
    Auth = 2,
    Lookup = 10,
    Forget = 11,
    Getattr = 12,
    Setattr = 13,
    Readlink = 14,
    Mknod = 15,
    Mkdir = 16,
    Unlink = 17,
    Rmdir = 18,
    Symlink = 19,
    Rename = 20,
    Link = 21,
    Open = 22,
    Read = 23,
    Write = 24,
    Statfs = 25,
    Release = 26,
    Fsync = 27,
    Setxattr = 28,
    Getxattr = 29,
    Listxattr = 30,
    Removexattr = 31,
    Flush = 32,
    Opendir = 33,
    Readdir = 34,
    Releasedir = 35,
    Fsyncdir = 36,
    Access = 37,
    Create = 38,
    Fallocate = 39,
    Lseek = 40,
    CopyFileRange = 41,
    Ping = 42,
    /// After a reconnect: open `node` again under the handle number the client already
    /// uses, so the kernel's open files go on working (protocol.md §15).
    Reopen = 43,
    /// After a reconnect: LOOKUP that counts the lookups the client's kernel already
    /// holds on the node (protocol.md §15).
    Reclaim = 44,
    /// Take, change or drop a lock without waiting (EAGAIN on conflict): the client
    /// retries a blocking request itself, so it can be interrupted (protocol.md §16).
    Setlk = 45,
    /// The first lock that would conflict with the one described.
    Getlk = 46,
    /// Drop every lock one owner holds on a node (the owner's file was closed).
    LockRelease = 47,
    /// Unnamed files made ahead in a directory, for creations answered before the server
    /// has made them (feature `SPARE_FILES`, protocol.md §17).
    Spares = 48,
    /// Gives a spare file its name: the creation the client already answered.
    Bind = 49,
    /// A freshness barrier: answered only after every invalidation for the host changes
    /// the server's watcher had queued when it read the request has been pushed
    /// (protocol.md §18).
    Sync = 50,
}

impl Op {
    pub fn from_u16(v: u16) -> Result<Op, DecodeError> {
        use Op::*;
        Ok(match v {
            1 => Hello,
            2 => Auth,
            10 => Lookup,
            11 => Forget,
            12 => Getattr,
            13 => Setattr,
            14 => Readlink,
            15 => Mknod,
            16 => Mkdir,
            17 => Unlink,
            18 => Rmdir,
            19 => Symlink,
            20 => Rename,
            21 => Link,
            22 => Open,
            23 => Read,
            24 => Write,
            25 => Statfs,
            26 => Release,
            27 => Fsync,
            28 => Setxattr,
            29 => Getxattr,
            30 => Listxattr,
            31 => Removexattr,
            32 => Flush,
            33 => Opendir,
            34 => Readdir,
            35 => Releasedir,
            36 => Fsyncdir,
            37 => Access,
            38 => Create,
            39 => Fallocate,
            40 => Lseek,
            41 => CopyFileRange,
            42 => Ping,
            43 => Reopen,
            44 => Reclaim,
            45 => Setlk,
            46 => Getlk,
            47 => LockRelease,
            48 => Spares,
            49 => Bind,
            50 => Sync,
            other => return Err(DecodeError::UnknownOp(other)),
        })
    }

    /// True for operations that change the export (refused by read-only exports).
    pub fn mutates(self) -> bool {
        use Op::*;
        matches!(
            self,
            Setattr
                | Mknod
                | Mkdir
                | Unlink
                | Rmdir
                | Symlink
                | Rename
                | Link
                | Write
                | Setxattr
                | Removexattr
                | Create
                | Fallocate
                | CopyFileRange
                | Spares
                | Bind
        )
    }
}

/// Lock types on the wire (not the host's F_RDLCK numbers, which differ between systems).
pub mod lock_type {
    pub const UNLOCK: u8 = 0;
    pub const READ: u8 = 1;
    pub const WRITE: u8 = 2;

    /// The wire type for fcntl's F_RDLCK, F_WRLCK (anything else: UNLOCK).
    // The casts are needed on Darwin, where the constants are i16.
    #[allow(clippy::unnecessary_cast)]
    pub fn from_fcntl(typ: i32) -> u8 {
        // The constants are i16 on Darwin and i32 on Linux.
        match typ {
            t if t == libc::F_RDLCK as i32 => READ,
            t if t == libc::F_WRLCK as i32 => WRITE,
            _ => UNLOCK,
        }
    }

    /// fcntl's type for a wire type.
    #[allow(clippy::unnecessary_cast)]
    pub fn to_fcntl(typ: u8) -> i32 {
        (match typ {
            READ => libc::F_RDLCK,
            WRITE => libc::F_WRLCK,
            _ => libc::F_UNLCK,
        }) as i32
    }
}

/// A byte-range lock as SETLK and GETLK describe it. `end` is inclusive; `u64::MAX` means
/// "to the end of the file, however long it grows".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockSpec {
    /// Whose lock: the guest kernel's lock owner (a process's file table for POSIX locks,
    /// an open file for flock and OFD locks).
    pub owner: u64,
    /// flock(2) semantics (whole file, independent of POSIX locks) instead of fcntl.
    pub flock: bool,
    /// One of [`lock_type`].
    pub typ: u8,
    pub start: u64,
    pub end: u64,
}

/// Who is asking, as the guest kernel reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

/// Seconds and nanoseconds since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Timespec {
    pub sec: i64,
    pub nsec: u32,
}

/// A time to set: leave it, set it to the server's clock, or to a given value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetTime {
    Omit,
    Now,
    At(Timespec),
}

/// File attributes as the host reported them (96 bytes on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr {
    /// The node id; the guest shows it as st_ino.
    pub ino: NodeId,
    pub size: u64,
    pub blocks: u64,
    pub atime: Timespec,
    pub mtime: Timespec,
    pub ctime: Timespec,
    /// Full st_mode: file type and permission bits.
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u64,
    pub blksize: u32,
    /// Reserved, sent as 0: replies are ordered against invalidations by push sequence on the
    /// client (docs/protocol.md §13).
    pub seq: u64,
}

/// A name bound to a node, with its attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub node: NodeId,
    pub generation: u64,
    /// [`entry_flags`]: what the server promises about this entry.
    pub flags: u32,
    pub attr: Attr,
}

/// Entry flags.
pub mod entry_flags {
    /// The server watches this entry (its directory, and the node itself if it is a
    /// directory) and will push an invalidation when it changes on the host: the client may
    /// cache it without a timeout.
    pub const WATCHED: u32 = 1;
    /// Only in a CREATE reply: the server made this file just now (it did not open one that
    /// was there), so it has no extended attributes yet.
    pub const NEW_FILE: u32 = 2;
}

/// setattr field mask.
pub mod setattr_valid {
    pub const MODE: u32 = 1;
    pub const UID: u32 = 2;
    pub const GID: u32 = 4;
    pub const SIZE: u32 = 8;
    /// The change is made for a process without CAP_FSETID: clear set-user-ID, and
    /// set-group-ID where Linux would (group-executable, or the caller not in the file's
    /// group), as the host kernel would for such a writer. Alone (no other bit), it is sent
    /// after a write that the guest kernel marked FUSE_WRITE_KILL_SUIDGID.
    pub const KILL_SUIDGID: u32 = 16;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SetAttr {
    /// Which of mode, uid, gid, size are set (see [`setattr_valid`]).
    pub valid: u32,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub atime: SetTime,
    pub mtime: SetTime,
}

/// Open reply flags.
pub mod open_flags {
    /// The guest may keep its page cache for this file.
    pub const KEEP_CACHE: u32 = 1;
    /// Bypass the guest page cache (FIFOs, sockets).
    pub const DIRECT_IO: u32 = 2;
}

/// Size of one entry in the kernel's readdir buffer: a fuse_dirent (24 bytes) or a
/// fuse_direntplus (128 + 24 bytes), plus the name, padded to 8 bytes. A READDIR's `size`
/// is counted in these.
pub fn fuse_dirent_size(name_len: usize, plus: bool) -> usize {
    let base = if plus { 152 } else { 24 };
    (base + name_len).next_multiple_of(8)
}

/// A directory entry. `entry` is present in readdirplus replies (except for "." and "..");
/// each present entry counts as one lookup of its node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// The entry's node id; the guest shows it as d_ino.
    pub ino: NodeId,
    /// Cookie to continue listing after this entry.
    pub offset: u64,
    /// DT_* type (Linux numbering).
    pub kind: u8,
    pub name: Bytes,
    pub entry: Option<Entry>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Statfs {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
}

/// A request from the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Hello(Hello),
    Auth {
        proof: [u8; crate::auth::PROOF_LEN],
    },
    Lookup {
        parent: NodeId,
        name: Bytes,
    },
    /// One-way: drop `count` lookups of each node.
    Forget {
        nodes: Vec<(NodeId, u64)>,
    },
    Getattr {
        node: NodeId,
        fh: Option<HandleId>,
    },
    Setattr {
        node: NodeId,
        fh: Option<HandleId>,
        set: SetAttr,
    },
    Readlink {
        node: NodeId,
    },
    Mknod {
        parent: NodeId,
        name: Bytes,
        mode: u32,
        rdev: u64,
        umask: u32,
    },
    Mkdir {
        parent: NodeId,
        name: Bytes,
        mode: u32,
        umask: u32,
    },
    Unlink {
        parent: NodeId,
        name: Bytes,
    },
    Rmdir {
        parent: NodeId,
        name: Bytes,
    },
    Symlink {
        parent: NodeId,
        name: Bytes,
        target: Bytes,
    },
    Rename {
        parent: NodeId,
        name: Bytes,
        new_parent: NodeId,
        new_name: Bytes,
        flags: u32,
    },
    Link {
        node: NodeId,
        new_parent: NodeId,
        new_name: Bytes,
    },
    Open {
        node: NodeId,
        flags: u32,
    },
    Read {
        node: NodeId,
        fh: Option<HandleId>,
        offset: u64,
        size: u32,
    },
    /// The data runs to the end of the frame.
    Write {
        node: NodeId,
        fh: Option<HandleId>,
        offset: u64,
        data: Bytes,
    },
    Statfs {
        node: NodeId,
    },
    Release {
        node: NodeId,
        fh: Option<HandleId>,
    },
    Fsync {
        node: NodeId,
        fh: Option<HandleId>,
        datasync: bool,
    },
    Setxattr {
        node: NodeId,
        name: Bytes,
        value: Bytes,
        flags: u32,
    },
    Getxattr {
        node: NodeId,
        name: Bytes,
        size: u32,
    },
    Listxattr {
        node: NodeId,
        size: u32,
    },
    Removexattr {
        node: NodeId,
        name: Bytes,
    },
    Flush {
        node: NodeId,
        fh: Option<HandleId>,
        lock_owner: u64,
    },
    Opendir {
        node: NodeId,
        flags: u32,
    },
    Readdir {
        node: NodeId,
        fh: Option<HandleId>,
        offset: u64,
        size: u32,
        plus: bool,
    },
    Releasedir {
        node: NodeId,
        fh: Option<HandleId>,
    },
    Fsyncdir {
        node: NodeId,
        fh: Option<HandleId>,
        datasync: bool,
    },
    Access {
        node: NodeId,
        mask: u32,
    },
    Create {
        parent: NodeId,
        name: Bytes,
        mode: u32,
        umask: u32,
        flags: u32,
    },
    Fallocate {
        node: NodeId,
        fh: Option<HandleId>,
        offset: u64,
        length: u64,
        mode: u32,
    },
    Lseek {
        node: NodeId,
        fh: Option<HandleId>,
        offset: i64,
        whence: u32,
    },
    CopyFileRange {
        node_in: NodeId,
        fh_in: Option<HandleId>,
        offset_in: u64,
        node_out: NodeId,
        fh_out: Option<HandleId>,
        offset_out: u64,
        len: u64,
        flags: u32,
    },
    Ping,
    Reopen {
        node: NodeId,
        fh: Option<HandleId>,
        flags: u32,
        dir: bool,
    },
    Reclaim {
        parent: NodeId,
        name: Bytes,
        lookups: u64,
    },
    /// `generation`: how many times the client has released this owner's locks on this
    /// node (LOCK_RELEASE); the server drops an older generation's locks first.
    Setlk {
        node: NodeId,
        lock: LockSpec,
        generation: u64,
    },
    Getlk {
        node: NodeId,
        lock: LockSpec,
    },
    /// Drops the owner's locks of `generation` and before, not those of a later SETLK.
    LockRelease {
        node: NodeId,
        owner: u64,
        generation: u64,
    },
    /// Makes up to `count` unnamed files in directory `parent`, owned as a file the caller
    /// created there would be; each is a node the client holds once (FORGET drops one never
    /// bound).
    Spares {
        parent: NodeId,
        count: u32,
    },
    /// Links spare file `node` into `parent` as `name` (failing with EEXIST if the name is
    /// taken), with permissions `mode & !umask` and access and modification times `time`.
    /// Sent again in a later session, it makes the file anew under the id `node` if the
    /// earlier session did not name it (protocol.md §17).
    Bind {
        parent: NodeId,
        name: Bytes,
        node: NodeId,
        mode: u32,
        umask: u32,
        time: Timespec,
    },
    /// A freshness barrier (no fields): the reply comes after the invalidations of every
    /// host change the server's watcher had queued when it read this request.
    Sync,
}

/// A successful reply. Which variant an op gets is fixed (see [`Request::op`] and the table
/// in docs/protocol.md), so the decoder needs the op to parse it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Hello(HelloReply),
    /// lookup, mknod, mkdir, symlink, link
    Entry(Entry),
    /// getattr, setattr
    Attr(Attr),
    /// readlink, read
    Data(Bytes),
    /// unlink, rmdir, rename, release, fsync, setxattr, removexattr, flush, releasedir,
    /// fsyncdir, access, fallocate, ping, sync
    Empty,
    /// open, opendir
    Open {
        fh: HandleId,
        flags: u32,
    },
    /// write, copy_file_range
    Written {
        size: u64,
        /// The file's attributes right after a WRITE: only when feature `WRITE_ATTR` was
        /// granted (then always, for WRITE; never for copy_file_range), encoded after
        /// `size`. Boxed: it would double the size of every `Reply`.
        attr: Option<Box<Attr>>,
    },
    Statfs(Statfs),
    /// getxattr, listxattr: the size (when asked with size 0) or the value.
    XattrSize(u32),
    XattrData(Bytes),
    Dir {
        entries: Vec<DirEntry>,
        /// The listing reached the end of the directory: a request for what follows the
        /// last entry would get none. Only when feature `DIR_END` was granted (then a
        /// byte 1 after the entries); false otherwise.
        end: bool,
    },
    Create {
        entry: Entry,
        fh: Option<HandleId>,
        flags: u32,
        /// The parent directory's attributes right after the creation: only when feature
        /// `DIR_ATTR` was granted (then always), encoded after `flags`.
        /// Boxed: it would double the size of every `Reply`.
        dir: Option<Box<Attr>>,
    },
    Lseek {
        offset: u64,
    },
    /// getlk: the conflicting lock (`typ` UNLOCK and the rest 0 when there is none). `pid`
    /// is the host's, 0 when unknown (locks of open file descriptions have none).
    Lock {
        typ: u8,
        start: u64,
        end: u64,
        pid: u32,
    },
    /// spares: the files made, fewer than asked when the server ran short.
    Spares(Vec<Entry>),
}

impl LockSpec {
    fn encode(&self, e: &mut Encoder) {
        e.u64(self.owner)
            .bool(self.flock)
            .u8(self.typ)
            .u64(self.start)
            .u64(self.end);
    }

    fn decode(d: &mut Decoder) -> Result<Self, DecodeError> {
        let owner = d.u64()?;
        let flock = d.bool()?;
        let typ = Self::decode_type(d)?;
        let (start, end) = (d.u64()?, d.u64()?);
        if start > end {
            return Err(DecodeError::Invalid {
                field: "lock range",
                value: start,
            });
        }
        Ok(LockSpec {
            owner,
            flock,
            typ,
            start,
            end,
        })
    }

    fn decode_type(d: &mut Decoder) -> Result<u8, DecodeError> {
        match d.u8()? {
            t @ (lock_type::UNLOCK | lock_type::READ | lock_type::WRITE) => Ok(t),
            v => Err(DecodeError::Invalid {
                field: "lock type",
                value: v as u64,
            }),
        }
    }
}

impl Timespec {
    fn encode(&self, e: &mut Encoder) {
        e.i64(self.sec).u32(self.nsec);
    }
    fn decode(d: &mut Decoder) -> Result<Self, DecodeError> {
        let sec = d.i64()?;
        let nsec = d.u32()?;
        if nsec >= 1_000_000_000 {
            return Err(DecodeError::Invalid {
                field: "nsec",
                value: nsec as u64,
            });
        }
        Ok(Timespec { sec, nsec })
    }
}

impl SetTime {
    fn encode(&self, e: &mut Encoder) {
        match self {
            SetTime::Omit => e.u8(0).i64(0).u32(0),
            SetTime::Now => e.u8(1).i64(0).u32(0),
            SetTime::At(t) => {
                e.u8(2);
                t.encode(e);
                e
            }
        };
    }
    fn decode(d: &mut Decoder) -> Result<Self, DecodeError> {
        let tag = d.u8()?;
        let t = Timespec::decode(d)?;
        match tag {
            0 => Ok(SetTime::Omit),
            1 => Ok(SetTime::Now),
            2 => Ok(SetTime::At(t)),
            v => Err(DecodeError::Invalid {
                field: "settime",
                value: v as u64,
            }),
        }
    }
}

impl Attr {
    pub const WIRE_LEN: usize = 96;

    /// Attributes of node `ino` with every other field 0, to fill in.
    pub fn of(ino: NodeId) -> Attr {
        Attr {
            ino,
            size: 0,
            blocks: 0,
            atime: Timespec::default(),
            mtime: Timespec::default(),
            ctime: Timespec::default(),
            mode: 0,
            nlink: 0,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 0,
            seq: 0,
        }
    }
    pub fn encode(&self, e: &mut Encoder) {
        e.node(self.ino).u64(self.size).u64(self.blocks);
        self.atime.encode(e);
        self.mtime.encode(e);
        self.ctime.encode(e);
        e.u32(self.mode)
            .u32(self.nlink)
            .u32(self.uid)
            .u32(self.gid)
            .u64(self.rdev)
            .u32(self.blksize)
            .u64(self.seq);
    }
    pub fn decode(d: &mut Decoder) -> Result<Self, DecodeError> {
        Ok(Attr {
            ino: d.node()?,
            size: d.u64()?,
            blocks: d.u64()?,
            atime: Timespec::decode(d)?,
            mtime: Timespec::decode(d)?,
            ctime: Timespec::decode(d)?,
            mode: d.u32()?,
            nlink: d.u32()?,
            uid: d.u32()?,
            gid: d.u32()?,
            rdev: d.u64()?,
            blksize: d.u32()?,
            seq: d.u64()?,
        })
    }
}

impl Entry {
    pub fn encode(&self, e: &mut Encoder) {
        e.node(self.node).u64(self.generation).u32(self.flags);
        self.attr.encode(e);
    }
    pub fn decode(d: &mut Decoder) -> Result<Self, DecodeError> {
        Ok(Entry {
            node: d.node()?,
            generation: d.u64()?,
            flags: d.u32()?,
            attr: Attr::decode(d)?,
        })
    }
}

/// setxattr's flag for "fail if the attribute exists" (Linux's value, as on the wire).
pub const XATTR_CREATE: u32 = 1;

impl Request {
    /// Whether executing the request twice has the same outcome as executing it once, so
    /// that a client may send it again when a connection broke before the reply came: reads,
    /// positioned writes, absolute attribute changes, syncs. Creating, removing and renaming
    /// are not (the second try would fail with EEXIST or ENOENT), nor is an exclusive
    /// setxattr or a removexattr.
    pub fn retry_safe(&self) -> bool {
        use Request::*;
        match self {
            Setxattr { flags, .. } => *flags & XATTR_CREATE == 0,
            // A handle the first try opened went with its (broken) session.
            Open { flags, .. } => {
                *flags & (libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC) as u32 == 0
            }
            Opendir { .. } => true,
            Mknod { .. }
            | Mkdir { .. }
            | Unlink { .. }
            | Rmdir { .. }
            | Symlink { .. }
            | Rename { .. }
            | Link { .. }
            | Create { .. }
            // Spare files go with their session (a BIND sent again makes its file anew, or
            // finds it made: protocol.md §17).
            | Spares { .. }
            | Removexattr { .. }
            | Release { .. }
            | Releasedir { .. }
            | Hello(_)
            | Auth { .. }
            | Forget { .. }
            | Reopen { .. }
            | Reclaim { .. } => false,
            _ => true,
        }
    }

    pub fn op(&self) -> Op {
        use Request::*;
        match self {
            Hello(_) => Op::Hello,
            Auth { .. } => Op::Auth,
            Lookup { .. } => Op::Lookup,
            Forget { .. } => Op::Forget,
            Getattr { .. } => Op::Getattr,
            Setattr { .. } => Op::Setattr,
            Readlink { .. } => Op::Readlink,
            Mknod { .. } => Op::Mknod,
            Mkdir { .. } => Op::Mkdir,
            Unlink { .. } => Op::Unlink,
            Rmdir { .. } => Op::Rmdir,
            Symlink { .. } => Op::Symlink,
            Rename { .. } => Op::Rename,
            Link { .. } => Op::Link,
            Open { .. } => Op::Open,
            Read { .. } => Op::Read,
            Write { .. } => Op::Write,
            Statfs { .. } => Op::Statfs,
            Release { .. } => Op::Release,
            Fsync { .. } => Op::Fsync,
            Setxattr { .. } => Op::Setxattr,
            Getxattr { .. } => Op::Getxattr,
            Listxattr { .. } => Op::Listxattr,
            Removexattr { .. } => Op::Removexattr,
            Flush { .. } => Op::Flush,
            Opendir { .. } => Op::Opendir,
            Readdir { .. } => Op::Readdir,
            Releasedir { .. } => Op::Releasedir,
            Fsyncdir { .. } => Op::Fsyncdir,
            Access { .. } => Op::Access,
            Create { .. } => Op::Create,
            Fallocate { .. } => Op::Fallocate,
            Lseek { .. } => Op::Lseek,
            CopyFileRange { .. } => Op::CopyFileRange,
            Ping => Op::Ping,
            Reopen { .. } => Op::Reopen,
            Reclaim { .. } => Op::Reclaim,
            Setlk { .. } => Op::Setlk,
            Getlk { .. } => Op::Getlk,
            LockRelease { .. } => Op::LockRelease,
            Spares { .. } => Op::Spares,
            Bind { .. } => Op::Bind,
            Sync => Op::Sync,
        }
    }

    /// Encodes a whole request frame.
    pub fn to_frame(&self, id: u64, caller: Caller) -> Vec<u8> {
        let flags = if matches!(self, Request::Forget { .. }) {
            FLAG_NO_REPLY
        } else {
            0
        };
        let extra = match self {
            Request::Write { data, .. } => data.len(),
            _ => 64,
        };
        let mut f = FrameBuilder::new(FrameKind::Request, flags, self.op() as u16, id, 64 + extra);
        self.encode_body(caller, &mut f.enc);
        f.finish()
    }

    fn encode_body(&self, c: Caller, e: &mut Encoder) {
        use Request::*;
        e.u32(c.uid).u32(c.gid).u32(c.pid);
        match self {
            Hello(h) => h.encode(e),
            Auth { proof } => {
                e.rest(proof);
            }
            Lookup { parent, name } | Unlink { parent, name } | Rmdir { parent, name } => {
                e.node(*parent).name(name);
            }
            Forget { nodes } => {
                e.u32(nodes.len() as u32);
                for (n, c) in nodes {
                    e.node(*n).u64(*c);
                }
            }
            Getattr { node, fh } | Release { node, fh } | Releasedir { node, fh } => {
                e.node(*node).handle(*fh);
            }
            Setattr { node, fh, set } => {
                e.node(*node)
                    .handle(*fh)
                    .u32(set.valid)
                    .u32(set.mode)
                    .u32(set.uid)
                    .u32(set.gid)
                    .u64(set.size);
                set.atime.encode(e);
                set.mtime.encode(e);
            }
            Readlink { node } | Statfs { node } => {
                e.node(*node);
            }
            Mknod {
                parent,
                name,
                mode,
                rdev,
                umask,
            } => {
                e.node(*parent).name(name).u32(*mode).u64(*rdev).u32(*umask);
            }
            Mkdir {
                parent,
                name,
                mode,
                umask,
            } => {
                e.node(*parent).name(name).u32(*mode).u32(*umask);
            }
            Symlink {
                parent,
                name,
                target,
            } => {
                e.node(*parent).name(name).blob(target);
            }
            Rename {
                parent,
                name,
                new_parent,
                new_name,
                flags,
            } => {
                e.node(*parent)
                    .name(name)
                    .node(*new_parent)
                    .name(new_name)
                    .u32(*flags);
            }
            Link {
                node,
                new_parent,
                new_name,
            } => {
                e.node(*node).node(*new_parent).name(new_name);
            }
            Open { node, flags } | Opendir { node, flags } => {
                e.node(*node).u32(*flags);
            }
            Read {
                node,
                fh,
                offset,
                size,
            } => {
                e.node(*node).handle(*fh).u64(*offset).u32(*size);
            }
            Write {
                node,
                fh,
                offset,
                data,
            } => {
                e.node(*node).handle(*fh).u64(*offset).rest(data);
            }
            Fsync { node, fh, datasync } | Fsyncdir { node, fh, datasync } => {
                e.node(*node).handle(*fh).bool(*datasync);
            }
            Setxattr {
                node,
                name,
                value,
                flags,
            } => {
                e.node(*node).name(name).u32(*flags).blob(value);
            }
            Getxattr { node, name, size } => {
                e.node(*node).name(name).u32(*size);
            }
            Listxattr { node, size } => {
                e.node(*node).u32(*size);
            }
            Removexattr { node, name } => {
                e.node(*node).name(name);
            }
            Flush {
                node,
                fh,
                lock_owner,
            } => {
                e.node(*node).handle(*fh).u64(*lock_owner);
            }
            Readdir {
                node,
                fh,
                offset,
                size,
                plus,
            } => {
                e.node(*node)
                    .handle(*fh)
                    .u64(*offset)
                    .u32(*size)
                    .bool(*plus);
            }
            Access { node, mask } => {
                e.node(*node).u32(*mask);
            }
            Create {
                parent,
                name,
                mode,
                umask,
                flags,
            } => {
                e.node(*parent)
                    .name(name)
                    .u32(*mode)
                    .u32(*umask)
                    .u32(*flags);
            }
            Fallocate {
                node,
                fh,
                offset,
                length,
                mode,
            } => {
                e.node(*node)
                    .handle(*fh)
                    .u64(*offset)
                    .u64(*length)
                    .u32(*mode);
            }
            Lseek {
                node,
                fh,
                offset,
                whence,
            } => {
                e.node(*node).handle(*fh).i64(*offset).u32(*whence);
            }
            CopyFileRange {
                node_in,
                fh_in,
                offset_in,
                node_out,
                fh_out,
                offset_out,
                len,
                flags,
            } => {
                e.node(*node_in)
                    .handle(*fh_in)
                    .u64(*offset_in)
                    .node(*node_out)
                    .handle(*fh_out)
                    .u64(*offset_out)
                    .u64(*len)
                    .u32(*flags);
            }
            Ping | Sync => {}
            Reopen {
                node,
                fh,
                flags,
                dir,
            } => {
                e.node(*node).handle(*fh).u32(*flags).bool(*dir);
            }
            Reclaim {
                parent,
                name,
                lookups,
            } => {
                e.node(*parent).name(name).u64(*lookups);
            }
            Setlk {
                node,
                lock,
                generation,
            } => {
                e.node(*node);
                lock.encode(e);
                e.u64(*generation);
            }
            Getlk { node, lock } => {
                e.node(*node);
                lock.encode(e);
            }
            LockRelease {
                node,
                owner,
                generation,
            } => {
                e.node(*node).u64(*owner).u64(*generation);
            }
            Spares { parent, count } => {
                e.node(*parent).u32(*count);
            }
            Bind {
                parent,
                name,
                node,
                mode,
                umask,
                time,
            } => {
                e.node(*parent)
                    .name(name)
                    .node(*node)
                    .u32(*mode)
                    .u32(*umask);
                time.encode(e);
            }
        }
    }

    /// Decodes a request body for `op`. Bulk data is sliced from `body`, not copied.
    pub fn decode(op: u16, body: Bytes) -> Result<(Caller, Request), DecodeError> {
        use Request::*;
        let op = Op::from_u16(op)?;
        let mut d = Decoder::new(body);
        let caller = Caller {
            uid: d.u32()?,
            gid: d.u32()?,
            pid: d.u32()?,
        };
        let r = match op {
            Op::Hello => Hello(crate::handshake::Hello::decode(&mut d)?),
            Op::Auth => Auth { proof: d.array()? },
            Op::Lookup => Lookup {
                parent: d.node()?,
                name: d.name()?,
            },
            Op::Unlink => Unlink {
                parent: d.node()?,
                name: d.name()?,
            },
            Op::Rmdir => Rmdir {
                parent: d.node()?,
                name: d.name()?,
            },
            Op::Forget => {
                let n = d.u32()? as usize;
                // Each item is 16 bytes: bound the allocation by what the frame can hold.
                let mut nodes = Vec::with_capacity(n.min(4096));
                for _ in 0..n {
                    nodes.push((d.node()?, d.u64()?));
                }
                Forget { nodes }
            }
            Op::Getattr => Getattr {
                node: d.node()?,
                fh: d.handle()?,
            },
            Op::Release => Release {
                node: d.node()?,
                fh: d.handle()?,
            },
            Op::Releasedir => Releasedir {
                node: d.node()?,
                fh: d.handle()?,
            },
            Op::Setattr => Setattr {
                node: d.node()?,
                fh: d.handle()?,
                set: SetAttr {
                    valid: d.u32()?,
                    mode: d.u32()?,
                    uid: d.u32()?,
                    gid: d.u32()?,
                    size: d.u64()?,
                    atime: SetTime::decode(&mut d)?,
                    mtime: SetTime::decode(&mut d)?,
                },
            },
            Op::Readlink => Readlink { node: d.node()? },
            Op::Statfs => Statfs { node: d.node()? },
            Op::Mknod => Mknod {
                parent: d.node()?,
                name: d.name()?,
                mode: d.u32()?,
                rdev: d.u64()?,
                umask: d.u32()?,
            },
            Op::Mkdir => Mkdir {
                parent: d.node()?,
                name: d.name()?,
                mode: d.u32()?,
                umask: d.u32()?,
            },
            Op::Symlink => Symlink {
                parent: d.node()?,
                name: d.name()?,
                target: d.blob()?,
            },
            Op::Rename => Rename {
                parent: d.node()?,
                name: d.name()?,
                new_parent: d.node()?,
                new_name: d.name()?,
                flags: d.u32()?,
            },
            Op::Link => Link {
                node: d.node()?,
                new_parent: d.node()?,
                new_name: d.name()?,
            },
            Op::Open => Open {
                node: d.node()?,
                flags: d.u32()?,
            },
            Op::Opendir => Opendir {
                node: d.node()?,
                flags: d.u32()?,
            },
            Op::Read => Read {
                node: d.node()?,
                fh: d.handle()?,
                offset: d.u64()?,
                size: d.u32()?,
            },
            Op::Write => Write {
                node: d.node()?,
                fh: d.handle()?,
                offset: d.u64()?,
                data: d.rest(),
            },
            Op::Fsync => Fsync {
                node: d.node()?,
                fh: d.handle()?,
                datasync: d.bool()?,
            },
            Op::Fsyncdir => Fsyncdir {
                node: d.node()?,
                fh: d.handle()?,
                datasync: d.bool()?,
            },
            Op::Setxattr => Setxattr {
                node: d.node()?,
                name: d.name()?,
                flags: d.u32()?,
                value: d.blob()?,
            },
            Op::Getxattr => Getxattr {
                node: d.node()?,
                name: d.name()?,
                size: d.u32()?,
            },
            Op::Listxattr => Listxattr {
                node: d.node()?,
                size: d.u32()?,
            },
            Op::Removexattr => Removexattr {
                node: d.node()?,
                name: d.name()?,
            },
            Op::Flush => Flush {
                node: d.node()?,
                fh: d.handle()?,
                lock_owner: d.u64()?,
            },
            Op::Readdir => Readdir {
                node: d.node()?,
                fh: d.handle()?,
                offset: d.u64()?,
                size: d.u32()?,
                plus: d.bool()?,
            },
            Op::Access => Access {
                node: d.node()?,
                mask: d.u32()?,
            },
            Op::Create => Create {
                parent: d.node()?,
                name: d.name()?,
                mode: d.u32()?,
                umask: d.u32()?,
                flags: d.u32()?,
            },
            Op::Fallocate => Fallocate {
                node: d.node()?,
                fh: d.handle()?,
                offset: d.u64()?,
                length: d.u64()?,
                mode: d.u32()?,
            },
            Op::Lseek => Lseek {
                node: d.node()?,
                fh: d.handle()?,
                offset: d.i64()?,
                whence: d.u32()?,
            },
            Op::CopyFileRange => CopyFileRange {
                node_in: d.node()?,
                fh_in: d.handle()?,
                offset_in: d.u64()?,
                node_out: d.node()?,
                fh_out: d.handle()?,
                offset_out: d.u64()?,
                len: d.u64()?,
                flags: d.u32()?,
            },
            Op::Ping => Ping,
            Op::Sync => Sync,
            Op::Reopen => Reopen {
                node: d.node()?,
                fh: d.handle()?,
                flags: d.u32()?,
                dir: d.bool()?,
            },
            Op::Reclaim => Reclaim {
                parent: d.node()?,
                name: d.name()?,
                lookups: d.u64()?,
            },
            Op::Setlk => Setlk {
                node: d.node()?,
                lock: LockSpec::decode(&mut d)?,
                generation: d.u64()?,
            },
            Op::Getlk => Getlk {
                node: d.node()?,
                lock: LockSpec::decode(&mut d)?,
            },
            Op::LockRelease => LockRelease {
                node: d.node()?,
                owner: d.u64()?,
                generation: d.u64()?,
            },
            Op::Spares => Spares {
                parent: d.node()?,
                count: d.u32()?,
            },
            Op::Bind => Bind {
                parent: d.node()?,
                name: d.name()?,
                node: d.node()?,
                mode: d.u32()?,
                umask: d.u32()?,
                time: Timespec::decode(&mut d)?,
            },
        };
        d.finish()?;
        Ok((caller, r))
    }
}

/// The status word for an error reply. 0 would read as success and values above i32::MAX
/// as a (negative) protocol error, so neither may be sent as an errno: both become EIO.
fn wire_status(errno: WireErrno) -> i32 {
    match i32::try_from(errno.0) {
        Ok(v) if v > 0 => v,
        _ => WireErrno::EIO.0 as i32,
    }
}

/// Encodes a reply frame: status 0 and the result, or the errno alone.
pub fn reply_frame(op: u16, id: u64, result: &Result<Reply, WireErrno>) -> Vec<u8> {
    let cap = match result {
        Ok(Reply::Data(d)) | Ok(Reply::XattrData(d)) => d.len() + 8,
        Ok(Reply::Dir { entries: v, .. }) => v.len() * (Attr::WIRE_LEN + 64) + 8,
        _ => 160,
    };
    let mut f = FrameBuilder::new(FrameKind::Reply, 0, op, id, cap);
    let e = &mut f.enc;
    match result {
        Err(errno) => {
            e.i32(wire_status(*errno));
        }
        Ok(r) => {
            e.i32(0);
            r.encode(e);
        }
    }
    f.finish()
}

/// Builds a data reply (read, readlink) by letting `fill` write straight into the frame
/// buffer, so bulk data is copied once, from the file into the outgoing frame.
pub fn data_reply_frame(
    op: u16,
    id: u64,
    max: usize,
    fill: impl FnOnce(&mut [u8]) -> Result<usize, WireErrno>,
) -> Vec<u8> {
    // Never build (or allocate for) a frame the peer would refuse as too long.
    let max = max.min(MAX_FRAME_LEN - FRAME_HEADER_LEN - 8);
    let mut f = FrameBuilder::new(FrameKind::Reply, 0, op, id, 8 + max);
    let start = f.enc.buf.len();
    f.enc.i32(0).u32(0);
    let data_at = f.enc.buf.len();
    f.enc.buf.resize(data_at + max, 0);
    match fill(&mut f.enc.buf[data_at..]) {
        Ok(n) => {
            let n = n.min(max);
            f.enc.buf.truncate(data_at + n);
            f.enc.buf[data_at - 4..data_at].copy_from_slice(&(n as u32).to_le_bytes());
        }
        Err(errno) => {
            f.enc.buf.truncate(start);
            f.enc.i32(wire_status(errno));
        }
    }
    f.finish()
}

impl Reply {
    fn encode(&self, e: &mut Encoder) {
        match self {
            Reply::Hello(h) => h.encode(e),
            Reply::Entry(en) => en.encode(e),
            Reply::Attr(a) => a.encode(e),
            Reply::Data(d) => {
                e.blob(d);
            }
            Reply::XattrData(d) => {
                e.u8(1).blob(d);
            }
            Reply::Empty => {}
            Reply::Open { fh, flags } => {
                e.handle(Some(*fh)).u32(*flags);
            }
            Reply::Written { size, attr } => {
                e.u64(*size);
                if let Some(a) = attr {
                    a.encode(e);
                }
            }
            Reply::Statfs(s) => {
                e.u64(s.blocks)
                    .u64(s.bfree)
                    .u64(s.bavail)
                    .u64(s.files)
                    .u64(s.ffree)
                    .u32(s.bsize)
                    .u32(s.namelen)
                    .u32(s.frsize);
            }
            Reply::XattrSize(n) => {
                e.u8(0).u32(*n);
            }
            Reply::Dir { entries, end } => {
                e.u32(entries.len() as u32);
                for de in entries {
                    e.node(de.ino).u64(de.offset).u8(de.kind).name(&de.name);
                    match &de.entry {
                        Some(en) => {
                            e.u8(1);
                            en.encode(e);
                        }
                        None => {
                            e.u8(0);
                        }
                    }
                }
                if *end {
                    e.u8(1);
                }
            }
            Reply::Create {
                entry,
                fh,
                flags,
                dir,
            } => {
                entry.encode(e);
                e.handle(*fh).u32(*flags);
                if let Some(a) = dir {
                    a.encode(e);
                }
            }
            Reply::Lseek { offset } => {
                e.u64(*offset);
            }
            Reply::Lock {
                typ,
                start,
                end,
                pid,
            } => {
                e.u8(*typ).u64(*start).u64(*end).u32(*pid);
            }
            Reply::Spares(entries) => {
                e.u32(entries.len() as u32);
                for entry in entries {
                    entry.encode(e);
                }
            }
        }
    }

    /// Decodes a reply body for a request of `op`. The outer result is a protocol error
    /// (close the connection); the inner one is the operation's outcome.
    pub fn decode(op: u16, body: Bytes) -> Result<Result<Reply, WireErrno>, DecodeError> {
        let op = Op::from_u16(op)?;
        let mut d = Decoder::new(body);
        let status = d.i32()?;
        if status != 0 {
            d.finish()?;
            if status < 0 {
                return Err(DecodeError::Invalid {
                    field: "status",
                    value: status as i64 as u64,
                });
            }
            return Ok(Err(WireErrno(status as u32)));
        }
        let r = match op {
            // AUTH is answered with the HELLO reply it unlocks.
            Op::Hello | Op::Auth => Reply::Hello(HelloReply::decode(&mut d)?),
            Op::Lookup | Op::Reclaim | Op::Mknod | Op::Mkdir | Op::Symlink | Op::Link => {
                Reply::Entry(Entry::decode(&mut d)?)
            }
            Op::Getattr | Op::Setattr => Reply::Attr(Attr::decode(&mut d)?),
            Op::Readlink | Op::Read => Reply::Data(d.blob()?),
            Op::Open | Op::Opendir => Reply::Open {
                fh: d.issued_handle()?,
                flags: d.u32()?,
            },
            Op::Write | Op::CopyFileRange => Reply::Written {
                size: d.u64()?,
                attr: if d.remaining() > 0 {
                    Some(Box::new(Attr::decode(&mut d)?))
                } else {
                    None
                },
            },
            Op::Statfs => Reply::Statfs(Statfs {
                blocks: d.u64()?,
                bfree: d.u64()?,
                bavail: d.u64()?,
                files: d.u64()?,
                ffree: d.u64()?,
                bsize: d.u32()?,
                namelen: d.u32()?,
                frsize: d.u32()?,
            }),
            Op::Getxattr | Op::Listxattr => match d.u8()? {
                0 => Reply::XattrSize(d.u32()?),
                1 => Reply::XattrData(d.blob()?),
                v => {
                    return Err(DecodeError::Invalid {
                        field: "xattr reply tag",
                        value: v as u64,
                    })
                }
            },
            Op::Readdir => {
                let n = d.u32()? as usize;
                let mut v = Vec::with_capacity(n.min(1024));
                for _ in 0..n {
                    let ino = d.node()?;
                    let offset = d.u64()?;
                    let kind = d.u8()?;
                    let name = d.name()?;
                    let entry = if d.bool()? {
                        Some(Entry::decode(&mut d)?)
                    } else {
                        None
                    };
                    v.push(DirEntry {
                        ino,
                        offset,
                        kind,
                        name,
                        entry,
                    });
                }
                let end = d.marker();
                Reply::Dir { entries: v, end }
            }
            // BIND finishes a creation: it is answered as one.
            Op::Create | Op::Bind => Reply::Create {
                entry: Entry::decode(&mut d)?,
                fh: d.handle()?,
                flags: d.u32()?,
                dir: if d.remaining() > 0 {
                    Some(Box::new(Attr::decode(&mut d)?))
                } else {
                    None
                },
            },
            Op::Lseek => Reply::Lseek { offset: d.u64()? },
            Op::Spares => {
                let n = d.u32()? as usize;
                let mut v = Vec::with_capacity(n.min(1024));
                for _ in 0..n {
                    v.push(Entry::decode(&mut d)?);
                }
                Reply::Spares(v)
            }
            Op::Getlk => Reply::Lock {
                typ: LockSpec::decode_type(&mut d)?,
                start: d.u64()?,
                end: d.u64()?,
                pid: d.u32()?,
            },
            Op::Forget
            | Op::Unlink
            | Op::Rmdir
            | Op::Rename
            | Op::Release
            | Op::Fsync
            | Op::Setxattr
            | Op::Removexattr
            | Op::Flush
            | Op::Releasedir
            | Op::Fsyncdir
            | Op::Access
            | Op::Fallocate
            | Op::Ping
            | Op::Sync
            | Op::Reopen
            | Op::Setlk
            | Op::LockRelease => Reply::Empty,
        };
        d.finish()?;
        Ok(Ok(r))
    }
}
