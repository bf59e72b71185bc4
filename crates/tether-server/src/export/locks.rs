//! A session's lock state: the open file descriptions that carry its guests' locks (the
//! operations are in ops/lock.rs, docs/protocol.md §16), and the export-wide record of
//! sessions refused a lock ([`LockWaits`]), each told (push LOCK_FREED) when another
//! session releases or downgrades one on the same file. Dropping descriptions here (FORGET
//! of a node, the end of the session) drops their locks and tells those sessions.

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};

use dashmap::DashMap;
use tether_proto::NodeId;

use crate::backend::{Backend, LockFd};

/// The open file descriptions that carry each (node, guest owner)'s locks.
pub struct LockTable {
    pub(crate) owners: DashMap<(NodeId, u64), Arc<OwnerFd>>,
    /// The WAL indexes this session has taken, with the description holding the DMS byte.
    /// One mutex for all: taking and giving back must not interleave, and it is rare.
    pub(crate) wal_guards: Mutex<HashMap<NodeId, LockFd>>,
    /// WAL indexes this session was refused, so that the log says so once each.
    pub(crate) wal_refused: Mutex<HashSet<NodeId>>,
    host: Arc<dyn Backend>,
    /// Sessions of the export refused a lock.
    waits: Arc<LockWaits>,
    /// Where this session hears of locks other sessions free; set by the session when it
    /// pushes.
    pub wake: Option<LockWake>,
}

/// One owner's description, and the generation of its locks (protocol.md §16): a SETLK
/// of a later generation replaces it, a LOCK_RELEASE of an earlier one leaves it alone.
pub(crate) struct OwnerFd {
    pub(crate) fd: LockFd,
    pub(crate) generation: u64,
}

impl LockTable {
    pub fn new(host: Arc<dyn Backend>, waits: Arc<LockWaits>) -> LockTable {
        LockTable {
            owners: DashMap::new(),
            wal_guards: Mutex::default(),
            wal_refused: Mutex::default(),
            host,
            waits,
            wake: None,
        }
    }

    /// This session was refused a lock on `node` (open as `fd`): it hears when another
    /// session frees one there.
    pub(crate) fn refused(&self, node: NodeId, fd: BorrowedFd<'_>) {
        if let (Some(wake), Some(key)) = (&self.wake, file_key(&*self.host, fd)) {
            self.waits.refused(key, node, wake);
        }
    }

    /// The files open as `fds`, as [`LockWaits`] names them. None while no session waits
    /// for a lock anywhere: then a release costs no `fstat`.
    pub(crate) fn waited_files<'a>(
        &self,
        fds: impl IntoIterator<Item = BorrowedFd<'a>>,
    ) -> HashSet<FileKey> {
        if self.waits.is_empty() {
            return HashSet::new();
        }
        (fds.into_iter())
            .filter_map(|fd| file_key(&*self.host, fd))
            .collect()
    }

    /// This session released or downgraded locks on `files`: other sessions refused a lock
    /// on one of them hear of it.
    pub(crate) fn freed(&self, files: HashSet<FileKey>) {
        let by = self.wake.as_ref().map_or(0, |w| w.session);
        for key in files {
            self.waits.freed(key, by);
        }
    }

    /// Drops the owners' descriptions `gone` (their locks go with them), then tells other
    /// sessions waiting on those files.
    pub(crate) fn drop_owners(&self, gone: Vec<Arc<OwnerFd>>) {
        let files = self.waited_files(gone.iter().map(|o| o.fd.as_fd()));
        drop(gone);
        self.freed(files);
    }

    /// FORGET of `node`: the guest holds no file open on it, so no lock either.
    pub(crate) fn forget_node(&self, node: NodeId) {
        // Every FORGET comes here: with no owners there is nothing to drop.
        if self.owners.is_empty() {
            return;
        }
        let mut gone = Vec::new();
        self.owners.retain(|(n, _), o| {
            if *n == node {
                gone.push(o.clone());
            }
            *n != node
        });
        self.wal_guards.lock().unwrap().remove(&node);
        self.drop_owners(gone);
    }

    /// The end of the session: every lock it holds goes.
    pub(crate) fn release_all(&self) {
        let gone: Vec<Arc<OwnerFd>> = self.owners.iter().map(|e| e.value().clone()).collect();
        self.owners.clear();
        self.wal_guards.lock().unwrap().clear();
        self.drop_owners(gone);
        if let Some(w) = &self.wake {
            self.waits.end_session(w.session);
        }
    }
}

/// A host file, as (st_dev, st_ino): sessions name files by their own node ids.
type FileKey = (u64, u64);

fn file_key(host: &dyn Backend, fd: BorrowedFd<'_>) -> Option<FileKey> {
    host.stat(fd).ok().map(|st| (st.st_dev as u64, st.st_ino))
}

/// Most files with refused sessions remembered at once, across the export: past it, a
/// refused session's waiters find a release by polling only.
const MAX_WAITED_FILES: usize = 4096;

/// Where a session hears of locks freed by other sessions: its id, and the channel of the
/// thread that pushes LOCK_FREED to its client (session.rs). Only sessions that were
/// granted pushes have one.
pub struct LockWake {
    pub session: u64,
    pub tx: Sender<NodeId>,
}

/// Sessions refused a lock on a file, per file, shared by every session of the export.
/// Each entry is told of the next release by another session and then dropped: a waiter
/// refused again is entered again.
#[derive(Default)]
pub struct LockWaits {
    files: Mutex<HashMap<FileKey, Vec<Refused>>>,
}

/// A session refused a lock on a file: its id, its node of the file, its pusher's channel.
type Refused = (u64, NodeId, Sender<NodeId>);

impl LockWaits {
    fn refused(&self, key: FileKey, node: NodeId, wake: &LockWake) {
        let mut files = self.files.lock().unwrap();
        if files.len() >= MAX_WAITED_FILES && !files.contains_key(&key) {
            return;
        }
        let waiting = files.entry(key).or_default();
        if !waiting
            .iter()
            .any(|(s, n, _)| *s == wake.session && *n == node)
        {
            waiting.push((wake.session, node, wake.tx.clone()));
        }
    }

    /// Session `by` released or downgraded a lock on `key`: every other session refused
    /// there hears of it. (`by`'s own waiters are woken by its client.)
    fn freed(&self, key: FileKey, by: u64) {
        let Some(waiting) = self.files.lock().unwrap().remove(&key) else {
            return;
        };
        for (session, node, tx) in waiting {
            if session != by {
                let _ = tx.send(node);
            }
        }
    }

    fn is_empty(&self) -> bool {
        self.files.lock().unwrap().is_empty()
    }

    /// The session ended: nothing to tell it any more.
    pub fn end_session(&self, session: u64) {
        let mut files = self.files.lock().unwrap();
        files.retain(|_, waiting| {
            waiting.retain(|(s, _, _)| *s != session);
            !waiting.is_empty()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_tells_the_other_sessions_refused_there_once() {
        let waits = LockWaits::default();
        let (tx1, rx1) = std::sync::mpsc::channel();
        let (tx2, rx2) = std::sync::mpsc::channel();
        let one = LockWake {
            session: 1,
            tx: tx1,
        };
        let two = LockWake {
            session: 2,
            tx: tx2,
        };
        waits.refused((1, 10), NodeId::new(5), &one);
        waits.refused((1, 10), NodeId::new(5), &one);
        waits.refused((1, 10), NodeId::new(7), &two);
        // Session 2's own release: its client wakes its waiters; session 1 hears, once.
        waits.freed((1, 10), 2);
        assert_eq!(rx1.try_iter().collect::<Vec<_>>(), vec![NodeId::new(5)]);
        assert!(rx2.try_recv().is_err());
        waits.freed((1, 10), 2);
        assert!(rx1.try_recv().is_err(), "told twice");
        // A session that ended hears nothing.
        waits.refused((1, 11), NodeId::new(6), &one);
        waits.end_session(1);
        waits.freed((1, 11), 2);
        assert!(rx1.try_recv().is_err());
        assert!(waits.files.lock().unwrap().is_empty());
    }
}
