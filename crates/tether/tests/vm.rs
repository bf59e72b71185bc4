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
#[path = "posix/known.rs"]
mod posix_known;

use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::{ChildLog, TETHER};
use tether_bench::HostChange as Change;

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
    args: Vec<String>,
    export: PathBuf,
    secret: PathBuf,
    log: ChildLog,
}

impl HostServer {
    fn start(export: &Path, listen: &str, secret: &Path) -> HostServer {
        HostServer::start_with(export, listen, secret, &[])
    }

    /// As `start`, with more arguments for `tether serve`.
    fn start_with(export: &Path, listen: &str, secret: &Path, args: &[&str]) -> HostServer {
        let (log, stderr) = ChildLog::new();
        let child = Command::new(TETHER)
            .arg("serve")
            .arg(export)
            .args(["--listen", listen, "--secret-file"])
            .arg(secret)
            .args(args)
            .stdin(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("start tether serve");
        let mut server = HostServer {
            child,
            listen: listen.to_string(),
            args: args.iter().map(|a| a.to_string()).collect(),
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
        let args: Vec<&str> = self.args.iter().map(|a| a.as_str()).collect();
        let fresh = HostServer::start_with(&self.export, &self.listen, &self.secret, &args);
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
    /// A raw disk image, the guest's /dev/vda.
    disk: Option<PathBuf>,
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
# umount_src: a plain umount of /mnt/src, which must succeed at once: the client's helper
# threads (the prefetch's listers, the flusher) open the mount's root through a detached
# clone of the mount, which the umount does not count, so no EBUSY right after a walk.
umount_src() {
    umount /mnt/src 2>/tmp/umount.err || fail "umount: $(cat /tmp/umount.err)"
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
        if let Some(disk) = &options.disk {
            cmd.arg("-d").arg(disk);
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
    for d in 1..=3 {
        std::fs::create_dir(s.export.join(format!("walk{d}"))).unwrap();
        for f in 1..=30 {
            s.write(&format!("walk{d}/f{f}"), "x");
        }
    }
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
# A plain umount right after a walk that starts the client's directory listers (two
# lookups missing in a directory): it used to fail with EBUSY 2 times in 15.
for i in 1 2 3 4 5 6; do
    mount_src vsock:2:7070 >/dev/null
    for d in 1 2 3; do stat /mnt/src/walk$d/f1 /mnt/src/walk$d/f2 /mnt/src/walk$d/f3 >/dev/null; done
    umount_src
done
echo "umount right after a walk: 6 times"
"#,
    );
    guest.wait_for_host_file(&s.export.join("read-1"));
    s.write("edit.txt", "version 2\n");
    guest.wait_for_host_file(&s.export.join("seen-2"));
    s.write("edit.txt", "version 3\n");
    s.write("wrote-3", "");
    let out = guest.succeeds();
    assert!(out.contains("seen after tether sync"), "{out}");
    assert!(out.contains("umount right after a walk"), "{out}");
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

// ---------------------------------------------------------------------------------------
// Checks run by test programs inside the guest: the POSIX suite (posix_native) and this
// file's own guest_side_* tests, built statically for musl by build-guest-tests.sh.

/// The port of the guest's control connection to the test (host side: UDS_7071).
const CONTROL_PORT: u32 = 7071;

/// The test programs the guest runs, built (once per run) by build-guest-tests.sh.
struct GuestTests {
    posix_native: PathBuf,
    vm: PathBuf,
}

fn guest_tests() -> &'static GuestTests {
    static BUILT: OnceLock<Result<GuestTests, String>> = OnceLock::new();
    let built = BUILT.get_or_init(|| {
        let started = Instant::now();
        let out = Command::new(format!("{SCRIPTS}/build-guest-tests.sh"))
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run build-guest-tests.sh: {e}"))?;
        let log = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            return Err(format!(
                "scripts/vm/build-guest-tests.sh failed ({}):\n{log}",
                out.status
            ));
        }
        eprintln!("{log}(build-guest-tests.sh took {:?})", started.elapsed());
        let paths = String::from_utf8_lossy(&out.stdout);
        let mut lines = paths.lines().map(PathBuf::from);
        match (lines.next(), lines.next()) {
            (Some(posix_native), Some(vm)) => Ok(GuestTests { posix_native, vm }),
            _ => Err(format!("build-guest-tests.sh printed no paths:\n{log}")),
        }
    });
    match built {
        Ok(t) => t,
        Err(e) => panic!("{e}"),
    }
}

/// Lines of the guest's output that start with `prefix`, written to this process's stderr
/// directly, so that the test's output shows them even when it passes (the test harness
/// captures only print! and eprint!).
fn show_lines(console: &str, prefix: &str) {
    use std::io::Write;
    let mut err = std::io::stderr().lock();
    for line in console.lines().filter(|l| l.starts_with(prefix)) {
        let _ = writeln!(err, "vm guest: {line}");
    }
}

/// The POSIX suite in the guest: posix_native's compare_with_dir_from_env runs every case
/// on the guest's own ext4 disk (a virtio disk made here with mkfs.ext4) and on the Tether
/// mount (vsock, ids passed through as in posix_mount.rs), and prints the differences;
/// they must be the known ones (posix/known.rs), as on a mount on this machine.
#[test]
fn posix_suite_in_the_guest_differs_from_its_ext4_only_as_known() {
    if !guest_ready() {
        return;
    }
    let tests = guest_tests();
    let _one = one_guest_at_a_time();
    let s = Scratch::new();
    let disk = s.path().join("native.ext4");
    std::fs::File::create(&disk)
        .and_then(|f| f.set_len(1 << 30))
        .unwrap();
    let mkfs = Command::new("mkfs.ext4")
        .args(["-q", "-F"])
        .arg(&disk)
        .output()
        .expect("mkfs.ext4 (e2fsprogs; build-guest.sh installs it)");
    assert!(mkfs.status.success(), "mkfs.ext4: {mkfs:?}");
    let listen = format!("vsock-unix:{}_{VSOCK_PORT}", s.vsock_base().display());
    let _server =
        HostServer::start_with(&s.export, &listen, &s.secret, &["--map-ids", "passthrough"]);
    let mut options = vsock_options(&s);
    options.disk = Some(disk);
    options
        .files
        .push((tests.posix_native.clone(), "/bin/posix_native".into()));
    let guest = Guest::boot(
        &s,
        &options,
        r#"
mkdir -p /mnt/native && mount -t ext4 /dev/vda /mnt/native || fail "mount the ext4 disk"
mount_src vsock:2:7070
mkdir /mnt/src/posix || fail "mkdir"
started=$(date +%s)
TMPDIR=/mnt/native POSIX_OTHER_DIR=/mnt/src/posix posix_native --ignored --exact \
    compare_with_dir_from_env --nocapture --test-threads 1 || fail "posix_native"
echo "posix suite: both runs took $(($(date +%s) - started)) s"
umount_src
umount /mnt/native
"#,
    );
    let out = guest.succeeds();
    show_lines(&out, "posix suite:");
    let mut lines = out.lines();
    let count: usize = lines
        .by_ref()
        // "N differences:", after the test harness's "test compare_with_dir_from_env ... ".
        .find_map(|l| {
            l.strip_suffix(" differences:")?
                .rsplit(' ')
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no differences line from the guest:\n{out}"));
    let diffs: Vec<String> = lines.take(count).map(str::to_string).collect();
    assert_eq!(diffs.len(), count, "{out}");
    if let Err(e) = posix_known::check(&diffs, posix_known::KNOWN_DIFFERENCES) {
        panic!("in the guest: {e}");
    }
}

/// Trials of each kind of host change (guest_side_of_host_changes).
const TRIALS: usize = 20;
/// Rounds of the host's changes in the watched directory.
const WATCH_ROUNDS: usize = 5;
/// How long a host change may take to be visible in the guest (or heard by its watcher).
const VISIBLE_WITHIN: Duration = Duration::from_secs(10);

/// Every kind of host change, made after the guest has cached the old state, becomes
/// visible in the guest (TRIALS times each, within VISIBLE_WITHIN), and a guest inotify
/// watcher hears the host create, modify, chmod, rename and delete files and make and
/// remove a directory. The guest's half is guest_side_of_host_changes, which asks for
/// each change over a vsock connection of its own (port 7071, here a Unix socket
/// UDS_7071), times it and prints p50/p99 per kind; the test output shows them.
#[test]
fn host_changes_reach_warm_guest_caches_and_guest_watchers() {
    if !guest_ready() {
        return;
    }
    let tests = guest_tests();
    let _one = one_guest_at_a_time();
    let s = Scratch::new();
    for change in CHANGES {
        for n in 0..TRIALS {
            let d = s
                .export
                .join("changes")
                .join(format!("{}-{n}", change.name()));
            std::fs::create_dir_all(&d).unwrap();
            change.prepare(&d);
        }
    }
    std::fs::create_dir(s.export.join("watched")).unwrap();
    let _server = serve_vsock(&s);
    let control = HostControl::start(&s);
    let mut options = vsock_options(&s);
    options
        .files
        .push((tests.vm.clone(), "/bin/vm-tests".into()));
    let guest = Guest::boot(
        &s,
        &options,
        &format!(
            r#"
mount_src vsock:2:7070
TETHER_VM_CONTROL={CONTROL_PORT} vm-tests --ignored --exact guest_side_of_host_changes \
    --nocapture --test-threads 1 || fail "guest_side_of_host_changes"
umount_src
"#
        ),
    );
    let out = guest.succeeds();
    show_lines(&out, "time to visible:");
    show_lines(&out, "watcher heard:");
    let handled = control.finish();
    assert_eq!(
        handled,
        CHANGES.len() * TRIALS + WATCH_STEPS.len() * WATCH_ROUNDS,
        "requests the host handled"
    );
}

/// The kinds of host change guest_side_of_host_changes times. Each trial has its own
/// directory, changes/KIND-N, which the host prepares before the guest boots.
const CHANGES: [Change; 10] = Change::ALL;

/// The mtime the host's utimes sets (seconds since the epoch).
const SET_MTIME: i64 = 1_000_000_000;

/// A directory's entries, sorted.
fn entries(d: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(d)
        .map(|it| {
            it.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

fn exists(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok()
}

fn content(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

/// What a trial of each kind of change does, on the host and in the guest.
trait Trial {
    fn prepare(self, d: &Path);
    fn make(self, d: &Path) -> std::io::Result<()>;
    fn warm(self, d: &Path);
    fn visible(self, d: &Path) -> bool;
}

impl Trial for Change {
    /// Host: the state before the change, in the trial's (new) directory `d`.
    fn prepare(self, d: &Path) {
        let write = |name: &str, text: &str| std::fs::write(d.join(name), text).unwrap();
        match self {
            Change::Rewrite => write("f", "old contents"),
            Change::Append => write("f", "line 1\n"),
            Change::Truncate => write("f", &"x".repeat(4096)),
            Change::Chmod | Change::Utimes => write("f", "data"),
            Change::Create => write("existing", "here before"),
            Change::Delete => write("victim", "to be deleted"),
            Change::Rename => write("from", "moved"),
            Change::Mkdir => {}
            Change::Rmdir => std::fs::create_dir(d.join("sub")).unwrap(),
        }
        if self == Change::Chmod {
            std::fs::set_permissions(d.join("f"), std::fs::Permissions::from_mode(0o644)).unwrap();
        }
    }

    /// Host: the change.
    fn make(self, d: &Path) -> std::io::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::FileExt;
        let f = d.join("f");
        match self {
            // In place, the same length: only the contents (and times) change.
            Change::Rewrite => std::fs::OpenOptions::new()
                .write(true)
                .open(&f)?
                .write_all_at(b"new contents", 0),
            Change::Append => std::fs::OpenOptions::new()
                .append(true)
                .open(&f)?
                .write_all(b"line 2\n"),
            Change::Truncate => std::fs::OpenOptions::new()
                .write(true)
                .open(&f)?
                .set_len(100),
            Change::Chmod => std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)),
            Change::Utimes => {
                let t = std::time::UNIX_EPOCH + Duration::from_secs(SET_MTIME as u64);
                std::fs::File::open(&f)?
                    .set_times(std::fs::FileTimes::new().set_accessed(t).set_modified(t))
            }
            Change::Create => std::fs::write(d.join("new"), "created"),
            Change::Delete => std::fs::remove_file(d.join("victim")),
            Change::Rename => std::fs::rename(d.join("from"), d.join("to")),
            Change::Mkdir => {
                std::fs::create_dir(d.join("sub"))?;
                std::fs::write(d.join("sub/inside"), "inside")
            }
            Change::Rmdir => std::fs::remove_dir(d.join("sub")),
        }
    }

    /// Guest: reads everything the change alters, so that the guest holds the old state
    /// (contents, attributes, names that exist and names that do not, the listing).
    fn warm(self, d: &Path) {
        let _ = entries(d);
        for name in [
            "f",
            "existing",
            "new",
            "victim",
            "from",
            "to",
            "sub",
            "sub/inside",
        ] {
            let p = d.join(name);
            if let Ok(m) = std::fs::metadata(&p) {
                if m.is_file() {
                    let _ = content(&p);
                } else {
                    let _ = entries(&p);
                }
            }
        }
    }

    /// Guest: does the guest see the change?
    fn visible(self, d: &Path) -> bool {
        use std::os::unix::fs::MetadataExt;
        let f = d.join("f");
        let meta = std::fs::metadata(&f);
        let listed = |name: &str| entries(d).iter().any(|e| e == name);
        match self {
            Change::Rewrite => content(&f) == "new contents",
            Change::Append => content(&f) == "line 1\nline 2\n",
            Change::Truncate => {
                meta.is_ok_and(|m| m.len() == 100) && content(&f) == "x".repeat(100)
            }
            Change::Chmod => meta.is_ok_and(|m| m.mode() & 0o7777 == 0o600),
            Change::Utimes => meta.is_ok_and(|m| m.mtime() == SET_MTIME),
            Change::Create => content(&d.join("new")) == "created" && listed("new"),
            Change::Delete => !exists(&d.join("victim")) && !listed("victim"),
            Change::Rename => {
                !exists(&d.join("from"))
                    && content(&d.join("to")) == "moved"
                    && entries(d) == ["to"]
            }
            Change::Mkdir => content(&d.join("sub/inside")) == "inside" && listed("sub"),
            Change::Rmdir => !exists(&d.join("sub")) && !listed("sub"),
        }
    }
}

/// The host's changes in the watched directory, one round each (file names carry the
/// round), and the inotify events (mask, name) a guest watcher must hear for each.
const WATCH_STEPS: [&str; 7] = [
    "create", "modify", "chmod", "rename", "delete", "mkdir", "rmdir",
];

fn watch_step_make(dir: &Path, step: &str, round: usize) -> std::io::Result<()> {
    use std::io::Write;
    let file = dir.join(format!("file-{round}"));
    let renamed = dir.join(format!("renamed-{round}"));
    let sub = dir.join(format!("dir-{round}"));
    match step {
        "create" => std::fs::write(&file, "created\n"),
        "modify" => std::fs::OpenOptions::new()
            .append(true)
            .open(&file)?
            .write_all(b"modified\n"),
        "chmod" => std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)),
        "rename" => std::fs::rename(&file, &renamed),
        "delete" => std::fs::remove_file(&renamed),
        "mkdir" => std::fs::create_dir(&sub),
        "rmdir" => std::fs::remove_dir(&sub),
        _ => Err(std::io::Error::other(format!("no watch step {step}"))),
    }
}

fn watch_step_events(step: &str, round: usize) -> Vec<(u32, String)> {
    let file = format!("file-{round}");
    let renamed = format!("renamed-{round}");
    let sub = format!("dir-{round}");
    match step {
        "create" => vec![
            (libc::IN_CREATE, file.clone()),
            (libc::IN_CLOSE_WRITE, file),
        ],
        "modify" => vec![
            (libc::IN_MODIFY, file.clone()),
            (libc::IN_CLOSE_WRITE, file),
        ],
        "chmod" => vec![(libc::IN_ATTRIB, file)],
        "rename" => vec![(libc::IN_MOVED_FROM, file), (libc::IN_MOVED_TO, renamed)],
        "delete" => vec![(libc::IN_DELETE, renamed)],
        "mkdir" => vec![(libc::IN_CREATE | libc::IN_ISDIR, sub)],
        "rmdir" => vec![(libc::IN_DELETE | libc::IN_ISDIR, sub)],
        _ => vec![],
    }
}

/// The host's side of the guest's control connection: a thread that accepts it on
/// UDS_7071 and, for each line "change KIND N" or "watch STEP ROUND", makes that change in
/// the export and answers "done" (or "error: ...").
struct HostControl {
    thread: JoinHandle<Result<usize, String>>,
}

impl HostControl {
    fn start(scratch: &Scratch) -> HostControl {
        let path = PathBuf::from(format!("{}_{CONTROL_PORT}", scratch.vsock_base().display()));
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        listener.set_nonblocking(true).unwrap();
        let export = scratch.export.clone();
        let thread = std::thread::spawn(move || {
            let started = Instant::now();
            let stream = loop {
                match listener.accept() {
                    Ok((stream, _)) => break stream,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        if started.elapsed() > GUEST_TIMEOUT {
                            return Err("the guest did not connect".to_string());
                        }
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    Err(e) => return Err(format!("accept: {e}")),
                }
            };
            stream.set_nonblocking(false).map_err(|e| e.to_string())?;
            let mut answers = stream.try_clone().map_err(|e| e.to_string())?;
            let mut handled = 0;
            for line in BufReader::new(stream).lines() {
                let line = line.map_err(|e| format!("read: {e}"))?;
                let words: Vec<&str> = line.split(' ').collect();
                let done = match words[..] {
                    ["change", kind, n] => match Change::from_name(kind) {
                        Some(c) => c.make(&export.join("changes").join(format!("{kind}-{n}"))),
                        None => Err(std::io::Error::other("no such change")),
                    },
                    ["watch", step, round] => match round.parse() {
                        Ok(r) => watch_step_make(&export.join("watched"), step, r),
                        Err(_) => Err(std::io::Error::other("bad round")),
                    },
                    _ => Err(std::io::Error::other("unknown request")),
                };
                let answer = match done {
                    Ok(()) => "done".to_string(),
                    Err(e) => format!("error: {line}: {e}"),
                };
                handled += 1;
                use std::io::Write;
                writeln!(answers, "{answer}").map_err(|e| format!("answer: {e}"))?;
            }
            Ok(handled)
        });
        HostControl { thread }
    }

    /// How many requests the host handled; panics if the thread failed.
    fn finish(self) -> usize {
        match self.thread.join() {
            Ok(Ok(n)) => n,
            Ok(Err(e)) => panic!("host control: {e}"),
            Err(_) => panic!("host control thread panicked"),
        }
    }
}

/// The guest's side of its control connection: AF_VSOCK to the host (CID 2), port
/// TETHER_VM_CONTROL. Only in the test guest: the test's host must open no AF_VSOCK socket,
/// so this refuses unless the variable is set and /tether-vm/cmd (the guest's script,
/// which exists only in the guest's initramfs) is there.
struct GuestControl {
    replies: BufReader<std::fs::File>,
    requests: std::fs::File,
}

impl GuestControl {
    fn connect() -> Option<GuestControl> {
        use std::os::fd::FromRawFd;
        let port: u32 = std::env::var("TETHER_VM_CONTROL").ok()?.parse().ok()?;
        if !Path::new("/tether-vm/cmd").exists() {
            return None;
        }
        // SAFETY: plain socket calls on a socket this function owns; the address is a
        // zeroed sockaddr_vm with its fields set.
        let file = unsafe {
            let fd = libc::socket(libc::AF_VSOCK, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
            assert!(
                fd >= 0,
                "socket(AF_VSOCK): {}",
                std::io::Error::last_os_error()
            );
            let file = std::fs::File::from_raw_fd(fd);
            let mut addr: libc::sockaddr_vm = std::mem::zeroed();
            addr.svm_family = libc::AF_VSOCK as libc::sa_family_t;
            addr.svm_cid = libc::VMADDR_CID_HOST;
            addr.svm_port = port;
            let r = libc::connect(
                fd,
                &addr as *const libc::sockaddr_vm as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_vm>() as libc::socklen_t,
            );
            assert!(
                r == 0,
                "connect(vsock 2:{port}): {}",
                std::io::Error::last_os_error()
            );
            // Answers come within the guest's time or not at all.
            let tv = libc::timeval {
                tv_sec: VISIBLE_WITHIN.as_secs() as libc::time_t,
                tv_usec: 0,
            };
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                &tv as *const libc::timeval as *const libc::c_void,
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            );
            file
        };
        Some(GuestControl {
            replies: BufReader::new(file.try_clone().unwrap()),
            requests: file,
        })
    }

    fn ask(&mut self, request: &str) {
        use std::io::Write;
        writeln!(self.requests, "{request}").expect("send a request to the host");
    }

    fn answer(&mut self) -> String {
        let mut line = String::new();
        match self.replies.read_line(&mut line) {
            Ok(n) if n > 0 => line.trim_end().to_string(),
            r => format!("no answer from the host: {r:?}"),
        }
    }
}

/// Polls `cond` every millisecond (the guest has one vCPU: the client must run between
/// polls) until it holds; how long that took, or None after `within`.
fn time_until(
    started: Instant,
    within: Duration,
    mut cond: impl FnMut() -> bool,
) -> Option<Duration> {
    loop {
        if cond() {
            return Some(started.elapsed());
        }
        if started.elapsed() > within {
            return None;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// "N trials: p50 X ms, p99 Y ms, max Z ms" of `times`.
fn percentiles(times: &[Duration]) -> String {
    let mut ms: Vec<f64> = times.iter().map(|t| t.as_secs_f64() * 1000.0).collect();
    if ms.is_empty() {
        return "no trials".into();
    }
    ms.sort_by(|a, b| a.total_cmp(b));
    let at = |p: usize| ms[(ms.len() - 1) * p / 100];
    format!(
        "{} trials: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        ms.len(),
        at(50),
        at(99),
        ms[ms.len() - 1]
    )
}

/// The guest's half of host_changes_reach_warm_guest_caches_and_guest_watchers, run in
/// the guest on its mount at /mnt/src. For each trial: read the old state, ask the host
/// for the change, poll until it is visible; the time is from the request (so it includes
/// the request's trip to the host, a vsock hop). Then, with an inotify watch on
/// /mnt/src/watched, ask for each watched step and wait for its events. Prints the times;
/// fails if anything was not visible or heard in VISIBLE_WITHIN. Elsewhere: does nothing.
#[test]
#[ignore = "the guest's side of a VM test: vm.rs runs it inside the guest"]
fn guest_side_of_host_changes() {
    let Some(mut control) = GuestControl::connect() else {
        eprintln!(
            "not in the test guest (no TETHER_VM_CONTROL or no /tether-vm/cmd): nothing to do"
        );
        return;
    };
    // A line of its own after the test harness's "test guest_side_of_host_changes ... ".
    println!();
    let root = Path::new("/mnt/src");
    let mut failures = Vec::new();
    for change in CHANGES {
        let mut times = Vec::new();
        for n in 0..TRIALS {
            let d = root.join("changes").join(format!("{}-{n}", change.name()));
            change.warm(&d);
            if change.visible(&d) {
                failures.push(format!(
                    "{} {n}: already visible before the change",
                    change.name()
                ));
                continue;
            }
            let started = Instant::now();
            control.ask(&format!("change {} {n}", change.name()));
            let seen = time_until(started, VISIBLE_WITHIN, || change.visible(&d));
            let answer = control.answer();
            if answer != "done" {
                failures.push(format!("{} {n}: host: {answer}", change.name()));
            }
            match seen {
                Some(t) => times.push(t),
                None => failures.push(format!(
                    "{} {n}: not visible within {VISIBLE_WITHIN:?}",
                    change.name()
                )),
            }
        }
        println!(
            "time to visible: {:<8} {}",
            change.name(),
            percentiles(&times)
        );
    }
    guest_watch(&mut control, &root.join("watched"), &mut failures);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// An inotify watch on `dir`; asks the host for each watched step WATCH_ROUNDS times and
/// waits for the step's events.
fn guest_watch(control: &mut GuestControl, dir: &Path, failures: &mut Vec<String>) {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: inotify calls on a descriptor this function owns; the path is a C string.
    let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
    assert!(
        fd >= 0,
        "inotify_init1: {}",
        std::io::Error::last_os_error()
    );
    let cpath = std::ffi::CString::new(dir.as_os_str().as_bytes()).unwrap();
    let mask = libc::IN_CREATE
        | libc::IN_MODIFY
        | libc::IN_ATTRIB
        | libc::IN_CLOSE_WRITE
        | libc::IN_DELETE
        | libc::IN_MOVED_FROM
        | libc::IN_MOVED_TO;
    // SAFETY: as above.
    let wd = unsafe { libc::inotify_add_watch(fd, cpath.as_ptr(), mask) };
    assert!(
        wd >= 0,
        "inotify_add_watch: {}",
        std::io::Error::last_os_error()
    );
    let mut times: std::collections::BTreeMap<&str, Vec<Duration>> = Default::default();
    for round in 0..WATCH_ROUNDS {
        for step in WATCH_STEPS {
            let mut want = watch_step_events(step, round);
            let mut heard: Vec<String> = Vec::new();
            let mut cookies = Vec::new();
            let started = Instant::now();
            control.ask(&format!("watch {step} {round}"));
            let done = time_until(started, VISIBLE_WITHIN, || {
                for (ev_mask, cookie, name) in read_inotify(fd) {
                    heard.push(format!("{} {name}", mask_names(ev_mask)));
                    if ev_mask & (libc::IN_MOVED_FROM | libc::IN_MOVED_TO) != 0 {
                        cookies.push(cookie);
                    }
                    want.retain(|(m, n)| !(ev_mask & m == *m && *n == name));
                }
                want.is_empty()
            });
            let answer = control.answer();
            if answer != "done" {
                failures.push(format!("watch {step} {round}: host: {answer}"));
            }
            match done {
                Some(t) => {
                    times.entry(step).or_default().push(t);
                    if round == 0 {
                        println!("watcher heard: {step:<6} {}", heard.join(", "));
                    }
                }
                None => failures.push(format!(
                    "watch {step} {round}: not heard within {VISIBLE_WITHIN:?}: missing {want:?}, heard {heard:?}"
                )),
            }
            if step == "rename"
                && (cookies.len() != 2 || cookies[0] != cookies[1] || cookies[0] == 0)
            {
                failures.push(format!("watch rename {round}: cookies {cookies:?}"));
            }
        }
    }
    for step in WATCH_STEPS {
        let t = times.get(step).map(|v| v.as_slice()).unwrap_or(&[]);
        println!("watcher heard: {step:<6} {}", percentiles(t));
    }
    // SAFETY: closing the descriptor opened above.
    unsafe { libc::close(fd) };
}

/// The events waiting on the (non-blocking) inotify descriptor `fd`: (mask, cookie, name).
fn read_inotify(fd: i32) -> Vec<(u32, u32, String)> {
    let mut buf = [0u8; 4096];
    let mut out = Vec::new();
    loop {
        // SAFETY: reading into a buffer of this size.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr() as *mut libc::c_void, buf.len()) };
        if n <= 0 {
            return out;
        }
        let mut at = 0;
        let head = std::mem::size_of::<libc::inotify_event>();
        while at + head <= n as usize {
            // SAFETY: the kernel wrote whole events; read_unaligned copes with the offset.
            let ev: libc::inotify_event = unsafe {
                std::ptr::read_unaligned(buf[at..].as_ptr() as *const libc::inotify_event)
            };
            let name = &buf[at + head..at + head + ev.len as usize];
            let name = String::from_utf8_lossy(name)
                .trim_end_matches('\0')
                .to_string();
            out.push((ev.mask, ev.cookie, name));
            at += head + ev.len as usize;
        }
    }
}

fn mask_names(mask: u32) -> String {
    let names = [
        (libc::IN_CREATE, "CREATE"),
        (libc::IN_MODIFY, "MODIFY"),
        (libc::IN_ATTRIB, "ATTRIB"),
        (libc::IN_CLOSE_WRITE, "CLOSE_WRITE"),
        (libc::IN_DELETE, "DELETE"),
        (libc::IN_MOVED_FROM, "MOVED_FROM"),
        (libc::IN_MOVED_TO, "MOVED_TO"),
        (libc::IN_ISDIR, "ISDIR"),
    ];
    let set: Vec<&str> = names
        .iter()
        .filter(|(m, _)| mask & m != 0)
        .map(|(_, n)| *n)
        .collect();
    set.join("|")
}
