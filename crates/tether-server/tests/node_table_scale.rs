//! The node table at 1,000,000 entries: every node findable, forgets remove them, and the
//! descriptor budget keeps the process far below its open-file limit throughout.

use std::ffi::CString;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use tether_proto::{NodeId, ROOT_NODE};
use tether_server::backend::{linux::Linux, sys};
use tether_server::export::{FdBudget, NodeTable};

fn fake_stat(dev: u64, ino: u64) -> libc::stat {
    // SAFETY: libc::stat is plain old data; all-zero is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    st.st_dev = dev;
    st.st_ino = ino;
    st.st_mode = libc::S_IFREG | 0o644;
    st
}

#[test]
fn a_million_nodes_stay_addressable_with_bounded_descriptors() {
    let dir = tempfile::tempdir().unwrap();
    let root: OwnedFd = std::fs::File::open(dir.path()).unwrap().into();
    let dev = sys::fstat(root.as_fd()).unwrap().st_dev;
    let budget = FdBudget::new(1000);
    let host = Arc::new(Linux::open().unwrap());
    let table = NodeTable::new(root.try_clone().unwrap(), budget.clone(), host).unwrap();
    const N: u64 = 1_000_000;
    for i in 0..N {
        let fd = root.try_clone().unwrap();
        let name = CString::new(format!("n{i}")).unwrap();
        table.remember(
            fd,
            (&fake_stat(dev, 1_000_000_000 + i), None),
            ROOT_NODE,
            name,
        );
        assert!(budget.open_count() <= 1001, "budget exceeded at {i}");
    }
    assert_eq!(table.len() as u64, N + 1);
    assert!(budget.evictions() >= N - 1000);
    for i in (0..N).step_by(9973) {
        let node = table.get(NodeId::new(1_000_000_000 + i)).unwrap();
        assert_eq!(node.ino, 1_000_000_000 + i);
    }
    for i in 0..N {
        table.forget(NodeId::new(1_000_000_000 + i), 1);
    }
    assert_eq!(table.len(), 1, "only the root remains");
    assert!(
        budget.open_count() <= 1,
        "forgotten nodes released their descriptors"
    );
}
