//! VM tests: a real Linux guest under QEMU mounts a `tether serve` running here, over vsock
//! (vhost-device-vsock, whose host side is a Unix socket: `serve --listen vsock-unix:`) and
//! over TCP (QEMU user networking forwarding a guest port to host loopback). The guest is
//! Debian's kernel with a busybox initramfs holding the static tether
//! (scripts/vm/build-guest.sh, built once per test run); scripts/vm/run.sh boots it and
//! runs a shell script in it. Each test boots one guest (about 25 s under TCG); one guest
//! runs at a time. docs/vm.md tells more.
//!
//! No AF_VSOCK socket is opened on this machine: the guest's vsock ends in a Unix socket.
//! QEMU, vhost-device-vsock and the servers are stopped and the temporary files removed
//! however a test ends.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::{ChildLog, TETHER};

const SCRIPTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/vm");

/// How long one guest may take, boot included (a boot takes about 25 s under TCG on an
/// idle machine; a loaded one is slower).
const GUEST_TIMEOUT: Duration = Duration::from_secs(300);

/// The port the guest's vsock connections go to (host side: UDS_7070).
const VSOCK_PORT: u32 = 7070;

/// Whether guests can be booted here; builds the guest (once per run) the first time. A
/// machine without real mounts skips; where they run (root with /dev/fuse, as on CI),
/// building the guest must work: build-guest.sh installs what it needs.
fn guest_ready() -> bool {
    if let Some(why) = common::mount_unavailable() {
        eprintln!("SKIPPED: {why}");
        return false;
    }
    if std::env::consts::ARCH != "x86_64" {
        common::skip_anywhere("the test guest is an x86_64 one");
        return false;
    }
    static BUILT: OnceLock<Result<String, String>> = OnceLock::new();
    let built = BUILT.get_or_init(|| {
        let started = Instant::now();
        let out = Command::new(format!("{SCRIPTS}/build-guest.sh"))
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run build-guest.sh: {e}"))?;
        let log = String::from_utf8_lossy(&out.stderr).into_owned();
        if out.status.success() {
            Ok(format!(
                "{log}(build-guest.sh took {:?})",
                started.elapsed()
            ))
        } else {
            Err(format!(
                "scripts/vm/build-guest.sh failed ({}):\n{log}",
                out.status
            ))
        }
    });
    match built {
        Ok(log) => eprintln!("{log}"),
        Err(e) => panic!("{e}"),
    }
    if let Some(p) = common::first_missing(&[&["qemu-system-x86_64", "--version"]]) {
        common::skip(&format!("{p} cannot be run"));
        return false;
    }
    true
}

/// One guest at a time: two TCG guests on a small machine would each take twice as long.
fn one_guest_at_a_time() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// A temporary directory for a test: the export, the secret, sockets, run.sh's files.
struct Scratch {
    dir: tempfile::TempDir,
    export: PathBuf,
    secret: PathBuf,
}

impl Scratch {
    fn new() -> Scratch {
        let dir = tempfile::Builder::new()
            .prefix("tether-vm-test")
            .tempdir()
            .unwrap();
        let export = dir.path().join("export");
        std::fs::create_dir(&export).unwrap();
        let secret = dir.path().join("secret");
        let mut bytes = [0u8; 32];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut bytes))
            .unwrap();
        let text: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        std::fs::write(&secret, format!("{text}\n")).unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        Scratch {
            dir,
            export,
            secret,
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The hybrid vsock socket's base path (vhost-device-vsock's uds-path).
    fn vsock_base(&self) -> PathBuf {
        self.path().join("vsock")
    }

    fn write(&self, name: &str, text: &str) {
        std::fs::write(self.export.join(name), text).unwrap();
    }

    fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.export.join(name))
            .unwrap_or_else(|e| panic!("host: cannot read {name}: {e}"))
    }
}

/// `tether serve EXPORT --listen ADDRESS --secret-file S` here, stopped when dropped.
struct HostServer {
    child: Child,
    listen: String,
    export: PathBuf,
    secret: PathBuf,
    log: ChildLog,
}

impl HostServer {
    fn start(export: &Path, listen: &str, secret: &Path) -> HostServer {
        let (log, stderr) = ChildLog::new();
        let child = Command::new(TETHER)
            .arg("serve")
            .arg(export)
            .args(["--listen", listen, "--secret-file"])
            .arg(secret)
            .stdin(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("start tether serve");
        let mut server = HostServer {
            child,
            listen: listen.to_string(),
            export: export.to_path_buf(),
            secret: secret.to_path_buf(),
            log,
        };
        server.wait_listening();
        server
    }

    fn wait_listening(&mut self) {
        let listen = self.listen.clone();
        let up = common::poll_until(Duration::from_secs(10), || {
            let ok = match listen.split_once(':') {
                Some(("vsock-unix", p)) => std::os::unix::net::UnixStream::connect(p).is_ok(),
                Some(("tcp", a)) => std::net::TcpStream::connect(a).is_ok(),
                _ => panic!("address {listen} not used here"),
            };
            ok || matches!(self.child.try_wait(), Ok(Some(_)))
        });
        assert!(
            up && matches!(self.child.try_wait(), Ok(None)),
            "tether serve did not listen on {listen}"
        );
    }

    fn stop(&mut self, signal: i32) {
        if matches!(self.child.try_wait(), Ok(None)) {
            // SAFETY: signalling our own, unreaped child.
            unsafe { libc::kill(self.child.id() as i32, signal) };
        }
        let _ = self.child.wait();
    }

    /// Stops the server with `signal`, leaves it away for `away`, starts it again.
    fn restart(&mut self, signal: i32, away: Duration) {
        self.stop(signal);
        std::thread::sleep(away);
        let fresh = HostServer::start(&self.export, &self.listen, &self.secret);
        let old = std::mem::replace(self, fresh);
        drop(old);
    }
}

impl Drop for HostServer {
    fn drop(&mut self) {
        self.stop(libc::SIGTERM);
        self.log.show(&format!("tether serve on {}", self.listen));
    }
}

/// A free TCP port on host loopback (nothing listens on it when this returns).
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// A guest booted by scripts/vm/run.sh, running a script. run.sh leads its own process
/// group (with QEMU, vhost-device-vsock and QEMU's forwarders in it), which is killed when
/// this is dropped before the guest has finished.
struct Guest {
    child: Child,
    console: Arc<Mutex<String>>,
    reader: Option<JoinHandle<()>>,
    errors: PathBuf,
    started: Instant,
}

/// What run.sh is asked for, besides the script.
#[derive(Default)]
struct GuestOptions {
    /// vhost-device-vsock's uds-path: guest vsock to CID 2 port P reaches UDS_P here.
    vsock: Option<PathBuf>,
    /// Host loopback ports the guest reaches at 10.0.2.100:PORT.
    tcp_ports: Vec<u16>,
    /// Host files copied into the guest: (host path, guest path).
    files: Vec<(PathBuf, String)>,
}

/// Shell functions every guest script starts with.
const PRELUDE: &str = r#"
set -u
fail() {
    echo "FAIL: $*"
    [ -f /tmp/mount.log ] && sed 's/^/mount log: /' /tmp/mount.log
    grep ' /mnt/src ' /proc/mounts >/dev/null && tether status /mnt/src 2>&1 | sed 's/^/status: /'
    exit 1
}
# until_ok SECONDS WHAT COMMAND...: runs COMMAND every 0.1 s until it succeeds.
until_ok() {
    tries=$(($1 * 10)); what=$2; shift 2
    while ! "$@"; do
        tries=$((tries - 1))
        [ $tries -gt 0 ] || fail "not within the time: $what"
        sleep 0.1
    done
}
# same FILE TEXT: FILE holds TEXT (and a newline).
same() { [ "$(cat "$1" 2>/dev/null)" = "$2" ]; }
# mount_src ADDRESS: tether mount ADDRESS /mnt/src in the background, with the secret.
mount_src() {
    tether mount "$1" /mnt/src --secret-file /secret --background --log /tmp/mount.log ||
        fail "tether mount $1"
    grep ' /mnt/src ' /proc/mounts || fail "no mount at /mnt/src"
}
# umount_src: umount /mnt/src, again for up to 10 s while it fails. A plain umount fails
# with EBUSY while one of the client's helper threads (the prefetch's directory listers)
# has the mount's root open for a moment; said when it happens.
umount_src() {
    tries=0
    until umount /mnt/src 2>/tmp/umount.err; do
        tries=$((tries + 1))
        [ $tries -lt 100 ] || fail "umount: $(cat /tmp/umount.err)"
        sleep 0.1
    done
    [ $tries -eq 0 ] || echo "umount succeeded after $tries failures ($(cat /tmp/umount.err))"
    grep -q ' /mnt/src ' /proc/mounts && fail "still mounted after umount"
    return 0
}
"#;

impl Guest {
    fn boot(scratch: &Scratch, options: &GuestOptions, script: &str) -> Guest {
        let dir = scratch.path();
        let script_path = dir.join("guest.sh");
        std::fs::write(&script_path, format!("{PRELUDE}\n{script}")).unwrap();
        let run_tmp = dir.join("run");
        std::fs::create_dir_all(&run_tmp).unwrap();
        let mut cmd = Command::new(format!("{SCRIPTS}/run.sh"));
        cmd.args(["-t", &GUEST_TIMEOUT.as_secs().to_string()]);
        if let Some(base) = &options.vsock {
            cmd.arg("-V").arg(base);
        }
        for port in &options.tcp_ports {
            cmd.args(["-p", &port.to_string()]);
        }
        let mut files = options.files.clone();
        files.push((scratch.secret.clone(), "/secret".into()));
        for (host, guest) in &files {
            cmd.arg("-f").arg(format!("{}:{guest}", host.display()));
        }
        let errors = dir.join("run.sh.stderr");
        cmd.arg(&script_path)
            .env("TMPDIR", &run_tmp)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&errors).unwrap())
            .process_group(0);
        let mut child = cmd.spawn().expect("start scripts/vm/run.sh");
        let console = Arc::new(Mutex::new(String::new()));
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let sink = console.clone();
        let reader = std::thread::spawn(move || {
            let mut line = String::new();
            while matches!(stdout.read_line(&mut line), Ok(n) if n > 0) {
                sink.lock().unwrap().push_str(&line);
                line.clear();
            }
        });
        Guest {
            child,
            console,
            reader: Some(reader),
            errors,
            started: Instant::now(),
        }
    }

    fn console(&self) -> String {
        self.console.lock().unwrap().clone()
    }

    fn finished(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// Waits until `path` (on the host) exists: the guest's sign that it has reached a
    /// step. Fails if the guest finishes first or the guest's time runs out.
    fn wait_for_host_file(&mut self, path: &Path) {
        while !path.exists() {
            assert!(
                !self.finished(),
                "the guest finished before it made {}",
                path.display()
            );
            assert!(
                self.started.elapsed() < GUEST_TIMEOUT,
                "the guest did not make {} in time",
                path.display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits for the guest to finish; asserts that its script succeeded and returns the
    /// script's output.
    fn succeeds(mut self) -> String {
        let deadline = self.started + GUEST_TIMEOUT + Duration::from_secs(30);
        let status = loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                break status;
            }
            assert!(Instant::now() < deadline, "run.sh did not end in time");
            std::thread::sleep(Duration::from_millis(100));
        };
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        let console = self.console();
        assert!(
            status.success(),
            "the guest script failed ({status}):\n{console}"
        );
        eprintln!("guest finished after {:?}", self.started.elapsed());
        console
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let group = self.child.id() as i32;
            // SAFETY: signalling the process group our own unreaped child leads.
            unsafe { libc::kill(-group, libc::SIGTERM) };
            let gone = common::poll_until(Duration::from_secs(10), || {
                matches!(self.child.try_wait(), Ok(Some(_)))
            });
            if !gone {
                // SAFETY: as above; the child is not reaped yet.
                unsafe { libc::kill(-group, libc::SIGKILL) };
            }
            let _ = self.child.wait();
        }
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        let mut errors = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.errors) {
            let _ = f.read_to_string(&mut errors);
        }
        eprintln!(
            "----- guest console -----\n{}----- run.sh's errors -----\n{errors}----- end of guest -----",
            self.console()
        );
    }
}

/// Serves `scratch`'s export on hybrid vsock port 7070 (UDS_7070).
fn serve_vsock(scratch: &Scratch) -> HostServer {
    let listen = format!("vsock-unix:{}_{VSOCK_PORT}", scratch.vsock_base().display());
    HostServer::start(&scratch.export, &listen, &scratch.secret)
}

fn vsock_options(scratch: &Scratch) -> GuestOptions {
    GuestOptions {
        vsock: Some(scratch.vsock_base()),
        ..GuestOptions::default()
    }
}

/// Over vsock: the guest reads a host file, writes one the host sees, and sees a host
/// edit of a file it has read (polling; then another after `tether sync`, at once).
#[test]
fn vsock_mount_reads_writes_and_sees_host_edits() {
    if !guest_ready() {
        return;
    }
    let _one = one_guest_at_a_time();
    let s = Scratch::new();
    s.write("hello.txt", "hello from the host\n");
    s.write("edit.txt", "version 1\n");
    let _server = serve_vsock(&s);
    let mut guest = Guest::boot(
        &s,
        &vsock_options(&s),
        r#"
mount_src vsock:2:7070
same /mnt/src/hello.txt "hello from the host" || fail "read: $(cat /mnt/src/hello.txt)"
echo "written in the guest" >/mnt/src/from-guest.txt || fail "write"
same /mnt/src/edit.txt "version 1" || fail "warm read: $(cat /mnt/src/edit.txt)"
: >/mnt/src/read-1
until_ok 60 "the host's edit (version 2)" same /mnt/src/edit.txt "version 2"
echo "the host's edit seen by polling"
: >/mnt/src/seen-2
until_ok 60 "the host's sign that it wrote version 3" test -e /mnt/src/wrote-3
tether sync /mnt/src || fail "tether sync"
same /mnt/src/edit.txt "version 3" || fail "after tether sync: $(cat /mnt/src/edit.txt)"
echo "the host's edit seen after tether sync"
umount_src
"#,
    );
    guest.wait_for_host_file(&s.export.join("read-1"));
    s.write("edit.txt", "version 2\n");
    guest.wait_for_host_file(&s.export.join("seen-2"));
    s.write("edit.txt", "version 3\n");
    s.write("wrote-3", "");
    let out = guest.succeeds();
    assert!(out.contains("seen after tether sync"), "{out}");
    assert_eq!(s.read("from-guest.txt"), "written in the guest\n");
}

/// Over TCP (QEMU user networking forwarding guest 10.0.2.100:PORT to host loopback):
/// read, write, and file operations through the guest's mount, checked on the host.
#[test]
fn tcp_mount_reads_writes_and_changes_files() {
    if !guest_ready() {
        return;
    }
    let _one = one_guest_at_a_time();
    let s = Scratch::new();
    s.write("hello.txt", "hello from the host\n");
    s.write("doomed", "to be removed\n");
    let port = free_port();
    let _server = HostServer::start(&s.export, &format!("tcp:127.0.0.1:{port}"), &s.secret);
    let options = GuestOptions {
        tcp_ports: vec![port],
        ..GuestOptions::default()
    };
    let script = format!(
        r#"
mount_src tcp:10.0.2.100:{port}
cd /mnt/src || fail "cd"
same hello.txt "hello from the host" || fail "read: $(cat hello.txt)"
echo "written in the guest" >from-guest.txt || fail "write"
echo data >created && mv created renamed || fail "create and rename"
rm doomed || fail "unlink"
echo mode >mode && chmod 640 mode || fail "chmod"
ln -s renamed symlink || fail "symlink"
echo linked >original && ln original hardlink || fail "hard link"
echo 0123456789 >short && truncate -s 4 short || fail "truncate"
mkdir -p dir/sub && echo nested >dir/sub/nested && mkdir gone && rmdir gone || fail "directories"
[ "$(stat -c %a mode)" = 640 ] || fail "mode: $(stat -c %a mode)"
[ "$(readlink symlink)" = renamed ] || fail "readlink: $(readlink symlink)"
[ "$(stat -c %h original)" = 2 ] || fail "links: $(stat -c %h original)"
[ "$(stat -c %s short)" = 4 ] || fail "size: $(stat -c %s short)"
ls -la
cd /
umount_src
"#
    );
    let guest = Guest::boot(&s, &options, &script);
    guest.succeeds();
    use std::os::unix::fs::MetadataExt;
    let e = &s.export;
    assert_eq!(s.read("from-guest.txt"), "written in the guest\n");
    assert_eq!(s.read("renamed"), "data\n");
    assert!(!e.join("created").exists() && !e.join("doomed").exists());
    let mode = std::fs::metadata(e.join("mode")).unwrap().mode() & 0o7777;
    assert_eq!(mode, 0o640);
    assert_eq!(
        std::fs::read_link(e.join("symlink")).unwrap(),
        Path::new("renamed")
    );
    let original = std::fs::metadata(e.join("original")).unwrap();
    let hardlink = std::fs::metadata(e.join("hardlink")).unwrap();
    assert_eq!((original.ino(), original.nlink()), (hardlink.ino(), 2));
    assert_eq!(s.read("short"), "0123");
    assert_eq!(s.read("dir/sub/nested"), "nested\n");
    assert!(!e.join("gone").exists());
}

/// The host kills and restarts `tether serve` while a guest process reads a file in a
/// loop: no read fails or returns anything else, and the mount reports one reconnect.
#[test]
fn server_restart_is_not_noticed_by_a_guest_reader() {
    if !guest_ready() {
        return;
    }
    let _one = one_guest_at_a_time();
    let s = Scratch::new();
    let data: String = (0..200)
        .map(|i| format!("line {i} of the data\n"))
        .collect();
    s.write("data.txt", &data);
    let mut server = serve_vsock(&s);
    let mut guest = Guest::boot(
        &s,
        &vsock_options(&s),
        r#"
mount_src vsock:2:7070
cp /mnt/src/data.txt /tmp/expected || fail "first read"
: >/tmp/errors
echo 0 >/tmp/count
(
    n=0
    while [ ! -e /tmp/stop ]; do
        if cat /mnt/src/data.txt >/tmp/got 2>/tmp/err; then
            cmp -s /tmp/got /tmp/expected || echo "read $n: other content" >>/tmp/errors
        else
            echo "read $n: $(cat /tmp/err)" >>/tmp/errors
        fi
        n=$((n + 1))
        echo $n >/tmp/count
    done
) &
reader=$!
until_ok 60 "the reader's first reads" sh -c '[ "$(cat /tmp/count)" -ge 5 ]'
: >/mnt/src/reading
until_ok 120 "the host's sign after the restart" test -e /mnt/src/restarted
before=$(cat /tmp/count)
until_ok 60 "reads after the restart" sh -c "[ \"\$(cat /tmp/count)\" -ge $((before + 20)) ]"
: >/tmp/stop
wait $reader
echo "reads: $(cat /tmp/count) (from $before on after the restart)"
[ -s /tmp/errors ] && fail "the reader saw: $(head -5 /tmp/errors)"
tether status /mnt/src >/tmp/status || fail "tether status"
grep '^connection:' /tmp/status
grep -q 'connection: up (1 reconnects' /tmp/status || fail "status: $(cat /tmp/status)"
echo "written after the restart" >/mnt/src/after.txt || fail "write after the restart"
umount_src
"#,
    );
    guest.wait_for_host_file(&s.export.join("reading"));
    server.restart(libc::SIGKILL, Duration::from_secs(1));
    s.write("restarted", "");
    let out = guest.succeeds();
    assert!(out.contains("reads: "), "{out}");
    assert_eq!(s.read("after.txt"), "written after the restart\n");
}

/// Mounted at boot from /etc/fstab: the guest's init runs `mount -a`, which runs
/// /sbin/mount.tether (a symbolic link to tether) for the tether line.
#[test]
fn fstab_mount_at_boot_through_mount_tether() {
    if !guest_ready() {
        return;
    }
    let _one = one_guest_at_a_time();
    let s = Scratch::new();
    s.write("hello.txt", "hello from the host\n");
    let fstab = s.path().join("fstab");
    std::fs::write(
        &fstab,
        "# the guest's fstab\n\
         vsock:2:7070  /mnt/src  tether  _netdev,nofail,secret-file=/secret,log=/tmp/mount.log  0 0\n",
    )
    .unwrap();
    let _server = serve_vsock(&s);
    let mut options = vsock_options(&s);
    options.files.push((fstab, "/etc/fstab".into()));
    let guest = Guest::boot(
        &s,
        &options,
        r#"
[ "$(cat /run/mount-a.status)" = 0 ] || fail "mount -a: status $(cat /run/mount-a.status)"
grep ' /mnt/src ' /proc/mounts || fail "nothing mounted at /mnt/src"
same /mnt/src/hello.txt "hello from the host" || fail "read: $(cat /mnt/src/hello.txt)"
echo "written through the fstab mount" >/mnt/src/from-guest.txt || fail "write"
umount_src
echo "fstab mount done"
"#,
    );
    let out = guest.succeeds();
    assert!(out.contains("fstab mount done"), "{out}");
    assert_eq!(
        s.read("from-guest.txt"),
        "written through the fstab mount\n"
    );
}
