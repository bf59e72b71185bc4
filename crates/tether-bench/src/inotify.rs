//! A guest file watcher, as `tether latency --inotify` and `tether-fsx --guest-watcher` run
//! one: an inotify watch on a
//! directory (through a mount) and the events it reads. The bench's own parser of the
//! kernel's `struct inotify_event` records: it needs only each event's mask and name.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// One event: its mask and the name it is about (empty for the watched directory itself).
pub type Event = (u32, Vec<u8>);

/// An inotify descriptor watching one directory for every kind of event.
pub struct Watch {
    fd: OwnedFd,
}

impl Watch {
    /// Watches `dir` (`IN_ALL_EVENTS`). With `nonblocking`, [`Watch::read`] returns None at
    /// once when nothing is queued; otherwise it waits for an event.
    pub fn new(dir: &Path, nonblocking: bool) -> io::Result<Watch> {
        let flags = libc::IN_CLOEXEC | if nonblocking { libc::IN_NONBLOCK } else { 0 };
        // SAFETY: no preconditions; the descriptor is owned at once.
        let raw = unsafe { libc::inotify_init1(flags) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor of ours.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let path = std::ffi::CString::new(dir.as_os_str().as_bytes())?;
        // SAFETY: a valid descriptor and C string.
        if unsafe { libc::inotify_add_watch(raw, path.as_ptr(), libc::IN_ALL_EVENTS) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Watch { fd })
    }

    /// One read(2) into `buf` (64 KiB holds any batch the kernel returns): its events, or
    /// None when it returned nothing (nothing queued on a nonblocking watch, or an error).
    pub fn read(&self, buf: &mut [u8]) -> Option<Vec<Event>> {
        // SAFETY: buf is writable for its length.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        (n > 0).then(|| events(&buf[..n as usize]))
    }

    /// Waits until an event is queued or `ms` milliseconds pass.
    pub fn wait(&self, ms: i32) {
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut pfd, 1, ms) };
    }
}

/// The events in `buf`, as read(2) from an inotify descriptor returned it: each record is a
/// 16-byte head (wd, mask, cookie, len as native-endian 32-bit words) and `len` bytes of
/// name padded with NULs. A record cut short ends the list.
pub fn events(mut buf: &[u8]) -> Vec<Event> {
    let word = |b: &[u8]| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
    let mut out = Vec::new();
    while let Some((head, rest)) = buf.split_first_chunk::<16>() {
        let len = word(&head[12..]) as usize;
        let Some(padded) = rest.get(..len) else { break };
        let name = padded.split(|&b| b == 0).next().unwrap_or_default();
        out.push((word(&head[4..]), name.to_vec()));
        buf = &rest[len..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record as the kernel lays it out, its name padded to `padded` bytes.
    fn raw(mask: u32, name: &[u8], padded: usize) -> Vec<u8> {
        let mut v = [7u32, mask, 0, padded as u32]
            .iter()
            .flat_map(|w| w.to_ne_bytes())
            .collect::<Vec<u8>>();
        v.extend(name);
        v.resize(16 + padded, 0);
        v
    }

    #[test]
    fn names_lose_their_padding_and_cut_records_end_the_list() {
        let mut buf = raw(libc::IN_CREATE, b"new.txt", 16);
        buf.extend(raw(libc::IN_ATTRIB, b"", 0));
        let all = vec![
            (libc::IN_CREATE, b"new.txt".to_vec()),
            (libc::IN_ATTRIB, Vec::new()),
        ];
        assert_eq!(events(&buf), all);
        assert_eq!(events(&buf[..buf.len() - 1]), all[..1]);
        assert_eq!(events(&buf[..20]), Vec::<Event>::new());
    }

    #[test]
    fn a_watch_reads_what_happens_in_its_directory() {
        let dir = tempfile::tempdir().unwrap();
        let w = Watch::new(dir.path(), true).unwrap();
        let mut buf = vec![0u8; 64 << 10];
        assert_eq!(w.read(&mut buf), None);
        std::fs::write(dir.path().join("f"), b"x").unwrap();
        w.wait(1000);
        let got = w.read(&mut buf).unwrap();
        assert!(
            got.iter()
                .any(|(m, n)| m & libc::IN_CREATE != 0 && n == b"f"),
            "{got:?}"
        );
    }
}
