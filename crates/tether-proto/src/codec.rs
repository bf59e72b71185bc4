//! Little-endian primitive encoding shared by every message.

use bytes::Bytes;

use crate::{HandleId, NodeId};

/// Why a frame or message could not be decoded. Every variant closes only the connection
/// that sent it; none of them is a panic.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("message truncated: needed {needed} more bytes at offset {offset}")]
    Truncated { offset: usize, needed: usize },
    #[error("{0} trailing bytes after the message")]
    Trailing(usize),
    #[error("frame length {0} exceeds the limit of {1} bytes")]
    TooLong(u64, u64),
    #[error("frame length {0} is shorter than a frame header")]
    TooShort(u32),
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    #[error("unknown operation {0}")]
    UnknownOp(u16),
    #[error("invalid value {value} for {field}")]
    Invalid { field: &'static str, value: u64 },
    #[error("bad magic: this peer does not speak the Tether protocol")]
    BadMagic,
}

/// Appends little-endian values to a byte vector.
#[derive(Default, Debug)]
pub struct Encoder {
    pub buf: Vec<u8>,
}

impl Encoder {
    pub fn with_capacity(n: usize) -> Self {
        Encoder {
            buf: Vec::with_capacity(n),
        }
    }
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn i32(&mut self, v: i32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn i64(&mut self, v: i64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn bool(&mut self, v: bool) -> &mut Self {
        self.u8(v as u8)
    }
    /// A node id: a u64.
    pub fn node(&mut self, v: NodeId) -> &mut Self {
        self.u64(v.get())
    }
    /// A node id that may be unknown (a host event's entry): a u64, 0 for none. (The
    /// server issues no node id 0.)
    pub fn maybe_node(&mut self, v: Option<NodeId>) -> &mut Self {
        self.u64(v.map_or(0, NodeId::get))
    }
    /// A handle that may be absent: a u64, 0 for none.
    pub fn handle(&mut self, v: Option<HandleId>) -> &mut Self {
        self.u64(HandleId::to_wire(v))
    }
    /// A name: u16 length, then the bytes.
    pub fn name(&mut self, v: &[u8]) -> &mut Self {
        self.u16(v.len().min(u16::MAX as usize) as u16);
        self.buf
            .extend_from_slice(&v[..v.len().min(u16::MAX as usize)]);
        self
    }
    /// A blob: u32 length, then the bytes.
    pub fn blob(&mut self, v: &[u8]) -> &mut Self {
        self.u32(v.len() as u32);
        self.buf.extend_from_slice(v);
        self
    }
    /// Raw bytes that run to the end of the frame (bulk data, no length prefix).
    pub fn rest(&mut self, v: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(v);
        self
    }
}

/// Reads little-endian values from a frame body without copying bulk data.
pub struct Decoder {
    body: Bytes,
    pos: usize,
}

impl Decoder {
    pub fn new(body: Bytes) -> Self {
        Decoder { body, pos: 0 }
    }
    fn take(&mut self, n: usize) -> Result<&[u8], DecodeError> {
        let remaining = self.body.len() - self.pos;
        if remaining < n {
            return Err(DecodeError::Truncated {
                offset: self.pos,
                needed: n - remaining,
            });
        }
        let s = &self.body[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    pub fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().unwrap()))
    }
    pub fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    pub fn i32(&mut self) -> Result<i32, DecodeError> {
        Ok(i32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    pub fn i64(&mut self) -> Result<i64, DecodeError> {
        Ok(i64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    pub fn bool(&mut self) -> Result<bool, DecodeError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(DecodeError::Invalid {
                field: "bool",
                value: v as u64,
            }),
        }
    }
    /// A node id: a u64.
    pub fn node(&mut self) -> Result<NodeId, DecodeError> {
        Ok(NodeId::new(self.u64()?))
    }
    /// A node id that may be unknown: a u64, 0 for none.
    pub fn maybe_node(&mut self) -> Result<Option<NodeId>, DecodeError> {
        Ok(Some(self.node()?).filter(|n| n.get() != 0))
    }
    /// A handle that may be absent: a u64, 0 for none.
    pub fn handle(&mut self) -> Result<Option<HandleId>, DecodeError> {
        Ok(HandleId::new(self.u64()?))
    }
    /// A handle that must be present (OPEN's reply): a u64 other than 0.
    pub fn issued_handle(&mut self) -> Result<HandleId, DecodeError> {
        self.handle()?.ok_or(DecodeError::Invalid {
            field: "fh",
            value: 0,
        })
    }
    /// An optional marker at the end of a message: consumes the next byte if it is 1 and
    /// says so; anything else stays, for [`Decoder::finish`] to refuse.
    pub fn marker(&mut self) -> bool {
        let set = self.body.get(self.pos) == Some(&1);
        self.pos += usize::from(set);
        set
    }
    /// A fixed-size byte array (nonces, proofs).
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        Ok(self.take(N)?.try_into().unwrap())
    }
    pub fn name(&mut self) -> Result<Bytes, DecodeError> {
        let n = self.u16()? as usize;
        self.slice(n)
    }
    pub fn blob(&mut self) -> Result<Bytes, DecodeError> {
        let n = self.u32()? as usize;
        self.slice(n)
    }
    fn slice(&mut self, n: usize) -> Result<Bytes, DecodeError> {
        let start = self.pos;
        self.take(n)?;
        Ok(self.body.slice(start..start + n))
    }
    /// Bytes left in the frame.
    pub fn remaining(&self) -> usize {
        self.body.len() - self.pos
    }
    /// Everything up to the end of the frame, without copying.
    pub fn rest(&mut self) -> Bytes {
        let s = self.body.slice(self.pos..);
        self.pos = self.body.len();
        s
    }
    /// Fails if bytes are left over: a message must fill its frame exactly.
    pub fn finish(self) -> Result<(), DecodeError> {
        let left = self.body.len() - self.pos;
        if left == 0 {
            Ok(())
        } else {
            Err(DecodeError::Trailing(left))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The end marker is the byte 1 alone: anything else is left for `finish` to refuse.
    /// 0 on the wire is no handle (and no known node where one may be unknown); a handle
    /// that must be there (OPEN's reply) is refused as 0.
    #[test]
    fn zero_is_none_for_optional_ids_and_refused_for_an_issued_handle() {
        let zero = || Decoder::new(Bytes::from_static(&[0; 8]));
        assert_eq!(zero().handle(), Ok(None));
        assert_eq!(zero().maybe_node(), Ok(None));
        assert_eq!(zero().node(), Ok(NodeId::new(0)));
        assert_eq!(
            zero().issued_handle(),
            Err(DecodeError::Invalid {
                field: "fh",
                value: 0
            })
        );
        let mut e = Encoder::default();
        e.handle(None).maybe_node(None).handle(HandleId::new(7));
        let mut d = Decoder::new(Bytes::from(e.buf));
        assert_eq!(d.handle(), Ok(None));
        assert_eq!(d.maybe_node(), Ok(None));
        assert_eq!(d.issued_handle(), Ok(HandleId::new(7).unwrap()));
        assert_eq!(d.finish(), Ok(()));
    }

    #[test]
    fn a_marker_is_the_byte_one_and_nothing_else() {
        let mut d = Decoder::new(Bytes::from_static(&[1]));
        assert!(d.marker());
        assert_eq!(d.finish(), Ok(()));
        for other in [0u8, 2, 0xff] {
            let mut d = Decoder::new(Bytes::copy_from_slice(&[other]));
            assert!(!d.marker(), "{other}");
            assert_eq!(d.finish(), Err(DecodeError::Trailing(1)), "{other}");
        }
        let mut d = Decoder::new(Bytes::new());
        assert!(!d.marker());
        assert_eq!(d.finish(), Ok(()));
    }
}
