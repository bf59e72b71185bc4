//! The frame header parser and read_frame on arbitrary byte streams.
//! The target and its invariants are tether_fuzz::frame (docs/fuzzing.md).
#![no_main]

use libfuzzer_sys::fuzz_target;

#[global_allocator]
static ALLOC: tether_fuzz::TrackingAlloc = tether_fuzz::TrackingAlloc;

fuzz_target!(|data: &[u8]| tether_fuzz::frame(data));
