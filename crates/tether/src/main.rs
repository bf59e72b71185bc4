//! `tether`: serve a folder on the host, mount it in a guest.

#[cfg(target_os = "linux")]
mod mount_helper;
mod secret;

use std::ffi::OsString;
#[cfg(target_os = "linux")]
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::thread;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
#[cfg(target_os = "linux")]
use tether_bench::print_out;
#[cfg(target_os = "linux")]
use tether_client::mount::{
    check_mount_point, mounted_at, retrying_while_busy, unmount, MountOptions, MountPointCheck,
    Mounted, Unmounter,
};
#[cfg(target_os = "linux")]
use tether_client::rpc::Redial;
use tether_client::rpc::{ConnectError, ConnectOptions};
use tether_client::Connection;
#[cfg(target_os = "linux")]
use tether_client::{CachePolicy, Client, Coherence, WriteMode};
use tether_server::backend::lock_helper::HelperCommand;
use tether_server::{BackendKind, Export, ExportOptions, IdMap, ServeOptions, SessionLimits};
use tether_transport::{Address, Listener};

/// The guest side is Linux's (FUSE): elsewhere `--writes` is only parsed.
#[cfg(not(target_os = "linux"))]
type WriteMode = String;

/// Writes `text` to standard output; a closed pipe is not an error.
#[cfg(not(target_os = "linux"))]
fn print_out(text: &str) -> Result<()> {
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => Ok(r?),
    }
}

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
    #[command(after_help = SERVE_EXAMPLES)]
    Serve {
        /// The directory to export.
        dir: PathBuf,
        /// Where to listen: unix:/path/to.sock, tcp:HOST:PORT, vsock:PORT (AF_VSOCK, any CID:
        /// the host of VMs with a vhost-vsock device), or vsock-unix:/path/to.sock_PORT (the
        /// Unix socket that Firecracker, Cloud Hypervisor or vhost-device-vsock forwards a
        /// guest's connections to host vsock port PORT to). A stale socket at the path (its
        /// server gone) is replaced; anything else there is refused, never removed.
        #[arg(long, short, required_unless_present = "stdio")]
        listen: Option<String>,
        /// Serve one client on standard input and output, then exit: what a client
        /// mounting ssh:HOST:DIR runs on the host through ssh.
        #[arg(long, conflicts_with_all = ["listen", "socket_group"])]
        stdio: bool,
        /// Refuse every change to the export.
        #[arg(long)]
        read_only: bool,
        /// Most node descriptors held open at once (default: half the open-file limit).
        #[arg(long, default_value_t = 0)]
        max_node_fds: usize,
        /// Most open files and directories per client (default: a quarter of the open-file
        /// limit).
        #[arg(long, default_value_t = 0)]
        max_handles: usize,
        /// The secret clients must prove they know. Required on TCP, vsock and vsock-unix,
        /// where it defaults to ~/.config/tether/secret (created, mode 0600, on first use);
        /// optional on Unix sockets, which admit only the serving user (and --socket-group)
        /// anyway.
        #[arg(long)]
        secret_file: Option<PathBuf>,
        /// Also admit members of this group to the Unix socket (created 0660 instead of 0600);
        /// for vsock-unix, a VMM running as another user in this group.
        #[arg(long)]
        socket_group: Option<String>,
        /// File ownership as guests see it: squash (every file is the guest owner's, new
        /// files are the serving user's), passthrough (host ids as they are), or a list like
        /// uid:1000:501,gid:1000:20 (guest:host pairs).
        #[arg(long, default_value = "squash")]
        map_ids: String,
        /// Seconds a new connection may take to greet and authenticate.
        #[arg(long, default_value_t = 10.0)]
        handshake_timeout: f64,
        /// Clients served at once; further connections are closed with a logged reason.
        #[arg(long, default_value_t = 128)]
        max_sessions: usize,
        /// The host calls to serve with: linux (O_PATH, openat2, statx, OFD locks, inotify
        /// and fanotify; the default on Linux) or portable (only calls macOS has too, and a
        /// watcher with FSEvents' semantics; the default elsewhere, and on Linux how the
        /// macOS code is tested: docs/macos.md).
        #[arg(long, value_parser = parse_backend, default_value = DEFAULT_BACKEND)]
        backend: BackendKind,
        /// Tests only (with --backend portable): find names whatever their case, as a
        /// case-insensitive host file system (APFS, HFS+, NTFS) does (docs/macos.md).
        #[arg(long, hide = true)]
        case_insensitive: bool,
    },
    /// Mount a served folder at MOUNTPOINT (in the guest); runs until unmounted or Ctrl-C.
    /// With files open under the mount, Ctrl-C unmounts once they close; a second Ctrl-C
    /// detaches at once (open files keep working), a third stops the process.
    ///
    /// Installed as /sbin/mount.tether (a symbolic link to tether), it is mount(8)'s helper
    /// for `mount -t tether` and fstab lines (docs/install.md).
    #[command(after_help = MOUNT_EXAMPLES)]
    Mount {
        /// The server: unix:/path/to.sock, tcp:HOST:PORT, vsock:CID:PORT (from a VM guest:
        /// vsock:2:PORT is its host), or ssh:[USER@]HOST:DIR (runs `tether serve --stdio
        /// DIR` there through ssh).
        address: String,
        mountpoint: PathBuf,
        #[command(flatten)]
        ssh: SshArgs,
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
        /// Keep flock, fcntl and OFD locks local to this guest's kernel instead of taking
        /// them on the host's files (where other mounts and host processes see them).
        #[arg(long)]
        local_locks: bool,
        /// How writes reach the host: through (the default: every write() is on the host
        /// when it returns, and its error comes back from it; closes cost nothing);
        /// behind (a write() of up to 64 KiB is answered once on its way: `dd` several
        /// times faster; close() and fsync() return once the host has the file's writes
        /// and report their errors, as NFS does, and every close() is a trip into the
        /// client: docs/coherence.md, "Write-behind"); create-behind (behind, and a file
        /// creation is answered with a file the server made ahead, named on the host by
        /// close(): docs/coherence.md, "Create-behind"); writeback (the guest kernel
        /// caches writes and sends them at close, fsync, unlock or within 20 ms: small
        /// writes near native speed, but a stat of a file closed since its last stat asks
        /// the client, so warm greps and copies are several times slower;
        /// docs/coherence.md, "Writeback cache").
        #[arg(long, default_value = "through", value_name = "MODE")]
        writes: WriteMode,
        /// Experimental: take kernel requests through FUSE over io_uring (Linux 6.14 and
        /// later), one queue per CPU, so that a request is served on the CPU that made it.
        /// Needs root; turns on the fuse module's `enable_uring` parameter if it is off.
        /// Each queue has 256 entries (1 MiB of address space each, memory only as used);
        /// a process blocked waiting for a lock holds one, so more than 256 such waiters on
        /// one CPU hold up that CPU's other requests. Where that address space is refused
        /// (strict overcommit), the mount uses /dev/fuse and its log says why.
        #[arg(long)]
        io_uring: bool,
        /// The server's secret (a copy of its secret file); needed for TCP and vsock servers.
        /// Defaults to ~/.config/tether/secret when that exists.
        #[arg(long)]
        secret_file: Option<PathBuf>,
        /// The guest user files appear to belong to when the server squashes ownership
        /// (default: the owner of MOUNTPOINT).
        #[arg(long)]
        uid: Option<u32>,
        /// The guest group files appear to belong to (default: the group of MOUNTPOINT).
        #[arg(long)]
        gid: Option<u32>,
        /// Seconds a file operation waits for a lost server to come back before it fails
        /// with EIO (the mount stays up and keeps reconnecting).
        #[arg(long, default_value_t = 60.0)]
        timeout: f64,
        /// Mount over a directory that has files in it without a warning (they are hidden
        /// until the mount goes away).
        #[arg(long)]
        nonempty: bool,
        /// Return once the mount is up, leaving a detached process to serve it (stopped by
        /// `tether unmount` or umount); fails with the reason if mounting fails.
        #[arg(long, short)]
        background: bool,
        /// With --background: where the mount process logs (appended; default: nowhere).
        #[arg(long, requires = "background", value_name = "FILE")]
        log: Option<PathBuf>,
    },
    /// Connect and authenticate to a server, and report what it offers; changes nothing.
    Check {
        /// The server: as for mount.
        address: String,
        /// As for mount.
        #[arg(long)]
        secret_file: Option<PathBuf>,
        #[command(flatten)]
        ssh: SshArgs,
        /// Then time N PING requests, one at a time (a request the server answers without
        /// touching the file system): the bare round trip through the transport and both
        /// ends, as min, p50, p99 and max.
        #[arg(long, value_name = "N")]
        ping: Option<u32>,
    },
    /// Report on a mount: connection, caching mode (and any fallback), counters.
    Status { mountpoint: PathBuf },
    /// Wait until every host change made before now is visible through MOUNTPOINT.
    ///
    /// When it returns, every change made on the host (or through another mount of the
    /// same export) that completed before it started is visible through MOUNTPOINT. Run it
    /// in the guest after editing on the host and before building, e.g.
    /// `tether sync /mnt/src && make -C /mnt/src`. Without it a host change shows within a
    /// few milliseconds (docs/coherence.md). Fails on a mount that revalidates on a timer
    /// (--no-push), where nothing can be promised, and with a server too old for it.
    Sync {
        mountpoint: PathBuf,
        /// Print nothing on success (otherwise: how long the barrier took).
        #[arg(long, short)]
        quiet: bool,
    },
    /// Unmount a Tether mount (also one whose client died). Anything else mounted there is
    /// refused unless --force.
    Unmount {
        mountpoint: PathBuf,
        /// Detach now even if files are open; the mount goes away when they are closed.
        #[arg(long)]
        lazy: bool,
        /// Unmount whatever is mounted there, Tether or not.
        #[arg(long)]
        force: bool,
    },
    /// Time the workloads users judge a shared folder by, in DIR and each --vs directory.
    #[cfg(target_os = "linux")]
    Bench(tether_bench::BenchArgs),
    /// Measure how long host-side changes take to become visible through a mount.
    #[cfg(target_os = "linux")]
    Latency(tether_bench::LatencyArgs),
    /// Started by `serve --backend portable`: holds the guests' byte-range locks for host
    /// processes to see (tether_server::backend::lock_helper); not for users.
    #[command(hide = true)]
    LockHelper,
}

#[cfg(target_os = "linux")]
const DEFAULT_BACKEND: &str = "linux";
#[cfg(not(target_os = "linux"))]
const DEFAULT_BACKEND: &str = "portable";

fn parse_backend(s: &str) -> Result<BackendKind, String> {
    BackendKind::parse(s).ok_or_else(|| {
        let names = if cfg!(target_os = "linux") {
            "linux or portable"
        } else {
            "portable (the linux backend is Linux's)"
        };
        format!("unknown backend {s:?}: use {names}")
    })
}

const SERVE_EXAMPLES: &str = "\
Examples:
  tether serve ~/src --listen unix:/run/user/1000/tether.sock
  tether serve ~/src --listen tcp:127.0.0.1:7070      # secret: ~/.config/tether/secret
  tether serve ~/src --listen vsock:7070              # VMs with vhost-vsock (libvirt, QEMU)
  tether serve ~/src --listen vsock-unix:/run/fc/v.sock_7070
      # Firecracker (uds_path /run/fc/v.sock), Cloud Hypervisor (--vsock socket=...),
      # vhost-device-vsock (uds-path=...): guests connect to vsock:2:7070
  (copy the secret file into each guest; docs/install.md)";

const MOUNT_EXAMPLES: &str = "\
Examples:
  tether mount vsock:2:7070 /mnt/src --secret-file /etc/tether/secret
  tether mount --background --log /var/log/tether.log vsock:2:7070 /mnt/src
  tether mount tcp:10.0.2.2:7070 /mnt/src --writes behind
  tether mount ssh:me@host:src /mnt/src
  mount -t tether vsock:2:7070 /mnt/src -o secret-file=/etc/tether/secret
fstab (with /sbin/mount.tether -> tether):
  vsock:2:7070  /mnt/src  tether  _netdev,nofail,secret-file=/etc/tether/secret  0 0";

fn main() -> ExitCode {
    #[allow(unused_mut)]
    let mut args: Vec<OsString> = std::env::args_os().collect();
    // As mount(8)'s helper: `mount.tether SOURCE DIR [-sfnv] [-o OPTIONS]`.
    #[cfg(target_os = "linux")]
    let helper = args
        .first()
        .is_some_and(|a| mount_helper::invoked_as_helper(a));
    #[cfg(not(target_os = "linux"))]
    let helper = false;
    #[cfg(target_os = "linux")]
    if helper {
        match mount_helper::helper_args(&args[1..]) {
            Ok(call) if call.fake => {
                let words: Vec<_> = call.args.iter().map(|a| a.to_string_lossy()).collect();
                eprintln!("mount.tether: -f: would run: tether {}", words.join(" "));
                return ExitCode::SUCCESS;
            }
            Ok(call) => args = std::iter::once("tether".into()).chain(call.args).collect(),
            Err(e) => {
                eprintln!("{e:#}");
                return ExitCode::from(1);
            }
        }
    }
    // Set in a background mount's own process: the pipe to report on.
    #[cfg(target_os = "linux")]
    mount_helper::take_ready_pipe();
    let cli = Cli::parse_from(&args);
    let default_level = match cli.verbose {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        // fuser logs every unmount attempt; a stop that waits for open files makes many.
        .unwrap_or_else(|_| {
            tracing_subscriber::EnvFilter::new(format!("{default_level},fuser=warn"))
        });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let context = RunContext {
        args: args[1..].to_vec(),
        verbose: cli.verbose > 0,
    };
    let result = run(cli.command, context);
    #[cfg(target_os = "linux")]
    if let Err(e) = &result {
        // A background mount that failed tells the waiting parent why.
        mount_helper::signal_failed(e);
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if helper => {
            eprintln!("mount.tether: {e:#}");
            // mount(8)'s code for a failed mount.
            ExitCode::from(32)
        }
        Err(e) => {
            eprintln!("tether: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// On SIGINT or SIGTERM: every session answers what it read and says GOODBYE (clients
/// send the rest to the next server), for at most DRAIN_LIMIT or until a second signal;
/// then the socket file is removed and the process exits. With `exit_when_drained` false
/// the caller exits once drained (it has output to finish), and this thread only on a
/// second signal or at the deadline.
fn drain_on_signals(
    drain: Arc<tether_server::Drain>,
    socket_file: Option<tether_transport::OwnSocketFile>,
    exit_when_drained: bool,
) -> Result<()> {
    let mut signals = signal_hook::iterator::Signals::new([libc::SIGINT, libc::SIGTERM])?;
    thread::spawn(move || {
        if signals.forever().next().is_some() {
            drain.begin();
            let hurry = thread::spawn(move || signals.forever().next());
            let deadline = std::time::Instant::now() + DRAIN_LIMIT;
            loop {
                let drained = drain.wait(std::time::Duration::from_millis(50));
                if (drained && exit_when_drained)
                    || hurry.is_finished()
                    || std::time::Instant::now() >= deadline
                {
                    break;
                }
            }
            if let Some(f) = socket_file {
                f.remove();
            }
            std::process::exit(0);
        }
    });
    Ok(())
}

#[cfg(target_os = "linux")]
/// Stops the mount on SIGINT or SIGTERM. The first signal unmounts, or, while files are
/// open under the mount, says so once and unmounts as soon as the last one closes; a
/// second detaches the mount lazily (it leaves the namespace, open files keep working until
/// they close); a third ends the process at once, which fails whatever still waits on the
/// mount (a mount whose requests hang can always be stopped).
fn stop_on_signals(
    mut signals: signal_hook::iterator::Signals,
    mut unmounter: Unmounter,
    mountpoint: &std::path::Path,
) {
    let mp = mountpoint.display();
    let busy = |e: &std::io::Error| e.raw_os_error() == Some(libc::EBUSY);
    if signals.forever().next().is_none() {
        return;
    }
    match retrying_while_busy(|| unmounter.unmount()) {
        Ok(()) => return,
        Err(e) if busy(&e) => eprintln!(
            "tether: files are open under {mp}: will unmount when they close; press Ctrl-C \
             again to detach now (lazy)"
        ),
        Err(e) => {
            eprintln!("tether: cannot unmount {mp}: {e}; press Ctrl-C again to detach now (lazy)")
        }
    }
    loop {
        if signals.pending().next().is_some() {
            break;
        }
        match unmounter.unmount() {
            Ok(()) => return,
            Err(e) if busy(&e) => {}
            Err(e) => tracing::debug!("unmount of {mp} failed again: {e}"),
        }
        thread::sleep(std::time::Duration::from_millis(50));
    }
    match unmount(mountpoint, true) {
        Ok(()) => eprintln!(
            "tether: detached {mp}; open files keep working until they close (Ctrl-C again \
             to stop now: they then fail)"
        ),
        Err(e) => eprintln!(
            "tether: cannot detach {mp}: {e} (Ctrl-C again to stop now: open files then fail)"
        ),
    }
    if signals.forever().next().is_some() {
        eprintln!("tether: stopping now: what is still open under {mp} fails from here on");
        std::process::exit(1);
    }
}

/// `serve --stdio`: one session on standard input and output (the ssh transport), then exit.
fn serve_stdio(export: Arc<Export>, limits: SessionLimits, secret: Option<Vec<u8>>) -> Result<()> {
    let (stream, stdout) =
        tether_transport::stdio().context("cannot serve on standard input and output")?;
    let peer = stream.peer.clone();
    tracing::info!(
        peer,
        "serving {} on standard input and output",
        export.root_path.display()
    );
    let drain = Arc::new(tether_server::Drain::default());
    drain_on_signals(drain.clone(), None, false)?;
    let ended = tether_server::run_session(export, stream, &limits, secret.as_deref(), Some(drain));
    // The last replies (and GOODBYE, after a SIGTERM) are still in the relay.
    stdout.finish(std::time::Duration::from_secs(5));
    ended.with_context(|| format!("session with {peer} ended"))
}

/// How to reach an ssh:HOST:DIR address.
#[derive(clap::Args, Debug)]
struct SshArgs {
    /// For ssh: addresses, the ssh command with options of one's own (split at spaces),
    /// e.g. "ssh -p 2222 -i ~/.ssh/guest".
    #[arg(long, default_value = "ssh")]
    ssh_command: String,
    /// For ssh: addresses, the tether program on the remote host.
    #[arg(long, default_value = "tether")]
    remote_tether: String,
}

fn parse_address(s: &str) -> Result<Address> {
    s.parse::<Address>().map_err(|e| anyhow::anyhow!("{e}"))
}

/// Parses a client's address; an ssh one takes its command from `ssh`.
fn client_address(s: &str, ssh: SshArgs) -> Result<Address> {
    let mut addr = parse_address(s)?
        .for_connecting()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    if let Address::Ssh(t) = &mut addr {
        t.command = ssh
            .ssh_command
            .split_whitespace()
            .map(String::from)
            .collect();
        if t.command.is_empty() {
            bail!("--ssh-command is empty");
        }
        t.remote_tether = ssh.remote_tether;
    }
    Ok(addr)
}

/// The secret a client offers: --secret-file, else the default file if it exists.
fn client_secret(secret_file: Option<PathBuf>) -> Result<Option<Vec<u8>>> {
    let path = match secret_file {
        Some(p) => p,
        None => match secret::default_path() {
            Ok(p) if p.exists() => p,
            _ => return Ok(None),
        },
    };
    secret::load(&path).map(Some)
}

/// Longest a first handshake may wait for the server: a listener that is not a tether
/// server (or a stuck one) fails the command instead of hanging it. Over ssh it covers the
/// login too, which may ask for a password.
const HANDSHAKE_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);
const SSH_HANDSHAKE_LIMIT: std::time::Duration = std::time::Duration::from_secs(180);

/// Connects and performs the handshake (authenticating if the server asks), within the
/// handshake limit for `addr`'s transport.
/// `tether check --ping N`: N PING requests, each sent once the previous one's reply came
/// back, timed from the send to the reply's arrival in the caller (the client's reader
/// thread hands it over, as it does for a file operation).
fn ping_round_trips(conn: &Connection, n: u32) -> Result<()> {
    use tether_proto::{Caller, Request};
    let mut us = Vec::with_capacity(n as usize);
    for i in 0..n {
        let start = std::time::Instant::now();
        conn.call_wait(Caller::default(), &Request::Ping)
            .map_err(|e| anyhow::anyhow!("ping {} of {n} failed: {e:?}", i + 1))?;
        us.push(start.elapsed().as_secs_f64() * 1e6);
    }
    us.sort_by(f64::total_cmp);
    let pct = |p: f64| us[((us.len() - 1) as f64 * p).round() as usize];
    print_out(&format!(
        "ping: {n} round trips, min {:.0} us, p50 {:.0} us, p99 {:.0} us, max {:.0} us\n",
        us[0],
        pct(0.5),
        pct(0.99),
        us[us.len() - 1]
    ))?;
    Ok(())
}

fn connect(addr: &Address, mut opts: ConnectOptions) -> Result<Arc<Connection>> {
    let stream =
        tether_transport::connect(addr).with_context(|| format!("cannot connect to {addr}"))?;
    opts.handshake_timeout = Some(match addr {
        Address::Ssh(_) => SSH_HANDSHAKE_LIMIT,
        _ => HANDSHAKE_LIMIT,
    });
    Connection::start_with(stream, opts).map_err(|e| {
        let ended = matches!(&e, ConnectError::Io(io) if matches!(
            io.kind(),
            std::io::ErrorKind::UnexpectedEof
                | std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::BrokenPipe
        ));
        if ended && matches!(addr, Address::Ssh(_)) {
            anyhow::anyhow!(
                "handshake with {addr} failed: ssh or the remote tether ended first (their \
                 messages above say why)"
            )
        } else if ended {
            anyhow::anyhow!(
                "handshake with {addr} failed: the peer closed the connection before it \
                 answered. Either it is not a Tether server (check the address and port), or \
                 it refused us (check --secret-file against the server's secret, and the \
                 server's log for why)"
            )
        } else {
            anyhow::Error::new(e).context(format!("handshake with {addr} failed"))
        }
    })
}

/// A group name (or number) as a gid.
fn group_id(name: &str) -> Result<u32> {
    if let Ok(gid) = name.parse::<u32>() {
        return Ok(gid);
    }
    let cname = std::ffi::CString::new(name).context("group name contains NUL")?;
    // SAFETY: getgrnam reads a NUL-terminated name; the result is copied before any other
    // call could reuse its static buffer (this runs once, at startup).
    let gr = unsafe { libc::getgrnam(cname.as_ptr()) };
    if gr.is_null() {
        bail!("no such group: {name}");
    }
    // SAFETY: gr is non-null and points to a valid group entry.
    Ok(unsafe { (*gr).gr_gid })
}

/// How long a stopping server waits for its sessions to answer what they read.
const DRAIN_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// What `run` needs besides the command.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
struct RunContext {
    /// The command line after the program name (as tether's, for a mount.tether call), to
    /// run again for a background mount.
    args: Vec<OsString>,
    verbose: bool,
}

fn run(cmd: Command, context: RunContext) -> Result<()> {
    match cmd {
        Command::Serve {
            dir,
            listen,
            // clap requires --listen or --stdio: no --listen means --stdio.
            stdio: _,
            read_only,
            max_node_fds,
            max_handles,
            secret_file,
            socket_group,
            map_ids,
            handshake_timeout,
            max_sessions,
            backend,
            case_insensitive,
        } => {
            if case_insensitive && backend != BackendKind::Portable {
                bail!("--case-insensitive needs --backend portable");
            }
            if !(0.01..=3600.0).contains(&handshake_timeout) {
                bail!("--handshake-timeout must be between 0.01 and 3600 seconds");
            }
            let id_map: IdMap = map_ids.parse()?;
            let limits = SessionLimits {
                handshake_timeout: std::time::Duration::from_secs_f64(handshake_timeout),
                ..SessionLimits::default()
            };
            let export_options = ExportOptions {
                read_only,
                max_node_fds,
                max_handles,
                id_map,
                backend,
                case_insensitive,
                // A process of its own, hence this binary again (never a fork of a threaded
                // server).
                lock_helper: (backend == BackendKind::Portable)
                    .then(|| HelperCommand::this_binary(&["lock-helper"]))
                    .transpose()
                    .context("cannot find this binary to start the lock helper")?,
            };
            let Some(listen) = listen else {
                // Through ssh, which authenticated the client: the session runs as the user
                // it logged in as. A secret is asked for only if given.
                let secret = secret_file.map(|p| secret::load(&p)).transpose()?;
                let export = Export::open(&dir, &export_options)
                    .with_context(|| format!("cannot export {}", dir.display()))?;
                return serve_stdio(export, limits, secret);
            };
            let addr = parse_address(&listen)?;
            let socket_group = socket_group.as_deref().map(group_id).transpose()?;
            if socket_group.is_some() && !matches!(addr, Address::Unix(_) | Address::VsockUnix(_)) {
                bail!("--socket-group applies to Unix sockets only");
            }
            let secret = match (&addr, secret_file) {
                (_, Some(path)) => Some(secret::load(&path)?),
                (addr, None) if addr.needs_secret() => {
                    let path = secret::default_path()?;
                    let (secret, created) = secret::load_or_create(&path)?;
                    if created {
                        eprintln!(
                            "tether: created a new secret in {}: copy it to each guest and \
                             mount with --secret-file",
                            path.display()
                        );
                    }
                    let loopback = match addr {
                        Address::Tcp(hostport) => {
                            tether_transport::is_loopback(hostport).unwrap_or(false)
                        }
                        // vsock stays between a host and its guests.
                        _ => true,
                    };
                    if !loopback {
                        eprintln!(
                            "tether: note: clients must prove they know the secret, but the \
                             traffic itself is not encrypted; on an untrusted network use ssh"
                        );
                    }
                    Some(secret)
                }
                // Listener::bind refuses an ssh address, saying why.
                (_, None) => None,
            };
            let export = Export::open(&dir, &export_options)
                .with_context(|| format!("cannot export {}", dir.display()))?;
            let listener = Listener::bind(&addr, socket_group)
                .with_context(|| format!("cannot listen on {addr}"))?;
            let bound = listener.local_address()?;
            // Remove the socket file on Ctrl-C / SIGTERM as well as on a normal exit.
            let socket_file = match &bound {
                Address::Unix(p) | Address::VsockUnix(p) => {
                    Some(tether_transport::OwnSocketFile::new(p))
                }
                Address::Tcp(_) | Address::Ssh(_) | Address::Vsock { .. } => None,
            };
            let drain = Arc::new(tether_server::Drain::default());
            drain_on_signals(drain.clone(), socket_file, true)?;
            eprintln!(
                "tether: serving {} on {bound}{}",
                export.root_path.display(),
                if read_only { " (read-only)" } else { "" }
            );
            tether_server::serve(
                export,
                listener,
                ServeOptions {
                    secret: secret.map(Arc::from),
                    socket_group,
                    max_sessions,
                    drain,
                    limits,
                },
            )?;
            Ok(())
        }
        #[cfg(not(target_os = "linux"))]
        Command::Mount { .. }
        | Command::Status { .. }
        | Command::Sync { .. }
        | Command::Unmount { .. } => {
            drop(context);
            bail!("this command is the guest side (a FUSE file system): it needs Linux")
        }
        #[cfg(target_os = "linux")]
        Command::Mount {
            address,
            mountpoint,
            ssh,
            attr_timeout,
            read_only,
            threads,
            no_push,
            no_watch_events,
            local_locks,
            writes,
            io_uring,
            secret_file,
            uid,
            gid,
            timeout,
            nonempty,
            background,
            log,
        } => {
            if background && !mount_helper::in_background() {
                return mount_helper::mount_in_background(
                    &context.args,
                    log.as_deref(),
                    context.verbose,
                );
            }
            // A background mount changes to / once mounted: keep the mount point's path valid.
            let mountpoint = if mount_helper::in_background() {
                mount_helper::absolute(&mountpoint)?
            } else {
                mountpoint
            };
            mount_helper::ensure_dev_fuse()?;
            let addr = client_address(&address, ssh)?;
            if check_mount_point(&mountpoint)? == MountPointCheck::NotEmpty && !nonempty {
                eprintln!(
                    "tether: note: {} is not empty: its files are hidden while the mount is \
                     there (--nonempty to mount without this note)",
                    mountpoint.display()
                );
            }
            let mp_meta = std::fs::metadata(&mountpoint)?;
            if !(0.0..=86400.0 * 365.0).contains(&attr_timeout) {
                bail!("--attr-timeout must be between 0 and one year of seconds");
            }
            if !(0.1..=86400.0 * 365.0).contains(&timeout) {
                bail!("--timeout must be between 0.1 seconds and one year");
            }
            let dial_addr = addr.clone();
            let co = Coherence::new();
            let on_push: Option<tether_client::rpc::PushHandler> = if no_push {
                None
            } else {
                let co = co.clone();
                Some(Box::new(move |h, body| co.on_push(h, body)))
            };
            let conn = connect(
                &addr,
                ConnectOptions {
                    client_name: format!("tether-mount {}", env!("CARGO_PKG_VERSION")),
                    on_push,
                    host_events: !no_watch_events,
                    secret: client_secret(secret_file)?,
                    owner: (uid.unwrap_or(mp_meta.uid()), gid.unwrap_or(mp_meta.gid())),
                    redial: Some(Redial {
                        dial: Box::new(move || tether_transport::connect(&dial_addr)),
                        timeout: std::time::Duration::from_secs_f64(timeout),
                    }),
                    handshake_timeout: None, // connect() sets the limit for the address
                },
            )?;
            let ttl = std::time::Duration::from_secs_f64(attr_timeout);
            let opts = MountOptions {
                cache: CachePolicy {
                    attr_ttl: ttl,
                    entry_ttl: ttl,
                    writes,
                },
                fs_name: format!("tether:{addr}"),
                threads,
                read_only,
                watch_events: !no_watch_events,
                host_locks: !local_locks,
                io_uring,
            };
            let client = Client::new(conn, co, writes);
            let _status =
                tether_client::status::StatusServer::start(&mountpoint, client.clone(), ttl)
                    .map_err(|e| tracing::warn!("no status socket: {e}"))
                    .ok();
            let mut mounted = Mounted::new(&client, &mountpoint, &opts)
                .with_context(|| format!("cannot mount on {}", mountpoint.display()))?;
            mount_helper::signal_ready();
            let unmounter = mounted.unmounter();
            let signals = signal_hook::iterator::Signals::new([libc::SIGINT, libc::SIGTERM])?;
            let mp = mountpoint.clone();
            thread::spawn(move || stop_on_signals(signals, unmounter, &mp));
            eprintln!("tether: mounted {addr} on {}", mountpoint.display());
            mounted.run()?;
            eprintln!("tether: unmounted {}", mountpoint.display());
            Ok(())
        }
        Command::Check {
            address,
            secret_file,
            ssh,
            ping,
        } => {
            let addr = client_address(&address, ssh)?;
            let conn = connect(
                &addr,
                ConnectOptions {
                    client_name: format!("tether-check {}", env!("CARGO_PKG_VERSION")),
                    secret: client_secret(secret_file)?,
                    ..ConnectOptions::default()
                },
            )?;
            let h = &conn.hello;
            print_out(&format!(
                "ok: {addr} speaks protocol {}, {}, ownership {:?}\n",
                h.version,
                if h.read_only {
                    "read-only"
                } else {
                    "read-write"
                },
                h.id_mapping
            ))?;
            let pinged = match ping {
                Some(n) if n > 0 => ping_round_trips(&conn, n),
                _ => Ok(()),
            };
            conn.shut_down();
            pinged
        }
        #[cfg(target_os = "linux")]
        Command::Status { mountpoint } => {
            print_out(&tether_client::status::query(&mountpoint)?)?;
            Ok(())
        }
        #[cfg(target_os = "linux")]
        Command::Sync { mountpoint, quiet } => sync_mount(&mountpoint, quiet),
        #[cfg(target_os = "linux")]
        Command::Unmount {
            mountpoint,
            lazy,
            force,
        } => {
            let shown = mountpoint.display();
            let Some(m) = mounted_at(&mountpoint)
                .with_context(|| format!("cannot read the mount table for {shown}"))?
            else {
                bail!("{shown} is not mounted");
            };
            if !m.is_tether() && !force {
                bail!(
                    "{shown} is a {} mount of {}, not a Tether mount: refusing to unmount it \
                     (--force unmounts it anyway)",
                    m.fstype,
                    m.source
                );
            }
            unmount(&m.mount_point, lazy).map_err(|e| {
                let hint = if e.raw_os_error() == Some(libc::EBUSY) {
                    ": files or working directories are open in it (close them, or use --lazy)"
                } else {
                    ""
                };
                anyhow::anyhow!("cannot unmount {shown}: {e}{hint}")
            })
        }
        #[cfg(target_os = "linux")]
        Command::Bench(args) => tether_bench::run_bench(args),
        #[cfg(target_os = "linux")]
        Command::Latency(args) => tether_bench::run_latency(args),
        Command::LockHelper => {
            drop(context);
            tether_server::backend::lock_helper::run().context("lock helper")
        }
    }
}

#[cfg(target_os = "linux")]
/// `tether sync MOUNTPOINT`: the freshness barrier (tether_client::sync).
fn sync_mount(mountpoint: &std::path::Path, quiet: bool) -> Result<()> {
    let synced = tether_client::sync::sync(mountpoint)?;
    for note in &synced.notes {
        eprintln!("tether: note: {note}");
    }
    if !quiet {
        print_out(&format!(
            "synced {} in {} us\n",
            mountpoint.display(),
            synced.took.as_micros()
        ))?;
    }
    Ok(())
}
