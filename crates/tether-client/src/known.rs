//! The nodes and open handles the kernel holds, and where each node was last seen: what a
//! reconnect must find again (restore.rs) and what the client's helpers use to name a node
//! (a path for the writeback cache's fixer, the prefetch's listers, the lock thread).

use std::hash::{DefaultHasher, Hash, Hasher};
use std::os::unix::ffi::OsStrExt;
use std::sync::{Mutex, MutexGuard};

use dashmap::DashMap;
use tether_proto::{Caller, HandleId, NodeId, Timespec, ROOT_NODE};

/// Where a node was last seen, and how many lookups the kernel holds on it.
pub(crate) struct Place {
    pub(crate) parent: NodeId,
    pub(crate) name: Box<[u8]>,
    /// Counted like the kernel's nlookup, so that a FORGET handled after a racing LOOKUP
    /// of the same node (two FUSE threads) still leaves it known.
    pub(crate) lookups: u64,
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
    pub(crate) places: DashMap<NodeId, Place>,
    /// Each node's lookup given to the kernel, counted together with what the client
    /// records about it, and the drop of its last lookup together with what the client
    /// forgets then (see [`Known::given`]). By node number, modulo.
    node_locks: [Mutex<()>; NODE_LOCKS],
    /// (parent, hash of name) -> node, to follow renames made through the mount. A hash
    /// collision only loses track of a renamed node (it is then lost at a reconnect).
    by_name: DashMap<(NodeId, u64), NodeId>,
    pub(crate) handles: DashMap<HandleId, OpenHandle>,
    /// Creations answered with spare files whose BIND has no reply yet.
    pub(crate) bindings: DashMap<NodeId, Binding>,
}

fn name_key(parent: NodeId, name: &[u8]) -> (NodeId, u64) {
    let mut h = DefaultHasher::new();
    name.hash(&mut h);
    (parent, h.finish())
}

impl Known {
    fn lock(&self, node: NodeId) -> MutexGuard<'_, ()> {
        // The id's value only spreads the nodes over the locks.
        let lock = &self.node_locks[(node.get() % NODE_LOCKS as u64) as usize];
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
        // (No server issues node 0; one that did would not have it placed.)
        if node == ROOT_NODE || node.get() == 0 || name == b"." || name == b".." {
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
        self.handles.insert(fh, h);
    }

    pub fn released(&self, fh: HandleId) {
        self.handles.remove(&fh);
    }

    /// (nodes, open handles) known.
    pub fn counts(&self) -> (usize, usize) {
        (self.places.len(), self.handles.len())
    }
}
