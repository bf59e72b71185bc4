//! Hybrid vsock (`serve --listen vsock-unix:PATH_PORT`): the Unix socket that Firecracker,
//! Cloud Hypervisor and vhost-device-vsock forward a guest's vsock connections to. Its peer
//! is the VMM, so the server authenticates by the secret, as on TCP, not by the peer's uid.
//!
//! Here the test itself plays the VMM: it connects to the socket directly (no VM, and no
//! AF_VSOCK socket is ever opened on this machine).

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use common::{ChildLog, Mount, TETHER};

/// `tether serve EXPORT --listen vsock-unix:SOCK EXTRA...` with `XDG_CONFIG_HOME=config`,
/// waiting until the socket accepts connections.
struct HybridServer {
    child: Child,
    log: ChildLog,
}

impl HybridServer {
    fn start(export: &Path, sock: &Path, config: &Path, extra: &[&str]) -> HybridServer {
        let (log, stderr) = ChildLog::new();
        let child = Command::new(TETHER)
            .arg("serve")
            .arg(export)
            .arg("--listen")
            .arg(format!("vsock-unix:{}", sock.display()))
            .args(extra)
            .env("XDG_CONFIG_HOME", config)
            .stdin(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("start tether serve");
        let mut server = HybridServer { child, log };
        let up = common::poll_until(Duration::from_secs(10), || {
            std::os::unix::net::UnixStream::connect(sock).is_ok()
                || matches!(server.child.try_wait(), Ok(Some(_)))
        });
        assert!(up, "the server did not listen on {}", sock.display());
        assert!(
            matches!(server.child.try_wait(), Ok(None)),
            "the server exited early"
        );
        server
    }
}

impl Drop for HybridServer {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            // SAFETY: signalling our own, unreaped child.
            unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        }
        let _ = self.child.wait();
        self.log.show("tether serve on vsock-unix");
    }
}

/// Runs `tether ARGS` with `XDG_CONFIG_HOME=config` (so no real default secret is used).
fn tether_in(config: &Path, args: &[&str]) -> Output {
    Command::new(TETHER)
        .args(args)
        .env("XDG_CONFIG_HOME", config)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn write_secret(path: &Path, text: &str) -> PathBuf {
    fs::write(path, text).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(0o600)).unwrap();
    path.to_path_buf()
}

/// A mount through the hybrid socket works with the secret (and /proc/mounts names the
/// transport); without it, or with a wrong one, the server refuses the connection although
/// the peer is root, the serving user (which a plain unix: listener would admit).
#[test]
fn hybrid_vsock_listener_requires_the_secret() {
    require_mount!();
    let dir = tempfile::tempdir().unwrap();
    let export = dir.path().join("e");
    let mnt = dir.path().join("m");
    let config = dir.path().join("config");
    let client_config = dir.path().join("client-config");
    for d in [&export, &mnt, &config, &client_config] {
        fs::create_dir(d).unwrap();
    }
    fs::write(export.join("f"), b"through the VMM's socket").unwrap();
    // Firecracker's naming: uds_path "v.sock", guest port 7070.
    let sock = dir.path().join("v.sock_7070");
    let addr = format!("vsock-unix:{}", sock.display());

    // No --secret-file: like TCP, the server creates the default secret and requires it.
    let _server = HybridServer::start(&export, &sock, &config, &[]);
    let secret = config.join("tether").join("secret");
    assert!(secret.exists(), "serve created no default secret");
    let mode = fs::metadata(&secret).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let secret = secret.to_str().unwrap();

    // Refused without the secret (the client's own config has none) ...
    let out = tether_in(&client_config, &["check", &addr]);
    assert!(!out.status.success(), "check without the secret succeeded");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("secret"), "{err}");
    // ... also as a plain unix: address (the peer is root, which unix: would admit) ...
    let unix_addr = format!("unix:{}", sock.display());
    let out = tether_in(&client_config, &["check", &unix_addr]);
    assert!(
        !out.status.success(),
        "unix: check without the secret succeeded"
    );
    // ... and with a wrong one.
    let wrong = write_secret(
        &dir.path().join("wrong"),
        "ffffffffffffffffffffffffffffffff\n",
    );
    let out = tether_in(
        &client_config,
        &["check", &addr, "--secret-file", wrong.to_str().unwrap()],
    );
    assert!(!out.status.success(), "check with a wrong secret succeeded");
    // A mount without the secret fails and leaves nothing mounted.
    let out = tether_in(&client_config, &["mount", &addr, mnt.to_str().unwrap()]);
    assert!(!out.status.success(), "mount without the secret succeeded");
    assert!(!common::is_mounted(&mnt));

    // With the secret: check says so, and a real mount works both ways.
    let out = tether_in(&client_config, &["check", &addr, "--secret-file", secret]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.starts_with(&format!("ok: {addr} speaks")), "{said}");
    // --ping: the bare round trip, timed (bench/vm.sh uses it in guests).
    let out = tether_in(
        &client_config,
        &["check", &addr, "--secret-file", secret, "--ping", "20"],
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && said.contains("\nping: 20 round trips, min "),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let mut m = Mount::start(&addr, &mnt, &["--secret-file", secret]);
    assert_eq!(
        fs::read(mnt.join("f")).unwrap(),
        b"through the VMM's socket"
    );
    fs::write(mnt.join("g"), b"back").unwrap();
    assert_eq!(fs::read(export.join("g")).unwrap(), b"back");
    // The mount table names the real transport.
    let mounts = fs::read_to_string("/proc/mounts").unwrap();
    let line = mounts
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some(mnt.to_str().unwrap()))
        .expect("the mount is in /proc/mounts");
    assert!(
        line.starts_with(&format!("tether:{addr} ")),
        "/proc/mounts says: {line}"
    );
    let status = common::status(&mnt);
    assert!(
        status.contains(&addr),
        "status does not name {addr}:\n{status}"
    );
    assert!(m.stop().success());
    assert!(!common::is_mounted(&mnt));
}

/// Client-side address checks need no server and open no socket. (Nothing here may reach
/// an AF_VSOCK socket: this machine's vsock leads to the machine hosting it. A `vsock:2`
/// is refused twice before that: by the command's address check and by connect().)
#[test]
fn vsock_addresses_are_checked_before_connecting() {
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().to_str().unwrap();
    for (args, want) in [
        (vec!["check", "vsock:x:1"], "the CID \"x\" is not a number"),
        (
            vec!["check", "vsock:2:4294967296"],
            "the port \"4294967296\" is not a number",
        ),
        // A listening address (port 2, any CID) cannot be dialled.
        (vec!["check", "vsock:2"], "vsock:2:PORT"),
        (vec!["mount", "vsock:7070", mnt], "vsock:2:PORT"),
        (vec!["mount", "vsock:1:2:3", mnt], "too many colons"),
    ] {
        let out = tether_in(dir.path(), &args);
        assert!(!out.status.success(), "{args:?} succeeded");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
    }
}
