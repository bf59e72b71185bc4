//! Pages a write left partly filled, dropped before they make reads slow.
//!
//! Without the writeback cache the kernel copies each `write()` into its page cache and
//! sends it on, but marks a page up to date only when one write covered it whole. A file
//! written in 1 KiB pieces is therefore left as a run of cached pages that are not up to
//! date, and reading it back fetches them one READ of 4 KiB at a time: readahead only fills
//! pages that are missing (about 20x native for `dd_read_1k`, bench/journal/2026-11-24-fewer-round-trips.md). The data
//! is on the server already (writes are write-through), so such pages are worth nothing:
//! when the kernel reads one, the other partly written pages of that file are invalidated,
//! and readahead fetches them in large requests. A writer that has moved on more than
//! [`DROP_BEHIND`] past its first partly written page has its pages behind it dropped at
//! once: in a VM guest the drop of a whole file's run at its first read lost the race with
//! the reader, which fetched page after page one READ at a time (`dd_read_1k` 8.5x the
//! guest's disk, against 0.9x for `dd_read_4k`).
//!
//! The invalidation runs on a thread of its own: it locks the pages, and a request handler
//! must never wait for a page the kernel may hold locked for that very request.

use std::sync::atomic::Ordering;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, OnceLock};

use dashmap::DashMap;
use fuser::Notifier;
use tether_proto::NodeId;

use crate::cache::coherence::Coherence;

const PAGE: u64 = 4096;

/// How far a writer may move past its partly written pages before they are dropped.
const DROP_BEHIND: u64 = 64 * PAGE;

/// A node's partly written pages: the span from the first to the end of the last.
type Span = (u64, u64);

#[derive(Default)]
pub struct PartialPages {
    spans: DashMap<NodeId, Span>,
    /// Set by [`PartialPages::start`]; until then nothing is recorded.
    drop_tx: OnceLock<Sender<(NodeId, Span)>>,
}

impl PartialPages {
    /// Starts the thread that drops pages through `notifier`, counting each run dropped
    /// in `co`'s counters.
    pub fn start(&self, notifier: Notifier, co: Arc<Coherence>) {
        let (tx, rx) = channel();
        if self.drop_tx.set(tx).is_ok() {
            let spawned = std::thread::Builder::new()
                .name("tether-pages".into())
                .spawn(move || drop_loop(rx, notifier, co));
            if let Err(e) = spawned {
                tracing::warn!("no thread to drop partly written pages: {e}");
            }
        }
    }

    /// A write of `len` bytes at `offset` went through the page cache of `node`.
    pub fn written(&self, node: NodeId, offset: u64, len: u64) {
        if self.drop_tx.get().is_none() || len == 0 {
            return;
        }
        let end = offset + len;
        let first = (!offset.is_multiple_of(PAGE)).then_some(offset);
        let last = (!end.is_multiple_of(PAGE)).then_some(end - 1);
        let (Some(lo), Some(hi)) = (first.or(last), last.or(first)) else {
            return; // whole pages only: the kernel marked them up to date
        };
        let span = (lo - lo % PAGE, hi - hi % PAGE + PAGE);
        // The pages of this write are the kernel's (locked) until it is answered: only
        // those before its first may be dropped now.
        let here = offset - offset % PAGE;
        let mut behind = None;
        self.spans
            .entry(node)
            .and_modify(|s| {
                *s = (s.0.min(span.0), s.1.max(span.1));
                if here >= s.0 + DROP_BEHIND {
                    behind = Some((s.0, here));
                    s.0 = here;
                }
            })
            .or_insert(span);
        if let (Some(part), Some(tx)) = (behind, self.drop_tx.get()) {
            let _ = tx.send((node, part));
        }
    }

    /// The kernel reads `len` bytes at `offset` of `node`: if that is one of its partly
    /// written pages, the others are dropped (the one being read is filled by this read).
    pub fn reading(&self, node: NodeId, offset: u64, len: u64) {
        let Some((_, (lo, hi))) = self.spans.remove(&node) else {
            return;
        };
        let Some(tx) = self.drop_tx.get() else { return };
        let end = offset.saturating_add(len);
        for part in [(lo, offset.min(hi)), (end.max(lo), hi)] {
            if part.0 < part.1 {
                let _ = tx.send((node, part));
            }
        }
    }

    /// The kernel forgot `node`: its pages are gone.
    pub fn forget(&self, node: NodeId) {
        self.spans.remove(&node);
    }
}

fn drop_loop(rx: Receiver<(NodeId, Span)>, notifier: Notifier, co: Arc<Coherence>) {
    for (node, (lo, hi)) in rx {
        // An error means the kernel holds nothing of the node any more: fine.
        let _ = co.inval_inode(&notifier, node, lo as i64, (hi - lo) as i64);
        co.counters
            .partial_pages_dropped
            .fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recording() -> (PartialPages, Receiver<(NodeId, Span)>) {
        let p = PartialPages::default();
        let (tx, rx) = channel();
        let _ = p.drop_tx.set(tx);
        (p, rx)
    }

    #[test]
    fn whole_pages_leave_nothing_to_drop() {
        let (p, rx) = recording();
        p.written(NodeId::new(7), 0, 4096);
        p.written(NodeId::new(7), 8192, 16384);
        p.reading(NodeId::new(7), 0, 4096);
        assert!(p.spans.is_empty());
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn a_read_of_one_partly_written_page_drops_the_others() {
        let (p, rx) = recording();
        for i in 0..12 {
            p.written(NodeId::new(7), i * 1024, 1024);
        }
        assert_eq!(p.spans.get(&NodeId::new(7)).map(|s| *s), Some((0, 12288)));
        p.reading(NodeId::new(7), 4096, 4096);
        assert_eq!(rx.try_recv(), Ok((NodeId::new(7), (0, 4096))));
        assert_eq!(rx.try_recv(), Ok((NodeId::new(7), (8192, 12288))));
        assert!(rx.try_recv().is_err());
        // Once: the pages read back since are up to date.
        p.reading(NodeId::new(7), 8192, 4096);
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn pages_a_writer_left_far_behind_are_dropped_without_waiting_for_a_read() {
        let (p, rx) = recording();
        let node = NodeId::new(5);
        let mut offset = 0;
        while offset < DROP_BEHIND {
            p.written(node, offset, 1024);
            offset += 1024;
        }
        assert!(rx.try_recv().is_err(), "the writer is still near them");
        p.written(node, offset, 1024);
        assert_eq!(rx.try_recv(), Ok((node, (0, DROP_BEHIND))));
        assert_eq!(
            p.spans.get(&node).map(|s| *s),
            Some((DROP_BEHIND, DROP_BEHIND + PAGE))
        );
        // A write back near the start makes the run whole again, without a drop: the
        // pages of the write itself are not the client's to drop yet.
        p.written(node, 1024, 1024);
        assert!(rx.try_recv().is_err());
        assert_eq!(
            p.spans.get(&node).map(|s| *s),
            Some((0, DROP_BEHIND + PAGE))
        );
    }

    #[test]
    fn a_small_file_read_whole_drops_nothing() {
        let (p, rx) = recording();
        p.written(NodeId::new(9), 0, 100);
        assert_eq!(p.spans.get(&NodeId::new(9)).map(|s| *s), Some((0, 4096)));
        p.reading(NodeId::new(9), 0, 4096);
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn an_unaligned_write_marks_only_its_end_pages() {
        let (p, _rx) = recording();
        p.written(NodeId::new(3), 1000, 10000);
        assert_eq!(p.spans.get(&NodeId::new(3)).map(|s| *s), Some((0, 12288)));
        let (p, _rx) = recording();
        p.written(NodeId::new(3), 4096, 5000);
        assert_eq!(
            p.spans.get(&NodeId::new(3)).map(|s| *s),
            Some((8192, 12288))
        );
    }
}
