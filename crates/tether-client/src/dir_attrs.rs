//! Directory attributes the client knows without asking.
//!
//! After every creation the kernel drops the directory's attributes (`fuse_dir_changed`)
//! and, since it checks permissions itself, asks for them again (GETATTR) before its next
//! lookup there: creating N files in a directory costs N GETATTR round trips on top of the
//! creations. With feature DIR_ATTR the server sends the directory's attributes after each
//! creation with the CREATE reply, and the client answers that GETATTR itself.
//!
//! They are good only while nothing else changed the directory. Each request that changes a
//! directory that had creations (a name in it, or its own attributes) counts once when sent
//! and once when answered ([`DirAttrs::touch`]). Attributes from a CREATE reply are kept
//! only if nothing but that creation touched the directory between its sending and its
//! reply, and used only while nothing has touched it since and no push invalidated it.

use std::sync::Arc;

use dashmap::DashMap;
use tether_proto::{Attr, NodeId, Request};

use crate::coherence::Coherence;

/// A request's count against the directories it changes, to repeat when it is answered.
pub struct Touch(Arc<DirAttrs>, [NodeId; 2]);

impl Touch {
    pub fn answered(&self) {
        self.0.touch(self.1[0]);
        if self.1[1] != self.1[0] {
            self.0.touch(self.1[1]);
        }
    }
}

#[derive(Default)]
pub struct DirAttrs {
    /// Touch counts of the directories that had creations through this mount.
    touches: DashMap<NodeId, u64>,
    /// Attributes from a CREATE reply: the touch count then, and the push sequence when
    /// the CREATE was sent.
    known: DashMap<NodeId, (Attr, u64, u64)>,
}

impl DirAttrs {
    /// `req` is about to be sent: counts it against the directories it changes, and
    /// returns what counts it again when it is answered ([`Touch::answered`]). CREATE
    /// counts through [`DirAttrs::creating`] and [`DirAttrs::created`] instead.
    pub fn touching(self: &Arc<Self>, req: &Request) -> Option<Touch> {
        use Request::*;
        let dirs = match *req {
            Mknod { parent, .. }
            | Mkdir { parent, .. }
            | Symlink { parent, .. }
            | Unlink { parent, .. }
            | Rmdir { parent, .. } => [parent, parent],
            Link { new_parent, .. } => [new_parent, new_parent],
            Rename {
                parent, new_parent, ..
            } => [parent, new_parent],
            Setattr { node, .. } | Setxattr { node, .. } | Removexattr { node, .. } => [node, node],
            _ => return None,
        };
        let t = Touch(self.clone(), dirs);
        t.answered();
        Some(t)
    }

    fn touch(&self, dir: NodeId) -> Option<u64> {
        let mut t = self.touches.get_mut(&dir)?;
        *t += 1;
        Some(*t)
    }

    /// A CREATE in `dir` is about to be sent: its touch count, for [`DirAttrs::created`].
    pub fn creating(&self, dir: NodeId) -> u64 {
        let mut t = self.touches.entry(dir).or_insert(0);
        *t += 1;
        *t
    }

    /// The CREATE counted `sent_touch`, sent at push sequence `sent`, was answered.
    pub fn created(&self, dir: NodeId, sent_touch: u64, attr: Option<Box<Attr>>, sent: u64) {
        let now = self.touch(dir);
        match attr {
            Some(a) if now == Some(sent_touch + 1) => {
                self.known.insert(dir, (*a, sent_touch + 1, sent));
            }
            _ => {
                self.known.remove(&dir);
            }
        }
    }

    /// `dir`'s attributes and the push sequence they date from, if they are known.
    pub fn get(&self, dir: NodeId, co: &Coherence) -> Option<(Attr, u64)> {
        let k = self.known.get(&dir)?;
        let touches = self.touches.get(&dir).map(|t| *t);
        if touches == Some(k.1) && co.cacheable(dir, k.2) {
            return Some((k.0, k.2));
        }
        drop(k);
        self.known.remove(&dir);
        None
    }

    /// The kernel forgot `node`.
    pub fn forget(&self, node: NodeId) {
        self.touches.remove(&node);
        self.known.remove(&node);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn attr(size: u64) -> Option<Box<Attr>> {
        Some(Box::new(Attr {
            size,
            ..Attr::default()
        }))
    }

    fn unlink(parent: NodeId) -> Request {
        Request::Unlink {
            parent,
            name: Bytes::from_static(b"x"),
        }
    }

    #[test]
    fn attributes_from_a_creation_are_kept_until_the_directory_is_touched() {
        let (d, co) = (Arc::new(DirAttrs::default()), Coherence::new());
        co.enable(); // the root (1) is watched
        let t = d.creating(1);
        d.created(1, t, attr(5), co.now());
        assert_eq!(d.get(1, &co).map(|(a, _)| a.size), Some(5));
        d.touching(&unlink(1));
        assert!(d.get(1, &co).is_none());
    }

    #[test]
    fn a_change_between_a_creation_and_its_reply_leaves_nothing_known() {
        let (d, co) = (Arc::new(DirAttrs::default()), Coherence::new());
        co.enable();
        // An unlink sent before the creation and answered while it was on its way.
        let unlinking = d.touching(&unlink(1)).unwrap();
        let t = d.creating(1);
        unlinking.answered();
        d.created(1, t, attr(5), co.now());
        assert!(d.get(1, &co).is_none());
        // Two creations in flight at once: neither reply is trusted.
        let (t1, t2) = (d.creating(1), d.creating(1));
        d.created(1, t1, attr(6), co.now());
        d.created(1, t2, attr(7), co.now());
        assert!(d.get(1, &co).is_none());
    }
}
