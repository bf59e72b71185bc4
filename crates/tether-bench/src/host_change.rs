//! The kinds of change a host makes to files a guest has cached, by name: what `tether
//! latency` times and what the VM tests make in a guest's sight (crates/tether/tests/vm.rs).

/// One kind of host change.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum HostChange {
    Rewrite,
    Append,
    Truncate,
    Chmod,
    Utimes,
    Create,
    Delete,
    Rename,
    Mkdir,
    Rmdir,
}

impl HostChange {
    pub const ALL: [HostChange; 10] = [
        HostChange::Rewrite,
        HostChange::Append,
        HostChange::Truncate,
        HostChange::Chmod,
        HostChange::Utimes,
        HostChange::Create,
        HostChange::Delete,
        HostChange::Rename,
        HostChange::Mkdir,
        HostChange::Rmdir,
    ];

    pub fn name(self) -> &'static str {
        match self {
            HostChange::Rewrite => "rewrite",
            HostChange::Append => "append",
            HostChange::Truncate => "truncate",
            HostChange::Chmod => "chmod",
            HostChange::Utimes => "utimes",
            HostChange::Create => "create",
            HostChange::Delete => "delete",
            HostChange::Rename => "rename",
            HostChange::Mkdir => "mkdir",
            HostChange::Rmdir => "rmdir",
        }
    }

    /// The kind called `name` ([`HostChange::name`]).
    pub fn from_name(name: &str) -> Option<HostChange> {
        HostChange::ALL.into_iter().find(|c| c.name() == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_is_found_by_its_own_name_only() {
        for kind in HostChange::ALL {
            assert_eq!(HostChange::from_name(kind.name()), Some(kind));
        }
        assert_eq!(HostChange::from_name("chown"), None);
    }
}
