//! Frames: a fixed 16-byte header, then the body.
//!
//! ```text
//! offset size field
//!  0     4    len   u32 LE: bytes after this field (12 + body length)
//!  4     1    kind  1 request, 2 reply, 3 push (server-initiated)
//!  5     1    flags bit 0 NO_REPLY on requests (forget); other bits 0
//!  6     2    op    u16 LE operation code (for push frames: the push type)
//!  8     8    id    u64 LE request id, echoed by the reply; push frames carry a sequence number
//! 16     -    body
//! ```

use crate::codec::DecodeError;

pub const FRAME_HEADER_LEN: usize = 16;
/// Largest frame accepted: 1 MiB of payload (the kernel's max_write) plus room for headers.
pub const MAX_FRAME_LEN: usize = (1 << 20) + 4096;
/// Request flag: the sender expects no reply (forget).
pub const FLAG_NO_REPLY: u8 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    Request = 1,
    Reply = 2,
    Push = 3,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub kind: FrameKind,
    pub flags: u8,
    pub op: u16,
    pub id: u64,
    /// Length of the body that follows the header.
    pub body_len: usize,
}

impl FrameHeader {
    /// Writes the header for a body of `body_len` bytes.
    pub fn encode(&self, out: &mut [u8; FRAME_HEADER_LEN]) {
        let len = (self.body_len + FRAME_HEADER_LEN - 4) as u32;
        out[0..4].copy_from_slice(&len.to_le_bytes());
        out[4] = self.kind as u8;
        out[5] = self.flags;
        out[6..8].copy_from_slice(&self.op.to_le_bytes());
        out[8..16].copy_from_slice(&self.id.to_le_bytes());
    }

    /// Parses a header, checking the length against `max_len` before anything is allocated.
    pub fn decode(b: &[u8; FRAME_HEADER_LEN], max_len: usize) -> Result<Self, DecodeError> {
        let len = u32::from_le_bytes(b[0..4].try_into().unwrap());
        if (len as usize) < FRAME_HEADER_LEN - 4 {
            return Err(DecodeError::TooShort(len));
        }
        // In u64: `len + 4` must not wrap where usize is 32 bits.
        if len as u64 + 4 > max_len as u64 {
            return Err(DecodeError::TooLong(len as u64 + 4, max_len as u64));
        }
        let kind = match b[4] {
            1 => FrameKind::Request,
            2 => FrameKind::Reply,
            3 => FrameKind::Push,
            k => return Err(DecodeError::UnknownKind(k)),
        };
        Ok(FrameHeader {
            kind,
            flags: b[5],
            op: u16::from_le_bytes(b[6..8].try_into().unwrap()),
            id: u64::from_le_bytes(b[8..16].try_into().unwrap()),
            body_len: len as usize + 4 - FRAME_HEADER_LEN,
        })
    }
}

/// Builds one frame in a single buffer: reserve the header, append the body, then `finish`.
pub struct FrameBuilder {
    pub enc: crate::codec::Encoder,
    header: FrameHeader,
}

impl FrameBuilder {
    pub fn new(kind: FrameKind, flags: u8, op: u16, id: u64, capacity: usize) -> Self {
        let mut enc = crate::codec::Encoder::with_capacity(FRAME_HEADER_LEN + capacity);
        enc.buf.resize(FRAME_HEADER_LEN, 0);
        FrameBuilder {
            enc,
            header: FrameHeader {
                kind,
                flags,
                op,
                id,
                body_len: 0,
            },
        }
    }
    pub fn finish(mut self) -> Vec<u8> {
        self.header.body_len = self.enc.buf.len() - FRAME_HEADER_LEN;
        let mut h = [0u8; FRAME_HEADER_LEN];
        self.header.encode(&mut h);
        self.enc.buf[..FRAME_HEADER_LEN].copy_from_slice(&h);
        self.enc.buf
    }
}
