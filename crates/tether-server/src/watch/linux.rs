//! The Linux [`Watcher`]: an inotify watch (inotify.rs) on each watched directory, and
//! beside it, where the kernel has it, a fanotify mark (fanotify.rs) that says which
//! process changed a file.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::Duration;

use tether_proto::NodeId;

use super::fanotify::{Drained, ForeignChanges};
use super::inotify::Inotify;
use super::{Batch, ForeignChanged, Watcher};

pub struct LinuxWatcher {
    inotify: Inotify,
    /// Which process changed a file, where the kernel can tell.
    foreign: Option<ForeignChanges>,
}

impl LinuxWatcher {
    pub fn new() -> io::Result<LinuxWatcher> {
        Ok(LinuxWatcher {
            inotify: Inotify::new()?,
            foreign: ForeignChanges::new()
                .inspect_err(|e| {
                    tracing::info!(
                        "no fanotify ({e}): a host write in the moment of a guest write to the \
                         same file may go unnoticed"
                    )
                })
                .ok(),
        })
    }
}

impl Watcher for LinuxWatcher {
    fn watch_dir(&self, node: NodeId, fd: &OwnedFd) -> bool {
        if !self.inotify.watch(node, fd) {
            return false;
        }
        if let Some(f) = &self.foreign {
            f.mark(node, fd.as_fd());
        }
        true
    }

    /// `fd`, if the server still has it, lets fanotify's mark go too.
    fn unwatch(&self, node: NodeId, fd: Option<&OwnedFd>) {
        if let Some(f) = &self.foreign {
            f.unmark(node, fd.map(|fd| fd.as_fd()));
        }
        self.inotify.unwatch(node);
    }

    /// Waits for either queue (gathering a burst is [`Watch::wait`]'s: coalesce.rs).
    ///
    /// [`Watch::wait`]: super::coalesce::Watch::wait
    fn wait(&self, timeout: Duration) -> bool {
        let pollfd = |fd: i32| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let mut pfds = vec![pollfd(self.inotify.fd().as_raw_fd())];
        if let Some(f) = &self.foreign {
            pfds.push(pollfd(f.fd().as_raw_fd()));
        }
        // SAFETY: valid pollfds.
        let n = unsafe {
            libc::poll(
                pfds.as_mut_ptr(),
                pfds.len() as libc::nfds_t,
                timeout.as_millis() as i32,
            )
        };
        n > 0
    }

    fn drain(&self) -> io::Result<Batch> {
        let mut buf = vec![0u8; 64 * 1024];
        let Some(events) = self.inotify.read_queued(&mut buf) else {
            return Ok(Batch::Overflow);
        };
        // After the inotify events: a change's fanotify event is queued in the same call as
        // its inotify event, so it is found here (or, if read a moment too early, with the
        // next batch: see `Watch::queued_changes`).
        let foreign = match self.foreign.as_ref().map(|f| f.drain(&mut buf)) {
            Some(Drained::Overflow) => return Ok(Batch::Overflow),
            Some(Drained::Changed(c)) => c,
            None => ForeignChanged::new(),
        };
        Ok(Batch::Events(events, foreign))
    }

    fn tells_writers(&self) -> bool {
        self.foreign.is_some()
    }

    fn made_unnamed(&self, ino: u64) {
        self.inotify.made_unnamed(ino);
    }
}
