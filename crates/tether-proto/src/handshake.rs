//! Connection start: both sides send [`MAGIC`], then the client sends a HELLO request and the
//! server answers with a HELLO reply. The magic lets a client skip banners that an ssh
//! transport may print before the server starts.
//!
//! A server that requires a secret answers HELLO with a [`Challenge`] instead of the session's
//! terms; the client checks the server's proof, sends AUTH with its own, and gets the real
//! HELLO reply as the AUTH reply (see [`crate::auth`]).

use crate::auth::{NONCE_LEN, PROOF_LEN};
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
    /// CREATE replies carry the parent directory's attributes after the creation, so the
    /// client can answer the kernel's next GETATTR of that directory itself. Granted only
    /// with `PUSH_INVALIDATE`: only then may the client keep them.
    pub const DIR_ATTR: u64 = 1 << 3;
    /// CREATE opens no handle: its reply's `fh` is 0 and the client does I/O on the new
    /// file by node (`IO_BY_NODE`), so it has no handle to release. Granted only with
    /// `PUSH_INVALIDATE` (a client without it keeps files open by handle).
    pub const CREATE_NO_HANDLE: u64 = 1 << 4;
    /// WRITE replies carry the file's attributes right after the write, so the client can
    /// answer the kernel's next GETATTR of it (the kernel drops a file's size and times
    /// after every write it sends) itself: the `stat` of a file just written, make's of
    /// the target its recipe wrote. Granted only with `PUSH_INVALIDATE`: only then may the
    /// client keep them.
    pub const WRITE_ATTR: u64 = 1 << 5;
    /// READDIR replies say when the listing reached the end of the directory, so the
    /// client can answer the kernel's next request (for what follows the last entry,
    /// always empty) itself: one round trip fewer per directory listed.
    pub const DIR_END: u64 = 1 << 6;
    /// The server executes every WRITE of at most [`super::ORDERED_WRITE_MAX`] bytes before
    /// it reads the next request, so a request sent after such a WRITE sees its effect: the
    /// client may answer the kernel's write before the server's reply (write-behind).
    pub const ORDERED_WRITES: u64 = 1 << 7;
    /// The server makes unnamed files ahead (SPARES) and names them (BIND), executing each
    /// BIND before it reads the next request, so the client may answer a creation with a
    /// spare before the server has named it (create-behind, with `ORDERED_WRITES`).
    pub const SPARE_FILES: u64 = 1 << 8;
}

/// The most data a WRITE the server executes in order may carry (feature `ORDERED_WRITES`).
pub const ORDERED_WRITE_MAX: usize = 64 * 1024;

/// The body of a WRITE request besides its data: the caller (uid, gid, pid), the node, the
/// handle and the offset.
pub const WRITE_BODY_FIXED: usize = 3 * 4 + 3 * 8;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    pub min_version: u16,
    pub max_version: u16,
    pub features: u64,
    /// Largest frame the client accepts.
    pub max_frame: u32,
    /// The guest user and group that exported files appear to belong to when the server
    /// squashes ownership (its default).
    pub owner_uid: u32,
    pub owner_gid: u32,
    /// Fresh random bytes: the server's proof of the secret covers them, so it cannot be
    /// replayed from an earlier connection.
    pub client_nonce: [u8; NONCE_LEN],
    /// Free text for the server's log (host name, version).
    pub client_name: Vec<u8>,
}

/// How the server maps file ownership between host and guest (informational for the client).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum IdMapping {
    /// Every file appears to belong to the client's `owner_uid`/`owner_gid`; new files
    /// belong to the user running the server.
    Squash = 0,
    /// Host ids are shown and used as they are.
    Passthrough = 1,
    /// Explicit guest-to-host tables; unmapped host ids appear as 65534.
    Mapped = 2,
}

impl IdMapping {
    pub fn from_u8(v: u8) -> Result<Self, DecodeError> {
        Ok(match v {
            0 => IdMapping::Squash,
            1 => IdMapping::Passthrough,
            2 => IdMapping::Mapped,
            v => {
                return Err(DecodeError::Invalid {
                    field: "id_mapping",
                    value: v as u64,
                })
            }
        })
    }
}

/// The server's demand for a proof of the shared secret, and its own proof.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Challenge {
    pub server_nonce: [u8; NONCE_LEN],
    /// `auth::proof(secret, Role::Server, client_nonce, server_nonce)`.
    pub server_proof: [u8; PROOF_LEN],
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
    pub id_mapping: IdMapping,
    /// Present when the client must authenticate (AUTH) before anything else; the other
    /// fields are then zero, and the AUTH reply carries the real ones.
    pub challenge: Option<Challenge>,
}

impl Hello {
    pub fn encode(&self, e: &mut Encoder) {
        e.u16(self.min_version)
            .u16(self.max_version)
            .u64(self.features)
            .u32(self.max_frame)
            .u32(self.owner_uid)
            .u32(self.owner_gid)
            .rest(&self.client_nonce)
            .name(&self.client_name);
    }
    pub fn decode(d: &mut Decoder) -> Result<Self, DecodeError> {
        Ok(Hello {
            min_version: d.u16()?,
            max_version: d.u16()?,
            features: d.u64()?,
            max_frame: d.u32()?,
            owner_uid: d.u32()?,
            owner_gid: d.u32()?,
            client_nonce: d.array()?,
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
            .bool(self.read_only)
            .u8(self.id_mapping as u8);
        match &self.challenge {
            None => {
                e.u8(0);
            }
            Some(c) => {
                e.u8(1).rest(&c.server_nonce).rest(&c.server_proof);
            }
        }
    }
    pub fn decode(d: &mut Decoder) -> Result<Self, DecodeError> {
        let version = d.u16()?;
        let features = d.u64()?;
        let max_frame = d.u32()?;
        let max_in_flight = d.u32()?;
        let instance = d.array()?;
        let read_only = d.bool()?;
        let id_mapping = IdMapping::from_u8(d.u8()?)?;
        let challenge = match d.u8()? {
            0 => None,
            1 => Some(Challenge {
                server_nonce: d.array()?,
                server_proof: d.array()?,
            }),
            v => {
                return Err(DecodeError::Invalid {
                    field: "challenge",
                    value: v as u64,
                })
            }
        };
        Ok(HelloReply {
            version,
            features,
            max_frame,
            max_in_flight,
            instance,
            read_only,
            id_mapping,
            challenge,
        })
    }
}
