//! The exported directory: what a session may do in it, with local-file-system semantics.
//!
//! Every operation names a node the server issued and at most one path component; names are
//! checked, and every syscall is relative to a held descriptor with no-follow flags. This
//! module holds the state the operations (ops/) work on: the export every session shares
//! (shared.rs), and one session's view of it (fs.rs) with its handles, kept write
//! descriptors, read-ahead and locks.

pub mod fs;
pub mod handles;
pub mod ids;
pub mod locks;
pub mod readahead;
pub mod shared;
pub mod writers;

/// The inotify record parser, where `tether::bench::latency` finds it.
#[cfg(target_os = "linux")]
pub mod watch {
    pub use crate::watch::inotify::records;
}

pub use fs::ExportFs;
pub use ids::{IdMap, SessionIds};
pub use locks::{LockWaits, LockWake};
pub use shared::{BackendKind, Export, ExportOptions};

pub use crate::nodes::{FdBudget, Node, NodeTable};
pub use crate::watch::coalesce::Changes;
