//! Composer's `GyroDropoutLayer`: the mask arithmetic ([`gyro_dropout`], [`iter_num`],
//! [`preselect_masks`]) and the module the surgery installs ([`GyroDropoutModule`]).

use std::sync::{Arc, Mutex};

use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_plugin_api::tch::{Device, Kind, Tensor};
use tessera_plugin_api::{device::upload, Error, Module};

use crate::KIND;

/// The mask schedule: `p`, `sigma` masks, `tau` in force at a time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Schedule {
    /// Drop probability of each feature in a preselected mask.
    pub p: f64,
    /// Masks drawn once, at the first training forward.
    pub sigma: i64,
    /// Masks in force at a time, each over `N / tau` consecutive samples.
    pub tau: i64,
    /// Training forwards between two selections of `tau` masks ([`iter_num`]).
    pub iter_num: u64,
}

/// Composer's selection period: `int(iters_per_epoch · max_epoch / sigma) · tau` training
/// forwards, with `iters_per_epoch · max_epoch` the run's training batches. `None` when that is
/// 0 (fewer batches than `sigma`; Composer then fails at the first forward, dividing by zero).
pub fn iter_num(training_batches: u64, sigma: i64, tau: i64) -> Option<u64> {
    let n = (training_batches / sigma as u64) * tau as u64;
    (n > 0).then_some(n)
}

/// `sigma` masks over `features` features, each entry kept (1) when a uniform draw from `draw`
/// exceeds `p` (Composer: `(torch.rand(sigma, features) > p).float()`), row by row.
pub fn preselect_masks(
    sigma: i64,
    features: i64,
    p: f64,
    mut draw: impl FnMut() -> f64,
) -> Result<Tensor, Error> {
    let values: Vec<f32> = (0..sigma * features)
        .map(|_| if draw() > p { 1.0 } else { 0.0 })
        .collect();
    Ok(Tensor::from_slice(&values).f_reshape([sigma, features])?)
}

/// Composer's training forward with the `tau` masks `selected` (`(tau, C)`) in force: sample
/// `i` of the batch uses row `i / (N / tau)`, kept features scaled by `1 / (1 − p)`. The batch
/// size must be a multiple of `tau`.
pub fn gyro_dropout(x: &Tensor, selected: &Tensor, p: f64) -> Result<Tensor, Error> {
    let n = *x
        .size()
        .first()
        .ok_or("gyro dropout needs a batch dimension")?;
    let tau = *selected.size().first().ok_or("no selected masks")?;
    if tau == 0 || n % tau != 0 || n < tau {
        return Err(Error::from(format!(
            "gyro_dropout: the batch of {n} samples is not a multiple of tau = {tau} (each of \
             the tau masks covers N / tau samples); use a batch size divisible by tau"
        )));
    }
    let mask = upload(&selected.f_to_kind(x.kind())?, x.device())?.f_repeat_interleave_self_int(
        n / tau,
        Some(0),
        None,
    )?;
    Ok(x.f_mul(&mask)?.f_mul_scalar(1.0 / (1.0 - p))?)
}

/// One layer's draws: its own generator (seeded from the host's stream at surgery), the
/// training forwards so far, the preselected masks and the picks in force.
#[derive(Debug)]
pub struct LayerState {
    /// The generator's seed (drawn from the host's seeded stream).
    pub seed: u64,
    /// The generator's position in its stream (32-bit words), for checkpoints.
    pub word_pos: u128,
    /// Training forwards so far (Composer's `iter_num` counter).
    pub step: u64,
    /// The `(sigma, C)` masks, drawn at the first training forward.
    pub preselected: Option<Tensor>,
    /// The rows of `preselected` in force (`tau` of them, repeats possible).
    pub picks: Vec<i64>,
}

impl LayerState {
    /// A layer that has not trained yet, its draws coming from `seed`.
    pub fn new(seed: u64) -> LayerState {
        LayerState {
            seed,
            word_pos: 0,
            step: 0,
            preselected: None,
            picks: Vec::new(),
        }
    }

    fn rng(&self) -> ChaCha8Rng {
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        rng.set_word_pos(self.word_pos);
        rng
    }

    /// The masks in force for the next training forward on `x`, drawing the preselected masks
    /// at the first one and `tau` new picks every `iter_num` forwards; counts the forward.
    pub fn next_masks(&mut self, x: &Tensor, schedule: &Schedule) -> Result<Tensor, Error> {
        let mut rng = self.rng();
        let features = *x
            .size()
            .get(1)
            .ok_or("gyro dropout needs (N, C) activations")?;
        if self.preselected.is_none() {
            let unit = |rng: &mut ChaCha8Rng| (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
            let masks = preselect_masks(schedule.sigma, features, schedule.p, || unit(&mut rng))?;
            self.preselected = Some(masks);
        }
        // Drawn (or restored from a checkpoint) on the host: uploaded once, without a blocking
        // copy, and picked from on the device.
        if let Some(masks) = self
            .preselected
            .as_ref()
            .filter(|m| m.device() != x.device())
        {
            self.preselected = Some(upload(masks, x.device())?);
        }
        if self.step.is_multiple_of(schedule.iter_num) {
            self.picks = (0..schedule.tau)
                .map(|_| rng.gen_range(0..schedule.sigma))
                .collect();
        }
        self.word_pos = rng.get_word_pos();
        self.step += 1;
        let preselected = self.preselected.as_ref().ok_or("no preselected masks")?;
        if preselected.size().get(1) != Some(&features) {
            return Err(Error::from(format!(
                "gyro_dropout: masks over {:?} features, activations with {features}",
                preselected.size().get(1)
            )));
        }
        let picks = upload(&Tensor::from_slice(&self.picks), x.device())?;
        Ok(preselected.f_index_select(0, &picks)?)
    }
}

/// The gyro dropout module: [`gyro_dropout`] in training, the identity in evaluation.
pub struct GyroDropoutModule {
    /// The mask schedule.
    pub schedule: Schedule,
    /// The layer's draws, shared with the method (which saves them in checkpoints).
    pub state: Arc<Mutex<LayerState>>,
}

impl Module for GyroDropoutModule {
    fn kind(&self) -> &str {
        KIND
    }

    fn attrs(&self) -> Vec<(String, f64)> {
        vec![
            ("p".to_owned(), self.schedule.p),
            ("sigma".to_owned(), self.schedule.sigma as f64),
            ("tau".to_owned(), self.schedule.tau as f64),
            ("iter_num".to_owned(), self.schedule.iter_num as f64),
        ]
    }

    fn forward(&self, input: &Tensor, train: bool) -> Result<Tensor, Error> {
        if !train {
            return Ok(input.shallow_clone());
        }
        let selected = {
            let mut state = self
                .state
                .lock()
                .map_err(|_| "gyro_dropout: state poisoned")?;
            state.next_masks(input, &self.schedule)?
        };
        gyro_dropout(input, &selected, self.schedule.p)
    }

    /// In evaluation the layer is the identity, as a plain dropout is: it folds back into one
    /// (which holds no tensors).
    fn export(&self) -> Result<Option<Vec<(String, Tensor)>>, Error> {
        Ok(Some(Vec::new()))
    }
}

/// A CPU float tensor of the masks, for checkpoints.
pub(crate) fn to_cpu(t: &Tensor) -> Result<Tensor, Error> {
    Ok(t.f_to_device(Device::Cpu)?.f_to_kind(Kind::Float)?)
}
