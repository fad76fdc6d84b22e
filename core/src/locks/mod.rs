//! The lock protocols of the catalogue, one file each.

pub(crate) mod lease_lock;

pub mod fenced;
pub mod redlock;
pub mod reentrant;
pub mod set_px_get_del;
pub mod set_px_lua;
pub mod set_px_watch;
pub mod setnx_del;
pub mod setnx_expire;
pub mod setnx_getset;
pub mod time_fenced;
