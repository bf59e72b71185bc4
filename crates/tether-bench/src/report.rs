//! The result of a bench run and its three renderings: the text table, JSON (the structs
//! below, serialized as they are) and an SVG bar chart.

use std::fmt::Write as _;

use serde::Serialize;

use crate::sys::Machine;
use crate::workloads::Sizes;

#[derive(Serialize)]
pub struct Report {
    pub tool: &'static str,
    pub date_unix: u64,
    pub machine: Machine,
    pub quick: bool,
    pub runs: u32,
    pub sizes: Sizes,
    /// False when the cold workloads could not drop the caches (not root).
    pub caches_dropped: bool,
    pub notes: Vec<String>,
    /// The label ratios are relative to (the first --vs directory), if any.
    pub baseline: Option<String>,
    pub dirs: Vec<DirInfo>,
    pub workloads: Vec<WorkloadResult>,
    pub failures: Vec<Failure>,
}

#[derive(Serialize)]
pub struct DirInfo {
    pub label: String,
    pub path: String,
    pub fs_type: String,
    pub fs_source: String,
}

#[derive(Serialize)]
pub struct WorkloadResult {
    pub name: String,
    pub description: String,
    pub results: Vec<Cell>,
}

#[derive(Serialize)]
pub struct Cell {
    pub dir: String,
    /// Timed seconds of every successful run, in run order.
    pub seconds: Vec<f64>,
    pub median: Option<f64>,
    /// median / the baseline's median.
    pub ratio: Option<f64>,
    /// Runs that failed.
    pub failed: u32,
}

#[derive(Serialize)]
pub struct Failure {
    pub workload: String,
    pub dir: String,
    pub run: u32,
    pub error: String,
    /// Not attempted because the directory had become unusable.
    pub skipped: bool,
}

/// Three significant digits: 12.3, 1.23, 0.123, 0.00123.
pub fn fmt_secs(s: f64) -> String {
    if s <= 0.0 || !s.is_finite() {
        return format!("{s}");
    }
    let decimals = (2 - s.log10().floor() as i32).clamp(0, 9) as usize;
    format!("{s:.decimals$}")
}

pub fn fmt_ratio(r: f64) -> String {
    if r >= 99.5 {
        format!("{r:.0}x")
    } else if r >= 9.95 {
        format!("{r:.1}x")
    } else {
        format!("{r:.2}x")
    }
}

fn cell_text(c: &Cell, f: impl Fn(&Cell) -> Option<String>) -> String {
    match f(c) {
        Some(s) if c.failed > 0 => format!("{s}*"),
        Some(s) => s,
        None if c.failed > 0 => "failed".into(),
        None => "-".into(),
    }
}

pub fn table(r: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "tether bench: median of {} run{} ({} sizes), seconds{}",
        r.runs,
        if r.runs == 1 { "" } else { "s" },
        if r.quick { "quick" } else { "full" },
        r.baseline
            .as_ref()
            .map(|b| format!(", and ratios to {b} (lower is better)"))
            .unwrap_or_default()
    );
    let lw = r.dirs.iter().map(|d| d.label.len()).max().unwrap_or(0);
    for d in &r.dirs {
        let _ = writeln!(
            out,
            "  {:lw$}  {}{}",
            d.label,
            d.path,
            if d.fs_type.is_empty() {
                String::new()
            } else {
                format!("  ({} {})", d.fs_type, d.fs_source)
            }
        );
    }
    for n in &r.notes {
        let _ = writeln!(out, "note: {n}");
    }
    out.push('\n');

    let ratio_dirs: Vec<&DirInfo> = r
        .dirs
        .iter()
        .filter(|d| r.baseline.as_ref() != Some(&d.label))
        .collect();
    let mut rows: Vec<Vec<String>> = Vec::new();
    let mut header = vec!["workload".to_string()];
    header.extend(r.dirs.iter().map(|d| d.label.clone()));
    if let Some(b) = &r.baseline {
        header.extend(ratio_dirs.iter().map(|d| format!("{}/{b}", d.label)));
    }
    rows.push(header);
    for w in &r.workloads {
        let mut row = vec![w.name.clone()];
        row.extend(
            w.results
                .iter()
                .map(|c| cell_text(c, |c| c.median.map(fmt_secs))),
        );
        if r.baseline.is_some() {
            for d in &ratio_dirs {
                let c = w.results.iter().find(|c| c.dir == d.label).expect("cell");
                row.push(cell_text(c, |c| c.ratio.map(fmt_ratio)));
            }
        }
        rows.push(row);
    }
    let cols = rows[0].len();
    let widths: Vec<usize> = (0..cols)
        .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0))
        .collect();
    let first_ratio = 1 + r.dirs.len();
    for row in &rows {
        let mut line = format!("{:w$}", row[0], w = widths[0]);
        for (i, cell) in row.iter().enumerate().skip(1) {
            line.push_str(if i == first_ratio { "   " } else { "  " });
            let _ = write!(line, "{:>w$}", cell, w = widths[i]);
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
    out.push('\n');
    let nw = r.workloads.iter().map(|w| w.name.len()).max().unwrap_or(0);
    for w in &r.workloads {
        let _ = writeln!(out, "  {:nw$}  {}", w.name, w.description);
    }
    if !r.failures.is_empty() {
        out.push_str("\n* some runs failed:\n");
        for f in r.failures.iter().filter(|f| !f.skipped) {
            let _ = writeln!(
                out,
                "  run {} {} in {}: {}",
                f.run, f.workload, f.dir, f.error
            );
        }
        for d in &r.dirs {
            let skipped = r
                .failures
                .iter()
                .filter(|f| f.skipped && f.dir == d.label)
                .count();
            if skipped > 0 {
                let _ = writeln!(
                    out,
                    "  {skipped} later step(s) in {} skipped: the directory could not even be \
                     emptied after the failure",
                    d.label
                );
            }
        }
    }
    out
}

const COLORS: [&str; 8] = [
    "#e15759", "#4e79a7", "#f28e2b", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#9c755f",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A horizontal bar chart on a log scale: with a baseline, each other directory's time
/// relative to it (bars grow right of 1x when slower, left when faster); without one, the
/// median seconds.
pub fn svg(r: &Report) -> String {
    let relative = r.baseline.is_some();
    let series: Vec<(usize, &DirInfo)> = r
        .dirs
        .iter()
        .enumerate()
        .filter(|(_, d)| r.baseline.as_ref() != Some(&d.label))
        .collect();
    let value = |w: &WorkloadResult, label: &str| -> Option<f64> {
        let c = w.results.iter().find(|c| c.dir == label)?;
        if relative { c.ratio } else { c.median }.filter(|v| *v > 0.0 && v.is_finite())
    };
    let mut vals: Vec<f64> = r
        .workloads
        .iter()
        .flat_map(|w| series.iter().filter_map(move |(_, d)| value(w, &d.label)))
        .collect();
    if relative {
        vals.push(1.0);
    }
    let lo_v = vals.iter().copied().fold(f64::INFINITY, f64::min);
    let hi_v = vals.iter().copied().fold(0.0, f64::max);
    let (mut lo, mut hi) = if vals.is_empty() {
        (0.1, 10.0)
    } else {
        (
            10f64.powf(lo_v.log10().floor()),
            10f64.powf(hi_v.log10().ceil()),
        )
    };
    if hi <= lo {
        hi = lo * 10.0;
    }
    if relative && lo >= 1.0 {
        lo = 0.1;
    }
    let (left, plot_w, right) = (130.0, 620.0, 70.0);
    let bar_h = 11.0;
    let group_gap = 9.0;
    let top = 78.0;
    let group_h = series.len() as f64 * (bar_h + 1.0) + group_gap;
    let height = top + r.workloads.len() as f64 * group_h + 40.0;
    let width = left + plot_w + right;
    let x = |v: f64| left + (v.log10() - lo.log10()) / (hi.log10() - lo.log10()) * plot_w;

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let title = match &r.baseline {
        Some(b) => format!(
            "tether bench: time relative to {} (log scale; right of 1x = slower)",
            esc(b)
        ),
        None => "tether bench: median seconds (log scale)".to_string(),
    };
    let _ = writeln!(
        s,
        r#"<text x="10" y="18" font-size="14" font-weight="bold">{title}</text>"#
    );
    let _ = writeln!(
        s,
        r##"<text x="10" y="34" fill="#555">median of {} run{}, {} sizes; {} CPUs, {} MiB, Linux {}</text>"##,
        r.runs,
        if r.runs == 1 { "" } else { "s" },
        if r.quick { "quick" } else { "full" },
        r.machine.nproc,
        r.machine.memory_mib,
        esc(&r.machine.kernel)
    );
    let mut lx = 10.0;
    for (i, d) in &series {
        let _ = writeln!(
            s,
            r#"<rect x="{lx}" y="44" width="10" height="10" fill="{}"/><text x="{}" y="53">{}</text>"#,
            COLORS[i % COLORS.len()],
            lx + 14.0,
            esc(&d.label)
        );
        lx += 24.0 + 7.0 * d.label.len() as f64;
    }
    // Grid: every power of ten, plus 2x and 5x when the range is small.
    let plot_bottom = height - 32.0;
    let mut decade = lo;
    while decade <= hi * 1.0001 {
        for m in [1.0, 2.0, 5.0] {
            let v = decade * m;
            if v > hi * 1.0001 || (m != 1.0 && hi / lo > 1e4) {
                continue;
            }
            let gx = x(v);
            let strong = m == 1.0;
            let _ = writeln!(
                s,
                r##"<line x1="{gx:.1}" y1="{}" x2="{gx:.1}" y2="{plot_bottom}" stroke="{}" stroke-width="{}"/>"##,
                top - 6.0,
                if relative && v == 1.0 {
                    "#000"
                } else if strong {
                    "#bbb"
                } else {
                    "#e4e4e4"
                },
                if relative && v == 1.0 { 1.2 } else { 1.0 }
            );
            let label = if relative {
                format!("{}x", trim_num(v))
            } else {
                format!("{}s", trim_num(v))
            };
            let _ = writeln!(
                s,
                r##"<text x="{gx:.1}" y="{}" text-anchor="middle" fill="#555">{label}</text>"##,
                plot_bottom + 14.0
            );
        }
        decade *= 10.0;
    }
    let origin = if relative { x(1.0) } else { left };
    for (wi, w) in r.workloads.iter().enumerate() {
        let gy = top + wi as f64 * group_h;
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#,
            left - 8.0,
            gy + (group_h - group_gap) / 2.0 + 4.0,
            esc(&w.name)
        );
        for (si, (i, d)) in series.iter().enumerate() {
            let y = gy + si as f64 * (bar_h + 1.0);
            let color = COLORS[i % COLORS.len()];
            match value(w, &d.label) {
                Some(v) => {
                    let vx = x(v).clamp(left, left + plot_w);
                    let (bx, bw) = if vx >= origin {
                        (origin, vx - origin)
                    } else {
                        (vx, origin - vx)
                    };
                    let text = if relative {
                        fmt_ratio(v)
                    } else {
                        format!("{}s", fmt_secs(v))
                    };
                    let (tx, anchor) = if vx >= origin {
                        (vx + 3.0, "start")
                    } else {
                        (vx - 3.0, "end")
                    };
                    let _ = writeln!(
                        s,
                        r#"<rect x="{bx:.1}" y="{y:.1}" width="{:.1}" height="{bar_h}" fill="{color}"><title>{} {}: {text}</title></rect><text x="{tx:.1}" y="{:.1}" text-anchor="{anchor}" font-size="9">{text}</text>"#,
                        bw.max(1.0),
                        esc(&w.name),
                        esc(&d.label),
                        y + bar_h - 2.0
                    );
                }
                None => {
                    let _ = writeln!(
                        s,
                        r##"<text x="{:.1}" y="{:.1}" font-size="9" fill="#a00">{} failed</text>"##,
                        origin + 3.0,
                        y + bar_h - 2.0,
                        esc(&d.label)
                    );
                }
            }
        }
    }
    s.push_str("</svg>\n");
    s
}

fn trim_num(v: f64) -> String {
    let s = format!("{v:.4}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys;

    fn sample(baseline: bool) -> Report {
        let cell = |dir: &str, m: f64, ratio: Option<f64>| Cell {
            dir: dir.into(),
            seconds: vec![m],
            median: Some(m),
            ratio,
            failed: 0,
        };
        Report {
            tool: "tether bench",
            date_unix: 0,
            machine: sys::machine(),
            quick: true,
            runs: 1,
            sizes: Sizes::quick(),
            caches_dropped: true,
            notes: vec![],
            baseline: baseline.then(|| "native".into()),
            dirs: ["tether", "native"]
                .iter()
                .map(|l| DirInfo {
                    label: l.to_string(),
                    path: format!("/x/{l}"),
                    fs_type: "ext4".into(),
                    fs_source: String::new(),
                })
                .collect(),
            workloads: vec![WorkloadResult {
                name: "stat_warm".into(),
                description: "stat".into(),
                results: vec![
                    cell("tether", 0.5, baseline.then_some(50.0)),
                    cell("native", 0.01, baseline.then_some(1.0)),
                ],
            }],
            failures: vec![],
        }
    }

    #[test]
    fn numbers_format() {
        assert_eq!(fmt_secs(12.345), "12.3");
        assert_eq!(fmt_secs(1.2345), "1.23");
        assert_eq!(fmt_secs(0.012345), "0.0123");
        assert_eq!(fmt_ratio(1.0), "1.00x");
        assert_eq!(fmt_ratio(12.34), "12.3x");
        assert_eq!(fmt_ratio(123.4), "123x");
    }

    #[test]
    fn table_has_seconds_and_ratios() {
        let t = table(&sample(true));
        assert!(t.contains("tether/native"), "{t}");
        let row = t.lines().find(|l| l.starts_with("stat_warm")).unwrap();
        assert!(row.contains("0.500") && row.contains("0.0100") && row.contains("50.0x"));
    }

    #[test]
    fn svg_is_well_formed_enough() {
        for b in [true, false] {
            let s = svg(&sample(b));
            assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
            assert_eq!(s.matches("<text").count(), s.matches("</text>").count());
            // One bar (with a tooltip) per directory other than the baseline.
            assert_eq!(s.matches("<title>").count(), if b { 1 } else { 2 });
            assert!(s.contains("stat_warm"));
        }
    }
}
