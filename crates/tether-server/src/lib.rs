//! Tether's host side: accepts connections and serves an exported directory to each.
//!
//! Layers: [`session`] (one connection: handshake, request queue, workers, replies) over
//! [`export`] (the node and handle tables and every operation, as `*at()` syscalls).

pub mod export;
pub mod session;

use std::sync::Arc;
use std::thread;

pub use export::{Export, ExportOptions};
pub use session::{run_session, SessionLimits};
use tether_transport::Listener;

/// Accepts connections forever, serving each on its own thread.
pub fn serve(
    export: Arc<Export>,
    listener: Listener,
    limits: SessionLimits,
) -> std::io::Result<()> {
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
        let (export, limits) = (export.clone(), limits.clone());
        let peer = stream.peer.clone();
        thread::Builder::new()
            .name("tether-session".into())
            .spawn(move || {
                if let Err(e) = run_session(export, stream, &limits) {
                    tracing::warn!(peer = %peer, "session closed: {e}");
                }
            })?;
    }
}
