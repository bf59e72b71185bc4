//! Target `frame`: the frame header parser and `read_frame` over arbitrary bytes.

use std::io::{self, Cursor, Read};

use bytes::Bytes;
use tether_proto::{DecodeError, FrameHeader, FRAME_HEADER_LEN, MAGIC, MAX_FRAME_LEN};
use tether_transport::framed::{read_frame, read_magic};

use crate::alloc::MemScope;

/// A reader that hands out at most `step` bytes per call, to exercise the partial-read paths.
struct Trickle<'a> {
    data: &'a [u8],
    pos: usize,
    step: usize,
}

impl Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = buf.len().min(self.step).min(self.data.len() - self.pos);
        buf[..n].copy_from_slice(&self.data[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// How a stream of frames was read: the frames, then a clean end (None) or the error kind.
type Outcome = (Vec<(FrameHeader, Bytes)>, Option<io::ErrorKind>);

fn read_all(r: &mut dyn Read, max_len: usize) -> Outcome {
    let mut frames = Vec::new();
    loop {
        match read_frame(r, max_len) {
            Ok(Some(f)) => frames.push(f),
            Ok(None) => return (frames, None),
            Err(e) => return (frames, Some(e.kind())),
        }
    }
}

/// Checks one 16-byte header against the spec (docs/protocol.md §3).
fn header(h: &[u8; FRAME_HEADER_LEN], max_len: usize) {
    let len = u32::from_le_bytes(h[0..4].try_into().unwrap()) as u64;
    match FrameHeader::decode(h, max_len) {
        Ok(hdr) => {
            assert!(
                len >= 12 && len + 4 <= max_len as u64,
                "accepted length {len}"
            );
            assert!(matches!(h[4], 1..=3));
            assert_eq!(hdr.body_len as u64, len - 12);
            let mut again = [0u8; FRAME_HEADER_LEN];
            hdr.encode(&mut again);
            assert_eq!(&again, h, "a decoded header encodes back to the same bytes");
        }
        Err(DecodeError::TooShort(l)) => assert!(l < 12 && l as u64 == len),
        Err(DecodeError::TooLong(l, m)) => {
            assert!(l == len + 4 && m == max_len as u64 && l > m)
        }
        Err(DecodeError::UnknownKind(k)) => assert!(k == h[4] && !matches!(k, 1..=3)),
        Err(e) => panic!("unexpected header error {e:?}"),
    }
}

/// Parses `data` as a frame header and as a stream of frames. Never panics; never allocates
/// a frame body above the declared limit (and, with a 64-byte limit, nothing large at all).
pub fn frame(data: &[u8]) {
    if let Some(h) = data.first_chunk::<FRAME_HEADER_LEN>() {
        header(h, MAX_FRAME_LEN);
        header(h, 64);
    }

    // The whole stream with the real limit, read at once and in small pieces.
    let mem = MemScope::start();
    let plain = read_all(&mut Cursor::new(data), MAX_FRAME_LEN);
    let step = data.len() % 7 + 1;
    let trickled = read_all(&mut Trickle { data, pos: 0, step }, MAX_FRAME_LEN);
    assert_eq!(plain, trickled, "reading in pieces of {step} bytes");
    // The only large block may be one frame body, allocated once its length is checked;
    // everything else is proportional to the input.
    mem.check(
        "frame",
        MAX_FRAME_LEN + 16 * data.len() + 64 * 1024,
        MAX_FRAME_LEN,
    );

    // The frames are the input's bytes, in order, back to back.
    let (frames, end) = plain;
    let mut pos = 0;
    for (h, body) in &frames {
        assert_eq!(h.body_len, body.len());
        assert!(FRAME_HEADER_LEN + body.len() <= MAX_FRAME_LEN);
        let mut hb = [0u8; FRAME_HEADER_LEN];
        h.encode(&mut hb);
        assert_eq!(&hb[..], &data[pos..pos + FRAME_HEADER_LEN]);
        pos += FRAME_HEADER_LEN;
        assert_eq!(&body[..], &data[pos..pos + body.len()]);
        pos += body.len();
    }
    match end {
        None => assert_eq!(pos, data.len(), "a clean end consumed everything"),
        Some(kind) => assert!(
            matches!(
                kind,
                io::ErrorKind::UnexpectedEof | io::ErrorKind::InvalidData
            ),
            "unexpected error kind {kind:?}"
        ),
    }

    // With a tiny limit, a longer frame must be refused before its body is allocated.
    let mem = MemScope::start();
    let mut r = Cursor::new(data);
    while let Ok(Some((h, _))) = read_frame(&mut r, 64) {
        assert!(h.body_len + FRAME_HEADER_LEN <= 64);
    }
    mem.check("frame with a 64-byte limit", 4096, 1024);

    // The magic, after at most 64 bytes of noise.
    let mut r = Cursor::new(data);
    if read_magic(&mut r, 64).is_ok() {
        let end = r.position() as usize;
        assert!((8..=72).contains(&end), "magic found at {end}");
        assert_eq!(data[end - 8..end], MAGIC);
        assert!(
            !data[..end - 1].windows(8).any(|w| w == MAGIC),
            "an earlier magic was skipped"
        );
    }
}
