//! Shared mappings through the mount: writes through MAP_SHARED reach read() and the host
//! after msync, and a host-side change reaches the mapped pages.

mod common;

use std::fs;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use common::TestMount;

struct Mapping {
    ptr: *mut u8,
    len: usize,
}

impl Mapping {
    fn shared(file: &fs::File, len: usize) -> Mapping {
        // SAFETY: a fresh shared mapping of an open file; unmapped in Drop.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(
            ptr,
            libc::MAP_FAILED,
            "mmap: {}",
            std::io::Error::last_os_error()
        );
        Mapping {
            ptr: ptr.cast(),
            len,
        }
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: the mapping is len bytes long and lives as long as self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    fn msync(&self) {
        // SAFETY: syncing our own mapping.
        let r = unsafe { libc::msync(self.ptr.cast(), self.len, libc::MS_SYNC) };
        assert_eq!(r, 0, "msync: {}", std::io::Error::last_os_error());
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping what mmap returned.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

#[test]
fn shared_mapping_writes_reach_read_and_the_host_after_msync() {
    require_mount!();
    let t = TestMount::start();
    let len = 3 * 4096;
    fs::write(t.export.join("m"), vec![b'.'; len]).unwrap();
    let file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(t.mnt.join("m"))
        .unwrap();
    let mut map = Mapping::shared(&file, len);
    map.bytes()[..5].copy_from_slice(b"first");
    map.bytes()[2 * 4096..2 * 4096 + 4].copy_from_slice(b"last");
    map.msync();
    let through_read = fs::read(t.mnt.join("m")).unwrap();
    assert_eq!(&through_read[..5], b"first");
    assert_eq!(&through_read[2 * 4096..2 * 4096 + 4], b"last");
    let on_host = fs::read(t.export.join("m")).unwrap();
    assert_eq!(&on_host[..5], b"first");
    assert_eq!(&on_host[2 * 4096..2 * 4096 + 4], b"last");
    assert_eq!(on_host.len(), len);
}

#[test]
fn a_host_change_reaches_mapped_pages() {
    require_mount!();
    let t = TestMount::start();
    let len = 2 * 4096;
    fs::write(t.export.join("m"), vec![b'a'; len]).unwrap();
    let file = fs::File::open(t.mnt.join("m")).unwrap();
    // SAFETY: a read-only shared mapping of an open file; unmapped below.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    assert_ne!(ptr, libc::MAP_FAILED);
    // SAFETY: the mapping is len bytes long until munmap below.
    let mapped = unsafe { std::slice::from_raw_parts(ptr as *const u8, len) };
    assert!(mapped.iter().all(|&b| b == b'a'));
    // The host rewrites the file in place, same size.
    fs::write(t.export.join("m"), vec![b'b'; len]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    // SAFETY: reading through a volatile pointer so each poll reads the page again.
    let first = || unsafe { std::ptr::read_volatile(ptr as *const u8) };
    let last = || unsafe { std::ptr::read_volatile((ptr as *const u8).add(len - 1)) };
    while first() != b'b' || last() != b'b' {
        assert!(
            Instant::now() < deadline,
            "the mapped pages still show the old content 5 s after the host change"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // SAFETY: unmapping what mmap returned.
    unsafe { libc::munmap(ptr, len) };
}
