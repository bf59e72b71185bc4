//! Target `messages`: every message decoder, with encode/decode round trips.
//!
//! Input: byte 0 picks the family (0 request, 1 reply, 2 push bodies: INVALIDATE and
//! LOCK_FREED, 3 HELLO and HELLO reply bodies without prefix), byte 1 the op
//! ([`op_from_selector`]), the rest is the body.

use bytes::Bytes;
use tether_proto::frame::FLAG_NO_REPLY;
use tether_proto::{
    data_reply_frame, decode_invalidate, decode_lock_freed, invalidate_frame, invalidate_frames,
    lock_freed_frame, push_op, reply_frame, DecodeError, Decoder, Encoder, FrameHeader, FrameKind,
    Hello, HelloReply, Op, Reply, Request, FRAME_HEADER_LEN, MAX_FRAME_LEN,
};

use crate::alloc::MemScope;

/// Every op code the protocol defines, in code order.
pub const OPS: [u16; 35] = [
    1, 2, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31,
    32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42,
];

/// Selector byte to op: below `OPS.len()` an index into [`OPS`]; from there on the raw codes
/// 0, 1, 2, …, so unassigned codes (0, 3–9, 43 and up) are reached too.
pub fn op_from_selector(sel: u8) -> u16 {
    match OPS.get(sel as usize) {
        Some(&op) => op,
        None => sel as u16 - OPS.len() as u16,
    }
}

/// The selector byte for a defined op (the inverse of [`op_from_selector`]): its index in
/// [`OPS`], or for a later op (not listed, so that older corpora keep their meaning) the
/// raw code's selector.
pub fn selector_for(op: Op) -> u8 {
    match OPS.iter().position(|&o| o == op as u16) {
        Some(i) => i as u8,
        None => u8::try_from(OPS.len() + op as usize).expect("an op code below 221"),
    }
}

/// Input families of the `messages` target (byte 0, modulo 4).
pub mod family {
    pub const REQUEST: u8 = 0;
    pub const REPLY: u8 = 1;
    pub const PUSH: u8 = 2;
    pub const HELLO: u8 = 3;
}

/// Splits an encoded frame and checks its header.
fn split(frame: &[u8], kind: FrameKind, op: u16, id: u64) -> (FrameHeader, Bytes) {
    let h = FrameHeader::decode(frame[..FRAME_HEADER_LEN].try_into().unwrap(), usize::MAX)
        .expect("an encoded frame has a valid header");
    assert_eq!((h.kind, h.op, h.id), (kind, op, id));
    assert_eq!(h.body_len, frame.len() - FRAME_HEADER_LEN);
    (h, Bytes::copy_from_slice(&frame[FRAME_HEADER_LEN..]))
}

fn request(op: u16, body: Bytes) {
    match Request::decode(op, body.clone()) {
        Ok((caller, req)) => {
            assert_eq!(req.op() as u16, op, "decoded as another op");
            let frame = req.to_frame(7, caller);
            let (h, again) = split(&frame, FrameKind::Request, op, 7);
            let one_way = matches!(req, Request::Forget { .. });
            assert_eq!(h.flags == FLAG_NO_REPLY, one_way, "flags {}", h.flags);
            assert_eq!(again.len(), body.len(), "re-encoded body length");
            let (caller2, req2) = Request::decode(op, again).expect("a re-encoded request decodes");
            assert_eq!((caller2, &req2), (caller, &req), "request round trip");
            assert_eq!(req2.to_frame(7, caller2), frame, "encoding is canonical");
        }
        Err(DecodeError::UnknownOp(o)) => {
            assert_eq!(o, op);
            assert!(Op::from_u16(op).is_err());
        }
        Err(e) => assert_malformed(&e, "request"),
    }
}

fn reply(op: u16, body: Bytes) {
    match Reply::decode(op, body.clone()) {
        Ok(result) => {
            let frame = reply_frame(op, 9, &result);
            let (h, again) = split(&frame, FrameKind::Reply, op, 9);
            assert_eq!(h.flags, 0);
            assert_eq!(again.len(), body.len(), "re-encoded body length");
            let result2 = Reply::decode(op, again).expect("a re-encoded reply decodes");
            assert_eq!(result2, result, "reply round trip");
            assert_eq!(reply_frame(op, 9, &result2), frame, "encoding is canonical");
            // The zero-copy data reply builds the same frame as the generic one.
            if let Ok(Reply::Data(d)) = &result {
                if d.len() <= MAX_FRAME_LEN - FRAME_HEADER_LEN - 8 {
                    let direct = data_reply_frame(op, 9, d.len(), |buf| {
                        buf.copy_from_slice(d);
                        Ok(d.len())
                    });
                    assert_eq!(direct, frame, "data_reply_frame");
                }
            }
        }
        Err(DecodeError::UnknownOp(o)) => {
            assert_eq!(o, op);
            assert!(Op::from_u16(op).is_err());
        }
        Err(e) => assert_malformed(&e, "reply"),
    }
}

fn push(body: Bytes) {
    lock_freed(body.clone());
    let Ok(p) = decode_invalidate(body.clone()) else {
        return;
    };
    let frame = invalidate_frame(5, &p.items, &p.events);
    let (_, again) = split(&frame, FrameKind::Push, push_op::INVALIDATE, 5);
    // Only an empty events part (count 0) may be left out.
    assert!(again.len() == body.len() || again.len() + 4 == body.len() && p.events.is_empty());
    let p2 = decode_invalidate(again).expect("a re-encoded push decodes");
    assert_eq!(p2, p, "push round trip");
    assert_eq!(
        invalidate_frame(5, &p2.items, &p2.events),
        frame,
        "canonical"
    );

    // Cut into frames: numbered on, each decodable, the same items and events in order.
    let mut seq = 41;
    let frames = invalidate_frames(&mut seq, &p.items, &p.events);
    assert_eq!(seq, 41 + frames.len() as u64);
    let (mut items, mut events) = (Vec::new(), Vec::new());
    for (i, f) in frames.iter().enumerate() {
        let (_, b) = split(f, FrameKind::Push, push_op::INVALIDATE, 42 + i as u64);
        let part = decode_invalidate(b).expect("a split push decodes");
        assert!(
            part.items.is_empty() || events.is_empty(),
            "items after events"
        );
        items.extend(part.items);
        events.extend(part.events);
    }
    assert_eq!(items, p.items);
    assert_eq!(events, p.events);
}

/// LOCK_FREED: what decodes encodes back to the same body.
fn lock_freed(body: Bytes) {
    match decode_lock_freed(body.clone()) {
        Ok(nodes) => {
            let frame = lock_freed_frame(&nodes);
            let (_, again) = split(&frame, FrameKind::Push, push_op::LOCK_FREED, 0);
            assert_eq!(again, body, "LOCK_FREED round trip");
        }
        Err(e) => assert_malformed(&e, "LOCK_FREED push"),
    }
}

fn hello(body: Bytes) {
    let mut d = Decoder::new(body.clone());
    if let Ok(h) = Hello::decode(&mut d) {
        if d.finish().is_ok() {
            let mut e = Encoder::default();
            h.encode(&mut e);
            assert_eq!(e.buf.len(), body.len());
            let mut d = Decoder::new(Bytes::from(e.buf));
            assert_eq!(Hello::decode(&mut d), Ok(h), "hello round trip");
            assert_eq!(d.finish(), Ok(()));
        }
    }
    let mut d = Decoder::new(body.clone());
    if let Ok(h) = HelloReply::decode(&mut d) {
        if d.finish().is_ok() {
            let mut e = Encoder::default();
            h.encode(&mut e);
            assert_eq!(e.buf.len(), body.len());
            let mut d = Decoder::new(Bytes::from(e.buf));
            assert_eq!(HelloReply::decode(&mut d), Ok(h), "hello reply round trip");
            assert_eq!(d.finish(), Ok(()));
        }
    }
}

/// Decodes `data` as the message its first two bytes select; whatever decodes must encode
/// back to an equal message. Never panics; memory stays proportional to the input (no
/// allocation sized by a declared count).
pub fn messages(data: &[u8]) {
    let [fam, sel, body @ ..] = data else {
        return;
    };
    let mem = MemScope::start();
    let op = op_from_selector(*sel);
    let body = Bytes::copy_from_slice(body);
    match fam % 4 {
        family::REQUEST => request(op, body),
        family::REPLY => reply(op, body),
        family::PUSH => push(body),
        _ => hello(body),
    }
    mem.check(
        "messages",
        2 * 1024 * 1024 + 256 * data.len(),
        MAX_FRAME_LEN + 64 * data.len(),
    );
}

/// A decode failure other than an unknown op must say the body was malformed.
fn assert_malformed(e: &DecodeError, what: &str) {
    assert!(
        matches!(
            e,
            DecodeError::Truncated { .. } | DecodeError::Trailing(_) | DecodeError::Invalid { .. }
        ),
        "unexpected {what} error {e:?}"
    );
}
