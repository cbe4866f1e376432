#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod config;
mod method;
mod select;
mod share;
mod update;

use tessera_plugin_api::{export_plugin, Error, Event, Hook, Plugin, Settings};

pub use config::{AdjustLr, MuonConfig, Variant, NS_COEFFICIENTS};
pub use method::{Muon, INIT_PRIORITY, STATE_FORMAT_VERSION};
pub use select::select_parameters;
pub use share::Plan;
pub use update::{matrix_shape, newton_schulz, MatrixGroup};

impl Plugin for Muon {
    const NAME: &'static str = "muon";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const DESCRIPTION: &'static str =
        "Muon: momentum orthogonalized by Newton–Schulz for the hidden weight matrices";
    const DEFAULT_SETTINGS: &'static str = "variant = \"torch\"\n\
        lr = 0.001\n\
        weight_decay = 0.1\n\
        momentum = 0.95\n\
        nesterov = true\n\
        ns_steps = 5\n\
        ns_coefficients = [3.4445, -4.775, 2.0315]\n\
        eps = 1e-7\n\
        adjust_lr = \"original\"\n\
        include = []\n\
        exclude = []\n\
        share_across_ranks = true\n\
        # variant = \"keller\": lr 0.02, weight_decay 0.0, no adjust_lr";

    fn hooks() -> Vec<Hook> {
        vec![
            Hook {
                event: Event::INIT,
                priority: INIT_PRIORITY,
            },
            Hook::at(Event::OPTIMIZER_STEP),
        ]
    }

    fn create(settings: &Settings) -> Result<Self, Error> {
        Ok(Muon::new(MuonConfig::from_settings(settings)?))
    }
}

export_plugin!(Muon);
