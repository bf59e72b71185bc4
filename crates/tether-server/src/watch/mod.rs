//! Watching what the client holds, and telling it what changed.
//!
//! The seam is [`Watcher`]: a backend reports changes in the directories the session
//! watches, as [`WatchEvent`]s resolved to the directories' nodes. [`Watch`](coalesce::Watch)
//! (coalesce.rs) is what a session holds: a backend, and what turns its events into the
//! invalidations (and host events) the client is pushed, leaving out the echoes of the
//! session's own changes (echo.rs). The session pulls changes from `Watch` only, never
//! from a backend.
//!
//! Today's backend is Linux's (linux.rs): inotify (inotify.rs) for names, content and
//! attributes, with fanotify (fanotify.rs) saying which process made a change. Another
//! host, or a portable backend that sees paths only, implements [`Watcher`] beside it:
//! events without cookies pair no renames, and [`Batch::Overflow`] asks for everything the
//! client holds to be invalidated (a rescan).

pub mod coalesce;
pub mod echo;
#[cfg(target_os = "linux")]
pub mod fanotify;
#[cfg(target_os = "linux")]
pub mod inotify;
#[cfg(target_os = "linux")]
pub mod linux;
pub mod portable;

use std::collections::HashSet;
use std::io;
use std::os::fd::OwnedFd;
use std::time::Duration;

use tether_proto::NodeId;

/// A change to a name in a directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NameChange {
    Created,
    Deleted,
    MovedFrom,
    MovedTo,
}

/// What a [`WatchEvent`] says changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// A name was made, removed or moved. `cookie` pairs the two halves of a rename (0 when
    /// the backend cannot tell); `is_dir` says whether the name is a directory's.
    Name {
        change: NameChange,
        cookie: u32,
        is_dir: bool,
    },
    /// Content or attributes changed: [`tether_proto::changed`] bits.
    Content(u8),
    /// Events in this directory and below were lost (FSEvents' "must scan
    /// subdirectories"): everything the client holds there must be looked at again.
    Rescan,
}

/// One change in a watched directory.
#[derive(Debug, Clone)]
pub struct WatchEvent {
    /// The watched directory's node.
    pub dir: NodeId,
    /// The entry of `dir` the change is about; None for `dir` itself.
    pub name: Option<Vec<u8>>,
    pub change: Change,
}

/// Files in watched directories that another process changed: (directory node, name).
pub type ForeignChanged = HashSet<(NodeId, Vec<u8>)>;

pub enum Batch {
    /// The events, and the files another process changed (empty where the backend cannot
    /// tell: [`Watcher::tells_writers`]).
    Events(Vec<WatchEvent>, ForeignChanged),
    /// Events were lost: everything must be considered changed.
    Overflow,
}

/// A watching backend: reports changes in the directories it is told to watch.
pub trait Watcher: Send + Sync {
    /// Starts watching directory `node` (`fd` is its node descriptor): changes to its
    /// entries' names, content and attributes. False when the host refuses (a watch limit):
    /// that directory falls back to revalidation.
    fn watch_dir(&self, node: NodeId, fd: &OwnedFd) -> bool;
    /// Stops watching directory `node`; `fd`, if the server still has it, may help the
    /// backend let go of it.
    fn unwatch(&self, node: NodeId, fd: Option<&OwnedFd>);
    /// Waits up to `timeout` for an event to be queued, and no longer (letting a burst
    /// gather is [`Watch::wait`](coalesce::Watch::wait)'s); true if there is something to
    /// read, which another thread may read first.
    fn wait(&self, timeout: Duration) -> bool;
    /// Every event queued now, without waiting: each change a system call completed before
    /// this call is in it (a SYNC relies on this).
    fn drain(&self) -> io::Result<Batch>;
    /// Whether batches name the files other processes changed.
    fn tells_writers(&self) -> bool;
    /// Whether renames come as MovedFrom and MovedTo paired by cookies; a backend that sees
    /// paths only reports them as Deleted and Created (and the session's own renames are
    /// recognised so).
    fn pairs_renames(&self) -> bool {
        true
    }
    /// This session made the file `ino` without a name and holds it open for writing:
    /// events through that descriptor are its own (a backend that cannot see them ignores
    /// this).
    fn made_unnamed(&self, ino: u64);
}
