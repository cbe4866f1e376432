#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod config;
mod method;
mod update;

use tessera_plugin_api::{export_plugin, Error, Event, Hook, Plugin, Settings};

pub use config::{airbench_decay, LookaheadConfig, Variant};
pub use method::{Lookahead, ModelTensor, Outcome, STATE_FORMAT_VERSION, SYNC_PRIORITY};
pub use tessera_plugin_api::kit::{copy_into, detached_copy};
pub use update::sync_tensor;

impl Plugin for Lookahead {
    const NAME: &'static str = "lookahead";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const DESCRIPTION: &'static str =
        "slow weights pulled towards the model and written back every k steps (Lookahead, or airbench's EMA)";
    const DEFAULT_SETTINGS: &'static str = "variant = \"lookahead\"\nk = 5\nalpha = 0.5\n\
        buffers = false\nfinal_copy = true\n\
        # total_steps = 1000 (default: the run's length in batches)\n\
        # variant = \"ema\" (airbench): decay_base = 0.95, decay_power = 3.0, buffers = true";

    fn hooks() -> Vec<Hook> {
        vec![
            Hook::at(Event::BATCH_START),
            Hook {
                event: Event::BATCH_END,
                priority: SYNC_PRIORITY,
            },
            Hook::at(Event::FIT_END),
            // Under sharding: the slow weights gathered whole for a checkpoint.
            Hook::at(Event::BATCH_CHECKPOINT),
            Hook::at(Event::EPOCH_CHECKPOINT),
            Hook::at(Event::ITERATION_CHECKPOINT),
        ]
    }

    fn create(settings: &Settings) -> Result<Self, Error> {
        Ok(Lookahead::new(LookaheadConfig::from_settings(settings)?))
    }
}

export_plugin!(Lookahead);
