//! The one place where the kernel's numbers for nodes and open files become Tether's node and
//! handle ids, and back.
//!
//! The kernel knows a node by its node id: the numbers are the same (FUSE's root inode, 1, is
//! [`tether_proto::ROOT_NODE`]), so st_ino in the guest matches the host. It knows an open
//! file by the server's handle id, or by 0 when the file has no server handle (no-open mode,
//! CREATE_NO_HANDLE, a spare file's early answer): I/O on it then goes by node, and 0 is
//! `None` here, as on the wire.

use fuser::{FileHandle, INodeNo};
use tether_proto::{HandleId, NodeId};

/// The inode number of a negative entry: the kernel caches the name as missing.
pub(crate) const NEGATIVE_INO: INodeNo = INodeNo(0);

/// The node the kernel means by inode number `ino`.
pub(crate) fn node_of(ino: INodeNo) -> NodeId {
    NodeId::new(ino.0)
}

/// The node of a file on the mount whose st_ino (or /proc fdinfo `ino:`) the guest kernel
/// reports as `st_ino`.
pub(crate) fn node_of_st_ino(st_ino: u64) -> NodeId {
    NodeId::new(st_ino)
}

/// The inode number the kernel knows `node` by.
pub(crate) fn ino_of(node: NodeId) -> INodeNo {
    INodeNo(node.get())
}

/// The server handle behind the kernel's file handle `fh`, if the file has one.
pub(crate) fn handle_of(fh: FileHandle) -> Option<HandleId> {
    HandleId::new(fh.0)
}

/// The file handle the kernel is given for server handle `fh` (0 for none).
pub(crate) fn kernel_fh(fh: Option<HandleId>) -> FileHandle {
    FileHandle(HandleId::to_wire(fh))
}
