//! The real client RPC and the real server session, in one process, over the in-memory pipe:
//! the protocol end to end without FUSE or sockets.

use std::fs;
use std::sync::Arc;
use std::thread;

use bytes::Bytes;
use tether_client::Connection;
use tether_proto::{Caller, HandleId, NodeId, Reply, Request, WireErrno, ROOT_NODE};
use tether_server::{run_session, Export, ExportOptions, SessionLimits};
use tether_transport::memory_pipe;

struct Setup {
    conn: Arc<Connection>,
    dir: tempfile::TempDir,
    server: Option<thread::JoinHandle<()>>,
}

impl Drop for Setup {
    fn drop(&mut self) {
        self.conn.shut_down();
        if let Some(s) = self.server.take() {
            s.join().unwrap();
        }
    }
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let export = Export::open(dir.path(), &ExportOptions::default()).unwrap();
    let (client_end, server_end) = memory_pipe();
    let server = thread::spawn(move || {
        let _ = run_session(export, server_end, &SessionLimits::default(), None, None);
    });
    let conn = Connection::start(client_end, "inprocess-test", None, false).unwrap();
    Setup {
        conn,
        dir,
        server: Some(server),
    }
}

fn call(s: &Setup, r: Request) -> Result<Reply, WireErrno> {
    let me = Caller {
        uid: unsafe { libc::geteuid() },
        gid: unsafe { libc::getegid() },
        pid: std::process::id(),
    };
    s.conn.call_wait(me, &r)
}

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

#[test]
fn create_write_read_list_rename_unlink() {
    let s = setup();
    let Reply::Create { entry, fh, .. } = call(
        &s,
        Request::Create {
            parent: ROOT_NODE,
            name: b("f"),
            mode: 0o100644,
            umask: 0o022,
            flags: libc::O_RDWR as u32,
        },
    )
    .unwrap() else {
        panic!("not a create reply")
    };
    assert_eq!(entry.attr.mode & 0o777, 0o644);
    let Reply::Written { size, .. } = call(
        &s,
        Request::Write {
            node: entry.node,
            fh,
            offset: 0,
            data: b("hello world"),
        },
    )
    .unwrap() else {
        panic!()
    };
    assert_eq!(size, 11);
    let Reply::Data(d) = call(
        &s,
        Request::Read {
            node: entry.node,
            fh,
            offset: 6,
            size: 100,
        },
    )
    .unwrap() else {
        panic!()
    };
    assert_eq!(&d[..], b"world");
    assert_eq!(fs::read(s.dir.path().join("f")).unwrap(), b"hello world");
    call(
        &s,
        Request::Release {
            node: entry.node,
            fh,
        },
    )
    .unwrap();

    let Reply::Entry(e) = call(
        &s,
        Request::Mkdir {
            parent: ROOT_NODE,
            name: b("d"),
            mode: 0o755,
            umask: 0,
        },
    )
    .unwrap() else {
        panic!()
    };
    call(
        &s,
        Request::Rename {
            parent: ROOT_NODE,
            name: b("f"),
            new_parent: e.node,
            new_name: b("g"),
            flags: 0,
        },
    )
    .unwrap();
    assert!(s.dir.path().join("d/g").exists());

    let Reply::Open { fh: dh, .. } = call(
        &s,
        Request::Opendir {
            node: e.node,
            flags: 0,
        },
    )
    .unwrap() else {
        panic!()
    };
    let Reply::Dir { entries, .. } = call(
        &s,
        Request::Readdir {
            node: e.node,
            fh: Some(dh),
            offset: 0,
            size: 4096,
            plus: true,
        },
    )
    .unwrap() else {
        panic!()
    };
    let mut names: Vec<_> = entries
        .iter()
        .map(|e| String::from_utf8_lossy(&e.name).into_owned())
        .collect();
    names.sort();
    assert_eq!(names, [".", "..", "g"]);
    let g = entries.iter().find(|e| &e.name[..] == b"g").unwrap();
    assert_eq!(
        g.entry.unwrap().attr.size,
        11,
        "readdirplus carries attributes"
    );

    assert_eq!(
        call(
            &s,
            Request::Rmdir {
                parent: ROOT_NODE,
                name: b("d")
            }
        ),
        Err(WireErrno::ENOTEMPTY)
    );
    call(
        &s,
        Request::Unlink {
            parent: e.node,
            name: b("g"),
        },
    )
    .unwrap();
    call(
        &s,
        Request::Rmdir {
            parent: ROOT_NODE,
            name: b("d"),
        },
    )
    .unwrap();
    assert_eq!(
        call(
            &s,
            Request::Lookup {
                parent: ROOT_NODE,
                name: b("d")
            }
        ),
        Err(WireErrno::ENOENT)
    );
}

#[test]
fn names_that_could_escape_are_refused() {
    let s = setup();
    for bad in ["..", ".", "a/b", "", "x\0y"] {
        let r = call(
            &s,
            Request::Lookup {
                parent: ROOT_NODE,
                name: Bytes::copy_from_slice(bad.as_bytes()),
            },
        );
        assert_eq!(r, Err(WireErrno::EINVAL), "lookup of {bad:?}");
        let r = call(
            &s,
            Request::Mkdir {
                parent: ROOT_NODE,
                name: Bytes::copy_from_slice(bad.as_bytes()),
                mode: 0o755,
                umask: 0,
            },
        );
        assert_eq!(r, Err(WireErrno::EINVAL), "mkdir of {bad:?}");
    }
    let long = "x".repeat(256);
    assert_eq!(
        call(
            &s,
            Request::Lookup {
                parent: ROOT_NODE,
                name: b(&long)
            }
        ),
        Err(WireErrno::ENAMETOOLONG)
    );
    // A node id the server never issued is stale, not a crash.
    assert_eq!(
        call(
            &s,
            Request::Getattr {
                node: NodeId::new(987654321),
                fh: None
            }
        ),
        Err(WireErrno::ESTALE)
    );
    // So is a handle it never issued.
    assert_eq!(
        call(
            &s,
            Request::Read {
                node: ROOT_NODE,
                fh: HandleId::new(4242),
                offset: 0,
                size: 10
            }
        ),
        Err(WireErrno::EBADF)
    );
}

#[test]
fn many_requests_in_flight_complete_out_of_order() {
    let s = setup();
    for i in 0..50 {
        fs::write(s.dir.path().join(format!("f{i}")), format!("{i}")).unwrap();
    }
    let (tx, rx) = std::sync::mpsc::channel();
    for i in 0..50 {
        let tx = tx.clone();
        s.conn.call(
            Caller::default(),
            &Request::Lookup {
                parent: ROOT_NODE,
                name: b(&format!("f{i}")),
            },
            move |r| {
                tx.send((i, r)).unwrap();
            },
        );
    }
    drop(tx);
    let mut got: Vec<_> = rx.iter().collect();
    assert_eq!(got.len(), 50);
    got.sort_by_key(|(i, _)| *i);
    for (i, r) in got {
        let Ok(Reply::Entry(e)) = r else {
            panic!("lookup {i} failed: {r:?}")
        };
        assert_eq!(e.attr.size, format!("{i}").len() as u64);
    }
}

#[test]
fn requests_after_the_server_goes_away_fail_with_eio() {
    let s = setup();
    call(&s, Request::Ping).unwrap();
    s.conn.shut_down();
    assert_eq!(call(&s, Request::Ping), Err(WireErrno::EIO));
}

/// SYNC is a barrier (protocol.md §18): when its reply arrives, the invalidation of a host
/// write made before it was sent has arrived too, every time. Without the server draining
/// its watcher first, the reply overtakes the push (the watcher lets events gather 2 ms).
#[test]
fn a_sync_reply_follows_the_push_of_every_change_made_before_it() {
    use std::os::unix::fs::FileExt;
    use std::sync::Mutex;
    use tether_proto::{decode_invalidate, push_op, Invalidation};

    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("f"), b"round 00000\n").unwrap();
    let export = Export::open(dir.path(), &ExportOptions::default()).unwrap();
    let (client_end, server_end) = memory_pipe();
    let server = thread::spawn(move || {
        let _ = run_session(export, server_end, &SessionLimits::default(), None, None);
    });
    // Every node an INVALIDATE named, in stream order (the reader thread runs this before
    // it completes a reply that follows the push).
    let invalidated = Arc::new(Mutex::new(Vec::new()));
    let seen = invalidated.clone();
    let on_push: tether_client::rpc::PushHandler = Box::new(move |h, body| {
        if h.op == push_op::INVALIDATE {
            let push = decode_invalidate(body).unwrap();
            for item in push.items {
                if let Invalidation::Inode(n) = item {
                    seen.lock().unwrap().push(n);
                }
            }
        }
    });
    let conn = Connection::start(client_end, "inprocess-sync", Some(on_push), false).unwrap();
    let s = Setup {
        conn,
        dir,
        server: Some(server),
    };
    let Reply::Entry(e) = call(
        &s,
        Request::Lookup {
            parent: ROOT_NODE,
            name: b("f"),
        },
    )
    .unwrap() else {
        panic!("not an entry")
    };
    let file = fs::OpenOptions::new()
        .write(true)
        .open(s.dir.path().join("f"))
        .unwrap();
    for round in 1..=200 {
        invalidated.lock().unwrap().clear();
        file.write_all_at(format!("round {round:05}\n").as_bytes(), 0)
            .unwrap();
        assert_eq!(call(&s, Request::Sync), Ok(Reply::Empty));
        assert!(
            invalidated.lock().unwrap().contains(&e.node),
            "round {round}: the SYNC reply came before the push of the host write"
        );
    }
}
