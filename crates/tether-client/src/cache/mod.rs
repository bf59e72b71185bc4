//! What the client keeps, and the one rule for how long it may be trusted ([`coherence`]:
//! the push sequence and its ordering rule): attributes, names, nodes, prefetched listings,
//! what this mount wrote.

pub mod coherence;
pub mod known_attrs;
pub mod partial_pages;
pub mod prefetch;
pub mod written_files;
