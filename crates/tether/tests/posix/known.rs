//! The POSIX suite's differences through Tether that are known and accepted, and the check
//! that a comparison shows no others. Shared by posix_mount.rs (a mount on this machine) and
//! vm.rs (the suite run in a QEMU guest on its mount of a host export).

/// Cases whose outcome legitimately differs through Tether today, each with its reason.
/// Keep this list short and honest; a case here still runs and must not panic.
pub const KNOWN_DIFFERENCES: &[(&str, &str)] = &[
    (
        "mknod_chardev",
        "the server refuses to create device nodes: a guest must not be able to plant a \
         device file on the host (the mount is nodev as well)",
    ),
    (
        "o_tmpfile",
        "fuser 0.18 has no FUSE_TMPFILE operation, so the kernel answers EOPNOTSUPP, as on \
         NFS; programs fall back to named temporary files",
    ),
];

/// Checks the differences `diffs` (from `posix::diff`, native first) against `known`: every
/// case listed must still differ (else the list is stale), and nothing else may. The error
/// says what is wrong.
pub fn check(diffs: &[String], known: &[(&str, &str)]) -> Result<(), String> {
    for (case, why) in known {
        if !diffs.iter().any(|d| d.starts_with(&format!("{case}["))) {
            return Err(format!(
                "{case} is listed as a known difference ({why}) but now matches: remove it"
            ));
        }
    }
    let unknown: Vec<&String> = diffs
        .iter()
        .filter(|d| {
            !known.iter().any(|(case, _)| {
                d.starts_with(&format!("{case}[")) || d.starts_with(&format!("{case}:"))
            })
        })
        .collect();
    if unknown.is_empty() {
        return Ok(());
    }
    Err(format!(
        "{} differences between native and Tether:\n{}",
        unknown.len(),
        unknown
            .iter()
            .map(|d| d.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    ))
}
