//! `tether sync MOUNTPOINT`: a freshness barrier. When it returns, every change made on the
//! host (or through another mount) that completed before it started is visible through the
//! mount (docs/coherence.md, "A barrier: tether sync"; protocol.md §18).
//!
//! The command asks the mount process over its control socket (control.rs) with the line
//! `sync`. The mount process sends SYNC to the server, whose reply comes after the pushes of
//! every change the server's watcher had queued when it read the request; then it waits
//! until its invalidation thread has applied every push received before that reply
//! ([`Coherence::barrier`]), and answers `ok MICROS`, maybe followed by `note: ...` lines,
//! or `error: ...`.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use tether_proto::handshake::features;
use tether_proto::{Caller, Reply, Request, WireErrno};

use crate::cache::coherence::Coherence;
use crate::rpc::Connection;

/// The status socket's request line for a barrier.
pub const REQUEST: &str = "sync";

/// Longest `sync` waits for the mount process's answer (which itself gives up after the
/// mount's `--timeout` for the server, and as long again for its own invalidations).
const ANSWER_WAIT: Duration = Duration::from_secs(600);

/// What the mount process answers for a mount that does not get pushed invalidations.
pub const NO_PUSH: &str = "this mount revalidates on a timer (--no-push): sync cannot promise \
                           anything";

/// A barrier that held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Synced {
    /// How long the mount process took, from the request to the last invalidation applied.
    pub took: Duration,
    /// What the barrier does not cover (parts of the tree the server could not watch).
    pub notes: Vec<String>,
}

/// The barrier, in the mount process: SYNC to the server, then every push received before
/// its reply applied to the kernel. Returns how long it took and notes, or why it cannot
/// promise anything.
pub fn barrier(conn: &Connection, co: &Coherence) -> Result<Synced, String> {
    let start = Instant::now();
    if !conn.asks_for(features::PUSH_INVALIDATE) {
        return Err(NO_PUSH.into());
    }
    if !conn.grants(features::PUSH_INVALIDATE) {
        return Err(
            "the server does not watch this export (it cannot watch its root), so \
                    this mount revalidates on a timer: sync cannot promise anything"
                .into(),
        );
    }
    if !co.enabled() {
        return Err("the mount is still starting: try again".into());
    }
    match conn.call_wait(Caller::default(), &Request::Sync) {
        Ok(Reply::Empty) => {}
        Ok(other) => return Err(format!("the server answered SYNC with {other:?}")),
        Err(e) => return Err(refused(e)),
    }
    let limit = conn.request_timeout();
    if !co.barrier(limit) {
        return Err(format!(
            "the mount did not apply the server's invalidations within {:.0} s",
            limit.as_secs_f64()
        ));
    }
    let mut notes = Vec::new();
    let (_, unwatched) = co.watch_counts();
    if unwatched > 0 {
        notes.push(format!(
            "{unwatched} nodes the server could not watch (its inotify watch limit) fall back \
             to revalidation on a timer: sync does not cover them"
        ));
    }
    Ok(Synced {
        took: start.elapsed(),
        notes,
    })
}

/// Says why the server's answer to SYNC is no barrier.
fn refused(e: WireErrno) -> String {
    if e == WireErrno::ENOSYS {
        "the server is too old for sync (it does not know the SYNC request): upgrade tether \
         on the host"
            .into()
    } else if e == WireErrno::EIO {
        "the server did not answer SYNC (the connection is down, or the mount's --timeout \
         passed)"
            .into()
    } else {
        format!("the server refused SYNC: {e}")
    }
}

/// Answers a `sync` request on the status socket (in the mount process; on a thread of its
/// own, the barrier may wait for the server).
pub(crate) fn answer(mut s: UnixStream, conn: &Connection, co: &Coherence) -> io::Result<()> {
    s.set_read_timeout(None)?;
    let text = match barrier(conn, co) {
        Ok(synced) => {
            let mut t = format!("ok {}\n", synced.took.as_micros());
            for n in &synced.notes {
                t += &format!("note: {n}\n");
            }
            t
        }
        Err(e) => format!("error: {e}\n"),
    };
    s.write_all(text.as_bytes())
}

/// `tether sync MOUNTPOINT`: asks the mount process of `mountpoint` (or of the mount that
/// holds the directory `mountpoint`) for a barrier and waits until it holds. An error says
/// why there is none (a `--no-push` mount, a server or mount process too old for it, a
/// server that does not answer).
pub fn sync(mountpoint: &Path) -> io::Result<Synced> {
    let mut s = crate::control::connect(&mount_point_of(mountpoint))?;
    s.write_all(format!("{REQUEST}\n").as_bytes())?;
    s.set_read_timeout(Some(ANSWER_WAIT))?;
    let mut answer = String::new();
    s.read_to_string(&mut answer)?;
    parse_answer(&answer, mountpoint)
}

/// The nearest of `path` and its parents that has a mount process's status socket, or
/// `path` itself if none has.
fn mount_point_of(path: &Path) -> std::path::PathBuf {
    let Ok(canonical) = std::fs::canonicalize(path) else {
        return path.to_path_buf();
    };
    (canonical.ancestors())
        .find(|dir| crate::control::socket_path(dir).exists())
        .map_or_else(|| path.to_path_buf(), Path::to_path_buf)
}

fn parse_answer(answer: &str, mountpoint: &Path) -> io::Result<Synced> {
    let mut lines = answer.lines();
    let first = lines.next().unwrap_or("");
    if let Some(micros) = first.strip_prefix("ok ") {
        let micros: u64 = micros.trim().parse().map_err(|_| {
            io::Error::new(io::ErrorKind::InvalidData, format!("bad answer {first:?}"))
        })?;
        let notes = lines
            .filter_map(|l| l.strip_prefix("note: "))
            .map(String::from)
            .collect();
        return Ok(Synced {
            took: Duration::from_micros(micros),
            notes,
        });
    }
    if let Some(why) = first.strip_prefix("error: ") {
        return Err(io::Error::other(format!(
            "cannot sync {}: {why}",
            mountpoint.display()
        )));
    }
    if first.starts_with("mount: ") {
        // The report: a mount process that knows no requests.
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!(
                "the mount process of {} is too old for sync: mount it again with this version \
                 of tether",
                mountpoint.display()
            ),
        ));
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidData,
        format!(
            "unexpected answer from the mount process of {}: {first:?}",
            mountpoint.display()
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_parsed_and_errors_say_why() {
        let mp = Path::new("/mnt/src");
        assert_eq!(
            parse_answer("ok 412\n", mp).unwrap(),
            Synced {
                took: Duration::from_micros(412),
                notes: vec![],
            }
        );
        let with_note = parse_answer("ok 7\nnote: 3 nodes ...\n", mp).unwrap();
        assert_eq!(with_note.notes, vec!["3 nodes ...".to_string()]);
        let e = parse_answer(&format!("error: {NO_PUSH}\n"), mp).unwrap_err();
        assert_eq!(e.to_string(), format!("cannot sync /mnt/src: {NO_PUSH}"));
        let e = parse_answer("mount: /mnt/src\nserver: unix:/s\n", mp).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::Unsupported);
        assert!(e.to_string().contains("too old"), "{e}");
        assert!(parse_answer("", mp).is_err());
        assert!(parse_answer("ok x\n", mp).is_err());
    }

    #[test]
    fn a_server_without_sync_is_reported_as_too_old() {
        assert!(refused(WireErrno::ENOSYS).contains("too old for sync"));
        assert!(refused(WireErrno::EIO).contains("did not answer"));
    }
}
