//! The one rule for a Unix socket's file, wherever Tether makes one at a path (a server's
//! `--listen unix:PATH`, a mount's status socket): only a stale socket, one nobody listens
//! on any more, is ever replaced or removed. Anything else at the path (a regular file, a
//! directory, a symlink, a FIFO, a live socket) is an error that names the path and says
//! what is there: a mistyped path must never cost the user a file.

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::UnixStream;
use std::path::Path;

/// What is at `path`, in words, for an error message.
fn describe(t: std::fs::FileType) -> &'static str {
    if t.is_file() {
        "a regular file"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_symlink() {
        "a symbolic link"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_block_device() || t.is_char_device() {
        "a device"
    } else {
        "something that is not a socket"
    }
}

/// Makes `path` free for a new socket: nothing there is fine, a stale socket is removed,
/// a socket someone listens on is `AddrInUse`, and anything else is `AlreadyExists`
/// (nothing is removed).
pub fn clear_stale_socket(path: &Path) -> io::Result<()> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if !meta.file_type().is_socket() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!(
                "{} is {}, not a socket: refusing to replace it (choose another path, or \
                 remove it yourself if it is not needed)",
                path.display(),
                describe(meta.file_type())
            ),
        ));
    }
    match UnixStream::connect(path) {
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!("{} is in use by a running server", path.display()),
        )),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => remove_if_same(path, &meta),
        Err(e) => Err(io::Error::new(
            e.kind(),
            format!(
                "{} is a socket that cannot be checked ({e}): not replacing it",
                path.display()
            ),
        )),
    }
}

/// The socket file this process made at `path`, identified by device and inode, so that
/// removing it later never removes something another process put there meanwhile.
#[derive(Debug)]
pub struct OwnSocketFile {
    path: std::path::PathBuf,
    id: Option<(u64, u64)>,
}

impl OwnSocketFile {
    /// Records the socket just bound at `path`.
    pub fn new(path: &Path) -> OwnSocketFile {
        let id = std::fs::symlink_metadata(path)
            .ok()
            .filter(|m| m.file_type().is_socket())
            .map(|m| (m.dev(), m.ino()));
        OwnSocketFile {
            path: path.to_path_buf(),
            id,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the file if it is still the socket this process made.
    pub fn remove(&self) {
        let Some(id) = self.id else { return };
        if let Ok(m) = std::fs::symlink_metadata(&self.path) {
            if m.file_type().is_socket() && (m.dev(), m.ino()) == id {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }
}

/// Removes `path` if it is still the file `meta` describes.
fn remove_if_same(path: &Path, meta: &std::fs::Metadata) -> io::Result<()> {
    let now = std::fs::symlink_metadata(path)?;
    if (now.dev(), now.ino()) != (meta.dev(), meta.ino()) || !now.file_type().is_socket() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!(
                "{} changed while it was checked: not replacing it",
                path.display()
            ),
        ));
    }
    std::fs::remove_file(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    #[test]
    fn only_a_stale_socket_is_removed() {
        let dir = tempfile_dir();
        let p = dir.join("x");
        // Nothing there.
        clear_stale_socket(&p).unwrap();
        // A regular file is kept, and the error says what it is.
        std::fs::write(&p, b"precious").unwrap();
        let e = clear_stale_socket(&p).unwrap_err();
        assert!(e.to_string().contains("a regular file"), "{e}");
        assert_eq!(std::fs::read(&p).unwrap(), b"precious");
        std::fs::remove_file(&p).unwrap();
        // A directory, a symlink.
        std::fs::create_dir(&p).unwrap();
        let e = clear_stale_socket(&p).unwrap_err();
        assert!(e.to_string().contains("a directory"), "{e}");
        std::fs::remove_dir(&p).unwrap();
        std::os::unix::fs::symlink("/nonexistent", &p).unwrap();
        let e = clear_stale_socket(&p).unwrap_err();
        assert!(e.to_string().contains("a symbolic link"), "{e}");
        std::fs::remove_file(&p).unwrap();
        // A live socket is in use; once its listener is gone it is stale and removed.
        let l = UnixListener::bind(&p).unwrap();
        let e = clear_stale_socket(&p).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AddrInUse);
        drop(l);
        clear_stale_socket(&p).unwrap();
        assert!(std::fs::symlink_metadata(&p).is_err());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn own_socket_file_leaves_a_replacement_alone() {
        let dir = tempfile_dir();
        let p = dir.join("s");
        let l = UnixListener::bind(&p).unwrap();
        let own = OwnSocketFile::new(&p);
        drop(l);
        std::fs::remove_file(&p).unwrap();
        std::fs::write(&p, b"someone else's").unwrap();
        own.remove();
        assert_eq!(std::fs::read(&p).unwrap(), b"someone else's");
        std::fs::remove_dir_all(dir).unwrap();
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!(
            "tether-socket-file-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
