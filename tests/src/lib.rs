//! # lockwright-tests
//!
//! Integration tests across crates: the Redis adapter against real
//! `redis-server` processes, and conformance of the keyspace model with Redis.
