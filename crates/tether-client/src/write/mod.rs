//! How what the guest writes reaches the host: the write mode ([`mode`]), small writes
//! answered once sent ([`behind`]), creations answered with spare files ([`spares`]), and
//! the flusher of the writeback cache ([`flusher`]).

pub mod behind;
pub mod flusher;
pub mod mode;
pub mod spares;
