//! `tether status MOUNTPOINT`: the mount process answers on a Unix socket named after its
//! mount point with a short report (connection, caching mode, counters). A client first
//! writes a request line: `status` (or nothing, as earlier versions did) for the report,
//! `sync` for a barrier (sync.rs).

use std::io::{self, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tether_proto::IdMapping;

use crate::client::Client;
pub use crate::control::socket_path;
use crate::rpc::Connection;
use crate::write::spares::Spares;

/// Serves status reports for `mountpoint` until the process exits; removes the socket on drop.
pub struct StatusServer {
    file: tether_transport::OwnSocketFile,
}

impl StatusServer {
    pub fn start(
        mountpoint: &Path,
        client: Arc<Client>,
        fallback: Duration,
    ) -> io::Result<StatusServer> {
        let path = crate::control::socket_path(mountpoint);
        let dir = path.parent().expect("has a parent");
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        remove_stale_sockets(dir);
        tether_transport::clear_stale_socket(&path)?;
        let listener = UnixListener::bind(&path)?;
        let file = tether_transport::OwnSocketFile::new(&path);
        let mp = mountpoint.display().to_string();
        std::thread::Builder::new()
            .name("tether-status".into())
            .spawn(move || {
                for mut stream in listener.incoming().flatten() {
                    if crate::control::read_request(&mut stream) == crate::sync::REQUEST {
                        let client = client.clone();
                        let _ = std::thread::Builder::new()
                            .name("tether-sync".into())
                            .spawn(move || crate::sync::answer(stream, &client.conn, &client.co));
                        continue;
                    }
                    let _ = answer(stream, &mp, &client, fallback);
                }
            })?;
        Ok(StatusServer { file })
    }
}

/// Removes the sockets in `dir` no process listens on any more: those of mount processes
/// that were killed (SIGKILL) or crashed, which could not remove their own. Not one made in
/// the last seconds: a starting mount's socket refuses connections between its bind and
/// its listen.
fn remove_stale_sockets(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if !(name.starts_with("mount-") && name.ends_with(".sock")) {
            continue;
        }
        let young = (e.metadata().and_then(|m| m.modified())).map_or(true, |t| {
            t.elapsed().map_or(true, |age| age < Duration::from_secs(5))
        });
        if young {
            continue;
        }
        // Only a socket nobody listens on: never a file of another kind.
        let _ = tether_transport::clear_stale_socket(&e.path());
    }
}

impl Drop for StatusServer {
    fn drop(&mut self) {
        self.file.remove();
    }
}

fn answer(mut s: UnixStream, mp: &str, client: &Client, fallback: Duration) -> io::Result<()> {
    let (conn, co) = (&*client.conn, &*client.co);
    let (watched, unwatched) = co.watch_counts();
    let caching = if co.enabled() {
        if unwatched == 0 {
            format!(
                "pushed invalidation: {watched} watched nodes cached until the host revokes them"
            )
        } else {
            format!(
                "pushed invalidation, partly: {watched} watched nodes cached until revoked; \
                 {unwatched} unwatched nodes fall back to {:.1} s revalidation",
                fallback.as_secs_f64()
            )
        }
    } else {
        format!(
            "revalidation only (no pushed invalidation): attributes and names cached {:.1} s, \
             file data re-read at every open",
            fallback.as_secs_f64()
        )
    };
    let events = match co.replayer.get() {
        Some(r) => format!(
            "on: {} replayed as inotify events, {} not watched in the guest, {} failed, {} dropped",
            r.counters.replayed.load(Ordering::Relaxed),
            r.counters.unwatched.load(Ordering::Relaxed),
            r.counters.failed.load(Ordering::Relaxed),
            r.counters.dropped.load(Ordering::Relaxed),
        ),
        None => "off".into(),
    };
    let writeback = match co.fixer() {
        Some(f) => format!(
            "writeback cache: on: {} files forgotten to be looked up anew, {} files' size or \
             mtime made the host's, {} fixes overtaken by guest writes and tried again, {} \
             put off while an executable ran, {} failed\n",
            f.counters.forgotten.load(Ordering::Relaxed),
            f.counters.fixed.load(Ordering::Relaxed),
            f.counters.overtaken.load(Ordering::Relaxed),
            f.counters.busy.load(Ordering::Relaxed),
            f.counters.failed.load(Ordering::Relaxed),
        ),
        None => String::new(),
    };
    let wb = &client.write_behind;
    let write_behind = match () {
        _ if wb.on() && !conn.grants(tether_proto::handshake::features::ORDERED_WRITES) => {
            "asked for, but off: the server does not promise to execute writes in order".into()
        }
        _ if wb.on() => format!(
            "on: {} writes answered before the server had them, {} of them failed there, {} \
             in flight; {}",
            wb.counters.answered_early.load(Ordering::Relaxed),
            wb.counters.failed_later.load(Ordering::Relaxed),
            wb.in_flight(),
            create_behind(&client.spares, conn),
        ),
        _ if co.fixer().is_some() => "off (the writeback cache)".into(),
        _ => "off (every write() waits for the server; `mount --writes behind` to change)".into(),
    };
    let ownership = match conn.hello.id_mapping {
        IdMapping::Squash => "squash (every file appears to be the mount owner's)",
        IdMapping::Passthrough => "passthrough (host ids as they are)",
        IdMapping::Mapped => "mapped (the server's uid/gid table)",
    };
    let sent: Vec<String> = conn
        .stats
        .sent()
        .into_iter()
        .map(|(op, n)| format!("{} {n}", format!("{op:?}").to_uppercase()))
        .collect();
    let report = format!(
        "mount: {mp}\nserver: {}{}\nconnection: {} ({} reconnects, {} requests sent again, \
         {} failed)\nownership: {ownership}\ncaching: {caching}\n\
         unwatched nodes: {unwatched}\npushes received: {}\ninvalidations applied: {}\n\
         invalidations not needed (the kernel held nothing since the last): {}\n\
         invalidations applied again once the kernel had made the node: {}\n\
         host events: {events}\nrequests sent: {}\nentries listed ahead of lookups: {}\n\
         directories listed ahead at once, at most: {}\n\
         partly written page runs dropped: {}\n\
         reads answered from what this mount wrote: {}\n\
         blocked locks granted at once on a release through this or another mount: {}\n\
         io_uring: {}\n\
         write-behind: {write_behind}\n{writeback}",
        conn.peer,
        if conn.hello.read_only {
            " (read-only export)"
        } else {
            ""
        },
        conn.state(),
        conn.stats.reconnects.load(Ordering::Relaxed),
        conn.stats.resent.load(Ordering::Relaxed),
        conn.stats.failed.load(Ordering::Relaxed),
        co.counters.pushes.load(Ordering::Relaxed),
        co.counters.invalidations.load(Ordering::Relaxed),
        co.counters.invalidations_unneeded.load(Ordering::Relaxed),
        co.counters.invalidations_retried.load(Ordering::Relaxed),
        sent.join(", "),
        co.counters.listed.load(Ordering::Relaxed),
        co.counters.listing_most.load(Ordering::Relaxed),
        co.counters.partial_pages_dropped.load(Ordering::Relaxed),
        co.counters.reads_from_written_files.load(Ordering::Relaxed),
        co.counters
            .lock_waits_ended_by_release
            .load(Ordering::Relaxed),
        crate::fuse::io_uring::status(&client.io_uring),
    );
    s.write_all(report.as_bytes())
}

/// Asks the mount process of `mountpoint` for its report.
pub fn query(mountpoint: &Path) -> io::Result<String> {
    let mut s = crate::control::connect(mountpoint)?;
    // A mount process of an earlier version reads nothing and answers at once.
    let _ = s.write_all(b"status\n");
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

/// The create-behind part of the write-behind line (write/spares.rs).
fn create_behind(s: &Spares, conn: &Connection) -> String {
    if !s.on() {
        return "file creations wait for the server (`mount --writes create-behind` to change)"
            .into();
    };
    if !conn.grants(tether_proto::handshake::features::SPARE_FILES) {
        return "file creations wait for the server (it makes no spare files)".into();
    }
    format!(
        "{} file creations answered with spare files, {} of those failed there, {} named \
         again after a reconnect, {} spares made, {} at hand",
        s.counters.answered_early.load(Ordering::Relaxed),
        s.counters.failed_later.load(Ordering::Relaxed),
        s.counters.named_again.load(Ordering::Relaxed),
        s.counters.made.load(Ordering::Relaxed),
        s.held(),
    )
}
