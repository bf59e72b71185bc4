//! Messages the server pushes without a request (frame kind 3). The frame's `op` is the push
//! type and its `id` a sequence number that grows with every push of a session.

use bytes::Bytes;

use crate::codec::{DecodeError, Decoder, Encoder};
use crate::frame::{FrameBuilder, FrameKind};
use crate::NodeId;

/// Push types (the `op` field of push frames). Clients ignore types they do not know.
pub mod push_op {
    /// A batch of invalidations: cached state the guest must drop, followed (when
    /// `HOST_EVENTS` was granted) by the host changes that caused them.
    pub const INVALIDATE: u16 = 100;
    /// The server is shutting down and has answered every request it read: the client may
    /// send the ones still unanswered to the next server. Empty body; the last frame.
    pub const GOODBYE: u16 = 101;
    /// Nodes on which another session released (or downgraded) a lock after this session
    /// was refused one there: a client whose processes wait for a lock on one of them may
    /// try again at once instead of at its next poll. Id 0, like GOODBYE.
    pub const LOCK_FREED: u16 = 102;
}

/// The GOODBYE push (see [`push_op::GOODBYE`]).
pub fn goodbye_frame() -> Vec<u8> {
    FrameBuilder::new(FrameKind::Push, 0, push_op::GOODBYE, 0, 0).finish()
}

/// A LOCK_FREED push (see [`push_op::LOCK_FREED`]): `count` u32, then `count` node ids.
pub fn lock_freed_frame(nodes: &[NodeId]) -> Vec<u8> {
    let mut f = FrameBuilder::new(
        FrameKind::Push,
        0,
        push_op::LOCK_FREED,
        0,
        4 + 8 * nodes.len(),
    );
    f.enc.u32(nodes.len() as u32);
    for n in nodes {
        f.enc.node(*n);
    }
    f.finish()
}

/// Decodes the body of a LOCK_FREED push.
pub fn decode_lock_freed(body: Bytes) -> Result<Vec<NodeId>, DecodeError> {
    let mut d = Decoder::new(body);
    let n = d.u32()? as usize;
    // Never allocate more than the frame could hold.
    let mut nodes = Vec::with_capacity(n.min(d.remaining() / 8));
    for _ in 0..n {
        nodes.push(d.node()?);
    }
    d.finish()?;
    Ok(nodes)
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

/// Bits of [`EventKind::Changed`]: what changed about an existing entry.
pub mod changed {
    /// Its content was written (inotify IN_MODIFY).
    pub const MODIFY: u8 = 1;
    /// A writer closed it (IN_CLOSE_WRITE).
    pub const CLOSE_WRITE: u8 = 2;
    /// Its attributes changed: mode, owner, times, link count (IN_ATTRIB).
    pub const ATTRIB: u8 = 4;
    pub const ALL: u8 = MODIFY | CLOSE_WRITE | ATTRIB;
}

/// What happened to a name, in the terms an inotify watcher in the guest expects.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum EventKind {
    Created,
    Deleted,
    /// Bits of [`changed`].
    Changed(u8),
    /// Renamed to this event's name from `from_name` in `from_dir`.
    Moved {
        from_dir: NodeId,
        from_path: Bytes,
        from_name: Bytes,
    },
}

/// A change made on the host (or through another client) to a name in a directory the
/// client holds, so that the client can raise the inotify events a local change would.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HostEvent {
    pub dir: NodeId,
    /// The directory's path below the export root, '/'-separated, empty for the root.
    pub dir_path: Bytes,
    pub name: Bytes,
    /// The entry's node id, if the server knows it (0 on the wire when it does not).
    pub node: Option<NodeId>,
    /// The entry's file type (S_IFMT bits of st_mode).
    pub file_type: u32,
    pub kind: EventKind,
}

/// The body of an INVALIDATE push.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InvalidatePush {
    pub items: Vec<Invalidation>,
    pub events: Vec<HostEvent>,
}

/// Pushes are cut into frames of about this size, far below any frame limit.
const PUSH_FRAME_TARGET: usize = 256 * 1024;

fn item_len(item: &Invalidation) -> usize {
    match item {
        Invalidation::Inode(_) => 9,
        Invalidation::Entry { name, .. } => 11 + name.len(),
        Invalidation::All => 1,
    }
}

fn event_len(ev: &HostEvent) -> usize {
    let base = 1 + 8 + 4 + ev.dir_path.len() + 2 + ev.name.len() + 8 + 4;
    base + match &ev.kind {
        EventKind::Created | EventKind::Deleted => 0,
        EventKind::Changed(_) => 1,
        EventKind::Moved {
            from_path,
            from_name,
            ..
        } => 8 + 4 + from_path.len() + 2 + from_name.len(),
    }
}

fn encode_item(e: &mut Encoder, item: &Invalidation) {
    match item {
        Invalidation::Inode(n) => {
            e.u8(1).node(*n);
        }
        Invalidation::Entry { parent, name } => {
            e.u8(2).node(*parent).name(name);
        }
        Invalidation::All => {
            e.u8(3);
        }
    }
}

fn encode_event(e: &mut Encoder, ev: &HostEvent) {
    let kind = match ev.kind {
        EventKind::Created => 1,
        EventKind::Deleted => 2,
        EventKind::Changed(_) => 3,
        EventKind::Moved { .. } => 4,
    };
    e.u8(kind)
        .node(ev.dir)
        .blob(&ev.dir_path)
        .name(&ev.name)
        .maybe_node(ev.node)
        .u32(ev.file_type);
    match &ev.kind {
        EventKind::Created | EventKind::Deleted => {}
        EventKind::Changed(bits) => {
            e.u8(*bits);
        }
        EventKind::Moved {
            from_dir,
            from_path,
            from_name,
        } => {
            e.node(*from_dir).blob(from_path).name(from_name);
        }
    }
}

/// Encodes one INVALIDATE push frame with sequence number `seq`. The events part is
/// written only when there are events, so a client that did not ask for them never sees it.
pub fn invalidate_frame(seq: u64, items: &[Invalidation], events: &[HostEvent]) -> Vec<u8> {
    let len =
        8 + items.iter().map(item_len).sum::<usize>() + events.iter().map(event_len).sum::<usize>();
    let mut f = FrameBuilder::new(FrameKind::Push, 0, push_op::INVALIDATE, seq, len);
    f.enc.u32(items.len() as u32);
    for item in items {
        encode_item(&mut f.enc, item);
    }
    if !events.is_empty() {
        f.enc.u32(events.len() as u32);
        for ev in events {
            encode_event(&mut f.enc, ev);
        }
    }
    f.finish()
}

/// Encodes a batch as as many INVALIDATE frames as its size needs (each about 256 KiB at
/// most), numbered from `*seq + 1`; `*seq` is left at the last number used. Order is kept:
/// every invalidation goes before the events, so the client revokes before it replays.
pub fn invalidate_frames(
    seq: &mut u64,
    items: &[Invalidation],
    events: &[HostEvent],
) -> Vec<Vec<u8>> {
    let mut frames = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < items.len() || j < events.len() || frames.is_empty() {
        let mut size = 8;
        let i0 = i;
        while i < items.len() && (i == i0 || size + item_len(&items[i]) <= PUSH_FRAME_TARGET) {
            size += item_len(&items[i]);
            i += 1;
        }
        let j0 = j;
        if i == items.len() {
            while j < events.len()
                && (size == 8 || size + event_len(&events[j]) <= PUSH_FRAME_TARGET)
            {
                size += event_len(&events[j]);
                j += 1;
            }
        }
        *seq += 1;
        frames.push(invalidate_frame(*seq, &items[i0..i], &events[j0..j]));
    }
    frames
}

fn decode_item(d: &mut Decoder) -> Result<Invalidation, DecodeError> {
    Ok(match d.u8()? {
        1 => Invalidation::Inode(d.node()?),
        2 => Invalidation::Entry {
            parent: d.node()?,
            name: d.name()?,
        },
        3 => Invalidation::All,
        v => {
            return Err(DecodeError::Invalid {
                field: "invalidation kind",
                value: v as u64,
            })
        }
    })
}

fn decode_event(d: &mut Decoder) -> Result<HostEvent, DecodeError> {
    let kind = d.u8()?;
    let (dir, dir_path, name, node, file_type) =
        (d.node()?, d.blob()?, d.name()?, d.maybe_node()?, d.u32()?);
    let kind = match kind {
        1 => EventKind::Created,
        2 => EventKind::Deleted,
        3 => EventKind::Changed(d.u8()? & changed::ALL),
        4 => EventKind::Moved {
            from_dir: d.node()?,
            from_path: d.blob()?,
            from_name: d.name()?,
        },
        v => {
            return Err(DecodeError::Invalid {
                field: "event kind",
                value: v as u64,
            })
        }
    };
    Ok(HostEvent {
        dir,
        dir_path,
        name,
        node,
        file_type,
        kind,
    })
}

/// Decodes the body of an INVALIDATE push.
pub fn decode_invalidate(body: Bytes) -> Result<InvalidatePush, DecodeError> {
    let mut d = Decoder::new(body);
    let n = d.u32()? as usize;
    // Each item is at least 1 byte: never allocate more than the frame could hold.
    let mut items = Vec::with_capacity(n.min(d.remaining()));
    for _ in 0..n {
        items.push(decode_item(&mut d)?);
    }
    let mut events = Vec::new();
    if d.remaining() > 0 {
        let m = d.u32()? as usize;
        // Each event is at least 27 bytes.
        events.reserve(m.min(d.remaining() / 27 + 1));
        for _ in 0..m {
            events.push(decode_event(&mut d)?);
        }
    }
    d.finish()?;
    Ok(InvalidatePush { items, events })
}
