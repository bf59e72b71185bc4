//! The FUSE file system the kernel talks to ([`fs`]), its host locks ([`locks`]) and FUSE
//! over io_uring ([`io_uring`]).

pub mod fs;
pub mod io_uring;
pub mod locks;
pub mod reply;
