#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod layer;

use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tessera_plugin_api::kit::{json_state, walk, StateReader};
use tessera_plugin_api::{
    export_plugin, Context, Error, Event, Hook, Method, ModuleInfo, Plugin, Settings, State,
};

pub use layer::{gyro_dropout, iter_num, preselect_masks, GyroDropoutModule, LayerState, Schedule};

/// Module kind of the host's dropout.
pub const DROPOUT: &str = "dropout";
/// Module kind of a gyro dropout.
pub const KIND: &str = "gyro_dropout";
/// Metric: dropouts replaced by gyro dropout.
pub const METRIC_NUM_LAYERS: &str = "gyro_dropout/num_layers";
/// Metric: the selection period in training forwards.
pub const METRIC_ITER_NUM: &str = "gyro_dropout/iter_num";
/// Layout of the method's checkpoint state.
const STATE_FORMAT: u32 = 1;

/// The dropouts the method replaces: every `dropout` of the tree (Composer: `nn.Dropout`, not
/// its 1-d/2-d/3-d variants; a replaced one shows the kind [`KIND`]).
pub fn targets(modules: &[ModuleInfo]) -> Vec<String> {
    walk::of_kind(modules, DROPOUT)
        .map(|m| m.path.to_string())
        .collect()
}

/// The GyroDropout method: surgery at `init`, the layers' draws in checkpoints.
#[derive(Debug)]
pub struct GyroDropout {
    p: f64,
    sigma: i64,
    tau: i64,
    layers: Vec<Arc<Mutex<LayerState>>>,
}

/// One layer's draws in a checkpoint (the masks go as tensors).
#[derive(Serialize, Deserialize)]
struct SavedLayer {
    seed: u64,
    /// `u128` as text (JSON numbers are not that wide).
    word_pos: String,
    step: u64,
    picks: Vec<i64>,
}

impl GyroDropout {
    /// Composer's `apply_gyro_dropout(model, iters_per_epoch, max_epoch, p, sigma, tau)` over the
    /// host's model, the run's training batches standing for `iters_per_epoch · max_epoch`:
    /// every dropout becomes a [`GyroDropoutModule`] whose draws come from a generator seeded
    /// from the host's stream. Returns the schedule, `None` when the model has no dropout.
    pub fn apply(&mut self, ctx: &mut Context<'_>) -> Result<Option<Schedule>, Error> {
        self.layers.clear();
        let paths = targets(&ctx.modules()?);
        if paths.is_empty() {
            return Ok(None);
        }
        let batches = ctx.time().max_batches;
        let iter_num = iter_num(batches, self.sigma, self.tau).ok_or_else(|| {
            Error::config(format!(
                "gyro_dropout: the run has {batches} training batches, fewer than `sigma` = {}: \
                 the masks would never be re-selected (Composer divides by zero here); lower \
                 `sigma` or train longer",
                self.sigma
            ))
        })?;
        let schedule = Schedule {
            p: self.p,
            sigma: self.sigma,
            tau: self.tau,
            iter_num,
        };
        for path in paths {
            let state = Arc::new(Mutex::new(LayerState::new(ctx.rng_u64())));
            self.layers.push(Arc::clone(&state));
            ctx.replace_module(&path, GyroDropoutModule { schedule, state }, Vec::new())?;
        }
        Ok(Some(schedule))
    }
}

impl Method for GyroDropout {
    fn on_event(&mut self, _event: Event, ctx: &mut Context<'_>) -> Result<(), Error> {
        let Some(schedule) = self.apply(ctx)? else {
            ctx.warn("gyro_dropout: the model has no dropout layers; nothing to do");
            ctx.log_metric(METRIC_NUM_LAYERS, 0.0);
            return Ok(());
        };
        ctx.info(&format!(
            "gyro_dropout: {} dropouts replaced (p {}, sigma {}, tau {}, new masks every {} \
             training forwards)",
            self.layers.len(),
            schedule.p,
            schedule.sigma,
            schedule.tau,
            schedule.iter_num
        ));
        ctx.log_metric(METRIC_NUM_LAYERS, self.layers.len() as f64);
        ctx.log_metric(METRIC_ITER_NUM, schedule.iter_num as f64);
        Ok(())
    }

    fn state(&self) -> Result<State, Error> {
        let mut saved = Vec::new();
        let mut tensors = Vec::new();
        for (i, layer) in self.layers.iter().enumerate() {
            let layer = layer.lock().map_err(|_| "gyro_dropout: state poisoned")?;
            saved.push(SavedLayer {
                seed: layer.seed,
                word_pos: layer.word_pos.to_string(),
                step: layer.step,
                picks: layer.picks.clone(),
            });
            if let Some(masks) = &layer.preselected {
                tensors.push((format!("{i}/preselected"), layer::to_cpu(masks)?));
            }
        }
        json_state("gyro_dropout", STATE_FORMAT, &saved, tensors)
    }

    fn load_state(&mut self, state: State) -> Result<(), Error> {
        let mut reader = StateReader::open("gyro_dropout", state, STATE_FORMAT)?;
        let saved: Vec<SavedLayer> = reader.json()?;
        if saved.len() != self.layers.len() {
            return Err(Error::from(format!(
                "gyro_dropout: the checkpoint has {} gyro dropouts, the model {}",
                saved.len(),
                self.layers.len()
            )));
        }
        let mut masks: Vec<(String, _)> = reader.take_all();
        for (i, (s, layer)) in saved.into_iter().zip(&self.layers).enumerate() {
            let mut layer = layer.lock().map_err(|_| "gyro_dropout: state poisoned")?;
            layer.seed = s.seed;
            layer.word_pos = s
                .word_pos
                .parse()
                .map_err(|_| format!("gyro_dropout: bad word_pos {:?}", s.word_pos))?;
            layer.step = s.step;
            layer.picks = s.picks;
            let name = format!("{i}/preselected");
            layer.preselected = masks
                .iter()
                .position(|(n, _)| *n == name)
                .map(|at| masks.swap_remove(at).1);
        }
        Ok(())
    }
}

impl Plugin for GyroDropout {
    const NAME: &'static str = "gyro_dropout";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const DESCRIPTION: &'static str =
        "replaces dropout by sigma preselected masks, tau of them in force at a time";
    const DEFAULT_SETTINGS: &'static str = "p = 0.5\nsigma = 256\ntau = 16";

    fn hooks() -> Vec<Hook> {
        vec![Hook::at(Event::INIT)]
    }

    fn create(settings: &Settings) -> Result<Self, Error> {
        let p = settings.f64("p")?;
        if !(0.0..1.0).contains(&p) {
            return Err(Error::config(format!("`p` must be in [0, 1), got {p}")));
        }
        let positive = |key: &str, default: u64| -> Result<i64, Error> {
            let v = settings.u64_or(key, default)?;
            if v == 0 || v > i32::MAX as u64 {
                return Err(Error::config(format!(
                    "`{key}` must be a positive integer, got {v}"
                )));
            }
            Ok(v as i64)
        };
        let sigma = positive("sigma", 256)?;
        let tau = positive("tau", 16)?;
        Ok(GyroDropout {
            p,
            sigma,
            tau,
            layers: Vec::new(),
        })
    }
}

export_plugin!(GyroDropout);
