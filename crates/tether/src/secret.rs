//! The shared secret that TCP peers prove they know: a file only its owner can read.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// Fewest bytes a secret file may hold: a guessable secret would make the proof worthless.
const MIN_SECRET_LEN: usize = 16;

/// Where the secret lives unless --secret-file says otherwise:
/// `$XDG_CONFIG_HOME/tether/secret`, or `~/.config/tether/secret`.
pub fn default_path() -> Result<PathBuf> {
    let config = match std::env::var_os("XDG_CONFIG_HOME").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => match std::env::var_os("HOME").filter(|v| !v.is_empty()) {
            Some(home) => PathBuf::from(home).join(".config"),
            None => bail!("neither XDG_CONFIG_HOME nor HOME is set: pass --secret-file"),
        },
    };
    Ok(config.join("tether").join("secret"))
}

/// Reads the secret at `path`, refusing a file others could read or that is too short.
pub fn load(path: &Path) -> Result<Vec<u8>> {
    let meta = fs::metadata(path)
        .with_context(|| format!("cannot read the secret file {}", path.display()))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        bail!(
            "the secret file {} is readable by others (mode {mode:03o}): run chmod 600 {}",
            path.display(),
            path.display()
        );
    }
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me && me != 0 {
        bail!(
            "the secret file {} belongs to uid {}, not to you (uid {me})",
            path.display(),
            meta.uid()
        );
    }
    let raw = fs::read(path)
        .with_context(|| format!("cannot read the secret file {}", path.display()))?;
    let secret = raw.trim_ascii().to_vec();
    if secret.len() < MIN_SECRET_LEN {
        bail!(
            "the secret file {} holds {} bytes; a secret needs at least {MIN_SECRET_LEN}",
            path.display(),
            secret.len()
        );
    }
    Ok(secret)
}

/// Loads the secret at `path`, first creating it (mode 0600, 32 random bytes as hex) if it
/// does not exist. Returns the secret and whether it was just created.
pub fn load_or_create(path: &Path) -> Result<(Vec<u8>, bool)> {
    if path.exists() {
        return Ok((load(path)?, false));
    }
    if let Some(dir) = path.parent() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let mut bytes = [0u8; 32];
    rand::fill(&mut bytes);
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    // create_new: never truncate a secret another server just wrote.
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot create the secret file {}", path.display()))?;
    writeln!(f, "{hex}")?;
    f.sync_all()?;
    Ok((load(path)?, true))
}
