//! Reading and writing whole frames on a byte stream.

use std::io::{self, Read, Write};

use bytes::Bytes;
use tether_proto::{DecodeError, FrameHeader, FRAME_HEADER_LEN, MAGIC};

/// Sends the protocol magic.
pub fn write_magic(w: &mut dyn Write) -> io::Result<()> {
    w.write_all(&MAGIC)?;
    w.flush()
}

/// Reads bytes until the protocol magic has been seen, skipping at most `max_skip` bytes of
/// anything else first (an ssh login banner, say). Fails on end of stream or too much noise.
pub fn read_magic(r: &mut dyn Read, max_skip: usize) -> io::Result<()> {
    let mut window = [0u8; 8];
    let mut seen = 0usize;
    let mut byte = [0u8; 1];
    loop {
        r.read_exact(&mut byte)?;
        window.copy_within(1.., 0);
        window[7] = byte[0];
        seen += 1;
        if seen >= 8 && window == MAGIC {
            return Ok(());
        }
        if seen >= max_skip + 8 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                DecodeError::BadMagic.to_string(),
            ));
        }
    }
}

/// Reads one frame. Returns `Ok(None)` on a clean end of stream between frames.
/// A frame longer than `max_len` is refused before its body is read or allocated.
pub fn read_frame(r: &mut dyn Read, max_len: usize) -> io::Result<Option<(FrameHeader, Bytes)>> {
    let mut h = [0u8; FRAME_HEADER_LEN];
    // Distinguish a clean close (no bytes) from a truncated header.
    let mut got = 0;
    while got < FRAME_HEADER_LEN {
        let n = r.read(&mut h[got..])?;
        if n == 0 {
            if got == 0 {
                return Ok(None);
            }
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed in the middle of a frame header",
            ));
        }
        got += n;
    }
    let header = FrameHeader::decode(&h, max_len)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
    let mut body = vec![0u8; header.body_len];
    r.read_exact(&mut body)?;
    Ok(Some((header, Bytes::from(body))))
}

/// Writes an already encoded frame.
pub fn write_frame(w: &mut dyn Write, frame: &[u8]) -> io::Result<()> {
    w.write_all(frame)
}
