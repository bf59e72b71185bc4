//! Tether's host side: accepts connections and serves an exported directory to each.
//!
//! Layers, each using only those below it: [`server`] (the accept loop) over [`session`]
//! (one connection: handshake, request queue, workers, replies, pushes) over [`ops`] (each
//! request decoded is dispatched to its operation) over [`export`] (a session's state: nodes,
//! handles, locks, kept descriptors) and [`watch`] (what changed on the host, as
//! invalidations for the client) over [`nodes`] (the node table) over [`backend`] (the
//! host's file system calls). [`drain`] is the graceful shutdown the server and its
//! sessions share.

// libc's types differ between the hosts (mode_t is u16, dev_t i32 and the F_*LCK constants
// i16 on macOS): casts that do nothing on Linux are needed on macOS.
#![allow(clippy::unnecessary_cast)]

pub mod backend;
pub mod drain;
pub mod export;
pub mod nodes;
pub mod ops;
pub mod server;
pub mod session;
pub mod watch;

#[cfg(test)]
mod tests;

pub use drain::Drain;
pub use export::{BackendKind, Export, ExportOptions, IdMap};
pub use server::{serve, ServeOptions};
pub use session::{run_session, SessionLimits};
