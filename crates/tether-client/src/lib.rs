//! Tether's guest side, in layers (each imports only those listed before it):
//!
//! - [`sys`]: what the kernel says (statx, the mount's own directory for helper threads);
//! - [`rpc`]: the pipelined connection to the server, with reconnects;
//! - [`known`]: the nodes and open handles the kernel holds, and where each was last seen;
//! - [`invalidate`]: host changes turned into the guest kernel's view (replays of host
//!   events, the writeback cache's fixer);
//! - [`cache`]: what the client keeps and how long it may trust it ([`Coherence`], whose
//!   invalidation thread drives the replays and fixes);
//! - [`write`]: how guest writes reach the host ([`WriteMode`]);
//! - [`fuse`]: the file system the kernel talks to;
//! - [`restore`], [`mount`]: putting it together; `control` (the mount process's socket),
//!   [`status`] and [`sync`]: what the CLI asks of a running mount.

pub mod cache;
pub mod client;
mod control;
pub mod fuse;
pub mod invalidate;
mod kernel_ids;
pub mod known;
pub mod mount;
pub mod restore;
pub mod rpc;
pub mod status;
pub mod sync;
mod sys;
pub mod write;

pub use cache::coherence::Coherence;
pub use client::Client;
pub use fuse::fs::{CachePolicy, TetherFs};
pub use rpc::Connection;
pub use write::mode::WriteMode;
