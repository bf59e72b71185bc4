//! Runs one target on input files, as a fuzzer would (for reproducing and tracing):
//!
//! TETHER_FUZZ_TRACE=1 cargo run -p tether-fuzz --example run_input -- session FILE...

#[global_allocator]
static ALLOC: tether_fuzz::TrackingAlloc = tether_fuzz::TrackingAlloc;

fn main() {
    let mut args = std::env::args().skip(1);
    let target = args.next().expect("usage: run_input TARGET FILE...");
    let f = tether_fuzz::TARGETS
        .iter()
        .find(|(name, _)| *name == target)
        .unwrap_or_else(|| panic!("unknown target {target}"))
        .1;
    for path in args {
        let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        eprintln!("{path}: {} bytes", data.len());
        f(&data);
    }
}
