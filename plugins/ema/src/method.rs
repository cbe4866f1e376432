//! The method: shadow weights taken at `init`, updated on the schedule, swapped into the model
//! for evaluation and checkpoints, and saved in the method's state.
//!
//! Under `[distributed] sharding` the shadow weights are this rank's slices of the model's
//! (plugin-api 1.10, [`Context::parameter_slice`]): the average is element by element, so each
//! rank averages its slice, and the whole shadow weights exist only for a checkpoint (gathered
//! at the `*_checkpoint` event, [`Context::gather_slices`]). Without sharding a slice is the
//! whole tensor.

use serde::{Deserialize, Serialize};
use tessera_plugin_api::kit::{json_state, StateReader};
use tessera_plugin_api::tch::{self, Device, Kind, Tensor};
use tessera_plugin_api::{gather_for_save, Context, Error, Event, Method, SliceLayout, State};

use crate::config::EmaConfig;
use crate::update::ema_update;
use tessera_plugin_api::kit::{copy_into, detached_copy};

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
    /// The shadow weights (this rank's slices of them), by model name, in the host's order.
    ema: Vec<(String, Tensor)>,
    /// The training weights while the model holds the EMA weights (aligned with `ema`).
    training: Vec<Tensor>,
    /// Which part of each model tensor `ema` holds (aligned with it); empty while `ema` holds
    /// whole tensors read from a checkpoint, before `attach` cut them.
    layouts: Vec<SliceLayout>,
    /// Rank 0, between a `*_checkpoint` event and the save: the state's tensors gathered whole
    /// from the ranks' slices (only when some are sharded).
    gathered: Option<Vec<(String, Tensor)>>,
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
            layouts: Vec::new(),
            gathered: None,
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

    /// This rank's slices of the model's tensors (shared with the host) under the shadow
    /// weights' names; `write`: to put weights into them.
    fn model_tensors(&self, ctx: &mut Context<'_>, write: bool) -> Result<Vec<Tensor>, Error> {
        self.ema
            .iter()
            .map(|(name, _)| {
                let slice = ctx.parameter_slice(name, write)?.ok_or_else(|| {
                    Error::from(format!("the model no longer has `{name}` (EMA tracks it)"))
                })?;
                Ok(slice.tensor)
            })
            .collect()
    }

    /// Whether `ema` holds this rank's slices of sharded tensors.
    fn sliced(&self) -> bool {
        self.layouts.len() == self.ema.len() && self.layouts.iter().any(|l| l.sharded)
    }

    /// The whole tensors of `ema` and, while swapped in, `training`, gathered from every
    /// rank's slices for the checkpoint that follows (collective; kept on rank 0 only).
    fn gather_for_checkpoint(&mut self, ctx: &mut Context<'_>) -> Result<(), Error> {
        if !self.sliced() {
            return Ok(());
        }
        let training: Vec<(String, Tensor)> = match self.swapped_in {
            true => self
                .ema
                .iter()
                .zip(&self.training)
                .map(|((n, _), t)| (n.clone(), t.shallow_clone()))
                .collect(),
            false => Vec::new(),
        };
        self.gathered = gather_for_save(ctx, &[("ema", &self.ema), ("training", &training)])?;
        Ok(())
    }

    /// Shadow (and spare training) copies of the model's trainable parameters and all its
    /// buffers, as Composer's `EMAParameters`: a frozen parameter (`requires_grad` off) is not
    /// averaged, and the model keeps its own value for it at evaluation.
    fn snapshot(&mut self, ctx: &mut Context<'_>) -> Result<(), Error> {
        let mut ema = Vec::new();
        let mut training = Vec::new();
        let mut layouts = Vec::new();
        for info in ctx.parameters()? {
            if !info.buffer && !info.trainable {
                continue;
            }
            let name = info.name.as_str().to_owned();
            let slice = ctx.parameter_slice(&name, false)?.ok_or_else(|| {
                Error::from(format!("the host listed `{name}` but has no such tensor"))
            })?;
            ema.push((name, detached_copy(&slice.tensor)?));
            training.push(detached_copy(&slice.tensor)?);
            layouts.push(slice.layout);
        }
        self.ema = ema;
        self.training = training;
        self.layouts = layouts;
        Ok(())
    }

    /// Takes the shadow weights at `init`, and again at `fit_start` while averaging has not
    /// started and no checkpoint gave them; otherwise checks them against the model (and moves
    /// them to its device).
    fn attach(&mut self, ctx: &mut Context<'_>) -> Result<(), Error> {
        self.attach_weights(ctx)?;
        if self.sliced() {
            let mine: i64 = self.layouts.iter().map(|l| l.len).sum();
            let all: i64 = self.layouts.iter().map(|l| l.numel()).sum();
            ctx.info(&format!(
                "ema: the weights are sharded: this rank averages its slices ({mine} of {all} \
                 elements)"
            ));
        }
        Ok(())
    }

    fn attach_weights(&mut self, ctx: &mut Context<'_>) -> Result<(), Error> {
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
            .enumerate()
            .map(|(i, (n, t))| {
                let size = match self.layouts.get(i) {
                    Some(l) if self.layouts.len() == self.ema.len() => l.size.clone(),
                    _ => t.size(),
                };
                (n.clone(), size)
            })
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
        // This rank's slices; shadow weights read whole from a checkpoint are cut to them.
        let mut layouts = Vec::with_capacity(self.ema.len());
        let mut current = Vec::with_capacity(self.ema.len());
        for (name, _) in &self.ema {
            let slice = ctx.parameter_slice(name, false)?.ok_or_else(|| {
                Error::from(format!("the model no longer has `{name}` (EMA tracks it)"))
            })?;
            current.push(slice.tensor);
            layouts.push(slice.layout);
        }
        // Whole shadow weights (read from a checkpoint, or taken at `init` before the host
        // sharded the parameters) are cut to this rank's slices.
        let aligned = self.layouts.len() == self.ema.len();
        for (i, layout) in layouts.iter().enumerate() {
            let whole = !aligned || !self.layouts[i].sharded;
            if whole && layout.sharded {
                self.ema[i].1 = layout.cut(&self.ema[i].1)?;
                self.training[i] = layout.cut(&self.training[i])?;
            }
        }
        self.layouts = layouts;
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
    fn swap_in(&mut self, ctx: &mut Context<'_>) -> Result<(), Error> {
        let model = self.model_tensors(ctx, true)?;
        for ((m, (_, e)), t) in model.iter().zip(&self.ema).zip(&self.training) {
            copy_into(t, m)?;
            copy_into(m, e)?;
        }
        self.swapped_in = true;
        Ok(())
    }

    /// Puts the training weights back into the model.
    fn restore(&mut self, ctx: &mut Context<'_>) -> Result<(), Error> {
        let model = self.model_tensors(ctx, true)?;
        for (m, t) in model.iter().zip(&self.training) {
            copy_into(m, t)?;
        }
        self.swapped_in = false;
        Ok(())
    }

    /// `sqrt(Σ ‖ema − θ‖²)` over the floating-point tensors, `θ` the training weights: the
    /// sharded slices' part summed over the ranks (collective when some are sharded).
    fn distance(&self, ctx: &mut Context<'_>) -> Result<f64, Error> {
        let _no_grad = tch::no_grad_guard();
        let mut whole: Option<Tensor> = None;
        let mut sliced: Option<Tensor> = None;
        for (i, ((_, e), t)) in self.ema.iter().zip(&self.training).enumerate() {
            if !e.is_floating_point() {
                continue;
            }
            let d = e
                .f_to_kind(Kind::Double)?
                .f_sub(&t.f_to_kind(Kind::Double)?)?;
            let sq = d.f_mul(&d)?.f_sum(Kind::Double)?;
            let total = match self.layouts.get(i) {
                Some(l) if l.sharded => &mut sliced,
                _ => &mut whole,
            };
            *total = Some(match total.take() {
                None => sq,
                Some(s) => s.f_add(&sq)?,
            });
        }
        let mut sum = match whole {
            Some(t) => t.f_double_value(&[])?,
            None => 0.0,
        };
        if self.sliced() {
            let mine = match sliced {
                Some(t) => t,
                None => Tensor::f_zeros([], (Kind::Double, self.ema[0].1.device()))?,
            };
            sum += ctx
                .all_gather(&mine)?
                .f_sum(Kind::Double)?
                .f_double_value(&[])?;
        }
        Ok(sum.sqrt())
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
            let model = self.model_tensors(ctx, false)?;
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
        // What was gathered for the last checkpoint has been saved.
        self.gathered = None;
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
                    let distance = self.distance(ctx)?;
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
                if ctx.checkpoint_pending()? {
                    if self.started && !self.swapped_in {
                        self.swap_in(ctx)?;
                    }
                    self.gather_for_checkpoint(ctx)?;
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
        if self.sliced() {
            // Sharded: the whole tensors were gathered at the `*_checkpoint` event.
            let tensors = self.gathered.as_ref().ok_or_else(|| {
                Error::from(
                    "EMA's weights are sliced over the ranks and were not gathered for this \
                     checkpoint (they are at a `*_checkpoint` event that announces one)",
                )
            })?;
            let tensors = tensors
                .iter()
                .map(|(n, t)| (n.clone(), t.shallow_clone()))
                .collect();
            return json_state("EMA", STATE_FORMAT_VERSION, &flags, tensors);
        }
        let mut tensors = Vec::new();
        for (name, t) in &self.ema {
            tensors.push((format!("ema/{name}"), detached_copy(t)?));
        }
        if self.swapped_in {
            for ((name, _), t) in self.ema.iter().zip(&self.training) {
                tensors.push((format!("training/{name}"), detached_copy(t)?));
            }
        }
        json_state("EMA", STATE_FORMAT_VERSION, &flags, tensors)
    }

    fn load_state(&mut self, state: State) -> Result<(), Error> {
        let mut reader = StateReader::open("EMA", state, STATE_FORMAT_VERSION)?;
        let flags: Flags = reader.json()?;
        let ema = reader.take("ema");
        let training = reader.take("training");
        reader.finish()?;
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
            // Whole tensors: `attach` cuts them to this rank's slices.
            self.layouts.clear();
        } else {
            let aligned = self.layouts.len() == self.ema.len();
            let ours: Vec<(&str, Vec<i64>)> = self
                .ema
                .iter()
                .enumerate()
                .map(|(i, (n, t))| match self.layouts.get(i) {
                    Some(l) if aligned => (n.as_str(), l.size.clone()),
                    _ => (n.as_str(), t.size()),
                })
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
            if aligned {
                let mut keep = kept.iter();
                self.layouts.retain(|_| *keep.next().unwrap_or(&false));
            }
            // This rank's slice of each saved whole tensor (the whole tensor without sharding).
            let fit = |i: usize, whole: &Tensor| -> Result<Tensor, Error> {
                match self.layouts.get(i) {
                    Some(l) if aligned => l.cut(whole),
                    _ => Ok(whole.shallow_clone()),
                }
            };
            for (i, ((_, dst), (_, src))) in self.ema.iter().zip(&ema).enumerate() {
                copy_into(dst, &fit(i, src)?)?;
            }
            for (i, (dst, (_, src))) in self.training.iter().zip(&training).enumerate() {
                copy_into(dst, &fit(i, src)?)?;
            }
        }
        self.started = flags.started;
        self.swapped_in = flags.swapped_in;
        self.updates = flags.updates;
        self.loaded = true;
        Ok(())
    }
}
