//! Mounting and unmounting the FUSE file system.

use std::ffi::CString;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;

use fuser::{Config, MountOption, Session, SessionACL, SessionUnmounter};

use crate::client::Client;
use crate::fuse::fs::{CachePolicy, TetherFs};
use crate::fuse::locks::Locks;
use crate::invalidate::fixer::AttrFixer;
use crate::invalidate::host_events::Replayer;
use crate::restore::Restore;
use crate::sys::mount_dir::MountDir;
use crate::write::flusher::{Flusher, FLUSH_INTERVAL};

#[derive(Debug, Clone)]
pub struct MountOptions {
    pub cache: CachePolicy,
    /// Shown as the source in /proc/mounts.
    pub fs_name: String,
    /// FUSE worker threads reading from /dev/fuse (handlers never block, so few are needed).
    pub threads: usize,
    pub read_only: bool,
    /// Raise inotify events in the guest for host changes (needs HOST_EVENTS granted).
    pub watch_events: bool,
    /// Take flock, POSIX and OFD locks on the host's files (needs root, for fanotify); off,
    /// they are local to this guest's kernel.
    pub host_locks: bool,
    /// Serve kernel requests through FUSE over io_uring, one queue per CPU (fuse/io_uring.rs).
    pub io_uring: bool,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            cache: CachePolicy::default(),
            fs_name: "tether".into(),
            threads: 2,
            read_only: false,
            watch_events: true,
            host_locks: true,
            io_uring: false,
        }
    }
}

/// A mounted file system; `run` serves it until it is unmounted.
pub struct Mounted {
    session: Session<TetherFs>,
    dir: Arc<MountDir>,
}

/// Unmounts from another thread; the writeback threads' descriptors are out of the way
/// first (an open one would make the unmount fail with EBUSY).
pub struct Unmounter {
    inner: SessionUnmounter,
    dir: Arc<MountDir>,
}

impl Unmounter {
    pub fn unmount(&mut self) -> io::Result<()> {
        self.dir.pause();
        let r = self.inner.unmount();
        if r.is_err() {
            self.dir.resume();
        }
        r
    }
}

/// How far the kernel reads ahead of a sequential reader, in KiB: as much as one READ
/// carries (max_write, and so max_pages, is 1 MiB). The kernel offers FUSE only its
/// default of 128 KiB, which takes eight round trips per MiB read.
const READAHEAD_KB: u32 = 1024;

/// Sets the mount's readahead (its backing device's `read_ahead_kb` in sysfs; needs root).
/// The device number comes from the mount table: a stat of the mount point would be a
/// request to this very file system, which serves none yet.
fn raise_readahead(mountpoint: &Path) {
    let Ok(want) = mountpoint.canonicalize() else {
        return;
    };
    let Ok(Some(m)) = tether_sys::mountinfo::mount_at(&want) else {
        return;
    };
    let knob = format!("/sys/class/bdi/{}/read_ahead_kb", m.device);
    if let Err(e) = std::fs::write(&knob, READAHEAD_KB.to_string()) {
        tracing::debug!("cannot raise the readahead ({knob}): {e}");
    }
}

impl Mounted {
    /// Mounts; `co` must be the coherence state whose `on_push` receives the connection's
    /// pushes (see `Connection::start`).
    pub fn new(
        client: &Arc<Client>,
        mountpoint: &Path,
        opts: &MountOptions,
    ) -> io::Result<Mounted> {
        let (conn, co) = (client.conn.clone(), client.co.clone());
        if conn.hello.features & tether_proto::handshake::features::PUSH_INVALIDATE != 0 {
            co.enable();
        }
        let read_only = opts.read_only || conn.hello.read_only;
        let mut options = vec![
            MountOption::FSName(opts.fs_name.clone()),
            MountOption::Subtype("tether".into()),
            // The kernel checks permissions against the attributes, as a local file system.
            MountOption::DefaultPermissions,
            MountOption::NoDev,
            // atime is not kept coherent, and a relatime update after every read would make
            // the next stat go to the server.
            MountOption::NoAtime,
        ];
        if read_only {
            options.push(MountOption::RO);
        }
        let mut config = Config::default();
        config.mount_options = options;
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        config.acl = if root {
            // Every guest user may use the mount; default_permissions keeps them apart.
            SessionACL::All
        } else {
            SessionACL::Owner
        };
        config.n_threads = Some(opts.threads.max(1));
        config.clone_fd = true;
        if opts.io_uring {
            config.io_uring_depth = crate::fuse::io_uring::prepare()?;
        }
        // Replays need a writable mount: the kernel refuses them on a read-only one.
        let replayer = (opts.watch_events
            && !read_only
            && conn.hello.features & tether_proto::handshake::features::HOST_EVENTS != 0)
            .then(|| -> io::Result<_> { Ok(Arc::new(Replayer::new(&mountpoint.canonicalize()?))) })
            .transpose()?;
        if let Some(r) = &replayer {
            r.set_server(conn.clone());
        }
        // open_by_handle_at needs CAP_DAC_READ_SEARCH: without it, no writeback cache.
        let dir = MountDir::new(mountpoint.to_path_buf());
        let fixer = root.then(|| Arc::new(AttrFixer::new(conn.clone(), dir.clone())));
        // Host locks need fanotify to see closes of locked files (fuse/locks.rs), so root; a
        // mount without them keeps locks local to this guest, as before.
        let locks = (opts.host_locks && root)
            .then(|| Locks::start(conn.clone(), dir.clone()))
            .transpose()?;
        let fs = TetherFs::new(
            conn.clone(),
            opts.cache,
            co.clone(),
            replayer.clone(),
            fixer.clone(),
            locks.clone(),
            (client.write_behind.clone(), client.spares.clone()),
        );
        let known = fs.known();
        let pages = fs.partial_pages();
        let prefetch = fs.prefetch();
        conn.set_restorer(Arc::new(Restore::new(
            known.clone(),
            co.clone(),
            locks.as_ref().map(|l| l.held()),
            client.spares.clone(),
        )));
        let session = Session::new(fs, mountpoint, &config)?;
        if root {
            raise_readahead(mountpoint);
        }
        if opts.io_uring {
            crate::fuse::io_uring::report(&client.io_uring, session.io_uring());
        }
        let fuse_dev = session.as_fd().try_clone_to_owned().ok();
        if let Some(f) = &fixer {
            f.attach(session.notifier(), known.clone());
        }
        if let Some(l) = &locks {
            l.attach(session.notifier(), known.clone(), co.clone());
        }
        co.start_applier(session.notifier(), replayer, fuse_dev);
        pages.start(session.notifier(), co.clone());
        prefetch.start(dir.clone(), known.clone());
        if co.fixer().is_some() {
            Flusher::start(dir.clone(), FLUSH_INTERVAL);
        }
        Ok(Mounted { session, dir })
    }

    /// A handle that unmounts from another thread (a signal handler thread).
    pub fn unmounter(&mut self) -> Unmounter {
        Unmounter {
            inner: self.session.unmount_callable(),
            dir: self.dir.clone(),
        }
    }

    /// Serves kernel requests until the file system is unmounted.
    pub fn run(self) -> io::Result<()> {
        let dir = self.dir.clone();
        let r = self.session.run();
        dir.gone();
        r
    }
}

/// Unmounts `mountpoint`; `lazy` detaches it even while files are open.
pub fn unmount(mountpoint: &Path, lazy: bool) -> io::Result<()> {
    let c = CString::new(mountpoint.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))?;
    let flags = if lazy { libc::MNT_DETACH } else { 0 };
    retrying_while_busy(|| {
        // SAFETY: c is a valid C string.
        if unsafe { libc::umount2(c.as_ptr(), flags) } == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    })
}

/// Runs `unmount` again while it fails with EBUSY, for up to a second. The mount's own
/// flusher holds a descriptor for the moment of each sync (invalidate/fixer.rs), a file may have
/// been closed a moment ago, and the client's helpers (listers, locks) read it: EBUSY for
/// that long is not "files open".
pub fn retrying_while_busy(mut unmount: impl FnMut() -> io::Result<()>) -> io::Result<()> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    loop {
        match unmount() {
            Err(e)
                if e.raw_os_error() == Some(libc::EBUSY)
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            r => return r,
        }
    }
}

/// What is mounted at `mountpoint` now, read from the mount table without touching the
/// mount itself (a dead or hung FUSE mount answers nothing). `None`: not a mount point.
pub fn mounted_at(mountpoint: &Path) -> io::Result<Option<tether_sys::mountinfo::MountEntry>> {
    let target = tether_sys::mountinfo::canonical_without_last(mountpoint)?;
    if let Some(m) = tether_sys::mountinfo::mount_at(&target)? {
        return Ok(Some(m));
    }
    // A symlink to a mount point: follow it (this stats what is mounted there).
    match std::fs::symlink_metadata(&target) {
        Ok(meta) if meta.file_type().is_symlink() => {
            tether_sys::mountinfo::mount_at(&std::fs::canonicalize(&target)?)
        }
        _ => Ok(None),
    }
}

/// Why a mount point cannot take a new mount, or what the user should know before.
#[derive(Debug, PartialEq, Eq)]
pub enum MountPointCheck {
    /// An empty directory: fine.
    Ready,
    /// A directory with files in it, which the mount hides until it is unmounted.
    NotEmpty,
}

/// Checks `mountpoint` before mounting: a Tether mount there already (alive or with its
/// client gone) is refused with what to do; a non-directory is refused; a directory with
/// files in it is reported, for a warning.
pub fn check_mount_point(mountpoint: &Path) -> io::Result<MountPointCheck> {
    let shown = mountpoint.display();
    if let Some(m) = mounted_at(mountpoint)?.filter(|m| m.is_tether()) {
        let err = |msg: String| Err(io::Error::new(io::ErrorKind::AlreadyExists, msg));
        return match responds(mountpoint) {
            Some(Err(e)) if e.raw_os_error() == Some(libc::ENOTCONN) => err(format!(
                "{shown} is a Tether mount whose client has gone (transport endpoint is not \
                 connected): run `tether unmount {shown}` first"
            )),
            Some(_) => err(format!(
                "{shown} is already a Tether mount of {}: unmount it first (`tether unmount \
                 {shown}`), or choose another mount point",
                m.source.strip_prefix("tether:").unwrap_or(&m.source)
            )),
            None => err(format!(
                "{shown} is already a Tether mount of {}, and it does not answer: run \
                 `tether unmount --lazy {shown}` first",
                m.source.strip_prefix("tether:").unwrap_or(&m.source)
            )),
        };
    }
    let meta = std::fs::metadata(mountpoint).map_err(|e| {
        let msg = if e.kind() == io::ErrorKind::NotFound {
            format!("mount point {shown} does not exist (mkdir it first)")
        } else {
            format!("cannot use {shown} as a mount point: {e}")
        };
        io::Error::new(e.kind(), msg)
    })?;
    if !meta.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("mount point {shown} is not a directory"),
        ));
    }
    let mut entries = std::fs::read_dir(mountpoint)?;
    Ok(if entries.next().is_some() {
        MountPointCheck::NotEmpty
    } else {
        MountPointCheck::Ready
    })
}

/// The status of `path`, or None if it takes longer than two seconds (a hung mount): the
/// stat goes on in a thread of its own, which is left behind.
fn responds(path: &Path) -> Option<io::Result<std::fs::Metadata>> {
    let (tx, rx) = std::sync::mpsc::channel();
    let path = path.to_path_buf();
    std::thread::spawn(move || {
        let _ = tx.send(std::fs::metadata(&path));
    });
    rx.recv_timeout(std::time::Duration::from_secs(2)).ok()
}
