//! Create-behind (with `tether mount --writes create-behind`): a file creation answered before the
//! server has made the file.
//!
//! A CREATE costs a server round trip, about half the time of creating a small file through
//! the mount (bench/journal/2026-11-27-create-behind-16k-reads-ext4-creation.md). With feature `SPARE_FILES` the server makes unnamed files
//! ahead of time in a directory the guest creates files in (SPARES: `O_TMPFILE`, owned as the
//! caller's new file would be). The client gives the kernel one of them as the new file at
//! once and sends BIND, which links it into the directory under its name and sets the asked
//! permissions and the times the guest was told.
//!
//! Why the guest sees nothing amiss: the spare is the host file itself, so its inode number
//! is the one the host will show, and writes to it need no name. The server executes BIND
//! before it reads the next request (like an ordered WRITE), so whatever the kernel asks
//! next, a listing of the directory, a GETATTR of it, a lookup by another name, sees the new
//! name. The kernel sent CREATE because it found the name free (coherent under pushed
//! invalidation); a host process that takes the name in the moment before BIND makes BIND
//! fail with EEXIST.
//!
//! What changes, as with write-behind: the host sees the file a moment after `open()`
//! returned. A BIND the server fails (the name taken meanwhile, no room in the directory) is
//! logged and counted; its error goes to the next `write()` or `fsync()` of the file, and the
//! guest's name and copy of it are dropped so that it sees what the host has. Spares belong
//! to their session: a reconnect drops them, and a BIND in flight then fails.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tether_proto::{Entry, NodeId, WireErrno};

/// Spares asked for at a time.
pub const ASK: u32 = 32;
/// A pool this low asks for more.
const LOW: usize = 8;
/// Directories (per caller) with spares at once; the least recently used gives its back.
const MAX_POOLS: usize = 8;
/// How long a directory whose SPARES failed (no O_TMPFILE, no permission) is left alone.
const RETRY_AFTER: Duration = Duration::from_secs(10);

/// Whose spares: files made as `uid`/`gid` would make them, where: `place` None for any
/// directory of the export's own file system (node ids below 2⁶³ are its inode numbers,
/// protocol.md §11) without set-group-ID, or else the one directory they were made in (a
/// set-group-ID directory gives its files its group; another file system cannot link them).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct PoolKey {
    pub place: Option<NodeId>,
    pub uid: u32,
    pub gid: u32,
}

impl PoolKey {
    pub fn new(dir: NodeId, set_group_id: bool, uid: u32, gid: u32) -> PoolKey {
        // Below 2⁶³ a node id is an inode number of the export's own file system.
        let place = if dir.get() < 1 << 63 && !set_group_id {
            None
        } else {
            Some(dir)
        };
        PoolKey { place, uid, gid }
    }
}

struct Pool {
    files: Vec<Entry>,
    /// The connection (count of reconnects) the files were made on.
    session: u64,
    asking: bool,
    failed_at: Option<Instant>,
    used: u64,
}

impl Pool {
    /// Starts over on connection `session` if the pool is of an earlier one: its spares
    /// went with it, and so did its SPARES request.
    fn on_session(&mut self, session: u64) -> &mut Pool {
        if self.session != session {
            self.files.clear();
            self.session = session;
            self.asking = false;
        }
        self
    }
}

#[derive(Default)]
pub struct Counters {
    /// Creations answered with a spare.
    pub answered_early: AtomicU64,
    /// Of those, creations the server then failed (BIND).
    pub failed_later: AtomicU64,
    /// Of those, creations named by a reconnect's restore: their BIND had no reply when
    /// the connection was lost, and their spare went with it (restore.rs).
    pub named_again: AtomicU64,
    /// Spares the server made.
    pub made: AtomicU64,
}

pub struct Spares {
    enabled: bool,
    pools: Mutex<HashMap<PoolKey, Pool>>,
    uses: AtomicU64,
    pub counters: Counters,
}

impl Spares {
    pub fn new(enabled: bool) -> Spares {
        Spares {
            enabled,
            pools: Mutex::new(HashMap::new()),
            uses: AtomicU64::new(0),
            counters: Counters::default(),
        }
    }

    pub fn on(&self) -> bool {
        self.enabled
    }

    /// A spare for a creation by `key`'s caller in its directory, made on connection
    /// `session`. Spares of an earlier connection are dropped (they went with it).
    pub fn take(&self, key: PoolKey, session: u64) -> Option<Entry> {
        if !self.enabled {
            return None;
        }
        let mut pools = self.pools.lock().unwrap();
        let pool = pools.get_mut(&key)?.on_session(session);
        pool.used = self.uses.fetch_add(1, Ordering::Relaxed);
        pool.files.pop()
    }

    /// Whether to ask the server for spares for `key` now (marked as asked): its pool is
    /// low and no request is on its way. A new pool may push out the least recently used
    /// one, whose spares are returned for the caller to FORGET.
    pub fn should_ask(&self, key: PoolKey, session: u64) -> Option<Vec<NodeId>> {
        if !self.enabled {
            return None;
        }
        let mut pools = self.pools.lock().unwrap();
        let mut evicted = Vec::new();
        if !pools.contains_key(&key) && pools.len() >= MAX_POOLS {
            let oldest = pools.iter().min_by_key(|(_, p)| p.used).map(|(k, _)| *k);
            if let Some(pool) = oldest.and_then(|k| pools.remove(&k)) {
                if pool.session == session {
                    evicted.extend(pool.files.iter().map(|e| e.node));
                }
            }
        }
        let used = self.uses.fetch_add(1, Ordering::Relaxed);
        let pool = pools
            .entry(key)
            .or_insert(Pool {
                files: Vec::new(),
                session,
                asking: false,
                failed_at: None,
                used,
            })
            .on_session(session);
        let resting = pool.failed_at.is_some_and(|t| t.elapsed() < RETRY_AFTER);
        if pool.asking || resting || pool.files.len() >= LOW {
            return (!evicted.is_empty()).then_some(evicted);
        }
        pool.asking = true;
        Some(evicted)
    }

    /// The server answered a SPARES for `key` sent on connection `session`; the connection
    /// is `current` now. Returns the spares nobody will use because their pool was pushed
    /// out meanwhile, for the caller to FORGET. Spares of an earlier connection are only
    /// dropped: they went with it, and a FORGET of their ids could hit a node of the new one.
    pub fn filled(
        &self,
        key: PoolKey,
        (session, current): (u64, u64),
        outcome: Result<Vec<Entry>, WireErrno>,
    ) -> Vec<NodeId> {
        let mut pools = self.pools.lock().unwrap();
        let files = match outcome {
            Ok(files) => files,
            Err(e) => {
                tracing::debug!(place = ?key.place, "no spare files: {e:?}");
                if let Some(pool) = pools.get_mut(&key).filter(|p| p.session == current) {
                    pool.asking = false;
                    pool.failed_at = Some(Instant::now());
                }
                return Vec::new();
            }
        };
        self.counters
            .made
            .fetch_add(files.len() as u64, Ordering::Relaxed);
        match pools.get_mut(&key) {
            Some(pool) if pool.session == session && session == current => {
                pool.asking = false;
                pool.failed_at = None;
                pool.files.extend(files);
                Vec::new()
            }
            None if session == current => files.iter().map(|e| e.node).collect(),
            _ => Vec::new(),
        }
    }

    /// Spares held now (for `tether status`).
    pub fn held(&self) -> usize {
        let pools = self.pools.lock().unwrap();
        pools.values().map(|p| p.files.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tether_proto::Attr;

    const KEY: PoolKey = PoolKey {
        place: None,
        uid: 1000,
        gid: 1000,
    };

    fn spare(node: NodeId) -> Entry {
        Entry {
            node,
            generation: 0,
            flags: 0,
            attr: Attr::of(node),
        }
    }

    fn ids<const N: usize>(raw: [u64; N]) -> [NodeId; N] {
        raw.map(NodeId::new)
    }

    #[test]
    fn a_pool_asks_once_until_answered_and_gives_out_what_came() {
        let s = Spares::new(true);
        assert_eq!(s.take(KEY, 0), None, "no pool yet");
        assert_eq!(s.should_ask(KEY, 0), Some(vec![]));
        assert_eq!(s.should_ask(KEY, 0), None, "already asking");
        assert!(s
            .filled(
                KEY,
                (0, 0),
                Ok(vec![spare(NodeId::new(10)), spare(NodeId::new(11))])
            )
            .is_empty());
        assert_eq!(s.held(), 2);
        // Low again: asks again.
        assert_eq!(s.should_ask(KEY, 0), Some(vec![]));
        let mut got = vec![s.take(KEY, 0).unwrap().node, s.take(KEY, 0).unwrap().node];
        got.sort();
        assert_eq!(got, ids([10, 11]));
        assert_eq!(s.take(KEY, 0), None);
    }

    #[test]
    fn spares_of_an_earlier_connection_are_never_given_out() {
        let s = Spares::new(true);
        s.should_ask(KEY, 0);
        s.filled(KEY, (0, 0), Ok(vec![spare(NodeId::new(10))]));
        assert_eq!(s.take(KEY, 1), None, "made on connection 0");
        // An answer of the old connection's: neither kept nor forgotten (its ids may be
        // nodes of the new connection).
        s.should_ask(KEY, 1);
        assert!(s
            .filled(KEY, (0, 1), Ok(vec![spare(NodeId::new(12))]))
            .is_empty());
        assert_eq!(s.take(KEY, 1), None);
        assert!(s
            .filled(KEY, (1, 1), Ok(vec![spare(NodeId::new(13))]))
            .is_empty());
        assert_eq!(s.take(KEY, 1).map(|e| e.node), Some(NodeId::new(13)));
    }

    #[test]
    fn a_failed_ask_rests_and_the_oldest_pool_gives_its_spares_back() {
        let s = Spares::new(true);
        s.should_ask(KEY, 0);
        s.filled(KEY, (0, 0), Err(WireErrno::EOPNOTSUPP));
        assert_eq!(s.should_ask(KEY, 0), None, "resting after a failure");
        let first = PoolKey { uid: 6, ..KEY };
        s.should_ask(first, 0);
        s.filled(
            first,
            (0, 0),
            Ok(vec![spare(NodeId::new(20)), spare(NodeId::new(21))]),
        );
        // A pool pushed out while its SPARES was on its way: the spares come back.
        let gone = PoolKey { uid: 7, ..KEY };
        assert_eq!(
            s.filled(gone, (0, 0), Ok(vec![spare(NodeId::new(30))])),
            ids([30])
        );
        for uid in 100..(100 + MAX_POOLS as u32 - 2) {
            assert_eq!(s.should_ask(PoolKey { uid, ..KEY }, 0), Some(vec![]));
        }
        // Full: the next new pool pushes out the least recently used (KEY's, empty), then
        // user 6's with its two spares.
        assert_eq!(s.should_ask(PoolKey { uid: 200, ..KEY }, 0), Some(vec![]));
        let mut back = s.should_ask(PoolKey { uid: 201, ..KEY }, 0).unwrap();
        back.sort();
        assert_eq!(back, ids([20, 21]));
    }

    #[test]
    fn off_means_nothing_is_asked_or_given() {
        let s = Spares::new(false);
        assert_eq!(s.should_ask(KEY, 0), None);
        assert_eq!(s.take(KEY, 0), None);
    }

    #[test]
    fn directories_of_the_exports_own_file_system_share_a_pool() {
        let key = |dir, set_group_id| PoolKey::new(dir, set_group_id, 5, 6);
        assert_eq!(key(NodeId::new(1), false), key(NodeId::new(12345), false));
        assert_ne!(
            key(NodeId::new(1), false),
            key(NodeId::new(1 << 63), false),
            "another file system"
        );
        assert_ne!(
            key(NodeId::new(1 << 63), false),
            key(NodeId::new((1 << 63) + 1), false)
        );
        assert_ne!(
            key(NodeId::new(12), true),
            key(NodeId::new(12345), false),
            "set-group-ID"
        );
        assert_ne!(key(NodeId::new(12), true), key(NodeId::new(13), true));
    }
}
