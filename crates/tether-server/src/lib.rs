//! Tether's host side: accepts connections and serves an exported directory to each.
//!
//! Layers: [`session`] (one connection: handshake, request queue, workers, replies) over
//! [`export`] (the node and handle tables and every operation, as `*at()` syscalls).

pub mod backend;
pub mod export;
pub mod nodes;
pub mod ops;
pub mod session;
pub mod watch;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

pub use export::{Export, ExportOptions, IdMap};
pub use session::{run_session, SessionLimits};
use tether_transport::{Listener, PeerCred, Socket};

/// Who may connect, and how many at once.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub limits: SessionLimits,
    /// When set, every client must prove it knows this secret (challenge and response).
    pub secret: Option<Arc<[u8]>>,
    /// Unix socket peers in this group are admitted besides the serving user and root.
    pub socket_group: Option<u32>,
    /// Connections served at once; more are closed at once, with a logged reason.
    pub max_sessions: usize,
    /// Ends every session gracefully when the server shuts down.
    pub drain: Arc<Drain>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            limits: SessionLimits::default(),
            secret: None,
            socket_group: None,
            max_sessions: 128,
            drain: Arc::default(),
        }
    }
}

impl ServeOptions {
    /// Whether a Unix socket peer may talk to this server: the serving user, root, or a
    /// member of the socket's group. (File permissions admit no one else; this holds even
    /// if someone loosens them.)
    fn admits(&self, cred: &PeerCred) -> bool {
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        cred.uid == me
            || cred.uid == 0
            || self
                .socket_group
                .is_some_and(|g| cred.gid == g || cred.groups.contains(&g))
    }
}

/// Accepts connections forever, serving each on its own thread.
pub fn serve(export: Arc<Export>, listener: Listener, opts: ServeOptions) -> std::io::Result<()> {
    let opts = Arc::new(opts);
    let sessions = Arc::new(AtomicUsize::new(0));
    loop {
        let stream = match listener.accept() {
            Ok(s) => s,
            Err(e) => {
                // A failed accept (EMFILE, a reset connection) must not end the server.
                tracing::warn!("accept failed: {e}");
                thread::sleep(std::time::Duration::from_millis(50));
                continue;
            }
        };
        let peer = stream.peer.clone();
        if let Some(cred) = &stream.peer_cred {
            if !opts.admits(cred) {
                tracing::warn!(peer = %peer, "refused: uid {} is not the serving user", cred.uid);
                continue;
            }
        }
        if opts.drain.is_draining() {
            tracing::info!(peer = %peer, "refused: shutting down");
            continue;
        }
        if sessions.fetch_add(1, Ordering::SeqCst) >= opts.max_sessions {
            sessions.fetch_sub(1, Ordering::SeqCst);
            tracing::warn!(peer = %peer, "refused: {} sessions already", opts.max_sessions);
            continue;
        }
        let (export, opts, ended) = (export.clone(), opts.clone(), sessions.clone());
        let spawned = thread::Builder::new()
            .name("tether-session".into())
            .spawn(move || {
                let secret = opts.secret.as_deref();
                match run_session(
                    export,
                    stream,
                    &opts.limits,
                    secret,
                    Some(opts.drain.clone()),
                ) {
                    Ok(()) => {}
                    Err(e @ session::SessionError::Auth(_)) => {
                        tracing::warn!(peer = %peer, "refused: {e}")
                    }
                    Err(e) => tracing::warn!(peer = %peer, "session closed: {e}"),
                }
                ended.fetch_sub(1, Ordering::SeqCst);
            });
        if let Err(e) = spawned {
            // Out of threads: refuse this one connection, keep serving the others.
            tracing::warn!("cannot start a session: {e}");
            sessions.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// A graceful shutdown: every session stops reading requests, answers the ones it read, and
/// says GOODBYE, so that its client can send what is still unanswered to the next server
/// (protocol.md §15). Nothing a client asked for is lost or done twice.
#[derive(Default)]
pub struct Drain {
    draining: AtomicBool,
    /// Sockets of the sessions being served, to stop their reading.
    sessions: Mutex<HashMap<u64, Arc<Socket>>>,
    left: Condvar,
    next_key: AtomicU64,
}

impl Drain {
    /// Starts the shutdown; returns at once (see [`Drain::wait`]).
    pub fn begin(&self) {
        self.draining.store(true, Ordering::SeqCst);
        for s in self.sessions.lock().unwrap().values() {
            s.stop_reading();
        }
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Waits until every session has said goodbye, at most `limit`; false if some did not
    /// (a request stuck on the host, such as a read of a FIFO without a writer).
    pub fn wait(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let mut sessions = self.sessions.lock().unwrap();
        while !sessions.is_empty() {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return false;
            };
            sessions = self.left.wait_timeout(sessions, left).unwrap().0;
        }
        true
    }

    /// Registers a session's socket; None when it has none to stop (in-process streams).
    pub(crate) fn enter(self: &Arc<Self>, socket: &Option<Arc<Socket>>) -> Option<u64> {
        let socket = socket.as_ref()?;
        let key = self.next_key.fetch_add(1, Ordering::Relaxed);
        self.sessions.lock().unwrap().insert(key, socket.clone());
        if self.is_draining() {
            socket.stop_reading();
        }
        Some(key)
    }

    pub(crate) fn leave(&self, key: u64) {
        self.sessions.lock().unwrap().remove(&key);
        self.left.notify_all();
    }
}

impl std::fmt::Debug for Drain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Drain")
            .field("draining", &self.is_draining())
            .finish_non_exhaustive()
    }
}
