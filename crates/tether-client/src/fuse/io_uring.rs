//! `tether mount --io-uring`: kernel requests through FUSE over io_uring, one queue per
//! CPU, so a request is served by a thread on the CPU of its caller (the protocol is in
//! vendor/fuser/src/uring.rs). On this machine a trip into the client costs about 29 us
//! when the kernel wakes a `/dev/fuse` reader on the other CPU and 8 us on the caller's
//! (bench/journal/2026-11-25-fewer-wakeups-write-descriptors.md, 2026-11-26-io-uring-opt-in.md).

use std::io;
use std::sync::{Arc, OnceLock};

use fuser::UringStats;

/// The fuse module's switch: the kernel offers io_uring at FUSE_INIT only while it is on.
const PARAM: &str = "/sys/module/fuse/parameters/enable_uring";

/// Ring entries per CPU, all registered at the start (vendor/fuser/src/uring.rs says why):
/// a blocked lock waiter holds one until it is granted, so this many waiters on one CPU
/// hold up that CPU's other requests. Each has a payload buffer of the largest request
/// (1 MiB): address space only, touched as far as requests use it, and the kernel hands
/// out the entry freed last first. Where the 256 MiB a CPU are refused (strict
/// overcommit), the mount goes on through `/dev/fuse`.
pub const DEPTH: u16 = 256;

/// Makes the kernel offer io_uring (turning the module parameter on, which only lets FUSE
/// servers that ask use it); returns the ring entries per CPU.
pub fn prepare() -> io::Result<u16> {
    let on = std::fs::read_to_string(PARAM).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("--io-uring: this kernel has no FUSE over io_uring ({PARAM}: {e})"),
        )
    })?;
    if on.trim() != "Y" {
        std::fs::write(PARAM, "Y").map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("--io-uring: cannot turn on {PARAM} (needs root): {e}"),
            )
        })?;
        tracing::info!("turned on {PARAM}");
    }
    Ok(DEPTH)
}

/// Records whether FUSE_INIT agreed on io_uring (in `agreed`), for `tether status`.
pub fn report(agreed: &OnceLock<Arc<UringStats>>, stats: Option<Arc<UringStats>>) {
    match stats {
        Some(s) => {
            let _ = agreed.set(s);
        }
        None => {
            tracing::warn!(
                "--io-uring: not in use (the kernel did not offer it at FUSE_INIT, or its \
                 rings could not be made: see above); requests come through /dev/fuse"
            )
        }
    }
}

/// The status line.
pub fn status(agreed: &OnceLock<Arc<UringStats>>) -> String {
    use std::sync::atomic::Ordering::Relaxed;
    match agreed.get() {
        Some(s) => describe(
            s.requests.load(Relaxed),
            s.queues.load(Relaxed),
            s.failed.load(Relaxed),
        ),
        None => "off (/dev/fuse)".into(),
    }
}

/// The status line of an agreed io_uring: a mount whose queue threads all ended after
/// serving or failing (the kernel refused or ended their commands) says so instead of
/// "on". (None serving and nothing done yet: they are starting.)
fn describe(requests: u64, queues: u64, failed: u64) -> String {
    if queues == 0 && requests + failed > 0 {
        format!(
            "agreed, but no queue thread is serving any more ({requests} requests came \
             through io_uring, {failed} failed; the log says why)"
        )
    } else {
        format!("on: {requests} requests through {queues} queues, {failed} failed")
    }
}

#[cfg(test)]
mod status_tests {
    use super::describe;

    #[test]
    fn a_mount_whose_queues_all_ended_does_not_say_on() {
        assert_eq!(
            describe(5, 2, 0),
            "on: 5 requests through 2 queues, 0 failed"
        );
        assert!(describe(5, 0, 3).starts_with("agreed, but no queue thread is serving"));
        assert!(describe(0, 0, 1).starts_with("agreed, but no queue thread is serving"));
        assert!(describe(0, 0, 0).starts_with("on: "), "still starting");
    }
}
