//! One client connection: handshake, then a pool of workers that take turns reading the
//! next request, execute requests concurrently and write each reply as soon as it is ready
//! (out of order); a watcher thread writes pushed invalidations on the same stream (and a
//! worker that reads a SYNC writes those queued so far before its reply: `Pusher`), and
//! another the locks other sessions freed (LOCK_FREED).

use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use bytes::Bytes;
use tether_proto::auth::{self, Role};
use tether_proto::frame::FLAG_NO_REPLY;
use tether_proto::handshake::features;
use tether_proto::{
    data_reply_frame, lock_freed_frame, reply_frame, Challenge, FrameHeader, FrameKind, Hello,
    HelloReply, IdMapping, NodeId, Op, Reply, Request, WireErrno, MAX_FRAME_LEN, PROTOCOL_VERSION,
};
use tether_transport::framed::{read_frame, read_magic, write_frame, write_magic};
use tether_transport::Stream;

use crate::drain::Drain;
use crate::export::{Export, ExportFs, LockWake};
use crate::ops;
use crate::watch::coalesce::Watch;

/// Numbers the sessions of this process, for [`LockWake`].
static NEXT_SESSION: AtomicU64 = AtomicU64::new(1);

/// Limits of one session.
#[derive(Debug, Clone)]
pub struct SessionLimits {
    /// Requests the client may send without waiting (announced in HELLO). The server
    /// executes `workers` of them at once; the rest wait in the socket, so a client that
    /// sends more only waits longer.
    pub max_in_flight: usize,
    /// Worker threads executing this session's requests; with all of them busy nobody
    /// reads, which back-pressures the client.
    pub workers: usize,
    /// How long a new connection may take to greet and authenticate.
    pub handshake_timeout: Duration,
}

impl Default for SessionLimits {
    fn default() -> Self {
        SessionLimits {
            max_in_flight: 256,
            workers: 8,
            handshake_timeout: Duration::from_secs(10),
        }
    }
}

/// Largest frame accepted before the handshake is over: HELLO and AUTH are small, and an
/// unauthenticated peer must not make the server allocate megabytes.
const HANDSHAKE_MAX_FRAME: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("connection error: {0}")]
    Io(#[from] io::Error),
    #[error("protocol error: {0}")]
    Protocol(String),
    #[error("authentication failed: {0}")]
    Auth(String),
}

type SharedWriter = Arc<Mutex<Box<dyn Write + Send>>>;

/// Serves one connection until the client disconnects or breaks the protocol. With a
/// `secret`, the client must prove it knows it before anything else.
pub fn run_session(
    export: Arc<Export>,
    stream: Stream,
    limits: &SessionLimits,
    secret: Option<&[u8]>,
    drain: Option<Arc<Drain>>,
) -> Result<(), SessionError> {
    let Stream {
        mut reader,
        mut writer,
        closer,
        peer,
        socket,
        ..
    } = stream;
    if let Some(s) = &socket {
        s.set_read_timeout(Some(limits.handshake_timeout))?;
    }
    let greeted = write_magic(&mut *writer).and_then(|_| read_magic(&mut *reader, 0));
    match greeted {
        Ok(()) => {}
        // A peer that connects and leaves without a word (a readiness probe) is no error.
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::UnexpectedEof
                    | io::ErrorKind::BrokenPipe
                    | io::ErrorKind::ConnectionReset
            ) =>
        {
            tracing::debug!(peer = %peer, "peer left before the handshake");
            return Ok(());
        }
        Err(e) => return Err(handshake_io(e)),
    }

    // The first frame must be HELLO.
    let (h, req) = read_handshake_frame(&mut *reader, Op::Hello)?;
    let Request::Hello(hello) = req else {
        unreachable!("read_handshake_frame checked the op")
    };
    if !(hello.min_version <= PROTOCOL_VERSION && PROTOCOL_VERSION <= hello.max_version) {
        writer.write_all(&reply_frame(h.op, h.id, &Err(WireErrno::EPROTO)))?;
        return Err(SessionError::Protocol(format!(
            "client speaks versions {}..={}, this server {}",
            hello.min_version, hello.max_version, PROTOCOL_VERSION
        )));
    }
    // The reply that carries the session's terms: to HELLO, or to AUTH after a challenge.
    let (reply_op, reply_id) = match secret {
        None => (h.op, h.id),
        Some(secret) => authenticate(&mut *reader, &mut *writer, secret, &h, &hello, &peer)?,
    };
    if let Some(s) = &socket {
        s.set_read_timeout(None)?;
    }
    // Push invalidations only if the root can be watched; otherwise the client revalidates.
    let wants_push = hello.features & features::PUSH_INVALIDATE != 0;
    let wants_events = hello.features & features::HOST_EVENTS != 0;
    let owner = (hello.owner_uid, hello.owner_gid);
    let mut fs = match ExportFs::new(export.clone(), wants_push, wants_events, owner) {
        Ok(fs) => fs,
        Err(e) => {
            writer.write_all(&reply_frame(reply_op, reply_id, &Err(e)))?;
            return Err(SessionError::Protocol(format!(
                "cannot open the export: {e}"
            )));
        }
    };
    let watch = fs.watching();
    // ORDERED_WRITES: `worker` executes small writes while it holds the reader.
    let mut granted =
        hello.features & (features::IO_BY_NODE | features::DIR_END | features::ORDERED_WRITES);
    if watch {
        granted |= features::PUSH_INVALIDATE;
        if fs.host_events() {
            granted |= features::HOST_EVENTS;
        }
        // Attributes after a creation or a write serve only a client that may cache them
        // (pushed invalidations); a write's come from the echo check's read, which only a
        // watching session makes.
        granted |= hello.features
            & (features::CREATE_NO_HANDLE | features::DIR_ATTR | features::WRITE_ATTR);
        // Spare files serve only creations answered early, which need pushed invalidation
        // (the client must know the name is free); `worker` executes BIND while it holds
        // the reader.
        granted |= hello.features & features::SPARE_FILES;
    }
    fs.dir_attr = granted & features::DIR_ATTR != 0;
    fs.write_attr = granted & features::WRITE_ATTR != 0;
    fs.dir_end = granted & features::DIR_END != 0;
    fs.create_no_handle = granted & features::CREATE_NO_HANDLE != 0;
    let (lock_tx, lock_rx) = std::sync::mpsc::channel();
    if watch {
        fs.locks.wake = Some(LockWake {
            session: NEXT_SESSION.fetch_add(1, Ordering::Relaxed),
            tx: lock_tx,
        });
    }
    let fs = Arc::new(fs);
    let terms = HelloReply {
        version: PROTOCOL_VERSION,
        features: granted,
        max_frame: MAX_FRAME_LEN as u32,
        max_in_flight: limits.max_in_flight as u32,
        instance: export.instance,
        read_only: export.read_only,
        id_mapping: export.id_map.mode(),
        challenge: None,
    };
    writer.write_all(&reply_frame(reply_op, reply_id, &Ok(Reply::Hello(terms))))?;
    writer.flush()?;
    tracing::info!(
        peer = %peer,
        client = %String::from_utf8_lossy(&hello.client_name),
        watching = watch,
        "session started"
    );

    let _registered = drain.as_ref().and_then(|d| {
        let key = d.enter(&socket)?;
        Some(Registered(d.clone(), key))
    });
    let draining = move || drain.as_ref().is_some_and(|d| d.is_draining());
    let writer: SharedWriter = Arc::new(Mutex::new(writer));
    let stop = Arc::new(AtomicBool::new(false));
    let pusher = watch.then(|| Arc::new(Pusher::default()));
    let watcher = pusher.clone().map(|pusher| {
        let (fs, writer, stop) = (fs.clone(), writer.clone(), stop.clone());
        thread::Builder::new()
            .name("tether-watch".into())
            .spawn(move || {
                if let Some(watch) = &fs.watch {
                    push_changes(watch, &pusher, &writer, &stop)
                }
            })
            .expect("spawn watcher")
    });
    let lock_pusher = watch.then(|| {
        let (writer, stop) = (writer.clone(), stop.clone());
        thread::Builder::new()
            .name("tether-lockwake".into())
            .spawn(move || push_lock_wakes(&lock_rx, &writer, &stop))
            .expect("spawn lock pusher")
    });
    // Leader/follower: the worker that reads a frame also executes it, so a request wakes
    // one thread, not a reader and then a worker. While it works, the next idle worker
    // takes the reader. With every worker busy nobody reads, which back-pressures the client.
    let reader = Arc::new(Mutex::new(reader));
    let workers: Vec<_> = (0..limits.workers)
        .map(|i| {
            let (fs, pusher, reader, writer, closer, draining) = (
                fs.clone(),
                pusher.clone(),
                reader.clone(),
                writer.clone(),
                closer.clone(),
                draining.clone(),
            );
            thread::Builder::new()
                .name(format!("tether-worker-{i}"))
                .spawn(move || {
                    let outcome = worker(&fs, pusher.as_deref(), &reader, &writer);
                    match outcome {
                        // At the end of the stream every worker stops by itself, after
                        // answering the request it is working on.
                        Ok(()) => Ok(()),
                        // Reading stopped mid-frame: that request was not read.
                        Err(_) if draining() => Ok(()),
                        Err(e) => {
                            // A broken stream: the first worker to see it ends the session
                            // for all.
                            closer.close();
                            Err(e)
                        }
                    }
                })
                .expect("spawn worker")
        })
        .collect();
    let mut outcome = Ok(());
    for w in workers {
        let r = w.join().unwrap_or(Ok(()));
        if outcome.is_ok() {
            outcome = r;
        }
    }
    if let Err(e) = &outcome {
        tracing::warn!("closing session: {e}");
    }
    stop.store(true, Ordering::Relaxed);
    for pusher in [watcher, lock_pusher].into_iter().flatten() {
        let _ = pusher.join();
    }
    if outcome.is_ok() && draining() {
        // Every request read was answered (each worker wrote its reply before it stopped).
        let mut w = writer.lock().unwrap();
        let _ = write_frame(&mut **w, &tether_proto::goodbye_frame()).and_then(|_| w.flush());
        tracing::info!(peer = %peer, "said goodbye: shutting down");
    }
    closer.close();
    tracing::info!(peer = %peer, nodes = fs.nodes.len(), handles = fs.open_handles(), "session ended");
    outcome
}

/// A session's place in the server's [`Drain`], given up when the session ends.
struct Registered(Arc<Drain>, u64);

impl Drop for Registered {
    fn drop(&mut self) {
        self.0.leave(self.1);
    }
}

/// Writes a watching session's INVALIDATE pushes, for the push thread and for SYNC.
///
/// Whoever holds `seq` reads the watch queues and writes the pushes they held before
/// letting go. So a SYNC that takes it after its request was read finds each change queued
/// before then either pushed already (by the push thread, which held it while it read
/// that change) or in its own read, and its reply, written after, follows every such push.
#[derive(Default)]
struct Pusher {
    /// The sequence number of the last INVALIDATE of the session.
    seq: Mutex<u64>,
}

impl Pusher {
    /// Reads the changes queued now, without waiting, and writes their pushes.
    fn push_queued(&self, watch: &Watch, writer: &SharedWriter) -> io::Result<()> {
        let mut seq = self.seq.lock().unwrap_or_else(|e| e.into_inner());
        let changes = watch.queued_changes();
        if changes.is_empty() {
            return Ok(());
        }
        tracing::debug!(?changes, "pushing invalidations");
        for frame in tether_proto::invalidate_frames(&mut seq, &changes.items, &changes.events) {
            write_frame(&mut **writer.lock().unwrap(), &frame)?;
        }
        tracing::trace!(target: "tether::lat", seq = *seq, "pushed");
        Ok(())
    }
}

/// Sends the client INVALIDATE pushes for every batch of host changes to what it holds.
/// Waits for the watch queues without holding the [`Pusher`], so a SYNC never waits for
/// the 2 ms the watcher lets a burst of events gather.
fn push_changes(watch: &Watch, pusher: &Pusher, writer: &SharedWriter, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        if !watch.wait(Duration::from_millis(200)) {
            continue;
        }
        if pusher.push_queued(watch, writer).is_err() {
            return;
        }
    }
}

/// Sends the client LOCK_FREED pushes: nodes it was refused a lock on that another session
/// has since freed (export/locks.rs, `LockWaits`).
fn push_lock_wakes(rx: &Receiver<NodeId>, writer: &SharedWriter, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        let first = match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(node) => node,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        let mut nodes: Vec<NodeId> = std::iter::once(first)
            .chain(rx.try_iter().take(4095))
            .collect();
        nodes.sort_unstable();
        nodes.dedup();
        if write_frame(&mut **writer.lock().unwrap(), &lock_freed_frame(&nodes)).is_err() {
            return;
        }
    }
}

type SharedReader = Arc<Mutex<Box<dyn std::io::Read + Send>>>;

/// Reads frames (holding the reader), executes them, writes their replies; until the
/// stream ends.
///
/// Leader/follower: the worker holding the reader executes what it reads. Before a request
/// that may take a while it hands the reader to the next idle worker (releasing the lock
/// wakes one), so other requests go on being read meanwhile. A [quick](is_quick) one it
/// executes and answers while still holding the reader, then reads on: a request that
/// arrives meanwhile waits that long, but no worker is woken to take over reading only to
/// sleep again (two context switches, of about eight per created file).
fn worker(
    fs: &ExportFs,
    pusher: Option<&Pusher>,
    reader: &SharedReader,
    writer: &SharedWriter,
) -> Result<(), SessionError> {
    let execute = |h: &FrameHeader, body| -> Result<(), SessionError> {
        if h.op == Op::Sync as u16 {
            // The barrier: every change queued by now is pushed before the reply. A session
            // that does not watch has nothing to push (and answers at once).
            if let (Some(p), Some(watch)) = (pusher, &fs.watch) {
                p.push_queued(watch, writer)?;
            }
        }
        if let Some(frame) = handle_frame(fs, h, body)? {
            let mut w = writer.lock().unwrap();
            write_frame(&mut **w, &frame)?;
        }
        Ok(())
    };
    loop {
        let (h, body) = {
            let mut r = reader.lock().unwrap();
            loop {
                let Some((h, body)) = read_frame(&mut **r, MAX_FRAME_LEN)? else {
                    return Ok(());
                };
                if h.kind != FrameKind::Request {
                    return Err(SessionError::Protocol(format!(
                        "unexpected frame kind {:?}",
                        h.kind
                    )));
                }
                if !is_quick(&h) {
                    break (h, body);
                }
                execute(&h, body)?;
            }
            // The reader is handed on here.
        };
        execute(&h, body)?;
    }
}

/// Requests done in a few microseconds on a file the server holds open (they read an inode
/// in memory; a small write goes to the page cache), executed without handing the reader
/// on. For small writes and BIND this is also a promise (features `ORDERED_WRITES`,
/// `SPARE_FILES`): every request read after one sees its effect, so the client answers
/// them early. Anything that may read the disk, wait for a lock, free many blocks (a
/// truncation) or move much data is not, nor a FORGET of many nodes (each may close a
/// descriptor and drop a watch).
fn is_quick(h: &FrameHeader) -> bool {
    use tether_proto::handshake::{ORDERED_WRITE_MAX, WRITE_BODY_FIXED};
    const FEW_FORGETS: usize = 256;
    match Op::from_u16(h.op) {
        Ok(Op::Getattr | Op::Statfs | Op::Ping) => true,
        Ok(Op::Getxattr | Op::Listxattr | Op::Readlink | Op::LockRelease) => true,
        Ok(Op::Forget) => h.body_len <= FEW_FORGETS,
        Ok(Op::Write) => h.body_len <= WRITE_BODY_FIXED + ORDERED_WRITE_MAX,
        // A promise too (feature `SPARE_FILES`): the file the client already gave the
        // kernel has its name before anything later is read.
        Ok(Op::Bind) => true,
        _ => false,
    }
}

/// Challenges the client to prove it knows `secret` (after proving it ourselves, in the
/// answer to its HELLO `h`) and checks the proof. Returns the op and id the session's terms
/// must answer: the client's AUTH.
fn authenticate(
    reader: &mut dyn std::io::Read,
    writer: &mut dyn Write,
    secret: &[u8],
    h: &FrameHeader,
    hello: &Hello,
    peer: &str,
) -> Result<(u16, u64), SessionError> {
    let mut server_nonce = [0u8; auth::NONCE_LEN];
    rand::fill(&mut server_nonce);
    let challenge = HelloReply {
        version: PROTOCOL_VERSION,
        features: 0,
        max_frame: HANDSHAKE_MAX_FRAME as u32,
        max_in_flight: 0,
        instance: [0; 16],
        read_only: false,
        id_mapping: IdMapping::Squash,
        challenge: Some(Challenge {
            server_nonce,
            server_proof: auth::proof(secret, Role::Server, &hello.client_nonce, &server_nonce),
        }),
    };
    writer.write_all(&reply_frame(h.op, h.id, &Ok(Reply::Hello(challenge))))?;
    writer.flush()?;
    let (ah, req) = read_handshake_frame(reader, Op::Auth).map_err(|e| {
        SessionError::Auth(format!(
            "{peer} did not prove it knows the secret ({e}); a client with a \
             different secret gives up here"
        ))
    })?;
    let Request::Auth { proof } = req else {
        unreachable!("read_handshake_frame checked the op")
    };
    if !auth::verify(
        secret,
        Role::Client,
        &hello.client_nonce,
        &server_nonce,
        &proof,
    ) {
        let _ = writer.write_all(&reply_frame(ah.op, ah.id, &Err(WireErrno::EACCES)));
        return Err(SessionError::Auth(format!(
            "{peer} does not know the secret (client {:?})",
            String::from_utf8_lossy(&hello.client_name)
        )));
    }
    Ok((ah.op, ah.id))
}

/// Reads one handshake frame, which must be a request for `op`.
fn read_handshake_frame(
    reader: &mut dyn std::io::Read,
    op: Op,
) -> Result<(FrameHeader, Request), SessionError> {
    let (h, body) = read_frame(reader, HANDSHAKE_MAX_FRAME)
        .map_err(handshake_io)?
        .ok_or_else(|| SessionError::Protocol(format!("closed before {op:?}")))?;
    if h.kind != FrameKind::Request || h.op != op as u16 {
        return Err(SessionError::Protocol(format!(
            "expected {op:?}, got op {}",
            h.op
        )));
    }
    let (_, req) =
        Request::decode(h.op, body).map_err(|e| SessionError::Protocol(e.to_string()))?;
    Ok((h, req))
}

/// Names the usual cause of an I/O error during the handshake.
fn handshake_io(e: io::Error) -> SessionError {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            SessionError::Protocol("no handshake within the time limit".into())
        }
        _ => SessionError::Io(e),
    }
}

/// Executes one request frame and returns the reply frame (None for one-way requests).
/// A malformed request is a protocol error that ends the session.
pub fn handle_frame(
    fs: &ExportFs,
    h: &FrameHeader,
    body: Bytes,
) -> Result<Option<Vec<u8>>, SessionError> {
    let no_reply = h.flags & FLAG_NO_REPLY != 0;
    let (caller, req) = match Request::decode(h.op, body) {
        Ok(r) => r,
        Err(tether_proto::DecodeError::UnknownOp(op)) => {
            // Unknown operations get ENOSYS so newer clients can probe; the session goes on.
            let reply = reply_frame(op, h.id, &Err(WireErrno::ENOSYS));
            return Ok((!no_reply).then_some(reply));
        }
        Err(e) => {
            return Err(SessionError::Protocol(format!(
                "bad request (op {}): {e}",
                h.op
            )))
        }
    };
    let frame = match req {
        Request::Read {
            node,
            fh,
            offset,
            size,
        } => {
            let size = (size as usize).min(MAX_FRAME_LEN - 64);
            data_reply_frame(h.op, h.id, size, |buf| {
                ops::io::read_into(fs, node, fh, offset, buf)
            })
        }
        req => {
            let r = ops::dispatch(fs, caller, req);
            reply_frame(h.op, h.id, &r)
        }
    };
    Ok(if no_reply { None } else { Some(frame) })
}
