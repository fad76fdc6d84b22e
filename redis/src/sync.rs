//! The synchronisation primitives the lease state uses: `std::sync`
//! normally, `loom::sync` under `--cfg loom`, so that the loom tests explore
//! every interleaving of the real code (the shape of tokio's `loom` module).

#[cfg(loom)]
pub(crate) use loom::sync::{Arc, Mutex, MutexGuard};
#[cfg(not(loom))]
pub(crate) use std::sync::{Arc, Mutex, MutexGuard};
