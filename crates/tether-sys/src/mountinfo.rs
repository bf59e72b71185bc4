//! The mount table as `/proc/self/mountinfo` gives it: which file system is mounted where.
//! Read as text, never by touching the mounts themselves, so a hung FUSE mount cannot hang
//! the reader.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The file system type of a Tether mount (FUSE with subtype `tether`).
pub const TETHER_FSTYPE: &str = "fuse.tether";

/// One line of the mount table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// `MAJOR:MINOR` of the mounted file system.
    pub device: String,
    pub mount_point: PathBuf,
    /// `ext4`, `tmpfs`, `fuse.tether`, ...
    pub fstype: String,
    /// What was mounted: for Tether, `tether:ADDRESS`.
    pub source: String,
}

impl MountEntry {
    /// A Tether mount: `fuse.tether`, or plain `fuse` with a `tether:` source (mounted by
    /// a build whose FUSE library dropped the subtype).
    pub fn is_tether(&self) -> bool {
        self.fstype == TETHER_FSTYPE
            || (self.fstype == "fuse" && self.source.starts_with("tether:"))
    }
}

/// The mounts of this process's mount namespace, in mount order (a later line for the same
/// mount point is the mount on top).
pub fn mounts() -> io::Result<Vec<MountEntry>> {
    Ok(parse(&std::fs::read_to_string("/proc/self/mountinfo")?))
}

/// The mount on top at `path` (compared as given: pass a path without symlinks), if `path`
/// is a mount point.
pub fn mount_at(path: &Path) -> io::Result<Option<MountEntry>> {
    Ok(mounts()?.into_iter().rev().find(|m| m.mount_point == path))
}

/// The mount with device `major:minor`, if any.
pub fn mount_of_device(major: u32, minor: u32) -> io::Result<Option<MountEntry>> {
    let want = format!("{major}:{minor}");
    Ok(mounts()?.into_iter().find(|m| m.device == want))
}

/// Parses mountinfo text; malformed lines are skipped.
pub fn parse(text: &str) -> Vec<MountEntry> {
    text.lines().filter_map(parse_line).collect()
}

/// "ID PARENT MAJOR:MINOR ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER"
fn parse_line(line: &str) -> Option<MountEntry> {
    let (left, right) = line.split_once(" - ")?;
    let mut l = left.split(' ');
    let device = l.nth(2)?.to_string();
    let mount_point = l.nth(1)?;
    let mut r = right.split(' ');
    let fstype = r.next()?.to_string();
    let source = r.next()?;
    Some(MountEntry {
        device,
        mount_point: PathBuf::from(OsStr::from_bytes(&unescape(mount_point))),
        fstype,
        source: String::from_utf8_lossy(&unescape(source)).into_owned(),
    })
}

/// Undoes mountinfo's octal escapes (`\040` for a space, and so on).
pub fn unescape(field: &str) -> Vec<u8> {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b.get(i + 1..i + 4).and_then(|d| {
            let s = std::str::from_utf8(d).ok()?;
            u8::from_str_radix(s, 8).ok()
        });
        match octal {
            Some(c) if b[i] == b'\\' => {
                out.push(c);
                i += 4;
            }
            _ => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    out
}

/// `path` made absolute and free of symlinks in every component but the last, which is
/// not touched: for a mount point, whose own status would be a request to the file system
/// mounted there (a hung or dead FUSE mount answers none).
pub fn canonical_without_last(path: &Path) -> io::Result<PathBuf> {
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()?.join(path)
    };
    let (Some(parent), Some(name)) = (abs.parent(), abs.file_name()) else {
        return Ok(abs); // "/"
    };
    if name == ".." || name == "." {
        return std::fs::canonicalize(&abs);
    }
    Ok(std::fs::canonicalize(parent)?.join(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape(r"/tmp/a\040b"), b"/tmp/a b");
        assert_eq!(unescape(r"/x\134y"), b"/x\\y");
        assert_eq!(unescape(r"/plain"), b"/plain");
        assert_eq!(unescape(r"/odd\9"), b"/odd\\9");
    }

    #[test]
    fn lines_are_parsed_with_optional_fields() {
        let text = "\
36 35 98:0 / /mnt1 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
90 24 0:52 / /tmp/my\\040mnt rw,nosuid,nodev,relatime shared:5 shared:7 - fuse.tether tether:unix:/run/t.sock rw,user_id=0
bad line
";
        let m = parse(text);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].device, "98:0");
        assert_eq!(m[0].mount_point, Path::new("/mnt1"));
        assert_eq!(m[0].fstype, "ext3");
        assert!(!m[0].is_tether());
        assert_eq!(m[1].mount_point, Path::new("/tmp/my mnt"));
        assert_eq!(m[1].source, "tether:unix:/run/t.sock");
        assert!(m[1].is_tether());
    }

    #[test]
    fn the_last_component_is_not_resolved() {
        let d = std::env::temp_dir().canonicalize().unwrap();
        assert_eq!(
            canonical_without_last(&d.join("no-such-entry")).unwrap(),
            d.join("no-such-entry")
        );
    }
}
