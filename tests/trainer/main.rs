//! The trainer itself: training, checkpoints and resume, the CLI, config errors, time strings,
//! metrics, losses, the stand-alone binary, time-to-target, sweeps, recipe search, tracking
//! (MLflow), the explorer, step syncs.
//!
//! One of the few test binaries (tests/Cargo.toml): cargo links it once, and its tests share one
//! pool of test threads. Each file below is one feature or method; docs/testing.md lists them.

mod checkpoint;
mod cli;
mod config_errors;
mod explore;
mod loss;
mod metrics;
mod mlflow;
mod plateau;
mod recipe_search;
mod standalone;
mod step_syncs;
mod sweep;
mod target;
mod time_strings;
mod train;
