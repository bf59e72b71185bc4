//! The session's start and end: INIT asks the kernel for what the mount uses (readdirplus,
//! parallel directory operations, KILLPRIV_V2, locks, and the writeback cache when a fixer
//! keeps it coherent); DESTROY waits for the writes answered early and shuts the connection.

use fuser::{InitFlags, KernelConfig};

use super::fs::TetherFs;

impl TetherFs {
    pub(super) fn on_init(&mut self, config: &mut KernelConfig) -> std::io::Result<()> {
        // Not FUSE_ATOMIC_O_TRUNC: in no-open mode there is no OPEN to carry O_TRUNC, so the
        // kernel must truncate with SETATTR itself.
        // Always readdirplus (no _AUTO heuristic): a directory walk then fills the dentry
        // and attribute caches with one trip per page of entries, not one LOOKUP per name.
        let mut wanted = InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_ASYNC_DIO
            | InitFlags::FUSE_BIG_WRITES;
        // KILLPRIV_V2 on every mount: the kernel marks the superblock SB_NOSEC and asks for
        // `security.capability` once per file instead of before every write; the server
        // clears set-user-ID itself (after writes by non-root callers, and on SETATTR bit
        // KILL_SUIDGID). Written-through `dd` runs about 10% faster with it.
        wanted |= InitFlags::FUSE_HANDLE_KILLPRIV_V2;
        // The writeback cache only with pushed invalidations (the kernel would otherwise
        // never learn a host-side size or mtime) and a fixer to apply them (invalidate/fixer.rs).
        let writeback = InitFlags::FUSE_WRITEBACK_CACHE | InitFlags::FUSE_HANDLE_KILLPRIV_V2;
        let fixer = self.fixer.clone().filter(|_| {
            self.cache.writes.asks_writeback_cache()
                && self.co.enabled()
                && config.capabilities().contains(writeback)
        });
        if fixer.is_some() {
            wanted |= writeback;
        }
        // Locks go to the host's files (fuse/locks.rs); flock too, not emulated with POSIX locks.
        if self.locks.is_some() {
            wanted |= InitFlags::FUSE_POSIX_LOCKS | InitFlags::FUSE_FLOCK_LOCKS;
        }
        let supported = wanted & config.capabilities();
        let _ = config.add_capabilities(supported);
        self.killpriv = supported.contains(InitFlags::FUSE_HANDLE_KILLPRIV_V2);
        if let Some(f) = fixer {
            self.co.set_fixer(f);
        }
        let _ = config.set_max_write(1 << 20);
        let _ = config.set_max_background(64);
        Ok(())
    }

    pub(super) fn on_destroy(&mut self) {
        // Writes answered early reach the server before the connection goes (a lost server
        // gets as long as any request waits for it).
        let left = self.write_behind.drain(self.conn.request_timeout());
        if left > 0 {
            tracing::error!("{left} write(s) answered early never reached the server");
        }
        for (node, e) in self.write_behind.unreported() {
            tracing::error!(%node, "a write answered early failed ({e:?}) and no later write or fsync of the file was there to report it");
        }
        self.conn.shut_down();
    }
}
