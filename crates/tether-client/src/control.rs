//! The mount process's control socket, a Unix socket named after its mount point: where it
//! is, connecting to it, and the request line a client writes first (`status` for the
//! report, status.rs; `sync` for a barrier, sync.rs).

use std::io::{self, Read};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where the status socket of `mountpoint` lives.
pub fn socket_path(mountpoint: &Path) -> PathBuf {
    let canonical = canonical_mountpoint(mountpoint);
    // FNV-1a: short, stable, and socket paths are limited to 108 bytes.
    let mut h: u64 = 0xcbf29ce484222325;
    for b in canonical.as_os_str().as_encoded_bytes() {
        h = (h ^ *b as u64).wrapping_mul(0x100000001b3);
    }
    // SAFETY: geteuid has no preconditions.
    let dir = if unsafe { libc::geteuid() } == 0 {
        PathBuf::from("/run/tether")
    } else {
        std::env::temp_dir().join(format!("tether-{}", unsafe { libc::geteuid() }))
    };
    dir.join(format!("mount-{h:016x}.sock"))
}

/// The mount point's canonical path, found without asking the mount itself where it can
/// be: canonicalizing the whole path stats the mount's root, which waits for the server
/// when the kernel's copy of its attributes has lapsed, so a `tether status` of a mount
/// whose server hangs would hang too. The parent's canonical path and the last name are the
/// same path unless the name is a symlink (readlink answers that without the mount).
fn canonical_mountpoint(mountpoint: &Path) -> PathBuf {
    let whole = || std::fs::canonicalize(mountpoint).unwrap_or_else(|_| mountpoint.to_path_buf());
    let (Some(parent), Some(name)) = (mountpoint.parent(), mountpoint.file_name()) else {
        return whole(); // "/", or a path ending in ".." or "."
    };
    if std::fs::read_link(mountpoint).is_ok() {
        return whole();
    }
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    match std::fs::canonicalize(parent) {
        Ok(p) => p.join(name),
        Err(_) => whole(),
    }
}

/// How long the mount process waits for a request line before it takes the connection
/// for a `tether status` of a version that wrote none and answers with the report.
pub(crate) const REQUEST_WAIT: Duration = Duration::from_millis(500);

/// Connects to the status socket of the mount process of `mountpoint`.
pub(crate) fn connect(mountpoint: &Path) -> io::Result<UnixStream> {
    UnixStream::connect(socket_path(mountpoint)).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!(
                "{} is not served by a running `tether mount` ({e})",
                mountpoint.display()
            ),
        )
    })
}

/// Reads the request line a status socket client sends (`status`, `sync`), waiting at most
/// [`REQUEST_WAIT`]: a `tether status` of an earlier version sends nothing, and gets the
/// report (an empty line).
pub(crate) fn read_request(s: &mut UnixStream) -> String {
    let _ = s.set_read_timeout(Some(REQUEST_WAIT));
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while line.len() < 64 {
        match s.read(&mut byte) {
            Ok(1) if byte[0] != b'\n' => line.push(byte[0]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&line).trim().to_string()
}
