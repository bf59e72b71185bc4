//! Host read-ahead for cold reads. A guest reading a tree whose caches were dropped sends
//! one READ per file, and on the host each waits for the disk in turn. When the guest
//! starts reading a second file of one directory shortly after a first, a thread of the
//! server asks the host kernel to read that directory's other files into its page cache
//! (`readahead(2)`), many at once, so the guest's next READs find their data there. Only a
//! hint: nothing reaches the guest that a READ would not return, and a directory listed
//! only for `stat` is never read ahead.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tether_proto::NodeId;

use crate::backend::Backend;

/// Two files of one directory read from their start within this time make a walk.
const WALK_WINDOW: Duration = Duration::from_millis(500);
/// A directory read ahead is not read ahead again for this long.
const AGAIN_AFTER: Duration = Duration::from_secs(2);
/// Bytes read ahead per file (a small file whole; the kernel's own read-ahead takes over
/// in a large one once the guest reads it).
const PER_FILE: usize = 128 << 10;
/// Files read ahead per directory at most.
const MAX_FILES: usize = 4096;
/// Directories waiting for the thread at most; more are not read ahead.
const QUEUE: usize = 64;
/// Directories remembered at most; the table starts over when full.
const MAX_DIRS: usize = 4096;

enum Seen {
    /// The start of file `.0` was read at `.1`.
    Once(NodeId, Instant),
    /// Read ahead at this time.
    Done(Instant),
}

pub struct ReadAhead {
    host: Arc<dyn Backend>,
    dirs: Mutex<HashMap<NodeId, Seen>>,
    /// The thread's queue, started with the first walk; the thread ends with the session
    /// (when this is dropped). None if it could not be started.
    queue: OnceLock<Option<SyncSender<OwnedFd>>>,
}

impl ReadAhead {
    pub fn new(host: Arc<dyn Backend>) -> ReadAhead {
        ReadAhead {
            host,
            dirs: Mutex::default(),
            queue: OnceLock::new(),
        }
    }

    /// The guest read the start of `file` in directory `dir`. Returns true when that makes
    /// a walk through `dir`, which the caller then opens and hands to [`ReadAhead::queue`].
    pub fn started_reading(&self, dir: NodeId, file: NodeId) -> bool {
        let now = Instant::now();
        let mut dirs = self.dirs.lock().unwrap();
        if dirs.len() >= MAX_DIRS && !dirs.contains_key(&dir) {
            dirs.clear();
        }
        match dirs.get(&dir) {
            Some(Seen::Done(at)) if now.duration_since(*at) < AGAIN_AFTER => false,
            Some(Seen::Once(first, at))
                if *first != file && now.duration_since(*at) < WALK_WINDOW =>
            {
                dirs.insert(dir, Seen::Done(now));
                true
            }
            _ => {
                dirs.insert(dir, Seen::Once(file, now));
                false
            }
        }
    }

    /// Hands a readable descriptor of a walked directory to the thread (dropped if the
    /// thread is behind).
    pub fn queue(&self, dir: OwnedFd) {
        let queue = self.queue.get_or_init(|| {
            let (tx, rx) = sync_channel(QUEUE);
            let host = self.host.clone();
            let spawned = std::thread::Builder::new()
                .name("tether-readahead".into())
                .spawn(move || run(rx, &*host));
            spawned
                .inspect_err(|e| tracing::warn!("no read-ahead thread: {e}"))
                .ok()
                .map(|_| tx)
        });
        if let Some(Err(TrySendError::Full(_))) = queue.as_ref().map(|q| q.try_send(dir)) {
            tracing::debug!("read-ahead queue full: a directory is not read ahead");
        }
    }
}

fn run(rx: Receiver<OwnedFd>, host: &dyn Backend) {
    for dir in rx.iter() {
        let mut names = Vec::new();
        let _ = host.read_dir(dir.as_fd(), 0, &mut |e| {
            if e.kind == libc::DT_REG {
                names.push(e.name);
            }
            names.len() < MAX_FILES
        });
        for name in names {
            let Ok(name) = std::ffi::CString::new(name) else {
                continue;
            };
            let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY;
            if let Ok(f) = host.open_at((dir.as_fd(), &name), flags, 0) {
                host.readahead(f.as_fd(), PER_FILE);
            }
        }
    }
}
