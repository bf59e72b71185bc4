//! Echo suppression: a session's own changes come back from the watcher too, and pushing
//! them would throw away the guest's caches after every write (docs/coherence.md, "Echo
//! suppression"). Two rules, each with a side the operations use and one the coalescing
//! (coalesce.rs) uses:
//!
//! - names: an operation records the name changes it is about to make ([`Expected`]); a
//!   matching event is consumed instead of pushed;
//! - content and attributes: each node holds the host ctime up to which the client is
//!   known to be coherent. An own change moves it forward ([`own_changes`]) if nothing
//!   else changed the node meanwhile; the watcher pushes a node whose ctime differs from it
//!   ([`changed_since_sync`]). Both read the ctime under the node's lock.

use std::ffi::CStr;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dashmap::DashMap;
use tether_proto::{NodeId, WireErrno};

use super::NameChange;
use crate::backend::{Backend, SysResult};
use crate::nodes::{Node, NodeTable};

/// How long an expected echo of the session's own change is kept.
const EXPECTATION_TTL: Duration = Duration::from_secs(10);

/// Name changes this session made itself and whose events it will see: (dir, name, kind)
/// -> (count, when). Creates and deletes of one name alternate, and moves carry cookies,
/// so the watcher never merges two of them: matching them one for one is exact.
#[derive(Default)]
pub struct Expected {
    changes: DashMap<(NodeId, Vec<u8>, NameChange), (u32, Instant)>,
}

impl Expected {
    /// Records that this session is about to make `change` to `name` in `dir`.
    pub fn expect(&self, dir: NodeId, name: &[u8], change: NameChange) {
        let mut e = self
            .changes
            .entry((dir, name.to_vec(), change))
            .or_insert((0, Instant::now()));
        e.0 += 1;
        e.1 = Instant::now();
    }

    /// Withdraws an expectation whose change did not happen (the operation failed).
    pub fn unexpect(&self, dir: NodeId, name: &[u8], change: NameChange) {
        let key = (dir, name.to_vec(), change);
        self.changes.remove_if_mut(&key, |_, v| {
            v.0 -= 1;
            v.0 == 0
        });
    }

    /// True (and consumed) when the event is the echo of this session's own change.
    pub fn is_own(&self, dir: NodeId, name: &[u8], change: NameChange) -> bool {
        let key = (dir, name.to_vec(), change);
        let mut own = false;
        self.changes.remove_if_mut(&key, |_, v| {
            own = v.1.elapsed() < EXPECTATION_TTL;
            v.0 -= 1;
            v.0 == 0 || !own
        });
        own
    }

    /// Events were lost: what they would have matched is gone too.
    pub fn forget(&self) {
        self.changes.clear();
    }
}

/// Runs `op`, this session's own change of `nodes` (each with a descriptor to read its
/// state through), so that its echo is recognised: a node the client was coherent with
/// before the change it is coherent with after it (its kernel saw the change happen). The
/// nodes' states are locked in node order, so that two changes sharing nodes cannot
/// deadlock. `size_after` gives the size a change of one node must leave, if it can tell,
/// from the size before and the change's result: a host change that came in the same
/// moment and left another size is then not taken for the session's own (its echo is
/// pushed). Also returns the nodes' states read after the change (in node order), which
/// the caller may reply with.
pub fn own_changes<T>(
    host: &dyn Backend,
    mut nodes: Vec<(&Node, BorrowedFd<'_>)>,
    op: impl FnOnce() -> SysResult<T>,
    size_after: impl Fn(u64, &T) -> Option<u64>,
) -> (SysResult<T>, Vec<Option<libc::stat>>) {
    nodes.sort_by_key(|(n, _)| n.id);
    nodes.dedup_by_key(|(n, _)| n.id);
    let ctime = |st: &libc::stat| (st.st_ctime, st.st_ctime_nsec);
    let mut held: Vec<_> = nodes
        .iter()
        .map(|(n, fd)| (n.id, n.synced_ctime.lock().unwrap(), host.stat(*fd), *fd))
        .collect();
    let r = op();
    let mut states = Vec::with_capacity(held.len());
    for (id, synced, before, fd) in &mut held {
        let after = host.stat(*fd).ok();
        states.push(after);
        let (Ok(before), Some(after)) = (before, after) else {
            continue;
        };
        if ctime(before) != **synced {
            continue;
        }
        let size_now = after.st_size as u64;
        let expected = r
            .as_ref()
            .ok()
            .and_then(|v| size_after(before.st_size as u64, v));
        if expected.is_some_and(|s| s != size_now) {
            tracing::debug!(
                node = %id,
                ?expected,
                size_now,
                "a host change came with an own change"
            );
            continue;
        }
        **synced = ctime(&after);
    }
    (r, states)
}

/// Whether the host state of `node` differs from what the client is coherent with; if
/// so, the client is about to be told, so that state becomes the coherent one. The state
/// is read under the node's lock, so it cannot interleave with an own change.
///
/// `named` is where the watcher found the node (a directory and a name in it): a spare
/// file the session is naming (BIND, ops/spare.rs) has neither a descriptor in the table
/// nor a location for a moment after its link, and its creation's event may be read in
/// that moment; it is stat'ed by that name then.
pub fn changed_since_sync(
    host: &dyn Backend,
    nodes: &NodeTable,
    node: &Arc<Node>,
    named: Option<(BorrowedFd<'_>, &CStr)>,
) -> bool {
    let mut synced = node.synced_ctime.lock().unwrap();
    let st = match (nodes.fd(node), named) {
        (Ok(fd), _) => host.stat(fd.as_fd()),
        (Err(_), Some((dir, name))) => host
            .stat_at(dir, name)
            .ok()
            .filter(|st| nodes.id_for(st.st_dev as u64, st.st_ino) == node.id)
            .ok_or(WireErrno::ESTALE),
        (Err(e), None) => Err(e),
    };
    let Ok(st) = st else {
        return true;
    };
    let now = (st.st_ctime, st.st_ctime_nsec);
    if *synced == now {
        return false;
    }
    tracing::trace!(
        node = %node.id,
        ?synced,
        ?now,
        "changed behind the client's back"
    );
    *synced = now;
    true
}
