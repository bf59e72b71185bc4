//! Names: LOOKUP, FORGET, and what makes or removes a name (MKNOD, MKDIR, SYMLINK, LINK,
//! CREATE, UNLINK, RMDIR, RENAME), with what the client knows of each name (known.rs,
//! cache/coherence.rs), the answers to the replay thread's requests (invalidate/host_events.rs),
//! and creations answered early with a spare file (write/spares.rs).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use fuser::{
    Errno, FileAttr, FopenFlags, Generation, RenameFlags, ReplyCreate, ReplyEmpty, ReplyEntry,
};
use tether_proto::{Attr, Caller, Entry, NodeId, Reply, Request, Timespec, WireErrno, ROOT_NODE};

use super::answer::{name, ttl_for};
use super::fs::{Asked, TetherFs};
use super::reply::{errno, file_attr};
use crate::cache::coherence::{Coherence, WATCHED_TTL};
use crate::invalidate::host_events::{ReplayLookup, Replayer, GHOST_BASE};
use crate::kernel_ids::{kernel_fh, NEGATIVE_INO};
use crate::known::{Binding, OpenHandle};
use crate::rpc::{Connection, ReplyResult};
use crate::write::behind;
use crate::write::spares::{self, PoolKey, Spares};

impl TetherFs {
    pub(super) fn on_lookup(&self, req: Asked<'_>, parent: NodeId, n: &OsStr, reply: ReplyEntry) {
        if req.origin.replay().is_none() {
            if self.co.surely_absent(parent, n.as_bytes()) {
                give_missing(reply); // as the server's ENOENT would be
                return;
            }
            self.prefetch.missed(parent);
        }
        self.entry_call(
            req,
            parent,
            Request::Lookup {
                parent,
                name: name(n),
            },
            reply,
        );
    }

    pub(super) fn on_forget(&self, req: Asked<'_>, ino: NodeId, nlookup: u64) {
        if ino >= GHOST_BASE {
            return; // never known to the server
        }
        // Sent before the count drops: a reconnect's restore then either counts these
        // lookups and gets the FORGET after it, or counts none of them.
        self.conn.send_oneway(
            req.caller(),
            &Request::Forget {
                nodes: vec![(ino, nlookup)],
            },
        );
        self.known.forgotten(ino, nlookup, |parent| {
            self.co.forget(ino);
            self.prefetch.forgotten(ino, parent);
            self.pages.forget(ino);
            self.known_attrs.forget(ino);
            self.written.drop_copy(ino);
            // Only now: the server drops a node's locks when the kernel holds no lookup.
            if let Some(l) = &self.locks {
                l.forgotten(ino);
            }
        });
    }

    pub(super) fn on_create(
        &self,
        req: Asked<'_>,
        (parent, n): (NodeId, &OsStr),
        (mode, umask): (u32, u32),
        flags: i32,
        reply: ReplyCreate,
    ) {
        let Err(reply) = self.create_behind(req, parent, n, mode, umask, flags, reply) else {
            return;
        };
        let msg = Request::Create {
            parent,
            name: name(n),
            mode,
            umask,
            flags: flags as u32,
        };
        let (co, fallback, sent, dir) =
            (self.co.clone(), self.cache.entry_ttl, self.co.now(), parent);
        let (conn, who, known) = (self.conn.clone(), req.caller(), self.known.clone());
        let created = name(n);
        let (known_attrs, touch) = (self.known_attrs.clone(), self.known_attrs.asking(dir));
        let written = self.keeps_written().then(|| self.written.clone());
        self.call(req, msg, reply, move |reply, r| match r {
            Reply::Create {
                entry,
                fh,
                dir: dir_attr,
                ..
            } => {
                known_attrs.learn(dir, touch, dir_attr.as_deref(), sent, &co);
                known.given(dir, &created, entry.node, || {
                    co.entry_given(&entry);
                    co.created(&entry, sent);
                    true
                });
                co.name_made(dir, &created);
                if let Some(written) = written.filter(|_| entry.attr.size == 0) {
                    written.start(entry.node, sent, &co);
                }
                let ttl = ttl_for(&co, fallback, entry.node, Some(dir), sent);
                // After what this reply itself tells is decided, before the kernel hears.
                co.changed_here(dir);
                let keep = if co.cacheable(entry.node, sent) {
                    FopenFlags::FOPEN_KEEP_CACHE
                } else {
                    FopenFlags::empty()
                };
                // In no-open mode the kernel does not always send RELEASE for a file made by
                // CREATE (not when it was created over a cached negative entry, as git's lock
                // files are), so a handle given to it could stay open on the server for good:
                // release it now and let the kernel do I/O on the new file by node.
                let kernel_handle = if co.enabled() {
                    // None to release when the server opened none (CREATE_NO_HANDLE).
                    if fh.is_some() {
                        let release = Request::Release {
                            node: entry.node,
                            fh,
                        };
                        conn.defer(who, release, Some(Box::new(|_| {})));
                    }
                    None
                } else if let Some(handle) = fh {
                    // Opened again without creating or truncating after a reconnect.
                    let flags = flags as u32 & !(libc::O_CREAT | libc::O_EXCL) as u32;
                    known.opened(
                        handle,
                        OpenHandle {
                            node: entry.node,
                            flags,
                            dir: false,
                        },
                    );
                    fh
                } else {
                    None
                };
                reply.created(
                    &ttl,
                    &file_attr(&entry.attr),
                    Generation(co.generation(entry.node, entry.generation)),
                    kernel_fh(kernel_handle),
                    keep,
                );
                Ok(())
            }
            _ => Err(reply),
        });
    }

    pub(super) fn on_mknod(
        &self,
        req: Asked<'_>,
        (parent, n): (NodeId, &OsStr),
        (mode, umask): (u32, u32),
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let msg = Request::Mknod {
            parent,
            name: name(n),
            mode,
            rdev: rdev as u64,
            umask,
        };
        self.entry_call(req, parent, msg, reply);
    }

    pub(super) fn on_mkdir(
        &self,
        req: Asked<'_>,
        (parent, n): (NodeId, &OsStr),
        (mode, umask): (u32, u32),
        reply: ReplyEntry,
    ) {
        self.entry_call(
            req,
            parent,
            Request::Mkdir {
                parent,
                name: name(n),
                mode,
                umask,
            },
            reply,
        );
    }

    pub(super) fn on_unlink(&self, req: Asked<'_>, parent: NodeId, n: &OsStr, reply: ReplyEmpty) {
        self.name_call(
            req,
            Request::Unlink {
                parent,
                name: name(n),
            },
            reply,
        );
    }

    pub(super) fn on_rmdir(&self, req: Asked<'_>, parent: NodeId, n: &OsStr, reply: ReplyEmpty) {
        self.name_call(
            req,
            Request::Rmdir {
                parent,
                name: name(n),
            },
            reply,
        );
    }

    pub(super) fn on_symlink(
        &self,
        req: Asked<'_>,
        parent: NodeId,
        link: &OsStr,
        target: &std::path::Path,
        reply: ReplyEntry,
    ) {
        let msg = Request::Symlink {
            parent,
            name: name(link),
            target: Bytes::copy_from_slice(target.as_os_str().as_bytes()),
        };
        self.entry_call(req, parent, msg, reply);
    }

    pub(super) fn on_rename(
        &self,
        req: Asked<'_>,
        (parent, n): (NodeId, &OsStr),
        (new_parent, new_name): (NodeId, &OsStr),
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let (from, to) = (name(n), name(new_name));
        let msg = Request::Rename {
            parent,
            name: from.clone(),
            new_parent,
            new_name: to.clone(),
            flags: flags.bits(),
        };
        if let Some(r) = req.origin.replay() {
            return replay_name_change(r, reply);
        }
        let known = self.known.clone();
        let exchange = flags.bits() & libc::RENAME_EXCHANGE != 0;
        // A whiteout takes the place of the old name.
        let whiteout = flags.bits() & libc::RENAME_WHITEOUT != 0;
        let co = self.co.clone();
        self.call(req, msg, reply, move |reply, r| match r {
            Reply::Empty => {
                known.renamed(parent, &from, new_parent, &to, exchange);
                if !exchange && !whiteout {
                    co.name_removed(parent, &from);
                }
                co.name_made(new_parent, &to);
                if exchange {
                    co.name_made(parent, &from);
                }
                reply.ok();
                Ok(())
            }
            _ => Err(reply),
        });
    }

    pub(super) fn on_link(
        &self,
        req: Asked<'_>,
        ino: NodeId,
        new_parent: NodeId,
        new_name: &OsStr,
        reply: ReplyEntry,
    ) {
        let msg = Request::Link {
            node: ino,
            new_parent,
            new_name: name(new_name),
        };
        self.entry_call(req, new_parent, msg, reply);
    }

    /// For lookup, mknod, mkdir, symlink, link: an entry in `parent`.
    fn entry_call(&self, req: Asked<'_>, parent: NodeId, msg: Request, reply: ReplyEntry) {
        if let Some(r) = req.origin.replay() {
            return self.replay_entry(req, r, parent, msg, reply);
        }
        let negative_ok = matches!(msg, Request::Lookup { .. });
        self.send_entry(req, parent, msg, reply, negative_ok);
    }

    fn send_entry(
        &self,
        req: Asked<'_>,
        parent: NodeId,
        msg: Request,
        reply: ReplyEntry,
        negative_ok: bool,
    ) {
        let (co, fallback, sent) = (self.co.clone(), self.cache, self.co.now());
        let (known, entry_name) = (self.known.clone(), entry_name(&msg));
        let made = !matches!(msg, Request::Lookup { .. });
        let mkdir = matches!(msg, Request::Mkdir { .. });
        // A found node's attributes answer the GETATTR after the kernel forgets its atime.
        let looked_up = (!made).then(|| (self.known_attrs.clone(), self.known_attrs.looking()));
        self.send(req, &msg, move |res: ReplyResult| match res {
            Ok(Reply::Entry(e)) => {
                if let Some((known_attrs, since)) = &looked_up {
                    known_attrs.learn_entry(e.node, *since, &e.attr, sent, &co);
                }
                // First: whether it is watched decides what follows.
                let record = || {
                    co.entry_given(&e);
                    true
                };
                if let Some(name) = entry_name {
                    known.given(parent, &name, e.node, record);
                    if made {
                        co.name_made(parent, &name);
                    }
                } else {
                    record();
                }
                if mkdir {
                    co.dir_made(&e, sent);
                }
                give_entry(&co, fallback.attr_ttl, parent, &e, sent, reply);
            }
            Ok(_) => reply.error(Errno::EIO),
            // A missing name in a watched directory is cached too (node id 0): compilers
            // and git probe many names that do not exist; the host's create revokes it.
            Err(WireErrno::ENOENT) if negative_ok && co.cacheable(parent, sent) => {
                give_missing(reply);
            }
            Err(e) => reply.error(errno(e)),
        });
    }

    /// An entry request of the replaying thread (invalidate/host_events.rs). What it is given about
    /// the names it changes may not outlive the replay, so those answers have a TTL of 0
    /// (and the replay invalidates the names afterwards): a lookup of an armed name finds
    /// the state before the host's change, a creation the node the host created. Any other
    /// lookup (a directory on the way, the file of a content replay) is an ordinary one:
    /// the host's entry as it is now, cached as for anyone (a TTL of 0 there made every
    /// later replay ask again for each directory on its path). Other entry operations
    /// change nothing.
    fn replay_entry(
        &self,
        req: Asked<'_>,
        r: &Arc<Replayer>,
        parent: NodeId,
        msg: Request,
        reply: ReplyEntry,
    ) {
        match msg {
            Request::Lookup { name, .. } => match r.lookup(parent, &name) {
                Some(l) => self.replay_lookup(req, r, l, reply),
                None => {
                    let msg = Request::Lookup { parent, name };
                    self.send_entry(req, parent, msg, reply, true)
                }
            },
            // The replay of a creation: answer with what the host created.
            msg => match created_name(&msg).map(|name| (r.lookup(parent, &name), name)) {
                Some((Some(ReplayLookup::Created { node, file_type }), name)) => {
                    self.replay_host_entry(req, r, (parent, name), (node, file_type), reply)
                }
                _ => reply.error(Errno::EPERM),
            },
        }
    }

    /// A lookup the replaying thread needs answered as the state before the host change.
    fn replay_lookup(&self, req: Asked<'_>, r: &Arc<Replayer>, l: ReplayLookup, reply: ReplyEntry) {
        match l {
            l if l.absent() => reply.error(Errno::ENOENT),
            ReplayLookup::Removed { file_type } => replay_ghost(r, file_type, reply),
            ReplayLookup::Renamed {
                dir,
                name,
                node,
                file_type,
            } => self.replay_host_entry(req, r, (dir, name), (node, file_type), reply),
            _ => unreachable!("absent() covers the other lookups"),
        }
    }

    /// What the host has now under `name` in `dir`, for the replaying thread only (TTL 0),
    /// if it is `node`: anything else, or nothing, or an unknown node (the name was gone
    /// already when the server read the event), is answered with a ghost of `file_type`,
    /// so that a replay never gives the name another file, not even for the moment of the
    /// replay.
    fn replay_host_entry(
        &self,
        req: Asked<'_>,
        r: &Arc<Replayer>,
        (dir, name): (NodeId, Bytes),
        (node, file_type): (Option<NodeId>, u32),
        reply: ReplyEntry,
    ) {
        let (co, r, known, conn) = (
            self.co.clone(),
            r.clone(),
            self.known.clone(),
            self.conn.clone(),
        );
        let Some(node) = node else {
            return replay_ghost(&r, file_type, reply);
        };
        let who = req.caller();
        let msg = Request::Lookup {
            parent: dir,
            name: name.clone(),
        };
        self.conn
            .call(who, &msg, move |res: ReplyResult| match res {
                Ok(Reply::Entry(e)) if e.node == node => {
                    known.given(dir, &name, e.node, || {
                        co.entry_given(&e);
                        true
                    });
                    let attr = file_attr(&e.attr);
                    let generation = Generation(co.generation(e.node, e.generation));
                    reply.entry(&Duration::ZERO, &attr, generation);
                }
                Ok(Reply::Entry(e)) => {
                    // Another file has the name now: the server counted a lookup the kernel
                    // never gets (sent from another thread: this is the reader's).
                    conn.defer(
                        who,
                        Request::Forget {
                            nodes: vec![(e.node, 1)],
                        },
                        None,
                    );
                    replay_ghost(&r, file_type, reply);
                }
                _ => replay_ghost(&r, file_type, reply),
            });
    }

    /// For unlink and rmdir: `name` goes from `parent` (a replay's went on the host already).
    fn name_call(&self, req: Asked<'_>, msg: Request, reply: ReplyEmpty) {
        if let Some(r) = req.origin.replay() {
            return replay_name_change(r, reply);
        }
        let (parent, name) = match &msg {
            Request::Unlink { parent, name } | Request::Rmdir { parent, name } => {
                (*parent, name.clone())
            }
            _ => unreachable!("name_call is for UNLINK and RMDIR"),
        };
        let co = self.co.clone();
        self.call(req, msg, reply, move |reply, r| match r {
            Reply::Empty => {
                co.name_removed(parent, &name);
                reply.ok();
                Ok(())
            }
            _ => Err(reply),
        });
    }

    /// Create-behind (write/spares.rs): answers the creation of `name` in `parent` with a spare
    /// file and sends BIND to name it, or gives `reply` back when it cannot (off, a durable
    /// or uncached open, no spare at hand, too much in flight).
    #[allow(clippy::too_many_arguments)]
    fn create_behind(
        &self,
        req: Asked<'_>,
        parent: NodeId,
        n: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) -> Result<(), ReplyCreate> {
        use tether_proto::handshake::features::SPARE_FILES;
        if !self.spares.on()
            || behind::durable_or_uncached(flags)
            || !self.co.enabled()
            || self.co.fixer().is_some()
            || !self.conn.grants(SPARE_FILES)
            // Spares go with their connection: none while it is being replaced.
            || !self.conn.is_up()
        {
            return Err(reply);
        }
        // A set-group-ID directory's files have its group: its spares are its own, so
        // its attributes must be known.
        let Some(dir_attr) = self.known_attrs.get(parent, &self.co) else {
            return Err(reply);
        };
        let set_group_id = dir_attr.mode & libc::S_ISGID != 0;
        let key = PoolKey::new(parent, set_group_id, req.uid(), req.gid());
        let session = self.conn.stats.reconnects.load(Ordering::Relaxed);
        ask_for_spares(&self.conn, &self.spares, key, parent, req.caller());
        let Some(mut entry) = self.spares.take(key, session) else {
            return Err(reply);
        };
        let node = entry.node;
        if !self.write_behind.begin_creation(node) {
            let forget = Request::Forget {
                nodes: vec![(node, 1)],
            };
            self.conn.send_oneway(req.caller(), &forget);
            return Err(reply);
        }
        // The kernel asks for the directory's attributes before its next creation there:
        // that waits for BIND's reply, which carries them (DIR_ATTR), as a write's GETATTR
        // waits for the write.
        let dir_tracked = self.write_behind.begin_creation(parent);
        // What the kernel is told: the file BIND will make, its times the guest's clock's
        // (BIND sets the host's atime and mtime to them; its ctime is the host's moment).
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let time = Timespec {
            sec: now.as_secs() as i64,
            nsec: now.subsec_nanos(),
        };
        let a = &mut entry.attr;
        a.mode = libc::S_IFREG | (mode & 0o7777 & !umask);
        (a.size, a.blocks, a.nlink) = (0, 0, 1);
        (a.atime, a.mtime, a.ctime) = (time, time, time);
        entry.flags = tether_proto::entry_flags::NEW_FILE;
        if self.co.watches(parent) {
            entry.flags |= tether_proto::entry_flags::WATCHED;
        }
        let created = name(n);
        let msg = Request::Bind {
            parent,
            name: created.clone(),
            node,
            mode,
            umask,
            time,
        };
        let sent = self.co.now();
        let (co, known_attrs, wb) = (
            self.co.clone(),
            self.known_attrs.clone(),
            self.write_behind.clone(),
        );
        let (dir_touch, file_touch) = (known_attrs.asking(parent), known_attrs.asking(node));
        let (spares, failed_name, known) =
            (self.spares.clone(), created.clone(), self.known.clone());
        // When BIND went out: after the directory was marked changed ([`Coherence::
        // changed_here`]), which its reply is not older than.
        let bind_sent = Arc::new(std::sync::atomic::AtomicU64::new(sent));
        let bind_sent_then = bind_sent.clone();
        let done = move |res: ReplyResult| {
            known.bound(node);
            let sent = bind_sent_then.load(Ordering::Acquire);
            let outcome = match res {
                Ok(Reply::Create {
                    entry: made, dir, ..
                }) => {
                    known_attrs.learn(parent, dir_touch, dir.as_deref(), sent, &co);
                    known_attrs.learn(node, file_touch, Some(&made.attr), sent, &co);
                    Ok(0)
                }
                Ok(_) => Err(WireErrno::EIO),
                Err(e) => Err(e),
            };
            if wb.finish(node, 0, outcome) {
                spares.counters.failed_later.fetch_add(1, Ordering::Relaxed);
                co.revoke_name(parent, failed_name, node);
            }
            // Never an error of the directory's own.
            if dir_tracked {
                wb.finish(parent, 0, Ok(0));
            }
        };
        let binding = Binding {
            caller: req.caller(),
            generation: entry.generation,
            mode,
            umask,
            time,
        };
        self.known.binding(node, binding);
        self.known.given(parent, &created, node, || {
            self.co.entry_given(&entry);
            self.co.created(&entry, sent);
            true
        });
        self.co.name_made(parent, &created);
        if self.keeps_written() {
            self.written.start(node, sent, &self.co);
        }
        let ttl = ttl_for(&self.co, self.cache.entry_ttl, node, Some(parent), sent);
        // The kernel hears of the file while BIND is about to go out: whatever it asks
        // next leaves after BIND.
        let answer = || {
            self.co.changed_here(parent);
            bind_sent.store(self.co.now(), Ordering::Release);
            reply.created(
                &ttl,
                &file_attr(&entry.attr),
                Generation(entry.generation),
                kernel_fh(None),
                FopenFlags::FOPEN_KEEP_CACHE,
            )
        };
        self.send_answering_first(req, &msg, done, answer);
        self.spares
            .counters
            .answered_early
            .fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// Gives the kernel entry `e` in `parent`, from a reply to a request sent at push sequence
/// `sent` (cached as `ttl_for` allows). `Coherence::entry_given` must have seen it.
fn give_entry(
    co: &Coherence,
    fallback: Duration,
    parent: NodeId,
    e: &Entry,
    sent: u64,
    reply: ReplyEntry,
) {
    let ttl = ttl_for(co, fallback, e.node, Some(parent), sent);
    let generation = Generation(co.generation(e.node, e.generation));
    reply.entry_with_ttls(&ttl, &ttl, &file_attr(&e.attr), generation);
}

/// Tells the kernel the name does not exist, cached until revoked (inode number 0), as for a
/// watched directory's ENOENT.
fn give_missing(reply: ReplyEntry) {
    // The rest of the attributes is all 0, and ignored.
    let attr = FileAttr {
        ino: NEGATIVE_INO,
        ..file_attr(&Attr::of(ROOT_NODE))
    };
    reply.entry_with_ttls(&WATCHED_TTL, &WATCHED_TTL, &attr, Generation(0));
}

/// Asks the server for spare files for `key`, made in `dir` as `who`, if its pool runs low
/// (write/spares.rs), and FORGETs the spares of a pool pushed out for it.
fn ask_for_spares(
    conn: &Arc<Connection>,
    spares: &Arc<Spares>,
    key: PoolKey,
    dir: NodeId,
    who: Caller,
) {
    let session = conn.stats.reconnects.load(Ordering::Relaxed);
    let Some(evicted) = spares.should_ask(key, session) else {
        return;
    };
    forget_spares(conn, who, evicted);
    let msg = Request::Spares {
        parent: dir,
        count: spares::ASK,
    };
    let (conn2, spares) = (conn.clone(), spares.clone());
    let done = move |res: ReplyResult| {
        let outcome = match res {
            Ok(Reply::Spares(files)) => Ok(files),
            Ok(_) => Err(WireErrno::EIO),
            Err(e) => Err(e),
        };
        let current = conn2.stats.reconnects.load(Ordering::Relaxed);
        let unused = spares.filled(key, (session, current), outcome);
        forget_spares(&conn2, who, unused);
    };
    conn.defer(who, msg, Some(Box::new(done)));
}

fn forget_spares(conn: &Arc<Connection>, who: Caller, nodes: Vec<NodeId>) {
    if !nodes.is_empty() {
        let nodes = nodes.into_iter().map(|n| (n, 1)).collect();
        conn.defer(who, Request::Forget { nodes }, None);
    }
}

/// A replayed unlink, rmdir or rename: done already on the host. The first attempt of a
/// replay that asks for it is answered ESTALE, so that the kernel tries once more with
/// LOOKUP_REVAL: that looks up again, under the directory locks, every name the operation
/// acts on, so the replay's own answers decide it even if a guest operation put another
/// dentry under the name since the replay invalidated it (Replayer::revalidate_first).
fn replay_name_change(r: &Replayer, reply: ReplyEmpty) {
    if r.revalidate_first() {
        reply.error(Errno::ESTALE);
    } else {
        reply.ok();
    }
}

/// A ghost of type `file_type` for the replaying thread: a node the server never knew,
/// never cached.
fn replay_ghost(r: &Replayer, file_type: u32, reply: ReplyEntry) {
    reply.entry(
        &Duration::ZERO,
        &file_attr(&r.ghost(file_type)),
        Generation(0),
    );
}

/// The name an entry request gives its node in its parent.
fn entry_name(msg: &Request) -> Option<Bytes> {
    match msg {
        Request::Lookup { name, .. } | Request::Link { new_name: name, .. } => Some(name.clone()),
        _ => created_name(msg),
    }
}

/// The name a creating request makes, for answering its replay.
fn created_name(msg: &Request) -> Option<Bytes> {
    match msg {
        Request::Mknod { name, .. }
        | Request::Mkdir { name, .. }
        | Request::Symlink { name, .. } => Some(name.clone()),
        _ => None,
    }
}
