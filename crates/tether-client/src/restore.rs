//! What a reconnect must re-create on the new server session: every node the kernel holds
//! (found again by the name it was last seen under, and kept only if it is still the same
//! file, or bound again if it was a spare file whose BIND had no reply) and every open
//! handle (opened again under the number the kernel knows). See protocol.md §15.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tether_proto::{
    entry_flags, Caller, HandleId, LockSpec, NodeId, Reply, Request, WireErrno, ROOT_NODE,
};

use crate::cache::coherence::Coherence;
use crate::fuse::locks::HeldLocks;
use crate::known::{Binding, Known, OpenHandle};
use crate::rpc::{Connection, Restorer};
use crate::write::spares::Spares;

/// A node the kernel holds, as a restore finds it again.
struct KnownNode {
    node: NodeId,
    parent: NodeId,
    name: Box<[u8]>,
    lookups: u64,
    /// Its BIND, if it has no reply yet.
    binding: Option<Binding>,
}

/// What a restore re-creates: the nodes, the open handles and the locks held on the host.
#[derive(Default)]
struct Snapshot {
    nodes: Vec<KnownNode>,
    handles: Vec<(HandleId, OpenHandle)>,
    locks: Vec<(NodeId, LockSpec, u64)>,
}

/// Re-creates the known nodes, handles and host locks on a new connection.
pub struct Restore {
    known: Arc<Known>,
    co: Arc<Coherence>,
    locks: Option<Arc<HeldLocks>>,
    /// Counts the creations named again (spares made ahead went with the old session).
    spares: Arc<Spares>,
    snapshot: Mutex<Snapshot>,
}

impl Restore {
    /// `locks`: the host locks this guest holds (none when locks stay in the guest).
    pub fn new(
        known: Arc<Known>,
        co: Arc<Coherence>,
        locks: Option<Arc<HeldLocks>>,
        spares: Arc<Spares>,
    ) -> Restore {
        Restore {
            known,
            co,
            locks,
            spares,
            snapshot: Mutex::default(),
        }
    }

    /// Looks every known node up again, parents before children. Returns how many were
    /// lost (gone, or now another file).
    fn nodes(&self, conn: &Connection) -> Result<usize, WireErrno> {
        let mut todo = std::mem::take(&mut self.snapshot.lock().unwrap().nodes);
        let mut found: HashSet<NodeId> = HashSet::from([ROOT_NODE]);
        let mut lost = Vec::new();
        while !todo.is_empty() {
            let (ready, rest): (Vec<_>, Vec<_>) =
                todo.into_iter().partition(|n| found.contains(&n.parent));
            if ready.is_empty() {
                // Their parents were lost: so are they.
                lost.extend(rest.into_iter().map(|n| n.node));
                break;
            }
            let (tx, rx) = mpsc::channel();
            for n in &ready {
                let (tx, node, parent, lookups) = (tx.clone(), n.node, n.parent, n.lookups);
                let name = bytes::Bytes::copy_from_slice(&n.name);
                let (caller, req) = match n.binding {
                    // Its spare went with the old session: BIND makes the file anew under
                    // the same id, or finds it bound by the old session (protocol.md §17).
                    Some(b) => (
                        b.caller,
                        Request::Bind {
                            parent,
                            name: name.clone(),
                            node,
                            mode: b.mode,
                            umask: b.umask,
                            time: b.time,
                        },
                    ),
                    // As many lookups as the kernel holds, so that its FORGETs add up.
                    None => (
                        Caller::default(),
                        Request::Reclaim {
                            parent,
                            name: name.clone(),
                            lookups,
                        },
                    ),
                };
                let spare_generation = n.binding.map(|b| b.generation);
                let more = (n.binding.is_some() && lookups > 1).then(|| Request::Reclaim {
                    parent,
                    name,
                    lookups: lookups - 1,
                });
                conn.call_restoring(caller, &req, move |r| {
                    let _ = tx.send((node, lookups, more, spare_generation, r));
                });
            }
            drop(tx);
            for (node, lookups, more, spare_generation, r) in rx.iter() {
                match r {
                    Ok(Reply::Entry(e)) if e.node == node => {
                        self.co
                            .set_watched(node, e.flags & entry_flags::WATCHED != 0);
                        found.insert(node);
                    }
                    Ok(Reply::Create { entry: e, .. }) if e.node == node => {
                        self.spares
                            .counters
                            .named_again
                            .fetch_add(1, Ordering::Relaxed);
                        if let Some(g) = spare_generation.filter(|&g| g != e.generation) {
                            self.co.keep_generation(node, g);
                        }
                        // BIND counted one lookup; the kernel may hold more.
                        if let Some(more) = more {
                            conn.call_restoring(Caller::default(), &more, move |r| {
                                if let Err(e) = r {
                                    tracing::warn!("node {node}: its lookups not counted: {e}");
                                }
                            });
                        }
                        found.insert(node);
                    }
                    Ok(Reply::Entry(e)) => {
                        // Another file has the name now; the kernel's node is stale.
                        let forget = Request::Forget {
                            nodes: vec![(e.node, lookups)],
                        };
                        conn.send_oneway_restoring(Caller::default(), &forget);
                        lost.push(node);
                    }
                    Err(WireErrno::EIO) => return Err(WireErrno::EIO),
                    other => {
                        tracing::debug!("node {node} is gone: {other:?}");
                        lost.push(node)
                    }
                }
            }
            todo = rest;
        }
        // Requests for lost nodes get ESTALE from the server, which never heard of them.
        for node in &lost {
            self.known.forgotten(*node, u64::MAX, |_| {});
        }
        Ok(lost.len())
    }

    /// Opens every known handle again under its number. Returns how many could not be.
    fn handles(&self, conn: &Connection) -> Result<usize, WireErrno> {
        let handles = std::mem::take(&mut self.snapshot.lock().unwrap().handles);
        let (tx, rx) = mpsc::channel();
        for (fh, h) in handles {
            let tx = tx.clone();
            let req = Request::Reopen {
                node: h.node,
                fh: Some(fh),
                flags: h.flags,
                dir: h.dir,
            };
            conn.call_restoring(Caller::default(), &req, move |r| {
                let _ = tx.send((fh, r));
            });
        }
        drop(tx);
        let mut lost = 0;
        for (fh, r) in rx.iter() {
            match r {
                Ok(_) => {}
                Err(WireErrno::EIO) => return Err(WireErrno::EIO),
                Err(e) => {
                    // I/O through it now fails with EBADF.
                    tracing::warn!("open handle {fh} could not be opened again: {e}");
                    self.known.released(fh);
                    lost += 1;
                }
            }
        }
        Ok(lost)
    }

    /// Takes every held lock again (the new session holds none). Another process may have
    /// taken one while the server was away: that lock is lost, and said so. Returns how
    /// many were taken again and how many were lost.
    fn locks(&self, conn: &Connection) -> Result<(usize, usize), WireErrno> {
        let (Some(held), locks) = (
            &self.locks,
            std::mem::take(&mut self.snapshot.lock().unwrap().locks),
        ) else {
            return Ok((0, 0));
        };
        let (tx, rx) = mpsc::channel();
        for (node, lock, generation) in locks {
            if node != ROOT_NODE && !self.known.places.contains_key(&node) {
                held.released(node, lock.owner, generation); // the node itself is lost
                continue;
            }
            let tx = tx.clone();
            let req = Request::Setlk {
                node,
                lock,
                generation,
            };
            conn.call_restoring(Caller::default(), &req, move |r| {
                let _ = tx.send((node, lock, generation, r));
            });
        }
        drop(tx);
        let (mut taken, mut lost) = (0, 0);
        for (node, lock, generation, r) in rx.iter() {
            match r {
                Ok(_) => taken += 1,
                Err(WireErrno::EIO) => return Err(WireErrno::EIO),
                Err(e) => {
                    tracing::error!(
                        "a lock on node {node} (bytes {}..={}) could not be taken again after \
                         the reconnect ({e}): another process took it while the server was \
                         away; its holder here no longer excludes others",
                        lock.start,
                        lock.end
                    );
                    held.released(node, lock.owner, generation);
                    lost += 1;
                }
            }
        }
        Ok((taken, lost))
    }
}

impl Restorer for Restore {
    fn lost(&self) {
        // Host changes made from now on are not pushed: caches served while the server
        // is away could be stale for good, so accesses wait for the server instead.
        self.co.distrust_all(Duration::from_millis(100));
    }

    fn snapshot(&self) {
        *self.snapshot.lock().unwrap() = Snapshot {
            nodes: (self.known.places.iter())
                .map(|e| KnownNode {
                    node: *e.key(),
                    parent: e.parent,
                    name: e.name.clone(),
                    lookups: e.lookups,
                    binding: self.known.bindings.get(e.key()).map(|b| *b),
                })
                .collect(),
            handles: (self.known.handles.iter())
                .map(|e| (*e.key(), *e))
                .collect(),
            locks: self.locks.as_ref().map(|l| l.all()).unwrap_or_default(),
        };
    }

    fn restore(&self, conn: &Connection) -> Result<(), WireErrno> {
        // Changes made while the connection was down were never pushed, and the kernel
        // may have cached replies that raced the loss.
        self.co.distrust_all(Duration::from_millis(100));
        let lost_nodes = self.nodes(conn)?;
        let lost_handles = self.handles(conn)?;
        let (locks, lost_locks) = self.locks(conn)?;
        let (nodes, handles) = self.known.counts();
        tracing::warn!(
            "restored {nodes} node(s), {handles} open handle(s) and {locks} lock(s) on the new \
             connection; {lost_nodes} node(s), {lost_handles} handle(s) and {lost_locks} \
             lock(s) were gone"
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;

    /// The interleaving that lost the writeback fixer's record of a file (fsx, about one
    /// run in 100 on a loaded machine): the kernel dropped an inode and looked the same
    /// node up again; the LOOKUP's reply recorded the new inode, then the old inode's
    /// FORGET, handled on another thread before the reply counted its lookup, erased it.
    /// A FORGET must wait for a lookup being given: its count then keeps the node known,
    /// and what was recorded stays.
    #[test]
    fn a_forget_racing_a_lookup_of_the_same_node_keeps_what_the_lookup_recorded() {
        let known = Arc::new(Known::default());
        let (dir, node) = (NodeId::new(1), NodeId::new(7));
        known.given(dir, b"f", node, || true); // the inode the kernel is about to drop
        let recorded = Arc::new(Mutex::new(HashSet::new()));
        let (recording, forget_now) = channel();
        let giver = {
            let (known, recorded) = (known.clone(), recorded.clone());
            std::thread::spawn(move || {
                known.given(dir, b"f", node, || {
                    recorded.lock().unwrap().insert(node);
                    recording.send(()).unwrap();
                    // Room for the FORGET to run in between, if nothing stops it.
                    std::thread::sleep(Duration::from_millis(100));
                    true
                })
            })
        };
        forget_now.recv().unwrap();
        known.forgotten(node, 1, |_| {
            recorded.lock().unwrap().remove(&node);
        });
        giver.join().unwrap();
        assert!(
            recorded.lock().unwrap().contains(&node),
            "the FORGET of the old inode erased what the new lookup recorded"
        );
        assert_eq!(known.counts().0, 1, "the new lookup is still counted");
        // Its own FORGET does drop it.
        known.forgotten(node, 1, |_| {
            recorded.lock().unwrap().remove(&node);
        });
        assert!(recorded.lock().unwrap().is_empty());
        assert_eq!(known.counts().0, 0);
    }
}
