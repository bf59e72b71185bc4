//! Small files this mount wrote whole, kept to answer the kernel's READs of them.
//!
//! Written through, the kernel copies each `write()` into its page cache but marks a page
//! up to date only when one write covered it whole. A small file written in pieces (a
//! compiler's dependency file, a log) keeps its pages "not up to date", and the next
//! reader's READ goes to the server: the first no-op `make` after a build read every `.d`
//! file that way (bench/journal/2026-11-27-written-files-copies.md). The client saw every byte of such a file go out, so
//! from its creation, or its truncation to nothing, it keeps what it wrote and answers
//! READs of the file itself.
//!
//! A copy holds what the pages the kernel keeps would hold, and goes by the same rule: it
//! starts from a CREATE or truncation to 0 whose reply may be cached
//! ([`Coherence::cacheable`]), and it is used only while no push, distrust or reconnect has
//! invalidated the node since ([`Coherence::still_cacheable`]). It is dropped by two writes
//! to the file in flight at once (their order on the server is unknown), a failed or short
//! write, any other change of the data through this mount (a truncation, `fallocate`,
//! `copy_file_range` into it), a file larger than [`MAX_FILE`], and the kernel forgetting
//! the node. Written behind (write/behind.rs), a write enters the copy when the kernel is
//! told "written", as it enters the kernel's pages; one the server then fails revokes the
//! file, which ends the copy. With the writeback cache there are no copies: the kernel
//! writes back by itself.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use dashmap::DashMap;
use tether_proto::NodeId;

use crate::cache::coherence::Coherence;

/// Largest file kept.
pub const MAX_FILE: u64 = 64 * 1024;
/// Most bytes kept over the whole mount; beyond it copies are dropped (they only save
/// trips).
const MAX_TOTAL: usize = 16 << 20;

struct Copy {
    /// The push sequence when the request it started from was sent.
    since: u64,
    /// Tells this copy from one started later for the same node, for a write answered
    /// after its copy was dropped.
    generation: u64,
    data: Vec<u8>,
    /// Writes to the file sent and not yet answered (at most one: a second drops the copy).
    writing: u32,
}

/// The copies, by node. A write to a node without a copy costs one lookup here: a copy
/// never starts while a write to its file is on its way, because the kernel starts none
/// then (it holds the file's lock for a truncation and a written-through write, waits for
/// mapped pages being written back before it truncates, and a CREATE's file is new).
#[derive(Default)]
pub struct WrittenFiles {
    copies: DashMap<NodeId, Copy>,
    bytes: AtomicUsize,
    generations: AtomicU64,
}

/// A write on its way to a file with a copy. Dropped without [`Writing::finished`] (a
/// write that failed), it drops the copy.
pub struct Writing {
    files: Arc<WrittenFiles>,
    node: NodeId,
    generation: u64,
    answered: bool,
}

impl Writing {
    /// The write of `data` at `offset` was answered: `whole` if all of it was written.
    pub fn finished(mut self, offset: u64, data: &[u8], whole: bool, co: &Coherence) {
        self.answered = true;
        let outcome = whole.then_some((offset, data, co));
        (self.files).written(self.node, self.generation, outcome);
    }
}

impl Drop for Writing {
    fn drop(&mut self) {
        if !self.answered {
            (self.files).written(self.node, self.generation, None);
        }
    }
}

impl WrittenFiles {
    /// `node` is empty now, per a reply to a request sent at push sequence `sent` (a CREATE
    /// or a truncation to 0): what this mount writes to it from here on is kept.
    pub fn start(&self, node: NodeId, sent: u64, co: &Coherence) {
        self.drop_copy(node);
        if !co.cacheable(node, sent) {
            return;
        }
        let generation = self.generations.fetch_add(1, Ordering::Relaxed) + 1;
        let copy = Copy {
            since: sent,
            generation,
            data: Vec::new(),
            writing: 0,
        };
        if let Some(old) = self.copies.insert(node, copy) {
            self.bytes.fetch_sub(old.data.len(), Ordering::Relaxed);
        }
    }

    /// A WRITE to `node` is about to be sent: if the file has a copy, what the write's
    /// outcome goes to ([`Writing::finished`]). None for the many writes to files without
    /// one, at the cost of one lookup.
    pub fn writing(self: &Arc<Self>, node: NodeId) -> Option<Writing> {
        let (generation, alone) = {
            let mut copy = self.copies.get_mut(&node)?;
            copy.writing += 1;
            (copy.generation, copy.writing == 1)
        };
        if !alone {
            self.remove(node, generation); // the order the two reach the host is unknown
            return None;
        }
        Some(Writing {
            files: self.clone(),
            node,
            generation,
            answered: false,
        })
    }

    /// A write to `node` was answered: `outcome` is where and what it wrote, or None when
    /// it failed or wrote only part.
    fn written(&self, node: NodeId, generation: u64, outcome: Option<(u64, &[u8], &Coherence)>) {
        let mut grown = None;
        if let Some(mut copy) = self.copies.get_mut(&node) {
            if copy.generation != generation {
                return;
            }
            copy.writing -= 1;
            let since = copy.since;
            if let Some((offset, data, _)) = outcome.filter(|&(offset, data, co)| {
                offset.saturating_add(data.len() as u64) <= MAX_FILE
                    && co.still_cacheable(node, since)
            }) {
                let (offset, end) = (offset as usize, offset as usize + data.len());
                let more = end.saturating_sub(copy.data.len());
                if more > 0 {
                    copy.data.resize(end, 0); // a hole before the write reads as zeros
                }
                copy.data[offset..end].copy_from_slice(data);
                grown = Some(more);
            }
        }
        match grown {
            None => self.remove(node, generation),
            Some(more) => {
                let total = self.bytes.fetch_add(more, Ordering::Relaxed) + more;
                if total > MAX_TOTAL {
                    self.shed(node);
                }
            }
        }
    }

    /// `size` bytes of `node` at `offset` from its copy, if it has one that still holds
    /// (short at the end of the file, as the server answers).
    pub fn read(&self, node: NodeId, offset: u64, size: u32, co: &Coherence) -> Option<Vec<u8>> {
        let copy = self.copies.get(&node)?;
        if copy.writing > 0 {
            return None;
        }
        if !co.still_cacheable(node, copy.since) {
            let generation = copy.generation;
            drop(copy);
            self.remove(node, generation);
            return None;
        }
        let len = copy.data.len() as u64;
        let start = offset.min(len) as usize;
        let end = offset.saturating_add(size as u64).min(len) as usize;
        let bytes = copy.data[start..end].to_vec();
        co.counters
            .reads_from_written_files
            .fetch_add(1, Ordering::Relaxed);
        Some(bytes)
    }

    /// The data of `node` changes other than by a write, or the kernel forgot it.
    pub fn drop_copy(&self, node: NodeId) {
        if let Some((_, old)) = self.copies.remove(&node) {
            self.bytes.fetch_sub(old.data.len(), Ordering::Relaxed);
        }
    }

    /// Drops `node`'s copy if it is still the one of `generation`.
    fn remove(&self, node: NodeId, generation: u64) {
        if let Some((_, old)) = self
            .copies
            .remove_if(&node, |_, c| c.generation == generation)
        {
            self.bytes.fetch_sub(old.data.len(), Ordering::Relaxed);
        }
    }

    /// Drops other copies than `keep`'s until the total is within [`MAX_TOTAL`].
    fn shed(&self, keep: NodeId) {
        let others: Vec<NodeId> = self.copies.iter().map(|c| *c.key()).collect();
        for node in others.into_iter().filter(|&n| n != keep) {
            if self.bytes.load(Ordering::Relaxed) <= MAX_TOTAL {
                break;
            }
            self.drop_copy(node);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::coherence::tests::push;
    use tether_proto::Invalidation;

    fn watched(nodes: &[NodeId]) -> std::sync::Arc<Coherence> {
        let co = Coherence::new();
        co.enable();
        nodes.iter().for_each(|&n| co.set_watched(n, true));
        co
    }

    fn write(w: &Arc<WrittenFiles>, co: &Coherence, node: NodeId, offset: u64, data: &[u8]) {
        if let Some(writing) = w.writing(node) {
            writing.finished(offset, data, true, co);
        }
    }

    #[test]
    fn a_file_written_in_pieces_reads_back_with_its_holes_as_zeros() {
        let (w, co) = (Arc::<WrittenFiles>::default(), watched(&[NodeId::new(7)]));
        w.start(NodeId::new(7), co.now(), &co);
        write(&w, &co, NodeId::new(7), 0, b"abc");
        write(&w, &co, NodeId::new(7), 6, b"xyz");
        assert_eq!(
            w.read(NodeId::new(7), 0, 100, &co).unwrap(),
            b"abc\0\0\0xyz"
        );
        assert_eq!(w.read(NodeId::new(7), 2, 2, &co).unwrap(), b"c\0");
        assert_eq!(
            w.read(NodeId::new(7), 50, 10, &co).unwrap(),
            b"",
            "past the end: nothing"
        );
        assert!(
            w.read(NodeId::new(8), 0, 10, &co).is_none(),
            "no copy of another node"
        );
    }

    #[test]
    fn a_push_for_the_node_after_the_start_ends_the_copy() {
        let (w, co) = (Arc::<WrittenFiles>::default(), watched(&[NodeId::new(7)]));
        w.start(NodeId::new(7), co.now(), &co);
        write(&w, &co, NodeId::new(7), 0, b"abc");
        push(&co, 1, &[Invalidation::Inode(NodeId::new(7))]);
        assert!(w.read(NodeId::new(7), 0, 10, &co).is_none());
        write(&w, &co, NodeId::new(7), 3, b"def");
        assert!(
            w.read(NodeId::new(7), 0, 10, &co).is_none(),
            "a later write does not bring it back"
        );
    }

    #[test]
    fn a_push_before_the_starting_reply_came_means_no_copy() {
        let (w, co) = (Arc::<WrittenFiles>::default(), watched(&[NodeId::new(7)]));
        let sent = co.now();
        push(&co, 1, &[Invalidation::Inode(NodeId::new(7))]);
        w.start(NodeId::new(7), sent, &co);
        write(&w, &co, NodeId::new(7), 0, b"abc");
        assert!(w.read(NodeId::new(7), 0, 10, &co).is_none());
    }

    #[test]
    fn overlapping_failed_and_large_writes_drop_the_copy() {
        let (w, co) = (Arc::<WrittenFiles>::default(), watched(&[NodeId::new(7)]));
        // Two writes on their way at once.
        w.start(NodeId::new(7), co.now(), &co);
        let a = w
            .writing(NodeId::new(7))
            .expect("a write to a file with a copy");
        assert!(
            w.read(NodeId::new(7), 0, 10, &co).is_none(),
            "not read while a write is out"
        );
        assert!(
            w.writing(NodeId::new(7)).is_none(),
            "a second write at once drops the copy"
        );
        a.finished(0, b"aa", true, &co);
        assert!(w.read(NodeId::new(7), 0, 10, &co).is_none());
        assert!(
            w.writing(NodeId::new(7)).is_none(),
            "no copy, nothing to follow"
        );
        // A failed write.
        w.start(NodeId::new(7), co.now(), &co);
        w.writing(NodeId::new(7))
            .unwrap()
            .finished(0, b"aa", false, &co);
        assert!(w.read(NodeId::new(7), 0, 10, &co).is_none());
        // A write that got an error reply (never finished).
        w.start(NodeId::new(7), co.now(), &co);
        drop(w.writing(NodeId::new(7)).unwrap());
        assert!(w.read(NodeId::new(7), 0, 10, &co).is_none());
        w.start(NodeId::new(7), co.now(), &co);
        assert!(
            w.read(NodeId::new(7), 0, 10, &co).is_some(),
            "nothing left on its way"
        );
        // Past the largest file kept.
        w.start(NodeId::new(7), co.now(), &co);
        write(&w, &co, NodeId::new(7), MAX_FILE - 1, b"ab");
        assert!(w.read(NodeId::new(7), 0, 10, &co).is_none());
        // A write of an old copy does not land in a new one.
        w.start(NodeId::new(7), co.now(), &co);
        let old = w.writing(NodeId::new(7)).unwrap();
        w.start(NodeId::new(7), co.now(), &co);
        old.finished(0, b"old", true, &co);
        assert_eq!(w.read(NodeId::new(7), 0, 10, &co).unwrap(), b"");
        w.start(NodeId::new(7), co.now(), &co);
        write(&w, &co, NodeId::new(7), 0, b"new");
        assert_eq!(w.read(NodeId::new(7), 0, 10, &co).unwrap(), b"new");
        w.drop_copy(NodeId::new(7));
        assert!(w.read(NodeId::new(7), 0, 10, &co).is_none());
    }

    #[test]
    fn unwatched_nodes_get_no_copy() {
        let (w, co) = (Arc::<WrittenFiles>::default(), watched(&[]));
        w.start(NodeId::new(7), co.now(), &co);
        write(&w, &co, NodeId::new(7), 0, b"abc");
        assert!(w.read(NodeId::new(7), 0, 10, &co).is_none());
    }
}
