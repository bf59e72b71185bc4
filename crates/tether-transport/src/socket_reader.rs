//! The read half of a socket: buffered, and waiting for data with `poll()` rather than in
//! `recv()`.
//!
//! Why not a plain blocking `recv()`: on a Unix stream socket, each time the peer reads
//! what this side wrote, the kernel wakes every thread sleeping on this side's socket to say
//! there is room to write again (`unix_write_space`), and a thread blocked in `recv()`
//! cannot tell that wake-up from data: it wakes, finds nothing and sleeps again. With one
//! reply per request that is two needless wake-ups per round trip, one in the client and
//! one in the server, each a context switch and often an idle CPU woken by an
//! inter-processor interrupt. A `poll()` for POLLIN is only woken for data.
//!
//! Buffered: a frame's header and body, and frames that arrive together, are usually one
//! `recv()`; reads at least as large as the buffer go straight to the caller's memory.

use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const BUFFER: usize = 64 * 1024;

/// A read timeout shared by a socket's handle and its reader (milliseconds; 0: none).
#[derive(Debug, Default, Clone)]
pub struct ReadTimeout(Arc<AtomicU64>);

impl ReadTimeout {
    pub fn set(&self, t: Option<Duration>) {
        let ms = t.map(|t| (t.as_millis() as u64).max(1)).unwrap_or(0);
        self.0.store(ms, Ordering::Relaxed);
    }

    /// As `poll()` takes it: -1 for no timeout.
    fn poll_ms(&self) -> i32 {
        match self.0.load(Ordering::Relaxed) {
            0 => -1,
            ms => ms.min(i32::MAX as u64) as i32,
        }
    }
}

pub struct SocketReader<S> {
    socket: S,
    timeout: ReadTimeout,
    buf: Box<[u8]>,
    start: usize,
    end: usize,
}

impl<S: AsRawFd> SocketReader<S> {
    pub fn new(socket: S, timeout: ReadTimeout) -> Self {
        SocketReader {
            socket,
            timeout,
            buf: vec![0u8; BUFFER].into_boxed_slice(),
            start: 0,
            end: 0,
        }
    }

    /// One `recv()` into `dst` of whatever has arrived, waiting in `poll()` while nothing
    /// has. Ok(0) is the end of the stream.
    fn recv(&self, dst: &mut [u8]) -> io::Result<usize> {
        let fd = self.socket.as_raw_fd();
        loop {
            // SAFETY: dst is valid, writable memory of dst.len() bytes.
            let n =
                unsafe { libc::recv(fd, dst.as_mut_ptr().cast(), dst.len(), libc::MSG_DONTWAIT) };
            if n >= 0 {
                return Ok(n as usize);
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => self.wait_readable()?,
                _ => return Err(e),
            }
        }
    }

    /// Waits until the socket has data, an end or an error; WouldBlock after the timeout,
    /// as a socket with SO_RCVTIMEO would say.
    fn wait_readable(&self) -> io::Result<()> {
        let mut p = libc::pollfd {
            fd: self.socket.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        loop {
            // SAFETY: p is one valid pollfd.
            let r = unsafe { libc::poll(&mut p, 1, self.timeout.poll_ms()) };
            match r {
                0 => return Err(io::ErrorKind::WouldBlock.into()),
                r if r > 0 => return Ok(()),
                _ => {
                    let e = io::Error::last_os_error();
                    if e.kind() != io::ErrorKind::Interrupted {
                        return Err(e);
                    }
                }
            }
        }
    }
}

impl<S: AsRawFd> Read for SocketReader<S> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if self.start == self.end {
            if out.len() >= self.buf.len() {
                return self.recv(out);
            }
            let mut buf = std::mem::take(&mut self.buf);
            let got = self.recv(&mut buf);
            self.buf = buf;
            self.start = 0;
            self.end = got?;
        }
        let n = out.len().min(self.end - self.start);
        out[..n].copy_from_slice(&self.buf[self.start..self.start + n]);
        self.start += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::net::UnixStream;
    use std::time::Instant;

    #[test]
    fn reads_small_and_large_pieces_in_order_then_the_end() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let mut r = SocketReader::new(a, ReadTimeout::default());
        let big: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let writer = {
            let big = big.clone();
            std::thread::spawn(move || {
                b.write_all(b"head").unwrap();
                b.write_all(&big).unwrap();
            })
        };
        let mut head = [0u8; 4];
        r.read_exact(&mut head).unwrap();
        assert_eq!(&head, b"head");
        let mut got = vec![0u8; big.len()];
        r.read_exact(&mut got).unwrap();
        assert_eq!(got, big);
        writer.join().unwrap();
        assert_eq!(
            r.read(&mut head).unwrap(),
            0,
            "the writer is gone: end of stream"
        );
    }

    #[test]
    fn a_read_timeout_ends_the_wait_with_would_block() {
        let (a, _b) = UnixStream::pair().unwrap();
        let timeout = ReadTimeout::default();
        timeout.set(Some(Duration::from_millis(50)));
        let mut r = SocketReader::new(a, timeout.clone());
        let start = Instant::now();
        let e = r.read(&mut [0u8; 8]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        assert!(start.elapsed() >= Duration::from_millis(40));
    }

    #[test]
    fn a_shutdown_from_another_thread_ends_a_waiting_read() {
        let (a, _b) = UnixStream::pair().unwrap();
        let closer = a.try_clone().unwrap();
        let mut r = SocketReader::new(a, ReadTimeout::default());
        let t = std::thread::spawn(move || r.read(&mut [0u8; 8]));
        std::thread::sleep(Duration::from_millis(50));
        closer.shutdown(std::net::Shutdown::Both).unwrap();
        assert_eq!(t.join().unwrap().unwrap(), 0);
    }
}
