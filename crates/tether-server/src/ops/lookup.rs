//! Names from the guest, and what finding one records: the checked component, the node
//! table's entry (a new directory is watched), the Entry the client is answered with, and
//! the Tether mounts the export refuses. Shared by every operation that answers with an
//! entry (entry.rs, spare.rs, readdirplus in dir.rs).

use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tether_proto::{entry_flags, Entry, HandleId, NodeId, Reply, WireErrno};

use crate::backend::SysResult;
use crate::export::fs::ExportFs;
use crate::nodes::Node;

/// Checks a single path component from the guest.
pub fn component(name: &[u8]) -> SysResult<CString> {
    if !tether_proto::is_component(name) {
        return Err(WireErrno::EINVAL);
    }
    if name.len() > tether_proto::NAME_MAX {
        return Err(WireErrno::ENAMETOOLONG);
    }
    Ok(CString::new(name).expect("a component has no NUL"))
}

/// Looks `name` up in directory `parent_fd` and counts one lookup of the result.
pub fn lookup_in(
    fs: &ExportFs,
    parent: NodeId,
    parent_fd: BorrowedFd<'_>,
    name: CString,
) -> SysResult<Entry> {
    let fd = fs.host().open_node(parent_fd, &name)?;
    refuse_tether_mount(fs, &fd, parent_fd, &name)?;
    entry_of(fs, parent, fd, name)
}

/// Refuses (ELOOP) a Tether mount found inside the export: a guest that mounts the
/// export inside itself (serving /a, mounting at /a/sub/mnt on the same machine) would
/// have this server send requests into its own mount, whose client waits for this
/// server: a loop that hangs both. The subtree is left out, said once in the log.
fn refuse_tether_mount(
    fs: &ExportFs,
    fd: &OwnedFd,
    parent_fd: BorrowedFd<'_>,
    name: &CStr,
) -> SysResult<()> {
    let Some((major, minor)) = fs.host().mount_root_device(fd.as_fd())? else {
        return Ok(());
    };
    let mounted = tether_sys::mountinfo::mount_of_device(major, minor)
        .ok()
        .flatten();
    if !mounted.is_some_and(|m| m.is_tether()) {
        return Ok(());
    }
    let path = fs.host().fd_path(parent_fd).unwrap_or_default();
    let mut path = std::path::PathBuf::from(std::ffi::OsStr::from_bytes(&path));
    path.push(std::ffi::OsStr::from_bytes(name.to_bytes()));
    if fs
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
/// ([`entry_for`]), noting the watcher's batch count before the read.
pub fn entry_of(fs: &ExportFs, parent: NodeId, fd: OwnedFd, name: CString) -> SysResult<Entry> {
    let seen = fs.watch.as_ref().map_or(0, |w| w.batches_seen());
    let (st, birth) = fs.host().stat_born(fd.as_fd())?;
    entry_for(fs, parent, fd, (&st, birth), name, seen)
}

/// Records a lookup of `fd` (found as `name` in `parent`, its status `st` read when
/// `Watch::batches_seen` was `seen`), watching it if it is a new directory, and builds its
/// entry.
pub fn entry_for(
    fs: &ExportFs,
    parent: NodeId,
    fd: OwnedFd,
    (st, birth): (&libc::stat, Option<(i64, u32)>),
    name: CString,
    seen: u64,
) -> SysResult<Entry> {
    let (node, new) = fs.nodes.remember(fd, (st, birth), parent, name);
    let mut st = *st;
    let mut flags = 0;
    if let Some(w) = &fs.watch {
        if w.batches_seen() != seen {
            st = state_now(fs, &node, st, new)?;
        }
        if node.is_dir() && !node.watched.load(Ordering::Relaxed) {
            let fd = fs.nodes.fd(&node)?;
            w.watch_dir(&node, &fd);
        }
        let parent_watched = fs
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
        attr: fs.attr_of(&st, node.id),
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
fn state_now(fs: &ExportFs, node: &Arc<Node>, st: libc::stat, new: bool) -> SysResult<libc::stat> {
    let fd = fs.nodes.fd(node)?;
    let mut synced = node.synced_ctime.lock().unwrap();
    let now = fs.host().stat(fd.as_fd())?;
    if (now.st_ctime, now.st_ctime_nsec) == (st.st_ctime, st.st_ctime_nsec) {
        return Ok(st);
    }
    if new {
        *synced = (now.st_ctime, now.st_ctime_nsec);
    }
    Ok(now)
}

/// The reply to a creation of `entry` in `parent` (descriptor `pfd`), with handle `fh`:
/// after it the kernel drops the directory's attributes and asks for them again before
/// its next lookup there, so they come along (DIR_ATTR).
pub fn created(
    fs: &ExportFs,
    entry: Entry,
    fh: Option<HandleId>,
    parent: NodeId,
    pfd: &OwnedFd,
) -> Reply {
    let dir = fs
        .dir_attr
        .then(|| fs.host().stat(pfd.as_fd()).ok())
        .flatten()
        .map(|st| Box::new(fs.attr_of(&st, parent)));
    Reply::Create {
        entry,
        fh,
        flags: 0,
        dir,
    }
}
