//! What one mount is made of that several of its parts read (the file system, the status
//! socket, a reconnect's restore): created before the kernel sees the mount, so that the
//! status socket reports on it from the first moment. Plain fields: whoever needs a part is
//! handed it.

use std::sync::{Arc, OnceLock};

use fuser::UringStats;

use crate::cache::coherence::Coherence;
use crate::rpc::Connection;
use crate::write::behind::WriteBehind;
use crate::write::mode::WriteMode;
use crate::write::spares::Spares;

pub struct Client {
    pub conn: Arc<Connection>,
    /// What the client keeps and how long it may trust it.
    pub co: Arc<Coherence>,
    /// Written-through writes answered before the server's reply (write/behind.rs).
    pub write_behind: Arc<WriteBehind>,
    /// Creations answered with spare files before the server named them (write/spares.rs).
    pub spares: Arc<Spares>,
    /// The io_uring queues' counters, once FUSE_INIT agreed on them (fuse/io_uring.rs).
    pub io_uring: OnceLock<Arc<UringStats>>,
}

impl Client {
    /// `co` must be the coherence state whose `on_push` receives `conn`'s pushes.
    pub fn new(conn: Arc<Connection>, co: Arc<Coherence>, writes: WriteMode) -> Arc<Client> {
        Arc::new(Client {
            conn,
            co,
            write_behind: Arc::new(WriteBehind::new(writes.writes_behind())),
            spares: Arc::new(Spares::new(writes.creates_behind())),
            io_uring: OnceLock::new(),
        })
    }
}
