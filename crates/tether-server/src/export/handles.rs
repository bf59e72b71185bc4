//! One session's open handles (OPEN, OPENDIR, CREATE, REOPEN): numbered descriptors, each
//! with the node it was opened on, so that a request must name both. Bounded per session
//! (`Export::max_handles`).

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use dashmap::DashMap;
use tether_proto::{HandleId, NodeId, WireErrno};

use crate::backend::SysResult;

pub enum Handle {
    File(OwnedFd),
    /// Directory streams share a position, so reads of one handle are serialized.
    Dir(Mutex<OwnedFd>),
}

pub struct HandleTable {
    handles: DashMap<HandleId, (NodeId, Arc<Handle>)>,
    next: AtomicU64,
    /// Most handles open at once.
    max: usize,
}

impl HandleTable {
    pub fn new(max: usize) -> HandleTable {
        HandleTable {
            handles: DashMap::new(),
            next: AtomicU64::new(1),
            max,
        }
    }

    pub fn len(&self) -> usize {
        self.handles.len()
    }

    pub fn is_empty(&self) -> bool {
        self.handles.is_empty()
    }

    /// Adds `h`, opened on `node`, under a new number.
    pub fn add(&self, node: NodeId, h: Handle) -> SysResult<HandleId> {
        if self.handles.len() >= self.max {
            return Err(WireErrno::EMFILE);
        }
        let h = (node, Arc::new(h));
        loop {
            // Skips numbers a reconnecting client claimed with REOPEN. `next` starts at 1 and
            // only grows, so no handle is 0 (the wire's "none"): 0 would take 2^64 opens.
            let Some(id) = HandleId::new(self.next.fetch_add(1, Ordering::Relaxed)) else {
                continue;
            };
            if let dashmap::Entry::Vacant(v) = self.handles.entry(id) {
                v.insert(h);
                return Ok(id);
            }
        }
    }

    /// Adds a handle under the number `fh` a reconnecting client already uses for it (none:
    /// EINVAL).
    pub fn add_at(&self, node: NodeId, fh: Option<HandleId>, h: Handle) -> SysResult<()> {
        let Some(fh) = fh else {
            return Err(WireErrno::EINVAL);
        };
        if self.handles.len() >= self.max {
            return Err(WireErrno::EMFILE);
        }
        match self.handles.entry(fh) {
            dashmap::Entry::Occupied(_) => Err(WireErrno::EEXIST),
            dashmap::Entry::Vacant(v) => {
                v.insert((node, Arc::new(h)));
                self.next
                    .fetch_max(fh.get().saturating_add(1), Ordering::Relaxed);
                Ok(())
            }
        }
    }

    /// Handle `fh`, which must have been opened on `node`: what a reply says about `node`
    /// (attributes, listed entries, own changes) then is about the handle's object.
    pub fn get(&self, node: NodeId, fh: HandleId) -> SysResult<Arc<Handle>> {
        match self.handles.get(&fh) {
            Some(h) if h.0 == node => Ok(h.1.clone()),
            _ => Err(WireErrno::EBADF),
        }
    }

    /// [`HandleTable::get`] of a file's handle.
    pub fn file(&self, node: NodeId, fh: HandleId) -> SysResult<Arc<Handle>> {
        let h = self.get(node, fh)?;
        match *h {
            Handle::File(_) => Ok(h),
            Handle::Dir(_) => Err(WireErrno::EISDIR),
        }
    }

    /// Closes handle `fh` if it was opened on `node` (RELEASE, RELEASEDIR; none: nothing).
    pub fn release(&self, node: NodeId, fh: Option<HandleId>) {
        if let Some(fh) = fh {
            self.handles.remove_if(&fh, |_, (n, _)| *n == node);
        }
    }
}
