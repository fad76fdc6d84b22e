//! # lockwright-model
//!
//! Stateright models that check the core's own machines against every fault
//! class, the verdict matrix, and the `lockwright` command line.
