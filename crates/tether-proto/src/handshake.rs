//! Connection start: both sides send [`MAGIC`], then the client sends a HELLO request and the
//! server answers with a HELLO reply. The magic lets a client skip banners that an ssh
//! transport may print before the server starts.

use crate::codec::{DecodeError, Decoder, Encoder};

/// 8 bytes sent by each side before anything else. The 0x89 and CR LF catch 7-bit and
/// line-ending mangling, as in PNG.
pub const MAGIC: [u8; 8] = *b"\x89TTHR\r\n\x1a";
/// The protocol version this build speaks.
pub const PROTOCOL_VERSION: u16 = 1;

/// Feature bits, negotiated as the intersection of both sides' sets.
pub mod features {
    /// The server watches what the client holds and pushes invalidations; the client may
    /// cache watched nodes without a timeout.
    pub const PUSH_INVALIDATE: u64 = 1 << 0;
    /// Reads and writes may be addressed by node with handle 0.
    pub const IO_BY_NODE: u64 = 1 << 1;
    /// INVALIDATE pushes also carry the host changes behind them (`HostEvent`), so the
    /// client can raise inotify events in the guest. Requires `PUSH_INVALIDATE`.
    pub const HOST_EVENTS: u64 = 1 << 2;
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    pub min_version: u16,
    pub max_version: u16,
    pub features: u64,
    /// Largest frame the client accepts.
    pub max_frame: u32,
    /// Free text for the server's log (host name, version).
    pub client_name: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelloReply {
    pub version: u16,
    pub features: u64,
    /// Largest frame the server accepts.
    pub max_frame: u32,
    /// Most requests the client may have in flight at once.
    pub max_in_flight: u32,
    /// Random per server process: a reconnecting client learns whether it is the same instance.
    pub instance: [u8; 16],
    /// True when the export refuses mutations.
    pub read_only: bool,
}

impl Hello {
    pub fn encode(&self, e: &mut Encoder) {
        e.u16(self.min_version)
            .u16(self.max_version)
            .u64(self.features)
            .u32(self.max_frame)
            .name(&self.client_name);
    }
    pub fn decode(d: &mut Decoder) -> Result<Self, DecodeError> {
        Ok(Hello {
            min_version: d.u16()?,
            max_version: d.u16()?,
            features: d.u64()?,
            max_frame: d.u32()?,
            client_name: d.name()?.to_vec(),
        })
    }
}

impl HelloReply {
    pub fn encode(&self, e: &mut Encoder) {
        e.u16(self.version)
            .u64(self.features)
            .u32(self.max_frame)
            .u32(self.max_in_flight)
            .rest(&self.instance)
            .bool(self.read_only);
    }
    pub fn decode(d: &mut Decoder) -> Result<Self, DecodeError> {
        let version = d.u16()?;
        let features = d.u64()?;
        let max_frame = d.u32()?;
        let max_in_flight = d.u32()?;
        let mut instance = [0u8; 16];
        for b in instance.iter_mut() {
            *b = d.u8()?;
        }
        Ok(HelloReply {
            version,
            features,
            max_frame,
            max_in_flight,
            instance,
            read_only: d.bool()?,
        })
    }
}
