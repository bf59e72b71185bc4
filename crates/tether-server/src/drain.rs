//! A graceful shutdown of every session of the server ([`Drain`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use tether_transport::Socket;

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
