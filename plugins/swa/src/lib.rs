#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod average;
mod config;
mod method;
mod swalr;

use tessera_plugin_api::{export_plugin, Error, Event, Hook, Plugin, Settings};

pub use average::{check_matches, swa_update, update_average, ModelTensor};
pub use config::{AnnealStrategy, SwaConfig, SwaLrMode};
pub use method::{Outcome, Swa, STATE_FORMAT_VERSION};
pub use swalr::{swalr_lr, Swalr};
/// The time strings of the settings: plugin-api's [`tessera_plugin_api::Time`], the host's
/// grammar.
pub use tessera_plugin_api::Time;

impl Plugin for Swa {
    const NAME: &'static str = "swa";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const DESCRIPTION: &'static str =
        "stochastic weight averaging: the running mean of late weights replaces the model's";
    const DEFAULT_SETTINGS: &'static str = "swa_start = \"0.7dur\"\nswa_end = \"0.97dur\"\n\
        update_interval = \"1ep\"\nschedule_swa_lr = false\nanneal_strategy = \"linear\"\n\
        anneal_steps = 10\nswa_lr_mode = \"composer\"\n\
        # swa_lr = 0.01 (used only with swa_lr_mode = \"hold\")";

    fn hooks() -> Vec<Hook> {
        vec![
            Hook::at(Event::BATCH_END),
            Hook::at(Event::EPOCH_END),
            Hook::at(Event::FIT_END),
            // Under sharding: the average gathered whole for a checkpoint.
            Hook::at(Event::BATCH_CHECKPOINT),
            Hook::at(Event::EPOCH_CHECKPOINT),
            Hook::at(Event::ITERATION_CHECKPOINT),
        ]
    }

    fn create(settings: &Settings) -> Result<Self, Error> {
        Ok(Swa::new(SwaConfig::from_settings(settings)?))
    }
}

export_plugin!(Swa);
