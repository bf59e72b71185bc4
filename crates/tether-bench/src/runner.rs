//! Runs the workloads: checks the directories and tools, creates the working
//! subdirectories, interleaves runs (for each run, for each workload, every directory in
//! turn) so drift hits every directory alike, and always removes what it created.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};

use crate::report::{self, Cell, DirInfo, Failure, Report, WorkloadResult};
use crate::sys::{self, Interrupt};
use crate::workloads::{self, Ctx, Data, Site, Sizes, Workload};
use crate::BenchArgs;

pub fn run(args: BenchArgs) -> Result<()> {
    let sizes = if args.quick {
        Sizes::quick()
    } else {
        Sizes::full()
    };
    let selected = select(&args.only)?;
    check_tools(&selected)?;
    let dirs: Vec<PathBuf> = std::iter::once(args.dir.clone())
        .chain(args.vs.iter().cloned())
        .collect();
    check_dirs(&dirs, args.allow_nonempty)?;
    let labels = labels(&dirs);

    let intr = Interrupt::install()?;
    let mut notes = Vec::new();
    let mut can_drop_caches = false;
    if selected.iter().any(Workload::is_cold) {
        match sys::drop_caches() {
            Ok(()) => can_drop_caches = true,
            Err(e) => notes.push(format!(
                "caches could not be dropped ({e}; needs root): the *_cold workloads ran with \
                 warm caches"
            )),
        }
    }
    let data = Data::generate(sizes);
    let pid = std::process::id();
    let copy_base = if Path::new("/var/tmp").is_dir() {
        PathBuf::from("/var/tmp")
    } else {
        std::env::temp_dir()
    };
    let copy_dest = copy_base.join(format!(".tether-bench-copy-{pid}"));

    let mut sites = Vec::new();
    for (i, (dir, label)) in dirs.iter().zip(&labels).enumerate() {
        let root = dir.join(format!(".tether-bench-{pid}-{i}"));
        if let Err(e) = std::fs::create_dir(&root) {
            cleanup(&sites, &copy_dest);
            return Err(e).with_context(|| format!("cannot create {}", root.display()));
        }
        sites.push(Site::new(label.clone(), root, &data));
    }
    let ctx = Ctx {
        data: &data,
        intr: &intr,
        can_drop_caches,
        copy_dest: &copy_dest,
    };
    let outcome = run_steps(&args, &selected, &mut sites, &ctx);
    let removed = cleanup(&sites, &copy_dest);
    let (seconds, failures) = match outcome {
        Ok(r) => r,
        Err(e) if sys::is_interrupted(&e) => {
            bail!(
                "interrupted; removed the working directories{}",
                if removed {
                    ""
                } else {
                    " (some could not be removed, see above)"
                }
            )
        }
        Err(e) => return Err(e),
    };
    if intr.fired() {
        bail!("interrupted; removed the working directories");
    }

    let baseline = (dirs.len() > 1).then_some(1);
    let workloads = selected
        .iter()
        .enumerate()
        .map(|(wi, w)| {
            let base = baseline.and_then(|b| median(&seconds[wi][b]));
            WorkloadResult {
                name: w.name.clone(),
                description: w.describe(&sizes),
                results: labels
                    .iter()
                    .enumerate()
                    .map(|(di, label)| {
                        let med = median(&seconds[wi][di]);
                        Cell {
                            dir: label.clone(),
                            seconds: seconds[wi][di].clone(),
                            median: med,
                            ratio: match (med, base) {
                                (Some(m), Some(b)) if b > 0.0 => Some(m / b),
                                _ => None,
                            },
                            failed: failures
                                .iter()
                                .filter(|f| f.workload == w.name && f.dir == *label)
                                .count() as u32,
                        }
                    })
                    .collect(),
            }
        })
        .collect();
    let report = Report {
        tool: "tether bench",
        date_unix: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        machine: sys::machine(),
        quick: args.quick,
        runs: args.runs,
        sizes,
        caches_dropped: can_drop_caches,
        notes,
        baseline: baseline.map(|b| labels[b].clone()),
        dirs: dirs
            .iter()
            .zip(&labels)
            .map(|(d, l)| {
                let (fs_type, fs_source) = sys::fs_of(d).unwrap_or_default();
                DirInfo {
                    label: l.clone(),
                    path: d.display().to_string(),
                    fs_type,
                    fs_source,
                }
            })
            .collect(),
        workloads,
        failures,
    };
    crate::print_out(&report::table(&report))?;
    if let Some(p) = &args.json {
        let json = serde_json::to_string_pretty(&report)?;
        std::fs::write(p, json + "\n").with_context(|| format!("cannot write {}", p.display()))?;
    }
    if let Some(p) = &args.plot {
        std::fs::write(p, report::svg(&report))
            .with_context(|| format!("cannot write {}", p.display()))?;
    }
    if !report.failures.is_empty() {
        let skipped = report.failures.iter().filter(|f| f.skipped).count();
        bail!(
            "{} step(s) failed{}; their cells are marked in the table",
            report.failures.len() - skipped,
            if skipped > 0 {
                format!(" and {skipped} were skipped")
            } else {
                String::new()
            }
        );
    }
    Ok(())
}

type Seconds = Vec<Vec<Vec<f64>>>;

/// Empties `site` (`run`: into a new run's subdirectory); if even that fails, marks it
/// `broken` (with why) for the rest of the bench.
fn wipe_or_give_up(
    site: &mut Site,
    run: Option<u32>,
    broken: &mut Option<String>,
    say: &impl Fn(String),
) {
    let wiped = match run {
        Some(run) => site.start_run(run),
        None => site.wipe(),
    };
    if let Err(e) = wiped {
        let why = format!("{e:#}");
        say(format!(
            "{}: giving up on this directory: {why}",
            site.label
        ));
        *broken = Some(why);
    }
}

fn run_steps(
    args: &BenchArgs,
    selected: &[Workload],
    sites: &mut [Site],
    ctx: &Ctx,
) -> Result<(Seconds, Vec<Failure>)> {
    let mut seconds: Seconds = vec![vec![Vec::new(); sites.len()]; selected.len()];
    let mut failures = Vec::new();
    let total = u64::from(args.runs) * (selected.len() * sites.len()) as u64;
    let (bars, pb) = crate::progress(total);
    let say = |s: String| {
        if bars {
            pb.println(s);
        } else {
            eprintln!("{s}");
        }
    };
    let width = selected.iter().map(|w| w.name.len()).max().unwrap_or(0);
    let lwidth = sites.iter().map(|s| s.label.len()).max().unwrap_or(0);
    // A directory that cannot even be emptied after a failure (say, the mount stopped
    // working) is left alone for the rest of the bench; the others carry on.
    let mut broken: Vec<Option<String>> = vec![None; sites.len()];
    for run in 1..=args.runs {
        for (di, site) in sites.iter_mut().enumerate() {
            ctx.intr.check()?;
            if broken[di].is_none() {
                wipe_or_give_up(site, Some(run), &mut broken[di], &say);
            }
        }
        for (wi, w) in selected.iter().enumerate() {
            for (di, site) in sites.iter_mut().enumerate() {
                ctx.intr.check()?;
                pb.inc(1);
                if broken[di].is_some() {
                    failures.push(Failure {
                        workload: w.name.clone(),
                        dir: site.label.clone(),
                        run,
                        error: "skipped: the directory is unusable".into(),
                        skipped: true,
                    });
                    continue;
                }
                pb.set_message(format!(
                    "run {run}/{}: {} in {}",
                    args.runs, w.name, site.label
                ));
                match site.step(w, ctx) {
                    Ok(s) => {
                        if !bars {
                            say(format!(
                                "run {run}/{} {:width$} {:lwidth$} {}",
                                args.runs,
                                w.name,
                                site.label,
                                report::fmt_secs(s)
                            ));
                        }
                        seconds[wi][di].push(s);
                    }
                    Err(e) if sys::is_interrupted(&e) => return Err(e),
                    Err(e) => {
                        say(format!(
                            "run {run}/{}: {} failed in {}: {e:#}",
                            args.runs, w.name, site.label
                        ));
                        failures.push(Failure {
                            workload: w.name.clone(),
                            dir: site.label.clone(),
                            run,
                            error: format!("{e:#}"),
                            skipped: false,
                        });
                        // Start the directory afresh so later steps do not trip over a
                        // half-made setup.
                        wipe_or_give_up(site, None, &mut broken[di], &say);
                    }
                }
            }
        }
    }
    pb.finish_and_clear();
    Ok((seconds, failures))
}

/// Removes every working directory and the copy destination; false if something stayed.
fn cleanup(sites: &[Site], copy_dest: &Path) -> bool {
    let mut ok = true;
    for p in sites.iter().map(|s| s.root.as_path()).chain([copy_dest]) {
        if p.exists() {
            if let Err(e) = std::fs::remove_dir_all(p) {
                eprintln!("tether: cannot remove {}: {e}", p.display());
                ok = false;
            }
        }
    }
    ok
}

fn select(only: &[String]) -> Result<Vec<Workload>> {
    let all = workloads::all();
    if only.is_empty() {
        return Ok(all);
    }
    let unknown: Vec<&String> = only
        .iter()
        .filter(|o| !all.iter().any(|w| &w.name == *o))
        .collect();
    if !unknown.is_empty() {
        bail!(
            "unknown workload(s) {}; the workloads are: {}",
            unknown
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            all.iter()
                .map(|w| w.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(all.into_iter().filter(|w| only.contains(&w.name)).collect())
}

fn check_tools(selected: &[Workload]) -> Result<()> {
    let mut missing: Vec<String> = Vec::new();
    for w in selected {
        for (prog, pkg) in w.tools() {
            if sys::which(prog).is_none() {
                let m = format!("`{prog}` (package {pkg}, needed by {})", w.name);
                if !missing.iter().any(|x| x.starts_with(&format!("`{prog}`"))) {
                    missing.push(m);
                }
            }
        }
    }
    if !missing.is_empty() {
        let mut pkgs: Vec<&str> = selected
            .iter()
            .flat_map(|w| w.tools())
            .filter(|(p, _)| sys::which(p).is_none())
            .map(|(_, pkg)| *pkg)
            .collect();
        pkgs.sort();
        pkgs.dedup();
        bail!(
            "missing tools: {}; install with `apt-get install {}` or leave those workloads \
             out with --only",
            missing.join(", "),
            pkgs.join(" ")
        );
    }
    Ok(())
}

fn check_dirs(dirs: &[PathBuf], allow_nonempty: bool) -> Result<()> {
    let mut nonempty = Vec::new();
    for d in dirs {
        let meta = std::fs::metadata(d).with_context(|| format!("cannot use {}", d.display()))?;
        if !meta.is_dir() {
            bail!("{} is not a directory", d.display());
        }
        let mut entries = std::fs::read_dir(d)
            .with_context(|| format!("cannot list {}", d.display()))?
            .filter_map(|e| e.ok());
        if let Some(first) = entries.next() {
            nonempty.push(format!(
                "{} (contains {}{})",
                d.display(),
                first.file_name().to_string_lossy(),
                if entries.next().is_some() {
                    " and more"
                } else {
                    ""
                }
            ));
        }
    }
    if !nonempty.is_empty() && !allow_nonempty {
        bail!(
            "refusing to run in a non-empty directory: {}. The bench works in its own \
             .tether-bench-* subdirectory and removes it afterwards, but heavy I/O next to \
             your files is probably a mistaken path; pass --allow-nonempty if it is not",
            nonempty.join(", ")
        );
    }
    Ok(())
}

/// Short names for the table: each directory's last path component, made unique.
fn labels(dirs: &[PathBuf]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for (i, d) in dirs.iter().enumerate() {
        let base = std::fs::canonicalize(d)
            .unwrap_or_else(|_| d.clone())
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| format!("dir{}", i + 1));
        let mut label = base.clone();
        let mut n = 2;
        while out.contains(&label) {
            label = format!("{base}#{n}");
            n += 1;
        }
        out.push(label);
    }
    out
}

pub fn median(v: &[f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let m = s.len() / 2;
    Some(if s.len() % 2 == 1 {
        s[m]
    } else {
        (s[m - 1] + s[m]) / 2.0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
    }

    #[test]
    fn labels_are_unique() {
        let l = labels(&[
            PathBuf::from("/nonexistent/a/native"),
            PathBuf::from("/nonexistent/b/native"),
            PathBuf::from("/"),
        ]);
        assert_eq!(l, ["native", "native#2", "dir3"]);
    }

    #[test]
    fn only_selects_in_canonical_order_and_rejects_unknown() {
        let s = select(&["read_warm".into(), "tree_create".into()]).unwrap();
        let names: Vec<&str> = s.iter().map(|w| w.name.as_str()).collect();
        assert_eq!(names, ["tree_create", "read_warm"]);
        let e = select(&["nope".into()]).unwrap_err().to_string();
        assert!(e.contains("nope") && e.contains("dd_read_4k"), "{e}");
    }
}
