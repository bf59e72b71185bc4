//! Directories: OPENDIR, READDIR, READDIRPLUS (whose entries fill the kernel's dentry and
//! attribute caches, as lookups would), RELEASEDIR and FSYNCDIR. A listing the client knows
//! has ended is answered without the server (cache/coherence.rs).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::Ordering;

use fuser::{Generation, OpenFlags, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyOpen};
use tether_proto::{fuse_dirent_size, Attr, Entry, HandleId, NodeId, Reply, Request};

use crate::kernel_ids::ino_of;

use super::answer::ttl_for;
use super::fs::{Asked, TetherFs};
use super::reply::{file_attr, kind_of_dtype};

impl TetherFs {
    pub(super) fn on_opendir(
        &self,
        req: Asked<'_>,
        ino: NodeId,
        flags: OpenFlags,
        reply: ReplyOpen,
    ) {
        self.open_call(
            req,
            Request::Opendir {
                node: ino,
                flags: flags.0 as u32,
            },
            reply,
        );
    }

    pub(super) fn on_readdir(
        &self,
        req: Asked<'_>,
        ino: NodeId,
        fh: Option<HandleId>,
        offset: u64,
        reply: ReplyDirectory,
    ) {
        if self.co.listing_surely_ended(ino, offset) {
            reply.ok();
            return;
        }
        // fuser does not tell us the kernel's buffer size; a page-sized answer always fits.
        let msg = Request::Readdir {
            node: ino,
            fh,
            offset,
            size: 4096,
            plus: false,
        };
        let (co, sent, dir) = (self.co.clone(), self.co.now(), ino);
        let names = self.co.names_made();
        self.call(req, msg, reply, move |mut reply, r| match r {
            Reply::Dir { entries, end } => {
                let mut full = false;
                let last = entries.last().map(|e| e.offset);
                for e in entries {
                    full = reply.add(
                        ino_of(e.ino),
                        e.offset,
                        kind_of_dtype(e.kind),
                        OsStr::from_bytes(&e.name),
                    );
                    if full {
                        break;
                    }
                }
                // Before the reply: the kernel asks for what follows as soon as it has it.
                if let (true, false, Some(last)) = (end, full, last) {
                    co.listing_ended(dir, last, sent, names);
                }
                reply.ok();
                Ok(())
            }
            _ => Err(reply),
        });
    }

    pub(super) fn on_readdirplus(
        &self,
        req: Asked<'_>,
        ino: NodeId,
        fh: Option<HandleId>,
        offset: u64,
        reply: ReplyDirectoryPlus,
    ) {
        // The kernel asks for what follows the last entry before it sees the end.
        if self.co.listing_surely_ended(ino, offset) {
            reply.ok();
            return;
        }
        let msg = Request::Readdir {
            node: ino,
            fh,
            offset,
            size: self.listing_bytes.load(Ordering::Relaxed),
            plus: true,
        };
        let listing_bytes = self.listing_bytes.clone();
        let (co, fallback, sent, dir) = (self.co.clone(), self.cache.entry_ttl, self.co.now(), ino);
        let names = self.co.names_made();
        let (conn, known) = (self.conn.clone(), self.known.clone());
        let (known_attrs, since) = (self.known_attrs.clone(), self.known_attrs.looking());
        let who = req.caller();
        self.call(req, msg, reply, move |mut reply, r| match r {
            Reply::Dir { entries, end } => {
                let last = entries.last().map(|e| e.offset);
                let mut unused: Vec<(NodeId, u64)> = Vec::new();
                let mut full = false;
                let mut fitted = 0;
                for e in entries {
                    let entry = e.entry.unwrap_or(Entry {
                        node: e.ino,
                        generation: 0,
                        flags: 0,
                        attr: Attr {
                            mode: (e.kind as u32) << 12,
                            ..Attr::of(e.ino)
                        },
                    });
                    if !full {
                        // Returns whether the kernel got a lookup of the entry.
                        let mut give = || {
                            let before = co.last_given(entry.node);
                            if e.entry.is_some() {
                                co.entry_given(&entry);
                            }
                            let ttl = ttl_for(&co, fallback, entry.node, Some(dir), sent);
                            full = reply.add(
                                ino_of(entry.node),
                                e.offset,
                                OsStr::from_bytes(&e.name),
                                &ttl,
                                &file_attr(&entry.attr),
                                Generation(co.generation(entry.node, entry.generation)),
                            );
                            if full && e.entry.is_some() && before.is_none() {
                                // It did not fit: the kernel never got it.
                                co.entry_not_given(entry.node);
                            }
                            if !full {
                                fitted += fuse_dirent_size(e.name.len(), true);
                                if e.entry.is_some() {
                                    let a = &entry.attr;
                                    known_attrs.learn_entry(entry.node, since, a, sent, &co);
                                }
                            }
                            !full && e.entry.is_some()
                        };
                        if e.entry.is_some() {
                            known.given(dir, &e.name, entry.node, give);
                        } else {
                            give();
                        }
                    }
                    // The server counted a lookup for each entry it sent; give back the ones
                    // the kernel never saw.
                    if full && e.entry.is_some() {
                        unused.push((entry.node, 1));
                    }
                }
                // Before the reply: the kernel asks for what follows as soon as it has it.
                if let (true, false, Some(last)) = (end, full, last) {
                    co.listing_ended(dir, last, sent, names);
                }
                reply.ok();
                if full {
                    // The kernel's buffer was smaller than asked for: ask for no more.
                    let fits = (fitted as u32).next_multiple_of(4096).max(4096);
                    listing_bytes.fetch_min(fits, Ordering::Relaxed);
                }
                if !unused.is_empty() {
                    conn.defer(who, Request::Forget { nodes: unused }, None);
                }
                Ok(())
            }
            _ => Err(reply),
        });
    }

    pub(super) fn on_releasedir(
        &self,
        req: Asked<'_>,
        ino: NodeId,
        fh: Option<HandleId>,
        reply: ReplyEmpty,
    ) {
        if let Some(fh) = fh {
            self.known.released(fh);
        }
        self.empty_call(req, Request::Releasedir { node: ino, fh }, reply);
    }

    pub(super) fn on_fsyncdir(
        &self,
        req: Asked<'_>,
        ino: NodeId,
        fh: Option<HandleId>,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.empty_call(
            req,
            Request::Fsyncdir {
                node: ino,
                fh,
                datasync,
            },
            reply,
        );
    }
}
