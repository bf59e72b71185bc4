//! AF_VSOCK stream sockets (virtio-vsock between a VM guest and its host), with libc
//! directly.
//!
//! A guest connects to `vsock:2:PORT` (CID 2 is the host); the host listens on
//! `vsock:PORT` (any CID), through the kernel's vhost-vsock that libvirt and QEMU's
//! `vhost-vsock-pci` use. VMMs that forward vsock to Unix sockets instead (Firecracker,
//! Cloud Hypervisor, vhost-device-vsock) are served through `vsock-unix:PATH`, a plain Unix
//! socket listener (see the crate's `Listener::VsockUnix`); nothing here is involved then.
//!
//! Only Linux has AF_VSOCK here; elsewhere every call fails with `Unsupported`.

use std::io::{self, IoSlice, Read, Write};
#[cfg(target_os = "linux")]
use std::os::fd::FromRawFd;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// The CID a listener binds to accept connections from any peer (`vsock:PORT`).
pub const CID_ANY: u32 = u32::MAX;
/// The host's CID, as a guest connects to it.
pub const CID_HOST: u32 = 2;
/// A port a listener binds to have the kernel choose one.
pub const PORT_ANY: u32 = u32::MAX;

/// A connected AF_VSOCK stream socket.
#[derive(Debug)]
pub struct VsockStream {
    fd: OwnedFd,
}

/// A bound, listening AF_VSOCK socket.
#[derive(Debug)]
pub struct VsockListener {
    fd: OwnedFd,
}

#[cfg(target_os = "linux")]
fn sockaddr(cid: u32, port: u32) -> libc::sockaddr_vm {
    // SAFETY: sockaddr_vm is plain old data (integers and a byte array); all zeroes is a
    // valid value, and the reserved and zero fields must be zero.
    let mut sa: libc::sockaddr_vm = unsafe { std::mem::zeroed() };
    sa.svm_family = libc::AF_VSOCK as libc::sa_family_t;
    sa.svm_cid = cid;
    sa.svm_port = port;
    sa
}

#[cfg(target_os = "linux")]
fn new_socket() -> io::Result<OwnedFd> {
    // SAFETY: socket() takes no pointers; a non-negative result is a new descriptor that
    // nothing else owns.
    let fd = unsafe { libc::socket(libc::AF_VSOCK, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        let e = io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            Some(libc::EAFNOSUPPORT) => io::Error::new(
                io::ErrorKind::Unsupported,
                "this kernel has no vsock (AF_VSOCK): in a guest, load vmw_vsock_virtio_transport \
                 (modprobe); on a host, vhost_vsock",
            ),
            _ => e,
        });
    }
    // SAFETY: fd was just returned by socket() and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(not(target_os = "linux"))]
fn unsupported<T>() -> io::Result<T> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "vsock is only supported on Linux",
    ))
}

impl VsockStream {
    /// Connects to `port` on the machine `cid`.
    #[cfg(target_os = "linux")]
    pub fn connect(cid: u32, port: u32) -> io::Result<VsockStream> {
        let fd = new_socket()?;
        let sa = sockaddr(cid, port);
        // SAFETY: sa is a valid sockaddr_vm and the length passed is its size; fd is an
        // open socket.
        let r = unsafe {
            libc::connect(
                fd.as_raw_fd(),
                (&sa as *const libc::sockaddr_vm).cast(),
                std::mem::size_of::<libc::sockaddr_vm>() as libc::socklen_t,
            )
        };
        if r == 0 {
            return Ok(VsockStream { fd });
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
        // An interrupted connect goes on in the background; wait for its outcome.
        wait_connected(fd)
    }

    #[cfg(not(target_os = "linux"))]
    pub fn connect(_cid: u32, _port: u32) -> io::Result<VsockStream> {
        unsupported()
    }

    /// A second handle on the same socket (a dup'd descriptor).
    pub fn try_clone(&self) -> io::Result<VsockStream> {
        Ok(VsockStream {
            fd: self.fd.try_clone()?,
        })
    }

    /// The peer's `(cid, port)`.
    pub fn peer_addr(&self) -> io::Result<(u32, u32)> {
        sock_name(self.fd.as_raw_fd(), true)
    }

    pub fn shutdown(&self, how: std::net::Shutdown) -> io::Result<()> {
        let how = match how {
            std::net::Shutdown::Read => libc::SHUT_RD,
            std::net::Shutdown::Write => libc::SHUT_WR,
            std::net::Shutdown::Both => libc::SHUT_RDWR,
        };
        // SAFETY: shutdown() takes no pointers; the descriptor is open while self lives.
        if unsafe { libc::shutdown(self.fd.as_raw_fd(), how) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// SO_RCVTIMEO: a blocking read fails with WouldBlock after `t` (None: never).
    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        if t == Some(Duration::ZERO) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a zero read timeout is not allowed",
            ));
        }
        let t = t.unwrap_or(Duration::ZERO);
        // `as _`: time_t and suseconds_t differ between libcs (musl's are deprecated
        // aliases); 68 years fits every width.
        let tv = libc::timeval {
            tv_sec: t.as_secs().min(i32::MAX as u64) as _,
            tv_usec: t.subsec_micros() as _,
        };
        // SAFETY: tv is a valid timeval and the length passed is its size.
        let r = unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// Waits for a connect() that was interrupted by a signal to finish, and returns its result.
#[cfg(target_os = "linux")]
fn wait_connected(fd: OwnedFd) -> io::Result<VsockStream> {
    loop {
        let mut pfd = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLOUT,
            revents: 0,
        };
        // SAFETY: pfd is one valid pollfd, and 1 is the number passed.
        let r = unsafe { libc::poll(&mut pfd, 1, -1) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        let mut err: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: err and len describe a valid, writable c_int.
        let r = unsafe {
            libc::getsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_ERROR,
                (&mut err as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        if err != 0 {
            return Err(io::Error::from_raw_os_error(err));
        }
        return Ok(VsockStream { fd });
    }
}

/// getpeername (peer) or getsockname of a vsock socket, as `(cid, port)`.
fn sock_name(fd: RawFd, peer: bool) -> io::Result<(u32, u32)> {
    #[cfg(target_os = "linux")]
    {
        let mut sa = sockaddr(0, 0);
        let mut len = std::mem::size_of::<libc::sockaddr_vm>() as libc::socklen_t;
        let sa_ptr = (&mut sa as *mut libc::sockaddr_vm).cast();
        // SAFETY: sa and len describe a valid, writable sockaddr_vm buffer.
        let r = unsafe {
            if peer {
                libc::getpeername(fd, sa_ptr, &mut len)
            } else {
                libc::getsockname(fd, sa_ptr, &mut len)
            }
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok((sa.svm_cid, sa.svm_port))
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (fd, peer);
        unsupported()
    }
}

impl AsRawFd for VsockStream {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl Read for VsockStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            // SAFETY: buf is valid, writable memory of buf.len() bytes.
            let n =
                unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n >= 0 {
                return Ok(n as usize);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

impl Write for VsockStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        loop {
            // SAFETY: buf is valid memory of buf.len() bytes. MSG_NOSIGNAL: a closed peer
            // is an EPIPE error, not a SIGPIPE.
            let n = unsafe {
                libc::send(
                    self.fd.as_raw_fd(),
                    buf.as_ptr().cast(),
                    buf.len(),
                    libc::MSG_NOSIGNAL,
                )
            };
            if n >= 0 {
                return Ok(n as usize);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        // IoSlice is ABI-compatible with iovec; the kernel takes at most IOV_MAX of them.
        let count = bufs.len().min(1024);
        loop {
            // SAFETY: msghdr is plain old data; all zeroes is valid (no name, no control).
            let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
            // The kernel only reads the iovecs, though the field is a *mut.
            msg.msg_iov = bufs.as_ptr() as *mut libc::iovec;
            msg.msg_iovlen = count as _;
            // SAFETY: msg points to `count` valid iovecs (IoSlice guarantees the iovec
            // layout), each describing readable memory that outlives the call.
            let n = unsafe { libc::sendmsg(self.fd.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
            if n >= 0 {
                return Ok(n as usize);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl VsockListener {
    /// Binds `port` on `cid` ([`CID_ANY`]: every CID this machine answers to) and listens.
    #[cfg(target_os = "linux")]
    pub fn bind(cid: u32, port: u32) -> io::Result<VsockListener> {
        let fd = new_socket()?;
        let sa = sockaddr(cid, port);
        // SAFETY: sa is a valid sockaddr_vm and the length passed is its size.
        let r = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&sa as *const libc::sockaddr_vm).cast(),
                std::mem::size_of::<libc::sockaddr_vm>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: listen() takes no pointers; fd is an open, bound socket.
        if unsafe { libc::listen(fd.as_raw_fd(), 128) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(VsockListener { fd })
    }

    #[cfg(not(target_os = "linux"))]
    pub fn bind(_cid: u32, _port: u32) -> io::Result<VsockListener> {
        unsupported()
    }

    /// The bound `(cid, port)`.
    pub fn local_addr(&self) -> io::Result<(u32, u32)> {
        sock_name(self.fd.as_raw_fd(), false)
    }

    /// Waits for a connection; returns it with the peer's `(cid, port)`.
    #[cfg(target_os = "linux")]
    pub fn accept(&self) -> io::Result<(VsockStream, (u32, u32))> {
        loop {
            let mut sa = sockaddr(0, 0);
            let mut len = std::mem::size_of::<libc::sockaddr_vm>() as libc::socklen_t;
            // SAFETY: sa and len describe a valid, writable sockaddr_vm buffer; the
            // listening descriptor is open while self lives.
            let fd = unsafe {
                libc::accept4(
                    self.fd.as_raw_fd(),
                    (&mut sa as *mut libc::sockaddr_vm).cast(),
                    &mut len,
                    libc::SOCK_CLOEXEC,
                )
            };
            if fd >= 0 {
                // SAFETY: fd was just returned by accept4() and is owned by nobody else.
                let fd = unsafe { OwnedFd::from_raw_fd(fd) };
                return Ok((VsockStream { fd }, (sa.svm_cid, sa.svm_port)));
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    #[cfg(not(target_os = "linux"))]
    pub fn accept(&self) -> io::Result<(VsockStream, (u32, u32))> {
        unsupported()
    }
}
