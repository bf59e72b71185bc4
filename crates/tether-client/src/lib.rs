//! Tether's guest side: a pipelined RPC connection to the server ([`rpc`]) and the FUSE
//! file system that the kernel talks to ([`fuse_fs`]).

pub mod coherence;
pub mod fuse_fs;
pub mod host_events;
pub mod io_uring;
pub mod known_attrs;
pub mod locks;
pub mod mount;
pub mod partial_pages;
pub mod prefetch;
pub mod restore;
pub mod rpc;
pub mod spares;
pub mod status;
pub mod sync;
mod sys;
pub mod write_behind;
pub mod write_mode;
pub mod writeback;
pub mod written_files;

pub use coherence::Coherence;
pub use fuse_fs::{CachePolicy, TetherFs};
pub use rpc::Connection;
pub use write_mode::WriteMode;
