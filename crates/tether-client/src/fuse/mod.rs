//! The FUSE file system the kernel talks to: [`fs`] holds its state and the door requests
//! come in by, and the areas answer them (`entry`: names, `attr`: attributes, `io`: file
//! contents, `dir`: directories, `xattr`, `lock`: the kernel's side of locks, `init`: start
//! and end; what they share is in `answer`). Also its host locks ([`locks`]) and FUSE over
//! io_uring ([`io_uring`]).

mod answer;
mod attr;
mod dir;
mod entry;
pub mod fs;
mod init;
mod io;
pub mod io_uring;
mod lock;
pub mod locks;
pub mod reply;
mod xattr;
