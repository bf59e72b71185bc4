//! Byte streams for Tether. A transport only produces a reader, a writer and a way to shut
//! both down; the protocol never knows what is on the other side.

pub mod framed;
mod socket_file;
mod socket_reader;
mod ssh;
pub mod vsock;

pub use socket_file::{clear_stale_socket, OwnSocketFile};

pub use ssh::{stdio, StdoutRelay};

use socket_reader::{ReadTimeout, SocketReader};
use vsock::{VsockListener, VsockStream};

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Where to listen or connect: `unix:/path/to.sock`, `tcp:HOST:PORT`, `vsock:CID:PORT`
/// (`vsock:PORT` to listen), `vsock-unix:/path/to.sock_PORT` (to listen for a VMM that
/// forwards vsock to Unix sockets), or (to connect only) `ssh:[USER@]HOST:DIR`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    Unix(PathBuf),
    Tcp(String),
    Ssh(SshTarget),
    /// AF_VSOCK: `vsock:CID:PORT`, or `vsock:PORT` (cid [`vsock::CID_ANY`]) to listen on
    /// every CID.
    Vsock {
        cid: u32,
        port: u32,
    },
    /// Hybrid vsock (Firecracker, Cloud Hypervisor, vhost-device-vsock): the VMM forwards a
    /// guest's connection to host vsock port P to the Unix socket `PATH_P`. The server
    /// listens there, but its peer is the VMM, not a local user, so it is authenticated like
    /// TCP (by the secret), not by the Unix socket's peer credentials. Connecting to it is a
    /// plain Unix socket connection (useful to check a server from the host).
    VsockUnix(PathBuf),
}

/// The schemes, for error messages.
const SCHEMES: &str = "unix:/path/to.sock, tcp:HOST:PORT, vsock:CID:PORT (vsock:PORT to \
                       listen), vsock-unix:/path/to.sock_PORT (to listen) or ssh:[USER@]HOST:DIR";

/// A server started on demand through ssh: the client runs `ssh DESTINATION REMOTE_TETHER
/// serve --stdio DIR` and speaks the protocol over that command's input and output. ssh
/// authenticates both ends and encrypts the traffic; the server lives as long as the
/// connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshTarget {
    /// `HOST` or `USER@HOST` (an alias from ssh_config works too).
    pub destination: String,
    /// The directory to export, on the remote host; relative paths (and `~/...`) are
    /// relative to the remote user's home.
    pub dir: String,
    /// The ssh program and options of one's own, e.g. `["ssh", "-p", "2222"]`.
    pub command: Vec<String>,
    /// The remote host's tether program.
    pub remote_tether: String,
}

impl SshTarget {
    /// The command line the remote shell runs.
    pub fn remote_command(&self) -> String {
        let dir = self.dir.strip_prefix("~/").unwrap_or(&self.dir);
        let dir = if dir.is_empty() || dir == "~" {
            "."
        } else {
            dir
        };
        format!(
            "{} serve --stdio -- {}",
            self.remote_tether,
            shell_quote(dir)
        )
    }

    /// The destination as ssh takes it: an IPv6 address without its brackets.
    pub fn ssh_destination(&self) -> String {
        let (user, host) = match self.destination.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, self.destination.as_str()),
        };
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        match user {
            Some(u) => format!("{u}@{host}"),
            None => host.to_string(),
        }
    }
}

/// `s` as one word for a POSIX shell.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AddressError {
    #[error("address {0:?} has no scheme: use {SCHEMES}")]
    NoScheme(String),
    #[error("unknown transport {0:?}: use {SCHEMES}")]
    UnknownScheme(String),
    #[error(
        "bad vsock address {address:?}: {why}; use vsock:CID:PORT to connect (CID 2 is the \
         host) or vsock:PORT to listen"
    )]
    BadVsock { address: String, why: String },
    #[error(
        "{0:?} is an address to listen on (any CID): to connect, name the CID too, as in \
         vsock:2:PORT (CID 2 is the host)"
    )]
    VsockNoCid(String),
    #[error("ssh address {0:?} needs [USER@]HOST:DIR")]
    NoSshDir(String),
    #[error("empty socket path in {0:?}")]
    EmptyPath(String),
    #[error("TCP address {0:?} needs HOST:PORT")]
    NoPort(String),
}

impl FromStr for Address {
    type Err = AddressError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (scheme, rest) = s
            .split_once(':')
            .ok_or_else(|| AddressError::NoScheme(s.to_string()))?;
        match scheme {
            "unix" => {
                if rest.is_empty() {
                    return Err(AddressError::EmptyPath(s.to_string()));
                }
                Ok(Address::Unix(PathBuf::from(rest)))
            }
            "tcp" => match rest.rsplit_once(':') {
                Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {
                    Ok(Address::Tcp(rest.to_string()))
                }
                _ => Err(AddressError::NoPort(s.to_string())),
            },
            "ssh" => match split_host(rest) {
                Some((destination, dir)) if !destination.is_empty() && !dir.is_empty() => {
                    Ok(Address::Ssh(SshTarget {
                        destination: destination.to_string(),
                        dir: dir.to_string(),
                        command: vec!["ssh".to_string()],
                        remote_tether: "tether".to_string(),
                    }))
                }
                _ => Err(AddressError::NoSshDir(s.to_string())),
            },
            "vsock" => parse_vsock(s, rest),
            "vsock-unix" => {
                if rest.is_empty() {
                    return Err(AddressError::EmptyPath(s.to_string()));
                }
                Ok(Address::VsockUnix(PathBuf::from(rest)))
            }
            other => Err(AddressError::UnknownScheme(other.to_string())),
        }
    }
}

/// `CID:PORT` or `PORT` of a vsock address `s`.
fn parse_vsock(s: &str, rest: &str) -> Result<Address, AddressError> {
    let bad = |why: String| AddressError::BadVsock {
        address: s.to_string(),
        why,
    };
    let number = |what: &str, n: &str| {
        if n.is_empty() {
            return Err(bad(format!("the {what} is missing")));
        }
        n.parse::<u32>().map_err(|_| {
            bad(format!(
                "the {what} {n:?} is not a number from 0 to {}",
                u32::MAX
            ))
        })
    };
    let parts: Vec<&str> = rest.split(':').collect();
    match parts[..] {
        [port] => Ok(Address::Vsock {
            cid: vsock::CID_ANY,
            port: number("port", port)?,
        }),
        [cid, port] => Ok(Address::Vsock {
            cid: number("CID", cid)?,
            port: number("port", port)?,
        }),
        _ => Err(bad("too many colons".to_string())),
    }
}

impl Address {
    /// This address, if a client can connect to it: a vsock address must name its CID.
    pub fn for_connecting(self) -> Result<Address, AddressError> {
        match self {
            Address::Vsock { cid, .. } if cid == vsock::CID_ANY => {
                Err(AddressError::VsockNoCid(self.to_string()))
            }
            Address::Vsock { port, .. } if port == vsock::PORT_ANY => Err(AddressError::BadVsock {
                address: self.to_string(),
                why: format!("port {port} means any port, which only a listener can use"),
            }),
            other => Ok(other),
        }
    }

    /// Whether a server on this address must require the secret: every listener whose peers
    /// the kernel cannot name as a local user (TCP, vsock, hybrid vsock).
    pub fn needs_secret(&self) -> bool {
        !matches!(self, Address::Unix(_) | Address::Ssh(_))
    }
}

/// Splits `[USER@]HOST:DIR` at the first colon outside brackets (`[::1]:dir`).
fn split_host(s: &str) -> Option<(&str, &str)> {
    let mut in_brackets = false;
    for (i, c) in s.char_indices() {
        match c {
            '[' => in_brackets = true,
            ']' => in_brackets = false,
            ':' if !in_brackets => return Some((&s[..i], &s[i + 1..])),
            _ => {}
        }
    }
    None
}

impl std::fmt::Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Address::Unix(p) => write!(f, "unix:{}", p.display()),
            Address::Tcp(a) => write!(f, "tcp:{a}"),
            Address::Ssh(t) => write!(f, "ssh:{}:{}", t.destination, t.dir),
            Address::Vsock { cid, port } if *cid == vsock::CID_ANY => write!(f, "vsock:{port}"),
            Address::Vsock { cid, port } => write!(f, "vsock:{cid}:{port}"),
            Address::VsockUnix(p) => write!(f, "vsock-unix:{}", p.display()),
        }
    }
}

/// A connected byte stream, split so one thread can read while others write.
pub struct Stream {
    pub reader: Box<dyn Read + Send>,
    pub writer: Box<dyn Write + Send>,
    /// Unblocks the reader and fails further writes; idempotent.
    pub closer: Closer,
    /// Who is on the other side, for logs.
    pub peer: String,
    /// The connecting process's credentials, on Unix sockets.
    pub peer_cred: Option<PeerCred>,
    /// The socket itself, to set timeouts (None for in-memory pipes); the closer shares it.
    pub socket: Option<Arc<Socket>>,
}

/// Who connected to a Unix socket, as the kernel recorded it at connect time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerCred {
    pub pid: i32,
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (empty when the kernel cannot tell).
    pub groups: Vec<u32>,
}

/// A handle on a stream's socket.
pub struct Socket {
    kind: SocketKind,
    /// The stream's reader waits in poll(), which SO_RCVTIMEO does not limit.
    read_timeout: ReadTimeout,
}

enum SocketKind {
    Unix(UnixStream),
    Tcp(TcpStream),
    Vsock(VsockStream),
}

impl Socket {
    /// Makes reads fail with WouldBlock/TimedOut after `t` without data (None: wait forever).
    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.read_timeout.set(t);
        match &self.kind {
            SocketKind::Unix(s) => s.set_read_timeout(t),
            SocketKind::Tcp(s) => s.set_read_timeout(t),
            SocketKind::Vsock(s) => s.set_read_timeout(t),
        }
    }
    fn shutdown(&self) {
        self.shutdown_how(std::net::Shutdown::Both);
    }

    /// Stops reading: every later read sees the end of the stream, while writes still go
    /// out (a server that is shutting down answers what it read).
    pub fn stop_reading(&self) {
        self.shutdown_how(std::net::Shutdown::Read);
    }

    fn shutdown_how(&self, how: std::net::Shutdown) {
        let _ = match &self.kind {
            SocketKind::Unix(s) => s.shutdown(how),
            SocketKind::Tcp(s) => s.shutdown(how),
            SocketKind::Vsock(s) => s.shutdown(how),
        };
    }
    fn halves(&self) -> io::Result<(Box<dyn Read + Send>, Box<dyn Write + Send>)> {
        let t = self.read_timeout.clone();
        Ok(match &self.kind {
            SocketKind::Unix(s) => (
                Box::new(SocketReader::new(s.try_clone()?, t)),
                Box::new(s.try_clone()?),
            ),
            SocketKind::Tcp(s) => (
                Box::new(SocketReader::new(s.try_clone()?, t)),
                Box::new(s.try_clone()?),
            ),
            SocketKind::Vsock(s) => (
                Box::new(SocketReader::new(s.try_clone()?, t)),
                Box::new(s.try_clone()?),
            ),
        })
    }
}

/// Shuts a stream down from any thread.
#[derive(Clone)]
pub struct Closer(Arc<dyn Fn() + Send + Sync>);

impl Closer {
    pub fn close(&self) {
        (self.0)()
    }
}

impl Stream {
    fn from_socket(
        kind: SocketKind,
        peer: String,
        peer_cred: Option<PeerCred>,
    ) -> io::Result<Stream> {
        let socket = Socket {
            kind,
            read_timeout: ReadTimeout::default(),
        };
        let (reader, writer) = socket.halves()?;
        let socket = Arc::new(socket);
        let closing = socket.clone();
        Ok(Stream {
            reader,
            writer,
            closer: Closer(Arc::new(move || closing.shutdown())),
            peer,
            peer_cred,
            socket: Some(socket),
        })
    }

    fn from_tcp(s: TcpStream) -> io::Result<Stream> {
        // Requests are small and latency-bound: never wait to coalesce them.
        s.set_nodelay(true)?;
        let peer = s
            .peer_addr()
            .map(|a| format!("tcp:{a}"))
            .unwrap_or_else(|_| "tcp:?".into());
        Stream::from_socket(SocketKind::Tcp(s), peer, None)
    }
}

/// The credentials of the process at the other end of a Unix socket.
#[cfg(target_os = "linux")]
pub fn peer_cred(s: &UnixStream) -> io::Result<PeerCred> {
    let fd = s.as_raw_fd();
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: cred and len describe a valid, writable ucred buffer.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut groups = vec![0 as libc::gid_t; 256];
    let mut len = (groups.len() * std::mem::size_of::<libc::gid_t>()) as libc::socklen_t;
    // SAFETY: groups and len describe a valid, writable buffer of gid_t.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERGROUPS,
            groups.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if r == 0 {
        groups.truncate(len as usize / std::mem::size_of::<libc::gid_t>());
    } else {
        groups.clear();
    }
    Ok(PeerCred {
        pid: cred.pid,
        uid: cred.uid,
        gid: cred.gid,
        groups,
    })
}

/// The credentials of the process at the other end of a Unix socket: getpeereid(3) and
/// LOCAL_PEERPID (macOS has no SO_PEERCRED; the supplementary groups are not told).
#[cfg(not(target_os = "linux"))]
pub fn peer_cred(s: &UnixStream) -> io::Result<PeerCred> {
    let fd = s.as_raw_fd();
    let (mut uid, mut gid) = (0, 0);
    // SAFETY: uid and gid are writable for the call.
    if unsafe { libc::getpeereid(fd, &mut uid, &mut gid) } != 0 {
        return Err(io::Error::last_os_error());
    }
    #[cfg(any(target_os = "macos", target_os = "ios"))]
    let pid = {
        let mut pid: libc::pid_t = 0;
        let mut len = std::mem::size_of::<libc::pid_t>() as libc::socklen_t;
        // SAFETY: pid and len describe a valid, writable pid_t.
        let r = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_LOCAL,
                libc::LOCAL_PEERPID,
                (&mut pid as *mut libc::pid_t).cast(),
                &mut len,
            )
        };
        if r == 0 {
            pid
        } else {
            0
        }
    };
    #[cfg(not(any(target_os = "macos", target_os = "ios")))]
    let pid = 0;
    Ok(PeerCred {
        pid,
        uid,
        gid,
        groups: Vec::new(),
    })
}

/// Connects to a server.
pub fn connect(addr: &Address) -> io::Result<Stream> {
    match addr {
        Address::Unix(p) => {
            let s = UnixStream::connect(p)?;
            // The server's process, which the client may want to tell from its own
            // machine's others (the server is not a guest process when both share a kernel).
            let cred = peer_cred(&s).ok();
            Stream::from_socket(SocketKind::Unix(s), addr.to_string(), cred)
        }
        Address::Tcp(a) => Stream::from_tcp(TcpStream::connect(a.as_str())?),
        Address::Ssh(t) => ssh::connect(t, addr.to_string()),
        Address::Vsock { cid, port } => {
            // Checked before any socket is made: a listening address cannot be dialled.
            let (cid, port) = match addr.clone().for_connecting() {
                Ok(_) => (*cid, *port),
                Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidInput, e.to_string())),
            };
            let s = VsockStream::connect(cid, port)?;
            Stream::from_socket(SocketKind::Vsock(s), addr.to_string(), None)
        }
        Address::VsockUnix(p) => {
            let s = UnixStream::connect(p)?;
            let cred = peer_cred(&s).ok();
            Stream::from_socket(SocketKind::Unix(s), addr.to_string(), cred)
        }
    }
}

/// True when every address `host:port` resolves to is a loopback address.
pub fn is_loopback(hostport: &str) -> io::Result<bool> {
    let addrs: Vec<_> = hostport.to_socket_addrs()?.collect();
    Ok(!addrs.is_empty() && addrs.iter().all(|a| a.ip().is_loopback()))
}

pub enum Listener {
    Unix {
        listener: UnixListener,
        file: OwnSocketFile,
    },
    Tcp(TcpListener),
    Vsock(VsockListener),
    /// A Unix socket a VMM forwards guests' vsock connections to ([`Address::VsockUnix`]):
    /// accepted streams carry no peer credentials, so a server authenticates them by the
    /// secret, as on TCP.
    VsockUnix {
        listener: UnixListener,
        file: OwnSocketFile,
    },
}

/// Binds a Unix socket at `path`, mode 0600 (or 0660 for `socket_group`).
fn bind_unix(
    path: &std::path::Path,
    socket_group: Option<u32>,
) -> io::Result<(UnixListener, OwnSocketFile)> {
    clear_stale_socket(path)?;
    // Created 0600 from the start: no moment where others could connect.
    // SAFETY: umask only changes this process's file creation mask; it is
    // restored right after.
    let old = unsafe { libc::umask(0o177) };
    let bound = UnixListener::bind(path);
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    let listener = bound?;
    let file = OwnSocketFile::new(path);
    if let Some(gid) = socket_group {
        std::os::unix::fs::chown(path, None, Some(gid))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
    }
    Ok((listener, file))
}

impl Listener {
    /// Binds `addr`. A Unix socket is created mode 0600, so only the serving user may
    /// connect, or 0660 owned by `socket_group` to admit that group as well. A stale socket
    /// file left by a dead server is replaced; a live one, or anything that is not a socket,
    /// is an error ([`clear_stale_socket`]).
    pub fn bind(addr: &Address, socket_group: Option<u32>) -> io::Result<Listener> {
        match addr {
            Address::Unix(path) => {
                let (listener, file) = bind_unix(path, socket_group)?;
                Ok(Listener::Unix { listener, file })
            }
            Address::VsockUnix(path) => {
                let (listener, file) = bind_unix(path, socket_group)?;
                Ok(Listener::VsockUnix { listener, file })
            }
            Address::Tcp(a) => Ok(Listener::Tcp(TcpListener::bind(a.as_str())?)),
            Address::Vsock { cid, port } => Ok(Listener::Vsock(VsockListener::bind(*cid, *port)?)),
            Address::Ssh(_) => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "an ssh address is for mounting: on the host, ssh starts `tether serve --stdio`",
            )),
        }
    }

    /// The bound address (with the real port when bound to port 0).
    pub fn local_address(&self) -> io::Result<Address> {
        match self {
            Listener::Unix { file, .. } => Ok(Address::Unix(file.path().to_path_buf())),
            Listener::Tcp(l) => Ok(Address::Tcp(l.local_addr()?.to_string())),
            Listener::Vsock(l) => {
                let (cid, port) = l.local_addr()?;
                Ok(Address::Vsock { cid, port })
            }
            Listener::VsockUnix { file, .. } => Ok(Address::VsockUnix(file.path().to_path_buf())),
        }
    }

    pub fn accept(&self) -> io::Result<Stream> {
        match self {
            Listener::Unix { listener, file } => {
                let (s, _) = listener.accept()?;
                let cred = peer_cred(&s)?;
                let peer = format!(
                    "unix:{} pid {} uid {}",
                    file.path().display(),
                    cred.pid,
                    cred.uid
                );
                Stream::from_socket(SocketKind::Unix(s), peer, Some(cred))
            }
            Listener::Tcp(l) => Stream::from_tcp(l.accept()?.0),
            Listener::Vsock(l) => {
                let (s, (cid, port)) = l.accept()?;
                Stream::from_socket(SocketKind::Vsock(s), format!("vsock:{cid}:{port}"), None)
            }
            Listener::VsockUnix { listener, file } => {
                let (s, _) = listener.accept()?;
                // The peer is the VMM, not the guest's user: its credentials are for the
                // log only, and the stream carries none, so the server asks for the secret
                // instead of checking a uid.
                let vmm = match peer_cred(&s) {
                    Ok(c) => format!(" (VMM pid {} uid {})", c.pid, c.uid),
                    Err(_) => String::new(),
                };
                let peer = format!("vsock-unix:{}{vmm}", file.path().display());
                Stream::from_socket(SocketKind::Unix(s), peer, None)
            }
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix { file, .. } | Listener::VsockUnix { file, .. } = self {
            file.remove();
        }
    }
}

/// An in-memory, in-process pipe pair for tests: what one side writes the other reads.
pub fn memory_pipe() -> (Stream, Stream) {
    let a = Arc::new(Pipe::default());
    let b = Arc::new(Pipe::default());
    (
        memory_end(a.clone(), b.clone(), "memory:a"),
        memory_end(b, a, "memory:b"),
    )
}

#[derive(Default)]
struct Pipe {
    state: Mutex<PipeState>,
    ready: Condvar,
}

#[derive(Default)]
struct PipeState {
    data: VecDeque<u8>,
    closed: bool,
}

impl Pipe {
    fn close(&self) {
        self.state.lock().unwrap().closed = true;
        self.ready.notify_all();
    }
}

struct PipeReader(Arc<Pipe>);
struct PipeWriter(Arc<Pipe>);

impl Read for PipeReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut st = self.0.state.lock().unwrap();
        loop {
            if !st.data.is_empty() {
                let n = buf.len().min(st.data.len());
                for (i, b) in st.data.drain(..n).enumerate() {
                    buf[i] = b;
                }
                return Ok(n);
            }
            if st.closed {
                return Ok(0);
            }
            st = self.0.ready.wait(st).unwrap();
        }
    }
}

impl Write for PipeWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut st = self.0.state.lock().unwrap();
        if st.closed {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        st.data.extend(buf);
        self.0.ready.notify_all();
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn memory_end(incoming: Arc<Pipe>, outgoing: Arc<Pipe>, peer: &str) -> Stream {
    let (i, o) = (incoming.clone(), outgoing.clone());
    Stream {
        reader: Box::new(PipeReader(incoming)),
        writer: Box::new(PipeWriter(outgoing)),
        closer: Closer(Arc::new(move || {
            i.close();
            o.close();
        })),
        peer: peer.to_string(),
        peer_cred: None,
        socket: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_addresses_and_explains_bad_ones() {
        assert_eq!(
            "unix:/run/t.sock".parse::<Address>(),
            Ok(Address::Unix("/run/t.sock".into()))
        );
        assert_eq!(
            "tcp:127.0.0.1:7070".parse::<Address>(),
            Ok(Address::Tcp("127.0.0.1:7070".into()))
        );
        assert_eq!(
            "tcp:[::1]:7070".parse::<Address>(),
            Ok(Address::Tcp("[::1]:7070".into()))
        );
        assert!(matches!(
            "/run/t.sock".parse::<Address>(),
            Err(AddressError::NoScheme(_))
        ));
        assert!(matches!(
            "udp:x:1".parse::<Address>(),
            Err(AddressError::UnknownScheme(_))
        ));
        assert!(matches!(
            "tcp:host".parse::<Address>(),
            Err(AddressError::NoPort(_))
        ));
        assert!(matches!(
            "tcp:host:99999".parse::<Address>(),
            Err(AddressError::NoPort(_))
        ));
        assert!(matches!(
            "unix:".parse::<Address>(),
            Err(AddressError::EmptyPath(_))
        ));
    }

    #[test]
    fn vsock_addresses_parse_and_display_round_trip() {
        // No test opens an AF_VSOCK socket: this machine's vsock leads to its own host.
        for (text, addr) in [
            ("vsock:2:7070", Address::Vsock { cid: 2, port: 7070 }),
            ("vsock:3:1", Address::Vsock { cid: 3, port: 1 }),
            (
                "vsock:4294967295:0",
                Address::Vsock {
                    cid: 4294967295,
                    port: 0,
                },
            ),
            // A listening address: any CID.
            (
                "vsock:7070",
                Address::Vsock {
                    cid: vsock::CID_ANY,
                    port: 7070,
                },
            ),
            (
                "vsock-unix:/run/fc/v.sock_7070",
                Address::VsockUnix("/run/fc/v.sock_7070".into()),
            ),
        ] {
            assert_eq!(text.parse::<Address>(), Ok(addr.clone()), "{text}");
            // What /proc/mounts (tether:{addr}) and `tether status` show.
            let shown = addr.to_string();
            let expected = if text == "vsock:4294967295:0" {
                "vsock:0" // CID_ANY is written the short way
            } else {
                text
            };
            assert_eq!(shown, expected);
            assert_eq!(shown.parse::<Address>(), Ok(addr));
        }
        assert_eq!(
            Address::Vsock { cid: 2, port: 7070 }.to_string(),
            "vsock:2:7070"
        );
    }

    #[test]
    fn bad_vsock_addresses_say_what_is_wrong() {
        let err = |s: &str| s.parse::<Address>().unwrap_err().to_string();
        let e = err("vsock:x:1");
        assert!(e.contains("the CID \"x\" is not a number"), "{e}");
        assert!(e.contains("vsock:CID:PORT"), "{e}");
        let e = err("vsock:2:4294967296");
        assert!(e.contains("the port \"4294967296\" is not a number"), "{e}");
        let e = err("vsock:2:-1");
        assert!(e.contains("the port \"-1\""), "{e}");
        let e = err("vsock:");
        assert!(e.contains("the port is missing"), "{e}");
        let e = err("vsock::7070");
        assert!(e.contains("the CID is missing"), "{e}");
        let e = err("vsock:2:");
        assert!(e.contains("the port is missing"), "{e}");
        let e = err("vsock:1:2:3");
        assert!(e.contains("too many colons"), "{e}");
        assert!(matches!(
            "vsock-unix:".parse::<Address>(),
            Err(AddressError::EmptyPath(_))
        ));
        // The scheme list names vsock.
        assert!(err("udp:1").contains("vsock:CID:PORT"));

        // `vsock:2` is port 2 on any CID: fine to listen on, but a client must name the
        // CID. (for_connecting is a pure check; connect() runs it before making a socket.)
        let listen: Address = "vsock:2".parse().unwrap();
        let e = listen.for_connecting().unwrap_err().to_string();
        assert!(e.contains("vsock:2:PORT"), "{e}");
        let e = Address::Vsock {
            cid: 2,
            port: vsock::PORT_ANY,
        }
        .for_connecting()
        .unwrap_err()
        .to_string();
        assert!(e.contains("any port"), "{e}");
        assert!(Address::Vsock { cid: 2, port: 7070 }
            .for_connecting()
            .is_ok());
    }

    #[test]
    fn listeners_that_need_the_secret() {
        for (text, needs) in [
            ("unix:/s", false),
            ("ssh:h:d", false),
            ("tcp:127.0.0.1:1", true),
            ("vsock:7070", true),
            ("vsock:2:7070", true),
            ("vsock-unix:/s_7070", true),
        ] {
            assert_eq!(
                text.parse::<Address>().unwrap().needs_secret(),
                needs,
                "{text}"
            );
        }
    }

    /// The hybrid listener is a Unix socket (0600), and what it accepts carries no peer
    /// credentials, so the server asks for the secret instead of checking a uid.
    #[test]
    fn vsock_unix_listener_accepts_without_peer_credentials() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("tether-vsock-unix-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("v.sock_7070");
        let addr = Address::VsockUnix(path.clone());
        let listener = Listener::bind(&addr, None).unwrap();
        assert_eq!(listener.local_address().unwrap(), addr);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let t = std::thread::spawn(move || {
            let mut s = connect(&Address::Unix(path)).unwrap();
            s.writer.write_all(b"ping").unwrap();
            let mut buf = [0u8; 4];
            s.reader.read_exact(&mut buf).unwrap();
            buf
        });
        let mut s = listener.accept().unwrap();
        assert!(s.peer_cred.is_none());
        assert!(s.peer.starts_with("vsock-unix:"), "{}", s.peer);
        assert!(s.peer.contains("v.sock_7070 (VMM pid"), "{}", s.peer);
        let mut buf = [0u8; 4];
        s.reader.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"ping");
        s.writer.write_all(b"pong").unwrap();
        assert_eq!(&t.join().unwrap(), b"pong");
        drop(listener);
        assert!(
            !dir.join("v.sock_7070").exists(),
            "the socket file is removed"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn loopback_detection() {
        assert!(is_loopback("127.0.0.1:1").unwrap());
        assert!(is_loopback("[::1]:1").unwrap());
        assert!(!is_loopback("0.0.0.0:1").unwrap());
        assert!(!is_loopback("10.1.2.3:1").unwrap());
    }

    #[test]
    fn memory_pipe_carries_bytes_both_ways_and_closes() {
        let (mut a, mut b) = memory_pipe();
        a.writer.write_all(b"hello").unwrap();
        let mut buf = [0u8; 5];
        b.reader.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"hello");
        b.writer.write_all(b"x").unwrap();
        a.reader.read_exact(&mut buf[..1]).unwrap();
        a.closer.close();
        assert_eq!(b.reader.read(&mut buf).unwrap(), 0);
        assert!(b.writer.write(b"y").is_err());
    }
}
