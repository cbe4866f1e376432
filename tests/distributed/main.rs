//! Ranks: the launcher, data-parallel training and sharding.
//!
//! One of the few test binaries (tests/Cargo.toml): cargo links it once, and its tests share one
//! pool of test threads. Each file below is one feature or method; docs/testing.md lists them.

mod distributed;
mod launch;
mod sharding;
