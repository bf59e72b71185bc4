//! Fuzz targets for Tether, as plain functions over `&[u8]`, so that cargo-fuzz (the
//! `fuzz/` project at the repository root) and the stable smoke test (`tests/smoke.rs`)
//! run the same code. docs/fuzzing.md says what each target checks and how to run it.
//!
//! - [`frame`]: the frame header parser and `read_frame` on arbitrary byte streams.
//! - [`messages`]: every request, reply, push and HELLO decoder, with round trips.
//! - [`session`]: request frames executed by the server against a temporary export.
//!
//! Each target panics when an invariant breaks. Binaries that install [`TrackingAlloc`]
//! as their global allocator also get the memory bounds checked.

pub mod alloc;
pub mod frame;
pub mod messages;
pub mod seeds;
pub mod session;

pub use alloc::{MemScope, TrackingAlloc};
pub use frame::frame;
pub use messages::messages;
pub use session::session;

/// A fuzz target: one input, a panic when an invariant breaks.
pub type Target = fn(&[u8]);

/// The targets by name, as cargo-fuzz and the corpus directories name them.
pub const TARGETS: [(&str, Target); 3] = [
    ("frame", frame),
    ("messages", messages),
    ("session", session),
];
