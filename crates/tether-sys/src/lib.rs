//! Facts about the machine that both the server and the client read from the kernel.
//! No protocol, no transport: only what the operating system says.

pub mod mountinfo;
