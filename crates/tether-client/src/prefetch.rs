//! Directory listings fetched ahead of LOOKUPs.
//!
//! A cold walk by known paths (a `stat` of every file of a tree, a build opening its
//! sources) sends one LOOKUP per name, and each is a round trip through two threads on
//! each side. After a second LOOKUP that the kernel could not answer in the same directory
//! within [`MISS_WINDOW`], the client lists that directory once with attributes (READDIR
//! plus, up to [`LISTED_AT_MOST`] entries) and answers the next LOOKUPs of its names from
//! the listing, without a round trip.
//!
//! The server counted one lookup for every entry it listed: an entry handed to the kernel
//! carries that count, and the others are given back (FORGET) after [`ENTRY_LIFE`].
//!
//! Coherence: a listed entry is used only if nothing about its directory or its node was
//! invalidated since the listing was asked for (the rule for every reply, coherence.rs; a
//! node the kernel forgot meanwhile counts as invalidated if any forgotten node was), and
//! nothing was changed through this mount since then, or was being changed then
//! (`Connection::changes`); otherwise it is given back, and the LOOKUP goes to the server.
//! So it is never staler than the reply to a LOOKUP sent when the listing was, and no change
//! this guest made is missing from it. A cold walk changes nothing; a build that writes
//! while it looks up names gets no help, and no harm.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use dashmap::mapref::entry::Entry as Slot;
use dashmap::DashMap;
use tether_proto::{Caller, Entry, NodeId, Reply, Request};

use crate::coherence::Coherence;
use crate::rpc::{reply_generation, Connection, ReplyResult};

/// Two LOOKUPs missing in one directory within this window start a listing.
const MISS_WINDOW: Duration = Duration::from_millis(500);
/// How long a listed entry waits for its LOOKUP (and a directory before it is listed again).
const ENTRY_LIFE: Duration = Duration::from_secs(2);
/// Entries listed per directory at most: a lookup in a huge directory must not fetch it all.
const LISTED_AT_MOST: usize = 4096;
/// READDIR buffer size per request (the kernel's own is 4 KiB; entries with attributes are
/// about 150 bytes each).
const LISTING_BYTES: u32 = 64 * 1024;

struct Listed {
    entry: Entry,
    /// Push sequence when the listing was asked for.
    sent: u64,
    /// `Connection::changes` then.
    changes: u64,
    /// The connection the server counted it on (`Connection::generation_up`).
    link: u64,
    at: Instant,
}

#[derive(Clone, Copy)]
struct DirState {
    window_start: Instant,
    misses: u32,
    /// Listed (or being listed) until then: not listed again before.
    listed_until: Option<Instant>,
}

pub struct Prefetch {
    conn: Arc<Connection>,
    co: Arc<Coherence>,
    listed: DashMap<(NodeId, Bytes), Listed>,
    dirs: DashMap<NodeId, DirState>,
}

/// An entry from a listing, for the kernel.
pub struct Prefetched {
    pub entry: Entry,
    pub sent: u64,
    /// The connection it was counted on: still the one up once the client has recorded
    /// the kernel's lookup, or else the new connection's restore may have missed it.
    pub link: u64,
}

impl Prefetch {
    pub fn new(conn: Arc<Connection>, co: Arc<Coherence>) -> Arc<Prefetch> {
        Arc::new(Prefetch {
            conn,
            co,
            listed: DashMap::new(),
            dirs: DashMap::new(),
        })
    }

    /// Starts the thread that gives back expired entries; it runs as long as the process.
    pub fn start(self: &Arc<Self>) {
        let me = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("tether-prefetch".into())
            .spawn(move || loop {
                std::thread::sleep(ENTRY_LIFE / 2);
                let Some(me) = me.upgrade() else { return };
                me.expire(Instant::now());
            });
        if let Err(e) = spawned {
            tracing::warn!("no thread to expire listed entries: {e}");
        }
    }

    /// The listed entry for `name` in `dir`, if there is one and nothing about it changed
    /// (its connection is for the caller to check: [`Prefetched::link`]).
    pub fn take(&self, dir: NodeId, name: &[u8]) -> Option<Prefetched> {
        let key = (dir, Bytes::copy_from_slice(name));
        let (_, l) = self.listed.remove(&key)?;
        let dir_fresh = self.co.fresh(dir, l.sent);
        let unchanged = self.conn.changes() == l.changes
            && dir_fresh
            && self.co.fresh_even_if_forgotten(l.entry.node, l.sent);
        if unchanged {
            // The caller checks `link` once it has recorded the kernel's lookup.
            return Some(Prefetched {
                entry: l.entry,
                sent: l.sent,
                link: l.link,
            });
        }
        if self.link() == Some(l.link) {
            self.give_back(vec![(l.entry.node, 1)]);
        }
        if !dir_fresh {
            self.dirs.remove(&dir); // its names changed: may be listed again at once
        }
        None
    }

    /// A LOOKUP in `dir` goes to the server: the second within [`MISS_WINDOW`] lists `dir`.
    pub fn missed(self: &Arc<Self>, dir: NodeId, caller: Caller) {
        if !self.co.enabled() {
            return;
        }
        let now = Instant::now();
        let list = {
            let mut st = self.dirs.entry(dir).or_insert(DirState {
                window_start: now,
                misses: 0,
                listed_until: None,
            });
            if st.listed_until.is_some_and(|t| now < t) {
                false
            } else {
                if now.duration_since(st.window_start) > MISS_WINDOW {
                    st.window_start = now;
                    st.misses = 0;
                }
                st.misses += 1;
                if st.misses >= 2 {
                    st.listed_until = Some(now + ENTRY_LIFE);
                    st.misses = 0;
                }
                st.misses == 0
            }
        };
        if list {
            self.list(dir, 0, 0, caller, false);
        }
    }

    /// Asks for the page of `dir`'s listing at `offset` (`so_far` entries listed before).
    fn list(self: &Arc<Self>, dir: NodeId, offset: u64, so_far: usize, who: Caller, defer: bool) {
        let (sent, changes) = (self.co.now(), self.conn.changes());
        let msg = Request::Readdir {
            node: dir,
            fh: 0,
            offset,
            size: LISTING_BYTES,
            plus: true,
        };
        let me = self.clone();
        let done = move |r: ReplyResult| me.listed(dir, so_far, (sent, changes), who, r);
        if defer {
            self.conn.defer(who, msg, Some(Box::new(done)));
        } else {
            self.conn.call(who, &msg, done);
        }
    }

    /// A page of a listing arrived (on the reader thread).
    fn listed(
        self: &Arc<Self>,
        dir: NodeId,
        so_far: usize,
        (sent, changes): (u64, u64),
        who: Caller,
        r: ReplyResult,
    ) {
        let Ok(Reply::Dir(entries)) = r else { return };
        // Not `self.link()`: this runs on the reader thread, which must not wait for the
        // link's lock (rpc.rs).
        let Some(link) = reply_generation() else {
            return;
        };
        // A change through this mount was answered while the server listed: the listing
        // may predate it. Not kept (and so not continued).
        let unchanged = self.conn.changes() == changes;
        let at = Instant::now();
        let mut spare = Vec::new();
        let mut next = None;
        let count = entries.len();
        for e in entries {
            next = Some(e.offset);
            let Some(entry) = e.entry else { continue }; // "." and ".."
                                                         // Kept unless the listing may predate a change, or the name is listed already.
            match self.listed.entry((dir, e.name)) {
                Slot::Vacant(v) if unchanged => {
                    v.insert(Listed {
                        entry,
                        sent,
                        changes,
                        link,
                        at,
                    });
                    self.co.counters.listed.fetch_add(1, Ordering::Relaxed);
                }
                _ => spare.push((entry.node, 1)),
            }
        }
        self.give_back(spare);
        let so_far = so_far + count;
        if let Some(offset) = next.filter(|_| unchanged && so_far < LISTED_AT_MOST) {
            self.list(dir, offset, so_far, who, true);
        }
    }

    /// Gives back the entries listed before `now - ENTRY_LIFE`.
    fn expire(&self, now: Instant) {
        let link = self.link();
        let mut old = Vec::new();
        self.listed.retain(|_, l| {
            let keep = now.duration_since(l.at) < ENTRY_LIFE;
            if !keep && link == Some(l.link) {
                old.push((l.entry.node, 1));
            }
            keep
        });
        self.dirs.retain(|_, d| {
            d.listed_until.is_some_and(|t| now < t)
                || now.duration_since(d.window_start) < MISS_WINDOW
        });
        self.give_back(old);
    }

    fn give_back(&self, nodes: Vec<(NodeId, u64)>) {
        if !nodes.is_empty() {
            self.conn
                .defer(Caller::default(), Request::Forget { nodes }, None);
        }
    }

    /// Counts are per connection: after a reconnect, entries counted on the old one are
    /// dropped, not given back, and none are used while a connection is being replaced.
    pub fn link(&self) -> Option<u64> {
        self.conn.generation_up()
    }
}
