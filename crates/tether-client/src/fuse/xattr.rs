//! Extended attributes: SETXATTR, GETXATTR, LISTXATTR, REMOVEXATTR. A change marks the
//! node's attributes as changing (cache/coherence.rs), and a file known to have no
//! `security.capability` is answered here: the kernel asks before writes (KILLPRIV_V2).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use bytes::Bytes;
use fuser::{Errno, ReplyEmpty, ReplyXattr};
use tether_proto::{NodeId, Reply, Request};

use super::answer::name;
use super::fs::{Asked, TetherFs};

impl TetherFs {
    pub(super) fn on_setxattr(
        &self,
        req: Asked<'_>,
        ino: NodeId,
        n: &OsStr,
        value: &[u8],
        flags: i32,
        reply: ReplyEmpty,
    ) {
        self.co.xattrs_changing(ino);
        let msg = Request::Setxattr {
            node: ino,
            name: name(n),
            value: Bytes::copy_from_slice(value),
            flags: flags as u32,
        };
        self.empty_call(req, msg, reply);
    }

    pub(super) fn on_getxattr(
        &self,
        req: Asked<'_>,
        ino: NodeId,
        n: &OsStr,
        size: u32,
        reply: ReplyXattr,
    ) {
        if n.as_bytes() == b"security.capability" && self.co.known_without_capability(ino) {
            reply.error(Errno::ENODATA);
            return;
        }
        self.xattr_call(
            req,
            Request::Getxattr {
                node: ino,
                name: name(n),
                size,
            },
            reply,
        );
    }

    pub(super) fn on_listxattr(&self, req: Asked<'_>, ino: NodeId, size: u32, reply: ReplyXattr) {
        self.xattr_call(req, Request::Listxattr { node: ino, size }, reply);
    }

    pub(super) fn on_removexattr(&self, req: Asked<'_>, ino: NodeId, n: &OsStr, reply: ReplyEmpty) {
        self.co.xattrs_changing(ino);
        self.empty_call(
            req,
            Request::Removexattr {
                node: ino,
                name: name(n),
            },
            reply,
        );
    }

    fn xattr_call(&self, req: Asked<'_>, msg: Request, reply: ReplyXattr) {
        self.call(req, msg, reply, |reply, r| match r {
            Reply::XattrSize(n) => {
                reply.size(n);
                Ok(())
            }
            Reply::XattrData(d) => {
                reply.data(&d);
                Ok(())
            }
            _ => Err(reply),
        });
    }
}
