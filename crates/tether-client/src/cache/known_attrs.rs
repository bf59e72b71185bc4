//! Attributes the client knows without asking.
//!
//! Directories: after every creation the kernel drops the directory's attributes
//! (`fuse_dir_changed`) and, since it checks permissions itself, asks for them again
//! (GETATTR) before its next lookup there: creating N files in a directory costs N GETATTR
//! round trips on top of the creations. With feature DIR_ATTR the server sends the
//! directory's attributes after each creation with the CREATE reply, and the client answers
//! that GETATTR itself.
//!
//! Files: with the writeback cache the kernel drops a file's block count at every close
//! (`fuse_flush`: it does not keep `i_blocks` itself), so the next `stat` of it, in the
//! next `grep` or `cp` of a tree, is a GETATTR round trip (warm grep 14x native). The
//! client answers it from the last GETATTR reply about the node.
//!
//! Written files: after every WRITE it sends the kernel drops the file's size and times
//! (`fuse_write_update_attr`), so the `stat` of a file just written (make's of the target
//! its recipe wrote) is a GETATTR round trip too. With feature WRITE_ATTR the WRITE reply
//! carries the file's attributes after the write, and the client answers that GETATTR.
//!
//! Found files: after every READ the kernel forgets a file's atime
//! (`fuse_invalidate_atime`, `noatime` or not), so the first `stat` after a file was read
//! from the server is a GETATTR round trip too (a build's `stat` of every source its
//! compiler read, the second `grep` of a tree read cold). The attributes of the LOOKUP or
//! READDIRPLUS entry that gave the kernel the node answer it, when nothing changed anything
//! while that request was on its way ([`KnownAttrs::learn_entry`]). The atime they carry
//! may be older than the host's: Tether does not keep atime coherent (coherence.md).
//!
//! Either is good only while nothing else changed the node. Each request that changes a
//! node known here (a name in a directory, its attributes, a file's data) counts once when
//! sent and once when answered ([`KnownAttrs::touch`]); a removal or rename of any name
//! (which may change a file's link count, and names no node) counts against all of them.
//! Attributes from a reply are kept only if nothing but the request itself touched the node
//! between its sending and its reply, and used only while nothing has touched it since and
//! no push invalidated it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use dashmap::DashMap;
use tether_proto::{Attr, NodeId, Request};

use crate::cache::coherence::Coherence;

/// A request's count against the nodes it changes, to repeat when it is answered; and
/// whether it makes or removes names in them (directories).
pub struct Touch(Arc<KnownAttrs>, [NodeId; 2], bool);

impl Touch {
    /// The directories the request makes or removes names in (with LINK, also the file
    /// linked), or None for a request that changes no names.
    pub fn name_changes(&self) -> Option<[NodeId; 2]> {
        self.2.then_some(self.1)
    }

    pub fn answered(&self) {
        self.0.touch(self.1[0]);
        if self.1[1] != self.1[0] {
            self.0.touch(self.1[1]);
        }
    }
}

/// What is known of a node: attributes, the node's touch count and the removals count
/// they date from, and the push sequence when the request that brought them was sent.
struct Learned {
    attr: Attr,
    touches: u64,
    removals: u64,
    sent: u64,
}

#[derive(Default)]
pub struct KnownAttrs {
    /// Touch counts of the nodes with a creation or a GETATTR through this mount.
    touches: DashMap<NodeId, u64>,
    /// Counts every touch of any node, before the node's own count: a reply naming nodes
    /// nobody knew at its sending (an entry) is kept only if this did not move meanwhile.
    changes: AtomicU64,
    /// Removals and renames of names, sent or answered.
    removals: AtomicU64,
    known: DashMap<NodeId, Learned>,
}

impl KnownAttrs {
    /// `req` is about to be sent: counts it against the nodes it changes, and returns what
    /// counts it again when it is answered ([`Touch::answered`]). CREATE, GETATTR, SETATTR
    /// and WRITE count through [`KnownAttrs::asking`] and [`KnownAttrs::learn`] instead.
    pub fn touching(self: &Arc<Self>, req: &Request) -> Option<Touch> {
        use Request::*;
        let (nodes, names) = match *req {
            Mknod { parent, .. } | Mkdir { parent, .. } | Symlink { parent, .. } => {
                ([parent, parent], true)
            }
            Link {
                node, new_parent, ..
            } => ([node, new_parent], true),
            Unlink { parent, .. } | Rmdir { parent, .. } => {
                self.removals.fetch_add(1, Ordering::AcqRel);
                ([parent, parent], true)
            }
            Rename {
                parent, new_parent, ..
            } => {
                self.removals.fetch_add(1, Ordering::AcqRel);
                ([parent, new_parent], true)
            }
            Setxattr { node, .. } | Removexattr { node, .. } | Fallocate { node, .. } => {
                ([node, node], false)
            }
            CopyFileRange { node_out, .. } => ([node_out, node_out], false),
            _ => return None,
        };
        let t = Touch(self.clone(), nodes, names);
        t.answered();
        Some(t)
    }

    fn touch(&self, node: NodeId) -> Option<u64> {
        self.changes.fetch_add(1, Ordering::SeqCst);
        let mut t = self.touches.get_mut(&node)?;
        *t += 1;
        Some(*t)
    }

    /// A request whose reply tells `node`'s attributes is about to be sent (a GETATTR,
    /// SETATTR or WRITE of it, a CREATE in it): counts it against the node, and returns the
    /// node's touch count and the removals count, for [`KnownAttrs::learn`]. A request that fails
    /// is never counted again, which leaves nothing known of the node until the next one.
    pub fn asking(&self, node: NodeId) -> (u64, u64) {
        self.changes.fetch_add(1, Ordering::SeqCst);
        let removals = self.removals.load(Ordering::Acquire);
        let mut t = self.touches.entry(node).or_insert(0);
        *t += 1;
        (*t, removals)
    }

    /// The request counted `counted` ([`KnownAttrs::asking`]), sent at push sequence
    /// `sent`, was answered with `attr` for `node`: kept if nothing else touched the node
    /// meanwhile and the reply may be cached.
    pub fn learn(
        &self,
        node: NodeId,
        counted: (u64, u64),
        attr: Option<&Attr>,
        sent: u64,
        co: &Coherence,
    ) {
        let now = self.touch(node);
        let (touches, removals) = counted;
        match attr {
            Some(a) if now == Some(touches + 1) && co.cacheable(node, sent) => {
                let known = Learned {
                    attr: *a,
                    touches: touches + 1,
                    removals,
                    sent,
                };
                self.known.insert(node, known);
            }
            _ => {
                self.known.remove(&node);
            }
        }
    }

    /// A LOOKUP or READDIRPLUS is about to be sent: what [`KnownAttrs::learn_entry`] needs
    /// to tell whether anything changed while it was on its way.
    pub fn looking(&self) -> (u64, u64) {
        let removals = self.removals.load(Ordering::Acquire);
        (self.changes.load(Ordering::SeqCst), removals)
    }

    /// An entry of the reply to a LOOKUP or READDIRPLUS counted `since`
    /// ([`KnownAttrs::looking`]) and sent at push sequence `sent` gave the kernel `node`
    /// with `attr`: kept if no request changed any node while it was on its way and no push
    /// revoked the node. Whatever is known of the node already stays otherwise.
    pub fn learn_entry(
        &self,
        node: NodeId,
        since: (u64, u64),
        attr: &Attr,
        sent: u64,
        co: &Coherence,
    ) {
        // The node's count first, then the global one: a touch bumps them the other way
        // round, so a touch either shows in the global count or comes after this read and
        // makes what is kept here stale by the node's count.
        let touches = *self.touches.entry(node).or_insert(0);
        if self.changes.load(Ordering::SeqCst) != since.0 || !co.cacheable(node, sent) {
            return;
        }
        let learned = Learned {
            attr: *attr,
            touches,
            removals: since.1,
            sent,
        };
        self.known.insert(node, learned);
    }

    /// `node`'s attributes, if they are known.
    pub fn get(&self, node: NodeId, co: &Coherence) -> Option<Attr> {
        let k = self.known.get(&node)?;
        let touches = self.touches.get(&node).map(|t| *t);
        let removals = self.removals.load(Ordering::Acquire);
        // A directory's own count covers removals in it; a file's link count may change
        // with a removal anywhere.
        let is_dir = k.attr.mode & libc::S_IFMT == libc::S_IFDIR;
        if touches == Some(k.touches)
            && (is_dir || removals == k.removals)
            && co.still_cacheable(node, k.sent)
        {
            return Some(k.attr);
        }
        drop(k);
        self.known.remove(&node);
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
            ..Attr::of(NodeId::new(1))
        }))
    }

    fn unlink(parent: NodeId) -> Request {
        Request::Unlink {
            parent,
            name: Bytes::from_static(b"x"),
        }
    }

    #[test]
    fn an_entry_is_kept_only_if_nothing_changed_while_its_lookup_was_on_its_way() {
        let (d, co) = (Arc::new(KnownAttrs::default()), Coherence::new());
        co.enable();
        co.set_watched(NodeId::new(5), true);
        co.set_watched(NodeId::new(6), true);
        let (since, sent) = (d.looking(), co.now());
        d.learn_entry(NodeId::new(5), since, &attr(3).unwrap(), sent, &co);
        assert_eq!(d.get(NodeId::new(5), &co).map(|a| a.size), Some(3));
        // A write to it afterwards leaves it unknown until the write's own reply.
        let w = d.asking(NodeId::new(5));
        assert!(d.get(NodeId::new(5), &co).is_none());
        d.learn(NodeId::new(5), w, attr(9).as_deref(), co.now(), &co);
        assert_eq!(d.get(NodeId::new(5), &co).map(|a| a.size), Some(9));
        // A change of another node while the lookup was on its way: nothing learned.
        let (since, sent) = (d.looking(), co.now());
        d.touching(&unlink(NodeId::new(1)));
        d.learn_entry(NodeId::new(6), since, &attr(4).unwrap(), sent, &co);
        assert!(d.get(NodeId::new(6), &co).is_none());
        // A push revoking the node after the lookup was sent: nothing learned.
        let (since, sent) = (d.looking(), co.now());
        co.distrust(NodeId::new(6));
        d.learn_entry(NodeId::new(6), since, &attr(4).unwrap(), sent, &co);
        assert!(d.get(NodeId::new(6), &co).is_none());
        // A later removal anywhere makes a file's link count doubtful.
        let (since, sent) = (d.looking(), co.now());
        d.learn_entry(NodeId::new(6), since, &attr(4).unwrap(), sent, &co);
        assert_eq!(d.get(NodeId::new(6), &co).map(|a| a.size), Some(4));
        d.touching(&unlink(NodeId::new(1)));
        assert!(d.get(NodeId::new(6), &co).is_none());
    }

    #[test]
    fn attributes_from_a_creation_are_kept_until_the_directory_is_touched() {
        let (d, co) = (Arc::new(KnownAttrs::default()), Coherence::new());
        co.enable(); // the root (1) is watched
        let t = d.asking(NodeId::new(1));
        d.learn(NodeId::new(1), t, attr(5).as_deref(), co.now(), &co);
        assert_eq!(d.get(NodeId::new(1), &co).map(|a| a.size), Some(5));
        d.touching(&unlink(NodeId::new(1)));
        assert!(d.get(NodeId::new(1), &co).is_none());
    }

    /// A lock just granted (fuse/locks.rs) distrusts the node: the last holder may have written
    /// the file elsewhere, and its invalidation may still be on its way. Nothing known of
    /// it stays, and a reply already on its way is neither kept nor cached by the kernel.
    #[test]
    fn a_distrusted_node_has_nothing_known_and_keeps_no_reply_on_its_way() {
        let (d, co) = (Arc::new(KnownAttrs::default()), Coherence::new());
        co.enable();
        co.set_watched(NodeId::new(2), true);
        let t = d.asking(NodeId::new(2));
        d.learn(NodeId::new(2), t, attr(1).as_deref(), co.now(), &co);
        assert_eq!(d.get(NodeId::new(2), &co).map(|a| a.size), Some(1));
        co.distrust(NodeId::new(2));
        assert!(d.get(NodeId::new(2), &co).is_none());
        let (on_its_way, sent_before) = (d.asking(NodeId::new(2)), co.now());
        co.distrust(NodeId::new(2));
        assert!(!co.cacheable(NodeId::new(2), sent_before));
        d.learn(
            NodeId::new(2),
            on_its_way,
            attr(1).as_deref(),
            sent_before,
            &co,
        );
        assert!(d.get(NodeId::new(2), &co).is_none());
        // The next request's reply is kept again.
        let (t, sent) = (d.asking(NodeId::new(2)), co.now());
        d.learn(NodeId::new(2), t, attr(2).as_deref(), sent, &co);
        assert_eq!(d.get(NodeId::new(2), &co).map(|a| a.size), Some(2));
    }

    #[test]
    fn a_change_between_a_creation_and_its_reply_leaves_nothing_known() {
        let (d, co) = (Arc::new(KnownAttrs::default()), Coherence::new());
        co.enable();
        // An unlink sent before the creation and answered while it was on its way.
        let unlinking = d.touching(&unlink(NodeId::new(1))).unwrap();
        let t = d.asking(NodeId::new(1));
        unlinking.answered();
        d.learn(NodeId::new(1), t, attr(5).as_deref(), co.now(), &co);
        assert!(d.get(NodeId::new(1), &co).is_none());
        // Two creations in flight at once: neither reply is trusted.
        let (t1, t2) = (d.asking(NodeId::new(1)), d.asking(NodeId::new(1)));
        d.learn(NodeId::new(1), t1, attr(6).as_deref(), co.now(), &co);
        d.learn(NodeId::new(1), t2, attr(7).as_deref(), co.now(), &co);
        assert!(d.get(NodeId::new(1), &co).is_none());
    }

    /// A FORGET of another node that drops an invalidation doubts only replies on their
    /// way at that moment (cache/coherence.rs), not attributes learned before.
    #[test]
    fn a_forgotten_invalidation_doubts_replies_on_their_way_not_attributes_known() {
        use crate::cache::coherence::tests::push;
        use tether_proto::Invalidation;
        let (d, co) = (Arc::new(KnownAttrs::default()), Coherence::new());
        co.enable();
        for n in [2, 3, 7] {
            co.set_watched(NodeId::new(n), true);
        }
        let t = d.asking(NodeId::new(2));
        d.learn(NodeId::new(2), t, attr(5).as_deref(), co.now(), &co);
        let (t, sent_before) = (d.asking(NodeId::new(3)), co.now());
        push(&co, 1, &[Invalidation::Inode(NodeId::new(7))]);
        co.forget(NodeId::new(7));
        d.learn(NodeId::new(3), t, attr(6).as_deref(), sent_before, &co);
        assert_eq!(d.get(NodeId::new(2), &co).map(|a| a.size), Some(5));
        assert!(
            d.get(NodeId::new(3), &co).is_none(),
            "a reply sent before the forgotten push"
        );
    }

    #[test]
    fn a_files_attributes_follow_its_writes_until_any_name_is_removed() {
        let (d, co) = (Arc::new(KnownAttrs::default()), Coherence::new());
        co.enable();
        let file = |size| {
            Some(Attr {
                size,
                mode: libc::S_IFREG | 0o644,
                ..Attr::of(NodeId::new(1))
            })
        };
        let t = d.asking(NodeId::new(1));
        d.learn(NodeId::new(1), t, file(3).as_ref(), co.now(), &co);
        assert_eq!(d.get(NodeId::new(1), &co).map(|a| a.size), Some(3));
        // Data written: a WRITE reply with the attributes after it (WRITE_ATTR) replaces
        // them; one without (a server that does not send them) leaves nothing known.
        let write = Request::Write {
            node: NodeId::new(1),
            fh: None,
            offset: 0,
            data: Bytes::from_static(b"more"),
        };
        assert!(d.touching(&write).is_none(), "WRITE counts through asking");
        let t = d.asking(NodeId::new(1));
        d.learn(NodeId::new(1), t, file(7).as_ref(), co.now(), &co);
        assert_eq!(d.get(NodeId::new(1), &co).map(|a| a.size), Some(7));
        let t = d.asking(NodeId::new(1));
        d.learn(NodeId::new(1), t, None, co.now(), &co);
        assert!(d.get(NodeId::new(1), &co).is_none());
        // Two WRITEs on their way at once: neither reply tells the state after both.
        let (t1, t2) = (d.asking(NodeId::new(1)), d.asking(NodeId::new(1)));
        d.learn(NodeId::new(1), t1, file(8).as_ref(), co.now(), &co);
        d.learn(NodeId::new(1), t2, file(9).as_ref(), co.now(), &co);
        assert!(d.get(NodeId::new(1), &co).is_none());
        // A removal of any name may change its link count (a hard link elsewhere).
        let t = d.asking(NodeId::new(1));
        d.learn(NodeId::new(1), t, file(4).as_ref(), co.now(), &co);
        assert!(d.get(NodeId::new(1), &co).is_some());
        d.touching(&unlink(NodeId::new(7))).unwrap().answered();
        assert!(d.get(NodeId::new(1), &co).is_none());
    }
}
