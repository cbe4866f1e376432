//! One module per `tessera` command: its arguments (`Args`, parsed by clap) and its `run`.

pub mod data;
pub mod eval;
pub mod explore;
pub mod export;
pub mod generate;
pub mod launch;
pub mod new_plugin;
pub mod plugins;
pub mod predict;
pub mod recipe;
pub mod sweep;
pub mod train;
