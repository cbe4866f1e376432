//! The state at `init` (`SetupState`): the model before the optimizer exists, the clock, what
//! methods may log, claim or draw, and the training samples they may read (`Sampler`).

use rand_chacha::{rand_core::SeedableRng, ChaCha8Rng};
use tch::Tensor;

use super::{CallError, Clock};
use crate::model::Model;
use crate::precision::Precision;
use crate::time::{RunLength, Timestamp};

/// The state at `init`: the model before the optimizer exists (so surgery may change its
/// parameters freely), the clock, and what methods may log or draw.
pub struct SetupState {
    /// The model.
    pub model: Model,
    /// The run's precision.
    pub precision: Precision,
    /// The clock (at zero).
    pub clock: Clock,
    /// Metrics methods logged since the trainer last collected them.
    pub metrics: Vec<(String, f64)>,
    /// The learning rate the optimizer will start from.
    pub initial_lr: f64,
    /// Methods' scaling of the first step's rate, handed to the optimizer when it is built.
    pub lr_scale: f64,
    /// Whether a method listed the model's modules (to look for layers to change by surgery).
    pub modules_listed: bool,
    /// Parameters methods claimed to update themselves (plugin-api 1.6), with the index of the
    /// method (in configuration order) that claimed each.
    pub claims: Vec<(usize, String)>,
    /// The index of the method the engine is calling.
    pub current_method: usize,
    /// Reads training samples for `training_sample` (plugin-api 1.6); none in unit tests.
    pub sampler: Option<Sampler>,
    pub(super) rng: ChaCha8Rng,
}

/// Reads up to `n` training samples as the model sees them (named batch tensors on the
/// training device), without moving the run's loader.
pub type Sampler = Box<dyn FnMut(usize) -> Result<Vec<(String, Tensor)>, CallError>>;

impl SetupState {
    /// The set-up state of a run of `model`; `seed` fixes the methods' random stream.
    pub fn new(
        model: Model,
        precision: Precision,
        run: RunLength,
        initial_lr: f64,
        seed: u64,
    ) -> Self {
        SetupState {
            model,
            precision,
            clock: Clock {
                timestamp: Timestamp::default(),
                run,
                training: true,
            },
            metrics: Vec::new(),
            initial_lr,
            lr_scale: 1.0,
            modules_listed: false,
            claims: Vec::new(),
            current_method: 0,
            sampler: None,
            // A stream of its own, so methods drawing numbers never shift the data order.
            rng: ChaCha8Rng::seed_from_u64(seed ^ 0x7e55_e4a0_0000_0001),
        }
    }
}

#[cfg(test)]
impl SetupState {
    /// A CPU set-up state over a tiny MLP (one epoch of 4 batches), for unit tests.
    pub fn for_tests() -> SetupState {
        let config = crate::model::ModelConfig {
            name: crate::model::ModelName::Mlp,
            torchscript: None,
            hidden: vec![4],
            widths: Vec::new(),
            width: None,
            num_classes: 2,
            dropout: 0.0,
            norm: None,
            gpt2: None,
            bert: None,
            llama: None,
            vit: None,
            init: None,
        };
        let shape = crate::model::InputShape {
            channels: 1,
            height: 2,
            width: 2,
        };
        let model = Model::build(&config, shape, 2, tch::Device::Cpu).expect("tiny model");
        let one_epoch = crate::time::Time::new(1, crate::time::TimeUnit::Epoch);
        let run = RunLength::new(one_epoch, 4, 2).expect("a run length");
        SetupState::new(model, Precision::Fp32, run, 0.1, 0)
    }
}
