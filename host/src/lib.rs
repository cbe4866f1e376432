//! Tessera: a fast deep-learning trainer on libtorch whose speed-up methods are binary plugins.
//!
//! One folder per concern: `config` (trainer.toml), `time` (Time, Timestamp, durations),
//! `checkpoint` (saving and resuming runs), `data` (datasets, loaders, transforms, fetching), `model` (module tree and zoo), `optim`
//! (optimizers, schedules), `engine` (events and dispatch), `plugin` (loading plugins, the
//! host side of the ABI), `precision` (autocast), `trainer` (the loops), `report` (progress, metrics, run records),
//! `scaffold` (`tessera new-plugin`), `export` (`tessera export`: weights for PyTorch).

pub mod checkpoint;
pub mod config;
pub mod data;
pub mod engine;
pub mod export;
pub mod model;
pub mod optim;
pub mod plugin;
pub mod precision;
pub mod report;
pub mod scaffold;
pub mod time;
pub mod trainer;
