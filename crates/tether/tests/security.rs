//! Who may connect and what they may do: the TCP secret, Unix socket permissions and peer
//! credentials, ownership mapping through real mounts, and hostile input (oversized,
//! truncated and unknown frames, silence, too many handles, a flood) against a real server.
//! The export boundary itself is attacked in boundary.rs.

mod common;

use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::{TestMount, TETHER};
use tether_client::rpc::{ConnectOptions, PushHandler};
use tether_client::Connection;
use tether_proto::auth::{self, Role};
use tether_proto::handshake::features;
use tether_proto::{
    Caller, FrameKind, Hello, HelloReply, Op, Reply, Request, WireErrno, MAGIC, MAX_FRAME_LEN,
    PROTOCOL_VERSION, ROOT_NODE,
};
use tether_transport::framed::{read_frame, read_magic};
use tether_transport::Address;

/// A `tether serve` whose log goes to a file the test reads.
struct LoggedServer {
    child: Child,
    log: PathBuf,
    address: String,
    /// What a client needs to prove, for TCP servers.
    secret: Option<Vec<u8>>,
}

impl LoggedServer {
    /// Starts `tether serve DIR --listen LISTEN EXTRA...` with `env`, and waits for the line
    /// that says where it listens (the real port, for port 0).
    fn start(dir: &Path, listen: &str, extra: &[&str], env: &[(&str, &Path)]) -> LoggedServer {
        let log = dir.with_extension(format!("log-{}", rand::random::<u32>()));
        let mut cmd = Command::new(TETHER);
        cmd.arg("serve")
            .env_remove("XDG_CONFIG_HOME")
            .arg(dir)
            .args(["--listen", listen])
            .args(extra)
            .stdin(Stdio::null())
            .stderr(fs::File::create(&log).unwrap());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("start tether serve");
        let mut server = LoggedServer {
            child,
            log,
            address: String::new(),
            secret: None,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let text = server.log_text();
            // A whole line only: the log may be read while the server writes it.
            let whole = |l: &&str| l.ends_with('\n') && l.contains("tether: serving");
            if let Some(line) = text.split_inclusive('\n').find(whole) {
                server.address = line.trim_end().rsplit(" on ").next().unwrap().to_string();
                server.address = server.address.trim_end_matches(" (read-only)").to_string();
                return server;
            }
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("tether serve exited early ({status}): {text}");
            }
            assert!(Instant::now() < deadline, "server did not start: {text}");
            thread::sleep(Duration::from_millis(20));
        }
    }

    fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the log contains `what` (logging is asynchronous to the client's view).
    fn wait_log(&self, what: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let text = self.log_text();
            if text.contains(what) {
                return text;
            }
            assert!(
                Instant::now() < deadline,
                "server log never said {what:?}:\n{text}"
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    fn addr(&self) -> Address {
        self.address.parse().unwrap()
    }

    fn rss_kib(&self) -> u64 {
        let status = fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    fn assert_alive(&self) {
        let pid = self.child.id() as i32;
        // SAFETY: signal 0 only checks that our child exists.
        assert_eq!(unsafe { libc::kill(pid, 0) }, 0, "the server died");
        let conn = Connection::start_with(
            tether_transport::connect(&self.addr()).unwrap(),
            ConnectOptions {
                client_name: "alive-check".into(),
                secret: self.secret.clone(),
                ..ConnectOptions::default()
            },
        )
        .expect("a fresh client is served");
        assert_eq!(conn.call_wait(me(), &Request::Ping), Ok(Reply::Empty));
        conn.shut_down();
    }
}

impl Drop for LoggedServer {
    fn drop(&mut self) {
        // SAFETY: signalling our own child process.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
        let _ = fs::remove_file(&self.log);
    }
}

fn me() -> Caller {
    Caller {
        uid: 0,
        gid: 0,
        pid: std::process::id(),
    }
}

fn tether(args: &[&str], env: &[(&str, &Path)]) -> Output {
    let mut cmd = Command::new(TETHER);
    cmd.args(args).env_remove("XDG_CONFIG_HOME");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `tether ARGS` run as `uid`:`gid` (with `groups` as its supplementary groups).
fn tether_as(uid: u32, gid: u32, groups: &[u32], args: &[&str]) -> Output {
    let groups = if groups.is_empty() {
        "--clear-groups".to_string()
    } else {
        format!(
            "--groups={}",
            groups
                .iter()
                .map(|g| g.to_string())
                .collect::<Vec<_>>()
                .join(",")
        )
    };
    Command::new("setpriv")
        .args([
            &format!("--reuid={uid}"),
            &format!("--regid={gid}"),
            &groups,
        ])
        .arg(common::tether_for_others())
        .args(args)
        .env("HOME", "/nonexistent")
        .output()
        .expect("setpriv (util-linux) runs")
}

fn write_secret(path: &Path, content: &str) {
    fs::write(path, content).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(0o600)).unwrap();
}

/// A temp dir others can traverse, so processes run as other users reach sockets and mounts.
fn open_tempdir() -> tempfile::TempDir {
    let d = tempfile::Builder::new()
        .prefix("tether-security")
        .tempdir()
        .unwrap();
    fs::set_permissions(d.path(), fs::Permissions::from_mode(0o755)).unwrap();
    d
}

/// A client that speaks the protocol by hand, to send what the real client never would.
struct RawClient {
    reader: Box<dyn Read + Send>,
    writer: Box<dyn Write + Send>,
    closer: tether_transport::Closer,
}

impl RawClient {
    fn connect(addr: &Address) -> RawClient {
        let s = tether_transport::connect(addr).unwrap();
        let mut c = RawClient {
            reader: s.reader,
            writer: s.writer,
            closer: s.closer,
        };
        c.writer.write_all(&MAGIC).unwrap();
        read_magic(&mut *c.reader, 0).unwrap();
        c
    }

    /// Sends HELLO with `nonce` and returns the server's answer.
    fn hello(&mut self, nonce: [u8; 32]) -> HelloReply {
        let hello = Request::Hello(Hello {
            min_version: PROTOCOL_VERSION,
            max_version: PROTOCOL_VERSION,
            features: 0,
            max_frame: MAX_FRAME_LEN as u32,
            owner_uid: 0,
            owner_gid: 0,
            client_nonce: nonce,
            client_name: b"raw-test".to_vec(),
        });
        self.send(&hello.to_frame(0, Caller::default()));
        match self.reply(Op::Hello) {
            Ok(Reply::Hello(h)) => h,
            other => panic!("HELLO answered with {other:?}"),
        }
    }

    /// Completes a handshake with a server that needs no secret.
    fn ready(addr: &Address) -> RawClient {
        let mut c = RawClient::connect(addr);
        assert!(c.hello([1; 32]).challenge.is_none());
        c
    }

    fn send(&mut self, frame: &[u8]) {
        self.writer.write_all(frame).unwrap();
        self.writer.flush().unwrap();
    }

    fn call(&mut self, id: u64, req: &Request) -> Result<Reply, WireErrno> {
        self.send(&req.to_frame(id, me()));
        self.reply(req.op())
    }

    fn reply(&mut self, op: Op) -> Result<Reply, WireErrno> {
        let (h, body) = read_frame(&mut *self.reader, MAX_FRAME_LEN)
            .unwrap()
            .expect("a reply, not the end of the connection");
        assert_eq!(h.kind, FrameKind::Reply);
        assert_eq!(h.op, op as u16);
        Reply::decode(h.op, body).unwrap()
    }

    /// True when the server has closed the connection (within a few seconds).
    fn closed_by_server(&mut self) -> bool {
        let (r, w) = (&mut self.reader, &mut self.writer);
        let _ = w.flush();
        let mut buf = [0u8; 4096];
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match r.read(&mut buf) {
                Ok(0) | Err(_) => return true,
                Ok(_) => {}
            }
            if Instant::now() > deadline {
                return false;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// TCP: the shared secret

#[test]
fn tcp_server_creates_a_private_secret_and_admits_only_its_holders() {
    let dir = open_tempdir();
    let export = dir.path().join("export");
    fs::create_dir(&export).unwrap();
    fs::write(export.join("f"), b"data").unwrap();
    let home = dir.path().join("home");
    fs::create_dir(&home).unwrap();
    let mut server = LoggedServer::start(&export, "tcp:127.0.0.1:0", &[], &[("HOME", &home)]);
    let secret_path = home.join(".config/tether/secret");
    server.wait_log("created a new secret");
    let meta = fs::metadata(&secret_path).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert_eq!(
        fs::metadata(secret_path.parent().unwrap())
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o700
    );
    let secret = fs::read_to_string(&secret_path).unwrap();
    assert_eq!(secret.trim().len(), 64, "32 random bytes as hex");
    server.secret = Some(secret.trim().as_bytes().to_vec());
    let addr = server.address.clone();
    let secret_arg = secret_path.to_str().unwrap();

    // The holder of the secret gets in.
    let ok = tether(&["check", &addr, "--secret-file", secret_arg], &[]);
    assert!(ok.status.success(), "{}", stderr(&ok));
    assert!(String::from_utf8_lossy(&ok.stdout).starts_with("ok: "));
    // So does one that finds it in its default place.
    let ok = tether(&["check", &addr], &[("HOME", &home)]);
    assert!(ok.status.success(), "{}", stderr(&ok));

    // Without a secret: a clear message, and the server logs the attempt.
    let empty_home = dir.path().join("empty-home");
    fs::create_dir(&empty_home).unwrap();
    let no = tether(&["check", &addr], &[("HOME", &empty_home)]);
    assert!(!no.status.success());
    assert!(
        stderr(&no).contains("requires a secret") && stderr(&no).contains("--secret-file"),
        "{}",
        stderr(&no)
    );
    server.wait_log("did not prove it knows the secret");

    // A wrong secret: the client notices the server cannot prove it knows ours, and stops.
    let wrong = dir.path().join("wrong");
    write_secret(&wrong, "this-is-not-the-secret-0123456789");
    let no = tether(
        &["check", &addr, "--secret-file", wrong.to_str().unwrap()],
        &[],
    );
    assert!(!no.status.success());
    assert!(
        stderr(&no).contains("does not know our secret"),
        "{}",
        stderr(&no)
    );
    // A mount with the wrong secret fails the same way, before mounting anything.
    let mnt = dir.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let no = tether(
        &[
            "mount",
            &addr,
            mnt.to_str().unwrap(),
            "--secret-file",
            wrong.to_str().unwrap(),
        ],
        &[],
    );
    assert!(!no.status.success());
    assert!(stderr(&no).contains("does not know our secret"));
    assert!(!common::is_mounted(&mnt));
    server.assert_alive();
}

#[test]
fn tcp_proofs_are_checked_cannot_be_replayed_and_come_before_any_request() {
    let dir = open_tempdir();
    let export = dir.path().join("export");
    fs::create_dir(&export).unwrap();
    let secret_path = dir.path().join("secret");
    let secret = "0123456789abcdef0123456789abcdef";
    write_secret(&secret_path, secret);
    let mut server = LoggedServer::start(
        &export,
        "tcp:127.0.0.1:0",
        &["--secret-file", secret_path.to_str().unwrap()],
        &[],
    );
    server.secret = Some(secret.as_bytes().to_vec());
    let addr = server.addr();
    let nonce = [42u8; 32];

    // A correct proof unlocks the session's real terms.
    let mut c = RawClient::connect(&addr);
    let challenge = c.hello(nonce).challenge.expect("a challenge");
    assert!(
        auth::verify(
            secret.as_bytes(),
            Role::Server,
            &nonce,
            &challenge.server_nonce,
            &challenge.server_proof
        ),
        "the server proves it knows the secret"
    );
    let proof = auth::proof(
        secret.as_bytes(),
        Role::Client,
        &nonce,
        &challenge.server_nonce,
    );
    let Ok(Reply::Hello(terms)) = c.call(1, &Request::Auth { proof }) else {
        panic!("a correct proof is accepted")
    };
    assert!(terms.challenge.is_none() && terms.max_in_flight > 0);
    assert!(matches!(
        c.call(
            2,
            &Request::Getattr {
                node: ROOT_NODE,
                fh: None
            }
        ),
        Ok(Reply::Attr(_))
    ));

    // The same proof on a new connection, with the same client nonce, is refused: the
    // server's nonce is fresh each time.
    let mut replay = RawClient::connect(&addr);
    let second = replay.hello(nonce).challenge.unwrap();
    assert_ne!(second.server_nonce, challenge.server_nonce);
    assert_eq!(
        replay.call(1, &Request::Auth { proof }),
        Err(WireErrno::EACCES)
    );
    assert!(replay.closed_by_server());
    server.wait_log("does not know the secret");

    // A guessed proof is refused.
    let mut guess = RawClient::connect(&addr);
    guess.hello([7; 32]);
    assert_eq!(
        guess.call(1, &Request::Auth { proof: [0; 32] }),
        Err(WireErrno::EACCES)
    );

    // Any request before AUTH ends the connection unanswered.
    let mut early = RawClient::connect(&addr);
    early.hello([8; 32]);
    early.send(
        &Request::Getattr {
            node: ROOT_NODE,
            fh: None,
        }
        .to_frame(1, me()),
    );
    assert!(early.closed_by_server());
    server.assert_alive();
}

/// A TCP relay that records every byte it forwards, both ways.
fn recording_relay(target: String) -> (String, Arc<Mutex<Vec<u8>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = format!("tcp:{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { return };
            let server = TcpStream::connect(&target).unwrap();
            for (mut from, mut to) in [
                (client.try_clone().unwrap(), server.try_clone().unwrap()),
                (server, client),
            ] {
                let log = log.clone();
                thread::spawn(move || {
                    let mut buf = [0u8; 65536];
                    while let Ok(n) = from.read(&mut buf) {
                        if n == 0 || to.write_all(&buf[..n]).is_err() {
                            break;
                        }
                        log.lock().unwrap().extend_from_slice(&buf[..n]);
                    }
                    let _ = to.shutdown(std::net::Shutdown::Both);
                });
            }
        }
    });
    (addr, seen)
}

#[test]
fn the_secret_never_crosses_the_wire() {
    let dir = open_tempdir();
    let export = dir.path().join("export");
    fs::create_dir(&export).unwrap();
    fs::write(export.join("f"), b"data").unwrap();
    let secret_path = dir.path().join("secret");
    let secret = "c0ffee11c0ffee22c0ffee33c0ffee44";
    write_secret(&secret_path, secret);
    let secret_arg = ["--secret-file", secret_path.to_str().unwrap()];
    let server = LoggedServer::start(&export, "tcp:127.0.0.1:0", &secret_arg, &[]);
    let target = server.address.trim_start_matches("tcp:").to_string();
    let (relay, seen) = recording_relay(target);
    for _ in 0..2 {
        let ok = tether(&["check", &relay, secret_arg[0], secret_arg[1]], &[]);
        assert!(ok.status.success(), "{}", stderr(&ok));
    }
    let wire = seen.lock().unwrap().clone();
    assert!(
        wire.windows(MAGIC.len()).filter(|w| *w == MAGIC).count() >= 4,
        "the relay saw both handshakes"
    );
    // Not the secret, nor any 8-byte piece of it.
    for piece in secret.as_bytes().windows(8) {
        assert!(
            !wire.windows(piece.len()).any(|w| w == piece),
            "secret bytes {:?} crossed the wire",
            String::from_utf8_lossy(piece)
        );
    }
}

// ---------------------------------------------------------------------------------------
// Unix sockets: file permissions and peer credentials

#[test]
fn unix_socket_admits_only_the_serving_user_and_its_group() {
    let dir = open_tempdir();
    let export = dir.path().join("export");
    fs::create_dir(&export).unwrap();
    let sock = dir.path().join("s.sock");
    let listen = format!("unix:{}", sock.display());
    let server = LoggedServer::start(&export, &listen, &[], &[]);
    assert_eq!(
        fs::metadata(&sock).unwrap().permissions().mode() & 0o777,
        0o600
    );

    let ok = tether(&["check", &listen], &[]);
    assert!(ok.status.success(), "{}", stderr(&ok));
    // Another user cannot even connect...
    let no = tether_as(65534, 65534, &[], &["check", &listen]);
    assert!(!no.status.success());
    assert!(stderr(&no).contains("cannot connect"), "{}", stderr(&no));
    // ...and if someone loosens the socket's mode, the server still refuses them.
    fs::set_permissions(&sock, fs::Permissions::from_mode(0o666)).unwrap();
    let no = tether_as(65534, 65534, &[], &["check", &listen]);
    assert!(
        !no.status.success(),
        "{}",
        String::from_utf8_lossy(&no.stdout)
    );
    server.wait_log("refused: uid 65534 is not the serving user");
    server.assert_alive();
    drop(server);

    // With --socket-group, members of the group (primary or supplementary) get in.
    let group = 4321u32;
    let server = LoggedServer::start(
        &export,
        &listen,
        &["--socket-group", &group.to_string()],
        &[],
    );
    let meta = fs::metadata(&sock).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o660);
    assert_eq!(meta.gid(), group);
    let ok = tether_as(65534, group, &[], &["check", &listen]);
    assert!(ok.status.success(), "{}", stderr(&ok));
    let ok = tether_as(65534, 65534, &[group], &["check", &listen]);
    assert!(ok.status.success(), "{}", stderr(&ok));
    let no = tether_as(65534, 65534, &[], &["check", &listen]);
    assert!(!no.status.success());
    server.assert_alive();
}

// ---------------------------------------------------------------------------------------
// Ownership

/// Runs `sh -c SCRIPT` as uid:gid 1000:1000 and returns its output.
fn sh_as_1000(script: &str) -> Output {
    Command::new("setpriv")
        .args(["--reuid=1000", "--regid=1000", "--clear-groups", "sh", "-c"])
        .arg(script)
        .output()
        .unwrap()
}

fn owner(p: &Path) -> (u32, u32) {
    let m = fs::symlink_metadata(p).unwrap();
    (m.uid(), m.gid())
}

fn chown(p: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
    std::os::unix::fs::chown(p, Some(uid), Some(gid))
}

/// A mount whose temp dir other users can traverse, with `hostfile` owned by 4242:4242,
/// `rootfile` by root, and a world-writable directory `pub`.
fn ownership_mount(serve_args: &[&str], mount_args: &[&str]) -> TestMount {
    let t = TestMount::start_with(serve_args, mount_args);
    fs::set_permissions(t.dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(&t.export, fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(t.export.join("hostfile"), b"h").unwrap();
    chown(&t.export.join("hostfile"), 4242, 4242).unwrap();
    fs::write(t.export.join("rootfile"), b"r").unwrap();
    fs::create_dir(t.export.join("pub")).unwrap();
    fs::set_permissions(t.export.join("pub"), fs::Permissions::from_mode(0o777)).unwrap();
    t
}

#[test]
fn squash_shows_every_file_as_the_guest_owners_and_creates_as_the_serving_user() {
    require_mount!();
    let t = ownership_mount(&[], &["--uid", "1000", "--gid", "1000"]);
    let m = &t.mnt;
    assert_eq!(owner(&m.join("hostfile")), (1000, 1000));
    assert_eq!(owner(&m.join("rootfile")), (1000, 1000));
    assert_eq!(owner(m), (1000, 1000));
    // The guest owner writes, creates and chmods as the owner of everything.
    let out = sh_as_1000(&format!(
        "echo mine > {m}/new && chmod 600 {m}/new && echo more >> {m}/rootfile && mkdir {m}/d",
        m = m.display()
    ));
    assert!(out.status.success(), "{}", stderr(&out));
    // On the host, new files belong to the user running serve (root here).
    assert_eq!(owner(&t.export.join("new")), (0, 0));
    assert_eq!(owner(&t.export.join("d")), (0, 0));
    assert_eq!(
        fs::metadata(t.export.join("new"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o600
    );
    assert_eq!(fs::read(t.export.join("rootfile")).unwrap(), b"rmore\n");
    // chown to the owner changes nothing; to anyone else it is refused.
    chown(&m.join("new"), 1000, 1000).unwrap();
    assert_eq!(owner(&t.export.join("new")), (0, 0));
    let e = chown(&m.join("new"), 0, 0).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EPERM));
    let e = chown(&m.join("hostfile"), 1000, 5).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EPERM));
    assert_eq!(owner(&t.export.join("hostfile")), (4242, 4242));
    assert!(common::status(m).contains("ownership: squash"));
}

#[test]
fn passthrough_shows_host_ids_and_creates_as_the_guest_caller() {
    require_mount!();
    let t = ownership_mount(&["--map-ids", "passthrough"], &[]);
    let m = &t.mnt;
    assert_eq!(owner(&m.join("hostfile")), (4242, 4242));
    assert_eq!(owner(&m.join("rootfile")), (0, 0));
    let out = sh_as_1000(&format!("echo x > {}/pub/mine", m.display()));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(owner(&t.export.join("pub/mine")), (1000, 1000));
    // A user cannot write a file that is not theirs.
    let out = sh_as_1000(&format!("echo x >> {}/hostfile", m.display()));
    assert!(!out.status.success());
    chown(&m.join("pub/mine"), 4243, 4244).unwrap();
    assert_eq!(owner(&t.export.join("pub/mine")), (4243, 4244));
}

#[test]
fn explicit_maps_translate_both_ways_and_refuse_unmapped_ids() {
    require_mount!();
    let t = ownership_mount(&["--map-ids", "uid:1000:4242,gid:1000:4242"], &[]);
    let m = &t.mnt;
    assert_eq!(owner(&m.join("hostfile")), (1000, 1000));
    assert_eq!(owner(&m.join("rootfile")), (65534, 65534));
    let out = sh_as_1000(&format!(
        "echo x > {m}/pub/mine && echo more >> {m}/hostfile",
        m = m.display()
    ));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(owner(&t.export.join("pub/mine")), (4242, 4242));
    assert_eq!(fs::read(t.export.join("hostfile")).unwrap(), b"hmore\n");
    // Guest root is not in the map: it cannot create, nor give files to unmapped ids.
    let e = fs::write(m.join("pub/by-root"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EPERM));
    let e = chown(&m.join("pub/mine"), 5, 5).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
    assert_eq!(owner(&t.export.join("pub/mine")), (4242, 4242));
}

// ---------------------------------------------------------------------------------------
// Hostile input and limits

fn unix_server(dir: &tempfile::TempDir, extra: &[&str]) -> LoggedServer {
    let export = dir.path().join("export");
    fs::create_dir_all(&export).unwrap();
    let listen = format!("unix:{}", dir.path().join("s.sock").display());
    LoggedServer::start(&export, &listen, extra, &[])
}

#[test]
fn bad_frames_close_only_their_own_connection() {
    let dir = open_tempdir();
    let server = unix_server(&dir, &[]);
    let addr = server.addr();
    let mut bystander = RawClient::ready(&addr);
    let mut ping_id = 100;
    let mut bystander_pings = |b: &mut RawClient| {
        ping_id += 1;
        assert_eq!(b.call(ping_id, &Request::Ping), Ok(Reply::Empty));
    };

    // An unknown op gets ENOSYS and the session goes on.
    let mut c = RawClient::ready(&addr);
    let mut frame = Request::Ping.to_frame(1, me());
    frame[6..8].copy_from_slice(&999u16.to_le_bytes());
    c.send(&frame);
    let (h, body) = read_frame(&mut *c.reader, MAX_FRAME_LEN).unwrap().unwrap();
    assert_eq!(h.op, 999);
    assert_eq!(&body[..], &(WireErrno::ENOSYS.0 as i32).to_le_bytes());
    assert_eq!(c.call(2, &Request::Ping), Ok(Reply::Empty));

    // A frame claiming 4 GiB is refused before anything is allocated.
    let mut frame = Request::Ping.to_frame(3, me());
    frame[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
    c.send(&frame);
    assert!(c.closed_by_server());
    server.wait_log("session closed");
    bystander_pings(&mut bystander);

    // A request whose body is cut short.
    let mut c = RawClient::ready(&addr);
    let mut frame = Request::Lookup {
        parent: ROOT_NODE,
        name: "abc".into(),
    }
    .to_frame(1, me());
    let n = frame.len();
    frame[0..4].copy_from_slice(&((n - 4 - 3) as u32).to_le_bytes());
    c.send(&frame[..n - 3]);
    assert!(c.closed_by_server());
    bystander_pings(&mut bystander);

    // A frame cut off by the end of the connection.
    let mut c = RawClient::ready(&addr);
    c.send(&Request::Ping.to_frame(1, me())[..10]);
    drop(c);
    bystander_pings(&mut bystander);

    // A reply or push frame sent to the server, and a second HELLO.
    let mut c = RawClient::ready(&addr);
    let mut frame = Request::Ping.to_frame(1, me());
    frame[4] = FrameKind::Reply as u8;
    c.send(&frame);
    assert!(c.closed_by_server());
    let mut c = RawClient::ready(&addr);
    let again = Request::Hello(Hello {
        min_version: PROTOCOL_VERSION,
        max_version: PROTOCOL_VERSION,
        features: 0,
        max_frame: 0,
        owner_uid: 0,
        owner_gid: 0,
        client_nonce: [0; 32],
        client_name: Vec::new(),
    });
    c.send(&again.to_frame(9, me()));
    assert_eq!(c.reply(Op::Hello), Err(WireErrno::EINVAL));
    assert_eq!(c.call(10, &Request::Ping), Ok(Reply::Empty));
    bystander_pings(&mut bystander);

    // Garbage instead of the magic.
    let Address::Unix(path) = &addr else {
        unreachable!()
    };
    let mut s = std::os::unix::net::UnixStream::connect(path).unwrap();
    s.write_all(&[0u8; 64]).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    assert!(buf.len() <= MAGIC.len(), "only the magic, then closed");
    bystander_pings(&mut bystander);
    server.assert_alive();
}

#[test]
fn a_silent_connection_is_closed_after_the_handshake_timeout() {
    let dir = open_tempdir();
    let server = unix_server(&dir, &["--handshake-timeout", "0.3"]);
    let Address::Unix(path) = server.addr() else {
        unreachable!()
    };
    let started = Instant::now();
    let mut s = std::os::unix::net::UnixStream::connect(&path).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    assert_eq!(buf, MAGIC, "the server greets, then hangs up");
    assert!(started.elapsed() < Duration::from_secs(5));
    server.wait_log("no handshake within the time limit");
    // The limit covers only the handshake: an idle session after it stays up.
    let mut c = RawClient::ready(&server.addr());
    thread::sleep(Duration::from_millis(600));
    assert_eq!(c.call(1, &Request::Ping), Ok(Reply::Empty));
}

#[test]
fn connections_beyond_the_session_limit_are_refused_until_one_ends() {
    let dir = open_tempdir();
    let server = unix_server(&dir, &["--max-sessions", "2"]);
    let addr = server.addr();
    let mut a = RawClient::ready(&addr);
    let _b = RawClient::ready(&addr);
    let Address::Unix(path) = &addr else {
        unreachable!()
    };
    let mut third = std::os::unix::net::UnixStream::connect(path).unwrap();
    third
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut buf = Vec::new();
    let _ = third.read_to_end(&mut buf);
    assert!(buf.is_empty(), "closed before the greeting");
    server.wait_log("refused: 2 sessions already");
    assert_eq!(a.call(1, &Request::Ping), Ok(Reply::Empty));
    // When one ends, a new one is admitted.
    a.closer.close();
    drop(a);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = tether_transport::connect(&addr).unwrap();
        let ok = Connection::start(s, "late", None, false)
            .map(|c| c.call_wait(me(), &Request::Ping).is_ok())
            .unwrap_or(false);
        if ok {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no session admitted after one ended"
        );
        thread::sleep(Duration::from_millis(50));
    }
}

/// Attributes in replies (DIR_ATTR, WRITE_ATTR) and creation without a handle serve only a
/// client that may keep what it is told, one that takes pushed invalidations: a client
/// without them is not granted them, so the server makes no `fstat` for nothing after each
/// creation and write.
#[test]
fn reply_attributes_are_granted_only_with_pushed_invalidations() {
    let dir = open_tempdir();
    let server = unix_server(&dir, &[]);
    let granted = |pushes: bool| {
        let on_push: Option<PushHandler> = pushes.then(|| Box::new(|_, _| {}) as PushHandler);
        let stream = tether_transport::connect(&server.addr()).unwrap();
        let conn = Connection::start(stream, "features", on_push, false).expect("handshake");
        let f = conn.hello.features;
        conn.shut_down();
        f
    };
    let keepers = features::DIR_ATTR | features::WRITE_ATTR | features::CREATE_NO_HANDLE;
    let with_pushes = keepers | features::PUSH_INVALIDATE;
    assert_eq!(granted(false) & with_pushes, 0);
    assert_eq!(granted(true) & with_pushes, with_pushes);
}

#[test]
fn a_directory_handle_lists_only_its_own_node() {
    let dir = open_tempdir();
    let server = unix_server(&dir, &[]);
    fs::create_dir(dir.path().join("export/sub")).unwrap();
    let mut c = RawClient::ready(&server.addr());
    let Ok(Reply::Entry(sub)) = c.call(
        1,
        &Request::Lookup {
            parent: ROOT_NODE,
            name: "sub".into(),
        },
    ) else {
        panic!("lookup sub")
    };
    let Ok(Reply::Open { fh, .. }) = c.call(
        2,
        &Request::Opendir {
            node: ROOT_NODE,
            flags: 0,
        },
    ) else {
        panic!("opendir")
    };
    // The root's handle addressed as "sub": its ".." would be the host directory above the
    // export, and its entries would be remembered under the wrong parent. The handle is
    // not open on "sub", so it is a bad handle there.
    for plus in [false, true] {
        assert_eq!(
            c.call(
                3,
                &Request::Readdir {
                    node: sub.node,
                    fh: Some(fh),
                    offset: 0,
                    size: 4096,
                    plus
                }
            ),
            Err(WireErrno::EBADF)
        );
    }
    assert!(matches!(
        c.call(
            4,
            &Request::Readdir {
                node: ROOT_NODE,
                fh: Some(fh),
                offset: 0,
                size: 4096,
                plus: true
            }
        ),
        Ok(Reply::Dir { .. })
    ));
}

#[test]
fn open_handles_are_capped_per_client() {
    let dir = open_tempdir();
    let server = unix_server(&dir, &["--max-handles", "8"]);
    let addr = server.addr();
    let mut a = RawClient::ready(&addr);
    let open = |c: &mut RawClient, id| {
        c.call(
            id,
            &Request::Opendir {
                node: ROOT_NODE,
                flags: 0,
            },
        )
    };
    let mut handles = Vec::new();
    for id in 1..=8 {
        match open(&mut a, id) {
            Ok(Reply::Open { fh, .. }) => handles.push(fh),
            other => panic!("open {id}: {other:?}"),
        }
    }
    for id in 9..20 {
        assert_eq!(open(&mut a, id), Err(WireErrno::EMFILE));
    }
    // The session goes on; closing one makes room for one.
    assert_eq!(
        a.call(
            30,
            &Request::Releasedir {
                node: ROOT_NODE,
                fh: Some(handles[0])
            }
        ),
        Ok(Reply::Empty)
    );
    assert!(matches!(open(&mut a, 31), Ok(Reply::Open { .. })));
    assert_eq!(open(&mut a, 32), Err(WireErrno::EMFILE));
    // Another client has its own allowance.
    let mut b = RawClient::ready(&addr);
    for id in 1..=8 {
        assert!(matches!(open(&mut b, id), Ok(Reply::Open { .. })));
    }
    server.assert_alive();
}

#[test]
fn a_flood_from_one_client_does_not_starve_another() {
    let dir = open_tempdir();
    let server = unix_server(&dir, &[]);
    fs::write(dir.path().join("export/f"), vec![7u8; 4096]).unwrap();
    let addr = server.addr();
    let rss_before = server.rss_kib();

    // The flooder pipelines requests as fast as it can and never reads a reply.
    let mut flooder = RawClient::ready(&addr);
    let frame = Request::Getattr {
        node: ROOT_NODE,
        fh: None,
    }
    .to_frame(1, me());
    let burst: Vec<u8> = frame
        .iter()
        .copied()
        .cycle()
        .take(frame.len() * 1000)
        .collect();
    let sent = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = sent.clone();
    let mut writer = std::mem::replace(&mut flooder.writer, Box::new(std::io::sink()));
    let flood = thread::spawn(move || {
        while writer.write_all(&burst).is_ok() {
            count.fetch_add(1000, std::sync::atomic::Ordering::Relaxed);
        }
    });
    // Wait until the flood has filled the pipes.
    thread::sleep(Duration::from_millis(500));

    let conn = Connection::start_with(
        tether_transport::connect(&addr).unwrap(),
        ConnectOptions {
            client_name: "bystander".into(),
            ..ConnectOptions::default()
        },
    )
    .unwrap();
    let started = Instant::now();
    for _ in 0..500 {
        assert!(matches!(
            conn.call_wait(
                me(),
                &Request::Getattr {
                    node: ROOT_NODE,
                    fh: None
                }
            ),
            Ok(Reply::Attr(_))
        ));
    }
    let took = started.elapsed();
    let rss_during = server.rss_kib();
    let flooded = sent.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!(
        "bystander: 500 getattrs in {took:?} while the flooder had sent {flooded} requests; \
         server RSS {rss_before} -> {rss_during} KiB"
    );
    assert!(flooded >= 1000, "the flood ran");
    // Generous bounds: starvation would mean no progress at all, not a slow machine.
    assert!(
        took < Duration::from_secs(20),
        "bystander starved: {took:?}"
    );
    assert!(
        rss_during < rss_before + 64 * 1024,
        "server memory grew from {rss_before} to {rss_during} KiB"
    );
    conn.shut_down();
    // Closing the flooder's connection ends its flood and frees its blocked workers.
    flooder.closer.close();
    flood.join().unwrap();
    server.assert_alive();
}
