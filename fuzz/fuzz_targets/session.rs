//! Request frames executed by the server against a temporary export.
//! The target and its invariants are tether_fuzz::session (docs/fuzzing.md).
#![no_main]

use libfuzzer_sys::fuzz_target;

#[global_allocator]
static ALLOC: tether_fuzz::TrackingAlloc = tether_fuzz::TrackingAlloc;

fuzz_target!(|data: &[u8]| tether_fuzz::session(data));
