//! One session's view of the export, [`ExportFs`]: its nodes, handles, spare files, kept
//! write descriptors, locks and watch, and what every operation (ops/) needs of them: a
//! node's descriptor checked for its kind, an open file for I/O, attributes as the guest
//! sees them, creations as the guest's caller, and own changes told to the watch.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use dashmap::DashMap;
use tether_proto::{Attr, Caller, HandleId, NodeId, Timespec, WireErrno, ROOT_NODE};

use super::handles::{Handle, HandleTable};
use super::ids::SessionIds;
use super::locks::LockTable;
use super::readahead::ReadAhead;
use super::shared::Export;
use super::writers::Writers;
use crate::backend::{Backend, SysResult};
use crate::nodes::{Node, NodeTable};
use crate::watch::coalesce::Watch;
use crate::watch::NameChange;

pub struct ExportFs {
    pub export: Arc<Export>,
    pub nodes: Arc<NodeTable>,
    /// Open handles, each with the node it was opened on: a request must name both.
    pub handles: HandleTable,
    /// Present when the client asked for pushed invalidations: the changes to push come
    /// from here.
    pub watch: Option<Watch>,
    /// CREATE replies carry the parent directory's attributes (feature DIR_ATTR).
    pub dir_attr: bool,
    /// WRITE replies carry the file's attributes (feature WRITE_ATTR).
    pub write_attr: bool,
    /// READDIR replies say when the listing ended (feature DIR_END).
    pub dir_end: bool,
    /// CREATE opens no handle (feature CREATE_NO_HANDLE).
    pub create_no_handle: bool,
    /// Ownership as this session's guest sees it.
    pub ids: SessionIds,
    /// The host descriptions that carry this session's guest locks (locks.rs), and where
    /// the session hears of locks other sessions free (`locks.wake`, set by the session
    /// when it pushes).
    pub locks: LockTable,
    /// Host read-ahead of directories the guest reads through (readahead.rs).
    pub readahead: ReadAhead,
    /// Descriptors kept for writes by node (writers.rs).
    pub writers: Arc<Writers>,
    /// Spare files not named yet (SPARES, BIND): the only descriptor of each, whose closing
    /// frees the file.
    pub spares: DashMap<NodeId, Arc<OwnedFd>>,
}

impl Drop for ExportFs {
    fn drop(&mut self) {
        self.writers.stop();
        self.locks.release_all();
    }
}

/// Whether the server may open an object of `kind` (S_IFMT bits) for I/O: only a regular
/// file or a directory. The guest kernel runs FIFOs, sockets and devices itself and never
/// asks to open them; opening a FIFO here would block a worker until someone opened the
/// other end, and a device would reach past the export.
pub fn check_openable(kind: u32) -> SysResult<()> {
    match kind {
        crate::backend::S_IFREG | crate::backend::S_IFDIR => Ok(()),
        crate::backend::S_IFLNK => Err(WireErrno::ELOOP),
        _ => Err(WireErrno::ENXIO),
    }
}

fn ts(sec: i64, nsec: i64) -> Timespec {
    Timespec {
        sec,
        nsec: nsec as u32,
    }
}

impl ExportFs {
    /// A session's view of the export; with `watch`, changes to what the client holds are
    /// reported by [`ExportFs::watch`], with the host events behind them if `host_events`.
    /// Files appear owned by guest `owner` (uid, gid) where the export squashes ownership.
    pub fn new(
        export: Arc<Export>,
        watch: bool,
        host_events: bool,
        owner: (u32, u32),
    ) -> SysResult<ExportFs> {
        let root = export
            .root_fd()
            .map_err(|e| WireErrno::from_host(e.raw_os_error().unwrap_or(libc::EIO)))?;
        let host = export.host.clone();
        let nodes = Arc::new(NodeTable::new(root, export.budget.clone(), host.clone())?);
        let watch = if watch {
            match export.backend.watcher(&export) {
                Ok(w) => Some(Watch::new(w, nodes.clone(), host, host_events)),
                Err(e) => {
                    tracing::warn!("cannot watch the export ({e}): the client will revalidate");
                    None
                }
            }
        } else {
            None
        };
        let ids = SessionIds {
            map: export.id_map.clone(),
            owner_uid: owner.0,
            owner_gid: owner.1,
            can_switch: export.creds_switch,
        };
        let readahead = ReadAhead::new(export.host.clone());
        let locks = LockTable::new(export.host.clone(), export.lock_waits.clone());
        let fs = ExportFs {
            ids,
            nodes,
            handles: HandleTable::new(export.max_handles),
            export,
            dir_attr: false,
            write_attr: false,
            dir_end: false,
            create_no_handle: false,
            locks,
            readahead,
            writers: Arc::default(),
            spares: DashMap::new(),
            watch,
        };
        if let Some(w) = &fs.watch {
            let (root, fd) = fs.node_fd(ROOT_NODE)?;
            w.watch_dir(&root, &fd);
        }
        Ok(fs)
    }

    /// True when the root is watched, so the client may cache without timeouts.
    pub fn watching(&self) -> bool {
        self.nodes
            .get(ROOT_NODE)
            .map(|n| n.watched.load(Ordering::Relaxed))
            .unwrap_or(false)
    }

    /// Whether the client also gets the host changes behind its invalidations.
    pub fn host_events(&self) -> bool {
        self.watch.as_ref().is_some_and(|w| w.host_events())
    }

    /// The host's file system calls (backend/).
    pub fn host(&self) -> &dyn Backend {
        &*self.export.host
    }

    pub fn open_handles(&self) -> usize {
        self.handles.len()
    }

    /// `st`, the status of node `id`, as the guest sees it.
    pub fn attr_of(&self, st: &libc::stat, id: NodeId) -> Attr {
        let (uid, gid) = self.ids.guest_owner(st.st_uid, st.st_gid);
        Attr {
            ino: id,
            size: st.st_size as u64,
            blocks: st.st_blocks as u64,
            atime: ts(st.st_atime, st.st_atime_nsec),
            mtime: ts(st.st_mtime, st.st_mtime_nsec),
            ctime: ts(st.st_ctime, st.st_ctime_nsec),
            mode: st.st_mode as u32,
            nlink: st.st_nlink as u32,
            uid,
            gid,
            rdev: st.st_rdev as u64,
            blksize: st.st_blksize as u32,
            // Reserved: replies are ordered against invalidations by push sequence on the
            // client (docs/coherence.md), so the server keeps no change counter for it.
            seq: 0,
        }
    }

    pub fn node_fd(&self, id: NodeId) -> SysResult<(Arc<Node>, Arc<OwnedFd>)> {
        self.nodes.node_fd(id)
    }

    /// The descriptor of directory `id`; ENOTDIR for anything else.
    pub fn dir_fd(&self, id: NodeId) -> SysResult<Arc<OwnedFd>> {
        let (node, fd) = self.node_fd(id)?;
        if !node.is_dir() {
            return Err(WireErrno::ENOTDIR);
        }
        Ok(fd)
    }

    /// A readable stream of directory `node`'s entries.
    pub fn dir_stream(&self, node: NodeId) -> SysResult<OwnedFd> {
        let fd = self.dir_fd(node)?;
        self.host().open_dir(fd.as_fd())
    }

    /// A node the server may open for I/O (see [`check_openable`]).
    pub fn openable_node(&self, node: NodeId) -> SysResult<(Arc<Node>, Arc<OwnedFd>)> {
        let (n, fd) = self.node_fd(node)?;
        check_openable(n.kind)?;
        Ok((n, fd))
    }

    /// Opens the node's inode again with real access flags.
    pub fn reopen(&self, fd: &OwnedFd, flags: i32) -> SysResult<OwnedFd> {
        self.host().reopen(fd.as_fd(), flags)
    }

    /// Regular file `node` opened with `flags`, for I/O addressed by node.
    pub fn reopen_file(&self, node: NodeId, flags: i32) -> SysResult<OwnedFd> {
        let (n, fd) = self.openable_node(node)?;
        if n.is_dir() {
            return Err(WireErrno::EISDIR);
        }
        self.reopen(&fd, flags)
    }

    /// The open file for I/O on `node`: the handle `fh`, or, for I/O addressed by node
    /// (no `fh`, the client's no-open mode), the node reopened with `flags` for this request.
    pub fn file_for(
        &self,
        node: NodeId,
        fh: Option<HandleId>,
        flags: i32,
    ) -> SysResult<Arc<Handle>> {
        if let Some(fh) = fh {
            return self.handles.file(node, fh);
        }
        Ok(Arc::new(Handle::File(self.reopen_file(node, flags)?)))
    }

    /// Runs a creating syscall as the host user the id mapping gives the guest's caller, so
    /// the new file is theirs (or as the serving user, when squashing).
    pub fn as_caller<T>(&self, caller: Caller, f: impl FnOnce() -> SysResult<T>) -> SysResult<T> {
        match self.ids.creator(caller)? {
            Some((uid, gid)) => {
                let _creds = self.host().creds_as(uid, gid);
                f()
            }
            None => f(),
        }
    }

    /// Runs this session's own change of `node` (through descriptor `fd`) so that its echo
    /// from the watcher is recognised: if the client was coherent with the node before the
    /// change, it is coherent after it (its kernel saw the change happen). `size_after`
    /// gives the size the change leaves from the size before it and the change's result:
    /// a host change that came in the same moment and left another size is then not taken
    /// for the session's own (its echo is pushed). Returns the change's result and the
    /// node's state after it as the echo check read it: None when this session does not
    /// watch (then nothing reads it) or it could not be read.
    pub fn own_change<T>(
        &self,
        node: &Node,
        fd: BorrowedFd<'_>,
        op: impl FnOnce() -> SysResult<T>,
        size_after: impl Fn(u64, &T) -> u64,
    ) -> SysResult<(T, Option<libc::stat>)> {
        let (r, mut after) = self.own_changes_sized(vec![(node, fd)], op, |before, r| {
            Some(size_after(before, r))
        });
        r.map(|r| (r, after.pop().flatten()))
    }

    /// [`own_change`](Self::own_change) of several nodes at once, whose sizes are not
    /// checked. Their states are locked in node order, so that two changes sharing nodes
    /// cannot deadlock.
    fn own_changes<T>(
        &self,
        nodes: Vec<(&Node, BorrowedFd<'_>)>,
        op: impl FnOnce() -> SysResult<T>,
    ) -> SysResult<T> {
        self.own_changes_sized(nodes, op, |_, _| None).0
    }

    /// The two above: `size_after` gives the size a change of one node must leave, if it
    /// can tell. Also returns the nodes' states read after the change (in node order),
    /// which the caller may reply with: empty when this session does not watch.
    fn own_changes_sized<T>(
        &self,
        nodes: Vec<(&Node, BorrowedFd<'_>)>,
        op: impl FnOnce() -> SysResult<T>,
        size_after: impl Fn(u64, &T) -> Option<u64>,
    ) -> (SysResult<T>, Vec<Option<libc::stat>>) {
        match &self.watch {
            Some(w) => w.own_changes(nodes, op, size_after),
            None => (op(), Vec::new()),
        }
    }

    /// `node` with its descriptor, for [`own_names`](Self::own_names): only a watching
    /// session tracks its own changes.
    pub fn with_fd(&self, node: Arc<Node>) -> Option<(Arc<Node>, Arc<OwnedFd>)> {
        self.watch.as_ref()?;
        let fd = self.nodes.fd(&node).ok()?;
        Some((node, fd))
    }

    /// Before `name` is removed from `dir` (node `parent`): the node the client holds for
    /// it, if any, keeps its descriptor, since it may not be found by name again (the
    /// guest may hold the file open and go on using it; see `NodeTable::name_removed`).
    /// Returns it with that descriptor, for [`own_names`](Self::own_names).
    pub fn keep_if_held(
        &self,
        parent: NodeId,
        dir: BorrowedFd<'_>,
        name: &std::ffi::CStr,
    ) -> Option<(Arc<Node>, Arc<OwnedFd>)> {
        let node = self.nodes.held_at(dir, name)?;
        self.nodes.name_removed(&node, parent, name);
        // Its space goes with its last name, not when an idle write descriptor closes.
        self.writers.forget(node.id);
        self.with_fd(node)
    }

    /// Runs a change of names in directories, telling the watcher to expect its echoes. The
    /// directories' ctimes change too, as do those of the files in `files` (the ones the
    /// change links, unlinks or moves): all of it is this session's change.
    pub fn own_names<T>(
        &self,
        changes: &[(NodeId, &[u8], NameChange)],
        files: &[Option<(Arc<Node>, Arc<OwnedFd>)>],
        op: impl FnOnce() -> SysResult<T>,
    ) -> SysResult<T> {
        let Some(w) = &self.watch else { return op() };
        let dirs: Vec<_> = changes
            .iter()
            .filter_map(|(dir, _, _)| self.node_fd(*dir).ok())
            .collect();
        let nodes = dirs
            .iter()
            .chain(files.iter().flatten())
            .map(|(n, fd)| (&**n, fd.as_fd()))
            .collect();
        for (dir, name, change) in changes {
            w.expect(*dir, name, *change);
        }
        let r = self.own_changes(nodes, op);
        if r.is_err() {
            for (dir, name, change) in changes {
                w.unexpect(*dir, name, *change);
            }
        }
        r
    }
}
