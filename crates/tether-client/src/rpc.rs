//! Pipelined RPC over one connection: any thread sends a request and registers a callback;
//! a reader thread runs each callback when its reply arrives, in whatever order replies come.
//! FUSE threads therefore never wait for the network.
//!
//! When the connection drops (or the server restarts), a connection made with [`Redial`]
//! dials again with backoff. Meanwhile requests wait, each for at most the redial timeout,
//! then fail with EIO. On the new connection a [`Restorer`] first re-creates the server-side
//! state the kernel relies on (nodes, open handles); then the waiting requests go out:
//! those never sent, those the server did not read (it said GOODBYE), and those unanswered
//! that are safe to execute twice. The others fail with EIO (protocol.md §15).

use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use bytes::Bytes;
use dashmap::DashMap;
use tether_proto::auth::{self, Role};
use tether_proto::handshake::features;
use tether_proto::{
    push_op, Caller, FrameHeader, FrameKind, Hello, HelloReply, Op, Reply, Request, WireErrno,
    MAX_FRAME_LEN, PROTOCOL_VERSION,
};
use tether_transport::framed::{read_frame, read_magic, write_magic};
use tether_transport::{Closer, Stream};

pub type ReplyResult = Result<Reply, WireErrno>;
type Callback = Box<dyn FnOnce(ReplyResult) + Send>;

/// Reads the server's HELLO (or AUTH) reply.
fn read_hello_reply(reader: &mut dyn io::Read, op: Op) -> Result<HelloReply, ConnectError> {
    let (h, body) = read_frame(reader, MAX_FRAME_LEN)?
        .ok_or_else(|| ConnectError::Protocol("server closed the connection".into()))?;
    if h.kind != FrameKind::Reply || h.op != op as u16 {
        return Err(ConnectError::Protocol(format!(
            "expected the {op:?} reply, got op {}",
            h.op
        )));
    }
    match Reply::decode(h.op, body).map_err(|e| ConnectError::Protocol(e.to_string()))? {
        Ok(Reply::Hello(r)) => Ok(r),
        Ok(_) => Err(ConnectError::Protocol(format!("malformed {op:?} reply"))),
        Err(e) => Err(ConnectError::Refused(e)),
    }
}

/// Handler for frames the server pushes (invalidations; see the coherence design).
pub type PushHandler = Box<dyn Fn(FrameHeader, Bytes) + Send + Sync>;

/// How to reach the server again after the connection drops.
pub struct Redial {
    pub dial: Box<dyn Fn() -> io::Result<Stream> + Send + Sync>,
    /// How long a request waits for the server to come back before it fails with EIO.
    pub timeout: Duration,
}

/// Re-creates, on a new connection, the server-side state that requests refer to.
pub trait Restorer: Send + Sync {
    /// The connection went away and a new one will be dialed. Runs on the thread that
    /// noticed the loss, holding no lock, before the connection's state says it is down.
    fn lost(&self);
    /// Takes note of the state to restore. Runs while nothing reaches any server, so that
    /// one-way requests (FORGET) are either reflected in it or sent after the restore.
    fn snapshot(&self);
    /// Re-creates the noted state before any waiting request is sent on the new
    /// connection; use [`Connection::call_restoring`]. An error means the new connection
    /// failed too.
    fn restore(&self, conn: &Connection) -> Result<(), WireErrno>;
}

struct Pending {
    op: u16,
    caller: Caller,
    /// Kept to send again on the next connection.
    req: Request,
    /// None: sent on the current connection. Some: waiting for one since then.
    waiting_since: Option<Instant>,
    /// When the request was made: it waits at most the redial timeout from then.
    created: Instant,
    /// Part of a restore: never sent again (the restore itself is redone).
    restoring: bool,
    /// Only ever taken by value after removal from the map; the mutex makes the map Sync
    /// without an unsafe impl and is never contended.
    done: Mutex<Callback>,
}

impl Pending {
    fn finish(self, r: ReplyResult) {
        (self.done.into_inner().unwrap())(r)
    }
}

/// The state of the connection to the server.
enum Link {
    /// Requests go out. `generation` counts connections. After a failed write nothing more
    /// is written (the stream may hold part of a frame): requests wait for the reader to
    /// see the end (a server that stops reading says GOODBYE first).
    Up {
        writer: Box<dyn Write + Send>,
        generation: u64,
        broken: bool,
    },
    /// A new connection, on which only restore requests go out yet.
    Restoring {
        writer: Box<dyn Write + Send>,
        generation: u64,
    },
    /// Lost; requests wait for the next connection.
    Down { since: Instant },
    /// Shut down for good: requests fail.
    Closed,
}

impl Link {
    fn generation(&self) -> Option<u64> {
        match self {
            Link::Up { generation, .. } | Link::Restoring { generation, .. } => Some(*generation),
            _ => None,
        }
    }
}

/// What a connection looks like from `tether status`.
pub struct LinkStats {
    pub reconnects: AtomicU64,
    /// Requests sent again on a new connection.
    pub resent: AtomicU64,
    /// Requests failed with EIO because the connection broke or stayed away too long.
    pub failed: AtomicU64,
    /// Requests written to a connection, by operation code (every code is below 64).
    sent: [AtomicU64; 64],
}

impl Default for LinkStats {
    fn default() -> Self {
        LinkStats {
            reconnects: AtomicU64::new(0),
            resent: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            sent: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl LinkStats {
    fn count(&self, op: u16) {
        if let Some(n) = self.sent.get(op as usize) {
            n.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// How many requests of each operation were sent, for the operations sent at all.
    pub fn sent(&self) -> Vec<(Op, u64)> {
        (0..self.sent.len())
            .filter_map(|i| {
                let n = self.sent[i].load(Ordering::Relaxed);
                let op = Op::from_u16(i as u16).ok()?;
                (n > 0).then_some((op, n))
            })
            .collect()
    }
}

pub struct Connection {
    link: Mutex<Link>,
    /// Closes the current connection's socket.
    closer: Mutex<Closer>,
    pending: DashMap<u64, Pending>,
    next_id: AtomicU64,
    generations: AtomicU64,
    /// When the last frame arrived (ms since `epoch`), to tell a silent server.
    last_received: AtomicU64,
    epoch: Instant,
    /// The terms of the first session (a reconnect must not change what the mount was
    /// set up for).
    pub hello: HelloReply,
    /// The features the current connection's server granted (`hello`'s are the first's).
    features_now: AtomicU64,
    pub peer: String,
    /// The server's process id when it runs on this machine, else 0.
    server_pid: AtomicU32,
    params: HandshakeParams,
    on_push: Option<Arc<PushHandler>>,
    redial: Option<Redial>,
    restorer: OnceLock<Arc<dyn Restorer>>,
    /// One-way frames held back during a restore (they must follow it).
    held_oneway: Mutex<Vec<Vec<u8>>>,
    /// Requests made on the reader thread, sent by another one (see [`Connection::defer`]).
    deferred: OnceLock<mpsc::Sender<(Caller, Request, Option<Callback>)>>,
    pub stats: LinkStats,
}

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error(transparent)]
    Io(#[from] io::Error),
    #[error("the server refused the connection: {0}")]
    Refused(WireErrno),
    #[error("protocol error during the handshake: {0}")]
    Protocol(String),
    #[error(
        "the server requires a secret: copy its secret file to this machine and pass \
         --secret-file (tether serve prints where it keeps it)"
    )]
    SecretRequired,
    #[error(
        "the server does not know our secret: wrong --secret-file, or not the server you \
         meant; nothing was sent"
    )]
    ServerNotAuthenticated,
    #[error("the server refused our secret: wrong --secret-file (the server logged the attempt)")]
    SecretRefused,
    #[error(
        "no answer to the handshake within {0:?}: the other side accepted the connection but \
         is not a tether server, or is stuck"
    )]
    HandshakeTimedOut(Duration),
}

/// What a client asks for when it connects.
#[derive(Default)]
pub struct ConnectOptions {
    /// Free text for the server's log.
    pub client_name: String,
    /// Where pushed frames go; None: do not ask for pushes.
    pub on_push: Option<PushHandler>,
    /// Ask for the host events behind invalidations (needs `on_push`).
    pub host_events: bool,
    /// The shared secret, for servers that require one.
    pub secret: Option<Vec<u8>>,
    /// The guest (uid, gid) files appear to belong to when the server squashes ownership.
    pub owner: (u32, u32),
    /// Reconnect when the connection drops; None: fail every request from then on.
    pub redial: Option<Redial>,
    /// Longest the first handshake may wait for the server; None: as long as it takes.
    pub handshake_timeout: Option<Duration>,
}

/// What every handshake of a connection sends.
struct HandshakeParams {
    client_name: Vec<u8>,
    features: u64,
    secret: Option<Vec<u8>>,
    owner: (u32, u32),
}

/// A connection after its handshake.
struct Session {
    hello: HelloReply,
    reader: Box<dyn io::Read + Send>,
    writer: Box<dyn Write + Send>,
    closer: Closer,
    peer: String,
    /// The server's process id, when it runs on this machine (a Unix socket).
    server_pid: Option<u32>,
}

/// Longest a reconnect's handshake may take before the attempt is given up.
const REDIAL_HANDSHAKE_LIMIT: Duration = Duration::from_secs(5);
/// Longest pause between two reconnect attempts.
const REDIAL_MAX_BACKOFF: Duration = Duration::from_secs(1);

/// Notices a server that stopped answering without closing the connection (stopped, or
/// behind a broken network): with requests unanswered, a PING after half the redial
/// timeout of silence, and the connection is given up after the whole timeout, so that
/// calls fail with EIO instead of hanging. A busy server answers the PING.
fn watchdog(conn: std::sync::Weak<Connection>, timeout: Duration) {
    let tick = (timeout / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
    let mut pinged = false;
    loop {
        thread::sleep(tick);
        let Some(conn) = conn.upgrade() else { return };
        let generation = match &*conn.link.lock().unwrap() {
            Link::Closed => return,
            Link::Up { generation, .. } => *generation,
            _ => continue,
        };
        let unanswered = conn.pending.iter().any(|e| e.waiting_since.is_none());
        let silence = conn.silence();
        if !unanswered || silence < timeout / 2 {
            pinged = false;
            continue;
        }
        if silence >= timeout {
            let why = format!("no answer for {:.1} s", silence.as_secs_f64());
            conn.lost(generation, false, &why);
            pinged = false;
        } else if !pinged {
            conn.call(Caller::default(), &Request::Ping, |_| {});
            pinged = true;
        }
    }
}

/// [`handshake`], given up once it has taken `limit` in all (a silent peer, or one that
/// trickles bytes): the stream is shut down then, which ends whatever read waits.
fn timed_handshake(
    stream: Stream,
    params: &HandshakeParams,
    limit: Option<Duration>,
) -> Result<Session, ConnectError> {
    let Some(limit) = limit else {
        return handshake(stream, params);
    };
    let closer = stream.closer.clone();
    let expired = Arc::new(AtomicBool::new(false));
    let (finished, wait) = mpsc::channel::<()>();
    let timer = {
        let expired = expired.clone();
        thread::Builder::new()
            .name("tether-handshake-limit".into())
            .spawn(move || {
                if let Err(mpsc::RecvTimeoutError::Timeout) = wait.recv_timeout(limit) {
                    expired.store(true, Ordering::SeqCst);
                    closer.close();
                }
            })?
    };
    let result = handshake(stream, params);
    drop(finished);
    let _ = timer.join();
    // Decided after the timer is done: a stream it shut down is no session.
    if expired.load(Ordering::SeqCst) {
        return Err(ConnectError::HandshakeTimedOut(limit));
    }
    result
}

/// Greets the server on `stream`, authenticating with the secret if it asks.
fn handshake(stream: Stream, params: &HandshakeParams) -> Result<Session, ConnectError> {
    let Stream {
        mut reader,
        mut writer,
        closer,
        peer,
        peer_cred,
        ..
    } = stream;
    write_magic(&mut *writer)?;
    let mut client_nonce = [0u8; auth::NONCE_LEN];
    rand::fill(&mut client_nonce);
    let hello = Request::Hello(Hello {
        min_version: PROTOCOL_VERSION,
        max_version: PROTOCOL_VERSION,
        features: params.features,
        max_frame: MAX_FRAME_LEN as u32,
        owner_uid: params.owner.0,
        owner_gid: params.owner.1,
        client_nonce,
        client_name: params.client_name.clone(),
    });
    writer.write_all(&hello.to_frame(0, Caller::default()))?;
    writer.flush()?;
    // Up to 64 KiB of noise (an ssh banner) may come before the server's magic.
    read_magic(&mut *reader, 64 * 1024)?;
    let mut hello = read_hello_reply(&mut *reader, Op::Hello)?;
    if let Some(challenge) = hello.challenge.take() {
        let secret = params
            .secret
            .as_deref()
            .ok_or(ConnectError::SecretRequired)?;
        // The server proves itself first, so a stranger learns nothing from our proof.
        if !auth::verify(
            secret,
            Role::Server,
            &client_nonce,
            &challenge.server_nonce,
            &challenge.server_proof,
        ) {
            return Err(ConnectError::ServerNotAuthenticated);
        }
        let proof = auth::proof(secret, Role::Client, &client_nonce, &challenge.server_nonce);
        writer.write_all(&Request::Auth { proof }.to_frame(1, Caller::default()))?;
        writer.flush()?;
        hello = match read_hello_reply(&mut *reader, Op::Auth) {
            Err(ConnectError::Refused(WireErrno::EACCES)) => {
                return Err(ConnectError::SecretRefused)
            }
            r => r?,
        };
        if hello.challenge.is_some() {
            return Err(ConnectError::Protocol("a second challenge".into()));
        }
    }
    Ok(Session {
        hello,
        reader,
        writer,
        closer,
        peer,
        server_pid: peer_cred.and_then(|c| u32::try_from(c.pid).ok()),
    })
}

impl Connection {
    /// The server's process id, when it runs on this machine (a Unix socket).
    pub fn local_server_pid(&self) -> Option<u32> {
        Some(self.server_pid.load(Ordering::Relaxed)).filter(|&p| p != 0)
    }

    /// Performs the handshake on `stream` and starts the reply reader. Pushes go to
    /// `on_push`; with `host_events` they also carry the host changes behind them.
    pub fn start(
        stream: Stream,
        client_name: &str,
        on_push: Option<PushHandler>,
        host_events: bool,
    ) -> Result<Arc<Connection>, ConnectError> {
        // SAFETY: geteuid/getegid have no preconditions.
        let owner = unsafe { (libc::geteuid(), libc::getegid()) };
        Connection::start_with(
            stream,
            ConnectOptions {
                client_name: client_name.into(),
                on_push,
                host_events,
                owner,
                ..ConnectOptions::default()
            },
        )
    }

    /// Performs the handshake, authenticating with `opts.secret` if the server asks.
    pub fn start_with(
        stream: Stream,
        opts: ConnectOptions,
    ) -> Result<Arc<Connection>, ConnectError> {
        let params = HandshakeParams {
            client_name: opts.client_name.into_bytes(),
            // Ask for pushed invalidations only when someone will apply them.
            features: features::IO_BY_NODE
                | features::DIR_END
                | features::DIR_ATTR
                | features::WRITE_ATTR
                | features::ORDERED_WRITES
                | match (&opts.on_push, opts.host_events) {
                    (None, _) => 0,
                    (Some(_), events) => {
                        let events = if events { features::HOST_EVENTS } else { 0 };
                        features::PUSH_INVALIDATE
                            | features::CREATE_NO_HANDLE
                            | features::SPARE_FILES
                            | events
                    }
                },
            secret: opts.secret,
            owner: opts.owner,
        };
        let session = timed_handshake(stream, &params, opts.handshake_timeout)?;
        let conn = Arc::new(Connection {
            link: Mutex::new(Link::Up {
                writer: session.writer,
                generation: 1,
                broken: false,
            }),
            closer: Mutex::new(session.closer),
            pending: DashMap::new(),
            next_id: AtomicU64::new(1),
            generations: AtomicU64::new(1),
            last_received: AtomicU64::new(0),
            epoch: Instant::now(),
            features_now: AtomicU64::new(session.hello.features),
            hello: session.hello,
            peer: session.peer,
            server_pid: AtomicU32::new(session.server_pid.unwrap_or(0)),
            params,
            on_push: opts.on_push.map(Arc::new),
            redial: opts.redial,
            restorer: OnceLock::new(),
            held_oneway: Mutex::new(Vec::new()),
            deferred: OnceLock::new(),
            stats: LinkStats::default(),
        });
        conn.start_reader(session.reader, 1)?;
        if let Some(r) = &conn.redial {
            let (watched, period) = (Arc::downgrade(&conn), r.timeout);
            thread::Builder::new()
                .name("tether-watchdog".into())
                .spawn(move || watchdog(watched, period))?;
        }
        Ok(conn)
    }

    fn heard(&self) {
        let ms = self.epoch.elapsed().as_millis() as u64;
        self.last_received.store(ms, Ordering::Relaxed);
    }

    /// How long the server has been silent.
    fn silence(&self) -> Duration {
        let last = Duration::from_millis(self.last_received.load(Ordering::Relaxed));
        self.epoch.elapsed().saturating_sub(last)
    }

    /// Sets what re-creates server-side state after a reconnect (once).
    pub fn set_restorer(&self, r: Arc<dyn Restorer>) {
        let _ = self.restorer.set(r);
    }

    fn start_reader(
        self: &Arc<Self>,
        reader: Box<dyn io::Read + Send>,
        generation: u64,
    ) -> io::Result<()> {
        let conn = self.clone();
        thread::Builder::new()
            .name("tether-replies".into())
            .spawn(move || conn.read_replies(reader, generation))?;
        Ok(())
    }

    fn read_replies(self: Arc<Self>, mut reader: Box<dyn io::Read + Send>, generation: u64) {
        let mut goodbye = false;
        let why = loop {
            let frame = read_frame(&mut *reader, MAX_FRAME_LEN);
            self.heard();
            match frame {
                Ok(Some((h, body))) => match h.kind {
                    FrameKind::Reply => {
                        let Some((_, p)) = self.pending.remove(&h.id) else {
                            break format!("reply to unknown request {}", h.id);
                        };
                        tracing::trace!(
                            target: "tether::lat",
                            id = h.id,
                            op = h.op,
                            us = p.created.elapsed().as_micros() as u64,
                            "reply read"
                        );
                        if p.op != h.op {
                            let expected = p.op;
                            p.finish(Err(WireErrno::EIO));
                            break format!("reply op {} for a request of op {expected}", h.op);
                        }
                        match Reply::decode(h.op, body) {
                            Ok(result) => p.finish(result),
                            Err(e) => {
                                p.finish(Err(WireErrno::EIO));
                                break format!("malformed reply: {e}");
                            }
                        }
                    }
                    FrameKind::Push if h.op == push_op::GOODBYE => {
                        goodbye = true;
                        break "the server is shutting down".into();
                    }
                    FrameKind::Push => {
                        tracing::trace!(target: "tether::lat", op = h.op, len = body.len(), "push read");
                        if let Some(handler) = &self.on_push {
                            handler(h, body);
                        }
                    }
                    FrameKind::Request => break "server sent a request frame".into(),
                },
                Ok(None) => break "server closed the connection".into(),
                Err(e) => break format!("connection error: {e}"),
            }
        };
        self.lost(generation, goodbye, &why);
    }

    /// Handles the loss of connection `generation`: requests that may go to the next
    /// connection wait for it, the others fail.
    fn lost(self: &Arc<Self>, generation: u64, goodbye: bool, why: &str) {
        // Before the link says so, so that whoever sees it down knows the caches went.
        if self.redial.is_some() && self.link.lock().unwrap().generation() == Some(generation) {
            if let Some(r) = self.restorer.get() {
                r.lost();
            }
        }
        let mut failed = Vec::new();
        let reconnect;
        {
            let mut link = self.link.lock().unwrap();
            if link.generation() != Some(generation) {
                return; // shut down, or already replaced
            }
            self.closer.lock().unwrap().close();
            let was_up = matches!(*link, Link::Up { .. });
            if self.redial.is_none() {
                tracing::warn!(peer = %self.peer, "connection lost: {why}");
                *link = Link::Closed;
                drop(link);
                self.fail_all();
                return;
            }
            tracing::warn!(peer = %self.peer, "connection lost: {why}; reconnecting");
            *link = Link::Down {
                since: Instant::now(),
            };
            let now = Instant::now();
            let ids: Vec<u64> = self.pending.iter().map(|e| *e.key()).collect();
            for id in ids {
                let fail = match self.pending.get_mut(&id) {
                    Some(mut p) if p.waiting_since.is_none() => {
                        // Sent and unanswered: did the server execute it?
                        if !p.restoring && (goodbye || p.req.retry_safe()) {
                            p.waiting_since = Some(now);
                            false
                        } else {
                            true
                        }
                    }
                    _ => false,
                };
                if fail {
                    if let Some((_, p)) = self.pending.remove(&id) {
                        failed.push(p);
                    }
                }
            }
            // A loss during a restore is handled by the reconnect thread already running.
            reconnect = was_up;
        }
        if !failed.is_empty() {
            tracing::warn!(
                "{} request(s) in flight could not be sent again safely: failed with EIO",
                failed.len()
            );
        }
        self.fail(failed);
        if reconnect {
            let conn = self.clone();
            let spawned = thread::Builder::new()
                .name("tether-redial".into())
                .spawn(move || conn.reconnect());
            if spawned.is_err() {
                self.shut_down();
            }
        }
    }

    fn fail(&self, requests: Vec<Pending>) {
        self.stats
            .failed
            .fetch_add(requests.len() as u64, Ordering::Relaxed);
        for p in requests {
            p.finish(Err(WireErrno::EIO));
        }
    }

    fn fail_all(&self) {
        let ids: Vec<u64> = self.pending.iter().map(|e| *e.key()).collect();
        let failed = ids
            .into_iter()
            .filter_map(|id| self.pending.remove(&id).map(|(_, p)| p))
            .collect();
        self.fail(failed);
    }

    /// Fails the requests that have waited longer than the redial timeout.
    fn expire(&self, timeout: Duration) {
        let now = Instant::now();
        let ids: Vec<u64> = self
            .pending
            .iter()
            .filter(|e| {
                e.waiting_since.is_some() && now.saturating_duration_since(e.created) >= timeout
            })
            .map(|e| *e.key())
            .collect();
        let failed: Vec<Pending> = ids
            .into_iter()
            .filter_map(|id| {
                self.pending
                    .remove_if(&id, |_, p| p.waiting_since.is_some())
                    .map(|(_, p)| p)
            })
            .collect();
        if !failed.is_empty() {
            tracing::warn!(
                "{} request(s) waited {timeout:?} for a server: failed with EIO",
                failed.len()
            );
        }
        self.fail(failed);
    }

    /// Dials until a new connection is up and restored, or until shut down.
    fn reconnect(self: Arc<Self>) {
        let Some(redial) = &self.redial else { return };
        let mut backoff = Duration::from_millis(20);
        let mut attempts = 0u64;
        loop {
            let since = match &*self.link.lock().unwrap() {
                Link::Down { since } => *since,
                _ => return, // closed
            };
            self.expire(redial.timeout);
            attempts += 1;
            let limit = Some(REDIAL_HANDSHAKE_LIMIT.min(redial.timeout));
            let dialed = (redial.dial)()
                .map_err(ConnectError::Io)
                .and_then(|stream| timed_handshake(stream, &self.params, limit));
            let session = match dialed {
                Ok(s) => s,
                Err(e) => {
                    if attempts == 1 || attempts.is_multiple_of(50) {
                        tracing::info!(peer = %self.peer, "reconnect attempt {attempts}: {e}");
                    }
                    thread::sleep(backoff);
                    backoff = (backoff * 2).min(REDIAL_MAX_BACKOFF);
                    continue;
                }
            };
            self.features_now
                .store(session.hello.features, Ordering::Relaxed);
            if session.hello.features != self.hello.features {
                tracing::warn!(
                    "the server now grants features {:#x} (was {:#x}); going on",
                    session.hello.features,
                    self.hello.features
                );
            }
            let generation = self.generations.fetch_add(1, Ordering::Relaxed) + 1;
            {
                let mut link = self.link.lock().unwrap();
                if !matches!(*link, Link::Down { .. }) {
                    session.closer.close();
                    return;
                }
                if let Some(r) = self.restorer.get() {
                    r.snapshot();
                }
                self.held_oneway.lock().unwrap().clear();
                *link = Link::Restoring {
                    writer: session.writer,
                    generation,
                };
                *self.closer.lock().unwrap() = session.closer;
            }
            self.server_pid
                .store(session.server_pid.unwrap_or(0), Ordering::Relaxed);
            self.heard();
            if self.start_reader(session.reader, generation).is_err() {
                self.lost(generation, false, "cannot start a reader thread");
                continue;
            }
            let restored = match self.restorer.get() {
                Some(r) => r.restore(&self),
                None => Ok(()),
            };
            let mut link = self.link.lock().unwrap();
            if link.generation() != Some(generation) {
                continue; // lost again during the restore
            }
            if let Err(e) = restored {
                drop(link);
                self.lost(generation, false, &format!("restoring state failed: {e}"));
                continue;
            }
            let Link::Restoring { writer, .. } = std::mem::replace(&mut *link, Link::Closed) else {
                unreachable!("checked above")
            };
            *link = Link::Up {
                writer,
                generation,
                broken: false,
            };
            // Waiting requests before the FORGETs held during the restore: a write the
            // kernel was told is done (write/behind.rs) must reach its node before a FORGET
            // sent after it lets the server drop the node. (Lookup counts only add up, so a
            // waiting LOOKUP before a FORGET is as good as after it.)
            let resent = self.send_waiting(&mut link);
            if let Link::Up { writer, broken, .. } = &mut *link {
                for frame in self.held_oneway.lock().unwrap().drain(..) {
                    *broken = *broken || writer.write_all(&frame).is_err();
                }
            }
            drop(link);
            self.stats.reconnects.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                peer = %self.peer,
                "reconnected after {:.1} s ({attempts} attempt(s)); {resent} request(s) sent again",
                since.elapsed().as_secs_f64()
            );
            return;
        }
    }

    /// Sends every waiting request, oldest first, on the connection that just came up.
    fn send_waiting(&self, link: &mut Link) -> usize {
        let Link::Up { writer, broken, .. } = link else {
            return 0;
        };
        let mut ids: Vec<u64> = self
            .pending
            .iter()
            .filter(|e| e.waiting_since.is_some())
            .map(|e| *e.key())
            .collect();
        ids.sort_unstable();
        let mut sent = 0;
        for id in ids {
            let Some(mut p) = self.pending.get_mut(&id) else {
                continue;
            };
            if writer.write_all(&p.req.to_frame(id, p.caller)).is_err() {
                // This one and the rest wait for the next connection.
                *broken = true;
                break;
            }
            p.waiting_since = None;
            sent += 1;
        }
        self.stats.resent.fetch_add(sent as u64, Ordering::Relaxed);
        sent
    }

    /// Closes the connection for good and fails every request still waiting with EIO.
    pub fn shut_down(&self) {
        *self.link.lock().unwrap() = Link::Closed;
        self.closer.lock().unwrap().close();
        self.fail_all();
    }

    /// Whether the current connection's server granted `feature` (a reconnect may reach a
    /// different one).
    pub fn grants(&self, feature: u64) -> bool {
        self.features_now.load(Ordering::Relaxed) & feature != 0
    }

    /// Whether this client asks every server it connects to for `feature` (what it was
    /// set up for, whatever the server grants).
    pub fn asks_for(&self, feature: u64) -> bool {
        self.params.features & feature != 0
    }

    /// How long a request may wait for a lost server (the redial timeout), or a moment for
    /// a connection that does not redial.
    pub fn request_timeout(&self) -> Duration {
        self.redial
            .as_ref()
            .map_or(Duration::from_secs(5), |r| r.timeout)
    }

    /// Whether requests go out now (not waiting for a reconnect or a restore).
    pub fn is_up(&self) -> bool {
        matches!(*self.link.lock().unwrap(), Link::Up { broken: false, .. })
    }

    pub fn is_closed(&self) -> bool {
        matches!(*self.link.lock().unwrap(), Link::Closed)
    }

    /// "up", "reconnecting (N s)" or "closed", for `tether status`.
    pub fn state(&self) -> String {
        match &*self.link.lock().unwrap() {
            Link::Up { .. } => "up".into(),
            Link::Restoring { .. } => "restoring after a reconnect".into(),
            Link::Down { since } => {
                format!("reconnecting (for {:.0} s)", since.elapsed().as_secs_f64())
            }
            Link::Closed => "closed".into(),
        }
    }

    /// Sends `req`; `done` runs on the reader thread with the outcome. While the server is
    /// away the request waits (see the module comment).
    pub fn call(
        &self,
        caller: Caller,
        req: &Request,
        done: impl FnOnce(ReplyResult) + Send + 'static,
    ) {
        self.send(caller, req, Box::new(done), false);
    }

    /// Like [`Connection::call`], for a [`Restorer`]: sent on the connection being restored
    /// and never sent again.
    pub fn call_restoring(
        &self,
        caller: Caller,
        req: &Request,
        done: impl FnOnce(ReplyResult) + Send + 'static,
    ) {
        self.send(caller, req, Box::new(done), true);
    }

    /// Like [`Connection::call`], running `first` just before the request goes out (or is
    /// queued for the next connection) while no other request can: for answering the
    /// kernel before the frame is written (write-behind), so that the caller is not held
    /// up by the server's wake-up, while whatever the kernel sends next still leaves after
    /// this request.
    pub fn call_answering_first(
        &self,
        caller: Caller,
        req: &Request,
        done: impl FnOnce(ReplyResult) + Send + 'static,
        first: impl FnOnce(),
    ) {
        self.send_after(caller, req, Box::new(done), false, first);
    }

    fn send(&self, caller: Caller, req: &Request, done: Callback, restoring: bool) {
        self.send_after(caller, req, done, restoring, || {});
    }

    fn send_after(
        &self,
        caller: Caller,
        req: &Request,
        done: Callback,
        restoring: bool,
        first: impl FnOnce(),
    ) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut pending = Pending {
            op: req.op() as u16,
            caller,
            req: req.clone(),
            waiting_since: None,
            created: Instant::now(),
            restoring,
            done: Mutex::new(done),
        };
        let mut link = self.link.lock().unwrap();
        first();
        let writer = match &mut *link {
            Link::Up {
                writer,
                broken: false,
                ..
            } if !restoring => writer,
            Link::Restoring { writer, .. } if restoring => writer,
            Link::Up { .. } | Link::Restoring { .. } | Link::Down { .. } if !restoring => {
                // Waits for the next connection.
                pending.waiting_since = Some(Instant::now());
                self.pending.insert(id, pending);
                return;
            }
            // Closed, or a restore request after its connection was lost.
            _ => {
                drop(link);
                return self.fail(vec![pending]);
            }
        };
        self.pending.insert(id, pending);
        // Counted before it goes: counted after, its reply could reach the kernel, and the
        // caller read `tether status`, before the count did.
        self.stats.count(req.op() as u16);
        if writer.write_all(&req.to_frame(id, caller)).is_ok() {
            tracing::trace!(target: "tether::lat", id, op = req.op() as u16, "request sent");
            return;
        }
        // Not (wholly) sent. The reader sees the end of this connection soon (after a
        // GOODBYE if the server is stopping).
        if let Link::Up { broken, .. } = &mut *link {
            // Safe to send again: it waits for the next connection.
            *broken = true;
            if let Some(mut p) = self.pending.get_mut(&id) {
                p.waiting_since = Some(Instant::now());
            }
        } else {
            // A restore is redone as a whole on the next connection.
            drop(link);
            if let Some((_, p)) = self.pending.remove(&id) {
                self.fail(vec![p]);
            }
        }
    }

    /// Sends a request that has no reply (forget). Dropped while the server is away (the
    /// restore starts from the state after it); held back during a restore.
    pub fn send_oneway(&self, caller: Caller, req: &Request) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let frame = req.to_frame(id, caller);
        match &mut *self.link.lock().unwrap() {
            Link::Up {
                writer,
                broken: false,
                ..
            } => {
                let _ = writer.write_all(&frame);
            }
            Link::Restoring { .. } => self.held_oneway.lock().unwrap().push(frame),
            _ => {}
        }
    }

    /// A one-way request of a restore itself (not held back).
    pub fn send_oneway_restoring(&self, caller: Caller, req: &Request) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        if let Link::Restoring { writer, .. } = &mut *self.link.lock().unwrap() {
            let _ = writer.write_all(&req.to_frame(id, caller));
        }
    }

    /// Sends `req` from another thread: for reply callbacks, which run on the reader
    /// thread. The reader must never wait for the writer: with the socket full both ways
    /// (big writes going out, the server blocked on its replies) that would deadlock.
    /// `done` None: a one-way request.
    pub fn defer(
        self: &Arc<Self>,
        caller: Caller,
        req: Request,
        done: Option<Box<dyn FnOnce(ReplyResult) + Send>>,
    ) {
        let tx = self.deferred.get_or_init(|| {
            let (tx, rx) = mpsc::channel::<(Caller, Request, Option<Callback>)>();
            // Weak: the thread must not keep the connection alive.
            let conn = Arc::downgrade(self);
            let _ = thread::Builder::new()
                .name("tether-deferred".into())
                .spawn(move || {
                    for (caller, req, done) in rx {
                        let Some(conn) = conn.upgrade() else { return };
                        match done {
                            Some(done) => conn.send(caller, &req, done, false),
                            None => conn.send_oneway(caller, &req),
                        }
                    }
                });
            tx
        });
        if let Err(mpsc::SendError((_, _, Some(done)))) = tx.send((caller, req, done)) {
            done(Err(WireErrno::EIO));
        }
    }

    /// Sends `req` and waits for the outcome (tests, the CLI; never FUSE handlers).
    pub fn call_wait(&self, caller: Caller, req: &Request) -> ReplyResult {
        let (tx, rx) = mpsc::sync_channel(1);
        self.call(caller, req, move |r| {
            let _ = tx.send(r);
        });
        rx.recv().unwrap_or(Err(WireErrno::EIO))
    }
}
