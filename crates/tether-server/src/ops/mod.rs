//! The operations: a decoded request goes to [`dispatch`], which hands it to the typed
//! function of its area, which returns the reply or the errno the guest gets. (READ is
//! the exception: its data goes straight into the reply frame, [`io::read_into`].)
//!
//! Areas, each in its own module: names and links (entry.rs), spare files (spare.rs),
//! attributes (attr.rs), file I/O and handles (io.rs), directory listings (dir.rs),
//! extended attributes (xattr.rs), locks (lock.rs); what a lookup records is shared by
//! several (lookup.rs). The operations work on a session's state (export/) and reach the
//! host only through its backend (`ExportFs::host`).

pub mod attr;
pub mod dir;
pub mod entry;
pub mod io;
pub mod lock;
pub mod lookup;
pub mod spare;
pub mod xattr;

use tether_proto::{Caller, Reply, Request, WireErrno};

use crate::backend::{wire, SysResult};
use crate::export::fs::ExportFs;

/// Executes one request (all but READ) for `caller`: one arm per operation, each a call of
/// its area's function with the request's fields.
#[rustfmt::skip]
pub fn dispatch(fs: &ExportFs, caller: Caller, req: Request) -> SysResult<Reply> {
    check_writable(fs, &req)?;
    use Request::*;
    match req {
        Hello(_) | Auth { .. } | Read { .. } => Err(WireErrno::EINVAL),
        // The session drains the watcher before a SYNC gets here (session.rs, `Pusher`);
        // without watching there is nothing to wait for.
        Ping | Sync => Ok(Reply::Empty),
        Lookup { parent, name } => entry::lookup(fs, parent, &name),
        Reclaim { parent, name, lookups } => entry::reclaim(fs, parent, &name, lookups),
        Forget { nodes } => entry::forget(fs, nodes),
        Mknod { parent, name, mode, rdev, umask } =>
            entry::mknod(fs, caller, parent, &name, (mode, umask), rdev),
        Mkdir { parent, name, mode, umask } =>
            entry::mkdir(fs, caller, parent, &name, (mode, umask)),
        Unlink { parent, name } => entry::unlink(fs, parent, &name),
        Rmdir { parent, name } => entry::rmdir(fs, parent, &name),
        Symlink { parent, name, target } => entry::symlink(fs, caller, parent, &name, &target),
        Readlink { node } => entry::readlink(fs, node),
        Rename { parent, name, new_parent, new_name, flags } =>
            entry::rename(fs, (parent, &name), (new_parent, &new_name), flags),
        Link { node, new_parent, new_name } => entry::link(fs, node, new_parent, &new_name),
        Create { parent, name, mode, umask, flags } =>
            entry::create(fs, caller, parent, &name, (mode, umask), wire::open_flags(flags)),
        Spares { parent, count } => spare::spares(fs, caller, parent, count),
        Bind { parent, name, node, mode, umask, time } =>
            spare::bind(fs, caller, (parent, &name), node, (mode, umask), time),
        Getattr { node, fh } => attr::getattr(fs, node, fh),
        Setattr { node, fh, set } => attr::setattr(fs, caller, node, fh, set),
        Access { node, mask } => attr::access(fs, node, mask),
        Statfs { node } => attr::statfs(fs, node),
        Open { node, flags } => io::open(fs, node, wire::open_flags(flags)),
        Write { node, fh, offset, data } => io::write(fs, caller, node, fh, offset, &data),
        Flush { .. } => io::flush(),
        Fsync { node, fh, datasync } => io::fsync(fs, node, fh, datasync),
        Release { node, fh } => io::release(fs, node, fh),
        Fallocate { node, fh, offset, length, mode } =>
            io::fallocate(fs, node, fh, (offset, length), mode),
        Lseek { node, fh, offset, whence } => io::lseek(fs, node, fh, offset, whence),
        CopyFileRange { node_in, fh_in, offset_in, node_out, fh_out, offset_out, len, flags } =>
            io::copy_file_range(fs, (node_in, fh_in, offset_in),
                                (node_out, fh_out, offset_out), len, flags),
        Reopen { node, fh, flags, dir } =>
            io::reopen(fs, node, fh, wire::open_flags(flags), dir),
        Opendir { node, .. } => dir::opendir(fs, node),
        Readdir { node, fh, offset, size, plus } => dir::readdir(fs, node, fh, offset, size, plus),
        Releasedir { node, fh } => dir::releasedir(fs, node, fh),
        Fsyncdir { node, fh, datasync } => dir::fsyncdir(fs, node, fh, datasync),
        Setxattr { node, name, value, flags } => xattr::setxattr(fs, node, &name, &value, flags),
        Getxattr { node, name, size } => xattr::getxattr(fs, node, &name, size),
        Listxattr { node, size } => xattr::listxattr(fs, node, size),
        Removexattr { node, name } => xattr::removexattr(fs, node, &name),
        Setlk { node, lock, generation } => lock::setlk(fs, node, lock, generation),
        Getlk { node, lock } => lock::getlk(fs, node, lock),
        LockRelease { node, owner, generation } => lock::release(fs, node, owner, generation),
    }
}

/// EROFS for a request that would change a read-only export (an open for writing or
/// truncation included).
fn check_writable(fs: &ExportFs, req: &Request) -> SysResult<()> {
    let mutating = req.op().mutates()
        || matches!(req, Request::Open { flags, .. } | Request::Reopen { flags, dir: false, .. }
            if flags & wire::oflag::ACCMODE != 0 || flags & wire::oflag::TRUNC != 0);
    if fs.export.read_only && mutating {
        return Err(WireErrno::EROFS);
    }
    Ok(())
}
