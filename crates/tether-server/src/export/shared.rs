//! What every session of one export shares: the root, the settings, the host backend, the
//! descriptor budget, and the sessions refused a lock.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tether_proto::WireErrno;

use super::ids::IdMap;
use super::locks::LockWaits;
#[cfg(target_os = "linux")]
use crate::backend::linux::Linux;
use crate::backend::lock_helper::{HelperCommand, LockHelper};
use crate::backend::portable::Portable;
use crate::backend::{sys, Backend};
use crate::nodes::FdBudget;
use crate::watch::Watcher;

/// Which host calls an export is served with (`tether serve --backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackendKind {
    /// Linux's own calls (O_PATH, openat2, statx, OFD locks, renameat2) and inotify with
    /// fanotify: the fastest, and the default on Linux.
    #[cfg(target_os = "linux")]
    #[default]
    Linux,
    /// Only calls macOS has as well (backend/portable.rs), and a watcher that sees what
    /// FSEvents sees (watch/portable.rs): the default elsewhere, and on Linux the way the
    /// macOS code paths are tested.
    #[cfg_attr(not(target_os = "linux"), default)]
    Portable,
}

impl BackendKind {
    /// The names `--backend` takes.
    pub fn parse(s: &str) -> Option<BackendKind> {
        match s {
            #[cfg(target_os = "linux")]
            "linux" => Some(BackendKind::Linux),
            "portable" => Some(BackendKind::Portable),
            _ => None,
        }
    }

    fn open(self, opts: &ExportOptions) -> io::Result<Arc<dyn Backend>> {
        Ok(match self {
            #[cfg(target_os = "linux")]
            BackendKind::Linux => Arc::new(Linux::open().map_err(to_io)?),
            BackendKind::Portable => {
                let host = Portable::new(opts.case_insensitive);
                let helper = opts.lock_helper.as_ref().map(LockHelper::spawn);
                Arc::new(match helper {
                    Some(Ok(helper)) => host.with_lock_helper(helper),
                    Some(Err(e)) => {
                        tracing::warn!(
                            "cannot start the lock helper ({e}): host processes will not see \
                             the guests' byte-range locks"
                        );
                        host
                    }
                    None => host,
                })
            }
        })
    }

    /// A new session's watcher of `export`.
    pub(crate) fn watcher(self, export: &Export) -> io::Result<Box<dyn Watcher>> {
        Ok(match self {
            #[cfg(target_os = "linux")]
            BackendKind::Linux => Box::new(crate::watch::linux::LinuxWatcher::new()?),
            BackendKind::Portable => Box::new(crate::watch::portable::PortableWatcher::new(
                export.host.clone(),
            )?),
        })
    }
}

/// Settings and state shared by every session of one export.
pub struct Export {
    pub root_path: PathBuf,
    root: OwnedFd,
    /// The host's file system calls.
    pub host: Arc<dyn Backend>,
    /// Which ones, and the watcher that goes with them.
    pub backend: BackendKind,
    pub read_only: bool,
    pub budget: Arc<FdBudget>,
    /// Most open file handles one session may hold (a share of the open-file limit, so that
    /// node descriptors and handles together stay below it).
    pub max_handles: usize,
    /// True when the server runs as root and so can create files as the guest's caller.
    pub creds_switch: bool,
    /// How ownership appears to guests and what chown does.
    pub id_map: IdMap,
    pub instance: [u8; 16],
    /// Sessions refused a lock, to be told when another session frees one (locks.rs).
    pub lock_waits: Arc<LockWaits>,
    /// Tether mounts found inside the export and refused (ops/lookup.rs, `refuse_tether_mount`):
    /// each is logged once.
    pub refused_mounts: std::sync::Mutex<std::collections::HashSet<PathBuf>>,
}

#[derive(Debug, Clone, Default)]
pub struct ExportOptions {
    pub read_only: bool,
    /// Most node descriptors held at once (0: derive from the open-file limit).
    pub max_node_fds: usize,
    /// Most open file and directory handles per session (0: derive from the open-file limit).
    pub max_handles: usize,
    pub id_map: IdMap,
    pub backend: BackendKind,
    /// Tests only (portable backend): names are found whatever their case, as on a
    /// case-insensitive host file system (APFS, HFS+, NTFS by default).
    pub case_insensitive: bool,
    /// With the portable backend: how to start the process that holds the guests'
    /// byte-range locks for host processes to see (backend/lock_helper.rs); None: they
    /// do not see them.
    pub lock_helper: Option<HelperCommand>,
}

impl Export {
    pub fn open(path: &Path, opts: &ExportOptions) -> io::Result<Arc<Export>> {
        let canonical = std::fs::canonicalize(path)?;
        if !canonical.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is not a directory", canonical.display()),
            ));
        }
        let cpath = CString::new(canonical.as_os_str().as_encoded_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))?;
        let host = opts.backend.open(opts)?;
        let cwd = cwd_fd(&*host);
        let root = host.open_dir_node(cwd.as_fd(), &cpath).map_err(to_io)?;
        let limit = sys::raise_nofile_limit() as usize;
        let cap = if opts.max_node_fds > 0 {
            opts.max_node_fds
        } else {
            // Half the limit for node descriptors, a quarter for open handles, the rest for
            // sockets, per-request reopens and the server's own needs.
            (limit / 2).clamp(64, 1 << 20)
        };
        let max_handles = if opts.max_handles > 0 {
            opts.max_handles
        } else {
            (limit / 4).clamp(16, 65_536)
        };
        // The kernel already applied the guest's umask; ours must not apply a second one.
        // SAFETY: umask only changes this process's file creation mask.
        unsafe { libc::umask(0) };
        let mut instance = [0u8; 16];
        rand::fill(&mut instance);
        // SAFETY: geteuid has no preconditions.
        let creds_switch = unsafe { libc::geteuid() } == 0;
        Ok(Arc::new(Export {
            root_path: canonical,
            root,
            host,
            backend: opts.backend,
            read_only: opts.read_only,
            budget: FdBudget::new(cap),
            max_handles,
            creds_switch,
            id_map: opts.id_map.clone(),
            instance,
            lock_waits: Arc::default(),
            refused_mounts: Default::default(),
        }))
    }

    /// A fresh O_PATH descriptor of the export root, for a new session's node table.
    pub fn root_fd(&self) -> io::Result<OwnedFd> {
        (self.host.open_dir_node(self.root.as_fd(), c".")).map_err(to_io)
    }
}

fn to_io(e: WireErrno) -> io::Error {
    io::Error::from_raw_os_error(e.to_host())
}

fn cwd_fd(host: &dyn Backend) -> OwnedFd {
    // An fd for "." is only used with absolute paths here; AT_FDCWD would do, but keeping
    // every call on a BorrowedFd keeps one calling convention.
    host.open_dir_node(
        // SAFETY: AT_FDCWD is a valid "descriptor" for *at calls and is never closed.
        unsafe { std::os::fd::BorrowedFd::borrow_raw(libc::AT_FDCWD) },
        c".",
    )
    .expect("the current directory can be opened")
}
