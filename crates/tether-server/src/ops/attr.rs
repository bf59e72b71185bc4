//! Attributes: GETATTR, SETATTR (mode, owner, size, times, and what a write by a process
//! without CAP_FSETID clears), ACCESS, STATFS. Ownership is shown and changed through the
//! session's id mapping (export/ids.rs).

use std::os::fd::{AsFd, OwnedFd};

use tether_proto::{setattr_valid, Caller, HandleId, NodeId, Reply, SetAttr, SetTime};

use crate::backend::SysResult;
use crate::export::fs::ExportFs;
use crate::export::handles::Handle;
use crate::nodes::Node;

/// GETATTR of `node`, through handle `fh` when it has one (an unlinked file's, say).
pub fn getattr(fs: &ExportFs, node: NodeId, fh: Option<HandleId>) -> SysResult<Reply> {
    if let Some(fh) = fh {
        if let Ok(h) = fs.handles.get(node, fh) {
            let st = match &*h {
                Handle::File(f) => fs.host().stat(f.as_fd())?,
                Handle::Dir(d) => fs.host().stat(d.lock().unwrap().as_fd())?,
            };
            return Ok(Reply::Attr(fs.attr_of(&st, node)));
        }
    }
    let (_, fd) = fs.node_fd(node)?;
    let st = fs.host().stat(fd.as_fd())?;
    Ok(Reply::Attr(fs.attr_of(&st, node)))
}

pub fn setattr(
    fs: &ExportFs,
    caller: Caller,
    node: NodeId,
    fh: Option<HandleId>,
    set: SetAttr,
) -> SysResult<Reply> {
    let (n, fd) = fs.node_fd(node)?;
    let resized = set.valid & setattr_valid::SIZE != 0;
    fs.own_change(
        &n,
        fd.as_fd(),
        || apply_setattr(fs, &n, &fd, fh, set, caller),
        |before, _| if resized { set.size } else { before },
    )?;
    let st = fs.host().stat(fd.as_fd())?;
    Ok(Reply::Attr(fs.attr_of(&st, node)))
}

fn apply_setattr(
    fs: &ExportFs,
    n: &Node,
    fd: &OwnedFd,
    fh: Option<HandleId>,
    set: SetAttr,
    caller: Caller,
) -> SysResult<()> {
    let file = fh.and_then(|fh| fs.handles.file(n.id, fh).ok());
    let file_fd = file.as_ref().map(|h| match &**h {
        Handle::File(f) => f.as_fd(),
        Handle::Dir(_) => unreachable!(),
    });
    if set.valid & setattr_valid::MODE != 0 {
        if n.is_symlink() {
            return Err(tether_proto::WireErrno::EOPNOTSUPP);
        }
        fs.host().chmod_node(fd.as_fd(), set.mode & 0o7777)?;
    }
    if set.valid & (setattr_valid::UID | setattr_valid::GID) != 0 {
        let uid = (set.valid & setattr_valid::UID != 0).then_some(set.uid);
        let gid = (set.valid & setattr_valid::GID != 0).then_some(set.gid);
        let (uid, gid) = fs.ids.chown(uid, gid)?;
        if uid.is_some() || gid.is_some() {
            fs.host().chown(fd.as_fd(), uid, gid)?;
        }
    }
    if set.valid & setattr_valid::SIZE != 0 {
        if n.is_dir() {
            return Err(tether_proto::WireErrno::EISDIR);
        }
        match file_fd {
            Some(f) => fs.host().truncate(f, set.size)?,
            None => fs.host().truncate_node(fd.as_fd(), set.size)?,
        }
    }
    if set.atime != SetTime::Omit || set.mtime != SetTime::Omit {
        fs.host()
            .utimens(fd.as_fd(), &[settime(set.atime), settime(set.mtime)])?;
    }
    if set.valid & setattr_valid::KILL_SUIDGID != 0 {
        kill_suidgid(fs, fd, caller)?;
    }
    Ok(())
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

/// What Linux does to a regular file written or truncated by a process without
/// CAP_FSETID, or given away by chown: set-user-ID goes, and set-group-ID if the file is
/// group-executable or the caller is neither in its group nor root (the caller's gid
/// stands for its groups here, and uid 0 for the capability).
pub fn kill_suidgid(fs: &ExportFs, fd: &OwnedFd, caller: Caller) -> SysResult<()> {
    let st = fs.host().stat(fd.as_fd())?;
    if crate::backend::file_type(&st) != crate::backend::S_IFREG {
        return Ok(());
    }
    let st_mode = st.st_mode as u32;
    let mut mode = st_mode & 0o7777;
    mode &= !(libc::S_ISUID as u32);
    let group_exec = st_mode & libc::S_IXGRP as u32 != 0;
    let (_, file_gid) = fs.ids.guest_owner(st.st_uid, st.st_gid);
    if group_exec || (caller.uid != 0 && caller.gid != file_gid) {
        mode &= !(libc::S_ISGID as u32);
    }
    if mode != st_mode & 0o7777 {
        fs.host().chmod_node(fd.as_fd(), mode)?;
    }
    Ok(())
}

pub fn access(fs: &ExportFs, node: NodeId, mask: u32) -> SysResult<Reply> {
    let (_, fd) = fs.node_fd(node)?;
    fs.host().access(fd.as_fd(), mask as i32)?;
    Ok(Reply::Empty)
}

pub fn statfs(fs: &ExportFs, node: NodeId) -> SysResult<Reply> {
    let (_, fd) = fs.node_fd(node)?;
    let s = fs.host().statfs(fd.as_fd())?;
    Ok(Reply::Statfs(tether_proto::Statfs {
        blocks: s.f_blocks as u64,
        bfree: s.f_bfree as u64,
        bavail: s.f_bavail as u64,
        files: s.f_files as u64,
        ffree: s.f_ffree as u64,
        bsize: s.f_bsize as u32,
        namelen: s.f_namemax as u32,
        frsize: s.f_frsize as u32,
    }))
}
