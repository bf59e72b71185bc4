//! Tether installed like a file system: `mount.tether` (mount(8)'s helper convention),
//! `tether mount --background`, and loading the fuse module when /dev/fuse is missing.
//!
//! Background mounts: the parent re-runs its own binary with the same arguments and
//! `TETHER_READY_FD` set to the write end of a pipe; that child (in a new session, its
//! standard streams on /dev/null or the `--log` file) mounts, then writes `ready` or
//! `error: ...` to the pipe and closes it. The parent returns once it reads that line, or
//! fails with the child's error (or its exit status, if it died without a word).

use std::ffi::{OsStr, OsString};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use anyhow::{bail, Context, Result};

/// The environment variable that tells a background child which descriptor to report on.
const READY_FD: &str = "TETHER_READY_FD";

/// The pipe to the parent of a background mount, in the child: set once at startup
/// ([`take_ready_pipe`]), used once ([`signal_ready`] or [`signal_failed`]).
static READY_PIPE: Mutex<Option<std::fs::File>> = Mutex::new(None);
/// Whether this process is a background mount's (set with the pipe, never cleared).
static IN_BACKGROUND: AtomicBool = AtomicBool::new(false);

/// In a background mount's process, takes the pipe to the parent from the environment
/// (and removes it there, so that nothing the mount starts inherits it).
pub fn take_ready_pipe() {
    let Some(fd) = std::env::var(READY_FD)
        .ok()
        .and_then(|v| v.parse::<i32>().ok())
    else {
        return;
    };
    std::env::remove_var(READY_FD);
    // Only a descriptor that is open and a pipe (not a number inherited by accident).
    // SAFETY: all zeroes is a valid stat value; fstat writes into it and only looks at fd.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above: st is a valid, writable stat buffer.
    if unsafe { libc::fstat(fd, &mut st) } != 0 || st.st_mode & libc::S_IFMT != libc::S_IFIFO {
        return;
    }
    // SAFETY: the parent opened this descriptor for this process alone and passed its
    // number; ownership is taken here, once (the variable is gone from the environment).
    let file = unsafe { std::fs::File::from_raw_fd(fd) };
    // Not inherited by anything the mount runs (ssh, modprobe).
    // SAFETY: fcntl on a descriptor this process owns; no pointers.
    unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
    *READY_PIPE.lock().unwrap() = Some(file);
    IN_BACKGROUND.store(true, Ordering::Relaxed);
}

/// Whether this process is a background mount's, started by `mount --background`.
pub fn in_background() -> bool {
    IN_BACKGROUND.load(Ordering::Relaxed)
}

/// Tells the waiting parent that the mount is up; it returns, and this process goes on
/// alone (in /, so that it keeps no directory of the caller's busy; paths were made
/// absolute first).
pub fn signal_ready() {
    if let Some(mut pipe) = READY_PIPE.lock().unwrap().take() {
        let _ = pipe.write_all(b"ready\n");
        let _ = std::env::set_current_dir("/");
    }
}

/// Tells the waiting parent, if any, why mounting failed.
pub fn signal_failed(e: &anyhow::Error) {
    if let Some(mut pipe) = READY_PIPE.lock().unwrap().take() {
        let msg = format!("{e:#}").replace('\n', " ");
        let _ = pipe.write_all(format!("error: {msg}\n").as_bytes());
    }
}

/// `tether mount --background`: runs this binary again with `args` (the whole command line
/// after the program name) as a detached mount process, and returns once it has mounted.
pub fn mount_in_background(args: &[OsString], log: Option<&Path>, verbose: bool) -> Result<()> {
    let exe = std::env::current_exe().context("cannot find this program to run it again")?;
    let (read_end, write_end) = pipe()?;
    let stderr = match log {
        Some(path) => Stdio::from(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("cannot open the log file {}", path.display()))?,
        ),
        None => Stdio::null(),
    };
    let write_fd = write_end.as_raw_fd();
    let mut cmd = Command::new(&exe);
    cmd.args(args)
        .env(READY_FD, write_fd.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr);
    // SAFETY: the closure runs in the forked child before exec and calls only
    // async-signal-safe functions (setsid, fcntl) on its own descriptors.
    unsafe {
        cmd.pre_exec(move || {
            // Detached: no controlling terminal, so no SIGHUP when the caller's session ends,
            // and no SIGINT from its Ctrl-C.
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The pipe's write end is the one descriptor the mount inherits.
            if libc::fcntl(write_fd, libc::F_SETFD, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot start {}", exe.display()))?;
    // Only the child holds the write end now: EOF means it finished or died.
    drop(write_end);
    let mut said = String::new();
    let mut reader = std::fs::File::from(read_end);
    let read = reader.read_to_string(&mut said);
    let line = said.lines().next().unwrap_or("").to_string();
    if line == "ready" {
        if verbose {
            eprintln!("tether: mounted in the background (pid {})", child.id());
        }
        return Ok(());
    }
    // Failed: the child exits; reap it so that its status can be told.
    let status = child.wait().ok();
    if let Some(msg) = line.strip_prefix("error: ") {
        bail!("{msg}");
    }
    read.context("cannot read from the mount process")?;
    let log_hint = match log {
        Some(p) => format!(" (its log: {})", p.display()),
        None => " (--log FILE keeps its log)".to_string(),
    };
    match status {
        Some(s) => bail!("the mount process ended before mounting: {s}{log_hint}"),
        None => bail!("the mount process ended before mounting{log_hint}"),
    }
}

/// A pipe, both ends close-on-exec.
fn pipe() -> Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0i32; 2];
    // SAFETY: fds is a writable array of two descriptors, as pipe2 expects.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error()).context("cannot make a pipe");
    }
    // SAFETY: pipe2 just returned these two new descriptors; nothing else owns them.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Makes sure /dev/fuse exists: loads the fuse module (as root) if it is missing, and makes
/// the device node if the module is there but no devtmpfs or udev made it.
pub fn ensure_dev_fuse() -> Result<()> {
    let dev = Path::new("/dev/fuse");
    if dev.exists() {
        return Ok(());
    }
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if root {
        tracing::info!("no /dev/fuse: running modprobe fuse");
        match Command::new("modprobe")
            .arg("fuse")
            .stdin(Stdio::null())
            .status()
        {
            Ok(s) if !s.success() => tracing::warn!("modprobe fuse failed: {s}"),
            Err(e) => tracing::warn!("cannot run modprobe: {e}"),
            Ok(_) => {}
        }
        // devtmpfs makes the node when the module registers it; wait a moment for it.
        for _ in 0..50 {
            if dev.exists() {
                return Ok(());
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        // The module is loaded but nothing made the node (no devtmpfs, no udev).
        if let Ok(numbers) = std::fs::read_to_string("/sys/class/misc/fuse/dev") {
            if let Some((major, minor)) = numbers.trim().split_once(':') {
                if let (Ok(major), Ok(minor)) = (major.parse::<u32>(), minor.parse::<u32>()) {
                    let path = c"/dev/fuse";
                    // SAFETY: path is NUL-terminated; mknod takes no other pointers.
                    let r = unsafe {
                        libc::mknod(
                            path.as_ptr(),
                            libc::S_IFCHR | 0o666,
                            libc::makedev(major, minor),
                        )
                    };
                    if r == 0 {
                        tracing::info!("made /dev/fuse ({major}:{minor})");
                        return Ok(());
                    }
                }
            }
        }
    }
    bail!(
        "no /dev/fuse: load the fuse module (modprobe fuse) or install it{}",
        if root {
            " (modprobe fuse did not make it appear)"
        } else {
            " (as root)"
        }
    )
}

/// Whether this program was started as mount(8)'s helper (argv[0] named `mount.tether`).
pub fn invoked_as_helper(argv0: &OsStr) -> bool {
    Path::new(argv0).file_name() == Some(OsStr::new("mount.tether"))
}

/// What mount(8)'s helper command line asks for.
#[derive(Debug, PartialEq, Eq)]
pub struct HelperCall {
    /// The equivalent `tether` command line (without the program name).
    pub args: Vec<OsString>,
    /// -f: check everything, mount nothing.
    pub fake: bool,
}

/// Options mount(8), systemd and fstab conventions pass that mean nothing to Tether.
fn ignored_option(name: &str) -> bool {
    matches!(
        name,
        "_netdev"
            | "nofail"
            | "defaults"
            | "rw"
            | "auto"
            | "noauto"
            | "user"
            | "users"
            | "nouser"
            | "owner"
            | "group"
            | "comment"
            // What every Tether mount is anyway.
            | "nodev"
            | "nosuid"
            | "noatime"
    ) || name.starts_with("x-")
}

/// Translates `mount.tether SOURCE MOUNTPOINT [-sfnvrw] [-N NS] [-t TYPE] [-o OPTIONS]` into
/// a `tether mount --background` command line. `-o` options (see the usage in docs/install.md):
/// secret-file=PATH, writes=MODE, ro, attr-timeout=S, timeout=S, uid=N, gid=N,
/// no-watch-events, local-locks, nonempty, threads=N, no-push, log=FILE; generic ones
/// (_netdev, nofail, defaults, rw, auto, noauto, user, x-systemd.*, comment=...) are
/// ignored; anything else is an error, or (with -s, sloppy) a warning.
pub fn helper_args(args: &[OsString]) -> Result<HelperCall> {
    let mut positional: Vec<OsString> = Vec::new();
    let mut options: Vec<String> = Vec::new();
    let (mut sloppy, mut fake, mut verbose, mut read_only) = (false, false, false, false);
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let s = arg.to_string_lossy();
        if s == "--" {
            positional.extend(it.by_ref().cloned());
            break;
        }
        let Some(flags) = s.strip_prefix('-').filter(|f| !f.is_empty()) else {
            positional.push(arg.clone());
            continue;
        };
        // Grouped single-letter flags; -o, -t and -N take a value (attached or next).
        for (i, c) in flags.char_indices() {
            match c {
                's' => sloppy = true,
                'f' => fake = true,
                'n' => {} // mount(8) keeps no mtab for us to write
                'v' => verbose = true,
                'r' => read_only = true,
                'w' => {}
                'o' | 't' | 'N' => {
                    let rest = &flags[i + c.len_utf8()..];
                    let value = if rest.is_empty() {
                        it.next()
                            .map(|v| v.to_string_lossy().into_owned())
                            .with_context(|| format!("mount.tether: -{c} needs a value"))?
                    } else {
                        rest.to_string()
                    };
                    match c {
                        'o' => options
                            .extend(value.split(',').filter(|o| !o.is_empty()).map(String::from)),
                        't' => {
                            if !matches!(value.as_str(), "tether" | "fuse.tether") {
                                bail!("mount.tether: cannot mount type {value:?}");
                            }
                        }
                        _ => bail!(
                            "mount.tether: -N (another mount namespace) is not supported: \
                             run mount in that namespace (nsenter)"
                        ),
                    }
                    break;
                }
                other => bail!("mount.tether: unknown flag -{other}"),
            }
        }
    }
    let [source, mountpoint] = &positional[..] else {
        bail!(
            "usage: mount.tether SOURCE MOUNTPOINT [-sfnvrw] [-o OPTIONS] (got {} arguments \
             besides the flags)",
            positional.len()
        );
    };
    let mut out: Vec<OsString> = Vec::new();
    if verbose {
        out.push("-v".into());
    }
    out.extend(["mount".into(), "--background".into()]);
    if read_only {
        out.push("--read-only".into());
    }
    for opt in &options {
        let (name, value) = match opt.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (opt.as_str(), None),
        };
        let flag_with_value = |flag: &str| -> Result<Vec<OsString>> {
            match value {
                Some(v) if !v.is_empty() => Ok(vec![flag.into(), v.into()]),
                _ => bail!("mount.tether: option {name} needs a value ({name}=...)"),
            }
        };
        let flag = |flag: &str| -> Result<Vec<OsString>> {
            match value {
                None => Ok(vec![flag.into()]),
                Some(_) => bail!("mount.tether: option {name} takes no value"),
            }
        };
        let mapped = match name {
            "secret-file" => flag_with_value("--secret-file")?,
            "writes" => flag_with_value("--writes")?,
            "attr-timeout" => flag_with_value("--attr-timeout")?,
            "timeout" => flag_with_value("--timeout")?,
            "uid" => flag_with_value("--uid")?,
            "gid" => flag_with_value("--gid")?,
            "threads" => flag_with_value("--threads")?,
            "log" => flag_with_value("--log")?,
            "ro" => flag("--read-only")?,
            "no-watch-events" => flag("--no-watch-events")?,
            "local-locks" => flag("--local-locks")?,
            "nonempty" => flag("--nonempty")?,
            "no-push" => flag("--no-push")?,
            n if ignored_option(n) => Vec::new(),
            _ if sloppy => {
                eprintln!("mount.tether: ignoring unknown option {opt:?} (-s)");
                Vec::new()
            }
            _ => bail!(
                "mount.tether: unknown option {opt:?} (known: secret-file=, writes=, ro, \
                 attr-timeout=, timeout=, uid=, gid=, threads=, log=, no-watch-events, \
                 local-locks, nonempty, no-push)"
            ),
        };
        out.extend(mapped);
    }
    // `--` so that a source or mount point starting with '-' is not taken for a flag.
    out.extend(["--".into(), source.clone(), mountpoint.clone()]);
    Ok(HelperCall { args: out, fake })
}

/// The mount point as an absolute path (a background mount changes to / once mounted).
pub fn absolute(p: &Path) -> Result<PathBuf> {
    std::path::absolute(p).with_context(|| format!("cannot resolve {}", p.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(args: &[&str]) -> Result<HelperCall> {
        helper_args(&args.iter().map(OsString::from).collect::<Vec<_>>())
    }

    fn words(c: &HelperCall) -> Vec<String> {
        c.args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn maps_mount_options_to_flags() {
        let c = call(&[
            "vsock:2:7070",
            "/mnt/src",
            "-o",
            "_netdev,nofail,secret-file=/etc/tether/secret,writes=behind,ro,attr-timeout=5,\
             timeout=30,uid=1000,gid=100,no-watch-events,local-locks,nonempty,\
             x-systemd.automount,comment=x,defaults,rw,auto,noauto,user",
        ])
        .unwrap();
        assert!(!c.fake);
        assert_eq!(
            words(&c),
            [
                "mount",
                "--background",
                "--secret-file",
                "/etc/tether/secret",
                "--writes",
                "behind",
                "--read-only",
                "--attr-timeout",
                "5",
                "--timeout",
                "30",
                "--uid",
                "1000",
                "--gid",
                "100",
                "--no-watch-events",
                "--local-locks",
                "--nonempty",
                "--",
                "vsock:2:7070",
                "/mnt/src",
            ]
        );
    }

    #[test]
    fn takes_mount8_flags_in_any_order_and_grouped() {
        let c = call(&["-sfnv", "-oro", "unix:/s", "/m", "-t", "tether", "-w"]).unwrap();
        assert!(c.fake);
        assert_eq!(
            words(&c),
            [
                "-v",
                "mount",
                "--background",
                "--read-only",
                "--",
                "unix:/s",
                "/m"
            ]
        );
        let c = call(&["unix:/s", "/m", "-r"]).unwrap();
        assert!(words(&c).contains(&"--read-only".to_string()));
    }

    #[test]
    fn refuses_what_it_does_not_know_naming_it() {
        let e = call(&["a:b", "/m", "-o", "ro,colour=blue"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"colour=blue\""), "{e}");
        // Sloppy (-s): only a warning.
        assert!(call(&["a:b", "/m", "-s", "-o", "colour=blue"]).is_ok());
        let e = call(&["a:b", "/m", "-o", "secret-file"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("secret-file needs a value"), "{e}");
        let e = call(&["a:b", "/m", "-o", "ro=1"]).unwrap_err().to_string();
        assert!(e.contains("ro takes no value"), "{e}");
        let e = call(&["a:b"]).unwrap_err().to_string();
        assert!(e.contains("usage: mount.tether"), "{e}");
        let e = call(&["a:b", "/m", "-t", "nfs"]).unwrap_err().to_string();
        assert!(e.contains("\"nfs\""), "{e}");
        let e = call(&["a:b", "/m", "-o"]).unwrap_err().to_string();
        assert!(e.contains("-o needs a value"), "{e}");
        let e = call(&["a:b", "/m", "-x"]).unwrap_err().to_string();
        assert!(e.contains("-x"), "{e}");
    }

    #[test]
    fn knows_its_name() {
        assert!(invoked_as_helper(OsStr::new("/sbin/mount.tether")));
        assert!(invoked_as_helper(OsStr::new("mount.tether")));
        assert!(!invoked_as_helper(OsStr::new("/usr/bin/tether")));
    }
}
