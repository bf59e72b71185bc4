//! What a reconnect must re-create on the new server session: every node the kernel holds
//! (found again by the name it was last seen under, and kept only if it is still the same
//! file, or bound again if it was a spare file whose BIND had no reply) and every open
//! handle (opened again under the number the kernel knows). See protocol.md §15.

use std::collections::HashSet;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use dashmap::DashMap;
use tether_proto::{
    entry_flags, Caller, HandleId, LockSpec, NodeId, Reply, Request, Timespec, WireErrno, ROOT_NODE,
};

use crate::coherence::Coherence;
use crate::locks::HeldLocks;
use crate::rpc::{Connection, Restorer};

/// Where a node was last seen, and how many lookups the kernel holds on it.
struct Place {
    parent: NodeId,
    name: Box<[u8]>,
    /// Counted like the kernel's nlookup, so that a FORGET handled after a racing LOOKUP
    /// of the same node (two FUSE threads) still leaves it known.
    lookups: u64,
}

/// An open handle the kernel uses, and how to open it again.
#[derive(Debug, Clone, Copy)]
pub struct OpenHandle {
    pub node: NodeId,
    pub flags: u32,
    pub dir: bool,
}

/// A creation answered with a spare file (create-behind) whose BIND has no reply yet: what
/// binding it again needs after a reconnect, since the spare went with its session.
#[derive(Debug, Clone, Copy)]
pub struct Binding {
    pub caller: Caller,
    /// The spare's generation, which the kernel knows the file by.
    pub generation: u64,
    pub mode: u32,
    pub umask: u32,
    pub time: Timespec,
}

/// How many locks `Known` shares out among nodes.
const NODE_LOCKS: usize = 32;

/// The nodes and handles the kernel holds, as a reconnect needs them.
#[derive(Default)]
pub struct Known {
    places: DashMap<NodeId, Place>,
    /// Each node's lookup given to the kernel, counted together with what the client
    /// records about it, and the drop of its last lookup together with what the client
    /// forgets then (see [`Known::given`]). By node number, modulo.
    node_locks: [Mutex<()>; NODE_LOCKS],
    /// (parent, hash of name) -> node, to follow renames made through the mount. A hash
    /// collision only loses track of a renamed node (it is then lost at a reconnect).
    by_name: DashMap<(NodeId, u64), NodeId>,
    handles: DashMap<HandleId, OpenHandle>,
    /// Creations answered with spare files whose BIND has no reply yet.
    bindings: DashMap<NodeId, Binding>,
}

fn name_key(parent: NodeId, name: &[u8]) -> (NodeId, u64) {
    let mut h = DefaultHasher::new();
    name.hash(&mut h);
    (parent, h.finish())
}

impl Known {
    fn lock(&self, node: NodeId) -> MutexGuard<'_, ()> {
        let lock = &self.node_locks[(node % NODE_LOCKS as u64) as usize];
        lock.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The kernel is given `node` as `name` in `parent`: `record` notes what the client
    /// keeps about it and returns whether the kernel got it, and if so one more lookup is
    /// counted. Both under the node's lock, which [`Known::forgotten`] takes too: the
    /// kernel may drop an inode (FORGET) while a LOOKUP gives it the same node again, and
    /// a FORGET handled between `record` and the count would erase what `record` kept
    /// about the new inode. (The writeback cache's fixer then no longer knew the kernel
    /// held the file, and the kernel kept a host-changed file's old size for good.)
    pub fn given(&self, parent: NodeId, name: &[u8], node: NodeId, record: impl FnOnce() -> bool) {
        let _node = self.lock(node);
        if record() {
            self.place(parent, name, node, 1);
        }
    }

    /// Where `node` was last seen: (parent, name).
    pub fn place_of(&self, node: NodeId) -> Option<(NodeId, Box<[u8]>)> {
        self.places.get(&node).map(|p| (p.parent, p.name.clone()))
    }

    /// The path of `node` below the mount's root, from where each node on the way was
    /// last seen (None if one is unknown). Only as good as those places: a rename in
    /// progress may lead elsewhere.
    pub fn path_of(&self, mut node: NodeId) -> Option<std::path::PathBuf> {
        let mut names = Vec::new();
        while node != ROOT_NODE {
            let (parent, name) = self.place_of(node)?;
            names.push(name);
            node = parent;
            if names.len() > 4096 {
                return None; // a loop, from places recorded at different times
            }
        }
        let mut path = std::path::PathBuf::from(".");
        for name in names.iter().rev() {
            path.push(std::ffi::OsStr::from_bytes(name));
        }
        Some(path)
    }

    /// Records `node`'s place, adding `lookups` to its count.
    fn place(&self, parent: NodeId, name: &[u8], node: NodeId, lookups: u64) {
        if node == ROOT_NODE || node == 0 || name == b"." || name == b".." {
            return;
        }
        let key = name_key(parent, name);
        let old_key = {
            let mut p = self.places.entry(node).or_insert_with(|| Place {
                parent,
                name: name.into(),
                lookups: 0,
            });
            p.lookups += lookups;
            let old_key = name_key(p.parent, &p.name);
            if old_key != key {
                p.parent = parent;
                p.name = name.into();
            }
            old_key
        };
        if old_key != key {
            self.by_name.remove_if(&old_key, |_, n| *n == node);
        }
        self.by_name.insert(key, node);
    }

    /// `name` in `parent` was renamed through the mount (with `exchange`, the two names
    /// swapped their files).
    pub fn renamed(
        &self,
        parent: NodeId,
        name: &[u8],
        new_parent: NodeId,
        new_name: &[u8],
        exchange: bool,
    ) {
        let moved = self.by_name.remove(&name_key(parent, name));
        let other = exchange
            .then(|| self.by_name.remove(&name_key(new_parent, new_name)))
            .flatten();
        if let Some((_, node)) = moved {
            self.place(new_parent, new_name, node, 0);
        }
        if let Some((_, node)) = other {
            self.place(parent, name, node, 0);
        }
    }

    /// The kernel dropped `lookups` of its lookups of `node`. If it holds none now,
    /// `forget` drops what the client keeps about it, given the directory `node` was last
    /// seen in, if known; under the node's lock (see [`Known::given`]).
    pub fn forgotten(&self, node: NodeId, lookups: u64, forget: impl FnOnce(Option<NodeId>)) {
        let _node = self.lock(node);
        let gone = self.places.remove_if_mut(&node, |_, p| {
            p.lookups = p.lookups.saturating_sub(lookups);
            p.lookups == 0
        });
        match gone {
            Some((_, p)) => {
                self.by_name
                    .remove_if(&name_key(p.parent, &p.name), |_, n| *n == node);
                forget(Some(p.parent));
            }
            None if !self.places.contains_key(&node) => forget(None),
            None => {}
        }
    }

    /// BIND of `node` is about to be sent.
    pub fn binding(&self, node: NodeId, b: Binding) {
        self.bindings.insert(node, b);
    }

    /// BIND of `node` has its final reply.
    pub fn bound(&self, node: NodeId) {
        self.bindings.remove(&node);
    }

    pub fn opened(&self, fh: HandleId, h: OpenHandle) {
        if fh != 0 {
            self.handles.insert(fh, h);
        }
    }

    pub fn released(&self, fh: HandleId) {
        self.handles.remove(&fh);
    }

    /// (nodes, open handles) known.
    pub fn counts(&self) -> (usize, usize) {
        (self.places.len(), self.handles.len())
    }
}

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
    snapshot: Mutex<Snapshot>,
}

impl Restore {
    /// `locks`: the host locks this guest holds (none when locks stay in the guest).
    pub fn new(known: Arc<Known>, co: Arc<Coherence>, locks: Option<Arc<HeldLocks>>) -> Restore {
        Restore {
            known,
            co,
            locks,
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
                        if let Some(s) = self.co.spares.get() {
                            s.counters.named_again.fetch_add(1, Ordering::Relaxed);
                        }
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
                fh,
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
        let node = 7;
        known.given(1, b"f", node, || true); // the inode the kernel is about to drop
        let recorded = Arc::new(Mutex::new(HashSet::new()));
        let (recording, forget_now) = channel();
        let giver = {
            let (known, recorded) = (known.clone(), recorded.clone());
            std::thread::spawn(move || {
                known.given(1, b"f", node, || {
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
