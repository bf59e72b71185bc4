//! File I/O and file handles: OPEN, READ, WRITE, FLUSH, FSYNC, RELEASE, FALLOCATE, LSEEK,
//! COPY_FILE_RANGE, REOPEN. I/O goes through an open handle, or, addressed by node (the
//! client's no-open mode, handle 0), through the node reopened for the request; writes by
//! node go through a descriptor kept for a moment (export/writers.rs). A change of a
//! file's content is this session's own (`ExportFs::own_change`), so its echo is not pushed.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex};

use tether_proto::{Caller, HandleId, NodeId, Reply, WireErrno};

use super::attr::kill_suidgid;
use crate::backend::SysResult;
use crate::export::fs::ExportFs;
use crate::export::handles::Handle;

/// Host open flags for a guest open: creation and no-follow flags are the server's business.
pub fn open_host_flags(flags: u32) -> i32 {
    let keep = libc::O_ACCMODE
        | libc::O_APPEND
        | libc::O_NONBLOCK
        | libc::O_DSYNC
        | libc::O_SYNC
        | crate::backend::wire::host_oflag::NOATIME
        | libc::O_TRUNC
        | crate::backend::wire::host_oflag::DIRECT
        | crate::backend::wire::host_oflag::LARGEFILE;
    flags as i32 & keep
}

pub fn open(fs: &ExportFs, node: NodeId, flags: u32) -> SysResult<Reply> {
    let (n, fd) = fs.openable_node(node)?;
    if n.is_dir() && flags & (libc::O_ACCMODE as u32) != libc::O_RDONLY as u32 {
        return Err(WireErrno::EISDIR);
    }
    let reopen = || fs.reopen(&fd, open_host_flags(flags));
    let f = if flags & libc::O_TRUNC as u32 != 0 {
        fs.own_change(&n, fd.as_fd(), reopen, |_, _| 0)?.0
    } else {
        reopen()?
    };
    let fh = fs.handles.add(node, Handle::File(f))?;
    Ok(Reply::Open { fh, flags: 0 })
}

/// REOPEN: a reconnecting client's open handle `fh` (a directory's if `dir`) made again
/// under its number.
pub fn reopen(
    fs: &ExportFs,
    node: NodeId,
    fh: Option<HandleId>,
    flags: u32,
    dir: bool,
) -> SysResult<Reply> {
    let h = if dir {
        Handle::Dir(Mutex::new(fs.dir_stream(node)?))
    } else {
        let (n, fd) = fs.openable_node(node)?;
        if n.is_dir() {
            return Err(WireErrno::EISDIR);
        }
        // The file was created and truncated when it was first opened.
        let flags = open_host_flags(flags) & !libc::O_TRUNC;
        Handle::File(fs.reopen(&fd, flags)?)
    };
    fs.handles.add_at(node, fh, h)?;
    Ok(Reply::Empty)
}

/// READ: reads file data straight into `buf` (the outgoing frame) and returns the length.
pub fn read_into(
    fs: &ExportFs,
    node: NodeId,
    fh: Option<HandleId>,
    offset: u64,
    buf: &mut [u8],
) -> SysResult<usize> {
    let h = fs.file_for(node, fh, libc::O_RDONLY)?;
    let Handle::File(f) = &*h else { unreachable!() };
    if offset == 0 {
        started_reading(fs, node);
    }
    fs.host().pread(f.as_fd(), buf, offset)
}

/// The guest reads `node` from its start (its page cache had none of it): perhaps the
/// next file of a cold walk through its directory (export/readahead.rs).
fn started_reading(fs: &ExportFs, node: NodeId) {
    let Some(dir) = fs.nodes.get(node).ok().and_then(|n| n.parent()) else {
        return;
    };
    if fs.readahead.started_reading(dir, node) {
        if let Ok(stream) = fs.dir_stream(dir) {
            fs.readahead.queue(stream);
        }
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

/// The descriptor a WRITE goes through: handle `fh`, or for writes by node (no `fh`) the
/// node's kept writable descriptor, opened and kept if there is none (export/writers.rs).
fn write_fd(fs: &ExportFs, node: NodeId, fh: Option<HandleId>) -> SysResult<WriteFd> {
    if let Some(fh) = fh {
        return fs.handles.file(node, fh).map(WriteFd::Handle);
    }
    if let Some(fd) = fs.writers.get(node) {
        return Ok(WriteFd::Kept(fd));
    }
    let f = fs.reopen_file(node, libc::O_WRONLY)?;
    Ok(WriteFd::Kept(fs.writers.keep(node, f)))
}

pub fn write(
    fs: &ExportFs,
    caller: Caller,
    node: NodeId,
    fh: Option<HandleId>,
    offset: u64,
    data: &[u8],
) -> SysResult<Reply> {
    let n = fs.nodes.get(node)?;
    let w = write_fd(fs, node, fh)?;
    let f = w.file();
    let (written, after) = fs.own_change(
        &n,
        f.as_fd(),
        || {
            let written = fs.host().pwrite(f.as_fd(), data, offset)?;
            // A guest writer without CAP_FSETID (uid 0 stands for it, as for
            // truncation) clears set-user-ID as a local write would; the server's own
            // write, with its CAP_FSETID, would not (the guest kernel leaves this to the
            // server: FUSE_HANDLE_KILLPRIV_V2). The data is written either way.
            if caller.uid != 0 {
                if let Err(e) = kill_suidgid(fs, f, caller) {
                    tracing::debug!(%node, "clearing set-user-ID after a write: {e:?}");
                }
            }
            Ok(written)
        },
        |before, &written| before.max(offset + written as u64),
    )?;
    // After the write (as the echo check read it): the kernel drops the file's
    // size and times and asks for them again at the next stat.
    let attr = after
        .filter(|_| fs.write_attr)
        .map(|st| Box::new(fs.attr_of(&st, node)));
    Ok(Reply::Written {
        size: written as u64,
        attr,
    })
}

/// FLUSH: nothing to do; the data went to the host as it was written.
pub fn flush() -> SysResult<Reply> {
    Ok(Reply::Empty)
}

/// FSYNC (and FSYNCDIR) through handle `fh`, or the node reopened for it.
pub fn fsync(
    fs: &ExportFs,
    node: NodeId,
    fh: Option<HandleId>,
    datasync: bool,
) -> SysResult<Reply> {
    let h = if let Some(fh) = fh {
        fs.handles.get(node, fh)?
    } else {
        let (_, fd) = fs.openable_node(node)?;
        Arc::new(Handle::File(fs.reopen(&fd, libc::O_RDONLY)?))
    };
    match &*h {
        Handle::File(f) => fs.host().fsync(f.as_fd(), datasync)?,
        Handle::Dir(d) => fs.host().fsync(d.lock().unwrap().as_fd(), datasync)?,
    }
    Ok(Reply::Empty)
}

/// RELEASE (and RELEASEDIR) of handle `fh`.
pub fn release(fs: &ExportFs, node: NodeId, fh: Option<HandleId>) -> SysResult<Reply> {
    fs.handles.release(node, fh);
    Ok(Reply::Empty)
}

/// FALLOCATE of `length` bytes at `offset` with fallocate(2)'s `mode`.
pub fn fallocate(
    fs: &ExportFs,
    node: NodeId,
    fh: Option<HandleId>,
    (offset, length): (u64, u64),
    mode: u32,
) -> SysResult<Reply> {
    let h = fs.file_for(node, fh, libc::O_WRONLY)?;
    let Handle::File(f) = &*h else { unreachable!() };
    let n = fs.nodes.get(node)?;
    let keeps_size = mode as i32 & crate::backend::wire::FALLOC_FL_KEEP_SIZE != 0;
    fs.own_change(
        &n,
        f.as_fd(),
        || fs.host().fallocate(f.as_fd(), mode as i32, offset, length),
        |before, _| match keeps_size {
            true => before,
            false => before.max(offset + length),
        },
    )?;
    Ok(Reply::Empty)
}

pub fn lseek(
    fs: &ExportFs,
    node: NodeId,
    fh: Option<HandleId>,
    offset: i64,
    whence: u32,
) -> SysResult<Reply> {
    let h = fs.file_for(node, fh, libc::O_RDONLY)?;
    let Handle::File(f) = &*h else { unreachable!() };
    let off = fs.host().lseek(f.as_fd(), offset, whence as i32)?;
    Ok(Reply::Lseek { offset: off })
}

/// COPY_FILE_RANGE of `len` bytes from (node, handle, offset) `from` to `to`.
pub fn copy_file_range(
    fs: &ExportFs,
    (node_in, fh_in, offset_in): (NodeId, Option<HandleId>, u64),
    (node_out, fh_out, offset_out): (NodeId, Option<HandleId>, u64),
    len: u64,
    flags: u32,
) -> SysResult<Reply> {
    if flags != 0 {
        return Err(WireErrno::EINVAL);
    }
    let hi = fs.file_for(node_in, fh_in, libc::O_RDONLY)?;
    let ho = fs.file_for(node_out, fh_out, libc::O_WRONLY)?;
    let (Handle::File(fi), Handle::File(fo)) = (&*hi, &*ho) else {
        unreachable!()
    };
    let out = fs.nodes.get(node_out)?;
    let (n, _) = fs.own_change(
        &out,
        fo.as_fd(),
        || {
            let (from, to) = ((fi.as_fd(), offset_in), (fo.as_fd(), offset_out));
            fs.host().copy_file_range(from, to, len)
        },
        |before, &n| before.max(offset_out + n),
    )?;
    Ok(Reply::Written {
        size: n,
        attr: None,
    })
}
