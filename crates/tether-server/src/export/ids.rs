//! Who owns what: how host uids/gids appear to the guest, which host ids files the guest
//! creates get, and what chown means (docs/security.md, "Ownership").

use std::str::FromStr;

use tether_proto::{Caller, IdMapping, WireErrno};

use crate::backend::SysResult;

/// The id unmapped host ids appear as (the kernel's overflow id).
pub const OVERFLOW_ID: u32 = 65534;

/// The export's ownership policy, chosen with `serve --map-ids`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum IdMap {
    /// Every file appears to belong to the guest user the client names (the owner of its
    /// mount point, by default); files the guest creates belong to the user running serve;
    /// chown can only "change" to that same owner. What NFS calls all_squash.
    #[default]
    Squash,
    /// Host ids shown and used as they are; files are created as the guest caller when the
    /// server runs as root.
    Passthrough,
    /// Explicit (guest, host) pairs; unmapped host ids appear as 65534, unmapped guest ids
    /// cannot create files or be given by chown.
    Mapped {
        uids: Vec<(u32, u32)>,
        gids: Vec<(u32, u32)>,
    },
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "bad --map-ids {0:?}: use squash, passthrough, or a comma-separated list of \
     uid:GUEST:HOST and gid:GUEST:HOST (for example uid:1000:501,gid:1000:20)"
)]
pub struct IdMapError(String);

impl FromStr for IdMap {
    type Err = IdMapError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "squash" => return Ok(IdMap::Squash),
            "passthrough" => return Ok(IdMap::Passthrough),
            _ => {}
        }
        let bad = || IdMapError(s.to_string());
        let (mut uids, mut gids) = (Vec::new(), Vec::new());
        for item in s.split(',') {
            let mut parts = item.trim().split(':');
            let (Some(kind), Some(guest), Some(host), None) =
                (parts.next(), parts.next(), parts.next(), parts.next())
            else {
                return Err(bad());
            };
            let guest: u32 = guest.parse().map_err(|_| bad())?;
            let host: u32 = host.parse().map_err(|_| bad())?;
            let table = match kind {
                "uid" => &mut uids,
                "gid" => &mut gids,
                _ => return Err(bad()),
            };
            // Each id may appear once on each side, or the mapping would not be reversible.
            if table.iter().any(|&(g, h)| g == guest || h == host) {
                return Err(bad());
            }
            table.push((guest, host));
        }
        Ok(IdMap::Mapped { uids, gids })
    }
}

impl IdMap {
    pub fn mode(&self) -> IdMapping {
        match self {
            IdMap::Squash => IdMapping::Squash,
            IdMap::Passthrough => IdMapping::Passthrough,
            IdMap::Mapped { .. } => IdMapping::Mapped,
        }
    }
}

/// One session's ownership view: the export's policy plus the guest owner its client named.
#[derive(Debug, Clone)]
pub struct SessionIds {
    pub map: IdMap,
    pub owner_uid: u32,
    pub owner_gid: u32,
    /// The server runs as root, so it can create files as someone else.
    pub can_switch: bool,
}

fn to_host(table: &[(u32, u32)], guest: u32) -> Option<u32> {
    table.iter().find(|&&(g, _)| g == guest).map(|&(_, h)| h)
}

fn to_guest(table: &[(u32, u32)], host: u32) -> u32 {
    table
        .iter()
        .find(|&&(_, h)| h == host)
        .map(|&(g, _)| g)
        .unwrap_or(OVERFLOW_ID)
}

impl SessionIds {
    /// The (uid, gid) the guest sees for a host file.
    pub fn guest_owner(&self, host_uid: u32, host_gid: u32) -> (u32, u32) {
        match &self.map {
            IdMap::Squash => (self.owner_uid, self.owner_gid),
            IdMap::Passthrough => (host_uid, host_gid),
            IdMap::Mapped { uids, gids } => (to_guest(uids, host_uid), to_guest(gids, host_gid)),
        }
    }

    /// The host (uid, gid) to create files as for `caller`; None: as the serving user.
    pub fn creator(&self, caller: Caller) -> SysResult<Option<(u32, u32)>> {
        if !self.can_switch {
            return Ok(None);
        }
        match &self.map {
            IdMap::Squash => Ok(None),
            IdMap::Passthrough => Ok(Some((caller.uid, caller.gid))),
            IdMap::Mapped { uids, gids } => {
                match (to_host(uids, caller.uid), to_host(gids, caller.gid)) {
                    (Some(u), Some(g)) => Ok(Some((u, g))),
                    // A guest user the map does not know has no host identity to create as.
                    _ => Err(WireErrno::EPERM),
                }
            }
        }
    }

    /// The host ids a chown to guest (`uid`, `gid`) should apply; None leaves that id as is.
    pub fn chown(
        &self,
        uid: Option<u32>,
        gid: Option<u32>,
    ) -> SysResult<(Option<u32>, Option<u32>)> {
        match &self.map {
            IdMap::Passthrough => Ok((uid, gid)),
            // Every file already appears to be the owner's: giving it to them changes
            // nothing, giving it to anyone else cannot be represented on the host.
            IdMap::Squash => {
                if uid.is_some_and(|u| u != self.owner_uid)
                    || gid.is_some_and(|g| g != self.owner_gid)
                {
                    Err(WireErrno::EPERM)
                } else {
                    Ok((None, None))
                }
            }
            IdMap::Mapped { uids, gids } => {
                let map = |table: &[(u32, u32)], id: Option<u32>| match id {
                    None => Ok(None),
                    Some(id) => to_host(table, id).map(Some).ok_or(WireErrno::EINVAL),
                };
                Ok((map(uids, uid)?, map(gids, gid)?))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(map: IdMap) -> SessionIds {
        SessionIds {
            map,
            owner_uid: 1000,
            owner_gid: 100,
            can_switch: true,
        }
    }

    fn caller(uid: u32, gid: u32) -> Caller {
        Caller { uid, gid, pid: 1 }
    }

    #[test]
    fn parses_map_ids_and_explains_bad_ones() {
        assert_eq!("squash".parse(), Ok(IdMap::Squash));
        assert_eq!("passthrough".parse(), Ok(IdMap::Passthrough));
        assert_eq!(
            "uid:1000:501,gid:1000:20,uid:0:0".parse(),
            Ok(IdMap::Mapped {
                uids: vec![(1000, 501), (0, 0)],
                gids: vec![(1000, 20)]
            })
        );
        for bad in [
            "",
            "squish",
            "uid:1000",
            "uid:1000:501:1",
            "user:1:2",
            "uid:-1:2",
            "uid:1:2,uid:1:3",
            "uid:1:2,uid:3:2",
        ] {
            let e = bad.parse::<IdMap>().unwrap_err();
            assert!(e.to_string().contains("uid:GUEST:HOST"), "{bad}: {e}");
        }
    }

    #[test]
    fn squash_shows_the_owner_creates_as_server_and_allows_only_no_op_chown() {
        let s = ids(IdMap::Squash);
        assert_eq!(s.guest_owner(0, 0), (1000, 100));
        assert_eq!(s.guest_owner(4242, 7), (1000, 100));
        assert_eq!(s.creator(caller(1000, 100)), Ok(None));
        assert_eq!(s.chown(Some(1000), Some(100)), Ok((None, None)));
        assert_eq!(s.chown(None, Some(100)), Ok((None, None)));
        assert_eq!(s.chown(Some(0), None), Err(WireErrno::EPERM));
        assert_eq!(s.chown(None, Some(0)), Err(WireErrno::EPERM));
    }

    #[test]
    fn passthrough_is_the_identity_and_creates_as_the_caller() {
        let s = ids(IdMap::Passthrough);
        assert_eq!(s.guest_owner(4242, 7), (4242, 7));
        assert_eq!(s.creator(caller(1000, 100)), Ok(Some((1000, 100))));
        assert_eq!(s.chown(Some(5), None), Ok((Some(5), None)));
        let unprivileged = SessionIds {
            can_switch: false,
            ..s
        };
        assert_eq!(unprivileged.creator(caller(1000, 100)), Ok(None));
    }

    #[test]
    fn mapped_translates_both_ways_and_refuses_the_unknown() {
        let s = ids("uid:1000:501,gid:100:20".parse().unwrap());
        assert_eq!(s.guest_owner(501, 20), (1000, 100));
        assert_eq!(s.guest_owner(0, 0), (OVERFLOW_ID, OVERFLOW_ID));
        assert_eq!(s.creator(caller(1000, 100)), Ok(Some((501, 20))));
        assert_eq!(s.creator(caller(0, 0)), Err(WireErrno::EPERM));
        assert_eq!(s.chown(Some(1000), Some(100)), Ok((Some(501), Some(20))));
        assert_eq!(s.chown(Some(0), None), Err(WireErrno::EINVAL));
    }
}
