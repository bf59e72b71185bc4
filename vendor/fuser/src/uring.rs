//! FUSE over io_uring (Linux 6.14 and later; added for Tether, see VENDORED.md).
//!
//! With `/dev/fuse`, a request wakes whichever reader thread the kernel picks, usually on
//! another CPU, and the caller sleeps until that thread writes the reply. Over io_uring the
//! kernel keeps one queue per CPU and hands a request to the queue of the CPU its caller
//! runs on; each queue here is served by one thread pinned to that CPU, so a request the
//! file system answers at once costs two context switches on one CPU instead of two
//! wake-ups across CPUs.
//!
//! Each queue owns `depth` ring entries: a header buffer (`fuse_uring_req_header`) and a
//! payload buffer (a slice of one mapping per queue), all registered with
//! FUSE_IO_URING_CMD_REGISTER when the queue starts.
//! A request arrives as the completion of an entry's command; its reply is written into
//! the same buffers and handed back with FUSE_IO_URING_CMD_COMMIT_AND_FETCH, which also
//! waits for the entry's next request. Only the queue's thread submits (the kernel copies
//! requests into the buffers in the submitter's context); a reply made on another thread
//! is queued and the queue's thread woken through an eventfd. Notifications, FORGET and
//! INTERRUPT still use `/dev/fuse`.

use std::cell::UnsafeCell;
use std::io;
use std::os::fd::AsFd;
use std::os::fd::AsRawFd;
use std::os::fd::FromRawFd;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;

use io_uring::IoUring;
use io_uring::opcode;
use io_uring::squeue;
use io_uring::types;
use log::debug;
use log::warn;
use parking_lot::Mutex;

use crate::channel::ChannelSender;

const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;
/// `user_data` of the eventfd read that wakes a queue's thread.
const WAKE: u64 = u64::MAX;
/// Most entries a queue has.
const MAX_ENTRIES: usize = 256;
/// Sizes of `struct fuse_in_header` and `struct fuse_out_header`.
const IN_HEADER: usize = 40;
const OUT_HEADER: usize = 16;
/// The per-opcode argument area of the header buffer.
const OP_IN: usize = 128;

/// `struct fuse_uring_ent_in_out`.
#[repr(C)]
#[derive(Default)]
struct EntInOut {
    flags: u64,
    commit_id: u64,
    payload_sz: u32,
    padding: u32,
    reserved: u64,
}

/// `struct fuse_uring_req_header`: `fuse_in_header` (or, for the reply, `fuse_out_header`),
/// the opcode's argument struct, and the entry's sizes.
#[repr(C)]
struct Headers {
    in_out: [u8; 128],
    op_in: [u8; OP_IN],
    ent: EntInOut,
}

const _: () = assert!(std::mem::size_of::<Headers>() == 288);
const _: () = assert!(std::mem::size_of::<EntInOut>() == 32);
const _: () = assert!(std::mem::size_of::<squeue::Entry128>() == 128);

/// One ring entry's header buffer (its payload buffer is in the queue's `Payloads`). The
/// kernel writes a request into them while the entry's command is pending; from its
/// completion until its commit they belong to the request's one reply.
struct Entry {
    headers: UnsafeCell<Headers>,
    commit_id: AtomicU64,
}

impl Entry {
    fn new() -> Entry {
        Entry {
            headers: UnsafeCell::new(Headers {
                in_out: [0; 128],
                op_in: [0; OP_IN],
                ent: EntInOut::default(),
            }),
            commit_id: AtomicU64::new(0),
        }
    }
}

/// The payload buffers of a queue's entries, one anonymous mapping: its pages cost memory
/// only once a request uses them. Mapped, not allocated, because a refused allocation
/// aborts the process, while a refused mapping (strict overcommit, `RLIMIT_AS`: 256 MiB a
/// CPU) only means the session goes on through `/dev/fuse`.
struct Payloads {
    base: *mut u8,
    each: usize,
    count: usize,
}

// SAFETY: the mapping is owned by its queue; a buffer in it is used by one party at a time,
// handed over as its entry is (see `Entry`).
unsafe impl Send for Payloads {}
unsafe impl Sync for Payloads {}

impl Payloads {
    fn map(count: usize, each: usize) -> io::Result<Payloads> {
        let len = count
            .checked_mul(each)
            .filter(|&l| l > 0)
            .ok_or_else(|| io::Error::other(format!("{count} payload buffers of {each} bytes")))?;
        // SAFETY: a fresh private anonymous mapping, no existing memory involved.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(
                e.kind(),
                format!("cannot map {len} bytes for {count} ring payload buffers: {e}"),
            ));
        }
        Ok(Payloads {
            base: base.cast(),
            each,
            count,
        })
    }

    /// Entry `i`'s payload buffer.
    fn of(&self, i: usize) -> *mut [u8] {
        assert!(i < self.count, "entry {i} of {}", self.count);
        // SAFETY: within the mapping, by the assertion.
        std::ptr::slice_from_raw_parts_mut(unsafe { self.base.add(i * self.each) }, self.each)
    }
}

impl Drop for Payloads {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `map`; the queue (and so any use of
        // its buffers, by us or by the kernel's registered commands) ends before this.
        unsafe { libc::munmap(self.base.cast(), self.count * self.each) };
    }
}

/// Requests served through the rings, and entries the kernel refused or lost.
#[derive(Debug, Default)]
pub struct UringStats {
    /// Requests received through io_uring.
    pub requests: AtomicU64,
    /// Queues whose thread is serving.
    pub queues: AtomicU64,
    /// Commands the kernel failed (other than at unmount).
    pub failed: AtomicU64,
}

/// A CPU's io_uring, held by the session until the thread that serves its queue takes it.
pub(crate) struct Ring(IoUring<squeue::Entry128>);

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Ring")
    }
}

/// A CPU's queue: its entries, and replies waiting to be committed.
pub(crate) struct RingQueue {
    qid: u16,
    /// All registered when the queue's thread starts. A request that finds every entry
    /// busy waits in the kernel for the next commit (an entry registered later does not
    /// take it), and a blocked lock waiter holds its entry until the lock is granted: with
    /// fewer entries than waiters, a later request could wait for the lock's release.
    entries: Box<[Entry]>,
    payloads: Payloads,
    /// Entries whose reply is written, to commit.
    replied: Mutex<Vec<u16>>,
    /// Set while the queue's thread waits in the kernel: only then does a reply from
    /// another thread need to wake it.
    sleeping: AtomicBool,
    wake: OwnedFd,
    /// Where the kernel puts the eventfd's count: owned by the queue, not the thread's
    /// stack, because a read still armed when the thread ends may complete later.
    wake_buf: UnsafeCell<[u8; 8]>,
    stop: AtomicBool,
    /// The `/dev/fuse` channel, for backing files.
    pub(crate) channel: ChannelSender,
}

// SAFETY: an entry's buffers are used by one party at a time, handed over through the
// kernel (command completion, commit) and the `replied` mutex; see `Entry`.
unsafe impl Sync for RingQueue {}

thread_local! {
    /// The queue served by this thread, if it serves one: its replies need no wake-up.
    static SERVING: std::cell::Cell<*const RingQueue> = const { std::cell::Cell::new(std::ptr::null()) };
}

/// The reply route of a request that came through a ring.
#[derive(Clone)]
pub(crate) struct RingReply {
    queue: Arc<RingQueue>,
    entry: u16,
}

impl std::fmt::Debug for RingReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RingReply(q{} e{})", self.queue.qid, self.entry)
    }
}

impl RingReply {
    pub(crate) fn channel(&self) -> &ChannelSender {
        &self.queue.channel
    }

    /// Writes the reply (`fuse_out_header` first) into the entry and queues its commit.
    pub(crate) fn send(&self, data: &[io::IoSlice<'_>]) -> io::Result<()> {
        let entry = self.queue.entry(self.entry);
        // SAFETY: the entry's buffers belong to this request's one reply until its commit
        // is queued below.
        let (headers, payload) = unsafe {
            (
                &mut *entry.headers.get(),
                &mut *self.queue.payloads.of(self.entry as usize),
            )
        };
        let total: usize = data.iter().map(|b| b.len()).sum();
        if total < OUT_HEADER || total - OUT_HEADER > payload.len() {
            self.fail();
            return Err(io::Error::other(format!(
                "a reply of {total} bytes does not fit a ring entry"
            )));
        }
        // The header goes to the header buffer, the rest to the payload; a slice may
        // straddle the two.
        let mut at = 0usize;
        for b in data {
            let mut b: &[u8] = b;
            if at < OUT_HEADER {
                let n = b.len().min(OUT_HEADER - at);
                headers.in_out[at..at + n].copy_from_slice(&b[..n]);
                at += n;
                b = &b[n..];
            }
            if b.is_empty() {
                continue;
            }
            payload[at - OUT_HEADER..at - OUT_HEADER + b.len()].copy_from_slice(b);
            at += b.len();
        }
        headers.ent.payload_sz = (total - OUT_HEADER) as u32;
        self.commit();
        Ok(())
    }

    /// Answers the entry's request with EIO: an entry never committed is lost to the
    /// queue, and its caller waits for good.
    pub(crate) fn fail(&self) {
        let Some(entry) = self.queue.entries.get(self.entry as usize) else {
            return; // not an entry of ours: no request to answer
        };
        // SAFETY: as in `send`: the entry's buffers are this request's until its commit.
        let headers = unsafe { &mut *entry.headers.get() };
        // The commit id is the request's unique id (request_of stores it first).
        let unique = entry.commit_id.load(Ordering::Acquire);
        headers.in_out[0..4].copy_from_slice(&(OUT_HEADER as u32).to_ne_bytes());
        headers.in_out[4..8].copy_from_slice(&(-libc::EIO).to_ne_bytes());
        headers.in_out[8..16].copy_from_slice(&unique.to_ne_bytes());
        headers.ent.payload_sz = 0;
        self.commit();
    }

    /// Queues the entry's commit, waking the queue's thread if it sleeps.
    fn commit(&self) {
        self.queue.replied.lock().push(self.entry);
        if !std::ptr::eq(SERVING.with(|s| s.get()), Arc::as_ptr(&self.queue))
            && self.queue.sleeping.swap(false, Ordering::SeqCst)
        {
            self.queue.wake();
        }
    }
}

impl std::fmt::Debug for RingQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RingQueue({})", self.qid)
    }
}

impl RingQueue {
    fn entry(&self, i: u16) -> &Entry {
        &self.entries[i as usize]
    }

    /// The iovecs that register entry `i`'s buffers.
    fn iovecs_of(&self, i: usize) -> Box<[libc::iovec; 2]> {
        let e = &self.entries[i];
        // SAFETY: only the address is taken; the kernel owns the buffer from REGISTER on.
        let payload = unsafe { &mut *self.payloads.of(i) };
        Box::new([
            libc::iovec {
                iov_base: e.headers.get().cast(),
                iov_len: std::mem::size_of::<Headers>(),
            },
            libc::iovec {
                iov_base: payload.as_mut_ptr().cast(),
                iov_len: payload.len(),
            },
        ])
    }

    fn wake(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a valid buffer to our eventfd.
        unsafe { libc::write(self.wake.as_raw_fd(), one.as_ptr().cast(), 8) };
    }

    /// Asks the queue's thread to stop (the session is over).
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.wake();
    }
}

/// The CPUs the kernel may run a caller on: it makes one queue per possible CPU and
/// expects every one to be registered before it uses any.
pub(crate) fn possible_cpus() -> io::Result<usize> {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    let last = s
        .trim()
        .split(',')
        .filter_map(|r| r.rsplit('-').next()?.parse::<usize>().ok())
        .max()
        .ok_or_else(|| io::Error::other(format!("cannot parse possible CPUs {s:?}")))?;
    Ok(last + 1)
}

/// Makes every queue and its ring, before FUSE_INIT is answered: once the kernel is told
/// that io_uring will be used, requests wait until every queue is registered, so a ring
/// that cannot be made must be known before.
pub(crate) fn make_queues(
    depth: u16,
    payload: usize,
    channel: &ChannelSender,
) -> io::Result<Vec<(Arc<RingQueue>, Ring)>> {
    let cpus = possible_cpus()?;
    let depth = depth.clamp(1, MAX_ENTRIES as u16);
    let mut queues = Vec::with_capacity(cpus);
    for qid in 0..cpus {
        // Room for a command per entry and the eventfd read.
        let ring = IoUring::<squeue::Entry128>::builder()
            .setup_cqsize(2 * (depth as u32 + 1))
            .build(depth as u32 + 1)?;
        let payloads = Payloads::map(depth as usize, payload)?;
        // SAFETY: eventfd has no memory preconditions.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd was just created and is owned here.
        let wake = unsafe { OwnedFd::from_raw_fd(fd) };
        let queue = Arc::new(RingQueue {
            qid: qid as u16,
            entries: (0..depth).map(|_| Entry::new()).collect(),
            payloads,
            replied: Mutex::new(Vec::new()),
            sleeping: AtomicBool::new(false),
            wake_buf: UnsafeCell::new([0; 8]),
            wake,
            stop: AtomicBool::new(false),
            channel: channel.clone(),
        });
        queues.push((queue, Ring(ring)));
    }
    Ok(queues)
}

/// The command SQE of `entry`: REGISTER (with its buffers) or COMMIT_AND_FETCH.
fn command(
    dev: i32,
    q: &RingQueue,
    entry: u16,
    cmd_op: u32,
    iov: Option<&[libc::iovec; 2]>,
) -> squeue::Entry128 {
    // struct fuse_uring_cmd_req { u64 flags; u64 commit_id; u16 qid; u8 padding[6]; }
    let mut cmd = [0u8; 80];
    if cmd_op == CMD_COMMIT_AND_FETCH {
        let id = q.entry(entry).commit_id.load(Ordering::Acquire);
        cmd[8..16].copy_from_slice(&id.to_ne_bytes());
    }
    cmd[16..18].copy_from_slice(&q.qid.to_ne_bytes());
    let sqe = opcode::UringCmd80::new(types::Fd(dev), cmd_op)
        .cmd(cmd)
        .addr(iov.map(|iov| iov.as_ptr() as u64))
        .build()
        .user_data(entry as u64);
    // The kernel takes the number of iovecs from sqe->len (offset 24), which the builder
    // does not set: two, the headers and the payload.
    // SAFETY: Entry128 is repr(C) over two io_uring_sqe-sized halves; len is a u32 at 24.
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
    raw[24..28].copy_from_slice(&2u32.to_ne_bytes());
    // SAFETY: as above, the same bytes with len set.
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
}

/// Pins the calling thread to `cpu`; the kernel queues a request on the queue of the CPU
/// its caller runs on, so this thread shares that CPU with its callers.
fn pin_to(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET stays within it for cpu < CPU_SETSIZE.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if cpu < libc::CPU_SETSIZE as usize {
            libc::CPU_SET(cpu, &mut set);
            if libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) != 0 {
                debug!("io_uring queue {cpu}: not pinned: {}", io::Error::last_os_error());
            }
        }
    }
}

/// Serves queue `q` on its `ring` until the connection ends or the session stops it:
/// registers entries, then hands each request to `dispatch` (with a contiguous
/// `/dev/fuse`-style copy of it and its reply route) and commits the replies.
pub(crate) fn serve(
    q: Arc<RingQueue>,
    ring: Ring,
    dev: &impl AsFd,
    stats: &UringStats,
    dispatch: impl FnMut(&[u8], RingReply),
) -> io::Result<()> {
    pin_to(q.qid as usize);
    SERVING.with(|s| s.set(Arc::as_ptr(&q)));
    stats.queues.fetch_add(1, Ordering::Relaxed);
    let result = serve_until_ended(&q, ring, dev.as_fd().as_raw_fd(), stats, dispatch);
    stats.queues.fetch_sub(1, Ordering::Relaxed);
    SERVING.with(|s| s.set(std::ptr::null()));
    result
}

fn serve_until_ended(
    q: &Arc<RingQueue>,
    Ring(mut ring): Ring,
    dev: i32,
    stats: &UringStats,
    mut dispatch: impl FnMut(&[u8], RingReply),
) -> io::Result<()> {
    let wake_ptr = q.wake_buf.get().cast::<u8>();
    let wake_read = || {
        squeue::Entry128::from(
            opcode::Read::new(types::Fd(q.wake.as_raw_fd()), wake_ptr, 8)
                .build()
                .user_data(WAKE),
        )
    };
    // SAFETY: wake_buf lives as long as the queue, which outlives its ring.
    unsafe { ring.submission().push(&wake_read()) }.map_err(|_| sq_full(q))?;
    // The iovecs of the REGISTERs: the kernel reads them when it takes the command, which
    // an interrupted submission may put off.
    let iovecs: Vec<Box<[libc::iovec; 2]>> =
        (0..q.entries.len()).map(|i| q.iovecs_of(i)).collect();
    {
        let mut sq = ring.submission();
        for (i, iov) in iovecs.iter().enumerate() {
            // SAFETY: the buffers live as long as the queue (held by `q`), the iovecs as
            // long as this function.
            unsafe { sq.push(&command(dev, q, i as u16, CMD_REGISTER, Some(iov))) }
                .map_err(|_| sq_full(q))?;
        }
    }
    let mut buf: Vec<u8> = Vec::new();
    let mut ready: Vec<(u64, i32)> = Vec::new();
    loop {
        if q.stop.load(Ordering::SeqCst) {
            return Ok(());
        }
        // Announce the wait, then look once more: a reply queued before the announcement
        // is committed now, one queued after it wakes the thread.
        q.sleeping.store(true, Ordering::SeqCst);
        let replied = std::mem::take(&mut *q.replied.lock());
        {
            let mut sq = ring.submission();
            for e in replied {
                // SAFETY: COMMIT_AND_FETCH carries no pointers.
                unsafe { sq.push(&command(dev, q, e, CMD_COMMIT_AND_FETCH, None)) }
                    .map_err(|_| sq_full(q))?;
            }
        }
        let waited = ring.submit_and_wait(1);
        q.sleeping.store(false, Ordering::SeqCst);
        match waited {
            Ok(_) => {}
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EBUSY | libc::EAGAIN)) => {}
            Err(e) => return Err(e),
        }
        ready.clear();
        ready.extend(ring.completion().map(|c| (c.user_data(), c.result())));
        let mut ended = false;
        for &(user_data, res) in &ready {
            if user_data == WAKE {
                // SAFETY: as for the first read.
                unsafe { ring.submission().push(&wake_read()) }.map_err(|_| sq_full(q))?;
                continue;
            }
            if res < 0 {
                let e = -res;
                if matches!(e, libc::ENOTCONN | libc::ECANCELED | libc::ECONNABORTED | libc::ENODEV) {
                    ended = true;
                } else {
                    stats.failed.fetch_add(1, Ordering::Relaxed);
                    warn!(
                        "io_uring queue {}: entry {user_data}: {}",
                        q.qid,
                        io::Error::from_raw_os_error(e)
                    );
                }
                continue;
            }
            let entry = user_data as u16;
            let route = RingReply {
                queue: q.clone(),
                entry,
            };
            let Some(request) = request_of(q, entry, &mut buf) else {
                warn!("io_uring queue {}: entry {entry}: malformed request", q.qid);
                stats.failed.fetch_add(1, Ordering::Relaxed);
                // Answered all the same, or its caller would wait for good.
                route.fail();
                continue;
            };
            stats.requests.fetch_add(1, Ordering::Relaxed);
            dispatch(request, route);
        }
        if ended {
            return Ok(());
        }
    }
}

/// Cannot happen: the ring has room for a command per entry and the eventfd read.
fn sq_full(q: &RingQueue) -> io::Error {
    io::Error::other(format!("io_uring queue {}: submission queue full", q.qid))
}

/// The request in `entry`, laid out as `/dev/fuse` delivers it (in_header, the opcode's
/// arguments, the payload), in `buf`.
fn request_of<'b>(q: &RingQueue, entry: u16, buf: &'b mut Vec<u8>) -> Option<&'b [u8]> {
    let e = q.entries.get(entry as usize)?;
    // SAFETY: the kernel completed the entry's command: its buffers hold a request and
    // nobody else uses them until the reply.
    let (headers, payload) = unsafe { (&*e.headers.get(), &*q.payloads.of(entry as usize)) };
    // First: even a malformed request is committed (answered EIO) under this id.
    e.commit_id.store(headers.ent.commit_id, Ordering::Release);
    let len = u32::from_ne_bytes(headers.in_out[0..4].try_into().ok()?) as usize;
    let payload_sz = headers.ent.payload_sz as usize;
    let op_sz = len.checked_sub(IN_HEADER)?.checked_sub(payload_sz)?;
    if op_sz > OP_IN || payload_sz > payload.len() {
        return None;
    }
    buf.clear();
    buf.extend_from_slice(&headers.in_out[..IN_HEADER]);
    buf.extend_from_slice(&headers.op_in[..op_sz]);
    buf.extend_from_slice(&payload[..payload_sz]);
    Some(&buf[..])
}
