//! The ssh transport: the client runs ssh, which starts `tether serve --stdio DIR` on the
//! remote host, and the protocol flows over that command's standard input and output.
//!
//! Both ends put a socket pair between the protocol and the pipes, so the session reads,
//! times out and shuts down as on any other socket ([`Stream::from_socket`]): the client
//! hands ssh one end of the pair as its standard input and output, and the server relays
//! its standard input and output to one end of a pair with two threads.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::thread;
use std::time::Duration;

use crate::{SocketKind, SshTarget, Stream};

/// After the user's own options (ssh keeps the first value it is given for each): bounds
/// on a dead link, without which a dead network would leave the client waiting on ssh,
/// and nothing of the user's forwarded to the host for the life of the mount (agent, X11,
/// ports set up again at each reconnect).
const SSH_OPTIONS: &[&str] = &[
    "-o",
    "ConnectTimeout=20",
    "-o",
    "ServerAliveInterval=15",
    "-o",
    "ServerAliveCountMax=3",
    "-o",
    "ForwardAgent=no",
    "-o",
    "ForwardX11=no",
    "-o",
    "ClearAllForwardings=yes",
    "-o",
    "PermitLocalCommand=no",
];

/// Starts ssh to `t` and returns the stream to the remote server, named `peer`.
pub(crate) fn connect(t: &SshTarget, peer: String) -> io::Result<Stream> {
    let (program, options) = t
        .command
        .split_first()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "empty ssh command"))?;
    let (ours, theirs) = UnixStream::pair()?;
    let theirs_out = theirs.try_clone()?;
    let mut command = Command::new(program);
    command
        .args(options)
        .args(SSH_OPTIONS)
        // No terminal: the stream must carry the protocol's bytes unchanged. "--" keeps a
        // destination that starts with "-" from being read as an option.
        .args(["-T", "--"])
        .arg(t.ssh_destination())
        .arg(t.remote_command())
        .stdin(Stdio::from(OwnedFd::from(theirs)))
        .stdout(Stdio::from(OwnedFd::from(theirs_out)));
    // Ctrl-C in the terminal is for the client, which unmounts; ssh would end the
    // connection under it (OpenSSH keeps an inherited SIG_IGN).
    // SAFETY: signal() is async-signal-safe, as pre_exec requires.
    unsafe {
        command.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_IGN);
            libc::signal(libc::SIGQUIT, libc::SIG_IGN);
            Ok(())
        });
    }
    let mut child = command
        .spawn()
        .map_err(|e| io::Error::new(e.kind(), format!("cannot run {program}: {e}")))?;
    // ssh exits when its input ends (the stream's closer shuts our end down) or the link
    // dies; someone must reap it.
    thread::Builder::new()
        .name("tether-ssh".into())
        .spawn(move || {
            let _ = child.wait();
        })?;
    Stream::from_socket(SocketKind::Unix(ours), peer, None)
}

/// Copies until the end of `from`, each read written on at once. Not `io::copy`: its splice
/// between sshd's pipes and the socket pair held replies back.
fn relay_bytes(from: &mut impl Read, to: &mut impl Write) -> io::Result<()> {
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        to.write_all(&buf[..n])?;
    }
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// The relay of the server's replies to standard output, which must finish before the
/// process exits: the last replies and GOODBYE are still on their way when the session
/// ends.
pub struct StdoutRelay(Receiver<()>);

impl StdoutRelay {
    /// Waits until everything the session wrote is out (at most `within`).
    pub fn finish(self, within: Duration) {
        let _ = self.0.recv_timeout(within);
    }
}

/// The server's end of `tether serve --stdio`: the protocol on this process's standard
/// input and output. From here on, standard output belongs to the protocol: whatever else
/// the process prints there goes to standard error, and standard input reads /dev/null.
pub fn stdio() -> io::Result<(Stream, StdoutRelay)> {
    // SAFETY: dup and dup2 of this process's standard descriptors; each new descriptor is
    // owned by exactly one OwnedFd.
    let (input, output) = unsafe {
        let input = OwnedFd::from_raw_fd(cvt(libc::dup(0))?);
        let output = OwnedFd::from_raw_fd(cvt(libc::dup(1))?);
        cvt(libc::dup2(2, 1))?;
        (input, output)
    };
    let null = File::open("/dev/null")?;
    // SAFETY: as above.
    cvt(unsafe { libc::dup2(std::os::fd::AsRawFd::as_raw_fd(&null), 0) })?;
    let (ours, relay) = UnixStream::pair()?;
    let relay_out = relay.try_clone()?;
    let (mut input, mut output) = (File::from(input), File::from(output));
    thread::Builder::new()
        .name("tether-stdin".into())
        .spawn(move || {
            let _ = relay_bytes(&mut input, &mut &relay);
            // The client is gone: the session reads the end of its stream.
            let _ = relay.shutdown(std::net::Shutdown::Write);
        })?;
    let (done, finished) = channel();
    thread::Builder::new()
        .name("tether-stdout".into())
        .spawn(move || {
            let _ = relay_bytes(&mut &relay_out, &mut output);
            // The client is gone (or the session ended): the session's writes fail rather
            // than wait on a pair nobody reads.
            let _ = relay_out.shutdown(std::net::Shutdown::Both);
            let _ = done.send(());
        })?;
    let peer = match std::env::var("SSH_CLIENT") {
        // "ADDRESS PORT LOCAL_PORT"
        Ok(c) => format!("ssh from {}", c.split(' ').next().unwrap_or("?")),
        Err(_) => "stdio".to_string(),
    };
    Ok((
        Stream::from_socket(SocketKind::Unix(ours), peer, None)?,
        StdoutRelay(finished),
    ))
}

#[cfg(test)]
mod tests {
    use crate::{Address, AddressError, SshTarget};

    fn target(s: &str) -> SshTarget {
        match s.parse::<Address>() {
            Ok(Address::Ssh(t)) => t,
            other => panic!("{s}: {other:?}"),
        }
    }

    #[test]
    fn parses_ssh_addresses() {
        let t = target("ssh:me@host:/srv/src");
        assert_eq!(
            (t.destination.as_str(), t.dir.as_str()),
            ("me@host", "/srv/src")
        );
        assert_eq!(t.command, ["ssh"]);
        assert_eq!(t.remote_tether, "tether");
        let t = target("ssh:[::1]:src");
        assert_eq!((t.destination.as_str(), t.dir.as_str()), ("[::1]", "src"));
        // ssh takes an IPv6 address without brackets.
        assert_eq!(t.ssh_destination(), "::1");
        assert_eq!(target("ssh:me@[::1]:src").ssh_destination(), "me@::1");
        assert_eq!(target("ssh:me@host:src").ssh_destination(), "me@host");
        let t = target("ssh:me@[fe80::1]:/a:b");
        assert_eq!(
            (t.destination.as_str(), t.dir.as_str()),
            ("me@[fe80::1]", "/a:b")
        );
        for bad in ["ssh:host", "ssh:host:", "ssh::/srv"] {
            assert!(
                matches!(bad.parse::<Address>(), Err(AddressError::NoSshDir(_))),
                "{bad}"
            );
        }
        let a = "ssh:me@host:/srv/src".parse::<Address>().unwrap();
        assert_eq!(a.to_string(), "ssh:me@host:/srv/src");
    }

    #[test]
    fn the_remote_command_quotes_the_directory() {
        let t = target("ssh:h:/srv/it's here");
        assert_eq!(
            t.remote_command(),
            r"tether serve --stdio -- '/srv/it'\''s here'"
        );
        // The remote shell starts in the home directory: `~/x` is `x` there.
        assert_eq!(
            target("ssh:h:~/src").remote_command(),
            "tether serve --stdio -- 'src'"
        );
        assert_eq!(
            target("ssh:h:~").remote_command(),
            "tether serve --stdio -- '.'"
        );
        // A directory that starts with "-" is still a directory.
        assert_eq!(
            target("ssh:h:-x").remote_command(),
            "tether serve --stdio -- '-x'"
        );
    }
}
