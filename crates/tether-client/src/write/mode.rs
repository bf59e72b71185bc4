//! How a mount sends what the guest writes: one choice (`tether mount --writes MODE`), and
//! this one place that says what each mode turns on.

use std::fmt;
use std::str::FromStr;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WriteMode {
    /// Every `write()` reaches the host before it returns, and an error comes back from
    /// the write that caused it: a server round trip per `write()`, and `close()` costs
    /// nothing (FLUSH is refused once, and the kernel stops sending it). The default.
    #[default]
    Through,
    /// A small `write()` is answered once its WRITE is on its way (write/behind.rs): the
    /// guest sees it at once, a host process may see it a moment after `write()` returned
    /// but has it when `close()` or `fsync()` returns, and an error reaches the next
    /// `write()`, `close()` or `fsync()` of the file.
    Behind,
    /// `Behind`, and a file creation is answered with a file the server made ahead
    /// (write/spares.rs), named on the host before `close()` returns. A creation still on
    /// its way when the connection is lost is made again by the reconnect.
    CreateBehind,
    /// The guest kernel caches writes and sends them at close, fsync, unlock or within
    /// about 20 ms (invalidate/fixer.rs); needs pushed invalidations, else writes go through.
    Writeback,
}

impl WriteMode {
    pub const ALL: [WriteMode; 4] = [
        WriteMode::Through,
        WriteMode::Behind,
        WriteMode::CreateBehind,
        WriteMode::Writeback,
    ];

    /// Small written-through writes are answered before the server's reply.
    pub fn writes_behind(self) -> bool {
        matches!(self, WriteMode::Behind | WriteMode::CreateBehind)
    }

    /// File creations are answered with spare files.
    pub fn creates_behind(self) -> bool {
        self == WriteMode::CreateBehind
    }

    /// The kernel's writeback cache is asked for at FUSE init.
    pub fn asks_writeback_cache(self) -> bool {
        self == WriteMode::Writeback
    }

    /// The name `--writes` takes.
    pub fn name(self) -> &'static str {
        match self {
            WriteMode::Through => "through",
            WriteMode::Behind => "behind",
            WriteMode::CreateBehind => "create-behind",
            WriteMode::Writeback => "writeback",
        }
    }
}

impl fmt::Display for WriteMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for WriteMode {
    type Err = String;

    fn from_str(s: &str) -> Result<WriteMode, String> {
        WriteMode::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = WriteMode::ALL.iter().map(|m| m.name()).collect();
                format!("unknown write mode {s:?}: one of {}", names.join(", "))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_modes_turn_on_what_they_say() {
        for m in WriteMode::ALL {
            assert_eq!(m.name().parse::<WriteMode>().unwrap(), m);
        }
        assert!("write-behind".parse::<WriteMode>().is_err());
        assert!(!WriteMode::Through.writes_behind());
        assert!(WriteMode::Behind.writes_behind() && !WriteMode::Behind.creates_behind());
        assert!(
            WriteMode::CreateBehind.writes_behind() && WriteMode::CreateBehind.creates_behind()
        );
        assert!(
            WriteMode::Writeback.asks_writeback_cache() && !WriteMode::Writeback.writes_behind()
        );
    }
}
