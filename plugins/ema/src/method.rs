//! The method: shadow weights taken at `init`, updated on the schedule, swapped into the model
//! for evaluation and checkpoints, and saved in the method's state.

use serde::{Deserialize, Serialize};
use tessera_plugin_api::tch::{self, Device, Kind, Tensor};
use tessera_plugin_api::{Context, Error, Event, Method, State};

use crate::config::EmaConfig;
use crate::update::{copy_into, detached_copy, ema_update};

/// The current layout of [`Method::state`].
pub const STATE_FORMAT_VERSION: u32 = 1;

/// The counters and flags saved in [`State::bytes`] (JSON).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
struct Flags {
    started: bool,
    swapped_in: bool,
    updates: u64,
}

/// Priority at `init`: after model surgery by other methods (which hook `init` at 0).
pub const INIT_PRIORITY: i32 = -1000;
/// Priority where EMA weights go in (`eval_start`, `*_checkpoint`) or training weights come
/// back (`batch_start`): before other methods look at the model.
pub const SWAP_PRIORITY: i32 = 1000;
/// Priority at `eval_end`: after other methods looked at the evaluated model.
pub const RESTORE_PRIORITY: i32 = -1000;

/// The EMA method.
pub struct Ema {
    config: EmaConfig,
    /// The shadow weights, by model name, in the host's order.
    ema: Vec<(String, Tensor)>,
    /// The training weights while the model holds the EMA weights (aligned with `ema`).
    training: Vec<Tensor>,
    /// Averaging has started (`ema_start` reached at an update event).
    started: bool,
    /// The model holds the EMA weights; the training weights are in `training`.
    swapped_in: bool,
    /// Updates done.
    updates: u64,
    /// The shadow weights came from `load_state` (so they must not be re-taken from the model).
    loaded: bool,
}

impl Ema {
    /// A method with these settings and no shadow weights yet (they are taken at `init`).
    pub fn new(config: EmaConfig) -> Ema {
        Ema {
            config,
            ema: Vec::new(),
            training: Vec::new(),
            started: false,
            swapped_in: false,
            updates: 0,
            loaded: false,
        }
    }

    /// The resolved settings.
    pub fn config(&self) -> &EmaConfig {
        &self.config
    }

    /// The shadow weights by name.
    pub fn ema_weights(&self) -> &[(String, Tensor)] {
        &self.ema
    }

    /// Whether averaging has started.
    pub fn started(&self) -> bool {
        self.started
    }

    /// Whether the model currently holds the EMA weights.
    pub fn swapped_in(&self) -> bool {
        self.swapped_in
    }

    /// Updates done so far.
    pub fn updates(&self) -> u64 {
        self.updates
    }

    /// The model's tensors (shared with the host) under the shadow weights' names.
    fn model_tensors(&self, ctx: &Context<'_>) -> Result<Vec<Tensor>, Error> {
        self.ema
            .iter()
            .map(|(name, _)| {
                ctx.parameter(name)?.ok_or_else(|| {
                    Error::from(format!("the model no longer has `{name}` (EMA tracks it)"))
                })
            })
            .collect()
    }

    /// Shadow (and spare training) copies of the model's trainable parameters and all its
    /// buffers, as Composer's `EMAParameters`: a frozen parameter (`requires_grad` off) is not
    /// averaged, and the model keeps its own value for it at evaluation.
    fn snapshot(&mut self, ctx: &Context<'_>) -> Result<(), Error> {
        let mut ema = Vec::new();
        let mut training = Vec::new();
        for info in ctx.parameters()? {
            if !info.buffer && !info.trainable {
                continue;
            }
            let name = info.name.as_str().to_owned();
            let t = ctx.parameter(&name)?.ok_or_else(|| {
                Error::from(format!("the host listed `{name}` but has no such tensor"))
            })?;
            ema.push((name, detached_copy(&t)?));
            training.push(detached_copy(&t)?);
        }
        self.ema = ema;
        self.training = training;
        Ok(())
    }

    /// Takes the shadow weights at `init`, and again at `fit_start` while averaging has not
    /// started and no checkpoint gave them; otherwise checks them against the model (and moves
    /// them to its device).
    fn attach(&mut self, ctx: &mut Context<'_>) -> Result<(), Error> {
        // Until averaging starts, the shadow weights follow the model: at `fit_start` they are
        // taken again, so that weights loaded after `init` (a `weights_only` checkpoint, as
        // Composer loads one after `init` and takes its EMA model at `fit_start`) are averaged,
        // not the weights the model was drawn with.
        if (self.ema.is_empty() || !self.started) && !self.loaded {
            return self.snapshot(ctx);
        }
        // The model's tensors the average should hold: those it holds, and any other buffer or
        // trainable parameter (a frozen one left out when averaging started is not missing).
        let tracked = |name: &str| self.ema.iter().any(|(n, _)| n == name);
        let model: Vec<(String, Vec<i64>)> = ctx
            .parameters()?
            .into_iter()
            .filter(|p| p.buffer || p.trainable || tracked(p.name.as_str()))
            .map(|p| (p.name.into_string(), p.shape.into_vec()))
            .collect();
        let ours: Vec<(String, Vec<i64>)> = self
            .ema
            .iter()
            .map(|(n, t)| (n.clone(), t.size()))
            .collect();
        if model != ours {
            let missing: Vec<&str> = ours
                .iter()
                .filter(|o| !model.contains(o))
                .map(|(n, _)| n.as_str())
                .collect();
            let extra: Vec<&str> = model
                .iter()
                .filter(|m| !ours.contains(m))
                .map(|(n, _)| n.as_str())
                .collect();
            return Err(format!(
                "the EMA weights do not match the model (not in the model or another shape: {missing:?}; \
                 only in the model: {extra:?})"
            )
            .into());
        }
        let current = self.model_tensors(ctx)?;
        for (i, m) in current.iter().enumerate() {
            let device: Device = m.device();
            if self.ema[i].1.device() != device {
                self.ema[i].1 = self.ema[i].1.f_to_device(device)?;
            }
            if self.training[i].device() != device {
                self.training[i] = self.training[i].f_to_device(device)?;
            }
        }
        Ok(())
    }

    /// Puts the EMA weights into the model, keeping the training weights.
    fn swap_in(&mut self, ctx: &Context<'_>) -> Result<(), Error> {
        let model = self.model_tensors(ctx)?;
        for ((m, (_, e)), t) in model.iter().zip(&self.ema).zip(&self.training) {
            copy_into(t, m)?;
            copy_into(m, e)?;
        }
        self.swapped_in = true;
        Ok(())
    }

    /// Puts the training weights back into the model.
    fn restore(&mut self, ctx: &Context<'_>) -> Result<(), Error> {
        let model = self.model_tensors(ctx)?;
        for (m, t) in model.iter().zip(&self.training) {
            copy_into(m, t)?;
        }
        self.swapped_in = false;
        Ok(())
    }

    /// `sqrt(Σ ‖ema − θ‖²)` over the floating-point tensors, `θ` the training weights.
    fn distance(&self, training: &[Tensor]) -> Result<f64, Error> {
        let _no_grad = tch::no_grad_guard();
        let mut total: Option<Tensor> = None;
        for ((_, e), t) in self.ema.iter().zip(training) {
            if !e.is_floating_point() {
                continue;
            }
            let d = e
                .f_to_kind(Kind::Double)?
                .f_sub(&t.f_to_kind(Kind::Double)?)?;
            let sq = d.f_mul(&d)?.f_sum(Kind::Double)?;
            total = Some(match total {
                None => sq,
                Some(s) => s.f_add(&sq)?,
            });
        }
        Ok(match total {
            Some(t) => t.f_double_value(&[])?.sqrt(),
            None => 0.0,
        })
    }

    fn update_event(&mut self, ctx: &mut Context<'_>) -> Result<(), Error> {
        // Deliberate difference from Composer: if a checkpoint left the EMA weights in the model
        // (epoch_end follows batch_checkpoint), average the training weights, not the EMA ones.
        if self.swapped_in {
            self.restore(ctx)?;
        }
        let time = ctx.time();
        if !self.started && self.config.ema_start.reached(&time) == Some(true) {
            // As Composer, which builds its `EMAParameters` again at that moment: averaging
            // starts from the model's weights then, over the parameters trainable then (a layer
            // frozen earlier is left out; one frozen later stays in the average).
            self.snapshot(ctx)?;
            self.started = true;
            ctx.info(&format!(
                "ema: averaging starts at batch {} (smoothing {}, every {})",
                time.batch, self.config.smoothing, self.config.update_interval
            ));
        }
        if self.started && self.config.update_due(&time) {
            let model = self.model_tensors(ctx)?;
            let s = self.config.smoothing;
            for ((_, e), m) in self.ema.iter().zip(&model) {
                ema_update(&mut e.shallow_clone(), m, s)?;
            }
            self.updates += 1;
        }
        Ok(())
    }
}

impl Method for Ema {
    fn on_event(&mut self, event: Event, ctx: &mut Context<'_>) -> Result<(), Error> {
        match event {
            Event::INIT | Event::FIT_START => self.attach(ctx),
            Event::BATCH_START | Event::EPOCH_START | Event::BEFORE_DATALOADER | Event::FIT_END => {
                if self.swapped_in {
                    self.restore(ctx)?;
                }
                Ok(())
            }
            e if e == self.config.update_event() => self.update_event(ctx),
            Event::EVAL_START => {
                if self.started && !self.swapped_in {
                    self.swap_in(ctx)?;
                }
                ctx.log_metric("ema/swapped_in", if self.swapped_in { 1.0 } else { 0.0 });
                if self.swapped_in {
                    let distance = self.distance(&self.training)?;
                    ctx.log_metric("ema/distance", distance);
                    ctx.log_metric("ema/updates", self.updates as f64);
                }
                Ok(())
            }
            Event::EVAL_END => {
                if self.swapped_in {
                    self.restore(ctx)?;
                }
                ctx.log_metric("ema/swapped_in", 0.0);
                Ok(())
            }
            Event::BATCH_CHECKPOINT | Event::EPOCH_CHECKPOINT | Event::ITERATION_CHECKPOINT => {
                if self.started && !self.swapped_in && ctx.checkpoint_pending()? {
                    self.swap_in(ctx)?;
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Format 1: `bytes` is JSON `{"started", "swapped_in", "updates"}`; tensors `ema/<name>`
    /// for every shadow weight and, while the model holds the EMA weights, `training/<name>`.
    fn state(&self) -> Result<State, Error> {
        let flags = Flags {
            started: self.started,
            swapped_in: self.swapped_in,
            updates: self.updates,
        };
        let bytes = serde_json::to_vec(&flags).map_err(|e| e.to_string())?;
        let mut tensors = Vec::new();
        for (name, t) in &self.ema {
            tensors.push((format!("ema/{name}"), detached_copy(t)?));
        }
        if self.swapped_in {
            for ((name, _), t) in self.ema.iter().zip(&self.training) {
                tensors.push((format!("training/{name}"), detached_copy(t)?));
            }
        }
        Ok(State {
            format_version: STATE_FORMAT_VERSION,
            bytes,
            tensors,
        })
    }

    fn load_state(&mut self, state: State) -> Result<(), Error> {
        if state.format_version != STATE_FORMAT_VERSION {
            return Err(format!(
                "EMA state format {} is unknown (this plugin reads format {STATE_FORMAT_VERSION})",
                state.format_version
            )
            .into());
        }
        let flags: Flags = serde_json::from_slice(&state.bytes)
            .map_err(|e| format!("EMA state: bad counters: {e}"))?;
        let mut ema: Vec<(String, Tensor)> = Vec::new();
        let mut training: Vec<(String, Tensor)> = Vec::new();
        for (name, t) in state.tensors {
            if let Some(n) = name.strip_prefix("ema/") {
                ema.push((n.to_owned(), t));
            } else if let Some(n) = name.strip_prefix("training/") {
                training.push((n.to_owned(), t));
            } else {
                return Err(format!("EMA state: unexpected tensor `{name}`").into());
            }
        }
        if flags.swapped_in {
            let names =
                |v: &[(String, Tensor)]| v.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
            if names(&training) != names(&ema) {
                return Err(
                    "EMA state: the saved training weights do not match the EMA weights".into(),
                );
            }
        } else if !training.is_empty() {
            return Err("EMA state: training weights saved while the EMA weights were out".into());
        }
        if self.ema.is_empty() {
            // Before init: adopt the saved tensors; `attach` checks them against the model.
            self.training = match flags.swapped_in {
                true => training.into_iter().map(|(_, t)| t).collect(),
                false => ema
                    .iter()
                    .map(|(_, t)| detached_copy(t))
                    .collect::<Result<_, _>>()?,
            };
            self.ema = ema;
        } else {
            let ours: Vec<(&str, Vec<i64>)> = self
                .ema
                .iter()
                .map(|(n, t)| (n.as_str(), t.size()))
                .collect();
            let theirs: Vec<(&str, Vec<i64>)> =
                ema.iter().map(|(n, t)| (n.as_str(), t.size())).collect();
            // A parameter frozen before averaging started is not in the saved average
            // (Composer's `EMAParameters`), but it was still trainable when this resumed run
            // took its shadow weights at `init` (the checkpoint's optimizer membership, which
            // freezes it again, is restored later): keep only what was saved.
            let saved = |name: &str| theirs.iter().any(|(n, _)| *n == name);
            let ours: Vec<(&str, Vec<i64>)> = ours.into_iter().filter(|(n, _)| saved(n)).collect();
            if ours != theirs {
                return Err(format!(
                    "EMA state: the saved weights {theirs:?} do not match the model's {ours:?}"
                )
                .into());
            }
            let kept: Vec<bool> = self.ema.iter().map(|(n, _)| saved(n)).collect();
            let mut keep = kept.iter();
            self.ema.retain(|_| *keep.next().unwrap_or(&false));
            let mut keep = kept.iter();
            self.training.retain(|_| *keep.next().unwrap_or(&false));
            for ((_, dst), (_, src)) in self.ema.iter().zip(&ema) {
                copy_into(dst, src)?;
            }
            for (dst, (_, src)) in self.training.iter().zip(&training) {
                copy_into(dst, src)?;
            }
        }
        self.started = flags.started;
        self.swapped_in = flags.swapped_in;
        self.updates = flags.updates;
        self.loaded = true;
        Ok(())
    }
}
