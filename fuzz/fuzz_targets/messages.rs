//! Every request, reply, push and HELLO decoder, with round trips.
//! The target and its invariants are tether_fuzz::messages (docs/fuzzing.md).
#![no_main]

use libfuzzer_sys::fuzz_target;

#[global_allocator]
static ALLOC: tether_fuzz::TrackingAlloc = tether_fuzz::TrackingAlloc;

fuzz_target!(|data: &[u8]| tether_fuzz::messages(data));
