//! statfs, xattrs, permission checks as an unprivileged user, exec.

use super::sys::*;
use super::*;

pub(crate) const CASES: &[(&str, CaseFn)] = &[
    ("statfs", statfs),
    ("xattr", xattr),
    ("xattr_dir", xattr_dir),
    ("xattr_special", xattr_special),
    ("eacces_nobody", eacces_nobody),
    ("nobody_create", nobody_create),
    ("sticky_dir", sticky_dir),
    ("write_clears_suid", write_clears_suid),
    ("exec", exec_case),
];

fn statfs(cx: &mut Ctx) {
    let r = statvfs(&cx.p(""));
    if let Some(s) = cx.ok("statvfs(dir)", r) {
        cx.o(format!("f_namemax = {}", s.f_namemax));
        cx.o(format!(
            "f_bsize > 0: {}, f_blocks > 0: {}, bavail <= bfree <= blocks: {}, ffree <= files: {}",
            s.f_bsize > 0,
            s.f_blocks > 0,
            s.f_bavail <= s.f_bfree && s.f_bfree <= s.f_blocks,
            s.f_ffree <= s.f_files
        ));
        cx.o(format!("ST_RDONLY: {}", s.f_flag & libc::ST_RDONLY != 0));
    }
    cx.put("f", b"x");
    let r = statvfs(&cx.p("f"));
    cx.val("statvfs(file) f_namemax", r.map(|s| s.f_namemax));
    if let Some(fd) = cx.setup("open", open(&cx.p("f"), libc::O_RDONLY, 0)) {
        cx.val("fstatvfs(fd) f_namemax", fstatvfs(&fd).map(|s| s.f_namemax));
    }
    let r = statvfs(&cx.p("missing"));
    cx.ok("statvfs(missing)", r);
}

fn show_list(r: Res<(usize, Vec<u8>)>) -> Res<String> {
    r.map(|(n, b)| format!("len={n} names={:?}", split_names(&b)))
}

fn show_val(r: Res<(usize, Vec<u8>)>) -> Res<String> {
    r.map(|(n, b)| format!("len={n} value={}", show_bytes(&b)))
}

fn xattr(cx: &mut Ctx) {
    cx.put("f", b"x");
    let f = cx.p("f");
    cx.val(
        "listxattr(f, size 0) initially",
        listxattr_raw(&f, 0).map(|x| x.0),
    );
    cx.val("listxattr(f) initially", show_list(listxattr_raw(&f, 4096)));
    cx.ok(
        "setxattr(user.b, text)",
        setxattr(&f, "user.b", b"value-b", 0),
    );
    cx.ok(
        "setxattr(user.a, binary)",
        setxattr(&f, "user.a", b"\x00\x01\x02\xff\x00bin\n", 0),
    );
    cx.ok(
        "setxattr(user.empty, 0 bytes)",
        setxattr(&f, "user.empty", b"", 0),
    );
    cx.ok("setxattr(user.c, c)", setxattr(&f, "user.c", b"c", 0));
    for n in ["user.a", "user.b", "user.empty", "user.c"] {
        cx.val(&format!("getxattr({n})"), show_val(getxattr(&f, n, 1024)));
        cx.val(
            &format!("getxattr({n}, size 0)"),
            getxattr(&f, n, 0).map(|x| x.0),
        );
    }
    cx.val("listxattr(f)", show_list(listxattr_raw(&f, 4096)));
    cx.val("listxattr(f, size 0)", listxattr_raw(&f, 0).map(|x| x.0));
    cx.val(
        "listxattr(f, size 3) too small",
        show_list(listxattr_raw(&f, 3)),
    );
    cx.val(
        "getxattr(user.b, size 3) too small",
        show_val(getxattr(&f, "user.b", 3)),
    );
    cx.val(
        "getxattr(user.b, exact size 7)",
        show_val(getxattr(&f, "user.b", 7)),
    );
    cx.val(
        "getxattr(user.missing)",
        show_val(getxattr(&f, "user.missing", 100)),
    );
    cx.val(
        "getxattr(user.missing, size 0)",
        getxattr(&f, "user.missing", 0).map(|x| x.0),
    );
    cx.ok(
        "setxattr(user.b, XATTR_CREATE) existing",
        setxattr(&f, "user.b", b"new", libc::XATTR_CREATE),
    );
    cx.ok(
        "setxattr(user.new, XATTR_REPLACE) missing",
        setxattr(&f, "user.new", b"new", libc::XATTR_REPLACE),
    );
    cx.ok(
        "setxattr(user.b, XATTR_REPLACE) existing",
        setxattr(&f, "user.b", b"replaced", libc::XATTR_REPLACE),
    );
    cx.val("getxattr(user.b)", show_val(getxattr(&f, "user.b", 100)));
    cx.ok(
        "setxattr(user.d, XATTR_CREATE) new",
        setxattr(&f, "user.d", b"d", libc::XATTR_CREATE),
    );
    cx.ok(
        "setxattr(user.d, CREATE|REPLACE)",
        setxattr(&f, "user.d", b"d", libc::XATTR_CREATE | libc::XATTR_REPLACE),
    );
    cx.ok("setxattr(user.d, flags 4)", setxattr(&f, "user.d", b"d", 4));
    // overwrite with a shorter and a longer value
    cx.ok(
        "setxattr(user.c, longer)",
        setxattr(&f, "user.c", &[b'L'; 300], 0),
    );
    cx.val("getxattr(user.c)", show_val(getxattr(&f, "user.c", 1000)));
    cx.ok("setxattr(user.c, shorter)", setxattr(&f, "user.c", b"s", 0));
    cx.val("getxattr(user.c)", show_val(getxattr(&f, "user.c", 1000)));
    // remove
    cx.ok("removexattr(user.a)", removexattr(&f, "user.a"));
    cx.val(
        "getxattr(user.a) after remove",
        show_val(getxattr(&f, "user.a", 100)),
    );
    cx.ok("removexattr(user.a) again", removexattr(&f, "user.a"));
    cx.ok("removexattr(user.never)", removexattr(&f, "user.never"));
    cx.val("listxattr(f)", show_list(listxattr_raw(&f, 4096)));
    // large value
    let big = pattern(3000, 11);
    cx.ok(
        "setxattr(user.big, 3000 bytes)",
        setxattr(&f, "user.big", &big, 0),
    );
    cx.val(
        "getxattr(user.big) equal",
        getxattr(&f, "user.big", 65536).map(|(n, b)| format!("len={n} equal={}", b == big)),
    );
    let huge = vec![0u8; 65537];
    cx.ok(
        "setxattr(user.huge, 65537 bytes)",
        setxattr(&f, "user.huge", &huge, 0),
    );
    // names
    let long_ok = format!("user.{}", "n".repeat(250));
    let too_long = format!("user.{}", "n".repeat(251));
    cx.ok("setxattr(255-byte name)", setxattr(&f, &long_ok, b"v", 0));
    cx.val(
        "getxattr(255-byte name)",
        show_val(getxattr(&f, &long_ok, 10)),
    );
    cx.ok("setxattr(256-byte name)", setxattr(&f, &too_long, b"v", 0));
    cx.ok("getxattr(256-byte name)", getxattr(&f, &too_long, 10));
    cx.ok("setxattr(name 'user.')", setxattr(&f, "user.", b"v", 0));
    cx.ok("setxattr(name '')", setxattr(&f, "", b"v", 0));
    cx.ok(
        "setxattr(unknown namespace)",
        setxattr(&f, "foo.bar", b"v", 0),
    );
    cx.ok("getxattr(unknown namespace)", getxattr(&f, "foo.bar", 10));
    cx.ok(
        "setxattr(user.with space/and:colon)",
        setxattr(&f, "user.with space/and:colon", b"odd", 0),
    );
    cx.val("listxattr(f)", show_list(listxattr_raw(&f, 65536)));
    // fd-based
    if let Some(fd) = cx.setup("open", open(&f, libc::O_RDONLY, 0)) {
        cx.ok(
            "fsetxattr(user.viafd)",
            fsetxattr(&fd, "user.viafd", b"fdval", 0),
        );
        cx.val(
            "fgetxattr(user.viafd)",
            show_val(fgetxattr(&fd, "user.viafd", 100)),
        );
        cx.ok("fremovexattr(user.viafd)", fremovexattr(&fd, "user.viafd"));
        cx.val(
            "fgetxattr(user.viafd)",
            show_val(fgetxattr(&fd, "user.viafd", 100)),
        );
    }
    // xattrs move with rename and are shared by hard links
    cx.ok("rename(f, g)", rename(&f, &cx.p("g")));
    cx.val(
        "getxattr(g, user.b)",
        show_val(getxattr(&cx.p("g"), "user.b", 100)),
    );
    cx.ok("link(g, h)", link(&cx.p("g"), &cx.p("h")));
    cx.ok(
        "setxattr(h, user.vialink)",
        setxattr(&cx.p("h"), "user.vialink", b"1", 0),
    );
    cx.val(
        "getxattr(g, user.vialink)",
        show_val(getxattr(&cx.p("g"), "user.vialink", 10)),
    );
    // missing file
    cx.ok(
        "setxattr(missing)",
        setxattr(&cx.p("missing"), "user.a", b"v", 0),
    );
    cx.ok(
        "getxattr(missing)",
        getxattr(&cx.p("missing"), "user.a", 10),
    );
    cx.ok("listxattr(missing)", listxattr_raw(&cx.p("missing"), 10));
    // ctime advances on setxattr
    let before = stat(&cx.p("g"));
    sleep_ms(15);
    cx.ok(
        "setxattr(g, user.t)",
        setxattr(&cx.p("g"), "user.t", b"t", 0),
    );
    if let (Ok(a), Ok(b)) = (before, stat(&cx.p("g"))) {
        cx.o(format!(
            "ctime advanced: {}, mtime unchanged: {}",
            ctime(&b) > ctime(&a),
            mtime(&b) == mtime(&a)
        ));
    }
}

fn xattr_dir(cx: &mut Ctx) {
    cx.setup("mkdir", mkdir(&cx.p("d"), 0o755));
    let d = cx.p("d");
    cx.ok(
        "setxattr(d, user.x)",
        setxattr(&d, "user.x", b"dir-value", 0),
    );
    cx.ok("setxattr(d, user.y, empty)", setxattr(&d, "user.y", b"", 0));
    cx.val("getxattr(d, user.x)", show_val(getxattr(&d, "user.x", 100)));
    cx.val("getxattr(d, user.y)", show_val(getxattr(&d, "user.y", 100)));
    cx.val("listxattr(d)", show_list(listxattr_raw(&d, 4096)));
    cx.ok(
        "setxattr(d, user.x, CREATE)",
        setxattr(&d, "user.x", b"v", libc::XATTR_CREATE),
    );
    cx.ok("removexattr(d, user.x)", removexattr(&d, "user.x"));
    cx.val("getxattr(d, user.x)", show_val(getxattr(&d, "user.x", 100)));
    cx.val("listxattr(d)", show_list(listxattr_raw(&d, 4096)));
    // the directory's xattrs are not inherited by new children
    cx.put("d/child", b"");
    cx.val(
        "listxattr(d/child)",
        show_list(listxattr_raw(&cx.p("d/child"), 4096)),
    );
    cx.ok("rename(d, e)", rename(&d, &cx.p("e")));
    cx.val(
        "getxattr(e, user.y)",
        show_val(getxattr(&cx.p("e"), "user.y", 100)),
    );
}

fn xattr_special(cx: &mut Ctx) {
    cx.put("f", b"x");
    cx.setup("symlink", symlink(b"f", &cx.p("sl")));
    // user.* xattrs on a symlink itself are not permitted; through the link they hit the target
    cx.ok(
        "lsetxattr(sl, user.a)",
        lsetxattr(&cx.p("sl"), "user.a", b"v", 0),
    );
    cx.val(
        "llistxattr(sl)",
        show_list(llistxattr_raw(&cx.p("sl"), 4096)),
    );
    cx.val(
        "lgetxattr(sl, user.a)",
        show_val(lgetxattr(&cx.p("sl"), "user.a", 100)),
    );
    cx.ok(
        "setxattr(sl, user.a) follows",
        setxattr(&cx.p("sl"), "user.a", b"via-link", 0),
    );
    cx.val(
        "getxattr(f, user.a)",
        show_val(getxattr(&cx.p("f"), "user.a", 100)),
    );
    cx.val(
        "lgetxattr(sl, user.a)",
        show_val(lgetxattr(&cx.p("sl"), "user.a", 100)),
    );
    cx.setup("mkfifo", mkfifo(&cx.p("fifo"), 0o644));
    cx.ok(
        "setxattr(fifo, user.a)",
        setxattr(&cx.p("fifo"), "user.a", b"v", 0),
    );
    cx.val(
        "listxattr(fifo)",
        show_list(listxattr_raw(&cx.p("fifo"), 4096)),
    );
    cx.setup("mknod", mknod(&cx.p("sock"), libc::S_IFSOCK | 0o644, 0));
    cx.ok(
        "setxattr(sock, user.a)",
        setxattr(&cx.p("sock"), "user.a", b"v", 0),
    );
    // many xattrs on one file
    let mut ok = 0;
    for i in 0..50 {
        if setxattr(
            &cx.p("f"),
            &format!("user.many{i:02}"),
            format!("{i}").as_bytes(),
            0,
        )
        .is_ok()
        {
            ok += 1;
        }
    }
    cx.o(format!("50 setxattr ok = {ok}"));
    cx.val(
        "listxattr(f) count",
        listxattr_raw(&cx.p("f"), 65536)
            .map(|(n, b)| format!("len={n} count={}", split_names(&b).len())),
    );
}

fn eacces_nobody(cx: &mut Ctx) {
    cx.put("secret", b"secret\n");
    cx.setup("chmod", chmod(&cx.p("secret"), 0o600));
    cx.put("public", b"public\n");
    cx.setup("chmod", chmod(&cx.p("public"), 0o644));
    cx.put("wonly", b"w\n");
    cx.setup("chmod", chmod(&cx.p("wonly"), 0o622));
    cx.setup("mkdir", mkdir(&cx.p("rootdir"), 0o755));
    cx.setup("chmod", chmod(&cx.p("rootdir"), 0o755));
    cx.put("rootdir/visible", b"v\n");
    cx.setup("mkdir", mkdir(&cx.p("private"), 0o700));
    cx.put("private/inner", b"inner\n");
    cx.setup("mkdir", mkdir(&cx.p("xonly"), 0o711));
    cx.setup("chmod", chmod(&cx.p("xonly"), 0o711));
    cx.put("xonly/known", b"known\n");
    cx.setup("chmod", chmod(&cx.p("xonly/known"), 0o644));

    cx.as_nobody("cat secret", &["cat", "secret"]);
    cx.as_nobody("cat public", &["cat", "public"]);
    cx.as_nobody("touch rootdir/x", &["touch", "rootdir/x"]);
    cx.as_nobody("ls private", &["ls", "private"]);
    cx.as_nobody("ls rootdir", &["ls", "rootdir"]);
    cx.as_nobody("cat private/inner", &["cat", "private/inner"]);
    cx.as_nobody("stat private/inner", &["stat", "-c", "%s", "private/inner"]);
    cx.as_nobody("ls xonly", &["ls", "xonly"]);
    cx.as_nobody("cat xonly/known", &["cat", "xonly/known"]);
    cx.as_nobody("chmod 777 public", &["chmod", "777", "public"]);
    cx.as_nobody("chown nobody public", &["chown", "65534", "public"]);
    cx.as_nobody("rm public", &["rm", "-f", "public"]);
    cx.as_nobody("mv public rootdir/p", &["mv", "public", "rootdir/p"]);
    cx.as_nobody("write public", &["sh", "-c", "echo x > public"]);
    cx.as_nobody("append wonly", &["sh", "-c", "echo y >> wonly"]);
    cx.as_nobody("cat wonly", &["cat", "wonly"]);
    cx.as_nobody(
        "touch -d @1000 public",
        &["touch", "-m", "-d", "@1000", "public"],
    );
    cx.as_nobody("touch public", &["touch", "public"]);
    cx.as_nobody("mkdir rootdir/sub", &["mkdir", "rootdir/sub"]);
    cx.as_nobody("rmdir rootdir", &["rmdir", "rootdir"]);
    cx.as_nobody("truncate secret", &["truncate", "-s", "0", "secret"]);
    cx.as_nobody(
        "test -r secret",
        &["sh", "-c", "test -r secret && echo yes || echo no"],
    );
    cx.as_nobody(
        "test -w wonly",
        &["sh", "-c", "test -w wonly && echo yes || echo no"],
    );
    cx.as_nobody(
        "sh open secret for reading",
        &["sh", "-c", "exec 3<secret; echo opened"],
    );
    cx.content("wonly");
    cx.content("public");
    cx.stat("public");
    cx.listing("");
    cx.listing("rootdir");
}

fn nobody_create(cx: &mut Ctx) {
    cx.setup("mkdir", mkdir(&cx.p("open"), 0o777));
    cx.setup("chmod", chmod(&cx.p("open"), 0o777));
    cx.as_nobody("touch open/newfile", &["touch", "open/newfile"]);
    cx.stat("open/newfile");
    cx.as_nobody("mkdir open/newdir", &["mkdir", "open/newdir"]);
    cx.stat("open/newdir");
    cx.as_nobody("ln -s x open/newlink", &["ln", "-s", "x", "open/newlink"]);
    cx.lstat("open/newlink");
    cx.as_nobody("mkfifo open/newfifo", &["mkfifo", "open/newfifo"]);
    cx.lstat("open/newfifo");
    cx.as_nobody(
        "write+chmod own file",
        &[
            "sh",
            "-c",
            "echo mine > open/newfile && chmod 600 open/newfile && cat open/newfile",
        ],
    );
    cx.stat("open/newfile");
    cx.as_nobody(
        "touch -d @1000 own file",
        &["touch", "-m", "-d", "@1000", "open/newfile"],
    );
    if let Ok(st) = stat(&cx.p("open/newfile")) {
        cx.o(format!("mtime of own file = {}", show_time(mtime(&st))));
    }
    cx.as_nobody("chown own file to root", &["chown", "0", "open/newfile"]);
    cx.as_nobody(
        "chgrp own file to root group",
        &["chgrp", "0", "open/newfile"],
    );
    cx.as_nobody("mv own file", &["mv", "open/newfile", "open/renamed"]);
    cx.as_nobody("rm own file", &["rm", "open/renamed"]);
    // a file root created in the world-writable (non-sticky) dir can be removed by nobody
    cx.put("open/rootfile", b"r");
    cx.as_nobody("rm root file in 0777 dir", &["rm", "-f", "open/rootfile"]);
    // nobody's file in nobody's dir is inaccessible to other users but not to root
    cx.as_nobody(
        "mkdir -m 700 open/mine",
        &["mkdir", "-m", "700", "open/mine"],
    );
    cx.stat("open/mine");
    cx.put("open/mine/byroot", b"root was here");
    cx.stat("open/mine/byroot");
    cx.listing("open");
}

fn sticky_dir(cx: &mut Ctx) {
    cx.setup("mkdir", mkdir(&cx.p("tmp"), 0o777));
    cx.setup("chmod", chmod(&cx.p("tmp"), 0o1777));
    cx.mode("tmp");
    cx.put("tmp/rootfile", b"root");
    cx.setup("chmod", chmod(&cx.p("tmp/rootfile"), 0o666));
    cx.as_nobody("touch tmp/nobodyfile", &["touch", "tmp/nobodyfile"]);
    cx.as_nobody("rm tmp/rootfile", &["rm", "-f", "tmp/rootfile"]);
    cx.as_nobody("mv tmp/rootfile tmp/x", &["mv", "tmp/rootfile", "tmp/x"]);
    cx.as_nobody(
        "mv tmp/nobodyfile tmp/rootfile",
        &["mv", "-f", "tmp/nobodyfile", "tmp/rootfile"],
    );
    cx.as_nobody(
        "write tmp/rootfile",
        &["sh", "-c", "echo nobody >> tmp/rootfile"],
    );
    cx.as_nobody(
        "mv tmp/nobodyfile tmp/moved",
        &["mv", "tmp/nobodyfile", "tmp/moved"],
    );
    cx.as_nobody("rm tmp/moved", &["rm", "tmp/moved"]);
    cx.content("tmp/rootfile");
    cx.listing("tmp");
    // root may remove anything
    cx.as_nobody("touch tmp/n2", &["touch", "tmp/n2"]);
    cx.ok("unlink(tmp/n2) as root", unlink(&cx.p("tmp/n2")));
}

fn write_clears_suid(cx: &mut Ctx) {
    for (n, m) in [
        ("suid", 0o4777),
        ("sgid", 0o2777),
        ("both", 0o6777),
        ("sgid_nogx", 0o2767),
        ("trunc_suid", 0o4777),
        ("root_suid", 0o4777),
    ] {
        cx.put(n, b"data");
        cx.setup("chmod", chmod(&cx.p(n), m));
        cx.mode(n);
    }
    cx.as_nobody("append suid", &["sh", "-c", "echo x >> suid"]);
    cx.mode("suid");
    cx.as_nobody("append sgid", &["sh", "-c", "echo x >> sgid"]);
    cx.mode("sgid");
    cx.as_nobody("append both", &["sh", "-c", "echo x >> both"]);
    cx.mode("both");
    cx.as_nobody("append sgid_nogx", &["sh", "-c", "echo x >> sgid_nogx"]);
    cx.mode("sgid_nogx");
    cx.as_nobody(
        "truncate trunc_suid",
        &["truncate", "-s", "2", "trunc_suid"],
    );
    cx.mode("trunc_suid");
    // root (CAP_FSETID) writing keeps the bits
    if let Some(fd) = cx.setup(
        "open",
        open(&cx.p("root_suid"), libc::O_WRONLY | libc::O_APPEND, 0),
    ) {
        cx.val("write as root", write(&fd, b"x"));
    }
    cx.mode("root_suid");
    cx.content("suid");
    cx.content("trunc_suid");
}

/// exec, retrying on ETXTBSY (a concurrently forked child of another thread may briefly hold a
/// write fd to the file before its own exec closes it).
fn run(path: &Path, args: &[&str]) -> Result<std::process::Output, std::io::Error> {
    let mut tries = 0;
    loop {
        let r = std::process::Command::new(path)
            .args(args)
            .env("LC_ALL", "C")
            .stdin(std::process::Stdio::null())
            .output();
        match &r {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 50 => {
                tries += 1;
                sleep_ms(20);
            }
            _ => return r,
        }
    }
}

fn show_run(r: Result<std::process::Output, std::io::Error>) -> String {
    match r {
        Ok(o) => format!(
            "exit={:?} stdout={:?}",
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).trim_end()
        ),
        Err(e) => format!("spawn error {}", from_io(&e)),
    }
}

fn exec_case(cx: &mut Ctx) {
    cx.put(
        "script.sh",
        b"#!/bin/sh\necho \"script ran with $1\"\nexit 3\n",
    );
    cx.setup("chmod", chmod(&cx.p("script.sh"), 0o755));
    let o = show_run(run(&cx.p("script.sh"), &["arg1"]));
    cx.o(format!("exec script.sh: {o}"));
    cx.put("noexec.sh", b"#!/bin/sh\necho nope\n");
    let o = show_run(run(&cx.p("noexec.sh"), &[]));
    cx.o(format!("exec noexec.sh (0644): {o}"));
    // an ELF binary (exec maps it from the file system)
    match std::fs::read("/bin/echo") {
        Ok(bin) => {
            cx.put("echo-copy", &bin);
            cx.setup("chmod", chmod(&cx.p("echo-copy"), 0o755));
            let o = show_run(run(&cx.p("echo-copy"), &["hello", "from", "copy"]));
            cx.o(format!("exec echo-copy: {o}"));
        }
        Err(e) => cx.o(format!("read /bin/echo failed: {e}")),
    }
    // exec of a directory and of a non-executable garbage file
    cx.setup("mkdir", mkdir(&cx.p("d"), 0o755));
    let o = show_run(run(&cx.p("d"), &[]));
    cx.o(format!("exec dir: {o}"));
    cx.put("garbage", b"\x7fELF-not-really");
    cx.setup("chmod", chmod(&cx.p("garbage"), 0o755));
    let o = show_run(run(&cx.p("garbage"), &[]));
    cx.o(format!("exec garbage: {o}"));
    // exec as nobody (needs read + exec for a script)
    cx.setup("chmod", chmod(&cx.p("script.sh"), 0o711));
    cx.as_nobody("run 0711 script", &["./script.sh", "x"]);
    cx.setup("chmod", chmod(&cx.p("script.sh"), 0o755));
    cx.as_nobody("run 0755 script", &["./script.sh", "y"]);
}
