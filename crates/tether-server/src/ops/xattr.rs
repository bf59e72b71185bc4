//! Extended attributes: SETXATTR, GETXATTR, LISTXATTR, REMOVEXATTR, of the object a node
//! descriptor holds. A symlink lists none, and setting or removing one on it gives EPERM.
//! A size of 0 asks for the size a value or list needs.

use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, BorrowedFd};

use bytes::Bytes;
use tether_proto::{NodeId, Reply, WireErrno};

use crate::backend::SysResult;
use crate::export::fs::ExportFs;

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

pub fn setxattr(
    fs: &ExportFs,
    node: NodeId,
    name: &[u8],
    value: &[u8],
    flags: u32,
) -> SysResult<Reply> {
    change_xattr(fs, node, name, |fd, name| {
        fs.host().setxattr(fd, name, value, flags as i32)
    })
}

pub fn getxattr(fs: &ExportFs, node: NodeId, name: &[u8], size: u32) -> SysResult<Reply> {
    let name = xattr_name(name)?;
    let (n, fd) = fs.node_fd(node)?;
    if n.is_symlink() {
        return Err(WireErrno::ENODATA);
    }
    xattr_reply(size, |buf| fs.host().getxattr(fd.as_fd(), &name, buf))
}

pub fn listxattr(fs: &ExportFs, node: NodeId, size: u32) -> SysResult<Reply> {
    let (n, fd) = fs.node_fd(node)?;
    if n.is_symlink() {
        return xattr_reply(size, |_| Ok(0));
    }
    xattr_reply(size, |buf| fs.host().listxattr(fd.as_fd(), buf))
}

pub fn removexattr(fs: &ExportFs, node: NodeId, name: &[u8]) -> SysResult<Reply> {
    change_xattr(fs, node, name, |fd, name| fs.host().removexattr(fd, name))
}

/// SETXATTR and REMOVEXATTR: `change` of attribute `name` of `node` (through its
/// descriptor), this session's own change.
fn change_xattr(
    fs: &ExportFs,
    node: NodeId,
    name: &[u8],
    change: impl FnOnce(BorrowedFd<'_>, &CStr) -> SysResult<()>,
) -> SysResult<Reply> {
    let name = xattr_name(name)?;
    let (n, fd) = fs.node_fd(node)?;
    if n.is_symlink() {
        return Err(WireErrno::EPERM);
    }
    let own = || change(fd.as_fd(), &name);
    fs.own_change(&n, fd.as_fd(), own, |before, _| before)?;
    Ok(Reply::Empty)
}
