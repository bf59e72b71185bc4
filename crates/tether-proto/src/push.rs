//! Messages the server pushes without a request (frame kind 3). The frame's `op` is the push
//! type and its `id` a sequence number that grows with every push of a session.

use bytes::Bytes;

use crate::codec::{DecodeError, Decoder};
use crate::frame::{FrameBuilder, FrameKind};
use crate::NodeId;

/// Push types (the `op` field of push frames). Clients ignore types they do not know.
pub mod push_op {
    /// A batch of invalidations: cached state the guest must drop.
    pub const INVALIDATE: u16 = 100;
}

/// One thing the guest must stop trusting.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Invalidation {
    /// The node's attributes and cached data (and, for a directory, its cached listing).
    Inode(NodeId),
    /// The name `name` in directory `parent`, positive or negative.
    Entry { parent: NodeId, name: Bytes },
    /// Everything: the server lost track of changes (its watch queue overflowed).
    All,
}

/// Encodes an INVALIDATE push frame with sequence number `seq`.
pub fn invalidate_frame(seq: u64, items: &[Invalidation]) -> Vec<u8> {
    let mut f = FrameBuilder::new(
        FrameKind::Push,
        0,
        push_op::INVALIDATE,
        seq,
        8 + items.len() * 24,
    );
    let e = &mut f.enc;
    e.u32(items.len() as u32);
    for item in items {
        match item {
            Invalidation::Inode(n) => {
                e.u8(1).u64(*n);
            }
            Invalidation::Entry { parent, name } => {
                e.u8(2).u64(*parent).name(name);
            }
            Invalidation::All => {
                e.u8(3);
            }
        }
    }
    f.finish()
}

/// Decodes the body of an INVALIDATE push.
pub fn decode_invalidate(body: Bytes) -> Result<Vec<Invalidation>, DecodeError> {
    let mut d = Decoder::new(body);
    let n = d.u32()? as usize;
    // Each item is at least 9 bytes: never allocate more than the frame could hold.
    let mut items = Vec::with_capacity(n.min(d.remaining() / 9 + 1));
    for _ in 0..n {
        items.push(match d.u8()? {
            1 => Invalidation::Inode(d.u64()?),
            2 => Invalidation::Entry {
                parent: d.u64()?,
                name: d.name()?,
            },
            3 => Invalidation::All,
            v => {
                return Err(DecodeError::Invalid {
                    field: "invalidation kind",
                    value: v as u64,
                })
            }
        });
    }
    d.finish()?;
    Ok(items)
}
