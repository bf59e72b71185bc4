//! Spare files (feature SPARE_FILES, protocol.md §17): SPARES makes files without a name
//! ahead of need, so that the client can answer a creation at once; BIND then gives one
//! its name, permissions, group and times. A spare is held only by its descriptor here
//! until it is bound, so closing that descriptor frees it.

use std::ffi::CString;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use tether_proto::{entry_flags, Caller, Entry, NodeId, Reply, Timespec, WireErrno};

use super::entry::perm;
use super::lookup::{component, created, entry_of};
use crate::backend::SysResult;
use crate::export::fs::ExportFs;
use crate::watch::NameChange;

/// Most spare files (SPARES) a session holds unnamed at once: each is a descriptor, so
/// also at most an eighth of the export's node descriptors.
const MAX_SPARES: usize = 256;

/// A file made without a name: its descriptor, status and birth time.
type Unnamed = (OwnedFd, libc::stat, Option<(i64, u32)>);

/// SPARES: up to `count` unnamed files in `parent`, made as the caller would make a file
/// there (owner, group), each held once by the client. Fewer when the session holds
/// `MAX_SPARES` already; an error only when none could be made (a file system without
/// O_TMPFILE answers EOPNOTSUPP).
pub fn spares(fs: &ExportFs, caller: Caller, parent: NodeId, count: u32) -> SysResult<Reply> {
    let pfd = fs.dir_fd(parent)?;
    let most = MAX_SPARES.min(fs.export.budget.cap() / 8);
    let room = most.saturating_sub(fs.spares.len());
    if room == 0 {
        return Err(WireErrno::EMFILE);
    }
    let mut made = Vec::new();
    for _ in 0..(count as usize).min(room) {
        let (file, st, birth) = match make_unnamed(fs, caller, &pfd) {
            Ok(made) => made,
            Err(e) if made.is_empty() => return Err(e),
            Err(_) => break,
        };
        let node = fs.nodes.remember_unnamed((&st, birth));
        fs.spares.insert(node.id, Arc::new(file));
        made.push(Entry {
            node: node.id,
            generation: node.generation,
            flags: 0,
            attr: fs.attr_of(&st, node.id),
        });
    }
    Ok(Reply::Spares(made))
}

/// A regular file with no name in directory `pfd`, made as the caller would make a file
/// there, with its status and birth time. Its events are this session's own.
fn make_unnamed(fs: &ExportFs, caller: Caller, pfd: &OwnedFd) -> SysResult<Unnamed> {
    let file = fs.as_caller(caller, || {
        // The permissions most files get (BIND sets others).
        fs.host().open_unnamed(pfd.as_fd(), 0o644)
    })?;
    let (st, birth) = fs.host().stat_born(file.as_fd())?;
    if let Some(w) = &fs.watch {
        w.made_unnamed(st.st_ino);
    }
    Ok((file, st, birth))
}

/// BIND of `node` as `name` in `parent`, with permissions `mode` less `umask`. A node that
/// is not a spare of this session is one the client took from an earlier session's
/// spares, its BIND sent again after a reconnect (protocol.md §17):
/// - a node of this session already (the reconnect's restore bound it): done;
/// - `name` holds it (the earlier session executed the BIND): that file, counted once;
/// - `name` is free: a new spare stands in for it under its id, and is bound;
/// - `name` holds another file: EEXIST.
pub fn bind(
    fs: &ExportFs,
    caller: Caller,
    (parent, name): (NodeId, &[u8]),
    node: NodeId,
    mode: (u32, u32),
    time: Timespec,
) -> SysResult<Reply> {
    let perm = perm(mode);
    let cname = component(name)?;
    let pfd = fs.dir_fd(parent)?;
    if fs.spares.contains_key(&node) {
        return bind_spare(fs, caller, (parent, &pfd, cname), node, perm, time);
    }
    if let Ok(held) = fs.nodes.get(node) {
        let st = fs.host().stat(fs.nodes.fd(&held)?.as_fd())?;
        let entry = Entry {
            node,
            generation: held.generation,
            flags: entry_flags::NEW_FILE,
            attr: fs.attr_of(&st, node),
        };
        return Ok(created(fs, entry, None, parent, &pfd));
    }
    match fs.host().stat_at(pfd.as_fd(), &cname) {
        Ok(st) if fs.nodes.id_for(st.st_dev as u64, st.st_ino) == node => {
            let named = fs.host().open_node(pfd.as_fd(), &cname)?;
            // Its one lookup is the one SPARES counted in the earlier session.
            let mut entry = entry_of(fs, parent, named, cname)?;
            entry.flags |= entry_flags::NEW_FILE;
            return Ok(created(fs, entry, None, parent, &pfd));
        }
        Ok(_) => return Err(WireErrno::EEXIST),
        Err(WireErrno::ENOENT) => {}
        Err(e) => return Err(e),
    }
    let (file, st, birth) = make_unnamed(fs, caller, &pfd)?;
    if fs.nodes.remember_unnamed_as(node, (&st, birth)).is_none() {
        return Err(WireErrno::ESTALE);
    }
    fs.spares.insert(node, Arc::new(file));
    let bound = bind_spare(fs, caller, (parent, &pfd, cname), node, perm, time);
    if bound.is_err() {
        fs.spares.remove(&node);
        fs.nodes.forget(node, 1);
    }
    bound
}

/// BIND of a spare: gives spare `node` permissions `perm`, access and modification
/// times `time`, and the group a file made in directory `parent` (descriptor `pfd`)
/// would have (a spare may come from another directory of the file system, one without
/// set-group-ID), then links it there as `name` (EEXIST if the name is taken). Answered
/// as a creation; the lookup the client holds on the node is the one SPARES counted.
fn bind_spare(
    fs: &ExportFs,
    caller: Caller,
    (parent, pfd, name): (NodeId, &OwnedFd, CString),
    node: NodeId,
    perm: u32,
    time: Timespec,
) -> SysResult<Reply> {
    let spare = fs.spares.get(&node).map(|f| f.clone());
    let (Some(file), Ok(n)) = (spare, fs.nodes.get(node)) else {
        return Err(WireErrno::ESTALE);
    };
    // The permissions, group and times first, through the unnamed file's own
    // descriptor: its events name it "#INO" and are dropped as this session's
    // (`Watch::made_unnamed`), so the host and other guests hear only the creation.
    let dir = fs.host().stat(pfd.as_fd())?;
    let group = if dir.st_mode as u32 & libc::S_ISGID as u32 != 0 {
        dir.st_gid
    } else {
        let own = fs.host().effective_gid();
        fs.ids.creator(caller)?.map_or(own, |(_, gid)| gid)
    };
    let st = fs.host().stat(file.as_fd())?;
    let ts = libc::timespec {
        tv_sec: time.sec,
        tv_nsec: time.nsec as i64,
    };
    // Own changes of the node (its ctime moves), though nobody hears of them.
    let set_attributes = || {
        if st.st_gid != group {
            fs.host().chown(file.as_fd(), None, Some(group))?;
        }
        // As the caller, like the creation it finishes: the kernel keeps set-group-ID
        // only for a member of the file's group.
        fs.as_caller(caller, || {
            if st.st_mode as u32 & 0o7777 != perm || st.st_gid != group {
                fs.host().chmod(file.as_fd(), perm)?;
            }
            fs.host().utimens(file.as_fd(), &[ts, ts])
        })
    };
    fs.own_change(&n, file.as_fd(), set_attributes, |before, _| before)?;
    let expect = [(parent, name.as_bytes(), NameChange::Created)];
    fs.own_names(&expect, &[Some((n.clone(), file.clone()))], || {
        fs.as_caller(caller, || {
            fs.host().link_open(file.as_fd(), pfd.as_fd(), &name)
        })
    })?;
    fs.spares.remove(&node);
    // Found by its name: the node's descriptor and location from now on.
    let named = fs.host().open_node(pfd.as_fd(), &name)?;
    let (st, birth) = fs.host().stat_born(named.as_fd())?;
    if !n.same_file(&st, birth) {
        // Replaced on the host between the link and now: the guest's file is not there.
        return Err(WireErrno::ESTALE);
    }
    let mut entry = entry_of(fs, parent, named, name)?;
    // entry_of counted a lookup the client does not add: SPARES counted its one.
    fs.nodes.forget(node, 1);
    entry.flags |= entry_flags::NEW_FILE;
    Ok(created(fs, entry, None, parent, pfd))
}
