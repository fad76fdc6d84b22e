//! # lockwright-chaos
//!
//! Testcontainers scenarios that inject the model's faults into real Redis
//! masters and check that reality agrees with the verdict matrix.
