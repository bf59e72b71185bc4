//! `tether`: serve a folder on the host, mount it in a guest.

mod bench;

use std::path::PathBuf;
use std::process::ExitCode;
use std::thread;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use tether_client::mount::{unmount, MountOptions, Mounted};
use tether_client::{CachePolicy, Coherence, Connection};
use tether_server::{Export, ExportOptions, SessionLimits};
use tether_transport::{Address, Listener};

#[derive(Parser)]
#[command(
    name = "tether",
    version,
    about = "A shared folder for VMs and containers: native speed, never stale."
)]
struct Cli {
    /// More log output (repeat for more); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Export DIR (on the host).
    Serve {
        /// The directory to export.
        dir: PathBuf,
        /// Where to listen: unix:/path/to.sock or tcp:HOST:PORT.
        #[arg(long, short)]
        listen: String,
        /// Refuse every change to the export.
        #[arg(long)]
        read_only: bool,
        /// Most node descriptors held open at once (default: half the open-file limit).
        #[arg(long, default_value_t = 0)]
        max_node_fds: usize,
    },
    /// Mount a served folder at MOUNTPOINT (in the guest); runs until unmounted or Ctrl-C.
    Mount {
        /// The server: unix:/path/to.sock or tcp:HOST:PORT.
        address: String,
        mountpoint: PathBuf,
        /// Seconds the kernel may cache attributes and names the server does not watch
        /// (watched ones are cached until the server revokes them).
        #[arg(long, default_value_t = 1.0)]
        attr_timeout: f64,
        /// Do not ask the server to push invalidations: cache everything for
        /// --attr-timeout only, and re-read file data at every open.
        #[arg(long)]
        no_push: bool,
        /// Mount read-only.
        #[arg(long)]
        read_only: bool,
        /// FUSE threads reading kernel requests.
        #[arg(long, default_value_t = 2)]
        threads: usize,
        /// Do not raise inotify events in the guest for changes made on the host.
        #[arg(long)]
        no_watch_events: bool,
    },
    /// Report on a mount: connection, caching mode (and any fallback), counters.
    Status { mountpoint: PathBuf },
    /// Unmount a Tether mount (also one whose client died).
    Unmount {
        mountpoint: PathBuf,
        /// Detach now even if files are open; the mount goes away when they are closed.
        #[arg(long)]
        lazy: bool,
    },
    /// Time the workloads users judge a shared folder by, in DIR and each --vs directory.
    Bench(bench::BenchArgs),
    /// Measure how long host-side changes take to become visible through a mount.
    Latency(bench::LatencyArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let default_level = match cli.verbose {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tether: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn parse_address(s: &str) -> Result<Address> {
    s.parse::<Address>().map_err(|e| anyhow::anyhow!("{e}"))
}

fn run(cmd: Command) -> Result<()> {
    match cmd {
        Command::Serve {
            dir,
            listen,
            read_only,
            max_node_fds,
        } => {
            let addr = parse_address(&listen)?;
            if let Address::Tcp(hostport) = &addr {
                let loopback = tether_transport::is_loopback(hostport)
                    .with_context(|| format!("cannot resolve {hostport}"))?;
                if !loopback {
                    bail!(
                        "refusing to listen on {hostport}: TCP peers are not authenticated yet, so \
                         only loopback addresses (127.0.0.1, [::1]) are allowed; use a Unix socket \
                         or an ssh tunnel to reach other machines"
                    );
                }
            }
            let export = Export::open(
                &dir,
                &ExportOptions {
                    read_only,
                    max_node_fds,
                },
            )
            .with_context(|| format!("cannot export {}", dir.display()))?;
            let listener =
                Listener::bind(&addr).with_context(|| format!("cannot listen on {addr}"))?;
            let bound = listener.local_address()?;
            // Remove the socket file on Ctrl-C / SIGTERM as well as on a normal exit.
            let socket_file = match &bound {
                Address::Unix(p) => Some(p.clone()),
                Address::Tcp(_) => None,
            };
            let mut signals = signal_hook::iterator::Signals::new([libc::SIGINT, libc::SIGTERM])?;
            thread::spawn(move || {
                if signals.forever().next().is_some() {
                    if let Some(p) = socket_file {
                        let _ = std::fs::remove_file(p);
                    }
                    std::process::exit(0);
                }
            });
            eprintln!(
                "tether: serving {} on {bound}{}",
                export.root_path.display(),
                if read_only { " (read-only)" } else { "" }
            );
            tether_server::serve(export, listener, SessionLimits::default())?;
            Ok(())
        }
        Command::Mount {
            address,
            mountpoint,
            attr_timeout,
            read_only,
            threads,
            no_push,
            no_watch_events,
        } => {
            let addr = parse_address(&address)?;
            if !mountpoint.is_dir() {
                bail!("mount point {} is not a directory", mountpoint.display());
            }
            if !(0.0..=86400.0 * 365.0).contains(&attr_timeout) {
                bail!("--attr-timeout must be between 0 and one year of seconds");
            }
            let stream = tether_transport::connect(&addr)
                .with_context(|| format!("cannot connect to {addr}"))?;
            let name = format!("tether-mount {}", env!("CARGO_PKG_VERSION"));
            let co = Coherence::new();
            let on_push: Option<tether_client::rpc::PushHandler> = if no_push {
                None
            } else {
                let co = co.clone();
                Some(Box::new(move |h, body| co.on_push(h, body)))
            };
            let conn = Connection::start(stream, &name, on_push, !no_watch_events)
                .with_context(|| format!("handshake with {addr} failed"))?;
            let ttl = std::time::Duration::from_secs_f64(attr_timeout);
            let opts = MountOptions {
                cache: CachePolicy {
                    attr_ttl: ttl,
                    entry_ttl: ttl,
                },
                fs_name: format!("tether:{addr}"),
                threads,
                read_only,
                watch_events: !no_watch_events,
            };
            let _status = tether_client::status::StatusServer::start(
                &mountpoint,
                conn.clone(),
                co.clone(),
                ttl,
            )
            .map_err(|e| tracing::warn!("no status socket: {e}"))
            .ok();
            let mut mounted = Mounted::new(conn, co, &mountpoint, &opts)
                .with_context(|| format!("cannot mount on {}", mountpoint.display()))?;
            let mut unmounter = mounted.unmounter();
            let mut signals = signal_hook::iterator::Signals::new([libc::SIGINT, libc::SIGTERM])?;
            let mp = mountpoint.clone();
            thread::spawn(move || {
                for _ in signals.forever() {
                    if let Err(e) = unmounter.unmount() {
                        eprintln!(
                            "tether: cannot unmount {}: {e} (files still open?)",
                            mp.display()
                        );
                    }
                }
            });
            eprintln!("tether: mounted {addr} on {}", mountpoint.display());
            mounted.run()?;
            eprintln!("tether: unmounted {}", mountpoint.display());
            Ok(())
        }
        Command::Status { mountpoint } => {
            print!("{}", tether_client::status::query(&mountpoint)?);
            Ok(())
        }
        Command::Unmount { mountpoint, lazy } => unmount(&mountpoint, lazy)
            .with_context(|| format!("cannot unmount {}", mountpoint.display())),
        Command::Bench(args) => bench::run_bench(args),
        Command::Latency(args) => bench::run_latency(args),
    }
}
