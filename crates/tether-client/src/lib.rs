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

// Only the connection (`tether check`) builds on other hosts: the rest is the FUSE mount,
// which is Linux's.
#[cfg(target_os = "linux")]
pub mod cache;
#[cfg(target_os = "linux")]
pub mod client;
#[cfg(target_os = "linux")]
mod control;
#[cfg(target_os = "linux")]
pub mod fuse;
#[cfg(target_os = "linux")]
pub mod invalidate;
#[cfg(target_os = "linux")]
mod kernel_ids;
#[cfg(target_os = "linux")]
pub mod known;
#[cfg(target_os = "linux")]
pub mod mount;
#[cfg(target_os = "linux")]
pub mod restore;
pub mod rpc;
#[cfg(target_os = "linux")]
pub mod status;
#[cfg(target_os = "linux")]
pub mod sync;
#[cfg(target_os = "linux")]
mod sys;
#[cfg(target_os = "linux")]
pub mod write;

#[cfg(target_os = "linux")]
pub use cache::coherence::Coherence;
#[cfg(target_os = "linux")]
pub use client::Client;
#[cfg(target_os = "linux")]
pub use fuse::fs::{CachePolicy, TetherFs};
pub use rpc::Connection;
#[cfg(target_os = "linux")]
pub use write::mode::WriteMode;
