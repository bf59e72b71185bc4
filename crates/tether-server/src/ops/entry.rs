//! Names and links: LOOKUP, RECLAIM, FORGET, MKNOD, MKDIR, UNLINK, RMDIR, SYMLINK,
//! READLINK, RENAME, LINK, CREATE. Each change of a name is one `*at` call in a directory
//! the server holds, made as the guest's caller where it creates something, and told to
//! the watch beforehand so that its echo is not pushed back (`ExportFs::own_names`).

use std::ffi::CString;
use std::os::fd::AsFd;

use bytes::Bytes;
use tether_proto::{entry_flags, Caller, NodeId, Reply, WireErrno};

use super::io::open_host_flags;
use super::lookup::{component, created, entry_of, lookup_in};
use crate::backend::SysResult;
use crate::export::fs::{check_openable, ExportFs};
use crate::export::handles::Handle;
use crate::watch::NameChange;

/// The permission bits a creation asks for: `mode` less the guest's `umask`.
pub fn perm((mode, umask): (u32, u32)) -> u32 {
    mode & 0o7777 & !umask
}

pub fn lookup(fs: &ExportFs, parent: NodeId, name: &[u8]) -> SysResult<Reply> {
    let name = component(name)?;
    let pfd = fs.dir_fd(parent)?;
    lookup_in(fs, parent, pfd.as_fd(), name).map(Reply::Entry)
}

/// RECLAIM: a lookup that counts `lookups` at once (a reconnecting client restoring what
/// its kernel holds).
pub fn reclaim(fs: &ExportFs, parent: NodeId, name: &[u8], lookups: u64) -> SysResult<Reply> {
    let name = component(name)?;
    let pfd = fs.dir_fd(parent)?;
    let e = lookup_in(fs, parent, pfd.as_fd(), name)?;
    fs.nodes.add_lookups(e.node, lookups.saturating_sub(1));
    Ok(Reply::Entry(e))
}

pub fn forget(fs: &ExportFs, nodes: Vec<(NodeId, u64)>) -> SysResult<Reply> {
    for (id, n) in nodes {
        let Some(gone) = fs.nodes.forget(id, n) else {
            continue;
        };
        // The guest has no file open on it, so no lock on it either.
        fs.locks.forget_node(gone.id);
        fs.spares.remove(&gone.id);
        fs.writers.forget(gone.id);
        if let Some(w) = &fs.watch {
            w.forgotten(&gone);
        }
    }
    Ok(Reply::Empty)
}

pub fn mknod(
    fs: &ExportFs,
    caller: Caller,
    parent: NodeId,
    name: &[u8],
    (mode, umask): (u32, u32),
    rdev: u64,
) -> SysResult<Reply> {
    let name = component(name)?;
    let kind = mode & crate::backend::S_IFMT;
    // Device nodes made by a guest would be usable on the host: refuse them.
    if kind != crate::backend::S_IFIFO
        && kind != crate::backend::S_IFSOCK
        && kind != crate::backend::S_IFREG
    {
        return Err(WireErrno::EPERM);
    }
    let pfd = fs.dir_fd(parent)?;
    let perm = perm((mode, umask));
    fs.own_names(
        &[(parent, name.as_bytes(), NameChange::Created)],
        &[],
        || {
            fs.as_caller(caller, || {
                fs.host().mknod_at(pfd.as_fd(), &name, kind | perm, rdev)
            })
        },
    )?;
    lookup_in(fs, parent, pfd.as_fd(), name).map(Reply::Entry)
}

pub fn mkdir(
    fs: &ExportFs,
    caller: Caller,
    parent: NodeId,
    name: &[u8],
    mode: (u32, u32),
) -> SysResult<Reply> {
    let name = component(name)?;
    let pfd = fs.dir_fd(parent)?;
    let perm = perm(mode);
    fs.own_names(
        &[(parent, name.as_bytes(), NameChange::Created)],
        &[],
        || fs.as_caller(caller, || fs.host().mkdir_at(pfd.as_fd(), &name, perm)),
    )?;
    lookup_in(fs, parent, pfd.as_fd(), name).map(Reply::Entry)
}

pub fn unlink(fs: &ExportFs, parent: NodeId, name: &[u8]) -> SysResult<Reply> {
    remove(fs, parent, name, 0)
}

pub fn rmdir(fs: &ExportFs, parent: NodeId, name: &[u8]) -> SysResult<Reply> {
    remove(fs, parent, name, libc::AT_REMOVEDIR)
}

/// UNLINK, or RMDIR with `flags` AT_REMOVEDIR. What the name held changes too: a file's
/// link count and ctime (another link of it may remain), a directory's link count.
fn remove(fs: &ExportFs, parent: NodeId, name: &[u8], flags: i32) -> SysResult<Reply> {
    let name = component(name)?;
    let pfd = fs.dir_fd(parent)?;
    let removed = fs.keep_if_held(parent, pfd.as_fd(), &name);
    let change = [(parent, name.as_bytes(), NameChange::Deleted)];
    fs.own_names(&change, &[removed], || {
        fs.host().unlink_at(pfd.as_fd(), &name, flags)
    })
    .map(|_| Reply::Empty)
}

pub fn symlink(
    fs: &ExportFs,
    caller: Caller,
    parent: NodeId,
    name: &[u8],
    target: &[u8],
) -> SysResult<Reply> {
    let name = component(name)?;
    if target.len() >= libc::PATH_MAX as usize {
        return Err(WireErrno::ENAMETOOLONG);
    }
    let target = CString::new(target.to_vec()).map_err(|_| WireErrno::EINVAL)?;
    let pfd = fs.dir_fd(parent)?;
    fs.own_names(
        &[(parent, name.as_bytes(), NameChange::Created)],
        &[],
        || fs.as_caller(caller, || fs.host().symlink_at(&target, pfd.as_fd(), &name)),
    )?;
    lookup_in(fs, parent, pfd.as_fd(), name).map(Reply::Entry)
}

pub fn readlink(fs: &ExportFs, node: NodeId) -> SysResult<Reply> {
    let (n, fd) = fs.node_fd(node)?;
    if !n.is_symlink() {
        return Err(WireErrno::EINVAL);
    }
    let target = fs.host().readlink(fd.as_fd())?;
    Ok(Reply::Data(Bytes::from(target)))
}

/// RENAME of `name` in `parent` to `new_name` in `new_parent`, with renameat2's `flags`.
pub fn rename(
    fs: &ExportFs,
    (parent, name): (NodeId, &[u8]),
    (new_parent, new_name): (NodeId, &[u8]),
    flags: u32,
) -> SysResult<Reply> {
    let name = component(name)?;
    let new_name = component(new_name)?;
    let allowed = crate::backend::wire::RENAME_NOREPLACE | crate::backend::wire::RENAME_EXCHANGE;
    if flags & !allowed != 0 {
        return Err(WireErrno::EINVAL);
    }
    let pfd = fs.dir_fd(parent)?;
    let npfd = fs.dir_fd(new_parent)?;
    let mut expect = vec![
        (parent, name.as_bytes(), NameChange::MovedFrom),
        (new_parent, new_name.as_bytes(), NameChange::MovedTo),
    ];
    if flags & crate::backend::wire::RENAME_EXCHANGE != 0 {
        expect.push((new_parent, new_name.as_bytes(), NameChange::MovedFrom));
        expect.push((parent, name.as_bytes(), NameChange::MovedTo));
    }
    // A file the rename replaces loses its name (an exchanged one keeps one).
    let target = if flags & crate::backend::wire::RENAME_EXCHANGE == 0 {
        fs.keep_if_held(new_parent, npfd.as_fd(), &new_name)
    } else {
        (fs.nodes.held_at(npfd.as_fd(), &new_name)).and_then(|n| fs.with_fd(n))
    };
    // A rename changes the moved file's ctime, and the replaced (or exchanged) one's:
    // this session's change, not the host's.
    let moved = (fs.nodes.held_at(pfd.as_fd(), &name)).and_then(|n| fs.with_fd(n));
    let files = [moved, target];
    fs.own_names(&expect, &files, || {
        let (from, to) = ((pfd.as_fd(), &*name), (npfd.as_fd(), &*new_name));
        fs.host().rename_at(from, to, flags)
    })?;
    // Keep the moved nodes findable by name should their descriptors be evicted.
    if let Ok(st) = fs.host().stat_at(npfd.as_fd(), &new_name) {
        fs.nodes.moved(
            fs.nodes.id_for(st.st_dev as u64, st.st_ino),
            new_parent,
            new_name.clone(),
        );
    }
    if flags & crate::backend::wire::RENAME_EXCHANGE != 0 {
        if let Ok(st) = fs.host().stat_at(pfd.as_fd(), &name) {
            fs.nodes
                .moved(fs.nodes.id_for(st.st_dev as u64, st.st_ino), parent, name);
        }
    }
    Ok(Reply::Empty)
}

pub fn link(fs: &ExportFs, node: NodeId, new_parent: NodeId, new_name: &[u8]) -> SysResult<Reply> {
    let new_name = component(new_name)?;
    let (n, fd) = fs.node_fd(node)?;
    if n.is_dir() {
        return Err(WireErrno::EPERM);
    }
    let pfd = fs.dir_fd(new_parent)?;
    let expect = [(new_parent, new_name.as_bytes(), NameChange::Created)];
    // The file's link count and ctime change: that is this session's change too.
    let file = Some((n.clone(), fd.clone()));
    fs.own_names(&expect, &[file], || {
        fs.host().link_open(fd.as_fd(), pfd.as_fd(), &new_name)
    })?;
    lookup_in(fs, new_parent, pfd.as_fd(), new_name).map(Reply::Entry)
}

/// Whether a file opened with the guest's `flags` may serve later writes by node, which
/// carry their own offsets and need no per-descriptor behaviour.
fn plain_writable(flags: u32) -> bool {
    let special =
        libc::O_APPEND | crate::backend::wire::host_oflag::DIRECT | libc::O_SYNC | libc::O_DSYNC;
    flags as i32 & libc::O_ACCMODE != libc::O_RDONLY && flags as i32 & special == 0
}

pub fn create(
    fs: &ExportFs,
    caller: Caller,
    parent: NodeId,
    name: &[u8],
    mode: (u32, u32),
    flags: u32,
) -> SysResult<Reply> {
    let name = component(name)?;
    let pfd = fs.dir_fd(parent)?;
    let perm = perm(mode);
    // Create exclusively, so the server knows whether it made the file (and so
    // whether to expect the watcher's echo); open an existing one only if the
    // guest did not ask for O_EXCL.
    let base = open_host_flags(flags) | libc::O_NOFOLLOW;
    let expect = [(parent, name.as_bytes(), NameChange::Created)];
    let created_here = fs.own_names(&expect, &[], || {
        fs.as_caller(caller, || {
            let excl = base | libc::O_CREAT | libc::O_EXCL;
            fs.host().open_at((pfd.as_fd(), &name), excl, perm)
        })
    });
    let new_file = created_here.is_ok();
    let f = match created_here {
        Err(WireErrno::EEXIST) if flags as i32 & libc::O_EXCL == 0 => {
            // Open what is there only if it is a regular file.
            let existing = fs.host().open_node(pfd.as_fd(), &name)?;
            let kind = crate::backend::file_type(&fs.host().stat(existing.as_fd())?);
            if kind == crate::backend::S_IFDIR {
                return Err(WireErrno::EISDIR);
            }
            check_openable(kind)?;
            fs.reopen(&existing, open_host_flags(flags))?
        }
        r => r?,
    };
    // The node gets its own node descriptor of the very inode just opened.
    let path_fd = fs.host().node_of_open(f.as_fd())?;
    let mut entry = entry_of(fs, parent, path_fd, name)?;
    if new_file {
        entry.flags |= entry_flags::NEW_FILE;
    }
    let fh = if fs.create_no_handle {
        // The client writes to it by node: through this descriptor, if it was
        // opened for plain writes.
        if new_file && plain_writable(flags) {
            fs.writers.keep(entry.node, f);
        }
        None
    } else {
        match fs.handles.add(entry.node, Handle::File(f)) {
            Ok(fh) => Some(fh),
            Err(e) => {
                fs.nodes.forget(entry.node, 1);
                return Err(e);
            }
        }
    };
    Ok(created(fs, entry, fh, parent, &pfd))
}
