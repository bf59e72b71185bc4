//! The lock helper: a process of its own that holds, with plain POSIX (fcntl) locks, the
//! union of the byte-range locks the portable backend keeps for its guests, file by file,
//! so that host processes see them (docs/macos.md).
//!
//! Why a process: POSIX locks belong to a process, merge all of its owners into one, and
//! all of a process's locks on a file go when it closes *any* descriptor of that file. The
//! server opens and closes descriptors of locked files all the time, so it keeps the
//! guests' locks itself ([`Portable::setlk`](super::portable::Portable)); the helper opens
//! nothing, holds one descriptor per file (its own open file description, sent by the
//! server) and closes it only when the server says the file has no lock left.
//!
//! The helper is `tether lock-helper` (hidden), started by the server with its standard
//! input one end of a Unix socket pair; it exits when the server's end closes, which drops
//! its locks, so a server that exits or is killed leaves none behind. One request at a
//! time, each answered: SET (F_SETLK on the file's descriptor, sent with the first SET of a
//! file by SCM_RIGHTS), LOWER (the same for a release or a downgrade), GET (F_GETLK, which
//! never reports the helper's own locks: it finds host processes' locks only) and CLOSE.
//! Only calls macOS has too.
//!
//! If the helper dies, the server logs it and goes on without it: guests still exclude
//! each other, and the host's locks are still seen, but the host no longer sees theirs.

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tether_proto::WireErrno;

use super::{RangeLock, SysResult};

/// A host file, as (st_dev, st_ino).
pub type FileKey = (u64, u64);

/// How to start the helper: a program (normally this binary) and its arguments.
#[derive(Debug, Clone)]
pub struct HelperCommand {
    pub program: PathBuf,
    pub args: Vec<OsString>,
    pub env: Vec<(OsString, OsString)>,
}

impl HelperCommand {
    /// This very binary with `args` (`tether lock-helper`).
    pub fn this_binary(args: &[&str]) -> io::Result<HelperCommand> {
        Ok(HelperCommand {
            program: std::env::current_exe()?,
            args: args.iter().map(OsString::from).collect(),
            env: Vec::new(),
        })
    }
}

const SET: u8 = 1;
const GET: u8 = 2;
const CLOSE: u8 = 3;
/// A SET that never asks for more than the helper holds (a release or a downgrade).
const LOWER: u8 = 4;

/// op, pad, type (i16), st_dev, st_ino, start, len: native byte order (one machine).
const REQUEST_LEN: usize = 36;
/// errno (0: done), type (i16), pad, start, len, pid.
const REPLY_LEN: usize = 28;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Request {
    op: u8,
    typ: i16,
    key: FileKey,
    start: i64,
    len: i64,
}

impl Request {
    fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[0] = self.op;
        b[2..4].copy_from_slice(&self.typ.to_ne_bytes());
        b[4..12].copy_from_slice(&self.key.0.to_ne_bytes());
        b[12..20].copy_from_slice(&self.key.1.to_ne_bytes());
        b[20..28].copy_from_slice(&self.start.to_ne_bytes());
        b[28..36].copy_from_slice(&self.len.to_ne_bytes());
        b
    }

    fn decode(b: &[u8; REQUEST_LEN]) -> Request {
        let u = |r: std::ops::Range<usize>| u64::from_ne_bytes(b[r].try_into().unwrap());
        Request {
            op: b[0],
            typ: i16::from_ne_bytes([b[2], b[3]]),
            key: (u(4..12), u(12..20)),
            start: u(20..28) as i64,
            len: u(28..36) as i64,
        }
    }
}

/// The helper's answer: an errno, or for GET the conflicting lock (type F_UNLCK: none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Reply {
    errno: i32,
    lock: RangeLock,
}

impl Reply {
    fn encode(&self) -> [u8; REPLY_LEN] {
        let mut b = [0u8; REPLY_LEN];
        b[0..4].copy_from_slice(&self.errno.to_ne_bytes());
        b[4..6].copy_from_slice(&self.lock.typ.to_ne_bytes());
        b[8..16].copy_from_slice(&self.lock.start.to_ne_bytes());
        b[16..24].copy_from_slice(&self.lock.len.to_ne_bytes());
        b[24..28].copy_from_slice(&self.lock.pid.to_ne_bytes());
        b
    }

    fn decode(b: &[u8; REPLY_LEN]) -> Reply {
        let i64_at = |at: usize| i64::from_ne_bytes(b[at..at + 8].try_into().unwrap());
        Reply {
            errno: i32::from_ne_bytes(b[0..4].try_into().unwrap()),
            lock: RangeLock {
                typ: i16::from_ne_bytes([b[4], b[5]]),
                start: i64_at(8),
                len: i64_at(16),
                pid: i32::from_ne_bytes(b[24..28].try_into().unwrap()),
            },
        }
    }

    fn result(&self) -> SysResult<()> {
        match self.errno {
            0 => Ok(()),
            e => Err(WireErrno::from_host(e)),
        }
    }
}

/// The server's side: the helper process and the files it holds a descriptor of. Every
/// call is made under the portable backend's lock table mutex, so the helper's locks
/// change in the same order as the table.
pub struct LockHelper {
    sock: UnixStream,
    pid: u32,
    /// Set before the server lets the helper go, so that its exit is not reported.
    leaving: Arc<AtomicBool>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    dead: bool,
    /// The files the helper holds, with the owners (server descriptors) that set locks on
    /// them since it has: when the last of them closes, the helper closes the file.
    files: HashMap<FileKey, HashSet<RawFd>>,
}

impl LockHelper {
    /// Starts the helper with `cmd`, its standard input the other end of a socket pair.
    pub fn spawn(cmd: &HelperCommand) -> io::Result<LockHelper> {
        let (ours, theirs) = UnixStream::pair()?;
        // A helper stuck for this long is treated as dead (its calls never wait).
        ours.set_read_timeout(Some(Duration::from_secs(10)))?;
        let mut child = Command::new(&cmd.program)
            .args(&cmd.args)
            .envs(cmd.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::from(OwnedFd::from(theirs)))
            .stdout(Stdio::null())
            .spawn()?;
        let pid = child.id();
        let leaving = Arc::new(AtomicBool::new(false));
        let told = leaving.clone();
        // Reaps it, and says so if it goes while the server still needs it.
        std::thread::Builder::new()
            .name("lock-helper-wait".into())
            .spawn(move || {
                let status = child.wait();
                if !told.load(Ordering::Relaxed) {
                    tracing::warn!(
                        "the lock helper (pid {pid}) exited ({status:?}): host processes no \
                         longer see the guests' byte-range locks (guests still exclude each \
                         other)"
                    );
                }
            })?;
        tracing::debug!("lock helper started (pid {pid})");
        Ok(LockHelper {
            sock: ours,
            pid,
            leaving,
            state: Mutex::default(),
        })
    }

    /// The helper's process id: the `l_pid` host processes see for the guests' locks.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Takes `typ` (F_RDLCK or F_WRLCK) over `span` (first and last byte) in the helper for
    /// `owner`, a server descriptor of file `key`: the one F_SETLK that makes the helper's
    /// locks in `span` the union's (the caller found no other owner's conflicting lock
    /// there, so after the change the union is `typ` throughout `span`). It fails with
    /// EAGAIN if a host process holds a conflicting lock, atomically: nothing changes.
    ///
    /// `open` gives the helper its descriptor of a file it does not hold yet, which it
    /// starts to hold only while the server holds no lock on the file (`unlocked`), so
    /// that every owner with a lock there is known. None when the helper does not mirror
    /// the file (gone, or the file could not be opened): the caller asks the host itself.
    pub fn lock(
        &self,
        key: FileKey,
        owner: RawFd,
        unlocked: bool,
        open: impl FnOnce() -> SysResult<OwnedFd>,
        typ: i16,
        span: (u64, u64),
    ) -> Option<SysResult<()>> {
        let mut st = self.state.lock().unwrap();
        if st.dead {
            return None;
        }
        let fresh = if st.files.contains_key(&key) {
            None
        } else if !unlocked {
            return None;
        } else {
            match open() {
                Ok(fd) => Some(fd),
                Err(e) => {
                    tracing::debug!("lock helper: file {key:?} not mirrored: {e:?}");
                    return None;
                }
            }
        };
        let (start, len) = fcntl_range(span);
        let req = Request {
            op: SET,
            typ,
            key,
            start,
            len,
        };
        let reply = self.call(&mut st, req, fresh.as_ref().map(|f| f.as_fd()))?;
        st.files.entry(key).or_default().insert(owner);
        Some(reply.result())
    }

    /// Sets the helper's locks on `key` over `span` to the union of `held` (type, first
    /// and last byte) there, after locks were dropped or downgraded: never more than it
    /// holds, so no host process can refuse it.
    pub fn restate(
        &self,
        key: FileKey,
        span: (u64, u64),
        held: impl Iterator<Item = (i16, u64, u64)>,
    ) {
        let mut st = self.state.lock().unwrap();
        if st.dead || !st.files.contains_key(&key) {
            return;
        }
        for (typ, first, last) in union_over(span, held) {
            let (start, len) = fcntl_range((first, last));
            let req = Request {
                op: LOWER,
                typ,
                key,
                start,
                len,
            };
            match self.call(&mut st, req, None).map(|r| r.result()) {
                Some(Ok(())) => {}
                Some(Err(e)) => tracing::warn!("lock helper: {req:?} refused: {e:?}"),
                None => return,
            }
        }
    }

    /// `owner` (a server descriptor of `key`) is closing, its locks already restated: the
    /// helper closes the file once no owner that locked it is left.
    pub fn owner_closing(&self, key: FileKey, owner: RawFd) {
        let mut st = self.state.lock().unwrap();
        let Some(owners) = st.files.get_mut(&key) else {
            return;
        };
        owners.remove(&owner);
        if owners.is_empty() {
            st.files.remove(&key);
            let req = Request {
                op: CLOSE,
                typ: libc::F_UNLCK as i16,
                key,
                start: 0,
                len: 0,
            };
            self.call(&mut st, req, None);
        }
    }

    /// The first host process's lock on `key` that conflicts with `lock` (F_GETLK in the
    /// helper, which does not see its own); None when the helper does not hold the file.
    pub fn host_conflict(
        &self,
        key: FileKey,
        lock: &RangeLock,
    ) -> Option<SysResult<Option<RangeLock>>> {
        let mut st = self.state.lock().unwrap();
        if st.dead || !st.files.contains_key(&key) {
            return None;
        }
        let req = Request {
            op: GET,
            typ: lock.typ,
            key,
            start: lock.start,
            len: lock.len,
        };
        let reply = self.call(&mut st, req, None)?;
        Some(
            reply
                .result()
                .map(|()| (reply.lock.typ as i32 != libc::F_UNLCK as i32).then_some(reply.lock)),
        )
    }

    /// One request and its reply; None (the helper counted as gone from now on, and its
    /// socket shut so that it exits) if either fails.
    fn call(&self, st: &mut State, req: Request, fd: Option<BorrowedFd<'_>>) -> Option<Reply> {
        let done = send_with_fd(self.sock.as_fd(), &req.encode(), fd).and_then(|()| {
            let mut b = [0u8; REPLY_LEN];
            (&self.sock).read_exact(&mut b)?;
            Ok(Reply::decode(&b))
        });
        match done {
            Ok(r) => Some(r),
            Err(e) => {
                if !self.leaving.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "the lock helper (pid {}) failed ({e}): host processes no longer see \
                         the guests' byte-range locks (guests still exclude each other)",
                        self.pid
                    );
                }
                st.dead = true;
                st.files.clear();
                let _ = self.sock.shutdown(std::net::Shutdown::Both);
                None
            }
        }
    }
}

impl Drop for LockHelper {
    fn drop(&mut self) {
        // Its end of the socket closes with ours: it exits, dropping its locks.
        self.leaving.store(true, Ordering::Relaxed);
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }
}

/// fcntl's (l_start, l_len) for the inclusive byte range `span` (len 0: to the end).
fn fcntl_range((first, last): (u64, u64)) -> (i64, i64) {
    let len = if last == u64::MAX {
        0
    } else {
        (last - first + 1) as i64
    };
    (first as i64, len)
}

/// How strong a lock type is: a write lock over a read lock over none.
fn rank(typ: i16) -> u8 {
    match typ as i32 {
        t if t == libc::F_WRLCK as i32 => 2,
        t if t == libc::F_RDLCK as i32 => 1,
        _ => 0,
    }
}

/// The union of `held` (type, first and last byte) over `span`: consecutive pieces that
/// cover all of it, each with the strongest type held there (F_UNLCK where none is).
pub fn union_over(
    span: (u64, u64),
    held: impl Iterator<Item = (i16, u64, u64)>,
) -> Vec<(i16, u64, u64)> {
    // Exclusive ends as u128: the last byte may be u64::MAX.
    let (s, e) = (span.0 as u128, span.1 as u128 + 1);
    let held: Vec<(i16, u128, u128)> = held
        .map(|(t, a, b)| (t, a as u128, b as u128 + 1))
        .filter(|&(_, a, b)| a < e && b > s)
        .collect();
    let mut points = vec![s, e];
    for &(_, a, b) in &held {
        points.extend([a, b].into_iter().filter(|&p| p > s && p < e));
    }
    points.sort_unstable();
    points.dedup();
    let mut out: Vec<(i16, u64, u64)> = Vec::new();
    for w in points.windows(2) {
        let typ = (held.iter())
            .filter(|&&(_, a, b)| a <= w[0] && w[0] < b)
            .map(|&(t, _, _)| t)
            .max_by_key(|&t| rank(t))
            .filter(|&t| rank(t) > 0)
            .unwrap_or(libc::F_UNLCK as i16);
        let last = (w[1] - 1) as u64;
        match out.last_mut() {
            Some(p) if p.0 == typ => p.2 = last,
            _ => out.push((typ, w[0] as u64, last)),
        }
    }
    out
}

/// Sends `buf` on stream `sock` in one message, with `fd` attached (SCM_RIGHTS).
fn send_with_fd(sock: BorrowedFd<'_>, buf: &[u8], fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: buf.as_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // Room for one descriptor's control message, aligned for cmsghdr.
    let mut control = [0u64; 8];
    // SAFETY: msghdr is plain data; all-zero is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if let Some(fd) = fd {
        let raw: RawFd = fd.as_raw_fd();
        msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
        // SAFETY: CMSG_SPACE computes a size; control is larger than it for one int.
        msg.msg_controllen = unsafe { libc::CMSG_SPACE(size_of::<RawFd>() as u32) } as _;
        // SAFETY: msg_control points at msg_controllen zeroed, aligned bytes, so the first
        // header and its data are inside `control`.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(size_of::<RawFd>() as u32) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(cmsg) as *mut RawFd, raw);
        }
    }
    // SAFETY: msg points at valid buffers that outlive the call.
    let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // A stream may take part of it; the descriptor went with the first byte.
    ManuallyDropStream::new(sock).write_all(&buf[n as usize..])
}

/// Reads one message of exactly `buf.len()` bytes from stream `sock`, with the descriptor
/// attached to it if any. Ok(None) at the end of the stream.
fn recv_with_fd(sock: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<Option<Option<OwnedFd>>> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    let mut control = [0u64; 8];
    // SAFETY: msghdr is plain data; all-zero is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = size_of_val(&control) as _;
    let n = loop {
        // SAFETY: msg points at valid, writable buffers that outlive the call.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, 0) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    if n == 0 {
        return Ok(None);
    }
    let mut fd = None;
    // SAFETY: recvmsg filled msg_control up to msg_controllen; the CMSG macros stay in it.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg) as *const RawFd;
                let count = ((*cmsg).cmsg_len as usize - (data as usize - cmsg as usize))
                    / size_of::<RawFd>();
                for i in 0..count {
                    // A descriptor the kernel just gave this process: ours to own.
                    let got = OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i)));
                    // More than one is a protocol error: keep the first, close the rest.
                    fd.get_or_insert(got);
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    if n < buf.len() {
        ManuallyDropStream::new(sock).read_exact(&mut buf[n..])?;
    }
    Ok(Some(fd))
}

/// A borrowed socket used as a `UnixStream` for plain reads and writes, never closed.
struct ManuallyDropStream(std::mem::ManuallyDrop<UnixStream>);

impl ManuallyDropStream {
    fn new(fd: BorrowedFd<'_>) -> ManuallyDropStream {
        // SAFETY: the stream is never dropped, so the borrowed descriptor is not closed;
        // it is used only while `fd` is borrowed.
        ManuallyDropStream(std::mem::ManuallyDrop::new(unsafe {
            UnixStream::from_raw_fd(fd.as_raw_fd())
        }))
    }
}

impl Read for ManuallyDropStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
}

impl Write for ManuallyDropStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// One file the helper holds locks on.
struct Held {
    fd: OwnedFd,
    /// Write locks need a descriptor open for writing; without one the helper holds a
    /// read lock there instead, which still keeps host writers out.
    writable: bool,
    /// Descriptors of the same file sent again (a server bug): closing one would drop the
    /// helper's locks on the file, so they are kept until the file is closed.
    spare: Vec<OwnedFd>,
}

fn fcntl_lock(
    fd: BorrowedFd<'_>,
    cmd: i32,
    typ: i16,
    start: i64,
    len: i64,
) -> SysResult<RangeLock> {
    let l = RangeLock {
        typ,
        start,
        len,
        pid: 0,
    };
    super::sys::fcntl_lock(fd, cmd, &l)
}

fn errno_of(e: &WireErrno) -> i32 {
    match *e {
        // POSIX lets F_SETLK say either for a conflict.
        WireErrno::EACCES => libc::EAGAIN,
        e => e.to_host(),
    }
}

fn unlocked() -> RangeLock {
    RangeLock {
        typ: libc::F_UNLCK as i16,
        start: 0,
        len: 0,
        pid: 0,
    }
}

/// The helper's answer to `req` (with `fd`, the descriptor that came with it).
fn answer(files: &mut HashMap<FileKey, Held>, req: Request, fd: Option<OwnedFd>) -> Reply {
    let reply = |errno| Reply {
        errno,
        lock: unlocked(),
    };
    if let Some(fd) = fd {
        if let Some(f) = files.get_mut(&req.key) {
            f.spare.push(fd);
        } else {
            // SAFETY: F_GETFL on a descriptor we own.
            let fl = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
            let writable = fl >= 0 && fl & libc::O_ACCMODE != libc::O_RDONLY;
            let held = Held {
                fd,
                writable,
                spare: Vec::new(),
            };
            files.insert(req.key, held);
        }
    }
    if req.op == CLOSE {
        files.remove(&req.key);
        return reply(0);
    }
    let Some(f) = files.get(&req.key) else {
        return reply(libc::EBADF);
    };
    let fd = f.fd.as_fd();
    let (start, len) = (req.start, req.len);
    match req.op {
        SET | LOWER => {
            let mut typ = req.typ;
            if typ as i32 == libc::F_WRLCK as i32 && !f.writable {
                // Lowering, it holds a read lock there already: nothing to check.
                if req.op == SET {
                    match fcntl_lock(fd, libc::F_GETLK, typ, start, len) {
                        Ok(c) if c.typ as i32 != libc::F_UNLCK as i32 => {
                            return reply(libc::EAGAIN)
                        }
                        Ok(_) => {}
                        Err(e) => return reply(errno_of(&e)),
                    }
                }
                typ = libc::F_RDLCK as i16;
            }
            match fcntl_lock(fd, libc::F_SETLK, typ, start, len) {
                Ok(_) => reply(0),
                Err(e) => reply(errno_of(&e)),
            }
        }
        GET => match fcntl_lock(fd, libc::F_GETLK, req.typ, start, len) {
            Ok(lock) if lock.typ as i32 == libc::F_UNLCK as i32 => reply(0),
            Ok(lock) => Reply { errno: 0, lock },
            Err(e) => reply(errno_of(&e)),
        },
        _ => reply(libc::EINVAL),
    }
}

/// The helper's main loop (`tether lock-helper`): requests on standard input, a socket,
/// until the server closes it.
pub fn run() -> io::Result<()> {
    // SAFETY: descriptor 0 is the socket the server gave us, open for the process's life.
    let sock = unsafe { BorrowedFd::borrow_raw(0) };
    // SAFETY: plain calls: a Ctrl-C meant for the server's terminal is the server's
    // business (its exit closes the socket), and no directory is kept busy.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::chdir(c"/".as_ptr());
    }
    let mut files: HashMap<FileKey, Held> = HashMap::new();
    loop {
        let mut b = [0u8; REQUEST_LEN];
        let fd = match recv_with_fd(sock, &mut b) {
            Ok(Some(fd)) => fd,
            // The server is gone: exiting drops every lock.
            Ok(None) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        };
        let reply = answer(&mut files, Request::decode(&b), fd);
        if let Err(e) = ManuallyDropStream::new(sock).write_all(&reply.encode()) {
            return if e.kind() == io::ErrorKind::BrokenPipe {
                Ok(())
            } else {
                Err(e)
            };
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    const R: i16 = libc::F_RDLCK as i16;
    const W: i16 = libc::F_WRLCK as i16;
    const U: i16 = libc::F_UNLCK as i16;

    #[test]
    fn messages_survive_the_trip() {
        let req = Request {
            op: SET,
            typ: W,
            key: (7, u64::MAX),
            start: 12,
            len: 0,
        };
        assert_eq!(Request::decode(&req.encode()), req);
        let reply = Reply {
            errno: libc::EAGAIN,
            lock: RangeLock {
                typ: R,
                start: 3,
                len: 9,
                pid: 4242,
            },
        };
        assert_eq!(Reply::decode(&reply.encode()), reply);
    }

    #[test]
    fn the_union_covers_the_span_with_the_strongest_type_held() {
        let held = [(R, 0, 9), (R, 5, 14), (W, 20, 24), (R, 30, u64::MAX)];
        assert_eq!(
            union_over((0, u64::MAX), held.into_iter()),
            [
                (R, 0, 14),
                (U, 15, 19),
                (W, 20, 24),
                (U, 25, 29),
                (R, 30, u64::MAX)
            ]
        );
        assert_eq!(
            union_over((12, 21), held.into_iter()),
            [(R, 12, 14), (U, 15, 19), (W, 20, 21)]
        );
        assert_eq!(union_over((3, 3), std::iter::empty()), [(U, 3, 3)]);
        assert_eq!(fcntl_range((30, u64::MAX)), (30, 0));
        assert_eq!(fcntl_range((5, 14)), (5, 10));
    }

    /// fcntl(2) `cmd` on `fd` with a flock structure; returns (type, start, len, pid) as
    /// the call left them, and fails the test if the call failed.
    #[cfg(target_os = "linux")]
    pub fn fcntl_fl(
        fd: BorrowedFd<'_>,
        cmd: i32,
        typ: i16,
        start: i64,
        len: i64,
    ) -> (i16, i64, i64, i32) {
        let l = fcntl_lock(fd, cmd, typ, start, len).unwrap();
        (l.typ, l.start, l.len, l.pid)
    }

    /// A file the server may only read is held with read locks where guests hold write
    /// locks (a write lock is still refused if the host holds any lock there); releases
    /// lower what it holds; the last owner's close closes the file, dropping the rest; a
    /// dead helper answers nothing. The host's lock is an OFD lock: this process's closes
    /// would drop a POSIX one.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_read_only_file_is_held_with_read_locks_and_closed_with_its_last_owner() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("f");
        std::fs::write(&path, b"0123456789").unwrap();
        let h = helper();
        let pid = h.pid() as i32;
        let probe = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let seen = |start, len| fcntl_fl(probe.as_fd(), libc::F_GETLK, W, start, len);
        let read_only = || Ok(OwnedFd::from(std::fs::File::open(&path).unwrap()));
        let key = (1, 2);

        assert_eq!(h.lock(key, 100, true, read_only, W, (0, 9)), Some(Ok(())));
        assert_eq!(seen(0, 20), (R, 0, 10, pid));
        assert_eq!(fcntl_fl(probe.as_fd(), libc::F_GETLK, R, 0, 0).0, U);
        assert_eq!(fcntl_fl(probe.as_fd(), libc::F_OFD_SETLK, R, 20, 5).0, R);
        let never = || panic!("the helper holds the file already");
        assert_eq!(
            h.lock(key, 101, false, never, W, (15, 24)),
            Some(Err(WireErrno::EAGAIN))
        );
        let host = h.host_conflict(key, &RangeLock::request(libc::F_WRLCK, 0, 0));
        assert_eq!(
            host.unwrap().unwrap().map(|l| (l.typ, l.start, l.len)),
            Some((R, 20, 5))
        );

        h.restate(key, (0, 9), [(W, 5, 9)].into_iter());
        assert_eq!(seen(0, 20), (R, 5, 5, pid));
        h.owner_closing(key, 100);
        assert_eq!(seen(0, 10).0, R); // owner 101 locked it too
        h.owner_closing(key, 101);
        assert_eq!(seen(0, 20).0, U);

        assert_eq!(h.lock(key, 100, true, read_only, R, (0, 0)), Some(Ok(())));
        // SAFETY: a signal to the helper this test started.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(seen(0, 20).0, U);
        let probe_lock = RangeLock::request(libc::F_WRLCK, 0, 0);
        assert_eq!(h.host_conflict(key, &probe_lock), None);
        assert_eq!(h.lock(key, 100, true, read_only, R, (0, 0)), None);
    }

    /// Runs the helper when a test started this binary as one (see `helper`).
    #[test]
    fn helper_process() {
        if std::env::var_os("TETHER_TEST_LOCK_HELPER").is_some() {
            let r = run();
            std::process::exit(if r.is_ok() { 0 } else { 1 });
        }
    }

    /// A helper: this test binary running only [`helper_process`].
    pub(crate) fn helper() -> LockHelper {
        let exe = std::env::current_exe().unwrap();
        let cmd = HelperCommand {
            program: exe,
            args: [
                "--exact",
                "backend::lock_helper::tests::helper_process",
                "--quiet",
            ]
            .map(OsString::from)
            .to_vec(),
            env: vec![("TETHER_TEST_LOCK_HELPER".into(), "1".into())],
        };
        LockHelper::spawn(&cmd).unwrap()
    }
}
