//! Data cases: create/open flags, read/write, fsync, fallocate, seek, copy_file_range, open files
//! whose names change, large sparse files, mmap, locks.

use super::sys::*;
use super::*;

pub(crate) const CASES: &[(&str, CaseFn)] = &[
    ("create", create),
    ("o_tmpfile", o_tmpfile),
    ("append", append),
    ("o_trunc", o_trunc),
    ("rw_basic", rw_basic),
    ("large_write", large_write),
    ("fsync", fsync_case),
    ("ioctl", ioctl_case),
    ("fallocate", fallocate_case),
    ("fallocate_zero_range", fallocate_zero_range),
    ("seek_data_hole", seek_data_hole),
    ("copy_file_range", copy_file_range_case),
    ("open_unlink", open_unlink),
    ("open_unlink_recreate", open_unlink_recreate),
    ("open_rename", open_rename),
    ("large_sparse", large_sparse),
    ("dup_offsets", dup_offsets),
    ("mmap_shared", mmap_shared),
    ("locks", locks),
];

const GIB: i64 = 1 << 30;
const MIB: i64 = 1 << 20;

fn create(cx: &mut Ctx) {
    use libc::{O_CREAT, O_DIRECTORY, O_EXCL, O_RDONLY, O_RDWR, O_TRUNC, O_WRONLY};
    let r = open(&cx.p("f"), O_CREAT | O_WRONLY, 0o640);
    cx.ok("open(f, O_CREAT|O_WRONLY, 0640)", r);
    cx.stat("f");
    let r = open(&cx.p("f"), O_CREAT | O_EXCL | O_WRONLY, 0o600);
    cx.ok("open(f, O_CREAT|O_EXCL) existing", r);
    let r = open(&cx.p("f"), O_CREAT | O_WRONLY, 0o777);
    cx.ok("open(f, O_CREAT, 0777) existing", r);
    cx.mode("f");
    let r = open(&cx.p("g"), O_CREAT | O_EXCL | O_RDWR, 0o600);
    cx.ok("open(g, O_CREAT|O_EXCL) new", r);
    cx.stat("g");
    // dangling symlinks
    cx.setup("symlink", symlink(b"target_missing", &cx.p("dangling")));
    let r = open(&cx.p("dangling"), O_CREAT | O_EXCL | O_WRONLY, 0o644);
    cx.ok("open(dangling, O_CREAT|O_EXCL)", r);
    cx.ok("lstat(target_missing)", lstat(&cx.p("target_missing")));
    let r = open(&cx.p("dangling"), O_CREAT | O_WRONLY, 0o600);
    cx.ok("open(dangling, O_CREAT) creates target", r);
    cx.lstat("target_missing");
    cx.lstat("dangling");
    cx.setup("symlink", symlink(b"f", &cx.p("sl_f")));
    let r = open(&cx.p("sl_f"), O_CREAT | O_EXCL | O_WRONLY, 0o644);
    cx.ok("open(symlink to file, O_CREAT|O_EXCL)", r);
    // directories
    cx.setup("mkdir", mkdir(&cx.p("d"), 0o755));
    let r = open(&cx.p("f"), O_RDONLY | O_DIRECTORY, 0);
    cx.ok("open(f, O_DIRECTORY)", r);
    let r = open(&cx.p("d"), O_WRONLY, 0);
    cx.ok("open(d, O_WRONLY)", r);
    let r = open(&cx.p("d"), O_RDWR, 0);
    cx.ok("open(d, O_RDWR)", r);
    let r = open(&cx.p("d"), O_RDONLY, 0);
    cx.ok("open(d, O_RDONLY)", r);
    let r = open(&cx.p("d"), O_RDONLY | O_DIRECTORY, 0);
    cx.ok("open(d, O_RDONLY|O_DIRECTORY)", r);
    let r = open(&cx.p("d"), O_CREAT | O_RDONLY, 0o644);
    cx.ok("open(d, O_CREAT|O_RDONLY)", r);
    let r = open(&cx.p("d"), O_CREAT | O_EXCL | O_RDONLY, 0o644);
    cx.ok("open(d, O_CREAT|O_EXCL)", r);
    let r = open(&cx.p("newdir"), O_CREAT | O_DIRECTORY | O_RDONLY, 0o755);
    cx.ok("open(newdir, O_CREAT|O_DIRECTORY)", r);
    cx.ok("lstat(newdir)", lstat(&cx.p("newdir")));
    // missing/invalid paths
    let r = open(&cx.p("missing"), O_RDONLY, 0);
    cx.ok("open(missing, O_RDONLY)", r);
    let r = open(&cx.p("missing/f"), O_CREAT | O_WRONLY, 0o644);
    cx.ok("open(missing/f, O_CREAT)", r);
    let r = open(&cx.p("f/x"), O_CREAT | O_WRONLY, 0o644);
    cx.ok("open(f/x, O_CREAT)", r);
    let r = open(&cx.p("f/"), O_RDONLY, 0);
    cx.ok("open(f/, O_RDONLY)", r);
    let r = open(&cx.p("new/"), O_CREAT | O_WRONLY, 0o644);
    cx.ok("open(new/, O_CREAT)", r);
    let r = open(&cx.p("d/"), O_RDONLY, 0);
    cx.ok("open(d/, O_RDONLY)", r);
    // mode 0 file is still writable through the creating fd
    if let Some(fd) = cx.ok(
        "open(zero, O_CREAT|O_RDWR, 0)",
        open(&cx.p("zero"), O_CREAT | O_RDWR, 0),
    ) {
        cx.val("write(fd(zero))", write(&fd, b"abc"));
        cx.val("pread(fd(zero))", pread(&fd, 10, 0).map(|b| show_bytes(&b)));
    }
    cx.stat("zero");
    // O_CREAT|O_TRUNC on existing content
    cx.put("h", b"old content");
    let r = open(&cx.p("h"), O_CREAT | O_TRUNC | O_WRONLY, 0o644);
    cx.ok("open(h, O_CREAT|O_TRUNC)", r);
    cx.stat("h");
    // new file is visible in a listing and owned by the creator
    cx.listing("");
}

fn o_tmpfile(cx: &mut Ctx) {
    cx.setup("mkdir", mkdir(&cx.p("d"), 0o755));
    let r = open(&cx.p("d"), libc::O_TMPFILE | libc::O_RDWR, 0o600);
    let Some(fd) = cx.ok("open(d, O_TMPFILE|O_RDWR, 0600)", r) else {
        return;
    };
    cx.val("write(tmpfile)", write(&fd, b"anonymous"));
    cx.fstat("tmpfile", &fd);
    cx.listing("d");
    cx.ok(
        "linkat(tmpfile, d/named, AT_EMPTY_PATH)",
        link_fd(&fd, &cx.p("d/named")),
    );
    cx.listing("d");
    cx.stat("d/named");
    cx.content("d/named");
    cx.fstat("tmpfile after link", &fd);
    let r = open(
        &cx.p("d"),
        libc::O_TMPFILE | libc::O_RDWR | libc::O_EXCL,
        0o600,
    );
    if let Some(fd2) = cx.ok("open(d, O_TMPFILE|O_EXCL)", r) {
        cx.ok(
            "linkat(O_EXCL tmpfile, AT_EMPTY_PATH)",
            link_fd(&fd2, &cx.p("d/named2")),
        );
    }
    let r = open(&cx.p("d"), libc::O_TMPFILE | libc::O_RDONLY, 0o600);
    cx.ok("open(d, O_TMPFILE|O_RDONLY)", r);
}

fn append(cx: &mut Ctx) {
    use libc::{O_APPEND, O_CREAT, O_WRONLY};
    cx.put("f", b"start:");
    let a = open(&cx.p("f"), O_WRONLY | O_APPEND, 0);
    let b = open(&cx.p("f"), O_WRONLY | O_APPEND | O_CREAT, 0o644);
    let (Some(a), Some(b)) = (
        cx.ok("open(f, O_APPEND) #1", a),
        cx.ok("open(f, O_APPEND) #2", b),
    ) else {
        return;
    };
    for i in 0..4 {
        cx.val(
            &format!("write(#1, A{i})"),
            write(&a, format!("A{i}").as_bytes()),
        );
        cx.val(
            &format!("write(#2, B{i}-)"),
            write(&b, format!("B{i}-").as_bytes()),
        );
    }
    cx.content("f");
    cx.val("lseek(#1, 0, SEEK_CUR)", lseek(&a, 0, libc::SEEK_CUR));
    cx.val("lseek(#2, 0, SEEK_CUR)", lseek(&b, 0, libc::SEEK_CUR));
    // seeking does not affect where appends go
    cx.val("lseek(#1, 0, SEEK_SET)", lseek(&a, 0, libc::SEEK_SET));
    cx.val("write(#1, X)", write(&a, b"X"));
    // Linux: pwrite on an O_APPEND fd appends regardless of offset
    cx.val("pwrite(#1, P, 0)", pwrite(&a, b"P", 0));
    cx.content("f");
    // a non-append writer overwrites, an appender then appends after the new end
    if let Some(c) = cx.setup("open", open(&cx.p("f"), libc::O_RDWR, 0)) {
        cx.val("pwrite(plain, ZZ, 0)", pwrite(&c, b"ZZ", 0));
        cx.val("pwrite(plain, END, 29) past EOF", pwrite(&c, b"END", 29));
        cx.val("write(#2, Q)", write(&b, b"Q"));
        cx.val("read(plain, 4)", read(&c, 4).map(|v| show_bytes(&v)));
    }
    cx.content("f");
    // O_APPEND|O_RDWR: reading starts at 0, writing appends
    if let Some(d) = cx.setup("open", open(&cx.p("f"), libc::O_RDWR | O_APPEND, 0)) {
        cx.val("read(rdwr-append, 5)", read(&d, 5).map(|v| show_bytes(&v)));
        cx.val("write(rdwr-append, W)", write(&d, b"W"));
        cx.val(
            "lseek(rdwr-append, 0, SEEK_CUR)",
            lseek(&d, 0, libc::SEEK_CUR),
        );
    }
    cx.content("f");
    // ftruncate then append continues at the new end
    cx.ok("ftruncate(#1, 3)", ftruncate(&a, 3));
    cx.val("write(#2, T)", write(&b, b"T"));
    cx.content("f");
}

fn o_trunc(cx: &mut Ctx) {
    cx.put("f", b"hello world");
    let r = open(&cx.p("f"), libc::O_WRONLY | libc::O_TRUNC, 0);
    cx.ok("open(f, O_WRONLY|O_TRUNC)", r);
    cx.stat("f");
    cx.put("f", b"hello again");
    let r = open(&cx.p("f"), libc::O_RDONLY, 0);
    cx.ok("open(f, O_RDONLY)", r);
    cx.size("f");
    let r = open(&cx.p("f"), libc::O_RDWR | libc::O_TRUNC, 0);
    if let Some(fd) = cx.ok("open(f, O_RDWR|O_TRUNC)", r) {
        cx.val("read after O_TRUNC", read(&fd, 100).map(|b| show_bytes(&b)));
        cx.val("write(new)", write(&fd, b"new"));
    }
    cx.content("f");
    // O_TRUNC on an empty file / O_RDONLY|O_TRUNC (Linux truncates)
    let r = open(&cx.p("f"), libc::O_RDONLY | libc::O_TRUNC, 0);
    cx.ok("open(f, O_RDONLY|O_TRUNC)", r);
    cx.size("f");
    // O_TRUNC keeps the inode and the mode
    cx.put("g", b"data");
    cx.setup("chmod", chmod(&cx.p("g"), 0o604));
    let before = stat(&cx.p("g"));
    let r = open(&cx.p("g"), libc::O_WRONLY | libc::O_TRUNC, 0o777);
    cx.ok("open(g, O_WRONLY|O_TRUNC)", r);
    if let (Ok(a), Ok(b)) = (before, stat(&cx.p("g"))) {
        cx.o(format!(
            "same ino: {}, mode: 0{:o}, size: {}",
            a.st_ino == b.st_ino,
            b.st_mode,
            b.st_size
        ));
    }
    // O_TRUNC through a symlink truncates the target
    cx.put("t", b"target");
    cx.setup("symlink", symlink(b"t", &cx.p("sl")));
    let r = open(&cx.p("sl"), libc::O_WRONLY | libc::O_TRUNC, 0);
    cx.ok("open(sl, O_WRONLY|O_TRUNC)", r);
    cx.size("t");
    // O_TRUNC on a directory
    cx.setup("mkdir", mkdir(&cx.p("d"), 0o755));
    let r = open(&cx.p("d"), libc::O_RDONLY | libc::O_TRUNC, 0);
    cx.ok("open(d, O_RDONLY|O_TRUNC)", r);
}

fn rw_basic(cx: &mut Ctx) {
    let Some(fd) = cx.ok(
        "open(f, O_CREAT|O_RDWR)",
        open(&cx.p("f"), libc::O_CREAT | libc::O_RDWR, 0o644),
    ) else {
        return;
    };
    cx.val("write(hello world)", write(&fd, b"hello world"));
    cx.val("read at EOF", read(&fd, 10).map(|b| show_bytes(&b)));
    cx.val("lseek(0, SEEK_SET)", lseek(&fd, 0, libc::SEEK_SET));
    cx.val("read(5)", read(&fd, 5).map(|b| show_bytes(&b)));
    cx.val("lseek(1, SEEK_CUR)", lseek(&fd, 1, libc::SEEK_CUR));
    cx.val("read(100)", read(&fd, 100).map(|b| show_bytes(&b)));
    cx.val("pwrite(WORLD, 6)", pwrite(&fd, b"WORLD", 6));
    cx.val("pread(5, 6)", pread(&fd, 5, 6).map(|b| show_bytes(&b)));
    cx.val("pread(100, 3)", pread(&fd, 100, 3).map(|b| show_bytes(&b)));
    cx.val(
        "pread(10, 11) at EOF",
        pread(&fd, 10, 11).map(|b| show_bytes(&b)),
    );
    cx.val(
        "pread(10, 1000) past EOF",
        pread(&fd, 10, 1000).map(|b| show_bytes(&b)),
    );
    cx.val(
        "lseek(0, SEEK_CUR) unchanged by pread/pwrite",
        lseek(&fd, 0, libc::SEEK_CUR),
    );
    cx.val("read(0 bytes)", read(&fd, 0).map(|b| b.len()));
    cx.val("write(0 bytes)", write(&fd, b""));
    cx.val("pwrite(0 bytes, 100)", pwrite(&fd, b"", 100));
    cx.fstat("f after 0-byte pwrite", &fd);
    // write past EOF leaves a hole of zeros
    cx.val("lseek(10000, SEEK_SET)", lseek(&fd, 10000, libc::SEEK_SET));
    cx.val("write(x) at 10000", write(&fd, b"x"));
    cx.fstat("f", &fd);
    if let Ok(b) = pread(&fd, 10001, 0) {
        cx.o(format!(
            "hole 11..10000 all zero: {}, last byte: {}",
            b[11..10000].iter().all(|&x| x == 0),
            b[10000] as char
        ));
    }
    cx.val("pwrite(y, 20000)", pwrite(&fd, b"y", 20000));
    cx.size("f");
    cx.val("lseek(-1, SEEK_SET)", lseek(&fd, -1, libc::SEEK_SET));
    cx.val("lseek(0, 42 whence)", lseek(&fd, 0, 42));
    cx.val(
        "lseek(100000, SEEK_SET) past EOF",
        lseek(&fd, 100000, libc::SEEK_SET),
    );
    cx.val("read past EOF", read(&fd, 10).map(|b| b.len()));
    cx.val("pread(-1 offset)", pread(&fd, 1, -1).map(|b| b.len()));
    drop(fd);
    // wrong access modes
    if let Some(ro) = cx.setup("open", open(&cx.p("f"), libc::O_RDONLY, 0)) {
        cx.val("write(O_RDONLY fd)", write(&ro, b"z"));
        cx.val("pwrite(O_RDONLY fd)", pwrite(&ro, b"z", 0));
    }
    if let Some(wo) = cx.setup("open", open(&cx.p("f"), libc::O_WRONLY, 0)) {
        cx.val("read(O_WRONLY fd)", read(&wo, 1).map(|b| b.len()));
        cx.val("pread(O_WRONLY fd)", pread(&wo, 1, 0).map(|b| b.len()));
    }
    if let Some(d) = cx.setup("open", open(&cx.p(""), libc::O_RDONLY, 0)) {
        cx.val("read(dir fd)", read(&d, 1).map(|b| b.len()));
    }
    if let Some(p) = cx.setup("open", open(&cx.p("f"), libc::O_PATH, 0)) {
        cx.val("read(O_PATH fd)", read(&p, 1).map(|b| b.len()));
    }
    // many small writes and reads with odd sizes
    if let Some(fd) = cx.setup(
        "open",
        open(
            &cx.p("g"),
            libc::O_CREAT | libc::O_RDWR | libc::O_TRUNC,
            0o644,
        ),
    ) {
        let data = pattern(100_000, 7);
        let mut off = 0;
        let mut step = 1;
        while off < data.len() {
            let end = (off + step).min(data.len());
            let _ = write_all(&fd, &data[off..end]);
            off = end;
            step = step * 3 % 4093 + 1;
        }
        let back = pread(&fd, 200_000, 0).unwrap_or_default();
        cx.o(format!("odd-size writes read back equal: {}", back == data));
        let mut rd = Vec::new();
        let _ = lseek(&fd, 0, libc::SEEK_SET);
        let mut step = 5;
        loop {
            match read(&fd, step) {
                Ok(b) if !b.is_empty() => rd.extend_from_slice(&b),
                _ => break,
            }
            step = step * 7 % 8191 + 1;
        }
        cx.o(format!("odd-size reads equal: {}", rd == data));
    }
}

fn large_write(cx: &mut Ctx) {
    let data = pattern(8 << 20, 42);
    cx.o(format!("data: {}", show_bytes(&data)));
    let Some(fd) = cx.ok(
        "open(big, O_CREAT|O_RDWR)",
        open(&cx.p("big"), libc::O_CREAT | libc::O_RDWR, 0o644),
    ) else {
        return;
    };
    cx.val("write_all(8 MiB) single call start", write_all(&fd, &data));
    cx.fstat("big", &fd);
    drop(fd);
    cx.content("big");
    // read back with a single 8 MiB pread and with unaligned chunks
    if let Some(fd) = cx.setup("open", open(&cx.p("big"), libc::O_RDONLY, 0)) {
        let r = pread(&fd, 8 << 20, 0);
        cx.val("pread(8 MiB, 0)", r.map(|b| show_bytes(&b)));
        let r = pread(&fd, 1 << 20, 12345);
        cx.o(format!(
            "pread(1 MiB, 12345) equal: {}",
            r.map(|b| b[..] == data[12345..12345 + (1 << 20)])
                .unwrap_or(false)
        ));
        let mut buf = Vec::new();
        loop {
            match read(&fd, 131_071) {
                Ok(b) if !b.is_empty() => buf.extend_from_slice(&b),
                _ => break,
            }
        }
        cx.o(format!("chunked read equal: {}", buf == data));
    }
    // overwrite a range in the middle, crossing page boundaries
    if let Some(fd) = cx.setup("open", open(&cx.p("big"), libc::O_WRONLY, 0)) {
        let patch = pattern(300_000, 9);
        cx.val(
            "pwrite(300000 bytes, 4000000)",
            pwrite(&fd, &patch, 4_000_000),
        );
        let mut expect = data.clone();
        expect[4_000_000..4_300_000].copy_from_slice(&patch);
        let back = read_file(&cx.p("big")).unwrap_or_default();
        cx.o(format!("after patch equal: {}", back == expect));
    }
    cx.ok("unlink(big)", unlink(&cx.p("big")));
}

/// Python asks isatty() of every file it opens.
fn ioctl_case(cx: &mut Ctx) {
    cx.put("f", b"not a terminal");
    if let Some(fd) = cx.setup("open", open(&cx.p("f"), libc::O_RDONLY, 0)) {
        cx.ok("ioctl(file, TCGETS)", tcgets(&fd));
        cx.val("ioctl(file, FIONREAD)", fionread(&fd));
    }
    if let Some(fd) = cx.setup(
        "open",
        open(&cx.p(""), libc::O_RDONLY | libc::O_DIRECTORY, 0),
    ) {
        cx.ok("ioctl(dir, TCGETS)", tcgets(&fd));
    }
}

fn fsync_case(cx: &mut Ctx) {
    cx.put("f", b"data to sync");
    if let Some(fd) = cx.setup("open", open(&cx.p("f"), libc::O_RDWR, 0)) {
        cx.setup("write", write(&fd, b"more"));
        cx.ok("fsync(file)", fsync(&fd));
        cx.ok("fdatasync(file)", fdatasync(&fd));
        cx.ok("syncfs(file)", syncfs(&fd));
    }
    if let Some(fd) = cx.setup("open", open(&cx.p("f"), libc::O_RDONLY, 0)) {
        cx.ok("fsync(O_RDONLY file)", fsync(&fd));
        cx.ok("fdatasync(O_RDONLY file)", fdatasync(&fd));
    }
    if let Some(fd) = cx.setup(
        "open",
        open(&cx.p(""), libc::O_RDONLY | libc::O_DIRECTORY, 0),
    ) {
        cx.ok("fsync(dir)", fsync(&fd));
        cx.ok("fdatasync(dir)", fdatasync(&fd));
    }
    if let Some(fd) = cx.setup("open", open(&cx.p("f"), libc::O_PATH, 0)) {
        cx.ok("fsync(O_PATH fd)", fsync(&fd));
    }
    if let Some(fd) = cx.setup(
        "open",
        open(
            &cx.p("s"),
            libc::O_CREAT | libc::O_WRONLY | libc::O_SYNC,
            0o644,
        ),
    ) {
        cx.val("write(O_SYNC)", write(&fd, b"synced"));
    }
    if let Some(fd) = cx.setup(
        "open",
        open(
            &cx.p("s"),
            libc::O_WRONLY | libc::O_DSYNC | libc::O_APPEND,
            0o644,
        ),
    ) {
        cx.val("write(O_DSYNC|O_APPEND)", write(&fd, b"+dsync"));
    }
    cx.content("s");
    unsafe { libc::sync() };
    cx.o("sync() returned");
}

fn fallocate_case(cx: &mut Ctx) {
    let Some(fd) = cx.setup(
        "open",
        open(&cx.p("f"), libc::O_CREAT | libc::O_RDWR, 0o644),
    ) else {
        return;
    };
    cx.ok("fallocate(0, 0, 65536)", fallocate(&fd, 0, 0, 65536));
    cx.fstat("f", &fd);
    cx.ok(
        "fallocate(KEEP_SIZE, 65536, 65536)",
        fallocate(&fd, libc::FALLOC_FL_KEEP_SIZE, 65536, 65536),
    );
    cx.fstat("f", &fd);
    cx.ok("fallocate(0, 100, 10) inside", fallocate(&fd, 0, 100, 10));
    cx.fstat("f", &fd);
    cx.ok(
        "fallocate(0, 65536, 1000) extend",
        fallocate(&fd, 0, 65536, 1000),
    );
    cx.fstat("f", &fd);
    if let Ok(b) = pread(&fd, 100_000, 0) {
        cx.o(format!(
            "len={} all zero: {}",
            b.len(),
            b.iter().all(|&x| x == 0)
        ));
    }
    // punch a hole into data
    let data = vec![b'D'; 3 * 4096];
    cx.val("pwrite(12288 x D, 0)", pwrite(&fd, &data, 0));
    cx.ok(
        "fallocate(PUNCH_HOLE|KEEP_SIZE, 4096, 4096)",
        fallocate(
            &fd,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            4096,
            4096,
        ),
    );
    cx.fstat("f", &fd);
    if let Ok(b) = pread(&fd, 3 * 4096, 0) {
        cx.o(format!(
            "0..4096 all D: {}, 4096..8192 all zero: {}, 8192..12288 all D: {}",
            b[..4096].iter().all(|&x| x == b'D'),
            b[4096..8192].iter().all(|&x| x == 0),
            b[8192..].iter().all(|&x| x == b'D')
        ));
    }
    // unaligned punch zeros exactly the range
    cx.ok(
        "fallocate(PUNCH_HOLE|KEEP_SIZE, 10, 20)",
        fallocate(
            &fd,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            10,
            20,
        ),
    );
    cx.val("pread(40, 0)", pread(&fd, 40, 0).map(|b| show_bytes(&b)));
    // punch beyond EOF does not change size
    cx.ok(
        "fallocate(PUNCH_HOLE|KEEP_SIZE, 60000, 100000)",
        fallocate(
            &fd,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            60000,
            100000,
        ),
    );
    cx.fstat("f", &fd);
    // errors
    cx.ok(
        "fallocate(PUNCH_HOLE without KEEP_SIZE)",
        fallocate(&fd, libc::FALLOC_FL_PUNCH_HOLE, 0, 10),
    );
    cx.ok("fallocate(0, 0, 0) zero length", fallocate(&fd, 0, 0, 0));
    cx.ok(
        "fallocate(0, -1, 10) negative offset",
        fallocate(&fd, 0, -1, 10),
    );
    if let Some(ro) = cx.setup("open", open(&cx.p("f"), libc::O_RDONLY, 0)) {
        cx.ok("fallocate(O_RDONLY fd)", fallocate(&ro, 0, 0, 10));
    }
    if let Some(d) = cx.setup("open", open(&cx.p(""), libc::O_RDONLY, 0)) {
        cx.ok("fallocate(dir fd)", fallocate(&d, 0, 0, 10));
    }
}

fn fallocate_zero_range(cx: &mut Ctx) {
    let Some(fd) = cx.setup(
        "open",
        open(&cx.p("f"), libc::O_CREAT | libc::O_RDWR, 0o644),
    ) else {
        return;
    };
    cx.setup("pwrite", pwrite(&fd, &vec![b'Z'; 16384], 0));
    cx.ok(
        "fallocate(ZERO_RANGE, 100, 5000)",
        fallocate(&fd, libc::FALLOC_FL_ZERO_RANGE, 100, 5000),
    );
    cx.fstat("f", &fd);
    if let Ok(b) = pread(&fd, 16384, 0) {
        cx.o(format!(
            "0..100 Z: {}, 100..5100 zero: {}, 5100.. Z: {}",
            b[..100].iter().all(|&x| x == b'Z'),
            b[100..5100].iter().all(|&x| x == 0),
            b[5100..].iter().all(|&x| x == b'Z')
        ));
    }
    cx.ok(
        "fallocate(ZERO_RANGE, 16000, 10000) extends",
        fallocate(&fd, libc::FALLOC_FL_ZERO_RANGE, 16000, 10000),
    );
    cx.fstat("f", &fd);
    cx.ok(
        "fallocate(ZERO_RANGE|KEEP_SIZE, 30000, 10000)",
        fallocate(
            &fd,
            libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
            30000,
            10000,
        ),
    );
    cx.fstat("f", &fd);
}

fn seek_data_hole(cx: &mut Ctx) {
    let Some(fd) = cx.setup(
        "open",
        open(&cx.p("sparse"), libc::O_CREAT | libc::O_RDWR, 0o644),
    ) else {
        return;
    };
    cx.setup("pwrite", pwrite(&fd, &vec![b'a'; 4096], 0));
    cx.setup("pwrite", pwrite(&fd, &vec![b'b'; 4096], MIB));
    cx.ok("fsync", fsync(&fd));
    cx.fstat("sparse", &fd);
    let (sd, sh) = (libc::SEEK_DATA, libc::SEEK_HOLE);
    for (label, off, wh) in [
        ("SEEK_DATA 0", 0, sd),
        ("SEEK_HOLE 0", 0, sh),
        ("SEEK_DATA 100", 100, sd),
        ("SEEK_HOLE 100", 100, sh),
        ("SEEK_DATA 4096", 4096, sd),
        ("SEEK_HOLE 4096", 4096, sh),
        ("SEEK_DATA 500000", 500_000, sd),
        ("SEEK_DATA 1MiB", MIB, sd),
        ("SEEK_HOLE 1MiB", MIB, sh),
        ("SEEK_DATA 1MiB+4095", MIB + 4095, sd),
        ("SEEK_HOLE 1MiB+4095", MIB + 4095, sh),
        ("SEEK_DATA 1MiB+4096 (EOF)", MIB + 4096, sd),
        ("SEEK_HOLE 1MiB+4096 (EOF)", MIB + 4096, sh),
        ("SEEK_DATA past EOF", MIB + 10000, sd),
        ("SEEK_HOLE past EOF", MIB + 10000, sh),
        ("SEEK_DATA -1", -1, sd),
        ("SEEK_END 0", 0, libc::SEEK_END),
        ("SEEK_END -10", -10, libc::SEEK_END),
        ("SEEK_END +10", 10, libc::SEEK_END),
        ("SEEK_END -(size+1)", -(MIB + 4097), libc::SEEK_END),
    ] {
        cx.val(&format!("lseek({label})"), lseek(&fd, off, wh));
    }
    // trailing hole: extend the size past the last data
    cx.ok("ftruncate(4 MiB)", ftruncate(&fd, 4 * MIB));
    for (label, off, wh) in [
        ("SEEK_DATA 1MiB+4096", MIB + 4096, sd),
        ("SEEK_HOLE 1MiB+4096", MIB + 4096, sh),
        ("SEEK_DATA 2MiB", 2 * MIB, sd),
        ("SEEK_HOLE 2MiB", 2 * MIB, sh),
        ("SEEK_DATA 4MiB", 4 * MIB, sd),
        ("SEEK_END 0", 0, libc::SEEK_END),
    ] {
        cx.val(&format!("lseek({label}) after extend"), lseek(&fd, off, wh));
    }
    // a file without holes
    cx.put("dense", &vec![b'x'; 10000]);
    if let Some(d) = cx.setup("open", open(&cx.p("dense"), libc::O_RDONLY, 0)) {
        cx.val("dense lseek(SEEK_DATA 0)", lseek(&d, 0, sd));
        cx.val("dense lseek(SEEK_HOLE 0)", lseek(&d, 0, sh));
        cx.val("dense lseek(SEEK_HOLE 9999)", lseek(&d, 9999, sh));
    }
    // an empty file
    cx.put("empty", b"");
    if let Some(e) = cx.setup("open", open(&cx.p("empty"), libc::O_RDONLY, 0)) {
        cx.val("empty lseek(SEEK_DATA 0)", lseek(&e, 0, sd));
        cx.val("empty lseek(SEEK_HOLE 0)", lseek(&e, 0, sh));
    }
}

fn copy_file_range_case(cx: &mut Ctx) {
    let src_data = pattern(300_000, 3);
    cx.put("src", &src_data);
    let src = open(&cx.p("src"), libc::O_RDONLY, 0);
    let dst = open(&cx.p("dst"), libc::O_CREAT | libc::O_RDWR, 0o644);
    let (Some(src), Some(dst)) = (cx.setup("open src", src), cx.setup("open dst", dst)) else {
        return;
    };
    // whole file using the fd offsets
    let mut total = 0;
    let mut err = None;
    loop {
        match copy_file_range(&src, None, &dst, None, 1 << 30) {
            Ok(0) => break,
            Ok(n) => total += n,
            Err(e) => {
                err = Some(e);
                break;
            }
        }
    }
    cx.o(format!("copy whole: total={total} err={err:?}"));
    cx.val("src offset after", lseek(&src, 0, libc::SEEK_CUR));
    cx.val("dst offset after", lseek(&dst, 0, libc::SEEK_CUR));
    let back = read_file(&cx.p("dst")).unwrap_or_default();
    cx.o(format!("dst == src: {}", back == src_data));
    // partial copies with explicit offsets
    let mut oin = 1000i64;
    let mut oout = 5i64;
    let r = copy_file_range(&src, Some(&mut oin), &dst, Some(&mut oout), 10);
    cx.val("copy(off_in=1000, off_out=5, len=10)", r);
    cx.o(format!("offsets after: in={oin} out={oout}"));
    cx.val("src fd offset unchanged", lseek(&src, 0, libc::SEEK_CUR));
    let mut expect = src_data.clone();
    expect[5..15].copy_from_slice(&src_data[1000..1010]);
    let back = read_file(&cx.p("dst")).unwrap_or_default();
    cx.o(format!(
        "dst after partial copy as expected: {}",
        back == expect
    ));
    // copy to a new file at an offset beyond its end creates a hole
    if let Some(d2) = cx.setup(
        "open",
        open(&cx.p("dst2"), libc::O_CREAT | libc::O_RDWR, 0o644),
    ) {
        let mut oin = 0i64;
        let mut oout = 100_000i64;
        let mut total = 0;
        while total < 50_000 {
            match copy_file_range(&src, Some(&mut oin), &d2, Some(&mut oout), 50_000 - total) {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n,
            }
        }
        cx.o(format!("copy 50000 to off 100000: total={total}"));
        cx.fstat("dst2", &d2);
        if let Ok(b) = pread(&d2, 200_000, 0) {
            cx.o(format!(
                "hole zero: {}, data equal: {}",
                b[..100_000].iter().all(|&x| x == 0),
                b[100_000..] == src_data[..50_000]
            ));
        }
    }
    // copy at/after EOF of the source returns 0
    let mut oin = 300_000i64;
    let mut oout = 0i64;
    let r = copy_file_range(&src, Some(&mut oin), &dst, Some(&mut oout), 100);
    cx.val("copy from src EOF", r);
    let mut oin = 10_000_000i64;
    let r = copy_file_range(&src, Some(&mut oin), &dst, Some(&mut oout), 100);
    cx.val("copy from past src EOF", r);
    // within the same file, non-overlapping
    if let Some(f) = cx.setup("open", open(&cx.p("dst"), libc::O_RDWR, 0)) {
        let mut a = 0i64;
        let mut b = 200_000i64;
        let r = copy_file_range(&f, Some(&mut a), &f, Some(&mut b), 1000);
        cx.val("copy within same file, non-overlapping", r);
        let mut a = 0i64;
        let mut b = 500i64;
        let r = copy_file_range(&f, Some(&mut a), &f, Some(&mut b), 1000);
        cx.val("copy within same file, overlapping", r);
    }
    // errors
    if let Some(wo) = cx.setup("open", open(&cx.p("src"), libc::O_WRONLY, 0)) {
        let r = copy_file_range(&wo, None, &dst, None, 10);
        cx.val("copy from O_WRONLY fd", r);
    }
    if let Some(d) = cx.setup("open", open(&cx.p(""), libc::O_RDONLY, 0)) {
        let r = copy_file_range(&d, None, &dst, None, 10);
        cx.val("copy from dir fd", r);
    }
    cx.setup("chmod", chmod(&cx.p("src"), 0o644));
    let ro_dst = open(&cx.p("dst2"), libc::O_RDONLY, 0);
    if let Some(ro) = cx.setup("open", ro_dst) {
        let r = copy_file_range(&src, None, &ro, None, 10);
        cx.val("copy to O_RDONLY fd", r);
    }
    let mut oin = 0i64;
    let mut oout = 0i64;
    let r = copy_file_range(&src, Some(&mut oin), &dst, Some(&mut oout), 0);
    cx.val("copy len 0", r);
}

fn open_unlink(cx: &mut Ctx) {
    cx.put("f", b"original data");
    let Some(fd) = cx.setup("open", open(&cx.p("f"), libc::O_RDWR, 0)) else {
        return;
    };
    let ro = open(&cx.p("f"), libc::O_RDONLY, 0);
    cx.ok("unlink(f)", unlink(&cx.p("f")));
    cx.ok("stat(f) after unlink", stat(&cx.p("f")));
    cx.listing("");
    cx.val(
        "pread(fd) after unlink",
        pread(&fd, 100, 0).map(|b| show_bytes(&b)),
    );
    cx.fstat("fd after unlink", &fd);
    cx.val("pwrite(fd, +appended, 13)", pwrite(&fd, b"+appended", 13));
    cx.val("pread(fd)", pread(&fd, 100, 0).map(|b| show_bytes(&b)));
    cx.fstat("fd after write", &fd);
    cx.ok("ftruncate(fd, 8)", ftruncate(&fd, 8));
    cx.fstat("fd after ftruncate", &fd);
    cx.ok("fchmod(fd, 0600)", fchmod(&fd, 0o600));
    cx.ok("fchown(fd, 1000, 1000)", fchown(&fd, 1000, 1000));
    cx.ok(
        "futimens(fd)",
        futimens(&fd, [(1_000_000_000, 5), (1_000_000_000, 6)]),
    );
    if let Ok(st) = fstat(&fd) {
        cx.o(format!(
            "fstat: {} mtime={}",
            describe(&st),
            show_time(mtime(&st))
        ));
    }
    cx.ok("fsetxattr(fd)", fsetxattr(&fd, "user.k", b"v", 0));
    cx.val(
        "fgetxattr(fd)",
        fgetxattr(&fd, "user.k", 100).map(|(_, b)| show_bytes(&b)),
    );
    cx.ok("fsync(fd)", fsync(&fd));
    if let Ok(ro) = ro {
        cx.val(
            "pread(second fd) after unlink",
            pread(&ro, 100, 0).map(|b| show_bytes(&b)),
        );
        cx.fstat("second fd", &ro);
    }
    // large write to the unlinked file
    let big = pattern(2 << 20, 5);
    cx.val("pwrite(2 MiB) to unlinked", pwrite(&fd, &big, 0));
    cx.val(
        "pread(2 MiB)",
        pread(&fd, 2 << 20, 0).map(|b| show_bytes(&b)),
    );
    // a new file with the same name is independent
    cx.put("f", b"new");
    cx.content("f");
    cx.val("pread(old fd, 5)", pread(&fd, 5, 0).map(|b| show_bytes(&b)));
    // unlinked directory: the open fd stays valid, but nothing can be created in it
    cx.setup("mkdir", mkdir(&cx.p("d"), 0o755));
    if let Some(dfd) = cx.setup(
        "open",
        open(&cx.p("d"), libc::O_RDONLY | libc::O_DIRECTORY, 0),
    ) {
        cx.ok("rmdir(d)", rmdir(&cx.p("d")));
        cx.fstat("fd(d) after rmdir", &dfd);
        let name = std::ffi::CString::new("x").unwrap();
        let r = unsafe {
            libc::openat(
                raw(&dfd),
                name.as_ptr(),
                libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
                0o644,
            )
        };
        let e = std::io::Error::last_os_error();
        if r >= 0 {
            unsafe { libc::close(r) };
            cx.o("openat(removed dir, x, O_CREAT) = ok");
        } else {
            cx.o(format!("openat(removed dir, x, O_CREAT) = {}", from_io(&e)));
        }
    }
}

fn open_unlink_recreate(cx: &mut Ctx) {
    cx.put("f", b"old content");
    let Some(old) = cx.setup("open", open(&cx.p("f"), libc::O_RDONLY, 0)) else {
        return;
    };
    let oldino = fstat(&old).map(|s| s.st_ino);
    cx.ok("unlink(f)", unlink(&cx.p("f")));
    cx.put("f", b"brand new content!");
    cx.val("read(old fd)", read(&old, 100).map(|b| show_bytes(&b)));
    cx.fstat("old fd", &old);
    cx.content("f");
    let newino = stat(&cx.p("f")).map(|s| s.st_ino);
    cx.o(format!(
        "new file has a different ino: {}",
        oldino != newino
    ));
    // replaced by rename instead of unlink
    cx.put("g", b"g version 1");
    cx.put("g.tmp", b"g version 2, longer");
    if let Some(gfd) = cx.setup("open", open(&cx.p("g"), libc::O_RDONLY, 0)) {
        cx.ok("rename(g.tmp, g)", rename(&cx.p("g.tmp"), &cx.p("g")));
        cx.val("read(old g fd)", read(&gfd, 100).map(|b| show_bytes(&b)));
        cx.fstat("old g fd", &gfd);
        cx.content("g");
    }
    // replaced while opened for writing: writes go to the old inode only
    cx.put("h", b"hhh");
    if let Some(hfd) = cx.setup("open", open(&cx.p("h"), libc::O_WRONLY | libc::O_APPEND, 0)) {
        cx.ok("unlink(h)", unlink(&cx.p("h")));
        cx.put("h", b"HHH");
        cx.val("write(old h fd)", write(&hfd, b"-appended"));
        cx.content("h");
        cx.fstat("old h fd", &hfd);
    }
}

fn open_rename(cx: &mut Ctx) {
    cx.put("f", b"0123456789");
    cx.setup("mkdir", mkdir(&cx.p("other"), 0o755));
    let Some(fd) = cx.setup("open", open(&cx.p("f"), libc::O_RDWR, 0)) else {
        return;
    };
    cx.ok("rename(f, g)", rename(&cx.p("f"), &cx.p("g")));
    cx.val("read(fd, 4)", read(&fd, 4).map(|b| show_bytes(&b)));
    cx.val("write(fd, ABCD)", write(&fd, b"ABCD"));
    cx.fstat("fd", &fd);
    cx.content("g");
    cx.ok("rename(g, other/h)", rename(&cx.p("g"), &cx.p("other/h")));
    cx.val("pwrite(fd, XY, 10)", pwrite(&fd, b"XY", 10));
    cx.val(
        "pread(fd, 100, 0)",
        pread(&fd, 100, 0).map(|b| show_bytes(&b)),
    );
    cx.fstat("fd", &fd);
    cx.content("other/h");
    cx.ok("ftruncate(fd, 6)", ftruncate(&fd, 6));
    cx.content("other/h");
    cx.ok("fchmod(fd, 0640)", fchmod(&fd, 0o640));
    cx.mode("other/h");
    cx.ok("fsync(fd)", fsync(&fd));
    // rename the parent directory of an open file
    cx.ok(
        "rename(other, other2)",
        rename(&cx.p("other"), &cx.p("other2")),
    );
    cx.val("pwrite(fd, !, 6)", pwrite(&fd, b"!", 6));
    cx.content("other2/h");
    cx.fstat("fd", &fd);
    // rename over another file while open
    cx.put("victim", b"victim");
    cx.ok(
        "rename(other2/h, victim)",
        rename(&cx.p("other2/h"), &cx.p("victim")),
    );
    cx.val("pwrite(fd, ?, 7)", pwrite(&fd, b"?", 7));
    cx.content("victim");
    cx.listing("");
    cx.listing("other2");
    // an fd open on the replaced target still sees the old content
    cx.put("a", b"aaaa");
    cx.put("b", b"bbbb");
    if let Some(bfd) = cx.setup("open", open(&cx.p("b"), libc::O_RDONLY, 0)) {
        cx.ok("rename(a, b)", rename(&cx.p("a"), &cx.p("b")));
        cx.val(
            "read(fd of replaced b)",
            read(&bfd, 10).map(|b| show_bytes(&b)),
        );
        cx.fstat("fd of replaced b", &bfd);
    }
    // an open directory fd follows its directory through a rename
    cx.setup("mkdir", mkdir(&cx.p("dd"), 0o755));
    if let Some(dfd) = cx.setup(
        "open",
        open(&cx.p("dd"), libc::O_RDONLY | libc::O_DIRECTORY, 0),
    ) {
        cx.ok(
            "rename(dd, other2/dd2)",
            rename(&cx.p("dd"), &cx.p("other2/dd2")),
        );
        let name = std::ffi::CString::new("created-via-fd").unwrap();
        let r = unsafe {
            libc::openat(
                raw(&dfd),
                name.as_ptr(),
                libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
                0o644,
            )
        };
        if r >= 0 {
            unsafe { libc::close(r) };
            cx.o("openat(dirfd, created-via-fd, O_CREAT) = ok");
        } else {
            let e = std::io::Error::last_os_error();
            cx.o(format!(
                "openat(dirfd, created-via-fd, O_CREAT) = {}",
                from_io(&e)
            ));
        }
        cx.listing("other2/dd2");
    }
}

fn large_sparse(cx: &mut Ctx) {
    let Some(fd) = cx.ok(
        "open(big, O_CREAT|O_RDWR)",
        open(&cx.p("big"), libc::O_CREAT | libc::O_RDWR, 0o644),
    ) else {
        return;
    };
    let o1 = 5 * GIB;
    let o2 = 8 * GIB + 123;
    cx.val("pwrite(five, 5 GiB)", pwrite(&fd, b"five", o1));
    cx.val(
        "pwrite(eight+123, 8 GiB+123)",
        pwrite(&fd, b"eight+123", o2),
    );
    cx.fstat("big", &fd);
    cx.size("big");
    cx.val("pread(4, 5 GiB)", pread(&fd, 4, o1).map(|b| show_bytes(&b)));
    cx.val(
        "pread(9, 8 GiB+123)",
        pread(&fd, 9, o2).map(|b| show_bytes(&b)),
    );
    cx.val(
        "pread(16, 5 GiB-6)",
        pread(&fd, 16, o1 - 6).map(|b| show_bytes(&b)),
    );
    cx.val(
        "pread(8, 4 GiB+100) hole",
        pread(&fd, 8, 4 * GIB + 100).map(|b| show_bytes(&b)),
    );
    cx.val(
        "pread(20, 8 GiB+120) crosses EOF",
        pread(&fd, 20, o2 - 3).map(|b| show_bytes(&b)),
    );
    cx.val(
        "pread(10, 9 GiB) past EOF",
        pread(&fd, 10, 9 * GIB).map(|b| b.len()),
    );
    cx.val("lseek(SEEK_DATA, 0)", lseek(&fd, 0, libc::SEEK_DATA));
    cx.val("lseek(SEEK_HOLE, 0)", lseek(&fd, 0, libc::SEEK_HOLE));
    cx.val(
        "lseek(SEEK_DATA, 5 GiB+4096)",
        lseek(&fd, o1 + 4096, libc::SEEK_DATA),
    );
    cx.val("lseek(SEEK_END, 0)", lseek(&fd, 0, libc::SEEK_END));
    // sequential read via lseek + read at > 4 GiB
    cx.val(
        "lseek(SEEK_SET, 5 GiB+2)",
        lseek(&fd, o1 + 2, libc::SEEK_SET),
    );
    cx.val("read(2)", read(&fd, 2).map(|b| show_bytes(&b)));
    cx.val("lseek(SEEK_CUR, 0)", lseek(&fd, 0, libc::SEEK_CUR));
    cx.ok("ftruncate(6 GiB)", ftruncate(&fd, 6 * GIB));
    cx.fstat("big after truncate", &fd);
    cx.val(
        "pread(4, 5 GiB) after truncate",
        pread(&fd, 4, o1).map(|b| show_bytes(&b)),
    );
    cx.val(
        "pread(4, 6 GiB-2) at new EOF",
        pread(&fd, 4, 6 * GIB - 2).map(|b| show_bytes(&b)),
    );
    cx.val(
        "lseek(SEEK_DATA, 0) after truncate",
        lseek(&fd, 0, libc::SEEK_DATA),
    );
    cx.val(
        "lseek(SEEK_DATA, 5 GiB+4096) after truncate",
        lseek(&fd, o1 + 4096, libc::SEEK_DATA),
    );
    cx.ok(
        "truncate(path, 4 GiB+1)",
        truncate(&cx.p("big"), 4 * GIB + 1),
    );
    cx.size("big");
    cx.val(
        "lseek(SEEK_DATA, 0) all hole",
        lseek(&fd, 0, libc::SEEK_DATA),
    );
    // write right at the 4 GiB boundary
    cx.val("pwrite(ab, 4 GiB-1)", pwrite(&fd, b"ab", 4 * GIB - 1));
    cx.val(
        "pread(4, 4 GiB-2)",
        pread(&fd, 4, 4 * GIB - 2).map(|b| show_bytes(&b)),
    );
    cx.ok(
        "fallocate(KEEP_SIZE, 7 GiB, 4096)",
        fallocate(&fd, libc::FALLOC_FL_KEEP_SIZE, 7 * GIB, 4096),
    );
    cx.size("big");
    drop(fd);
    cx.ok("unlink(big)", unlink(&cx.p("big")));
}

fn dup_offsets(cx: &mut Ctx) {
    cx.put("f", b"abcdefghijklmnop");
    let Some(a) = cx.setup("open", open(&cx.p("f"), libc::O_RDWR, 0)) else {
        return;
    };
    let Some(b) = cx.setup("dup", dup(&a)) else {
        return;
    };
    let c = open(&cx.p("f"), libc::O_RDONLY, 0);
    cx.val("read(a, 3)", read(&a, 3).map(|v| show_bytes(&v)));
    cx.val(
        "read(dup, 3) shares offset",
        read(&b, 3).map(|v| show_bytes(&v)),
    );
    if let Ok(c) = c {
        cx.val(
            "read(separate open, 3)",
            read(&c, 3).map(|v| show_bytes(&v)),
        );
    }
    cx.val("write(dup, XY)", write(&b, b"XY"));
    cx.val("read(a, 3)", read(&a, 3).map(|v| show_bytes(&v)));
    cx.content("f");
    drop(a);
    cx.val(
        "read(dup) after closing original",
        read(&b, 100).map(|v| show_bytes(&v)),
    );
}

fn mmap_shared(cx: &mut Ctx) {
    let Some(fd) = cx.setup(
        "open",
        open(&cx.p("m"), libc::O_CREAT | libc::O_RDWR, 0o644),
    ) else {
        return;
    };
    cx.ok("ftruncate(8192)", ftruncate(&fd, 8192));
    cx.setup("pwrite", pwrite(&fd, b"written-before-map", 0));
    let len = 8192usize;
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            raw(&fd),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        let e = std::io::Error::last_os_error();
        cx.o(format!("mmap(MAP_SHARED, RW) = {}", from_io(&e)));
        return;
    }
    cx.o("mmap(MAP_SHARED, RW) = ok");
    let slice = unsafe { std::slice::from_raw_parts_mut(p as *mut u8, len) };
    cx.o(format!("mapped[0..18] = {}", show_bytes(&slice[..18])));
    slice[100..109].copy_from_slice(b"via-mmap1");
    slice[5000..5009].copy_from_slice(b"via-mmap2");
    let r = unsafe { libc::msync(p, len, libc::MS_SYNC) };
    cx.o(format!(
        "msync = {}",
        if r == 0 {
            "ok".into()
        } else {
            from_io(&std::io::Error::last_os_error()).to_string()
        }
    ));
    cx.val("pread(9, 100)", pread(&fd, 9, 100).map(|b| show_bytes(&b)));
    cx.val(
        "pread(9, 5000)",
        pread(&fd, 9, 5000).map(|b| show_bytes(&b)),
    );
    // a write through the fd is visible in the mapping
    cx.setup("pwrite", pwrite(&fd, b"fd-write", 200));
    cx.o(format!(
        "mapped[200..208] = {}",
        show_bytes(&slice[200..208])
    ));
    unsafe { libc::munmap(p, len) };
    drop(fd);
    // content through a fresh open
    if let Ok(b) = read_file(&cx.p("m")) {
        cx.o(format!(
            "after close: len={} [100..109]={} [5000..5009]={}",
            b.len(),
            show_bytes(&b[100..109]),
            show_bytes(&b[5000..5009])
        ));
    }
    // private read-only mapping
    if let Some(fd) = cx.setup("open", open(&cx.p("m"), libc::O_RDONLY, 0)) {
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                raw(&fd),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            cx.o(format!(
                "mmap(MAP_PRIVATE, R) = {}",
                from_io(&std::io::Error::last_os_error())
            ));
        } else {
            let s = unsafe { std::slice::from_raw_parts(p as *const u8, 18) };
            cx.o(format!("private map [0..18] = {}", show_bytes(s)));
            unsafe { libc::munmap(p, 4096) };
        }
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                raw(&fd),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            cx.o(format!(
                "mmap(MAP_SHARED, RW) on O_RDONLY fd = {}",
                from_io(&std::io::Error::last_os_error())
            ));
        } else {
            cx.o("mmap(MAP_SHARED, RW) on O_RDONLY fd = ok");
            unsafe { libc::munmap(p, 4096) };
        }
    }
}

fn locks(cx: &mut Ctx) {
    cx.put("f", b"lockable");
    let a = open(&cx.p("f"), libc::O_RDWR, 0);
    let b = open(&cx.p("f"), libc::O_RDWR, 0);
    let (Some(a), Some(b)) = (cx.setup("open a", a), cx.setup("open b", b)) else {
        return;
    };
    cx.ok("flock(a, LOCK_EX)", flock(&a, libc::LOCK_EX));
    cx.ok(
        "flock(b, LOCK_EX|LOCK_NB)",
        flock(&b, libc::LOCK_EX | libc::LOCK_NB),
    );
    cx.ok(
        "flock(b, LOCK_SH|LOCK_NB)",
        flock(&b, libc::LOCK_SH | libc::LOCK_NB),
    );
    cx.ok("flock(a, LOCK_UN)", flock(&a, libc::LOCK_UN));
    cx.ok(
        "flock(b, LOCK_SH|LOCK_NB)",
        flock(&b, libc::LOCK_SH | libc::LOCK_NB),
    );
    cx.ok(
        "flock(a, LOCK_SH|LOCK_NB)",
        flock(&a, libc::LOCK_SH | libc::LOCK_NB),
    );
    cx.ok(
        "flock(a, LOCK_EX|LOCK_NB)",
        flock(&a, libc::LOCK_EX | libc::LOCK_NB),
    );
    cx.ok("flock(b, LOCK_UN)", flock(&b, libc::LOCK_UN));
    cx.ok(
        "flock(a, LOCK_EX|LOCK_NB)",
        flock(&a, libc::LOCK_EX | libc::LOCK_NB),
    );
    cx.ok("flock(a, LOCK_UN)", flock(&a, libc::LOCK_UN));
    // OFD byte-range locks conflict between different open file descriptions
    let wr = libc::F_WRLCK;
    let rd = libc::F_RDLCK;
    cx.ok(
        "OFD_SETLK(a, WR, 0, 10)",
        fcntl_lock(&a, libc::F_OFD_SETLK, wr, 0, 10),
    );
    cx.ok(
        "OFD_SETLK(b, WR, 5, 10)",
        fcntl_lock(&b, libc::F_OFD_SETLK, wr, 5, 10),
    );
    cx.ok(
        "OFD_SETLK(b, RD, 5, 10)",
        fcntl_lock(&b, libc::F_OFD_SETLK, rd, 5, 10),
    );
    cx.ok(
        "OFD_SETLK(b, WR, 10, 10)",
        fcntl_lock(&b, libc::F_OFD_SETLK, wr, 10, 10),
    );
    match fcntl_lock(&b, libc::F_OFD_GETLK, wr, 0, 100) {
        Ok(fl) => cx.o(format!(
            "OFD_GETLK(b, WR, 0, 100): type={} start={} len={} pid={}",
            if fl.l_type as i32 == wr {
                "WR"
            } else if fl.l_type as i32 == rd {
                "RD"
            } else {
                "UNLCK"
            },
            fl.l_start,
            fl.l_len,
            fl.l_pid
        )),
        Err(e) => cx.o(format!("OFD_GETLK = {e}")),
    }
    cx.ok(
        "OFD_SETLK(a, UNLCK, 0, 10)",
        fcntl_lock(&a, libc::F_OFD_SETLK, libc::F_UNLCK, 0, 10),
    );
    cx.ok(
        "OFD_SETLK(b, WR, 0, 10)",
        fcntl_lock(&b, libc::F_OFD_SETLK, wr, 0, 10),
    );
    // read lock on a write-only fd fails
    if let Some(w) = cx.setup("open", open(&cx.p("f"), libc::O_WRONLY, 0)) {
        cx.ok(
            "OFD_SETLK(O_WRONLY fd, RD)",
            fcntl_lock(&w, libc::F_OFD_SETLK, rd, 100, 1),
        );
    }
    // OFD locks conflict with classic POSIX locks
    cx.ok(
        "F_SETLK(a, WR, 0, 10) vs OFD lock of b",
        fcntl_lock(&a, libc::F_SETLK, wr, 0, 10),
    );
    cx.ok(
        "OFD_SETLK(b, UNLCK, 0, 0)",
        fcntl_lock(&b, libc::F_OFD_SETLK, libc::F_UNLCK, 0, 0),
    );
    // classic POSIX locks within one process never conflict
    cx.ok(
        "F_SETLK(a, WR, whole)",
        fcntl_lock(&a, libc::F_SETLK, wr, 0, 0),
    );
    cx.ok(
        "F_SETLK(b, WR, whole)",
        fcntl_lock(&b, libc::F_SETLK, wr, 0, 0),
    );
    // but they do conflict with OFD locks of the same process
    cx.ok(
        "OFD_SETLK(b, RD, 0, 1) vs own POSIX lock",
        fcntl_lock(&b, libc::F_OFD_SETLK, rd, 0, 1),
    );
    cx.ok(
        "F_SETLK(a, UNLCK)",
        fcntl_lock(&a, libc::F_SETLK, libc::F_UNLCK, 0, 0),
    );
    cx.ok(
        "OFD_SETLK(b, RD, 0, 1) after unlock",
        fcntl_lock(&b, libc::F_OFD_SETLK, rd, 0, 1),
    );
}
