//! The node table: every node the client holds, keyed by node id, in a sharded map (no global
//! lock; O(1) at millions of entries).
//!
//! Node ids are the host inode numbers for files on the export's own file system, so the
//! guest's st_ino and readdir d_ino agree with the host and stay the same across server
//! restarts; inodes of other file systems mounted inside the export get synthetic ids.
//!
//! Descriptors are bounded: each node holds an O_PATH descriptor while it can, and the
//! oldest ones are closed when the export-wide budget is exceeded. A node without a
//! descriptor is found again by (parent, name) and checked against its inode number. Nodes
//! that could not be found that way keep their descriptors, up to a quarter beyond the
//! budget (a guest must not be able to exhaust the server's descriptors): a file with no name
//! left (unlinked while the guest holds it open) and one whose last-seen name was removed
//! through this server.
//!
//! An inode number can be reused once the file is gone and no descriptor holds it. A node is
//! therefore also identified by its kind and birth time: a new file that got a held node's
//! number gets a synthetic id of its own, and the old node answers ESTALE.

use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};

use crossbeam_queue::SegQueue;
use dashmap::DashMap;
use tether_proto::{NodeId, WireErrno, ROOT_NODE};

use crate::backend::{Backend, SysResult};

/// Where a node was last seen, to find it again after its descriptor was closed.
#[derive(Clone)]
struct Location {
    parent: NodeId,
    name: CString,
}

pub struct Node {
    pub id: NodeId,
    pub generation: u64,
    pub dev: u64,
    pub ino: u64,
    /// S_IFMT bits of the node.
    pub kind: u32,
    /// Birth time, where the file system records it.
    birth: Option<(i64, u32)>,
    fd: RwLock<Option<Arc<OwnedFd>>>,
    location: Mutex<Option<Location>>,
    /// Lookups the client holds; changed only under the table's entry lock.
    lookups: AtomicU64,
    budget: Arc<FdBudget>,
    /// The host ctime up to which the client's caches of this node are known to be
    /// coherent (see docs/coherence.md, echo suppression). Also serializes this session's
    /// own mutations of the node against the watcher's checks.
    pub synced_ctime: Mutex<(i64, i64)>,
    /// A directory with an inotify watch: changes in it are pushed to the client.
    pub watched: AtomicBool,
    /// The name the node was last seen under was removed through this server (unlink,
    /// rmdir, a rename over it): it cannot be found again, so its descriptor is kept.
    pinned: AtomicBool,
}

impl Node {
    pub fn is_dir(&self) -> bool {
        self.kind == crate::backend::S_IFDIR
    }
    pub fn is_symlink(&self) -> bool {
        self.kind == crate::backend::S_IFLNK
    }

    /// The directory the node was last seen in.
    pub fn parent(&self) -> Option<NodeId> {
        (self.location.lock().unwrap().as_ref()).map(|l| l.parent)
    }

    /// The directory and name the node was last seen under.
    pub fn location(&self) -> Option<(NodeId, CString)> {
        (self.location.lock().unwrap().as_ref()).map(|l| (l.parent, l.name.clone()))
    }

    /// Whether the name the node was last seen under ends with `suffix`.
    pub fn name_ends_with(&self, suffix: &[u8]) -> bool {
        (self.location.lock().unwrap().as_ref())
            .is_some_and(|l| l.name.as_bytes().ends_with(suffix))
    }

    /// Whether `st` (with birth time `birth`) is this node's file, not a later one that got
    /// the same inode number.
    pub fn same_file(&self, st: &libc::stat, birth: Option<(i64, u32)>) -> bool {
        st.st_dev as u64 == self.dev
            && st.st_ino == self.ino
            && crate::backend::file_type(st) == self.kind
            && (self.birth.is_none() || birth.is_none() || self.birth == birth)
    }

    fn has_fd(&self) -> bool {
        self.fd.read().unwrap().is_some()
    }

    /// The node's descriptor if it still has one (never reopened: see [`NodeTable::fd`]).
    pub fn open_fd(&self) -> Option<Arc<OwnedFd>> {
        self.fd.read().unwrap().clone()
    }

    /// Whether the node can be found again by name once its descriptor is closed: not when
    /// the name it was last seen under was removed, nor when the file has no name left at
    /// all (unlinked while the guest holds it, typically open). Closing such a descriptor
    /// would turn every later request for the node, I/O on the open file included, into
    /// ESTALE.
    fn refindable(&self, host: &dyn Backend) -> bool {
        if self.pinned.load(Ordering::SeqCst) {
            return false;
        }
        let fd = self.fd.read().unwrap().clone();
        match fd {
            Some(fd) => host
                .stat(fd.as_fd())
                .map(|st| st.st_nlink > 0)
                .unwrap_or(true),
            None => true,
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if self.fd.get_mut().map(|f| f.is_some()).unwrap_or(false) {
            self.budget.open.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// The export-wide limit on node descriptors, with oldest-first eviction.
pub struct FdBudget {
    open: AtomicUsize,
    cap: usize,
    order: SegQueue<Weak<Node>>,
    evicted: AtomicU64,
}

impl FdBudget {
    pub fn new(cap: usize) -> Arc<FdBudget> {
        Arc::new(FdBudget {
            open: AtomicUsize::new(0),
            cap: cap.max(16),
            order: SegQueue::new(),
            evicted: AtomicU64::new(0),
        })
    }

    /// The most node descriptors the export keeps open (a quarter more for nodes that
    /// cannot be found again by name).
    pub fn cap(&self) -> usize {
        self.cap
    }

    pub fn open_count(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    pub fn evictions(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }

    fn opened(&self, node: &Arc<Node>, host: &dyn Backend) {
        self.open.fetch_add(1, Ordering::Relaxed);
        self.order.push(Arc::downgrade(node));
        // One pass over the queue at most: the root and nodes that could not be found again
        // keep their descriptors (they go to the back of the queue), the latter up to the
        // hard cap.
        let hard_cap = self.cap + self.cap / 4;
        let queued = self.order.len();
        let mut looked = 0;
        while self.open.load(Ordering::Relaxed) > self.cap && looked < queued {
            looked += 1;
            let Some(old) = self.order.pop() else { break };
            let Some(old) = old.upgrade() else { continue };
            let strict = self.open.load(Ordering::Relaxed) > hard_cap;
            if old.id == ROOT_NODE || (!strict && !old.refindable(host)) {
                self.order.push(Arc::downgrade(&old));
                continue;
            }
            let mut slot = old.fd.write().unwrap();
            // Checked again under the lock: see `NodeTable::name_removed`.
            if !strict && old.pinned.load(Ordering::SeqCst) {
                drop(slot);
                self.order.push(Arc::downgrade(&old));
                continue;
            }
            if slot.take().is_some() {
                self.open.fetch_sub(1, Ordering::Relaxed);
                self.evicted.fetch_add(1, Ordering::Relaxed);
            }
        }
        // Entries of forgotten nodes linger in the queue; sweep them when it grows.
        if self.order.len() > 2 * self.cap + 1024 {
            for _ in 0..self.order.len() {
                match self.order.pop() {
                    Some(w) if w.strong_count() > 0 => self.order.push(w),
                    Some(_) => {}
                    None => break,
                }
            }
        }
    }
}

pub struct NodeTable {
    nodes: DashMap<NodeId, Arc<Node>>,
    /// Synthetic ids for inodes on other file systems than the export root's, and for files
    /// that got the inode number of a node the client still holds.
    foreign: DashMap<(u64, u64), NodeId>,
    /// Whether any file of the root's file system has a synthetic id (skips a lookup).
    any_reused: AtomicBool,
    next_foreign: AtomicU64,
    root_dev: u64,
    root_ino: u64,
    budget: Arc<FdBudget>,
    host: Arc<dyn Backend>,
}

const FOREIGN_BASE: u64 = 1 << 63;

impl NodeTable {
    pub fn new(
        root_fd: OwnedFd,
        budget: Arc<FdBudget>,
        host: Arc<dyn Backend>,
    ) -> SysResult<NodeTable> {
        let st = host.stat(root_fd.as_fd())?;
        let table = NodeTable {
            nodes: DashMap::new(),
            foreign: DashMap::new(),
            any_reused: AtomicBool::new(false),
            next_foreign: AtomicU64::new(FOREIGN_BASE),
            root_dev: st.st_dev as u64,
            root_ino: st.st_ino,
            budget: budget.clone(),
            host: host.clone(),
        };
        let root = Arc::new(Node {
            id: ROOT_NODE,
            generation: 0,
            dev: st.st_dev as u64,
            ino: st.st_ino,
            kind: crate::backend::S_IFDIR,
            birth: (host.stat_born(root_fd.as_fd()))
                .ok()
                .and_then(|(_, birth)| birth),
            fd: RwLock::new(Some(Arc::new(root_fd))),
            location: Mutex::new(None),
            lookups: AtomicU64::new(1),
            budget: budget.clone(),
            synced_ctime: Mutex::new((st.st_ctime, st.st_ctime_nsec)),
            watched: AtomicBool::new(false),
            pinned: AtomicBool::new(false),
        });
        budget.opened(&root, &*host);
        table.nodes.insert(ROOT_NODE, root);
        Ok(table)
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The device of the export's own file system.
    pub fn root_dev(&self) -> u64 {
        self.root_dev
    }

    /// The id the guest sees for a host inode.
    pub fn id_for(&self, dev: u64, ino: u64) -> NodeId {
        let reassigned =
            || self.any_reused.load(Ordering::Relaxed) && self.foreign.contains_key(&(dev, ino));
        // An inode of the root's file system is known by its inode number (so ids survive
        // server restarts), unless that number is the root's id or in the synthetic range.
        if dev == self.root_dev && ino != ROOT_NODE.get() && ino < FOREIGN_BASE && !reassigned() {
            if ino == self.root_ino {
                return ROOT_NODE;
            }
            return NodeId::new(ino);
        }
        *self
            .foreign
            .entry((dev, ino))
            .or_insert_with(|| self.new_synthetic_id())
    }

    /// A synthetic id never issued before: counted up from [`FOREIGN_BASE`].
    fn new_synthetic_id(&self) -> NodeId {
        NodeId::new(self.next_foreign.fetch_add(1, Ordering::Relaxed))
    }

    /// Every node last seen below directory `dir` (at any depth), with the directory and
    /// name it was seen under: what a rescan of `dir` must invalidate. Walks the whole
    /// table (a rescan is rare).
    pub fn below(&self, dir: NodeId) -> Vec<(NodeId, NodeId, CString)> {
        let mut children: std::collections::HashMap<NodeId, Vec<(NodeId, CString)>> =
            std::collections::HashMap::new();
        for e in self.nodes.iter() {
            if let Some(l) = e.value().location.lock().unwrap().as_ref() {
                children
                    .entry(l.parent)
                    .or_default()
                    .push((*e.key(), l.name.clone()));
            }
        }
        let mut out = Vec::new();
        let mut todo = vec![dir];
        let mut seen = std::collections::HashSet::from([dir]);
        while let Some(d) = todo.pop() {
            for (child, name) in children.remove(&d).unwrap_or_default() {
                if seen.insert(child) {
                    todo.push(child);
                }
                out.push((child, d, name));
            }
        }
        out
    }

    pub fn get(&self, id: NodeId) -> SysResult<Arc<Node>> {
        self.nodes
            .get(&id)
            .map(|n| n.clone())
            .ok_or(WireErrno::ESTALE)
    }

    /// Records one more lookup of the object `fd` (an O_PATH descriptor just opened as
    /// `name` in `parent`, with its status and birth time as [`Backend::stat_born`] read them)
    /// and returns its node, and whether the node is new.
    pub fn remember(
        &self,
        fd: OwnedFd,
        (st, birth): (&libc::stat, Option<(i64, u32)>),
        parent: NodeId,
        name: CString,
    ) -> (Arc<Node>, bool) {
        let mut id = self.id_for(st.st_dev as u64, st.st_ino);
        // A held node whose descriptor was evicted may be an older file with this number,
        // and one with another inode number holds it as a stand-in (`remember_unnamed_as`).
        let held = self.nodes.get(&id).map(|n| n.clone());
        if let Some(old) = held.filter(|n| !n.has_fd() || n.ino != st.st_ino) {
            if !old.same_file(st, birth) {
                id = self.reassign(st.st_dev as u64, st.st_ino, id);
            }
        }
        let location = Location { parent, name };
        let mut new = false;
        let node = {
            let mut slot = self.nodes.entry(id).or_insert_with(|| {
                new = true;
                Arc::new(self.new_node(id, st, birth))
            });
            let node = slot.value_mut();
            node.lookups.fetch_add(1, Ordering::Relaxed);
            node.clone()
        };
        if id != ROOT_NODE {
            *node.location.lock().unwrap() = Some(location);
            // Found by a name again.
            node.pinned.store(false, Ordering::SeqCst);
        }
        let installed = {
            let mut guard = node.fd.write().unwrap();
            let empty = guard.is_none();
            if empty {
                *guard = Some(Arc::new(fd));
            }
            empty
        };
        if installed {
            self.budget.opened(&node, &*self.host);
        }
        (node, new)
    }

    /// Records a file that has no name yet (a spare file, made with O_TMPFILE) as a node the
    /// client holds once. It has no descriptor here and no location, so every request for
    /// it fails with ESTALE until it is found by a name ([`NodeTable::remember`]).
    pub fn remember_unnamed(&self, (st, birth): (&libc::stat, Option<(i64, u32)>)) -> Arc<Node> {
        let mut id = self.id_for(st.st_dev as u64, st.st_ino);
        if self.nodes.contains_key(&id) {
            // A held node of a file gone since, whose number this new one got.
            id = self.reassign(st.st_dev as u64, st.st_ino, id);
        }
        let node = Arc::new(self.new_node(id, st, birth));
        node.lookups.store(1, Ordering::Relaxed);
        self.nodes.insert(id, node.clone());
        node
    }

    /// Records a new unnamed file as node `id`, which the client holds already from an
    /// earlier session (a spare whose BIND that session never executed): from now on the
    /// file's inode is known by that id. None if `id` is a node of this session.
    pub fn remember_unnamed_as(
        &self,
        id: NodeId,
        (st, birth): (&libc::stat, Option<(i64, u32)>),
    ) -> Option<Arc<Node>> {
        // 0 is no id this server issues (the client's, at worst a broken one).
        if id == ROOT_NODE || id.get() == 0 {
            return None;
        }
        let dashmap::mapref::entry::Entry::Vacant(slot) = self.nodes.entry(id) else {
            return None;
        };
        self.any_reused.store(true, Ordering::Relaxed);
        self.foreign.insert((st.st_dev as u64, st.st_ino), id);
        let node = Arc::new(self.new_node(id, st, birth));
        node.lookups.store(1, Ordering::Relaxed);
        slot.insert(node.clone());
        Some(node)
    }

    fn new_node(&self, id: NodeId, st: &libc::stat, birth: Option<(i64, u32)>) -> Node {
        Node {
            id,
            generation: generation_of(birth),
            dev: st.st_dev as u64,
            ino: st.st_ino,
            kind: crate::backend::file_type(st),
            birth,
            fd: RwLock::new(None),
            location: Mutex::new(None),
            lookups: AtomicU64::new(0),
            budget: self.budget.clone(),
            synced_ctime: Mutex::new((st.st_ctime, st.st_ctime_nsec)),
            watched: AtomicBool::new(false),
            pinned: AtomicBool::new(false),
        }
    }

    /// Gives (dev, ino), whose id `old` now belongs to an older file the client still holds,
    /// a synthetic id of its own.
    fn reassign(&self, dev: u64, ino: u64, old: NodeId) -> NodeId {
        self.any_reused.store(true, Ordering::Relaxed);
        let mut id = self
            .foreign
            .entry((dev, ino))
            .or_insert_with(|| self.new_synthetic_id());
        if *id == old {
            // Reused twice: the synthetic id is the stale one now.
            *id = self.new_synthetic_id();
        }
        *id
    }

    /// Counts `more` lookups of a held node (a reconnecting client restoring what its
    /// kernel holds). The shard's read lock keeps FORGET's removal out meanwhile.
    pub fn add_lookups(&self, id: NodeId, more: u64) {
        if let Some(node) = self.nodes.get(&id) {
            node.lookups.fetch_add(more, Ordering::Relaxed);
        }
    }

    /// Drops `count` lookups; returns the node if it left the table (none are left).
    pub fn forget(&self, id: NodeId, count: u64) -> Option<Arc<Node>> {
        if id == ROOT_NODE {
            return None;
        }
        self.nodes
            .remove_if(&id, |_, node| {
                let left = node.lookups.load(Ordering::Relaxed).saturating_sub(count);
                node.lookups.store(left, Ordering::Relaxed);
                left == 0
            })
            .map(|(_, n)| n)
    }

    /// Node `id` and its descriptor (reopened if it was evicted).
    pub fn node_fd(&self, id: NodeId) -> SysResult<(Arc<Node>, Arc<OwnedFd>)> {
        let node = self.get(id)?;
        let fd = self.fd(&node)?;
        Ok((node, fd))
    }

    /// The node the client holds for the file `name` in `dir`, if any.
    pub fn held_at(&self, dir: BorrowedFd<'_>, name: &CStr) -> Option<Arc<Node>> {
        let st = self.host.stat_at(dir, name).ok()?;
        self.find(st.st_dev as u64, st.st_ino)
    }

    /// The node for a host inode, if the client holds it.
    pub fn find(&self, dev: u64, ino: u64) -> Option<Arc<Node>> {
        let id = self.id_for(dev, ino);
        self.nodes
            .get(&id)
            .map(|n| n.clone())
            .filter(|n| n.ino == ino && n.dev == dev)
    }

    /// Updates where a node is found after a rename made through this server.
    pub fn moved(&self, id: NodeId, parent: NodeId, name: CString) {
        if let Some(node) = self.nodes.get(&id) {
            *node.location.lock().unwrap() = Some(Location { parent, name });
            node.pinned.store(false, Ordering::SeqCst);
        }
    }

    /// Called before the name `name` in `parent` is removed through this server (unlink,
    /// rmdir, a rename over it). If that name is where `node` would be found again, the
    /// node keeps its descriptor from now on (reopened first if it was evicted): the guest
    /// may go on using it, as an open file whose name is gone. Pinning comes first and
    /// eviction checks the pin under the descriptor's lock, so either the eviction sees the
    /// pin or the reopen sees the eviction.
    pub fn name_removed(&self, node: &Arc<Node>, parent: NodeId, name: &CStr) {
        let here = matches!(&*node.location.lock().unwrap(),
            Some(l) if l.parent == parent && l.name.as_c_str() == name);
        if here {
            node.pinned.store(true, Ordering::SeqCst);
            let _ = self.fd(node);
        }
    }

    /// The node's descriptor, reopening it by (parent, name) if it was evicted.
    pub fn fd(&self, node: &Arc<Node>) -> SysResult<Arc<OwnedFd>> {
        if let Some(fd) = node.fd.read().unwrap().as_ref() {
            return Ok(fd.clone());
        }
        let loc = node
            .location
            .lock()
            .unwrap()
            .clone()
            .ok_or(WireErrno::ESTALE)?;
        let parent = self.get(loc.parent)?;
        let parent_fd = self.fd(&parent)?;
        let fd = (self.host.open_node(parent_fd.as_fd(), &loc.name)).map_err(|e| {
            if e == WireErrno::ENOENT {
                WireErrno::ESTALE
            } else {
                e
            }
        })?;
        let (st, birth) = self.host.stat_born(fd.as_fd())?;
        if !node.same_file(&st, birth) {
            // The name now refers to another file (perhaps with the same inode number): the
            // node we knew is gone from there.
            return Err(WireErrno::ESTALE);
        }
        let fd = Arc::new(fd);
        let mut slot = node.fd.write().unwrap();
        if let Some(existing) = slot.as_ref() {
            return Ok(existing.clone());
        }
        *slot = Some(fd.clone());
        drop(slot);
        self.budget.opened(node, &*self.host);
        Ok(fd)
    }
}

/// A node's generation: its birth time, so that it is the same in every session (a kernel
/// that kept a node across a reconnect must find it unchanged) and differs for a later file
/// with the same inode number. 0 where the file system records no birth time.
fn generation_of(birth: Option<(i64, u32)>) -> u64 {
    birth
        .map(|(sec, nsec)| {
            (sec as u64)
                .wrapping_mul(1_000_000_000)
                .wrapping_add(nsec as u64)
        })
        .unwrap_or(0)
}
