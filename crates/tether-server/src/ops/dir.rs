//! Directory listings: OPENDIR, READDIR (and READDIRPLUS, whose entries are lookups),
//! RELEASEDIR, FSYNCDIR. A listing's offsets are the file system's own cookies, so a
//! listing addressed by node (no-opendir mode) reads from a stream opened for the request.

use std::ffi::CString;
use std::os::fd::AsFd;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tether_proto::{DirEntry, HandleId, NodeId, Reply, WireErrno, ROOT_NODE};

use super::io;
use super::lookup::lookup_in;
use crate::backend::SysResult;
use crate::export::fs::ExportFs;
use crate::export::handles::Handle;

pub fn opendir(fs: &ExportFs, node: NodeId) -> SysResult<Reply> {
    let fh = (fs.handles).add(node, Handle::Dir(Mutex::new(fs.dir_stream(node)?)))?;
    Ok(Reply::Open { fh, flags: 0 })
}

/// READDIR of directory `node` from `offset`, at most `size` bytes of the kernel's
/// records; with `plus`, each entry looked up (READDIRPLUS).
pub fn readdir(
    fs: &ExportFs,
    node: NodeId,
    fh: Option<HandleId>,
    offset: u64,
    size: u32,
    plus: bool,
) -> SysResult<Reply> {
    let h = if let Some(fh) = fh {
        fs.handles.get(node, fh)?
    } else {
        // Listing addressed by node (no-opendir mode): a stream just for this request;
        // offsets are the file system's cookies, valid across streams.
        Arc::new(Handle::Dir(Mutex::new(fs.dir_stream(node)?)))
    };
    let Handle::Dir(dir) = &*h else {
        return Err(WireErrno::ENOTDIR);
    };
    let dir = dir.lock().unwrap();
    let mut budget = size as usize;
    let mut entries = Vec::new();
    let mut failure = None;
    let ended = fs.host().read_dir(dir.as_fd(), offset, &mut |raw| {
        let need = tether_proto::fuse_dirent_size(raw.name.len(), plus);
        if need > budget {
            return false;
        }
        let dots = raw.name == b"." || raw.name == b"..";
        // The root's ".." is outside the export: it shows as the root itself.
        let ino = if raw.name == b"." || (node == ROOT_NODE && raw.name == b"..") {
            node
        } else {
            fs.nodes.id_for(fs.nodes.root_dev(), raw.ino)
        };
        let entry = if plus && !dots {
            let name = match CString::new(raw.name.clone()) {
                Ok(n) => n,
                Err(_) => return true,
            };
            match lookup_in(fs, node, dir.as_fd(), name) {
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
            ino: entry.as_ref().map_or(ino, |e| e.node),
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
        end: ended && fs.dir_end,
    })
}

/// RELEASEDIR: as a file's RELEASE, the handle says which.
pub fn releasedir(fs: &ExportFs, node: NodeId, fh: Option<HandleId>) -> SysResult<Reply> {
    io::release(fs, node, fh)
}

/// FSYNCDIR: as a file's FSYNC, the handle says which.
pub fn fsyncdir(
    fs: &ExportFs,
    node: NodeId,
    fh: Option<HandleId>,
    datasync: bool,
) -> SysResult<Reply> {
    io::fsync(fs, node, fh, datasync)
}
