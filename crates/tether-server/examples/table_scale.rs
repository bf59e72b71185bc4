//! Micro-benchmark: cost of node-table operations as the table grows to 1,000,000 entries.
//! `cargo run --release -p tether-server --example table_scale`

use std::ffi::CString;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::Instant;

use tether_proto::{NodeId, ROOT_NODE};
use tether_server::backend::{linux::Linux, sys};
use tether_server::export::{FdBudget, NodeTable};

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let root: OwnedFd = std::fs::File::open(dir.path()).unwrap().into();
    let dev = sys::fstat(root.as_fd()).unwrap().st_dev;
    let host = Arc::new(Linux::open().unwrap());
    let table = NodeTable::new(root.try_clone().unwrap(), FdBudget::new(4096), host).unwrap();
    // SAFETY: libc::stat is plain old data.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    st.st_dev = dev;
    st.st_mode = libc::S_IFREG | 0o644;
    let mut inserted = 0u64;
    println!(
        "{:>10} {:>14} {:>12}",
        "entries", "insert ns/op", "get ns/op"
    );
    for target in [1_000u64, 10_000, 100_000, 1_000_000] {
        let t = Instant::now();
        let before = inserted;
        while inserted < target {
            st.st_ino = 10_000_000 + inserted;
            let name = CString::new(format!("n{inserted}")).unwrap();
            table.remember(root.try_clone().unwrap(), (&st, None), ROOT_NODE, name);
            inserted += 1;
        }
        let insert_ns = t.elapsed().as_nanos() as f64 / (inserted - before) as f64;
        let probes = 200_000u64;
        let t = Instant::now();
        let mut x = 0u64;
        for i in 0..probes {
            let id = 10_000_000 + (i * 7919) % inserted;
            x = x.wrapping_add(table.get(NodeId::new(id)).unwrap().ino);
        }
        let get_ns = t.elapsed().as_nanos() as f64 / probes as f64;
        std::hint::black_box(x);
        println!("{target:>10} {insert_ns:>14.0} {get_ns:>12.1}");
    }
    println!("(insert includes one dup() per node, as a real lookup opens one descriptor)");
}
