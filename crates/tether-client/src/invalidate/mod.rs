//! What turns host changes into the guest kernel's view: replays of host events as guest
//! inotify events ([`host_events`]) and, with the writeback cache, the fixer that re-states
//! sizes and mtimes the kernel will not take from a reply ([`fixer`]).

pub mod fixer;
pub mod host_events;
