//! Behaviour of `tether bench` and `tether latency` on native directories: output, JSON,
//! refusals and cleanup. Never asserts on speed.

use std::path::Path;
use std::process::{Command, Output};

const TETHER: &str = env!("CARGO_BIN_EXE_tether");

/// Cheap workloads that need neither root (no cache dropping) nor extra tools.
const CHEAP: [&str; 5] = [
    "tree_create",
    "stat_warm",
    "small_write",
    "dd_write_16k",
    "dd_read_16k",
];

fn tether(args: &[&str]) -> Output {
    Command::new(TETHER)
        .args(args)
        .output()
        .expect("run tether")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn leftovers(dir: &Path, prefix: &str) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(prefix))
        .collect()
}

fn bench(a: &Path, b: &Path, extra: &[&str]) -> Output {
    let only = CHEAP.join(",");
    let mut args = vec![
        "bench",
        a.to_str().unwrap(),
        "--vs",
        b.to_str().unwrap(),
        "--quick",
        "--runs",
        "1",
        "--only",
        &only,
    ];
    args.extend_from_slice(extra);
    tether(&args)
}

#[test]
fn bench_prints_table_writes_json_and_cleans_up() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("mine"), tmp.path().join("native"));
    std::fs::create_dir(&a).unwrap();
    std::fs::create_dir(&b).unwrap();
    let json = tmp.path().join("out.json");
    let svg = tmp.path().join("out.svg");
    let out = bench(
        &a,
        &b,
        &[
            "--json",
            json.to_str().unwrap(),
            "--plot",
            svg.to_str().unwrap(),
        ],
    );
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "bench failed: {stdout}\n{}",
        text(&out.stderr)
    );

    // The table: a header naming both directories and the ratio column, one row per
    // workload with two times and a ratio.
    let header = stdout
        .lines()
        .find(|l| l.starts_with("workload"))
        .unwrap_or_else(|| panic!("no table header in:\n{stdout}"));
    assert!(
        header.contains("mine") && header.contains("mine/native"),
        "{header}"
    );
    for w in CHEAP {
        let row = stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(w) && l.ends_with('x'))
            .unwrap_or_else(|| panic!("no row for {w} in:\n{stdout}"));
        assert_eq!(row.split_whitespace().count(), 4, "{row}");
    }
    assert!(
        !stdout.contains("dd_write_1k"),
        "ran a workload not asked for"
    );

    // The JSON.
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["tool"], "tether bench");
    assert_eq!(v["runs"], 1);
    assert_eq!(v["quick"], true);
    assert_eq!(v["baseline"], "native");
    assert_eq!(v["sizes"]["tree_files"], 1000);
    assert!(v["machine"]["nproc"].as_u64().unwrap() >= 1);
    let dirs = v["dirs"].as_array().unwrap();
    assert_eq!(dirs.len(), 2);
    assert_eq!(dirs[0]["label"], "mine");
    assert_eq!(dirs[0]["path"], a.to_str().unwrap());
    let workloads = v["workloads"].as_array().unwrap();
    let names: Vec<&str> = workloads
        .iter()
        .map(|w| w["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, CHEAP);
    for w in workloads {
        assert!(!w["description"].as_str().unwrap().is_empty());
        let cells = w["results"].as_array().unwrap();
        assert_eq!(cells.len(), 2);
        for c in cells {
            assert_eq!(c["seconds"].as_array().unwrap().len(), 1, "{c}");
            assert!(c["median"].as_f64().unwrap() > 0.0, "{c}");
            assert!(c["ratio"].as_f64().unwrap() > 0.0, "{c}");
            assert_eq!(c["failed"], 0);
        }
        assert_eq!(cells[1]["ratio"].as_f64().unwrap(), 1.0);
    }
    assert_eq!(v["failures"].as_array().unwrap().len(), 0);
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("tree_create"));

    for d in [&a, &b] {
        assert_eq!(leftovers(d, ".tether-bench-"), Vec::<String>::new());
        assert_eq!(std::fs::read_dir(d).unwrap().count(), 0);
    }
}

#[test]
fn bench_refuses_a_nonempty_directory_unless_allowed() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    std::fs::create_dir(&a).unwrap();
    std::fs::create_dir(&b).unwrap();
    std::fs::write(b.join("precious.txt"), "keep me").unwrap();

    let out = bench(&a, &b, &[]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("non-empty") && stderr.contains("--allow-nonempty"),
        "{stderr}"
    );
    assert!(stderr.contains(b.to_str().unwrap()), "{stderr}");
    assert_eq!(leftovers(&a, ".tether-bench-"), Vec::<String>::new());

    let out = bench(&a, &b, &["--allow-nonempty"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        std::fs::read_to_string(b.join("precious.txt")).unwrap(),
        "keep me"
    );
    assert_eq!(leftovers(&b, ".tether-bench-"), Vec::<String>::new());
    assert_eq!(std::fs::read_dir(&b).unwrap().count(), 1);
}

#[test]
fn bench_rejects_unknown_workloads() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tether(&[
        "bench",
        tmp.path().to_str().unwrap(),
        "--only",
        "tree_create,warp_drive",
    ]);
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("warp_drive") && stderr.contains("git_status"),
        "{stderr}"
    );
}

#[test]
fn latency_of_a_directory_against_itself() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("d");
    std::fs::create_dir(&d).unwrap();
    let json = tmp.path().join("lat.json");
    let ds = d.to_str().unwrap();
    let out = tether(&[
        "latency",
        "--host",
        ds,
        "--mount",
        ds,
        "--trials",
        "20",
        "--json",
        json.to_str().unwrap(),
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    let kinds = [
        "rewrite", "append", "truncate", "chmod", "utimes", "create", "delete", "rename", "mkdir",
        "rmdir",
    ];
    for k in kinds {
        let row = stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(k))
            .unwrap_or_else(|| panic!("no row for {k} in:\n{stdout}"));
        // Two trials of each kind, both visible at once.
        assert!(row.trim_end().ends_with(" 0"), "{row}");
    }
    assert!(stdout.lines().any(|l| l.starts_with("all ")), "{stdout}");

    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["tool"], "tether latency");
    assert_eq!(v["trials"], 20);
    let ks = v["kinds"].as_array().unwrap();
    assert_eq!(ks.len(), kinds.len());
    for (k, name) in ks.iter().zip(kinds) {
        assert_eq!(k["kind"], name);
        assert_eq!(k["visible"], 2, "{k}");
        assert_eq!(k["not_visible"], 0, "{k}");
        assert_eq!(k["stopped"], false, "{k}");
        assert!(k["p50_ms"].as_f64().unwrap() <= k["max_ms"].as_f64().unwrap());
    }
    assert_eq!(v["overall"]["visible"], 20);
    assert_eq!(v["overall"]["not_visible"], 0);
    assert_eq!(leftovers(&d, ".tether-latency-"), Vec::<String>::new());
    assert_eq!(std::fs::read_dir(&d).unwrap().count(), 0);
}
