//! Namespace cases: readdir, mkdir, mknod, unlink, rmdir, rename, symlink, link, names.

use super::sys::*;
use super::*;

pub(crate) const CASES: &[(&str, CaseFn)] = &[
    ("readdir_many", readdir_many),
    ("readdir_seek", readdir_seek),
    ("readdir_after_changes", readdir_after_changes),
    ("readdir_long_names", readdir_long_names),
    ("odd_names", odd_names),
    ("name_too_long", name_too_long),
    ("mkdir", mkdir_case),
    ("setgid_dir", setgid_dir),
    ("dir_nlink", dir_nlink),
    ("mknod", mknod_case),
    ("mknod_chardev", mknod_chardev),
    ("unlink", unlink_case),
    ("rmdir", rmdir_case),
    ("rename_basic", rename_basic),
    ("rename_dirs", rename_dirs),
    ("rename_same_inode", rename_same_inode),
    ("rename_noreplace", rename_noreplace),
    ("rename_exchange", rename_exchange),
    ("symlink", symlink_case),
    ("hardlink", hardlink),
    ("many_files", many_files),
];

fn readdir_many(cx: &mut Ctx) {
    cx.setup("mkdir", mkdir(&cx.p("d"), 0o755));
    for i in 0..300 {
        let kind = ["file", "dir", "link", "fifo", "sock", "file2"][i % 6];
        let name = format!("d/e{i:03}_{kind}");
        let p = cx.p(&name);
        let r = match kind {
            "file" | "file2" => write_file(&p, &vec![b'a'; i]),
            "dir" => mkdir(&p, 0o755),
            "link" => symlink(format!("e{:03}_file", i - 2).as_bytes(), &p),
            "fifo" => mkfifo(&p, 0o644),
            _ => mknod(&p, libc::S_IFSOCK | 0o644, 0),
        };
        cx.setup(&name, r);
    }
    let Some(list) = cx.setup("list", list_dir(&cx.p("d"))) else {
        return;
    };
    cx.o(format!("count = {}", list.len()));
    for (n, t) in &list {
        cx.o(format!("{} {}", esc(n), dtype_name(*t)));
    }
    // d_type agrees with lstat for every entry
    let mut mismatches = 0;
    let mut total_size = 0i64;
    for (n, t) in &list {
        let p = cx.pb(&[b"d/".as_slice(), n].concat());
        match lstat(&p) {
            Ok(st) => {
                if dtype_name(*t) != ftype(st.st_mode) {
                    mismatches += 1;
                }
                if st.st_mode & libc::S_IFMT == libc::S_IFREG {
                    total_size += st.st_size;
                }
            }
            Err(_) => mismatches += 1,
        }
    }
    cx.o(format!("d_type/lstat mismatches = {mismatches}"));
    cx.o(format!("total regular file size = {total_size}"));
    // a second listing gives the same result
    let again = list_dir(&cx.p("d"));
    cx.o(format!(
        "second listing identical: {}",
        again.map(|a| a == list).unwrap_or(false)
    ));
    // raw order contains no duplicates and exactly . and ..
    if let Ok(mut d) = Dir::open(&cx.p("d")) {
        let mut names = Vec::new();
        while let Ok(Some((n, _))) = d.next() {
            names.push(n);
        }
        let total = names.len();
        names.sort();
        names.dedup();
        cx.o(format!(
            "raw readdir entries = {total}, unique = {}, has . and ..: {}",
            names.len(),
            names.iter().any(|n| n == b".") && names.iter().any(|n| n == b"..")
        ));
    }
}

fn readdir_seek(cx: &mut Ctx) {
    cx.setup("mkdir", mkdir(&cx.p("d"), 0o755));
    for i in 0..60 {
        cx.put(&format!("d/n{i:02}"), b"");
    }
    let Some(mut d) = cx.setup("opendir", Dir::open(&cx.p("d"))) else {
        return;
    };
    let mut first = Vec::new();
    for _ in 0..25 {
        if let Ok(Some((n, _))) = d.next() {
            first.push(n);
        }
    }
    let pos = d.tell();
    let mut rest = Vec::new();
    while let Ok(Some((n, _))) = d.next() {
        rest.push(n);
    }
    cx.o(format!(
        "first part = {}, rest = {}, total = {}",
        first.len(),
        rest.len(),
        first.len() + rest.len()
    ));
    d.seek(pos);
    let mut rest2 = Vec::new();
    while let Ok(Some((n, _))) = d.next() {
        rest2.push(n);
    }
    cx.o(format!(
        "rest after seekdir(telldir) identical: {}",
        rest == rest2
    ));
    d.rewind();
    let mut all = Vec::new();
    while let Ok(Some((n, _))) = d.next() {
        all.push(n);
    }
    let mut expected = first.clone();
    expected.extend(rest.iter().cloned());
    cx.o(format!("after rewinddir identical: {}", all == expected));
    let mut sorted = all.clone();
    sorted.sort();
    sorted.dedup();
    cx.o(format!("unique entries incl . and .. = {}", sorted.len()));
}

fn readdir_after_changes(cx: &mut Ctx) {
    cx.setup("mkdir", mkdir(&cx.p("d"), 0o755));
    for n in ["a", "b", "c", "d", "e"] {
        cx.put(&format!("d/{n}"), n.as_bytes());
    }
    cx.listing("d");
    // keep a stream open across changes; rewinddir must show the new state
    let mut stream = Dir::open(&cx.p("d")).ok();
    if let Some(s) = stream.as_mut() {
        let _ = s.next();
    }
    cx.ok("unlink(d/b)", unlink(&cx.p("d/b")));
    cx.ok("rename(d/c, d/z)", rename(&cx.p("d/c"), &cx.p("d/z")));
    cx.ok("mkdir(d/f)", mkdir(&cx.p("d/f"), 0o755));
    cx.ok("symlink(a, d/g)", symlink(b"a", &cx.p("d/g")));
    cx.ok("rename(d/e, d/f/e)", rename(&cx.p("d/e"), &cx.p("d/f/e")));
    cx.listing("d");
    cx.listing("d/f");
    if let Some(s) = stream.as_mut() {
        s.rewind();
        let mut v = Vec::new();
        while let Ok(Some((n, t))) = s.next() {
            if n != b"." && n != b".." {
                v.push(format!("{}:{}", esc(&n), dtype_name(t)));
            }
        }
        v.sort();
        cx.o(format!("old stream after rewinddir = [{}]", v.join(", ")));
    }
    cx.ok("unlink(d/a)", unlink(&cx.p("d/a")));
    cx.ok("unlink(d/d)", unlink(&cx.p("d/d")));
    cx.ok("unlink(d/z)", unlink(&cx.p("d/z")));
    cx.ok("unlink(d/g)", unlink(&cx.p("d/g")));
    cx.ok("unlink(d/f/e)", unlink(&cx.p("d/f/e")));
    cx.ok("rmdir(d/f)", rmdir(&cx.p("d/f")));
    cx.listing("d");
    cx.ok("rmdir(d)", rmdir(&cx.p("d")));
    cx.listing("");
}

fn readdir_long_names(cx: &mut Ctx) {
    cx.setup("mkdir", mkdir(&cx.p("d"), 0o755));
    let mut names = Vec::new();
    for (i, len) in [100usize, 200, 254, 255].into_iter().enumerate() {
        let c = (b'a' + i as u8) as char;
        let name: String = std::iter::repeat_n(c, len).collect();
        names.push(name);
    }
    for (i, n) in names.iter().enumerate() {
        let p = cx.p(&format!("d/{n}"));
        let r = if i % 2 == 0 {
            write_file(&p, n.as_bytes())
        } else {
            mkdir(&p, 0o755)
        };
        cx.ok(&format!("create name len {}", n.len()), r);
    }
    // a 255-byte symlink name with a long target
    let lname: String = std::iter::repeat_n('z', 255).collect();
    let r = symlink(names[3].as_bytes(), &cx.p(&format!("d/{lname}")));
    cx.ok("symlink(255-byte target, 255-byte name)", r);
    if let Some(list) = cx.setup("list", list_dir(&cx.p("d"))) {
        for (n, t) in &list {
            cx.o(format!(
                "entry len={} first={} type={}",
                n.len(),
                n[0] as char,
                dtype_name(*t)
            ));
        }
    }
    for n in &names {
        let r = lstat(&cx.p(&format!("d/{n}")));
        cx.val(
            &format!("lstat(name len {})", n.len()),
            r.map(|s| describe(&s)),
        );
    }
    let r = readlink(&cx.p(&format!("d/{lname}")));
    cx.val(
        "readlink(255-byte name) len",
        r.map(|b| format!("{} equal: {}", b.len(), b == names[3].as_bytes())),
    );
    let r = stat(&cx.p(&format!("d/{lname}")));
    cx.val("stat(through long link)", r.map(|s| describe(&s)));
    // rename long name to another long name
    let n2: String = std::iter::repeat_n('y', 255).collect();
    let r = rename(&cx.p(&format!("d/{}", names[0])), &cx.p(&format!("d/{n2}")));
    cx.ok("rename(100-byte name, 255-byte name)", r);
    let r = read_file(&cx.p(&format!("d/{n2}")));
    cx.val(
        "content(renamed to 255-byte name)",
        r.map(|b| show_bytes(&b)),
    );
}

fn odd_names(cx: &mut Ctx) {
    let names: Vec<&[u8]> = vec![
        b"with space",
        b"new\nline",
        b"tab\there",
        b"back\\slash",
        b"colon:star*?",
        b"quote\"'",
        b"-leading-dash",
        b".hidden",
        b"..double",
        b"...",
        "utf8-\u{e9}\u{e8}-\u{4e2d}\u{6587}-\u{1f600}".as_bytes(),
        b"latin1-\xe9\xff",
        b"\x01ctrl\x7f",
        b"UPPER",
        b"upper",
        b"trailing.",
        b"trailing ",
    ];
    for n in &names {
        let p = cx.pb(n);
        let r = write_file(&p, n);
        cx.ok(&format!("create({})", esc(n)), r);
    }
    cx.listing("");
    for n in &names {
        let r = read_file(&cx.pb(n));
        cx.val(
            &format!("content({})", esc(n)),
            r.map(|b| (b == *n).to_string()),
        );
    }
    // case sensitivity: UPPER and upper are distinct
    cx.same_ino("UPPER", "upper");
    // rename between odd names
    let r = rename(&cx.pb(b"latin1-\xe9\xff"), &cx.pb(b"renamed-\xfe"));
    cx.ok("rename(latin1 name, other binary name)", r);
    let r = mkdir(&cx.pb(b"dir-\xc3\x28"), 0o755);
    cx.ok("mkdir(invalid utf8 name)", r);
    let r = symlink(b"new\nline", &cx.pb(b"link\xff"));
    cx.ok("symlink(to name with newline, binary name)", r);
    let r = read_file(&cx.pb(b"link\xff"));
    cx.val("content(link\\xff)", r.map(|b| show_bytes(&b)));
    cx.listing("");
}

fn name_too_long(cx: &mut Ctx) {
    let n255: String = std::iter::repeat_n('a', 255).collect();
    let n256: String = std::iter::repeat_n('b', 256).collect();
    let r = open(&cx.p(&n256), libc::O_CREAT | libc::O_WRONLY, 0o644);
    cx.ok("open(256-byte name, O_CREAT)", r);
    let r = stat(&cx.p(&n256));
    cx.ok("stat(256-byte name)", r);
    let r = lstat(&cx.p(&n256));
    cx.ok("lstat(256-byte name)", r);
    let r = mkdir(&cx.p(&n256), 0o755);
    cx.ok("mkdir(256-byte name)", r);
    let r = symlink(b"x", &cx.p(&n256));
    cx.ok("symlink(x, 256-byte name)", r);
    let r = mknod(&cx.p(&n256), libc::S_IFIFO | 0o644, 0);
    cx.ok("mknod(256-byte name)", r);
    let r = unlink(&cx.p(&n256));
    cx.ok("unlink(256-byte name)", r);
    let r = open(&cx.p(&n255), libc::O_CREAT | libc::O_WRONLY, 0o644);
    cx.ok("open(255-byte name, O_CREAT)", r);
    let r = stat(&cx.p(&n255));
    cx.val("stat(255-byte name)", r.map(|s| describe(&s)));
    let r = rename(&cx.p(&n255), &cx.p(&n256));
    cx.ok("rename(255-byte name, 256-byte name)", r);
    let r = link(&cx.p(&n255), &cx.p(&n256));
    cx.ok("link(255-byte name, 256-byte name)", r);
    let r = setxattr(&cx.p(&n256), "user.x", b"v", 0);
    cx.ok("setxattr(256-byte name)", r);
    // a 256-byte component in the middle of a path
    let r = stat(&cx.p(&format!("{n256}/x")));
    cx.ok("stat(256-byte dir component/x)", r);
    cx.listing("");
    // a path longer than PATH_MAX
    let long: String = std::iter::repeat_n("a/", 2100).collect();
    let r = stat(&cx.p(&long));
    cx.ok("stat(path > PATH_MAX)", r);
}

fn mkdir_case(cx: &mut Ctx) {
    for (n, m) in [
        ("d777", 0o777),
        ("d700", 0o700),
        ("d1777", 0o1777),
        ("d2777", 0o2777),
        ("d4777", 0o4777),
        ("d000", 0o000),
    ] {
        let r = mkdir(&cx.p(n), m);
        cx.ok(&format!("mkdir({n}, {m:04o})"), r);
        cx.stat(n);
    }
    cx.listing("d777");
    let r = mkdir(&cx.p("d777"), 0o755);
    cx.ok("mkdir(existing dir)", r);
    cx.put("f", b"");
    let r = mkdir(&cx.p("f"), 0o755);
    cx.ok("mkdir(existing file)", r);
    let r = mkdir(&cx.p("missing/x"), 0o755);
    cx.ok("mkdir(missing/x)", r);
    let r = mkdir(&cx.p("f/x"), 0o755);
    cx.ok("mkdir(f/x)", r);
    cx.setup("symlink", symlink(b"nowhere", &cx.p("dangling")));
    let r = mkdir(&cx.p("dangling"), 0o755);
    cx.ok("mkdir(dangling symlink)", r);
    cx.setup("symlink", symlink(b"d777", &cx.p("sl_d")));
    let r = mkdir(&cx.p("sl_d"), 0o755);
    cx.ok("mkdir(symlink to dir)", r);
    let r = mkdir(&cx.p("sl_d/inner"), 0o755);
    cx.ok("mkdir(sl_d/inner)", r);
    cx.stat("d777/inner");
    let r = mkdir(&cx.p("trailing/"), 0o755);
    cx.ok("mkdir(trailing/)", r);
    cx.stat("trailing");
    let r = mkdir(&cx.p("d000/sub"), 0o755);
    cx.ok("mkdir(d000/sub) as root", r);
    // deep nesting
    let mut path = String::from("deep");
    let mut ok = 0;
    for _ in 0..30 {
        if mkdir(&cx.p(&path), 0o755).is_ok() {
            ok += 1;
        }
        path.push_str("/x");
    }
    cx.o(format!("nested mkdirs ok = {ok}"));
    cx.stat(&path[..path.len() - 2]);
}

fn setgid_dir(cx: &mut Ctx) {
    cx.setup("mkdir", mkdir(&cx.p("d"), 0o755));
    cx.ok("chown(d, 0, 1234)", chown(&cx.p("d"), 0, 1234));
    cx.ok("chmod(d, 02775)", chmod(&cx.p("d"), 0o2775));
    cx.stat("d");
    cx.put("d/f", b"x");
    cx.stat("d/f");
    let r = mkdir(&cx.p("d/sub"), 0o755);
    cx.ok("mkdir(d/sub)", r);
    cx.stat("d/sub");
    let r = mkfifo(&cx.p("d/fifo"), 0o644);
    cx.ok("mkfifo(d/fifo)", r);
    cx.stat("d/fifo");
    let r = symlink(b"f", &cx.p("d/sl"));
    cx.ok("symlink(f, d/sl)", r);
    cx.lstat("d/sl");
    let r = open(&cx.p("d/sgidfile"), libc::O_CREAT | libc::O_WRONLY, 0o2755);
    cx.ok("open(d/sgidfile, O_CREAT, 02755)", r);
    cx.stat("d/sgidfile");
    cx.put("d/sub/deeper", b"y");
    cx.stat("d/sub/deeper");
    // a file moved into the dir keeps its gid
    cx.put("outside", b"z");
    cx.ok(
        "rename(outside, d/moved)",
        rename(&cx.p("outside"), &cx.p("d/moved")),
    );
    cx.stat("d/moved");
}

fn dir_nlink(cx: &mut Ctx) {
    cx.setup("mkdir", mkdir(&cx.p("a"), 0o755));
    cx.setup("mkdir", mkdir(&cx.p("b"), 0o755));
    cx.stat("a");
    for s in ["a/1", "a/2", "a/3"] {
        cx.ok(&format!("mkdir({s})"), mkdir(&cx.p(s), 0o755));
        cx.stat("a");
    }
    cx.put("a/file", b"");
    cx.stat("a");
    cx.ok("rename(a/1, b/1)", rename(&cx.p("a/1"), &cx.p("b/1")));
    cx.stat("a");
    cx.stat("b");
    cx.ok("rmdir(a/2)", rmdir(&cx.p("a/2")));
    cx.stat("a");
    cx.ok(
        "rename(a/3, b/1) over empty dir",
        rename(&cx.p("a/3"), &cx.p("b/1")),
    );
    cx.stat("a");
    cx.stat("b");
    cx.stat("b/1");
    cx.stat("");
}

fn mknod_case(cx: &mut Ctx) {
    let r = mkfifo(&cx.p("fifo"), 0o666);
    cx.ok("mkfifo(fifo, 0666)", r);
    cx.lstat("fifo");
    let r = mknod(&cx.p("fifo2"), libc::S_IFIFO | 0o600, 0);
    cx.ok("mknod(fifo2, S_IFIFO|0600)", r);
    cx.lstat("fifo2");
    let r = mknod(&cx.p("sock"), libc::S_IFSOCK | 0o640, 0);
    cx.ok("mknod(sock, S_IFSOCK|0640)", r);
    cx.lstat("sock");
    let r = mknod(&cx.p("reg"), libc::S_IFREG | 0o600, 0);
    cx.ok("mknod(reg, S_IFREG|0600)", r);
    cx.lstat("reg");
    let r = mknod(&cx.p("fifo"), libc::S_IFIFO | 0o600, 0);
    cx.ok("mknod(existing)", r);
    let r = mknod(&cx.p("missing/x"), libc::S_IFIFO | 0o600, 0);
    cx.ok("mknod(missing/x)", r);
    let r = mknod(&cx.p("dir"), libc::S_IFDIR | 0o755, 0);
    cx.ok("mknod(dir, S_IFDIR)", r);
    cx.listing("");
    // a FIFO works as a pipe (handled by the kernel, not the file system)
    if let Some(fd) = cx.ok(
        "open(fifo, O_RDWR|O_NONBLOCK)",
        open(&cx.p("fifo"), libc::O_RDWR | libc::O_NONBLOCK, 0),
    ) {
        cx.val("write(fifo, ping)", write(&fd, b"ping"));
        cx.val("read(fifo)", read(&fd, 100).map(|b| show_bytes(&b)));
        cx.val("read(empty fifo)", read(&fd, 100).map(|b| show_bytes(&b)));
        cx.fstat("fifo", &fd);
    }
    // opening a socket file fails with ENXIO
    let r = open(&cx.p("sock"), libc::O_RDONLY, 0);
    cx.ok("open(sock)", r);
    // a real bound unix socket
    let sp = cx.p("bound.sock");
    match std::os::unix::net::UnixListener::bind(&sp) {
        Ok(l) => {
            cx.o("bind(bound.sock) = ok");
            cx.lstat("bound.sock");
            match std::os::unix::net::UnixStream::connect(&sp) {
                Ok(mut s) => {
                    use std::io::{Read, Write};
                    let _ = s.write_all(b"hello");
                    let got = l.accept().ok().map(|(mut c, _)| {
                        let mut b = [0u8; 5];
                        let _ = c.read_exact(&mut b);
                        b.to_vec()
                    });
                    cx.o(format!(
                        "connect+accept+transfer: {:?}",
                        got.map(|b| show_bytes(&b))
                    ));
                }
                Err(e) => cx.o(format!("connect(bound.sock) = {}", from_io(&e))),
            }
        }
        Err(e) => cx.o(format!("bind(bound.sock) = {}", from_io(&e))),
    }
    cx.ok("unlink(fifo)", unlink(&cx.p("fifo")));
    cx.ok("unlink(sock)", unlink(&cx.p("sock")));
    cx.ok("unlink(bound.sock)", unlink(&cx.p("bound.sock")));
    cx.listing("");
}

fn mknod_chardev(cx: &mut Ctx) {
    let dev = libc::makedev(1, 3);
    let r = mknod(&cx.p("null"), libc::S_IFCHR | 0o666, dev);
    cx.ok("mknod(null, S_IFCHR|0666, 1:3)", r);
    if let Some(st) = cx.lstat("null") {
        cx.o(format!(
            "rdev = {}:{}",
            libc::major(st.st_rdev),
            libc::minor(st.st_rdev)
        ));
    }
    let r = mknod(&cx.p("blk"), libc::S_IFBLK | 0o600, libc::makedev(7, 200));
    cx.ok("mknod(blk, S_IFBLK|0600, 7:200)", r);
    if let Some(st) = cx.lstat("blk") {
        cx.o(format!(
            "rdev = {}:{}",
            libc::major(st.st_rdev),
            libc::minor(st.st_rdev)
        ));
    }
    cx.listing("");
    cx.ok("unlink(null)", unlink(&cx.p("null")));
    cx.ok("unlink(blk)", unlink(&cx.p("blk")));
}

fn unlink_case(cx: &mut Ctx) {
    cx.put("f", b"x");
    cx.setup("mkdir", mkdir(&cx.p("d"), 0o755));
    cx.put("target", b"t");
    cx.setup("symlink", symlink(b"target", &cx.p("sl")));
    cx.setup("symlink", symlink(b"d", &cx.p("sl_d")));
    cx.ok("unlink(f)", unlink(&cx.p("f")));
    cx.ok("stat(f) after unlink", stat(&cx.p("f")));
    cx.ok("unlink(f) again", unlink(&cx.p("f")));
    cx.ok("unlink(missing)", unlink(&cx.p("missing")));
    cx.ok("unlink(d)", unlink(&cx.p("d")));
    cx.ok("unlink(d/)", unlink(&cx.p("d/")));
    cx.ok("unlink(target/x)", unlink(&cx.p("target/x")));
    cx.ok("unlink(missing/x)", unlink(&cx.p("missing/x")));
    cx.ok("unlink(sl)", unlink(&cx.p("sl")));
    cx.stat("target");
    cx.ok("unlink(sl_d/)", unlink(&cx.p("sl_d/")));
    cx.ok("unlink(sl_d)", unlink(&cx.p("sl_d")));
    cx.stat("d");
    cx.ok("unlinkat(d, AT_REMOVEDIR)", unlinkat_dir(&cx.p("d")));
    cx.ok(
        "unlinkat(target, AT_REMOVEDIR)",
        unlinkat_dir(&cx.p("target")),
    );
    cx.listing("");
    // unlink in a read-only (0555) dir as root works
    cx.setup("mkdir", mkdir(&cx.p("ro"), 0o755));
    cx.put("ro/f", b"");
    cx.setup("chmod", chmod(&cx.p("ro"), 0o555));
    cx.ok("unlink(ro/f) as root", unlink(&cx.p("ro/f")));
}

fn rmdir_case(cx: &mut Ctx) {
    cx.setup("mkdir", mkdir(&cx.p("d"), 0o755));
    cx.put("d/f", b"");
    cx.setup("mkdir", mkdir(&cx.p("e"), 0o755));
    cx.setup("mkdir", mkdir(&cx.p("e/sub"), 0o755));
    cx.put("f", b"");
    cx.setup("symlink", symlink(b"e", &cx.p("sl_e")));
    cx.ok("rmdir(d) non-empty", rmdir(&cx.p("d")));
    cx.ok("rmdir(f)", rmdir(&cx.p("f")));
    cx.ok("rmdir(missing)", rmdir(&cx.p("missing")));
    cx.ok("rmdir(.)", rmdir(&cx.p(".")));
    cx.ok("rmdir(e/sub/.)", rmdir(&cx.p("e/sub/.")));
    cx.ok("rmdir(e/sub/..)", rmdir(&cx.p("e/sub/..")));
    cx.ok("rmdir(sl_e)", rmdir(&cx.p("sl_e")));
    cx.ok("rmdir(sl_e/)", rmdir(&cx.p("sl_e/")));
    cx.ok("rmdir(e) with subdir", rmdir(&cx.p("e")));
    cx.ok("rmdir(e/sub/)", rmdir(&cx.p("e/sub/")));
    cx.ok("rmdir(e)", rmdir(&cx.p("e")));
    cx.ok("unlink(d/f)", unlink(&cx.p("d/f")));
    cx.ok("rmdir(d)", rmdir(&cx.p("d")));
    cx.ok("stat(d) after rmdir", stat(&cx.p("d")));
    cx.ok("mkdir(d) again", mkdir(&cx.p("d"), 0o755));
    cx.listing("d");
    // a dir containing only a hidden file or a fifo is not empty
    cx.put("d/.hidden", b"");
    cx.ok("rmdir(d) with .hidden", rmdir(&cx.p("d")));
    cx.listing("");
}

fn rename_basic(cx: &mut Ctx) {
    cx.put("a", b"content-a");
    cx.put("b", b"content-b");
    cx.ok("rename(a, b)", rename(&cx.p("a"), &cx.p("b")));
    cx.ok("stat(a) after", stat(&cx.p("a")));
    cx.content("b");
    cx.ok("rename(b, c)", rename(&cx.p("b"), &cx.p("c")));
    cx.listing("");
    cx.ok("rename(missing, x)", rename(&cx.p("missing"), &cx.p("x")));
    cx.ok(
        "rename(c, missing/x)",
        rename(&cx.p("c"), &cx.p("missing/x")),
    );
    cx.ok("rename(c, c)", rename(&cx.p("c"), &cx.p("c")));
    cx.content("c");
    cx.setup("mkdir", mkdir(&cx.p("d"), 0o755));
    cx.ok("rename(c, d) file over dir", rename(&cx.p("c"), &cx.p("d")));
    cx.ok("rename(d, c) dir over file", rename(&cx.p("d"), &cx.p("c")));
    cx.ok("rename(c, d/c) into dir", rename(&cx.p("c"), &cx.p("d/c")));
    cx.content("d/c");
    cx.ok(
        "rename(d/c, c/) trailing slash",
        rename(&cx.p("d/c"), &cx.p("c/")),
    );
    cx.ok("rename(d/c, d/c/x)", rename(&cx.p("d/c"), &cx.p("d/c/x")));
    // symlinks are renamed, not followed
    cx.setup("symlink", symlink(b"d/c", &cx.p("sl")));
    cx.ok("rename(sl, sl2)", rename(&cx.p("sl"), &cx.p("sl2")));
    cx.lstat("sl2");
    cx.content("sl2");
    cx.put("e", b"eee");
    cx.ok(
        "rename(e, sl2) over symlink",
        rename(&cx.p("e"), &cx.p("sl2")),
    );
    cx.lstat("sl2");
    cx.content("d/c");
    // inode stays the same across rename
    let before = stat(&cx.p("d/c")).map(|s| s.st_ino);
    cx.ok("rename(d/c, moved)", rename(&cx.p("d/c"), &cx.p("moved")));
    let after = stat(&cx.p("moved")).map(|s| s.st_ino);
    cx.o(format!(
        "ino preserved across rename: {}",
        before.is_ok() && before == after
    ));
    // replaced target's old inode is gone from the name
    cx.put("x", b"x");
    cx.put("y", b"y");
    let yino = stat(&cx.p("y")).map(|s| s.st_ino);
    let xino = stat(&cx.p("x")).map(|s| s.st_ino);
    cx.ok("rename(x, y)", rename(&cx.p("x"), &cx.p("y")));
    let now_ino = stat(&cx.p("y")).map(|s| s.st_ino);
    cx.o(format!(
        "y now has x's ino: {}, not old y's: {}",
        now_ino == xino,
        now_ino != yino
    ));
    cx.listing("");
    cx.listing("d");
}

fn rename_dirs(cx: &mut Ctx) {
    for d in ["src", "src/inner", "empty", "full", "full/keep", "other"] {
        cx.setup("mkdir", mkdir(&cx.p(d), 0o755));
    }
    cx.put("src/inner/file", b"deep");
    cx.put("afile", b"");
    cx.ok(
        "rename(src, full) over non-empty dir",
        rename(&cx.p("src"), &cx.p("full")),
    );
    cx.ok(
        "rename(src, afile) dir over file",
        rename(&cx.p("src"), &cx.p("afile")),
    );
    cx.ok(
        "rename(src, src/inner/x) into own subdir",
        rename(&cx.p("src"), &cx.p("src/inner/x")),
    );
    cx.ok(
        "rename(src, src/x) into itself",
        rename(&cx.p("src"), &cx.p("src/x")),
    );
    cx.ok(
        "rename(src/inner, src) onto ancestor",
        rename(&cx.p("src/inner"), &cx.p("src")),
    );
    cx.ok(
        "rename(src, empty) over empty dir",
        rename(&cx.p("src"), &cx.p("empty")),
    );
    cx.content("empty/inner/file");
    cx.ok("stat(src) after", stat(&cx.p("src")));
    cx.ok(
        "rename(empty, other/moved) across parents",
        rename(&cx.p("empty"), &cx.p("other/moved")),
    );
    cx.content("other/moved/inner/file");
    cx.same_ino("other/moved/inner/../..", "other");
    cx.ok(
        "rename(other/moved/, renamed/) trailing slashes",
        rename(&cx.p("other/moved/"), &cx.p("renamed/")),
    );
    cx.listing("");
    cx.listing("renamed");
    cx.stat("renamed");
    cx.stat("other");
    cx.ok(
        "rename(renamed, renamed/inner/..)",
        rename(&cx.p("renamed"), &cx.p("renamed/inner/..")),
    );
}

fn rename_same_inode(cx: &mut Ctx) {
    // rename between two hard links of the same inode is a successful no-op
    cx.put("a", b"data");
    cx.setup("link", link(&cx.p("a"), &cx.p("b")));
    cx.ok("rename(a, b) same inode", rename(&cx.p("a"), &cx.p("b")));
    cx.listing("");
    cx.stat("a");
    cx.stat("b");
    let r = renameat2(&cx.p("a"), &cx.p("b"), libc::RENAME_NOREPLACE);
    cx.ok("renameat2(a, b, NOREPLACE) same inode", r);
    let r = renameat2(&cx.p("a"), &cx.p("b"), libc::RENAME_EXCHANGE);
    cx.ok("renameat2(a, b, EXCHANGE) same inode", r);
    cx.listing("");
}

fn rename_noreplace(cx: &mut Ctx) {
    cx.put("a", b"A");
    cx.put("b", b"B");
    let r = renameat2(&cx.p("a"), &cx.p("b"), libc::RENAME_NOREPLACE);
    cx.ok("renameat2(a, b, NOREPLACE)", r);
    cx.content("a");
    cx.content("b");
    let r = renameat2(&cx.p("a"), &cx.p("c"), libc::RENAME_NOREPLACE);
    cx.ok("renameat2(a, c, NOREPLACE)", r);
    cx.listing("");
    cx.content("c");
    cx.setup("mkdir", mkdir(&cx.p("d"), 0o755));
    cx.setup("mkdir", mkdir(&cx.p("e"), 0o755));
    let r = renameat2(&cx.p("d"), &cx.p("e"), libc::RENAME_NOREPLACE);
    cx.ok("renameat2(d, e, NOREPLACE) onto empty dir", r);
    let r = renameat2(&cx.p("d"), &cx.p("e/d"), libc::RENAME_NOREPLACE);
    cx.ok("renameat2(d, e/d, NOREPLACE)", r);
    cx.setup("symlink", symlink(b"nowhere", &cx.p("dangling")));
    let r = renameat2(&cx.p("c"), &cx.p("dangling"), libc::RENAME_NOREPLACE);
    cx.ok("renameat2(c, dangling symlink, NOREPLACE)", r);
    let r = renameat2(&cx.p("missing"), &cx.p("x"), libc::RENAME_NOREPLACE);
    cx.ok("renameat2(missing, x, NOREPLACE)", r);
    let r = renameat2(&cx.p("c"), &cx.p("c2"), 0x80);
    cx.ok("renameat2(c, c2, invalid flag)", r);
    cx.listing("");
    cx.listing("e");
}

fn rename_exchange(cx: &mut Ctx) {
    let ex = libc::RENAME_EXCHANGE;
    cx.put("f", b"file-content");
    cx.setup("mkdir", mkdir(&cx.p("d"), 0o755));
    cx.put("d/child", b"child-content");
    let fino = lstat(&cx.p("f")).map(|s| s.st_ino);
    let dino = lstat(&cx.p("d")).map(|s| s.st_ino);
    cx.ok(
        "renameat2(f, d, EXCHANGE)",
        renameat2(&cx.p("f"), &cx.p("d"), ex),
    );
    cx.lstat("f");
    cx.lstat("d");
    cx.content("d");
    cx.content("f/child");
    cx.listing("");
    cx.listing("f");
    cx.o(format!(
        "inodes swapped: {}",
        lstat(&cx.p("f")).map(|s| s.st_ino) == dino
            && lstat(&cx.p("d")).map(|s| s.st_ino) == fino
            && fino.is_ok()
    ));
    // swap back
    cx.ok(
        "renameat2(f, d, EXCHANGE) back",
        renameat2(&cx.p("f"), &cx.p("d"), ex),
    );
    cx.content("f");
    cx.content("d/child");
    // two files in different directories
    cx.setup("mkdir", mkdir(&cx.p("other"), 0o755));
    cx.put("other/g", b"g-content");
    cx.ok(
        "renameat2(f, other/g, EXCHANGE)",
        renameat2(&cx.p("f"), &cx.p("other/g"), ex),
    );
    cx.content("f");
    cx.content("other/g");
    // a dir and a file across directories: parent nlink changes
    cx.stat("");
    cx.stat("other");
    cx.ok(
        "renameat2(d, other/g, EXCHANGE)",
        renameat2(&cx.p("d"), &cx.p("other/g"), ex),
    );
    cx.stat("");
    cx.stat("other");
    cx.content("d");
    cx.content("other/g/child");
    cx.same_ino("other/g/..", "other");
    // errors
    let r = renameat2(&cx.p("f"), &cx.p("missing"), ex);
    cx.ok("renameat2(f, missing, EXCHANGE)", r);
    let r = renameat2(&cx.p("missing"), &cx.p("f"), ex);
    cx.ok("renameat2(missing, f, EXCHANGE)", r);
    let r = renameat2(&cx.p("f"), &cx.p("d"), ex | libc::RENAME_NOREPLACE);
    cx.ok("renameat2(f, d, EXCHANGE|NOREPLACE)", r);
    let r = renameat2(&cx.p("other"), &cx.p("other/g"), ex);
    cx.ok("renameat2(other, other/g, EXCHANGE) into own subdir", r);
    let r = renameat2(&cx.p("f"), &cx.p("f"), ex);
    cx.ok("renameat2(f, f, EXCHANGE)", r);
    // symlink <-> file
    cx.setup("symlink", symlink(b"target-text", &cx.p("sl")));
    cx.ok(
        "renameat2(sl, f, EXCHANGE)",
        renameat2(&cx.p("sl"), &cx.p("f"), ex),
    );
    cx.lstat("f");
    cx.val("readlink(f)", readlink(&cx.p("f")).map(|b| show_bytes(&b)));
    cx.content("sl");
    cx.listing("");
    cx.listing("other");
}

fn symlink_case(cx: &mut Ctx) {
    cx.put("target", b"target-content");
    cx.setup("mkdir", mkdir(&cx.p("d"), 0o755));
    cx.ok(
        "symlink(abs)",
        symlink(b"/nonexistent/abs/target", &cx.p("abs")),
    );
    cx.ok("symlink(../target)", symlink(b"../target", &cx.p("d/rel")));
    cx.ok("symlink(target)", symlink(b"target", &cx.p("rel2")));
    let long: Vec<u8> = (0..1000).map(|i| b'a' + (i % 26) as u8).collect();
    cx.ok("symlink(1000-byte target)", symlink(&long, &cx.p("long")));
    let longest: Vec<u8> = (0..4095)
        .map(|i| if i % 2 == 0 { b'x' } else { b'/' })
        .collect();
    cx.ok(
        "symlink(4095-byte target)",
        symlink(&longest, &cx.p("longest")),
    );
    let toolong = vec![b'y'; 4096];
    cx.ok(
        "symlink(4096-byte target)",
        symlink(&toolong, &cx.p("toolong")),
    );
    cx.ok("symlink(empty target)", symlink(b"", &cx.p("empty")));
    cx.ok("symlink(x, existing)", symlink(b"x", &cx.p("target")));
    cx.ok("symlink(x, missing/l)", symlink(b"x", &cx.p("missing/l")));
    for n in ["abs", "d/rel", "rel2"] {
        cx.val(
            &format!("readlink({n})"),
            readlink(&cx.p(n)).map(|b| show_bytes(&b)),
        );
        cx.lstat(n);
    }
    cx.val(
        "readlink(long) equal",
        readlink(&cx.p("long")).map(|b| format!("len={} {}", b.len(), b == long)),
    );
    cx.lstat("long");
    cx.val(
        "readlink(longest) equal",
        readlink(&cx.p("longest")).map(|b| format!("len={} {}", b.len(), b == longest)),
    );
    cx.val(
        "readlink(long, bufsize 10) truncated",
        readlink_buf(&cx.p("long"), 10).map(|b| show_bytes(&b)),
    );
    cx.ok("readlink(target) non-symlink", readlink(&cx.p("target")));
    cx.ok("readlink(d) dir", readlink(&cx.p("d")));
    cx.ok("readlink(missing)", readlink(&cx.p("missing")));
    cx.content("d/rel");
    cx.content("rel2");
    cx.ok("open(abs)", open(&cx.p("abs"), libc::O_RDONLY, 0));
    // loops
    cx.setup("symlink", symlink(b"loop2", &cx.p("loop1")));
    cx.setup("symlink", symlink(b"loop1", &cx.p("loop2")));
    cx.setup("symlink", symlink(b"self", &cx.p("self")));
    cx.ok("open(loop1)", open(&cx.p("loop1"), libc::O_RDONLY, 0));
    cx.ok("stat(self)", stat(&cx.p("self")));
    cx.ok(
        "open(loop1, O_CREAT)",
        open(&cx.p("loop1"), libc::O_CREAT | libc::O_WRONLY, 0o644),
    );
    cx.lstat("loop1");
    // O_NOFOLLOW
    cx.ok(
        "open(rel2, O_NOFOLLOW)",
        open(&cx.p("rel2"), libc::O_RDONLY | libc::O_NOFOLLOW, 0),
    );
    cx.ok(
        "open(target, O_NOFOLLOW)",
        open(&cx.p("target"), libc::O_RDONLY | libc::O_NOFOLLOW, 0),
    );
    cx.ok(
        "open(d/rel, O_NOFOLLOW|O_PATH)",
        open(&cx.p("d/rel"), libc::O_NOFOLLOW | libc::O_PATH, 0),
    );
    // chain of 40 symlinks works, 41 hits ELOOP
    let mut prev = "target".to_string();
    for i in 0..41 {
        let n = format!("chain{i}");
        cx.setup("symlink", symlink(prev.as_bytes(), &cx.p(&n)));
        prev = n;
    }
    cx.ok("stat(chain39) 40 links", stat(&cx.p("chain39")));
    cx.ok("stat(chain40) 41 links", stat(&cx.p("chain40")));
    // symlink to dir used as a path component
    cx.setup("symlink", symlink(b"d", &cx.p("sl_d")));
    cx.put("d/inside", b"in");
    cx.content("sl_d/inside");
    cx.setup("symlink", symlink(b"..", &cx.p("d/up")));
    cx.content("d/up/target");
    cx.ok("unlink(empty)", unlink(&cx.p("empty")));
}

fn hardlink(cx: &mut Ctx) {
    cx.put("a", b"shared");
    let nl = |cx: &mut Ctx, label: &str| {
        let r = stat(&cx.p("a"));
        cx.val(&format!("nlink(a) {label}"), r.map(|s| s.st_nlink));
    };
    nl(cx, "initially");
    cx.ok("link(a, b)", link(&cx.p("a"), &cx.p("b")));
    nl(cx, "after link b");
    cx.setup("mkdir", mkdir(&cx.p("d"), 0o755));
    cx.ok("link(a, d/c)", link(&cx.p("a"), &cx.p("d/c")));
    nl(cx, "after link d/c");
    cx.same_ino("a", "b");
    cx.same_ino("a", "d/c");
    cx.stat("b");
    // write through one name is visible through the others
    if let Some(fd) = cx.setup("open", open(&cx.p("b"), libc::O_WRONLY | libc::O_APPEND, 0)) {
        cx.setup("write", write(&fd, b"+more"));
    }
    cx.content("a");
    cx.content("d/c");
    // metadata is shared
    cx.ok("chmod(b, 0600)", chmod(&cx.p("b"), 0o600));
    cx.mode("a");
    cx.ok("unlink(b)", unlink(&cx.p("b")));
    nl(cx, "after unlink b");
    cx.content("a");
    cx.ok("unlink(a)", unlink(&cx.p("a")));
    let r = stat(&cx.p("d/c"));
    cx.val("nlink(d/c) after unlink a", r.map(|s| s.st_nlink));
    cx.content("d/c");
    // errors
    cx.ok("link(d, e) dir", link(&cx.p("d"), &cx.p("e")));
    cx.put("x", b"x");
    cx.ok("link(x, d/c) existing", link(&cx.p("x"), &cx.p("d/c")));
    cx.ok("link(missing, y)", link(&cx.p("missing"), &cx.p("y")));
    cx.ok("link(x, missing/y)", link(&cx.p("x"), &cx.p("missing/y")));
    cx.ok("link(x, x)", link(&cx.p("x"), &cx.p("x")));
    // link of a symlink links the symlink itself (no AT_SYMLINK_FOLLOW)
    cx.setup("symlink", symlink(b"x", &cx.p("sl")));
    cx.ok("link(sl, sl2)", link(&cx.p("sl"), &cx.p("sl2")));
    cx.lstat("sl2");
    cx.lstat("sl");
    cx.ok(
        "linkat(sl, sl_follow, AT_SYMLINK_FOLLOW)",
        linkat_flags(&cx.p("sl"), &cx.p("sl_follow"), libc::AT_SYMLINK_FOLLOW),
    );
    cx.lstat("sl_follow");
    cx.same_ino("sl_follow", "x");
    // links of special files
    cx.setup("mkfifo", mkfifo(&cx.p("fifo"), 0o644));
    cx.ok("link(fifo, fifo2)", link(&cx.p("fifo"), &cx.p("fifo2")));
    cx.lstat("fifo2");
    cx.listing("");
}

fn many_files(cx: &mut Ctx) {
    const N: usize = 2000;
    cx.setup("mkdir", mkdir(&cx.p("d"), 0o755));
    let mut created = 0;
    let mut expected_size = 0usize;
    for i in 0..N {
        let data = vec![b'0' + (i % 10) as u8; i % 100];
        expected_size += data.len();
        if write_file(&cx.p(&format!("d/file{i:04}")), &data).is_ok() {
            created += 1;
        }
    }
    cx.o(format!(
        "created = {created}, expected total size = {expected_size}"
    ));
    if let Some(list) = cx.ok("list(d)", list_dir(&cx.p("d"))) {
        let all_reg = list.iter().all(|(_, t)| *t == libc::DT_REG);
        let names_ok = list
            .iter()
            .enumerate()
            .all(|(i, (n, _))| n == format!("file{i:04}").as_bytes());
        cx.o(format!(
            "count = {}, all DT_REG: {all_reg}, names exactly file0000..file{:04}: {names_ok}",
            list.len(),
            N - 1
        ));
        let mut stat_ok = 0;
        let mut total = 0i64;
        let mut sizes_ok = 0;
        for (i, (n, _)) in list.iter().enumerate() {
            if let Ok(st) = stat(&cx.pb(&[b"d/".as_slice(), n].concat())) {
                stat_ok += 1;
                total += st.st_size;
                if st.st_size == (i % 100) as i64 {
                    sizes_ok += 1;
                }
            }
        }
        cx.o(format!(
            "stat ok = {stat_ok}, total size = {total}, sizes as written = {sizes_ok}"
        ));
    }
    let mut removed = 0;
    for i in 0..N {
        if unlink(&cx.p(&format!("d/file{i:04}"))).is_ok() {
            removed += 1;
        }
    }
    cx.o(format!("removed = {removed}"));
    cx.val("list(d) after", list_dir(&cx.p("d")).map(|l| l.len()));
    cx.ok("rmdir(d)", rmdir(&cx.p("d")));
}
