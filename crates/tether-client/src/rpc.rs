//! Pipelined RPC over one connection: any thread sends a request and registers a callback;
//! a reader thread runs each callback when its reply arrives, in whatever order replies come.
//! FUSE threads therefore never wait for the network.

use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;

use bytes::Bytes;
use dashmap::DashMap;
use tether_proto::auth::{self, Role};
use tether_proto::handshake::features;
use tether_proto::{
    Caller, FrameHeader, FrameKind, Hello, HelloReply, Op, Reply, Request, WireErrno,
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

struct Pending {
    op: u16,
    /// Only ever taken by value after removal from the map; the mutex makes the map Sync
    /// without an unsafe impl and is never contended.
    done: Mutex<Callback>,
}

impl Pending {
    fn finish(self, r: ReplyResult) {
        (self.done.into_inner().unwrap())(r)
    }
}

pub struct Connection {
    writer: Mutex<Box<dyn Write + Send>>,
    pending: DashMap<u64, Pending>,
    next_id: AtomicU64,
    closed: AtomicBool,
    closer: Closer,
    pub hello: HelloReply,
    pub peer: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("{0}")]
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
}

impl Connection {
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
                secret: None,
                owner,
            },
        )
    }

    /// Performs the handshake, authenticating with `opts.secret` if the server asks.
    pub fn start_with(
        stream: Stream,
        opts: ConnectOptions,
    ) -> Result<Arc<Connection>, ConnectError> {
        let Stream {
            mut reader,
            mut writer,
            closer,
            peer,
            ..
        } = stream;
        let on_push = opts.on_push;
        write_magic(&mut *writer)?;
        let mut client_nonce = [0u8; auth::NONCE_LEN];
        rand::fill(&mut client_nonce);
        let hello = Request::Hello(Hello {
            min_version: PROTOCOL_VERSION,
            max_version: PROTOCOL_VERSION,
            // Ask for pushed invalidations only when someone will apply them.
            features: features::IO_BY_NODE
                | match (&on_push, opts.host_events) {
                    (None, _) => 0,
                    (Some(_), false) => features::PUSH_INVALIDATE,
                    (Some(_), true) => features::PUSH_INVALIDATE | features::HOST_EVENTS,
                },
            max_frame: MAX_FRAME_LEN as u32,
            owner_uid: opts.owner.0,
            owner_gid: opts.owner.1,
            client_nonce,
            client_name: opts.client_name.as_bytes().to_vec(),
        });
        writer.write_all(&hello.to_frame(0, Caller::default()))?;
        writer.flush()?;
        // Up to 64 KiB of noise (an ssh banner) may come before the server's magic.
        read_magic(&mut *reader, 64 * 1024)?;
        let mut hello = read_hello_reply(&mut *reader, Op::Hello)?;
        if let Some(challenge) = hello.challenge.take() {
            let secret = opts.secret.as_deref().ok_or(ConnectError::SecretRequired)?;
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
        let conn = Arc::new(Connection {
            writer: Mutex::new(writer),
            pending: DashMap::new(),
            next_id: AtomicU64::new(1),
            closed: AtomicBool::new(false),
            closer,
            hello,
            peer,
        });
        let reader_conn = conn.clone();
        thread::Builder::new()
            .name("tether-replies".into())
            .spawn(move || reader_conn.read_replies(reader, on_push))?;
        Ok(conn)
    }

    fn read_replies(&self, mut reader: Box<dyn io::Read + Send>, on_push: Option<PushHandler>) {
        let why = loop {
            match read_frame(&mut *reader, MAX_FRAME_LEN) {
                Ok(Some((h, body))) => match h.kind {
                    FrameKind::Reply => {
                        let Some((_, p)) = self.pending.remove(&h.id) else {
                            break format!("reply to unknown request {}", h.id);
                        };
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
                    FrameKind::Push => {
                        if let Some(handler) = &on_push {
                            handler(h, body);
                        }
                    }
                    FrameKind::Request => break "server sent a request frame".into(),
                },
                Ok(None) => break "server closed the connection".into(),
                Err(e) => break format!("connection error: {e}"),
            }
        };
        if self.is_closed() {
            tracing::debug!(peer = %self.peer, "connection closed: {why}");
        } else {
            tracing::warn!(peer = %self.peer, "connection lost: {why}");
        }
        self.shut_down();
    }

    /// Marks the connection closed and fails every request still waiting with EIO.
    pub fn shut_down(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.closer.close();
        let ids: Vec<u64> = self.pending.iter().map(|e| *e.key()).collect();
        for id in ids {
            if let Some((_, p)) = self.pending.remove(&id) {
                p.finish(Err(WireErrno::EIO));
            }
        }
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Sends `req`; `done` runs on the reader thread with the outcome.
    pub fn call(
        &self,
        caller: Caller,
        req: &Request,
        done: impl FnOnce(ReplyResult) + Send + 'static,
    ) {
        if self.is_closed() {
            return done(Err(WireErrno::EIO));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let frame = req.to_frame(id, caller);
        self.pending.insert(
            id,
            Pending {
                op: req.op() as u16,
                done: Mutex::new(Box::new(done)),
            },
        );
        let sent = self.writer.lock().unwrap().write_all(&frame);
        // If the connection closed meanwhile, the reader may already have drained `pending`;
        // make sure this request is not left waiting forever.
        if sent.is_err() || self.is_closed() {
            if let Some((_, p)) = self.pending.remove(&id) {
                p.finish(Err(WireErrno::EIO));
            }
        }
    }

    /// Sends a request that has no reply (forget).
    pub fn send_oneway(&self, caller: Caller, req: &Request) {
        if self.is_closed() {
            return;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let frame = req.to_frame(id, caller);
        let _ = self.writer.lock().unwrap().write_all(&frame);
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
