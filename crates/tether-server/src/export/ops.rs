//! One session's view of the export: its nodes and open handles, and every operation.

use std::ffi::CString;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use dashmap::DashMap;
use tether_proto::{
    entry_flags, setattr_valid, Attr, Caller, DirEntry, Entry, HandleId, NodeId, Reply, Request,
    SetTime, Timespec, WireErrno, ROOT_NODE,
};

use super::ids::SessionIds;
use super::locks::{LockTable, LockWake};
use super::readahead::ReadAhead;
use super::writers::Writers;
use super::Export;
use crate::backend::{Backend, SysResult};
use crate::nodes::{Node, NodeTable};
use crate::watch::coalesce::Watch;
use crate::watch::linux::LinuxWatcher;
use crate::watch::NameChange;

enum Handle {
    File(OwnedFd),
    /// Directory streams share a position, so reads of one handle are serialized.
    Dir(Mutex<OwnedFd>),
}

pub struct ExportFs {
    pub export: Arc<Export>,
    pub nodes: Arc<NodeTable>,
    /// Open handles, each with the node it was opened on: a request must name both.
    handles: DashMap<HandleId, (NodeId, Arc<Handle>)>,
    next_handle: AtomicU64,
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
    /// The host descriptions that carry this session's guest locks (locks.rs).
    pub(super) locks: LockTable,
    /// Host read-ahead of directories the guest reads through (readahead.rs).
    readahead: ReadAhead,
    /// Descriptors kept for writes by node (writers.rs).
    writers: Arc<Writers>,
    /// Spare files not named yet (SPARES, BIND): the only descriptor of each, whose closing
    /// frees the file.
    spares: DashMap<NodeId, Arc<OwnedFd>>,
    /// Where the session hears of locks other sessions free (locks.rs); set by the session
    /// when it pushes.
    pub lock_wake: Option<LockWake>,
}

impl Drop for ExportFs {
    fn drop(&mut self) {
        self.writers.stop();
        self.release_all_locks();
    }
}

/// What a WRITE goes through: an open handle, or a descriptor kept for writes by node.
enum WriteFd {
    Handle(Arc<Handle>),
    Kept(Arc<OwnedFd>),
}

impl WriteFd {
    fn file(&self) -> &OwnedFd {
        match self {
            WriteFd::Kept(fd) => fd,
            WriteFd::Handle(h) => match &**h {
                Handle::File(f) => f,
                Handle::Dir(_) => unreachable!("file_for gives files only"),
            },
        }
    }
}

/// Most spare files (SPARES) a session holds unnamed at once: each is a descriptor, so
/// also at most an eighth of the export's node descriptors.
const MAX_SPARES: usize = 256;

/// A file made without a name: its descriptor, status and birth time.
type Unnamed = (OwnedFd, libc::stat, Option<(i64, u32)>);

/// Checks a single path component from the guest.
fn component(name: &[u8]) -> SysResult<CString> {
    if !tether_proto::is_component(name) {
        return Err(WireErrno::EINVAL);
    }
    if name.len() > tether_proto::NAME_MAX {
        return Err(WireErrno::ENAMETOOLONG);
    }
    Ok(CString::new(name).expect("a component has no NUL"))
}

fn ts(sec: i64, nsec: i64) -> Timespec {
    Timespec {
        sec,
        nsec: nsec as u32,
    }
}

fn settime(t: SetTime) -> libc::timespec {
    match t {
        SetTime::Omit => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        SetTime::Now => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        },
        SetTime::At(t) => libc::timespec {
            tv_sec: t.sec,
            tv_nsec: t.nsec as i64,
        },
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
            match LinuxWatcher::new() {
                Ok(w) => Some(Watch::new(Box::new(w), nodes.clone(), host, host_events)),
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
        let fs = ExportFs {
            ids,
            export,
            nodes,
            handles: DashMap::new(),
            next_handle: AtomicU64::new(1),
            dir_attr: false,
            write_attr: false,
            dir_end: false,
            create_no_handle: false,
            locks: LockTable::default(),
            readahead,
            writers: Arc::default(),
            spares: DashMap::new(),
            lock_wake: None,
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

    fn attr_of(&self, st: &libc::stat, id: NodeId) -> Attr {
        let (uid, gid) = self.ids.guest_owner(st.st_uid, st.st_gid);
        Attr {
            ino: id,
            size: st.st_size as u64,
            blocks: st.st_blocks as u64,
            atime: ts(st.st_atime, st.st_atime_nsec),
            mtime: ts(st.st_mtime, st.st_mtime_nsec),
            ctime: ts(st.st_ctime, st.st_ctime_nsec),
            mode: st.st_mode,
            nlink: st.st_nlink as u32,
            uid,
            gid,
            rdev: st.st_rdev,
            blksize: st.st_blksize as u32,
            // Reserved: replies are ordered against invalidations by push sequence on the
            // client (docs/coherence.md), so the server keeps no change counter for it.
            seq: 0,
        }
    }

    pub(crate) fn node_fd(&self, id: NodeId) -> SysResult<(Arc<Node>, Arc<OwnedFd>)> {
        self.nodes.node_fd(id)
    }

    fn dir_fd(&self, id: NodeId) -> SysResult<Arc<OwnedFd>> {
        let (node, fd) = self.node_fd(id)?;
        if !node.is_dir() {
            return Err(WireErrno::ENOTDIR);
        }
        Ok(fd)
    }

    /// A readable stream of directory `node`'s entries.
    fn dir_stream(&self, node: NodeId) -> SysResult<OwnedFd> {
        let fd = self.dir_fd(node)?;
        self.host().open_dir(fd.as_fd())
    }

    fn getattr_node(&self, id: NodeId) -> SysResult<Attr> {
        let (_, fd) = self.node_fd(id)?;
        let st = self.host().stat(fd.as_fd())?;
        Ok(self.attr_of(&st, id))
    }

    /// Looks `name` up in directory `parent_fd` and counts one lookup of the result.
    fn lookup_in(
        &self,
        parent: NodeId,
        parent_fd: BorrowedFd<'_>,
        name: CString,
    ) -> SysResult<Entry> {
        let fd = self.host().open_node(parent_fd, &name)?;
        self.refuse_tether_mount(&fd, parent_fd, &name)?;
        self.entry_of(parent, fd, name)
    }

    /// Refuses (ELOOP) a Tether mount found inside the export: a guest that mounts the
    /// export inside itself (serving /a, mounting at /a/sub/mnt on the same machine) would
    /// have this server send requests into its own mount, whose client waits for this
    /// server: a loop that hangs both. The subtree is left out, said once in the log.
    fn refuse_tether_mount(
        &self,
        fd: &OwnedFd,
        parent_fd: BorrowedFd<'_>,
        name: &std::ffi::CStr,
    ) -> SysResult<()> {
        let Some((major, minor)) = self.host().mount_root_device(fd.as_fd())? else {
            return Ok(());
        };
        let mounted = tether_sys::mountinfo::mount_of_device(major, minor)
            .ok()
            .flatten();
        if !mounted.is_some_and(|m| m.is_tether()) {
            return Ok(());
        }
        let path = self.host().fd_path(parent_fd).unwrap_or_default();
        let mut path = std::path::PathBuf::from(std::ffi::OsStr::from_bytes(&path));
        path.push(std::ffi::OsStr::from_bytes(name.to_bytes()));
        if self
            .export
            .refused_mounts
            .lock()
            .unwrap()
            .insert(path.clone())
        {
            tracing::warn!(
                "not serving {}: it is a Tether mount inside the export (a mount of this \
                 export inside itself would loop back into this server); guests see ELOOP \
                 there. Mount it outside the exported directory.",
                path.display()
            );
        }
        Err(WireErrno::ELOOP)
    }

    /// Reads the status of `fd` (found as `name` in `parent`) and records the lookup
    /// ([`ExportFs::entry_for`]), noting the watcher's batch count before the read.
    fn entry_of(&self, parent: NodeId, fd: OwnedFd, name: CString) -> SysResult<Entry> {
        let seen = self.watch.as_ref().map_or(0, |w| w.batches_seen());
        let (st, birth) = self.host().stat_born(fd.as_fd())?;
        self.entry_for(parent, fd, (&st, birth), name, seen)
    }

    /// Records a lookup of `fd` (found as `name` in `parent`, its status `st` read when
    /// [`Watch::batches_seen`] was `seen`), watching it if it is a new directory, and
    /// builds its entry.
    pub(crate) fn entry_for(
        &self,
        parent: NodeId,
        fd: OwnedFd,
        (st, birth): (&libc::stat, Option<(i64, u32)>),
        name: CString,
        seen: u64,
    ) -> SysResult<Entry> {
        let (node, new) = self.nodes.remember(fd, (st, birth), parent, name);
        let mut st = *st;
        let mut flags = 0;
        if let Some(w) = &self.watch {
            if w.batches_seen() != seen {
                st = self.state_now(&node, st, new)?;
            }
            if node.is_dir() && !node.watched.load(Ordering::Relaxed) {
                let fd = self.nodes.fd(&node)?;
                w.watch_dir(&node, &fd);
            }
            let parent_watched = self
                .nodes
                .get(parent)
                .map(|p| p.watched.load(Ordering::Relaxed))
                .unwrap_or(false);
            if parent_watched && (!node.is_dir() || node.watched.load(Ordering::Relaxed)) {
                flags |= entry_flags::WATCHED;
            }
        }
        Ok(Entry {
            node: node.id,
            generation: node.generation,
            flags,
            attr: self.attr_of(&st, node.id),
        })
    }

    /// The state to answer a lookup of `node` with, whose status `st` was read before the
    /// node was remembered, when the watcher took a batch of events in hand meanwhile (it
    /// counts the batch before it looks for any node, so a batch that missed this node is
    /// counted by then). The watcher pushes nothing for a file the client holds no node of,
    /// so a host change between that read and now may have been told to nobody: answer with
    /// what is there now. Also when another lookup of the same file, in flight beside this
    /// one, made the node: that one may have read the new state, and the client would keep
    /// whichever reply comes last. For a node `new` here, the state now is what the client
    /// is coherent with; for one it may already hold, that is left to the watcher, which
    /// pushes the change if it has not yet.
    fn state_now(&self, node: &Arc<Node>, st: libc::stat, new: bool) -> SysResult<libc::stat> {
        let fd = self.nodes.fd(node)?;
        let mut synced = node.synced_ctime.lock().unwrap();
        let now = self.host().stat(fd.as_fd())?;
        if (now.st_ctime, now.st_ctime_nsec) == (st.st_ctime, st.st_ctime_nsec) {
            return Ok(st);
        }
        if new {
            *synced = (now.st_ctime, now.st_ctime_nsec);
        }
        Ok(now)
    }

    /// Runs this session's own change of `node` (through descriptor `fd`) so that its echo
    /// from the watcher is recognised: if the client was coherent with the node before the
    /// change, it is coherent after it (its kernel saw the change happen). `size_after`
    /// gives the size the change leaves from the size before it and the change's result:
    /// a host change that came in the same moment and left another size is then not taken
    /// for the session's own (its echo is pushed).
    pub(crate) fn own_change<T>(
        &self,
        node: &Node,
        fd: BorrowedFd<'_>,
        op: impl FnOnce() -> SysResult<T>,
        size_after: impl Fn(u64, &T) -> u64,
    ) -> SysResult<T> {
        self.own_change_then_stat(node, fd, op, size_after)
            .map(|(r, _)| r)
    }

    /// [`own_change`](Self::own_change), also returning the node's state after the change
    /// as the echo check read it: None when this session does not watch (then nothing
    /// reads it) or it could not be read.
    fn own_change_then_stat<T>(
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
    fn with_fd(&self, node: Arc<Node>) -> Option<(Arc<Node>, Arc<OwnedFd>)> {
        self.watch.as_ref()?;
        let fd = self.nodes.fd(&node).ok()?;
        Some((node, fd))
    }

    /// Before `name` is removed from `dir` (node `parent`): the node the client holds for
    /// it, if any, keeps its descriptor, since it may not be found by name again (the
    /// guest may hold the file open and go on using it; see `NodeTable::name_removed`).
    /// Returns it with that descriptor, for [`own_names`](Self::own_names).
    fn keep_if_held(
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
    fn own_names<T>(
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

    /// SPARES: up to `count` unnamed files in `parent`, made as the caller would make a file
    /// there (owner, group), each held once by the client. Fewer when the session holds
    /// [`MAX_SPARES`] already; an error only when none could be made (a file system without
    /// O_TMPFILE answers EOPNOTSUPP).
    fn make_spares(&self, caller: Caller, parent: NodeId, count: u32) -> SysResult<Reply> {
        let pfd = self.dir_fd(parent)?;
        let most = MAX_SPARES.min(self.export.budget.cap() / 8);
        let room = most.saturating_sub(self.spares.len());
        if room == 0 {
            return Err(WireErrno::EMFILE);
        }
        let mut made = Vec::new();
        for _ in 0..(count as usize).min(room) {
            let (file, st, birth) = match self.make_unnamed(caller, &pfd) {
                Ok(made) => made,
                Err(e) if made.is_empty() => return Err(e),
                Err(_) => break,
            };
            let node = self.nodes.remember_unnamed((&st, birth));
            self.spares.insert(node.id, Arc::new(file));
            made.push(Entry {
                node: node.id,
                generation: node.generation,
                flags: 0,
                attr: self.attr_of(&st, node.id),
            });
        }
        Ok(Reply::Spares(made))
    }

    /// A regular file with no name in directory `pfd`, made as the caller would make a file
    /// there, with its status and birth time. Its events are this session's own.
    fn make_unnamed(&self, caller: Caller, pfd: &OwnedFd) -> SysResult<Unnamed> {
        let file = self.as_caller(caller, || {
            // The permissions most files get (BIND sets others).
            self.host().open_unnamed(pfd.as_fd(), 0o644)
        })?;
        let (st, birth) = self.host().stat_born(file.as_fd())?;
        if let Some(w) = &self.watch {
            w.made_unnamed(st.st_ino);
        }
        Ok((file, st, birth))
    }

    /// BIND. A node that is not a spare of this session is one the client took from an
    /// earlier session's spares, its BIND sent again after a reconnect (protocol.md §17):
    /// - a node of this session already (the reconnect's restore bound it): done;
    /// - `name` holds it (the earlier session executed the BIND): that file, counted once;
    /// - `name` is free: a new spare stands in for it under its id, and is bound;
    /// - `name` holds another file: EEXIST.
    fn bind(
        &self,
        caller: Caller,
        parent: NodeId,
        name: &[u8],
        node: NodeId,
        perm: u32,
        time: tether_proto::Timespec,
    ) -> SysResult<Reply> {
        let cname = component(name)?;
        let pfd = self.dir_fd(parent)?;
        if self.spares.contains_key(&node) {
            return self.bind_spare(caller, (parent, &pfd, cname), node, perm, time);
        }
        if let Ok(held) = self.nodes.get(node) {
            let st = self.host().stat(self.nodes.fd(&held)?.as_fd())?;
            let entry = Entry {
                node,
                generation: held.generation,
                flags: entry_flags::NEW_FILE,
                attr: self.attr_of(&st, node),
            };
            return Ok(self.created(entry, 0, parent, &pfd));
        }
        match self.host().stat_at(pfd.as_fd(), &cname) {
            Ok(st) if self.nodes.id_for(st.st_dev, st.st_ino) == node => {
                let named = self.host().open_node(pfd.as_fd(), &cname)?;
                // Its one lookup is the one SPARES counted in the earlier session.
                let mut entry = self.entry_of(parent, named, cname)?;
                entry.flags |= entry_flags::NEW_FILE;
                return Ok(self.created(entry, 0, parent, &pfd));
            }
            Ok(_) => return Err(WireErrno::EEXIST),
            Err(WireErrno::ENOENT) => {}
            Err(e) => return Err(e),
        }
        let (file, st, birth) = self.make_unnamed(caller, &pfd)?;
        if self.nodes.remember_unnamed_as(node, (&st, birth)).is_none() {
            return Err(WireErrno::ESTALE);
        }
        self.spares.insert(node, Arc::new(file));
        let bound = self.bind_spare(caller, (parent, &pfd, cname), node, perm, time);
        if bound.is_err() {
            self.spares.remove(&node);
            self.nodes.forget(node, 1);
        }
        bound
    }

    /// BIND of a spare: gives spare `node` permissions `perm`, access and modification
    /// times `time`, and the group a file made in directory `parent` (descriptor `pfd`)
    /// would have (a spare may come from another directory of the file system, one without
    /// set-group-ID), then links it there as `name` (EEXIST if the name is taken). Answered
    /// as a creation; the lookup the client holds on the node is the one SPARES counted.
    fn bind_spare(
        &self,
        caller: Caller,
        (parent, pfd, name): (NodeId, &OwnedFd, CString),
        node: NodeId,
        perm: u32,
        time: tether_proto::Timespec,
    ) -> SysResult<Reply> {
        let spare = self.spares.get(&node).map(|f| f.clone());
        let (Some(file), Ok(n)) = (spare, self.nodes.get(node)) else {
            return Err(WireErrno::ESTALE);
        };
        // The permissions, group and times first, through the unnamed file's own
        // descriptor: its events name it "#INO" and are dropped as this session's
        // (`Watch::made_unnamed`), so the host and other guests hear only the creation.
        let dir = self.host().stat(pfd.as_fd())?;
        let group = if dir.st_mode & libc::S_ISGID != 0 {
            dir.st_gid
        } else {
            let own = self.host().effective_gid();
            self.ids.creator(caller)?.map_or(own, |(_, gid)| gid)
        };
        let st = self.host().stat(file.as_fd())?;
        let ts = libc::timespec {
            tv_sec: time.sec,
            tv_nsec: time.nsec as i64,
        };
        // Own changes of the node (its ctime moves), though nobody hears of them.
        let set_attributes = || {
            if st.st_gid != group {
                self.host().chown(file.as_fd(), None, Some(group))?;
            }
            // As the caller, like the creation it finishes: the kernel keeps set-group-ID
            // only for a member of the file's group.
            self.as_caller(caller, || {
                if st.st_mode & 0o7777 != perm || st.st_gid != group {
                    self.host().chmod(file.as_fd(), perm)?;
                }
                self.host().utimens(file.as_fd(), &[ts, ts])
            })
        };
        self.own_change(&n, file.as_fd(), set_attributes, |before, _| before)?;
        let expect = [(parent, name.as_bytes(), NameChange::Created)];
        self.own_names(&expect, &[Some((n.clone(), file.clone()))], || {
            self.as_caller(caller, || {
                self.host().link_open(file.as_fd(), pfd.as_fd(), &name)
            })
        })?;
        self.spares.remove(&node);
        // Found by its name: the node's descriptor and location from now on.
        let named = self.host().open_node(pfd.as_fd(), &name)?;
        let (st, birth) = self.host().stat_born(named.as_fd())?;
        if !n.same_file(&st, birth) {
            // Replaced on the host between the link and now: the guest's file is not there.
            return Err(WireErrno::ESTALE);
        }
        let mut entry = self.entry_of(parent, named, name)?;
        // entry_of counted a lookup the client does not add: SPARES counted its one.
        self.nodes.forget(node, 1);
        entry.flags |= entry_flags::NEW_FILE;
        Ok(self.created(entry, 0, parent, pfd))
    }

    /// The reply to a creation of `entry` in `parent` (descriptor `pfd`), with handle `fh`:
    /// after it the kernel drops the directory's attributes and asks for them again before
    /// its next lookup there, so they come along (DIR_ATTR).
    fn created(&self, entry: Entry, fh: HandleId, parent: NodeId, pfd: &OwnedFd) -> Reply {
        let dir = self
            .dir_attr
            .then(|| self.host().stat(pfd.as_fd()).ok())
            .flatten()
            .map(|st| Box::new(self.attr_of(&st, parent)));
        Reply::Create {
            entry,
            fh,
            flags: 0,
            dir,
        }
    }

    /// Runs a creating syscall as the host user the id mapping gives the guest's caller, so
    /// the new file is theirs (or as the serving user, when squashing).
    fn as_caller<T>(&self, caller: Caller, f: impl FnOnce() -> SysResult<T>) -> SysResult<T> {
        match self.ids.creator(caller)? {
            Some((uid, gid)) => {
                let _creds = self.host().creds_as(uid, gid);
                f()
            }
            None => f(),
        }
    }

    /// Handle `fh`, which must have been opened on `node`: what a reply says about `node`
    /// (attributes, listed entries, own changes) then is about the handle's object.
    fn handle(&self, node: NodeId, fh: HandleId) -> SysResult<Arc<Handle>> {
        match self.handles.get(&fh) {
            Some(h) if h.0 == node => Ok(h.1.clone()),
            _ => Err(WireErrno::EBADF),
        }
    }

    fn file(&self, node: NodeId, fh: HandleId) -> SysResult<Arc<Handle>> {
        let h = self.handle(node, fh)?;
        match *h {
            Handle::File(_) => Ok(h),
            Handle::Dir(_) => Err(WireErrno::EISDIR),
        }
    }

    /// The open file for I/O on `node`: the handle `fh`, or, for I/O addressed by node
    /// (`fh` 0, the client's no-open mode), the node reopened with `flags` for this request.
    fn file_for(&self, node: NodeId, fh: HandleId, flags: i32) -> SysResult<Arc<Handle>> {
        if fh != 0 {
            return self.file(node, fh);
        }
        Ok(Arc::new(Handle::File(self.reopen_file(node, flags)?)))
    }

    /// Regular file `node` opened with `flags`, for I/O addressed by node.
    fn reopen_file(&self, node: NodeId, flags: i32) -> SysResult<OwnedFd> {
        let (n, fd) = self.openable_node(node)?;
        if n.is_dir() {
            return Err(WireErrno::EISDIR);
        }
        self.reopen(&fd, flags)
    }

    /// The descriptor a WRITE goes through: handle `fh`, or for writes by node (`fh` 0) the
    /// node's kept writable descriptor, opened and kept if there is none (writers.rs).
    fn write_fd(&self, node: NodeId, fh: HandleId) -> SysResult<WriteFd> {
        if fh != 0 {
            return self.file(node, fh).map(WriteFd::Handle);
        }
        if let Some(fd) = self.writers.get(node) {
            return Ok(WriteFd::Kept(fd));
        }
        let f = self.reopen_file(node, libc::O_WRONLY)?;
        Ok(WriteFd::Kept(self.writers.keep(node, f)))
    }

    /// A node the server may open for I/O (see [`check_openable`]).
    pub(super) fn openable_node(&self, node: NodeId) -> SysResult<(Arc<Node>, Arc<OwnedFd>)> {
        let (n, fd) = self.node_fd(node)?;
        check_openable(n.kind)?;
        Ok((n, fd))
    }

    fn add_handle(&self, node: NodeId, h: Handle) -> SysResult<HandleId> {
        if self.handles.len() >= self.export.max_handles {
            return Err(WireErrno::EMFILE);
        }
        let h = (node, Arc::new(h));
        loop {
            // Skips numbers a reconnecting client claimed with REOPEN.
            let id = self.next_handle.fetch_add(1, Ordering::Relaxed);
            if let dashmap::Entry::Vacant(v) = self.handles.entry(id) {
                v.insert(h);
                return Ok(id);
            }
        }
    }

    /// Adds a handle under the number `fh` a reconnecting client already uses for it.
    fn add_handle_at(&self, node: NodeId, fh: HandleId, h: Handle) -> SysResult<()> {
        if fh == 0 {
            return Err(WireErrno::EINVAL);
        }
        if self.handles.len() >= self.export.max_handles {
            return Err(WireErrno::EMFILE);
        }
        match self.handles.entry(fh) {
            dashmap::Entry::Occupied(_) => Err(WireErrno::EEXIST),
            dashmap::Entry::Vacant(v) => {
                v.insert((node, Arc::new(h)));
                self.next_handle
                    .fetch_max(fh.saturating_add(1), Ordering::Relaxed);
                Ok(())
            }
        }
    }

    /// Opens the node's inode again through /proc/self/fd with real access flags.
    pub(super) fn reopen(&self, fd: &OwnedFd, flags: i32) -> SysResult<OwnedFd> {
        self.host().reopen(fd.as_fd(), flags)
    }

    fn check_writable(&self, req: &Request) -> SysResult<()> {
        let mutating = req.op().mutates()
            || matches!(req, Request::Open { flags, .. } | Request::Reopen { flags, dir: false, .. }
                if flags & (libc::O_ACCMODE as u32) != libc::O_RDONLY as u32
                    || flags & libc::O_TRUNC as u32 != 0);
        if self.export.read_only && mutating {
            return Err(WireErrno::EROFS);
        }
        Ok(())
    }

    /// Reads file data straight into `buf` (the outgoing frame) and returns the length.
    pub fn read_into(
        &self,
        node: NodeId,
        fh: HandleId,
        offset: u64,
        buf: &mut [u8],
    ) -> SysResult<usize> {
        let h = self.file_for(node, fh, libc::O_RDONLY)?;
        let Handle::File(f) = &*h else { unreachable!() };
        if offset == 0 {
            self.started_reading(node);
        }
        self.host().pread(f.as_fd(), buf, offset)
    }

    /// The guest reads `node` from its start (its page cache had none of it): perhaps the
    /// next file of a cold walk through its directory (readahead.rs).
    fn started_reading(&self, node: NodeId) {
        let Some(dir) = self.nodes.get(node).ok().and_then(|n| n.parent()) else {
            return;
        };
        if self.readahead.started_reading(dir, node) {
            if let Ok(stream) = self.dir_stream(dir) {
                self.readahead.queue(stream);
            }
        }
    }

    fn readlink(&self, node: NodeId) -> SysResult<Vec<u8>> {
        let (n, fd) = self.node_fd(node)?;
        if !n.is_symlink() {
            return Err(WireErrno::EINVAL);
        }
        self.host().readlink(fd.as_fd())
    }

    /// Executes one request (all but read, which writes straight into the reply frame).
    pub fn dispatch(&self, caller: Caller, req: Request) -> SysResult<Reply> {
        self.check_writable(&req)?;
        self.execute(caller, req)
    }

    fn execute(&self, caller: Caller, req: Request) -> SysResult<Reply> {
        use Request::*;
        match req {
            Hello(_) | Auth { .. } => Err(WireErrno::EINVAL),
            Ping => Ok(Reply::Empty),
            // The session drains the watcher before a SYNC gets here (session.rs, `Pusher`);
            // without watching there is nothing to wait for.
            Sync => Ok(Reply::Empty),
            Setlk {
                node,
                lock,
                generation,
            } => self.setlk(node, lock, generation),
            Getlk { node, lock } => self.getlk(node, lock),
            LockRelease {
                node,
                owner,
                generation,
            } => Ok(self.lock_release(node, owner, generation)),
            Lookup { parent, name } => {
                let name = component(&name)?;
                let pfd = self.dir_fd(parent)?;
                self.lookup_in(parent, pfd.as_fd(), name).map(Reply::Entry)
            }
            Reclaim {
                parent,
                name,
                lookups,
            } => {
                let name = component(&name)?;
                let pfd = self.dir_fd(parent)?;
                let e = self.lookup_in(parent, pfd.as_fd(), name)?;
                self.nodes.add_lookups(e.node, lookups.saturating_sub(1));
                Ok(Reply::Entry(e))
            }
            Forget { nodes } => {
                for (id, n) in nodes {
                    let Some(gone) = self.nodes.forget(id, n) else {
                        continue;
                    };
                    // The guest has no file open on it, so no lock on it either.
                    self.forget_locks(gone.id);
                    self.spares.remove(&gone.id);
                    self.writers.forget(gone.id);
                    if let Some(w) = &self.watch {
                        w.forgotten(&gone);
                    }
                }
                Ok(Reply::Empty)
            }
            Getattr { node, fh } => {
                if fh != 0 {
                    if let Ok(h) = self.handle(node, fh) {
                        let st = match &*h {
                            Handle::File(f) => self.host().stat(f.as_fd())?,
                            Handle::Dir(d) => self.host().stat(d.lock().unwrap().as_fd())?,
                        };
                        return Ok(Reply::Attr(self.attr_of(&st, node)));
                    }
                }
                self.getattr_node(node).map(Reply::Attr)
            }
            Setattr { node, fh, set } => self.setattr(caller, node, fh, set).map(Reply::Attr),
            Readlink { node } => self.readlink(node).map(|v| Reply::Data(Bytes::from(v))),
            Mknod {
                parent,
                name,
                mode,
                rdev,
                umask,
            } => {
                let name = component(&name)?;
                let kind = mode & libc::S_IFMT;
                // Device nodes made by a guest would be usable on the host: refuse them.
                if kind != libc::S_IFIFO && kind != libc::S_IFSOCK && kind != libc::S_IFREG {
                    return Err(WireErrno::EPERM);
                }
                let pfd = self.dir_fd(parent)?;
                let perm = mode & 0o7777 & !umask;
                self.own_names(
                    &[(parent, name.as_bytes(), NameChange::Created)],
                    &[],
                    || {
                        self.as_caller(caller, || {
                            self.host().mknod_at(pfd.as_fd(), &name, kind | perm, rdev)
                        })
                    },
                )?;
                self.lookup_in(parent, pfd.as_fd(), name).map(Reply::Entry)
            }
            Mkdir {
                parent,
                name,
                mode,
                umask,
            } => {
                let name = component(&name)?;
                let pfd = self.dir_fd(parent)?;
                let perm = mode & 0o7777 & !umask;
                self.own_names(
                    &[(parent, name.as_bytes(), NameChange::Created)],
                    &[],
                    || self.as_caller(caller, || self.host().mkdir_at(pfd.as_fd(), &name, perm)),
                )?;
                self.lookup_in(parent, pfd.as_fd(), name).map(Reply::Entry)
            }
            Unlink { parent, name } => {
                let name = component(&name)?;
                let pfd = self.dir_fd(parent)?;
                // Another link of the file may remain: its link count and ctime change too.
                let file = self.keep_if_held(parent, pfd.as_fd(), &name);
                let change = [(parent, name.as_bytes(), NameChange::Deleted)];
                self.own_names(&change, &[file], || {
                    self.host().unlink_at(pfd.as_fd(), &name, 0)
                })
                .map(|_| Reply::Empty)
            }
            Rmdir { parent, name } => {
                let name = component(&name)?;
                let pfd = self.dir_fd(parent)?;
                // The directory removed changes (its link count) too.
                let removed = self.keep_if_held(parent, pfd.as_fd(), &name);
                let change = [(parent, name.as_bytes(), NameChange::Deleted)];
                self.own_names(&change, &[removed], || {
                    self.host()
                        .unlink_at(pfd.as_fd(), &name, libc::AT_REMOVEDIR)
                })
                .map(|_| Reply::Empty)
            }
            Symlink {
                parent,
                name,
                target,
            } => {
                let name = component(&name)?;
                if target.len() >= libc::PATH_MAX as usize {
                    return Err(WireErrno::ENAMETOOLONG);
                }
                let target = CString::new(target.to_vec()).map_err(|_| WireErrno::EINVAL)?;
                let pfd = self.dir_fd(parent)?;
                self.own_names(
                    &[(parent, name.as_bytes(), NameChange::Created)],
                    &[],
                    || {
                        self.as_caller(caller, || {
                            self.host().symlink_at(&target, pfd.as_fd(), &name)
                        })
                    },
                )?;
                self.lookup_in(parent, pfd.as_fd(), name).map(Reply::Entry)
            }
            Rename {
                parent,
                name,
                new_parent,
                new_name,
                flags,
            } => self.rename(parent, &name, new_parent, &new_name, flags),
            Link {
                node,
                new_parent,
                new_name,
            } => {
                let new_name = component(&new_name)?;
                let (n, fd) = self.node_fd(node)?;
                if n.is_dir() {
                    return Err(WireErrno::EPERM);
                }
                let pfd = self.dir_fd(new_parent)?;
                let expect = [(new_parent, new_name.as_bytes(), NameChange::Created)];
                // The file's link count and ctime change: that is this session's change too.
                let file = Some((n.clone(), fd.clone()));
                self.own_names(&expect, &[file], || {
                    self.host().link_open(fd.as_fd(), pfd.as_fd(), &new_name)
                })?;
                self.lookup_in(new_parent, pfd.as_fd(), new_name)
                    .map(Reply::Entry)
            }
            Open { node, flags } => {
                let (n, fd) = self.openable_node(node)?;
                if n.is_dir() && flags & (libc::O_ACCMODE as u32) != libc::O_RDONLY as u32 {
                    return Err(WireErrno::EISDIR);
                }
                let reopen = || self.reopen(&fd, open_host_flags(flags));
                let f = if flags & libc::O_TRUNC as u32 != 0 {
                    self.own_change(&n, fd.as_fd(), reopen, |_, _| 0)?
                } else {
                    reopen()?
                };
                let fh = self.add_handle(node, Handle::File(f))?;
                Ok(Reply::Open { fh, flags: 0 })
            }
            Create {
                parent,
                name,
                mode,
                umask,
                flags,
            } => {
                let name = component(&name)?;
                let pfd = self.dir_fd(parent)?;
                let perm = mode & 0o7777 & !umask;
                // Create exclusively, so the server knows whether it made the file (and so
                // whether to expect the watcher's echo); open an existing one only if the
                // guest did not ask for O_EXCL.
                let base = open_host_flags(flags) | libc::O_NOFOLLOW;
                let expect = [(parent, name.as_bytes(), NameChange::Created)];
                let created = self.own_names(&expect, &[], || {
                    self.as_caller(caller, || {
                        let excl = base | libc::O_CREAT | libc::O_EXCL;
                        self.host().open_at((pfd.as_fd(), &name), excl, perm)
                    })
                });
                let new_file = created.is_ok();
                let f = match created {
                    Err(WireErrno::EEXIST) if flags as i32 & libc::O_EXCL == 0 => {
                        // Open what is there only if it is a regular file.
                        let existing = self.host().open_node(pfd.as_fd(), &name)?;
                        let kind = self.host().stat(existing.as_fd())?.st_mode & libc::S_IFMT;
                        if kind == libc::S_IFDIR {
                            return Err(WireErrno::EISDIR);
                        }
                        check_openable(kind)?;
                        self.reopen(&existing, open_host_flags(flags))?
                    }
                    r => r?,
                };
                // The node gets its own O_PATH descriptor of the very inode just opened.
                let path_fd = self.reopen(&f, libc::O_PATH)?;
                let mut entry = self.entry_of(parent, path_fd, name)?;
                if new_file {
                    entry.flags |= entry_flags::NEW_FILE;
                }
                let fh = if self.create_no_handle {
                    // The client writes to it by node: through this descriptor, if it was
                    // opened for plain writes.
                    if new_file && plain_writable(flags) {
                        self.writers.keep(entry.node, f);
                    }
                    0
                } else {
                    match self.add_handle(entry.node, Handle::File(f)) {
                        Ok(fh) => fh,
                        Err(e) => {
                            self.nodes.forget(entry.node, 1);
                            return Err(e);
                        }
                    }
                };
                Ok(self.created(entry, fh, parent, &pfd))
            }
            Spares { parent, count } => self.make_spares(caller, parent, count),
            Bind {
                parent,
                name,
                node,
                mode,
                umask,
                time,
            } => self.bind(caller, parent, &name, node, mode & 0o7777 & !umask, time),
            Read { .. } => Err(WireErrno::EINVAL),
            Write {
                node,
                fh,
                offset,
                data,
            } => {
                let n = self.nodes.get(node)?;
                let w = self.write_fd(node, fh)?;
                let f = w.file();
                let (written, after) = self.own_change_then_stat(
                    &n,
                    f.as_fd(),
                    || {
                        let written = self.host().pwrite(f.as_fd(), &data, offset)?;
                        // A guest writer without CAP_FSETID (uid 0 stands for it, as for
                        // truncation) clears set-user-ID as a local write would; the server's own
                        // write, with its CAP_FSETID, would not (the guest kernel leaves this to the
                        // server: FUSE_HANDLE_KILLPRIV_V2). The data is written either way.
                        if caller.uid != 0 {
                            if let Err(e) = self.kill_suidgid(f, caller) {
                                tracing::debug!(node, "clearing set-user-ID after a write: {e:?}");
                            }
                        }
                        Ok(written)
                    },
                    |before, &written| before.max(offset + written as u64),
                )?;
                // After the write (as the echo check read it): the kernel drops the file's
                // size and times and asks for them again at the next stat.
                let attr = after
                    .filter(|_| self.write_attr)
                    .map(|st| Box::new(self.attr_of(&st, node)));
                Ok(Reply::Written {
                    size: written as u64,
                    attr,
                })
            }
            Statfs { node } => {
                let (_, fd) = self.node_fd(node)?;
                let s = self.host().statfs(fd.as_fd())?;
                Ok(Reply::Statfs(tether_proto::Statfs {
                    blocks: s.f_blocks,
                    bfree: s.f_bfree,
                    bavail: s.f_bavail,
                    files: s.f_files,
                    ffree: s.f_ffree,
                    bsize: s.f_bsize as u32,
                    namelen: s.f_namemax as u32,
                    frsize: s.f_frsize as u32,
                }))
            }
            Release { node, fh } | Releasedir { node, fh } => {
                self.handles.remove_if(&fh, |_, (n, _)| *n == node);
                Ok(Reply::Empty)
            }
            Flush { .. } => Ok(Reply::Empty),
            Fsync { node, fh, datasync } | Fsyncdir { node, fh, datasync } => {
                let h = if fh != 0 {
                    self.handle(node, fh)?
                } else {
                    let (_, fd) = self.openable_node(node)?;
                    Arc::new(Handle::File(self.reopen(&fd, libc::O_RDONLY)?))
                };
                match &*h {
                    Handle::File(f) => self.host().fsync(f.as_fd(), datasync)?,
                    Handle::Dir(d) => self.host().fsync(d.lock().unwrap().as_fd(), datasync)?,
                }
                Ok(Reply::Empty)
            }
            Setxattr {
                node,
                name,
                value,
                flags,
            } => {
                let name = xattr_name(&name)?;
                let (n, fd) = self.node_fd(node)?;
                if n.is_symlink() {
                    return Err(WireErrno::EPERM);
                }
                self.own_change(
                    &n,
                    fd.as_fd(),
                    || {
                        self.host()
                            .setxattr(fd.as_fd(), &name, &value, flags as i32)
                    },
                    |before, _| before,
                )?;
                Ok(Reply::Empty)
            }
            Getxattr { node, name, size } => {
                let name = xattr_name(&name)?;
                let (n, fd) = self.node_fd(node)?;
                if n.is_symlink() {
                    return Err(WireErrno::ENODATA);
                }
                xattr_reply(size, |buf| self.host().getxattr(fd.as_fd(), &name, buf))
            }
            Listxattr { node, size } => {
                let (n, fd) = self.node_fd(node)?;
                if n.is_symlink() {
                    return xattr_reply(size, |_| Ok(0));
                }
                xattr_reply(size, |buf| self.host().listxattr(fd.as_fd(), buf))
            }
            Removexattr { node, name } => {
                let name = xattr_name(&name)?;
                let (n, fd) = self.node_fd(node)?;
                if n.is_symlink() {
                    return Err(WireErrno::EPERM);
                }
                self.own_change(
                    &n,
                    fd.as_fd(),
                    || self.host().removexattr(fd.as_fd(), &name),
                    |before, _| before,
                )?;
                Ok(Reply::Empty)
            }
            Reopen {
                node,
                fh,
                flags,
                dir,
            } => {
                let h = if dir {
                    Handle::Dir(Mutex::new(self.dir_stream(node)?))
                } else {
                    let (n, fd) = self.openable_node(node)?;
                    if n.is_dir() {
                        return Err(WireErrno::EISDIR);
                    }
                    // The file was created and truncated when it was first opened.
                    let flags = open_host_flags(flags) & !libc::O_TRUNC;
                    Handle::File(self.reopen(&fd, flags)?)
                };
                self.add_handle_at(node, fh, h)?;
                Ok(Reply::Empty)
            }
            Opendir { node, .. } => {
                let fh = self.add_handle(node, Handle::Dir(Mutex::new(self.dir_stream(node)?)))?;
                Ok(Reply::Open { fh, flags: 0 })
            }
            Readdir {
                node,
                fh,
                offset,
                size,
                plus,
            } => self.readdir(node, fh, offset, size, plus),
            Access { node, mask } => {
                let (_, fd) = self.node_fd(node)?;
                self.host().access(fd.as_fd(), mask as i32)?;
                Ok(Reply::Empty)
            }
            Fallocate {
                node,
                fh,
                offset,
                length,
                mode,
            } => {
                let h = self.file_for(node, fh, libc::O_WRONLY)?;
                let Handle::File(f) = &*h else { unreachable!() };
                let n = self.nodes.get(node)?;
                let keeps_size = mode as i32 & libc::FALLOC_FL_KEEP_SIZE != 0;
                self.own_change(
                    &n,
                    f.as_fd(),
                    || {
                        self.host()
                            .fallocate(f.as_fd(), mode as i32, offset, length)
                    },
                    |before, _| match keeps_size {
                        true => before,
                        false => before.max(offset + length),
                    },
                )?;
                Ok(Reply::Empty)
            }
            Lseek {
                node,
                fh,
                offset,
                whence,
            } => {
                let h = self.file_for(node, fh, libc::O_RDONLY)?;
                let Handle::File(f) = &*h else { unreachable!() };
                let off = self.host().lseek(f.as_fd(), offset, whence as i32)?;
                Ok(Reply::Lseek { offset: off })
            }
            CopyFileRange {
                node_in,
                fh_in,
                offset_in,
                node_out,
                fh_out,
                offset_out,
                len,
                flags,
            } => {
                if flags != 0 {
                    return Err(WireErrno::EINVAL);
                }
                let hi = self.file_for(node_in, fh_in, libc::O_RDONLY)?;
                let ho = self.file_for(node_out, fh_out, libc::O_WRONLY)?;
                let (Handle::File(fi), Handle::File(fo)) = (&*hi, &*ho) else {
                    unreachable!()
                };
                let out = self.nodes.get(node_out)?;
                let n = self.own_change(
                    &out,
                    fo.as_fd(),
                    || {
                        let (from, to) = ((fi.as_fd(), offset_in), (fo.as_fd(), offset_out));
                        self.host().copy_file_range(from, to, len)
                    },
                    |before, &n| before.max(offset_out + n),
                )?;
                Ok(Reply::Written {
                    size: n,
                    attr: None,
                })
            }
        }
    }

    fn setattr(
        &self,
        caller: Caller,
        node: NodeId,
        fh: HandleId,
        set: tether_proto::SetAttr,
    ) -> SysResult<Attr> {
        let (n, fd) = self.node_fd(node)?;
        let resized = set.valid & setattr_valid::SIZE != 0;
        self.own_change(
            &n,
            fd.as_fd(),
            || self.apply_setattr(&n, &fd, fh, set, caller),
            |before, _| if resized { set.size } else { before },
        )?;
        let st = self.host().stat(fd.as_fd())?;
        Ok(self.attr_of(&st, node))
    }

    fn apply_setattr(
        &self,
        n: &Node,
        fd: &OwnedFd,
        fh: HandleId,
        set: tether_proto::SetAttr,
        caller: Caller,
    ) -> SysResult<()> {
        let file = if fh != 0 {
            self.file(n.id, fh).ok()
        } else {
            None
        };
        let file_fd = file.as_ref().map(|h| match &**h {
            Handle::File(f) => f.as_fd(),
            Handle::Dir(_) => unreachable!(),
        });
        if set.valid & setattr_valid::MODE != 0 {
            if n.is_symlink() {
                return Err(WireErrno::EOPNOTSUPP);
            }
            self.host().chmod_node(fd.as_fd(), set.mode & 0o7777)?;
        }
        if set.valid & (setattr_valid::UID | setattr_valid::GID) != 0 {
            let uid = (set.valid & setattr_valid::UID != 0).then_some(set.uid);
            let gid = (set.valid & setattr_valid::GID != 0).then_some(set.gid);
            let (uid, gid) = self.ids.chown(uid, gid)?;
            if uid.is_some() || gid.is_some() {
                self.host().chown(fd.as_fd(), uid, gid)?;
            }
        }
        if set.valid & setattr_valid::SIZE != 0 {
            if n.is_dir() {
                return Err(WireErrno::EISDIR);
            }
            match file_fd {
                Some(f) => self.host().truncate(f, set.size)?,
                None => self.host().truncate_node(fd.as_fd(), set.size)?,
            }
        }
        if set.atime != SetTime::Omit || set.mtime != SetTime::Omit {
            self.host()
                .utimens(fd.as_fd(), &[settime(set.atime), settime(set.mtime)])?;
        }
        if set.valid & setattr_valid::KILL_SUIDGID != 0 {
            self.kill_suidgid(fd, caller)?;
        }
        Ok(())
    }

    /// What Linux does to a regular file written or truncated by a process without
    /// CAP_FSETID, or given away by chown: set-user-ID goes, and set-group-ID if the file is
    /// group-executable or the caller is neither in its group nor root (the caller's gid
    /// stands for its groups here, and uid 0 for the capability).
    fn kill_suidgid(&self, fd: &OwnedFd, caller: Caller) -> SysResult<()> {
        let st = self.host().stat(fd.as_fd())?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Ok(());
        }
        let mut mode = st.st_mode & 0o7777;
        mode &= !libc::S_ISUID;
        let group_exec = st.st_mode & libc::S_IXGRP != 0;
        let (_, file_gid) = self.ids.guest_owner(st.st_uid, st.st_gid);
        if group_exec || (caller.uid != 0 && caller.gid != file_gid) {
            mode &= !libc::S_ISGID;
        }
        if mode != st.st_mode & 0o7777 {
            self.host().chmod_node(fd.as_fd(), mode)?;
        }
        Ok(())
    }

    fn rename(
        &self,
        parent: NodeId,
        name: &[u8],
        new_parent: NodeId,
        new_name: &[u8],
        flags: u32,
    ) -> SysResult<Reply> {
        let name = component(name)?;
        let new_name = component(new_name)?;
        let allowed = libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE;
        if flags & !allowed != 0 {
            return Err(WireErrno::EINVAL);
        }
        let pfd = self.dir_fd(parent)?;
        let npfd = self.dir_fd(new_parent)?;
        let mut expect = vec![
            (parent, name.as_bytes(), NameChange::MovedFrom),
            (new_parent, new_name.as_bytes(), NameChange::MovedTo),
        ];
        if flags & libc::RENAME_EXCHANGE != 0 {
            expect.push((new_parent, new_name.as_bytes(), NameChange::MovedFrom));
            expect.push((parent, name.as_bytes(), NameChange::MovedTo));
        }
        // A file the rename replaces loses its name (an exchanged one keeps one).
        let target = if flags & libc::RENAME_EXCHANGE == 0 {
            self.keep_if_held(new_parent, npfd.as_fd(), &new_name)
        } else {
            (self.nodes.held_at(npfd.as_fd(), &new_name)).and_then(|n| self.with_fd(n))
        };
        // A rename changes the moved file's ctime, and the replaced (or exchanged) one's:
        // this session's change, not the host's.
        let moved = (self.nodes.held_at(pfd.as_fd(), &name)).and_then(|n| self.with_fd(n));
        let files = [moved, target];
        self.own_names(&expect, &files, || {
            let (from, to) = ((pfd.as_fd(), &*name), (npfd.as_fd(), &*new_name));
            self.host().rename_at(from, to, flags)
        })?;
        // Keep the moved nodes findable by name should their descriptors be evicted.
        if let Ok(st) = self.host().stat_at(npfd.as_fd(), &new_name) {
            self.nodes.moved(
                self.nodes.id_for(st.st_dev, st.st_ino),
                new_parent,
                new_name.clone(),
            );
        }
        if flags & libc::RENAME_EXCHANGE != 0 {
            if let Ok(st) = self.host().stat_at(pfd.as_fd(), &name) {
                self.nodes
                    .moved(self.nodes.id_for(st.st_dev, st.st_ino), parent, name);
            }
        }
        Ok(Reply::Empty)
    }

    fn readdir(
        &self,
        node: NodeId,
        fh: HandleId,
        offset: u64,
        size: u32,
        plus: bool,
    ) -> SysResult<Reply> {
        let h = if fh != 0 {
            self.handle(node, fh)?
        } else {
            // Listing addressed by node (no-opendir mode): a stream just for this request;
            // offsets are the file system's cookies, valid across streams.
            Arc::new(Handle::Dir(Mutex::new(self.dir_stream(node)?)))
        };
        let Handle::Dir(dir) = &*h else {
            return Err(WireErrno::ENOTDIR);
        };
        let dir = dir.lock().unwrap();
        let mut budget = size as usize;
        let mut entries = Vec::new();
        let mut failure = None;
        let ended = self.host().read_dir(dir.as_fd(), offset, &mut |raw| {
            let need = tether_proto::fuse_dirent_size(raw.name.len(), plus);
            if need > budget {
                return false;
            }
            let dots = raw.name == b"." || raw.name == b"..";
            // The root's ".." is outside the export: it shows as the root itself.
            let ino = if raw.name == b"." || (node == ROOT_NODE && raw.name == b"..") {
                node
            } else {
                self.nodes.id_for(self.nodes.root_dev(), raw.ino)
            };
            let entry = if plus && !dots {
                let name = match CString::new(raw.name.clone()) {
                    Ok(n) => n,
                    Err(_) => return true,
                };
                match self.lookup_in(node, dir.as_fd(), name) {
                    Ok(e) => Some(e),
                    // Removed since the listing was read: skip it, as a local readdir might;
                    // a Tether mount inside the export (refuse_tether_mount) is left out.
                    Err(WireErrno::ENOENT | WireErrno::ELOOP) => return true,
                    Err(e) => {
                        failure = Some(e);
                        return false;
                    }
                }
            } else {
                None
            };
            budget -= need;
            entries.push(DirEntry {
                ino: entry.as_ref().map(|e| e.node).unwrap_or(ino),
                offset: raw.next_offset,
                kind: raw.kind,
                name: Bytes::from(raw.name),
                entry,
            });
            true
        })?;
        if let (Some(e), true) = (failure, entries.is_empty()) {
            return Err(e);
        }
        Ok(Reply::Dir {
            entries,
            end: ended && self.dir_end,
        })
    }
}

/// Whether the server may open an object of `kind` (S_IFMT bits) for I/O: only a regular
/// file or a directory. The guest kernel runs FIFOs, sockets and devices itself and never
/// asks to open them; opening a FIFO here would block a worker until someone opened the
/// other end, and a device would reach past the export.
fn check_openable(kind: u32) -> SysResult<()> {
    match kind {
        libc::S_IFREG | libc::S_IFDIR => Ok(()),
        libc::S_IFLNK => Err(WireErrno::ELOOP),
        _ => Err(WireErrno::ENXIO),
    }
}

/// Whether a file opened with the guest's `flags` may serve later writes by node, which
/// carry their own offsets and need no per-descriptor behaviour.
fn plain_writable(flags: u32) -> bool {
    let special = libc::O_APPEND | libc::O_DIRECT | libc::O_SYNC | libc::O_DSYNC;
    flags as i32 & libc::O_ACCMODE != libc::O_RDONLY && flags as i32 & special == 0
}

/// Host open flags for a guest open: creation and no-follow flags are the server's business.
fn open_host_flags(flags: u32) -> i32 {
    let keep = libc::O_ACCMODE
        | libc::O_APPEND
        | libc::O_NONBLOCK
        | libc::O_DSYNC
        | libc::O_SYNC
        | libc::O_NOATIME
        | libc::O_TRUNC
        | libc::O_DIRECT
        | libc::O_LARGEFILE;
    flags as i32 & keep
}

fn xattr_name(name: &[u8]) -> SysResult<CString> {
    if name.is_empty() || name.len() > 255 {
        return Err(if name.is_empty() {
            WireErrno::EINVAL
        } else {
            WireErrno::ERANGE
        });
    }
    // Unlike a component, an xattr name is not checked for NUL on the way in.
    CString::new(name).map_err(|_| WireErrno::EINVAL)
}

/// getxattr/listxattr: with size 0 report the size, else return the value or ERANGE.
fn xattr_reply(size: u32, mut get: impl FnMut(&mut [u8]) -> SysResult<usize>) -> SysResult<Reply> {
    if size == 0 {
        return Ok(Reply::XattrSize(get(&mut [])? as u32));
    }
    let mut buf = vec![0u8; size.min(64 * 1024) as usize];
    let n = get(&mut buf)?;
    buf.truncate(n);
    Ok(Reply::XattrData(Bytes::from(buf)))
}
