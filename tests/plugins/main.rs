//! Plugins as files: load errors and faults, older plugin-api versions, new-plugin, stand-alone
//! plugin crates, installing.
//!
//! One of the few test binaries (tests/Cargo.toml): cargo links it once, and its tests share one
//! pool of test threads. Each file below is one feature or method; docs/testing.md lists them.

mod crates;
mod install;
mod new_plugin;
mod plugin_api_16;
mod plugin_compat;
mod plugin_errors;
mod plugin_faults;

// standalone_plugin.rs is a test binary of its own (tests/Cargo.toml): it builds a copy of
// label_smoothing into the shared target folder, which overwrites the workspace's
// liblabel_smoothing.so until it puts it back, so no other test may run beside it.
