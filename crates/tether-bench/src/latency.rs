//! `tether latency`: how long a change made on the host takes to become visible through a
//! mount. Each trial makes one change in HOSTDIR and polls the same path in MOUNTDIR until
//! the change shows, cycling through ten kinds of change, each with its own check. With
//! `--sync`, each change is followed by `tether sync` and one check instead: the times are
//! the barrier's, and a change not visible after it is a failure of the barrier.

use std::fs::{self, File};
use std::io::{ErrorKind, Write as _};
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use serde::Serialize;

use crate::host_change::HostChange as Change;
use crate::inotify::{Event, Watch};
use crate::report::fmt_secs;
use crate::sys::{self, Interrupt, Machine, Rng};
use crate::LatencyArgs;

/// Pause between two polls of the mount.
const POLL: Duration = Duration::from_micros(75);
/// A kind is given up after this many changes in a row that never showed.
const GIVE_UP_AFTER: u32 = 3;
const REWRITE_LEN: usize = 4096;
const APPEND_LEN: u64 = 64;

const KINDS: [Change; 10] = Change::ALL;

impl Change {
    /// The inotify event a watcher of the directory expects for this change (what the same
    /// change made locally raises; setting only the mtime is IN_MODIFY).
    fn event(self) -> (u32, &'static str) {
        match self {
            Change::Rewrite | Change::Append | Change::Truncate | Change::Utimes => {
                (libc::IN_MODIFY, "IN_MODIFY")
            }
            Change::Chmod => (libc::IN_ATTRIB, "IN_ATTRIB"),
            Change::Create | Change::Mkdir => (libc::IN_CREATE, "IN_CREATE"),
            Change::Delete | Change::Rmdir => (libc::IN_DELETE, "IN_DELETE"),
            Change::Rename => (libc::IN_MOVED_TO, "IN_MOVED_TO"),
        }
    }

    /// What the mount is polled for.
    fn check(self) -> &'static str {
        match self {
            Change::Rewrite => "same-size content read back",
            Change::Append | Change::Truncate => "stat size",
            Change::Chmod => "stat mode",
            Change::Utimes => "stat mtime",
            Change::Create => "stat finds it",
            Change::Delete => "stat: ENOENT",
            Change::Rename => "new name found, old gone",
            Change::Mkdir => "listing contains it",
            Change::Rmdir => "listing omits it",
        }
    }
}

/// The host-side state of the files the stateful kinds change, and the two views.
struct Lab {
    host: PathBuf,
    mount: PathBuf,
    rng: Rng,
    content: Vec<u8>,
    append_size: u64,
    truncate_size: u64,
    mode: u32,
    mtime: i64,
}

fn exists(p: &Path) -> bool {
    fs::symlink_metadata(p).is_ok()
}

fn absent(p: &Path) -> bool {
    matches!(fs::symlink_metadata(p), Err(e) if e.kind() == ErrorKind::NotFound)
}

fn listing_has(dir: &Path, name: &str) -> Option<bool> {
    let mut found = false;
    for e in fs::read_dir(dir).ok()? {
        if e.ok()?.file_name() == name {
            found = true;
        }
    }
    Some(found)
}

impl Lab {
    fn names(kind: Change, k: usize) -> (String, String) {
        match kind {
            Change::Create => (format!("new-{k}"), String::new()),
            Change::Delete => (format!("del-{k}"), String::new()),
            Change::Rename => (format!("ren-{k}"), format!("ren-{k}.moved")),
            Change::Mkdir => (format!("mkd-{k}"), String::new()),
            Change::Rmdir => (format!("rmd-{k}"), String::new()),
            _ => (kind.name().to_string(), String::new()),
        }
    }

    /// Creates the files every kind starts from, in the host directory.
    fn setup(&mut self, per_kind: usize) -> Result<Vec<String>> {
        let mut names = Vec::new();
        let mut content = vec![0u8; REWRITE_LEN];
        self.fill(&mut content);
        fs::write(self.host.join("rewrite"), &content)?;
        self.content = content;
        self.append_size = 100;
        fs::write(
            self.host.join("append"),
            vec![b'a'; self.append_size as usize],
        )?;
        self.truncate_size = per_kind as u64 * APPEND_LEN + 4096;
        File::create(self.host.join("truncate"))?.set_len(self.truncate_size)?;
        self.mode = 0o644;
        fs::write(self.host.join("chmod"), b"chmod\n")?;
        fs::set_permissions(
            self.host.join("chmod"),
            fs::Permissions::from_mode(self.mode),
        )?;
        self.mtime = 1_500_000_000;
        fs::write(self.host.join("utimes"), b"utimes\n")?;
        set_mtime(&self.host.join("utimes"), self.mtime)?;
        names.extend(["rewrite", "append", "truncate", "chmod", "utimes"].map(String::from));
        for k in 0..per_kind {
            for kind in [Change::Delete, Change::Rename] {
                let n = Lab::names(kind, k).0;
                fs::write(self.host.join(&n), b"x\n")?;
                names.push(n);
            }
            let n = Lab::names(Change::Rmdir, k).0;
            fs::create_dir(self.host.join(&n))?;
            names.push(n);
        }
        Ok(names)
    }

    fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.rng.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }

    /// Whether the mount shows the state before (`after == false`) or after trial `k` of
    /// `kind`. For the stateful kinds both mean "shows the host's current value".
    fn holds(&self, kind: Change, k: usize, after: bool) -> bool {
        let (a, b) = Lab::names(kind, k);
        let p = self.mount.join(&a);
        match kind {
            Change::Rewrite => fs::read(&p).is_ok_and(|c| c == self.content),
            Change::Append => fs::symlink_metadata(&p).is_ok_and(|m| m.len() == self.append_size),
            Change::Truncate => {
                fs::symlink_metadata(&p).is_ok_and(|m| m.len() == self.truncate_size)
            }
            Change::Chmod => fs::symlink_metadata(&p).is_ok_and(|m| m.mode() & 0o7777 == self.mode),
            Change::Utimes => fs::symlink_metadata(&p).is_ok_and(|m| m.mtime() == self.mtime),
            Change::Create => {
                if after {
                    exists(&p)
                } else {
                    absent(&p)
                }
            }
            Change::Delete => {
                if after {
                    absent(&p)
                } else {
                    exists(&p)
                }
            }
            Change::Rename => {
                let q = self.mount.join(&b);
                if after {
                    exists(&q) && absent(&p)
                } else {
                    exists(&p) && absent(&q)
                }
            }
            Change::Mkdir => listing_has(&self.mount, &a) == Some(after),
            Change::Rmdir => listing_has(&self.mount, &a) == Some(!after),
        }
    }

    /// Makes trial `k`'s change of `kind` in the host directory.
    fn change(&mut self, kind: Change, k: usize) -> Result<()> {
        let (a, b) = Lab::names(kind, k);
        let p = self.host.join(&a);
        match kind {
            Change::Rewrite => {
                let mut content = vec![0u8; REWRITE_LEN];
                self.fill(&mut content);
                content[..8].copy_from_slice(&(k as u64).to_le_bytes());
                // In place: a truncating write would briefly show an empty file.
                File::options()
                    .write(true)
                    .open(&p)?
                    .write_all_at(&content, 0)?;
                self.content = content;
            }
            Change::Append => {
                File::options()
                    .append(true)
                    .open(&p)?
                    .write_all(&[b'b'; APPEND_LEN as usize])?;
                self.append_size += APPEND_LEN;
            }
            Change::Truncate => {
                self.truncate_size -= APPEND_LEN;
                File::options()
                    .write(true)
                    .open(&p)?
                    .set_len(self.truncate_size)?;
            }
            Change::Chmod => {
                self.mode = if self.mode == 0o644 { 0o600 } else { 0o644 };
                fs::set_permissions(&p, fs::Permissions::from_mode(self.mode))?;
            }
            Change::Utimes => {
                // Whole seconds: sftp (sshfs) carries no sub-second times.
                self.mtime += 17;
                set_mtime(&p, self.mtime)?;
            }
            Change::Create => drop(File::create(&p)?),
            Change::Delete => fs::remove_file(&p)?,
            Change::Rename => fs::rename(&p, self.host.join(&b))?,
            Change::Mkdir => fs::create_dir(&p)?,
            Change::Rmdir => fs::remove_dir(&p)?,
        }
        Ok(())
    }
}

fn set_mtime(p: &Path, secs: i64) -> Result<()> {
    let t = UNIX_EPOCH + Duration::from_secs(secs as u64);
    File::open(p)?.set_modified(t)?;
    Ok(())
}

/// An inotify watch on the lab directory in the mount: what a guest file watcher sees.
struct InotifyProbe {
    watch: Watch,
    buf: Vec<u8>,
}

impl InotifyProbe {
    fn new(dir: &Path) -> Result<InotifyProbe> {
        let watch =
            Watch::new(dir, true).with_context(|| format!("cannot watch {}", dir.display()))?;
        Ok(InotifyProbe {
            watch,
            buf: vec![0u8; 64 * 1024],
        })
    }

    /// Events queued now, as (mask, name).
    fn read(&mut self) -> Vec<Event> {
        let mut out = Vec::new();
        while let Some(events) = self.watch.read(&mut self.buf) {
            out.extend(events);
        }
        out
    }

    /// Waits for `mask` on `name`; how long that took, or None after `timeout`.
    fn wait(
        &mut self,
        mask: u32,
        name: &str,
        timeout: Duration,
        intr: &Interrupt,
    ) -> Result<Option<Duration>> {
        let start = Instant::now();
        loop {
            if self
                .read()
                .iter()
                .any(|(m, n)| m & mask != 0 && n == name.as_bytes())
            {
                return Ok(Some(start.elapsed()));
            }
            if start.elapsed() >= timeout {
                return Ok(None);
            }
            intr.check()?;
            // 10 ms at a time, so that an interrupt is noticed.
            self.watch.wait(10);
        }
    }
}

/// Polls `check` until it holds (returns how long that took) or `timeout` passes.
fn wait_for(
    mut check: impl FnMut() -> bool,
    timeout: Duration,
    intr: &Interrupt,
) -> Result<Option<Duration>> {
    let start = Instant::now();
    loop {
        if check() {
            return Ok(Some(start.elapsed()));
        }
        if start.elapsed() >= timeout {
            return Ok(None);
        }
        intr.check()?;
        thread::sleep(POLL);
    }
}

#[derive(Default)]
struct Tally {
    samples: Vec<Duration>,
    not_visible: u32,
    setup_not_visible: u32,
    in_a_row: u32,
    stopped: bool,
}

#[derive(Serialize)]
struct Stats {
    attempted: u32,
    visible: u32,
    not_visible: u32,
    p50_ms: Option<f64>,
    p99_ms: Option<f64>,
    max_ms: Option<f64>,
}

#[derive(Serialize)]
struct KindReport {
    kind: &'static str,
    check: &'static str,
    #[serde(flatten)]
    stats: Stats,
    /// Trials whose starting state (the previous change) never showed in the mount.
    setup_not_visible: u32,
    /// Given up after 3 changes in a row that never showed.
    stopped: bool,
}

#[derive(Serialize)]
struct LatencyReport {
    tool: &'static str,
    date_unix: u64,
    machine: Machine,
    host: String,
    mount: String,
    trials: u32,
    timeout_s: f64,
    poll_us: u64,
    /// Timed to an inotify event on the mount rather than to a poll showing the change.
    inotify: bool,
    /// Each change followed by `tether sync` and one check; times are the sync's.
    sync: bool,
    kinds: Vec<KindReport>,
    overall: Stats,
    /// With `sync`: syncs with nothing changed (before each change).
    #[serde(skip_serializing_if = "Option::is_none")]
    idle_sync: Option<Stats>,
}

fn percentile(sorted: &[Duration], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1].as_secs_f64() * 1e3)
}

fn stats(samples: &[Duration], not_visible: u32) -> Stats {
    let mut s = samples.to_vec();
    s.sort();
    Stats {
        attempted: s.len() as u32 + not_visible,
        visible: s.len() as u32,
        not_visible,
        p50_ms: percentile(&s, 0.50),
        p99_ms: percentile(&s, 0.99),
        max_ms: s.last().map(|d| d.as_secs_f64() * 1e3),
    }
}

pub fn run(args: LatencyArgs) -> Result<()> {
    if !(args.timeout.is_finite() && args.timeout > 0.0 && args.timeout <= 3600.0) {
        bail!("--timeout must be a number of seconds between 0 and 3600");
    }
    for d in [&args.host, &args.mount] {
        if !fs::metadata(d)
            .with_context(|| format!("cannot use {}", d.display()))?
            .is_dir()
        {
            bail!("{} is not a directory", d.display());
        }
    }
    let intr = Interrupt::install()?;
    let name = format!(".tether-latency-{}", std::process::id());
    let host = args.host.join(&name);
    fs::create_dir(&host).with_context(|| format!("cannot create {}", host.display()))?;
    let mut lab = Lab {
        host: host.clone(),
        mount: args.mount.join(&name),
        rng: Rng::new(0x1a7e),
        content: Vec::new(),
        append_size: 0,
        truncate_size: 0,
        mode: 0,
        mtime: 0,
    };
    let result = trials(&args, &mut lab, &intr);
    let removed = fs::remove_dir_all(&host);
    let (tallies, idle) = match result {
        Err(e) if sys::is_interrupted(&e) => bail!("interrupted; removed {}", host.display()),
        r => r?,
    };
    if let Err(e) = removed {
        eprintln!("tether: cannot remove {}: {e}", host.display());
    }

    let kinds: Vec<KindReport> = KINDS
        .iter()
        .zip(&tallies)
        .map(|(k, t)| KindReport {
            kind: k.name(),
            check: if args.inotify {
                k.event().1
            } else if args.sync {
                "read once right after the sync"
            } else {
                k.check()
            },
            stats: stats(&t.samples, t.not_visible + t.setup_not_visible),
            setup_not_visible: t.setup_not_visible,
            stopped: t.stopped,
        })
        .collect();
    let all: Vec<Duration> = tallies.iter().flat_map(|t| t.samples.clone()).collect();
    let report = LatencyReport {
        tool: "tether latency",
        date_unix: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        machine: sys::machine(),
        host: args.host.display().to_string(),
        mount: args.mount.display().to_string(),
        trials: args.trials,
        timeout_s: args.timeout,
        poll_us: POLL.as_micros() as u64,
        inotify: args.inotify,
        sync: args.sync,
        idle_sync: args.sync.then(|| stats(&idle, 0)),
        overall: stats(
            &all,
            tallies
                .iter()
                .map(|t| t.not_visible + t.setup_not_visible)
                .sum(),
        ),
        kinds,
    };
    crate::print_out(&table(&report))?;
    if let Some(p) = &args.json {
        let json = serde_json::to_string_pretty(&report)?;
        fs::write(p, json + "\n").with_context(|| format!("cannot write {}", p.display()))?;
    }
    Ok(())
}

/// Runs the trials; returns their tallies by kind and, with `--sync`, the times of the
/// syncs with nothing changed.
fn trials(
    args: &LatencyArgs,
    lab: &mut Lab,
    intr: &Interrupt,
) -> Result<(Vec<Tally>, Vec<Duration>)> {
    let timeout = Duration::from_secs_f64(args.timeout);
    let per_kind = (args.trials as usize).div_ceil(KINDS.len());
    let names = lab.setup(per_kind)?;
    // The mount must show the starting files; allow a generous wait for caches of the
    // parent directory to expire.
    let setup_wait = timeout.max(Duration::from_secs(30));
    let seen = wait_for(
        || {
            fs::read_dir(&lab.mount).is_ok_and(|rd| {
                let listed: std::collections::HashSet<_> =
                    rd.filter_map(|e| e.ok().map(|e| e.file_name())).collect();
                names
                    .iter()
                    .all(|n| listed.contains(std::ffi::OsStr::new(n)))
            })
        },
        setup_wait,
        intr,
    )?;
    if seen.is_none() {
        bail!(
            "{} never showed the files created in {} within {} s: are HOSTDIR and MOUNTDIR \
             the same directory?",
            lab.mount.display(),
            lab.host.display(),
            setup_wait.as_secs()
        );
    }
    let mut probe = if args.inotify {
        Some(InotifyProbe::new(&lab.mount)?)
    } else {
        None
    };
    let (bars, pb) = crate::progress(u64::from(args.trials));
    let mut tallies: Vec<Tally> = KINDS.iter().map(|_| Tally::default()).collect();
    let mut idle = Vec::new();
    let sync = |lab: &Lab| -> Result<Duration> {
        let start = Instant::now();
        tether_client::sync::sync(&lab.mount)?;
        Ok(start.elapsed())
    };
    for i in 0..args.trials as usize {
        intr.check()?;
        pb.inc(1);
        let (ki, k) = (i % KINDS.len(), i / KINDS.len());
        let kind = KINDS[ki];
        let t = &mut tallies[ki];
        if t.stopped {
            continue;
        }
        pb.set_message(kind.name());
        if !bars && i > 0 && i % 100 == 0 {
            eprintln!("latency: {i}/{} trials", args.trials);
        }
        // The previous change must show first, or this trial would time the backlog.
        if wait_for(|| lab.holds(kind, k, false), timeout, intr)?.is_none() {
            t.setup_not_visible += 1;
            t.in_a_row += 1;
        } else {
            if let Some(p) = &mut probe {
                p.read(); // events of the checks above
            }
            if args.sync {
                idle.push(sync(lab)?);
            }
            lab.change(kind, k)
                .with_context(|| format!("{} #{k} on the host", kind.name()))?;
            let seen = match &mut probe {
                _ if args.sync => {
                    let took = sync(lab)?;
                    lab.holds(kind, k, true).then_some(took)
                }
                Some(p) => {
                    let (a, b) = Lab::names(kind, k);
                    let name = if kind == Change::Rename { b } else { a };
                    p.wait(kind.event().0, &name, timeout, intr)?
                }
                None => wait_for(|| lab.holds(kind, k, true), timeout, intr)?,
            };
            match seen {
                Some(d) => {
                    t.samples.push(d);
                    t.in_a_row = 0;
                }
                None => {
                    t.not_visible += 1;
                    t.in_a_row += 1;
                }
            }
        }
        if t.in_a_row >= GIVE_UP_AFTER {
            t.stopped = true;
            let msg = format!(
                "latency: {} changes are not visible within {} s; giving up on that kind",
                kind.name(),
                args.timeout
            );
            if bars {
                pb.println(msg);
            } else {
                eprintln!("{msg}");
            }
        }
    }
    pb.finish_and_clear();
    Ok((tallies, idle))
}

fn fmt_ms(ms: Option<f64>) -> String {
    match ms {
        None => "-".into(),
        Some(ms) if ms < 1.0 => format!("{:.0} us", ms * 1e3),
        Some(ms) if ms < 1000.0 => format!("{} ms", fmt_secs(ms)),
        Some(ms) => format!("{} s", fmt_secs(ms / 1e3)),
    }
}

fn table(r: &LatencyReport) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let how = if r.inotify {
        "heard by an inotify watch on"
    } else if r.sync {
        "each followed by `tether sync` and one read through"
    } else {
        "polled through"
    };
    let _ = writeln!(
        out,
        "tether latency: changes made in {}, {how} {}",
        r.host, r.mount
    );
    let poll = if r.inotify {
        String::new()
    } else if r.sync {
        "; times are the sync's, \"not visible\" means stale after it".into()
    } else {
        format!("; polling every {} us", r.poll_us)
    };
    let _ = writeln!(
        out,
        "{} trials cycling through {} kinds; timeout {} s{poll}\n",
        r.trials,
        KINDS.len(),
        r.timeout_s,
    );
    let mut rows = vec![[
        "kind",
        "visible when",
        "n",
        "p50",
        "p99",
        "max",
        "not visible",
    ]
    .map(String::from)
    .to_vec()];
    let row = |name: &str, check: &str, s: &Stats, extra: String| {
        vec![
            name.to_string(),
            check.to_string(),
            s.visible.to_string(),
            fmt_ms(s.p50_ms),
            fmt_ms(s.p99_ms),
            fmt_ms(s.max_ms),
            extra,
        ]
    };
    for k in &r.kinds {
        let extra = if k.stopped && k.stats.visible == 0 {
            format!("all: never within {} s", r.timeout_s)
        } else if k.stopped {
            format!("{} (then gave up)", k.stats.not_visible)
        } else {
            k.stats.not_visible.to_string()
        };
        rows.push(row(k.kind, k.check, &k.stats, extra));
    }
    rows.push(row(
        "all",
        "",
        &r.overall,
        r.overall.not_visible.to_string(),
    ));
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    for row in &rows {
        let mut line = String::new();
        for (i, c) in row.iter().enumerate() {
            let pad = widths[i] - c.chars().count();
            if i < 2 || i == 6 {
                let _ = write!(line, "{c}{}  ", " ".repeat(pad));
            } else {
                let _ = write!(line, "{}{c}  ", " ".repeat(pad));
            }
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
    if let Some(idle) = &r.idle_sync {
        let _ = writeln!(
            out,
            "\nsync with nothing changed: n {}, p50 {}, p99 {}, max {}",
            idle.visible,
            fmt_ms(idle.p50_ms),
            fmt_ms(idle.p99_ms),
            fmt_ms(idle.max_ms)
        );
    }
    if r.kinds.iter().any(|k| k.stopped) {
        let _ = writeln!(
            out,
            "\n\"gave up\": after {GIVE_UP_AFTER} changes in a row not visible within {} s, \
             the remaining trials of that kind were skipped.",
            r.timeout_s
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_nearest_rank() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&v, 0.5), Some(50.0));
        assert_eq!(percentile(&v, 0.99), Some(99.0));
        assert_eq!(percentile(&v[..1], 0.99), Some(1.0));
        assert_eq!(percentile(&[], 0.5), None);
    }

    #[test]
    fn ms_format() {
        assert_eq!(fmt_ms(Some(0.085)), "85 us");
        assert_eq!(fmt_ms(Some(12.34)), "12.3 ms");
        assert_eq!(fmt_ms(Some(1020.0)), "1.02 s");
    }
}
