//! `tether-fsx`: the random-operation integrity tester (`tether_bench::run_fsx`, in
//! crates/tether-bench/src/fsx.rs). Its binary stays in this package so that the real-mount
//! tests here (tests/fsx.rs) get it built and named by Cargo (`CARGO_BIN_EXE_tether-fsx`),
//! next to the `tether` binary they mount with.

#[cfg(target_os = "linux")]
fn main() -> std::process::ExitCode {
    use clap::Parser;
    tether_bench::run_fsx(tether_bench::FsxArgs::parse())
}

/// It tests mounts, which are Linux's.
#[cfg(not(target_os = "linux"))]
fn main() -> std::process::ExitCode {
    eprintln!("tether-fsx: tests a Tether mount, which needs Linux");
    std::process::ExitCode::FAILURE
}
