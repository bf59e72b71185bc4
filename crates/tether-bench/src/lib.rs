//! The measurements behind `tether bench` (the workloads users judge a shared folder by,
//! run side by side in several directories) and `tether latency` (how long a host-side
//! change takes to show through a mount), and the random-operation integrity tester
//! `tether-fsx`. The `tether` binary parses [`BenchArgs`] and [`LatencyArgs`] as its
//! subcommands and hands them to [`run_bench`] and [`run_latency`]; the `tether-fsx` binary
//! parses [`FsxArgs`] for [`run_fsx`].
//!
//! - `workloads`: what each workload sets up, times and checks; the generated content.
//! - `runner`: directory checks, the interleaved runs, progress, cleanup on interrupt.
//! - `report`: the result model, the text table, JSON and the SVG chart.
//! - `latency`: the coherence latency benchmark.
//! - `fsx`: the integrity tester: mixed operations through a mount and on the host,
//!   checked against a model.
//! - `inotify`: the guest file watcher of `tether latency --inotify` and `tether-fsx
//!   --guest-watcher`, and its event parser.
//! - `sys`: signals, child processes, caches, machine facts, the seeded generator.
//!
//! It measures through the file system and `tether_client::sync` only: nothing of the
//! server's internals.

mod fsx;
pub mod host_change;
mod inotify;
mod latency;
mod report;
mod runner;
mod sys;
mod workloads;

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

pub use fsx::{run_fsx, FsxArgs};
pub use host_change::HostChange;

/// `tether bench`: its arguments.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// The directory to measure (usually a Tether mount). It must be empty: the bench works
    /// in its own `.tether-bench-*` subdirectory and removes it at the end.
    pub dir: PathBuf,
    /// Another directory to run the same workloads in, interleaved with DIR (repeatable).
    /// Ratios are relative to the first one, usually the native directory.
    #[arg(long = "vs", value_name = "DIR2")]
    pub vs: Vec<PathBuf>,
    /// About a tenth of the full sizes, for a smoke test.
    #[arg(long)]
    pub quick: bool,
    /// Runs of every workload in every directory; the table shows medians.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub runs: u32,
    /// Also write the results as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Also draw the results as an SVG bar chart in FILE.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Run even if a directory already contains files.
    #[arg(long)]
    pub allow_nonempty: bool,
    /// Only these workloads (comma-separated names; see the table for the list).
    #[arg(long, value_delimiter = ',', value_name = "W1,W2")]
    pub only: Vec<String>,
}

/// `tether latency`: its arguments.
#[derive(Args, Debug)]
pub struct LatencyArgs {
    /// The directory as the host sees it (changes are made here).
    #[arg(long, value_name = "HOSTDIR")]
    pub host: PathBuf,
    /// The same directory seen through a mount (polled until each change shows).
    #[arg(long, value_name = "MOUNTDIR")]
    pub mount: PathBuf,
    /// Number of changes, cycling through the kinds of change.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    pub trials: u32,
    /// Seconds to wait for one change to become visible.
    #[arg(long, default_value_t = 5.0, value_name = "SECS")]
    pub timeout: f64,
    /// Also write the results as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Time until an inotify watch on MOUNTDIR reports each change (the event a local change
    /// would raise), instead of until a poll of the mount shows it.
    #[arg(long, conflicts_with = "sync")]
    pub inotify: bool,
    /// Follow each change with `tether sync` on MOUNTDIR's mount and check the mount once:
    /// the times are the sync's, and "not visible" counts changes still stale after it. A
    /// sync with nothing changed is timed before each change too ("idle").
    #[arg(long)]
    pub sync: bool,
}

/// A progress bar when both outputs are a terminal (and whether it is shown), a hidden one
/// when the output is piped or logged.
fn progress(len: u64) -> (bool, indicatif::ProgressBar) {
    use std::io::IsTerminal;
    if !(std::io::stdout().is_terminal() && std::io::stderr().is_terminal()) {
        return (false, indicatif::ProgressBar::hidden());
    }
    let pb = indicatif::ProgressBar::new(len);
    pb.set_style(
        indicatif::ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    (true, pb)
}

/// Runs `tether bench`: prints the table to standard output (progress to standard error)
/// and writes the JSON and SVG files asked for.
pub fn run_bench(args: BenchArgs) -> Result<()> {
    runner::run(args)
}

/// Runs `tether latency`: prints the table to standard output and writes the JSON file
/// asked for.
pub fn run_latency(args: LatencyArgs) -> Result<()> {
    latency::run(args)
}

/// Writes `text` to standard output. A reader that went away (`tether status | head -1`)
/// is not an error: what it wanted, it got.
pub fn print_out(text: &str) -> Result<()> {
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => Ok(r?),
    }
}
