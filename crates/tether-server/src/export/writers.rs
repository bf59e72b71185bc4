//! Descriptors opened for writes addressed by node, kept for a moment after their last use.
//!
//! A client in no-open mode sends every write by node, and each WRITE used to reopen the
//! file through /proc/self/fd and close it again: two syscalls, and two more inotify and
//! fanotify events (IN_CLOSE_WRITE, FAN_CLOSE_WRITE) for the watcher to read and check,
//! per `write()` of the guest. A CREATE's own descriptor was closed too, just before the
//! first WRITE reopened the file. Now a writable descriptor stays open until no write has
//! used it for [`IDLE`]; host watchers then see one IN_CLOSE_WRITE shortly after the guest's
//! last write of a file, as from a local program, instead of one per write.
//!
//! What a kept descriptor costs, for at most [`IDLE`]: the file cannot be executed on the
//! host (ETXTBSY), and a file deleted on the host keeps its space. Deletions through the
//! server drop the descriptor at once ([`Writers::forget`]).

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use tether_proto::NodeId;

/// How long a descriptor stays open after its last write.
pub const IDLE: Duration = Duration::from_millis(50);

/// Most descriptors kept at once; the least recently used goes first.
const MAX_KEPT: usize = 64;

#[derive(Default)]
pub struct Writers {
    kept: Mutex<Kept>,
    changed: Condvar,
}

#[derive(Default)]
struct Kept {
    fds: HashMap<NodeId, (Arc<OwnedFd>, Instant)>,
    /// The thread that closes idle descriptors, started with the first one kept and
    /// ended by [`Writers::stop`] (not per burst of writes: a start costs a write its time).
    closer_started: bool,
    stopped: bool,
}

impl Writers {
    /// The kept descriptor of `node`, if any, marked as used now.
    pub fn get(&self, node: NodeId) -> Option<Arc<OwnedFd>> {
        let mut k = self.kept.lock().unwrap();
        let (fd, last) = k.fds.get_mut(&node)?;
        *last = Instant::now();
        Some(fd.clone())
    }

    /// Keeps `fd`, opened for writing `node`, and returns it for use.
    pub fn keep(self: &Arc<Self>, node: NodeId, fd: OwnedFd) -> Arc<OwnedFd> {
        let fd = Arc::new(fd);
        let mut evicted = None;
        let mut k = self.kept.lock().unwrap();
        if k.stopped {
            return fd;
        }
        if k.fds.len() >= MAX_KEPT && !k.fds.contains_key(&node) {
            let oldest = k.fds.iter().min_by_key(|(_, (_, t))| *t).map(|(n, _)| *n);
            evicted = oldest.and_then(|n| k.fds.remove(&n));
        }
        // A descriptor it replaces (two WRITEs of one node racing) is closed by its last user.
        let was_empty = k.fds.is_empty();
        k.fds.insert(node, (fd.clone(), Instant::now()));
        if !k.closer_started {
            let me = self.clone();
            let spawned = std::thread::Builder::new()
                .name("tether-writers".into())
                .spawn(move || me.close_idle());
            match spawned {
                Ok(_) => k.closer_started = true,
                // Without the thread nothing would close them: keep none.
                Err(_) => k.fds.clear(),
            }
        } else if was_empty {
            // The closer waits without a deadline while nothing is kept.
            self.changed.notify_all();
        }
        drop(k);
        drop(evicted);
        fd
    }

    /// Closes `node`'s kept descriptor (its name was removed, or the client forgot it).
    pub fn forget(&self, node: NodeId) {
        let gone = self.kept.lock().unwrap().fds.remove(&node);
        drop(gone);
    }

    /// Closes every kept descriptor and keeps no more (the session ends).
    pub fn stop(&self) {
        let gone = {
            let mut k = self.kept.lock().unwrap();
            k.stopped = true;
            std::mem::take(&mut k.fds)
        };
        self.changed.notify_all();
        drop(gone);
    }

    /// The closing thread: closes each descriptor [`IDLE`] after its last use (outside the
    /// lock: a close may take a while), until the table is stopped.
    fn close_idle(&self) {
        let mut k = self.kept.lock().unwrap();
        loop {
            if k.stopped {
                return;
            }
            if k.fds.is_empty() {
                k = self.changed.wait(k).unwrap();
                continue;
            }
            let now = Instant::now();
            let idle: Vec<NodeId> = (k.fds.iter())
                .filter(|(_, (_, last))| now.duration_since(*last) >= IDLE)
                .map(|(n, _)| *n)
                .collect();
            let closing: Vec<_> = idle.iter().filter_map(|n| k.fds.remove(n)).collect();
            if !closing.is_empty() {
                drop(k);
                drop(closing);
                k = self.kept.lock().unwrap();
                continue;
            }
            let next = (k.fds.values())
                .map(|(_, last)| *last + IDLE)
                .min()
                .expect("not empty");
            let wait = next.saturating_duration_since(now);
            k = self.changed.wait_timeout(k, wait).unwrap().0;
        }
    }

    #[cfg(test)]
    fn kept(&self) -> usize {
        self.kept.lock().unwrap().fds.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// The write end of a pipe, and its read end, which sees the end of the stream once
    /// every copy of the write end is closed.
    fn pipe() -> (OwnedFd, std::fs::File) {
        let mut fds = [0; 2];
        // SAFETY: fds has room for the two descriptors pipe2 returns.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: both descriptors were just created and are owned by nobody else.
        unsafe {
            use std::os::fd::FromRawFd;
            (
                OwnedFd::from_raw_fd(fds[1]),
                std::fs::File::from_raw_fd(fds[0]),
            )
        }
    }

    fn closed(mut reader: std::fs::File) -> bool {
        reader.read(&mut [0u8; 1]).unwrap() == 0
    }

    #[test]
    fn a_kept_descriptor_is_reused_then_closed_after_it_idles() {
        let w = Arc::new(Writers::default());
        let (fd, reader) = pipe();
        let kept = w.keep(NodeId::new(7), fd);
        let again = w.get(NodeId::new(7)).expect("kept");
        assert!(Arc::ptr_eq(&kept, &again));
        drop((kept, again));
        std::thread::sleep(IDLE * 4);
        assert_eq!(w.kept(), 0);
        assert!(w.get(NodeId::new(7)).is_none());
        assert!(closed(reader));
        // Kept again after the table emptied: the same closer closes it.
        let (fd, reader) = pipe();
        drop(w.keep(NodeId::new(8), fd));
        std::thread::sleep(IDLE * 4);
        assert_eq!(w.kept(), 0);
        assert!(closed(reader));
    }

    #[test]
    fn forgetting_a_node_or_stopping_closes_at_once() {
        let w = Arc::new(Writers::default());
        let ((one, one_reader), (two, two_reader)) = (pipe(), pipe());
        w.keep(NodeId::new(1), one);
        w.keep(NodeId::new(2), two);
        w.forget(NodeId::new(1));
        assert!(w.get(NodeId::new(1)).is_none());
        assert!(closed(one_reader));
        w.stop();
        assert_eq!(w.kept(), 0);
        assert!(closed(two_reader));
        let (three, _) = pipe();
        w.keep(NodeId::new(3), three);
        assert_eq!(w.kept(), 0, "a stopped table keeps nothing");
    }

    #[test]
    fn at_most_max_kept_are_kept_and_the_least_recently_used_goes() {
        let w = Arc::new(Writers::default());
        for n in 0..MAX_KEPT as u64 {
            w.keep(NodeId::new(n), pipe().0);
            std::thread::sleep(Duration::from_micros(50));
        }
        w.get(NodeId::new(0)); // now the most recently used
        w.keep(NodeId::new(1000), pipe().0);
        assert_eq!(w.kept(), MAX_KEPT);
        assert!(w.get(NodeId::new(0)).is_some());
        assert!(
            w.get(NodeId::new(1)).is_none(),
            "the least recently used was closed"
        );
    }
}
