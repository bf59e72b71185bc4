//! With the writeback cache: the mount synced every few milliseconds, so that what the
//! guest writes reaches the host soon even through a descriptor that stays open.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use crate::sys::mount_dir::MountDir;

/// Syncs the mount every `interval`, so that data written through a descriptor that stays
/// open reaches the server within about that time instead of the kernel's 30 s writeback
/// expiry. syncfs costs next to nothing when nothing is dirty.
pub struct Flusher;

/// How often the flusher syncs a mount by default.
pub const FLUSH_INTERVAL: Duration = Duration::from_millis(20);

impl Flusher {
    /// Starts the thread; it ends when the mount is gone.
    pub fn start(dir: Arc<MountDir>, interval: Duration) {
        let spawned = std::thread::Builder::new()
            .name("tether-flush".into())
            .spawn(move || loop {
                std::thread::sleep(interval);
                if dir.is_gone() {
                    return;
                }
                // SAFETY: syncfs on a descriptor that is open for the call.
                let r = dir.with(|root| unsafe { libc::syncfs(root.as_raw_fd()) });
                match r {
                    Some(0) | None => {}
                    Some(_) => {
                        let e = io::Error::last_os_error();
                        if matches!(e.raw_os_error(), Some(libc::ENOTCONN | libc::ENODEV)) {
                            return;
                        }
                        tracing::warn!("syncing the mount failed: {e}");
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::warn!("no flusher thread: {e}");
        }
    }
}
