//! Tether's wire protocol: frames, messages, handshake and errno mapping.
//!
//! This crate does no I/O and reads no clock, so every message can be tested byte by byte and
//! fuzzed. `docs/protocol.md` is the byte-level specification; the golden tests in
//! `tests/golden.rs` pin this code to it.

pub mod auth;
pub mod codec;
pub mod errno;
pub mod frame;
pub mod handshake;
mod ids;
pub mod message;
pub mod push;

pub use codec::{DecodeError, Decoder, Encoder};
pub use errno::WireErrno;
pub use frame::{FrameHeader, FrameKind, FRAME_HEADER_LEN, MAX_FRAME_LEN};
pub use handshake::{Challenge, Hello, HelloReply, IdMapping, MAGIC, PROTOCOL_VERSION};
pub use message::*;
pub use push::{
    changed, decode_invalidate, decode_lock_freed, goodbye_frame, invalidate_frame,
    invalidate_frames, lock_freed_frame, push_op, EventKind, HostEvent, InvalidatePush,
    Invalidation,
};

pub use ids::{HandleId, NodeId, ROOT_NODE};

/// Longest name a component may have (Linux NAME_MAX).
pub const NAME_MAX: usize = 255;

/// Whether `name` is one path component as docs/protocol.md §5 allows it on the wire: not
/// empty, not `.` or `..`, without `/` or NUL. (Length is checked against [`NAME_MAX`]
/// separately, since it gets its own errno.)
pub fn is_component(name: &[u8]) -> bool {
    !(name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') || name.contains(&0))
}
