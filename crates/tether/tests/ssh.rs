//! The ssh transport against a real sshd: a private one on 127.0.0.1 with its own keys and
//! configuration, whose login prints a banner before running the requested command (as
//! some shells' startup files do), so the client must find the server's magic after it.

mod common;

use std::fs;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{status, wait_until, Mount, TETHER};

const SSHD: &str = "/usr/sbin/sshd";

/// Why these tests cannot run here, if they cannot.
fn ssh_unavailable() -> Option<String> {
    if let Some(why) = common::mount_unavailable() {
        return Some(why);
    }
    if !Path::new(SSHD).exists() {
        return Some(format!("no {SSHD} (Debian package openssh-server)"));
    }
    common::first_missing(&[&["ssh", "-V"], &["ssh-keygen", "--help"]])
        .map(|p| format!("no {p} (Debian package openssh-client)"))
}

macro_rules! require_ssh {
    () => {
        if let Some(why) = ssh_unavailable() {
            common::skip(&why);
            return;
        }
    };
}

/// A private sshd on 127.0.0.1 that admits root with a key made for it; stopped when
/// dropped.
struct Sshd {
    child: Child,
    dir: tempfile::TempDir,
    port: u16,
}

impl Sshd {
    fn start() -> Sshd {
        let dir = tempfile::Builder::new()
            .prefix("tether-sshd")
            .tempdir()
            .unwrap();
        let d = dir.path();
        for key in ["host_key", "client_key"] {
            let ok = Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-f"])
                .arg(d.join(key))
                .status()
                .unwrap();
            assert!(ok.success(), "ssh-keygen failed");
        }
        fs::copy(d.join("client_key.pub"), d.join("authorized_keys")).unwrap();
        // sshd refuses a locked account (a password field starting with '!') unless PAM
        // decides.
        let shadow = fs::read_to_string("/etc/shadow").unwrap_or_default();
        let locked = shadow
            .lines()
            .find_map(|l| l.strip_prefix("root:"))
            .is_some_and(|rest| rest.starts_with('!'));
        let port = free_port();
        let config = format!(
            "Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host_key\nPidFile {d}/sshd.pid\n\
             AuthorizedKeysFile {d}/authorized_keys\nPermitRootLogin prohibit-password\n\
             PubkeyAuthentication yes\nPasswordAuthentication no\n\
             KbdInteractiveAuthentication no\nUsePAM {}\nStrictModes no\n\
             ForceCommand echo 'Welcome to the test host'; exec sh -c \"$SSH_ORIGINAL_COMMAND\"\n",
            if locked { "yes" } else { "no" },
            d = d.display()
        );
        fs::write(d.join("sshd_config"), config).unwrap();
        // sshd's privilege separation directory, which the package creates at boot.
        fs::create_dir_all("/run/sshd").unwrap();
        let child = Command::new(SSHD)
            .arg("-D")
            .arg("-e")
            .arg("-f")
            .arg(d.join("sshd_config"))
            .stderr(fs::File::create(d.join("sshd.log")).unwrap())
            .spawn()
            .unwrap();
        let mut sshd = Sshd { child, dir, port };
        let up = common::poll_until(Duration::from_secs(10), || {
            TcpStream::connect(("127.0.0.1", port)).is_ok()
                || matches!(sshd.child.try_wait(), Ok(Some(_)))
        });
        assert!(
            up && matches!(sshd.child.try_wait(), Ok(None)),
            "sshd did not start: {}",
            sshd.log()
        );
        sshd
    }

    fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("sshd.log")).unwrap_or_default()
    }

    /// The ssh command that logs in to this sshd as root.
    fn ssh_command(&self) -> String {
        format!(
            "ssh -p {} -i {} -o IdentitiesOnly=yes -o BatchMode=yes -o StrictHostKeyChecking=no \
             -o UserKnownHostsFile=/dev/null -o GlobalKnownHostsFile=/dev/null -o LogLevel=ERROR",
            self.port,
            self.dir.path().join("client_key").display()
        )
    }

    /// `tether mount` arguments for an ssh: address through this sshd.
    fn mount_args(&self) -> Vec<String> {
        vec![
            "--ssh-command".into(),
            self.ssh_command(),
            "--remote-tether".into(),
            TETHER.into(),
        ]
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// The export and mount point of one test, and the mount through ssh.
struct SshMount {
    mount: Mount,
    export: PathBuf,
    mnt: PathBuf,
    _dir: tempfile::TempDir,
}

fn mount_through(sshd: &Sshd) -> SshMount {
    let dir = tempfile::Builder::new()
        .prefix("tether-ssh")
        .tempdir()
        .unwrap();
    let (export, mnt) = (dir.path().join("export"), dir.path().join("mnt"));
    fs::create_dir(&export).unwrap();
    fs::create_dir(&mnt).unwrap();
    let address = format!("ssh:root@127.0.0.1:{}", export.display());
    let args = sshd.mount_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mount = Mount::start(&address, &mnt, &args);
    SshMount {
        mount,
        export,
        mnt,
        _dir: dir,
    }
}

/// The pids of `tether serve --stdio EXPORT` processes.
fn remote_servers(export: &Path) -> Vec<u32> {
    let want = format!("serve\0--stdio\0--\0{}\0", export.display());
    fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).ends_with(&want))
        })
        .collect()
}

#[test]
fn a_mount_through_ssh_reads_writes_and_sees_host_changes() {
    require_ssh!();
    let sshd = Sshd::start();
    // What the client must skip: the login prints before the command runs.
    let words: Vec<String> = sshd
        .ssh_command()
        .split_whitespace()
        .map(String::from)
        .collect();
    let out = Command::new(&words[0])
        .args(&words[1..])
        .args(["root@127.0.0.1", "echo", "the command"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "Welcome to the test host\nthe command\n"
    );
    let mut t = mount_through(&sshd);
    let (h, g) = (&t.export, &t.mnt);
    fs::write(h.join("from-host"), b"host").unwrap();
    assert_eq!(fs::read(g.join("from-host")).unwrap(), b"host");
    fs::create_dir(g.join("d")).unwrap();
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    fs::write(g.join("d/big"), &data).unwrap();
    assert_eq!(fs::read(h.join("d/big")).unwrap(), data);
    // The guest has the file cached; the host's change is pushed over ssh.
    fs::write(h.join("from-host"), b"changed").unwrap();
    wait_until("the host's change shows", Duration::from_secs(5), || {
        fs::read(g.join("from-host")).unwrap() == b"changed"
    });
    let report = status(g);
    assert!(
        report.contains("server: ssh:root@127.0.0.1:") && report.contains("connection: up"),
        "{report}"
    );
    assert_eq!(remote_servers(h).len(), 1);
    // Unmounting ends ssh and the remote server with it.
    let status = t.mount.stop();
    assert!(status.success(), "mount exited with {status}");
    wait_until("the remote server exits", Duration::from_secs(10), || {
        remote_servers(h).is_empty()
    });
}

#[test]
fn a_remote_server_that_dies_is_replaced_through_ssh() {
    require_ssh!();
    let sshd = Sshd::start();
    let t = mount_through(&sshd);
    fs::write(t.mnt.join("before"), b"1").unwrap();
    let servers = remote_servers(&t.export);
    assert_eq!(servers.len(), 1, "{servers:?}");
    // SAFETY: a process this test started (through ssh).
    unsafe { libc::kill(servers[0] as i32, libc::SIGKILL) };
    // The next request waits for a new ssh connection and its server.
    fs::write(t.mnt.join("after"), b"2").unwrap();
    assert_eq!(fs::read(t.export.join("after")).unwrap(), b"2");
    assert_eq!(fs::read(t.mnt.join("before")).unwrap(), b"1");
    let report = status(&t.mnt);
    assert!(report.contains("connection: up (1 reconnects"), "{report}");
    let now = remote_servers(&t.export);
    assert!(now.len() == 1 && now[0] != servers[0], "{now:?}");
}

#[test]
fn a_refused_ssh_login_fails_the_mount_with_ssh_s_reason() {
    require_ssh!();
    let sshd = Sshd::start();
    let dir = tempfile::tempdir().unwrap();
    let stranger = dir.path().join("stranger_key");
    let ok = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&stranger)
        .status()
        .unwrap();
    assert!(ok.success());
    let ssh = format!(
        "ssh -p {} -i {} -o IdentitiesOnly=yes -o BatchMode=yes -o StrictHostKeyChecking=no \
         -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR",
        sshd.port,
        stranger.display()
    );
    let mnt = dir.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let out = Command::new(TETHER)
        .arg("mount")
        .arg(format!("ssh:root@127.0.0.1:{}", dir.path().display()))
        .arg(&mnt)
        .args(["--ssh-command", &ssh, "--remote-tether", TETHER])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("Permission denied") && err.contains("ssh or the remote tether ended first"),
        "{err}"
    );
    assert!(!common::is_mounted(&mnt));
}
