//! # lockwright-redis
//!
//! The thin tokio + redis driver that runs `lockwright-core` machines against
//! real Redis servers, and the async lock and semaphore API built on it.
//! It adds no protocol logic of its own.
