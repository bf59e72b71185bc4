//! The accept loop: who may connect ([`ServeOptions`]), and a thread per admitted
//! connection running its session (session.rs).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;

use tether_transport::{Listener, PeerCred};

use crate::drain::Drain;
use crate::export::Export;
use crate::session::{self, run_session, SessionLimits};

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
