#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod config;
mod method;
mod update;

use tessera_plugin_api::{export_plugin, Error, Event, Hook, Plugin, Settings};

pub use config::{smoothing_from_half_life, EmaConfig};
pub use method::{Ema, INIT_PRIORITY, RESTORE_PRIORITY, STATE_FORMAT_VERSION, SWAP_PRIORITY};
/// The time strings of the settings: plugin-api's [`tessera_plugin_api::Time`], the host's
/// grammar.
pub use tessera_plugin_api::Time;
pub use update::{compute_ema, ema_update};

impl Plugin for Ema {
    const NAME: &'static str = "ema";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const DESCRIPTION: &'static str =
        "exponential moving average of the weights, swapped in for evaluation";
    const DEFAULT_SETTINGS: &'static str = "half_life = \"1000ba\"\nema_start = \"0.0dur\"\n\
        # smoothing = 0.999 (instead of half_life)\n\
        # update_interval = \"1ba\" (default: one unit of half_life's unit)";

    fn hooks() -> Vec<Hook> {
        let at = |event, priority| Hook { event, priority };
        vec![
            at(Event::INIT, INIT_PRIORITY),
            Hook::at(Event::FIT_START),
            at(Event::BATCH_START, SWAP_PRIORITY),
            // After a checkpoint swapped the EMA weights in, the training weights come back at
            // the very next training event, so that no method (selective backprop scores the
            // batch at `after_dataloader`) sees the EMA weights during training: writing a
            // checkpoint never changes the run.
            at(Event::EPOCH_START, SWAP_PRIORITY),
            at(Event::BEFORE_DATALOADER, SWAP_PRIORITY),
            at(Event::FIT_END, SWAP_PRIORITY),
            Hook::at(Event::BATCH_END),
            Hook::at(Event::EPOCH_END),
            at(Event::EVAL_START, SWAP_PRIORITY),
            at(Event::EVAL_END, RESTORE_PRIORITY),
            at(Event::BATCH_CHECKPOINT, SWAP_PRIORITY),
            at(Event::EPOCH_CHECKPOINT, SWAP_PRIORITY),
            at(Event::ITERATION_CHECKPOINT, SWAP_PRIORITY),
        ]
    }

    fn create(settings: &Settings) -> Result<Self, Error> {
        Ok(Ema::new(EmaConfig::from_settings(settings)?))
    }
}

export_plugin!(Ema);
