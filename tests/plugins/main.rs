//! Plugins as files: load errors and faults, older plugin-api versions, new-plugin, stand-alone
//! plugin crates, installing.
//!
//! One test binary of six (tests/Cargo.toml): cargo links it once, and its tests share one pool
//! of test threads. Each file below is one feature or method; docs/testing.md lists them.

mod install;
mod new_plugin;
mod plugin_api_16;
mod plugin_compat;
mod plugin_errors;
mod plugin_faults;
mod plugin_standalone;
