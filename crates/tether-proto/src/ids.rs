//! Node ids and handle ids: the two kinds of number the server issues and the client hands
//! back. Newtypes, so that neither can be mistaken for the other, for a count, an offset or a
//! kernel inode number; each is a `u64` on the wire (encoded and decoded only by
//! [`Encoder::node`](crate::Encoder::node), [`Encoder::handle`](crate::Encoder::handle) and
//! their [`Decoder`](crate::Decoder) counterparts).

use std::fmt;
use std::num::NonZeroU64;

/// A node id issued by the server. Ids are never reused within one server session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(transparent)]
pub struct NodeId(u64);

impl NodeId {
    /// The node id `raw` as it is on the wire.
    pub const fn new(raw: u64) -> NodeId {
        NodeId(raw)
    }

    /// The id as it is on the wire.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// The export root always has this node id.
pub const ROOT_NODE: NodeId = NodeId::new(1);

/// An open file or directory handle issued by the server. Never 0: where the wire carries a
/// handle that may be absent, 0 stands for none and the Rust type is `Option<HandleId>`
/// (which is as small as a `u64`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(transparent)]
pub struct HandleId(NonZeroU64);

impl HandleId {
    /// The handle numbered `raw`; `None` for 0, which is no handle.
    pub const fn new(raw: u64) -> Option<HandleId> {
        match NonZeroU64::new(raw) {
            Some(n) => Some(HandleId(n)),
            None => None,
        }
    }

    /// The handle's number (never 0).
    pub const fn get(self) -> u64 {
        self.0.get()
    }

    /// An optional handle as the wire carries it: 0 for none.
    pub const fn to_wire(fh: Option<HandleId>) -> u64 {
        match fh {
            Some(h) => h.get(),
            None => 0,
        }
    }
}

impl fmt::Display for HandleId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handle_zero_is_none_and_costs_nothing() {
        assert_eq!(HandleId::new(0), None);
        assert_eq!(HandleId::new(7).map(HandleId::get), Some(7));
        assert_eq!(HandleId::to_wire(None), 0);
        assert_eq!(HandleId::to_wire(HandleId::new(u64::MAX)), u64::MAX);
        assert_eq!(std::mem::size_of::<Option<HandleId>>(), 8);
        assert_eq!(std::mem::size_of::<NodeId>(), 8);
    }
}
