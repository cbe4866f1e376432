//! The method: slow weights taken at the first step, synchronised with the model every `k`
//! steps, written into the model at the end, and saved in the method's state.
//!
//! [`Lookahead::start`], [`Lookahead::step_end`] and [`Lookahead::finish`] are the whole
//! behaviour, as functions of the step count, the run's length and the model's tensors, so
//! that a test can drive them without a host; the [`Method`] implementation gathers those from
//! the [`Context`] and logs what happened.
//!
//! Under `[distributed] sharding` the model's tensors it is given are this rank's slices
//! (plugin-api 1.10, [`Context::parameter_slice`]): the update is element by element, so each
//! rank keeps the slow weights of its slice only, and they are gathered whole for a checkpoint
//! ([`Context::gather_slices`]). Without sharding a slice is the whole tensor.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use tessera_plugin_api::kit::{json_state, StateReader};
use tessera_plugin_api::tch::Tensor;
use tessera_plugin_api::{Context, Error, Event, Method, SlicedCopies, State};

use crate::config::{LookaheadConfig, Variant};
use crate::update::sync_tensor;
use tessera_plugin_api::kit::{copy_into, detached_copy};

/// The current layout of [`Method::state`].
pub const STATE_FORMAT_VERSION: u32 = 1;

/// Priority at `batch_end`: before other methods look at the model after the optimizer step
/// (EMA and SWA average the synchronised weights).
pub const SYNC_PRIORITY: i32 = 100;

/// The counters saved in [`State::bytes`] (JSON).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
struct Counters {
    started: bool,
    steps: u64,
    syncs: u64,
    done: bool,
}

/// One model tensor as the method sees it: its name, the tensor (sharing storage with the
/// model's) and its role.
pub struct ModelTensor {
    /// Full dotted name.
    pub name: String,
    /// The model's tensor (writes go into the model).
    pub tensor: Tensor,
    /// A buffer (batch-norm running statistics), not a parameter.
    pub buffer: bool,
    /// A parameter that currently requires a gradient (is in the optimizer).
    pub trainable: bool,
}

/// What one `batch_end` did.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Outcome {
    /// The step count after this step (`t`).
    pub step: u64,
    /// The slow weights were synchronised with this interpolation weight `w`
    /// (`φ ← φ + w(θ − φ); θ ← φ`).
    pub synced: Option<f64>,
    /// The slow weights were written into the model and the method ended.
    pub final_copy: bool,
    /// The method ended at this step (`T` reached).
    pub ended: bool,
}

/// The Lookahead method (both variants).
pub struct Lookahead {
    config: LookaheadConfig,
    /// The slow weights by model name, in the host's order.
    slow: Vec<(String, Tensor)>,
    /// The slow weights were taken (at the first step).
    started: bool,
    /// Steps completed since the start (`t`).
    steps: u64,
    /// Synchronisations done.
    syncs: u64,
    /// `T` was reached (or the final copy made at `fit_end`): the method does nothing more.
    done: bool,
    /// Under sharding: the slices' layouts, whether `slow` holds whole tensors from a
    /// checkpoint, and the slow weights gathered whole for a checkpoint.
    sliced: SlicedCopies,
}

impl Lookahead {
    /// A method with these settings and no slow weights yet (they are taken at the first step).
    pub fn new(config: LookaheadConfig) -> Lookahead {
        Lookahead {
            config,
            slow: Vec::new(),
            started: false,
            steps: 0,
            syncs: 0,
            done: false,
            sliced: SlicedCopies::default(),
        }
    }

    /// The resolved settings.
    pub fn config(&self) -> &LookaheadConfig {
        &self.config
    }

    /// The slow weights by name.
    pub fn slow_weights(&self) -> &[(String, Tensor)] {
        &self.slow
    }

    /// Whether the slow weights were taken.
    pub fn started(&self) -> bool {
        self.started
    }

    /// Steps completed since the start.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Synchronisations done.
    pub fn syncs(&self) -> u64 {
        self.syncs
    }

    /// Whether the method has ended.
    pub fn done(&self) -> bool {
        self.done
    }

    /// Whether the method updates `m`: a floating-point trainable parameter, or a
    /// floating-point buffer when `buffers` is set. Frozen parameters and integer buffers
    /// (`num_batches_tracked`) are left alone.
    pub fn selects(&self, m: &ModelTensor) -> bool {
        (m.trainable || (m.buffer && self.config.buffers)) && m.tensor.is_floating_point()
    }

    /// The first step: the slow weights become a copy of the model's selected tensors.
    pub fn start(&mut self, model: &[ModelTensor]) -> Result<(), Error> {
        self.slow = model
            .iter()
            .filter(|m| self.selects(m))
            .map(|m| Ok((m.name.clone(), detached_copy(&m.tensor)?)))
            .collect::<Result<_, Error>>()?;
        self.started = true;
        Ok(())
    }

    /// Whether the step after `steps` completed ones needs the model's tensors (a
    /// synchronisation or the end), with `total` the run's length `T` when known.
    pub fn needs_model(&self, total: Option<u64>) -> bool {
        if self.done || !self.started {
            return false;
        }
        let t = self.steps + 1;
        self.config.sync_due(t) || total.is_some_and(|total| t >= total)
    }

    /// `T`: `total_steps`, else the run's length in batches (`max_batches`, 0 when the host
    /// does not know it).
    pub fn total(&self, max_batches: u64) -> Option<u64> {
        self.config
            .total_steps
            .or((max_batches > 0).then_some(max_batches))
    }

    /// One completed step (`batch_end`, after the optimizer step), with `total` the run's
    /// length `T` when known and the model's tensors (needed only when [`needs_model`] says
    /// so): counts the step; when `t` is a multiple of `k`, synchronises; when `t` reaches
    /// `T`, writes the slow weights into the model (`final_copy`) and ends.
    ///
    /// [`needs_model`]: Lookahead::needs_model
    pub fn step_end(
        &mut self,
        total: Option<u64>,
        model: &[ModelTensor],
    ) -> Result<Outcome, Error> {
        let mut outcome = Outcome::default();
        if self.done || !self.started {
            outcome.step = self.steps;
            return Ok(outcome);
        }
        self.steps += 1;
        let t = self.steps;
        outcome.step = t;
        if self.config.variant == Variant::Ema && total.is_none() {
            return Err(Error::config(
                "variant = \"ema\" needs the run's length T for its decay (t/T)^decay_power, and \
                 the host does not know it in batches (max_duration in tokens or iterations): \
                 set `total_steps`",
            ));
        }
        if self.config.sync_due(t) {
            let w = self.config.weight(t, total.unwrap_or(t));
            self.sync(model, Some(w))?;
            self.syncs += 1;
            outcome.synced = Some(w);
        }
        if total.is_some_and(|total| t >= total) {
            if self.config.final_copy && outcome.synced.is_none() {
                self.sync(model, None)?;
                outcome.final_copy = true;
            } else if self.config.final_copy {
                // The synchronisation just made the model equal to the slow weights.
                outcome.final_copy = true;
            }
            self.end();
            outcome.ended = true;
        }
        Ok(outcome)
    }

    /// At the end of training (`fit_end`) before `T`: with `final_copy`, writes the slow
    /// weights into the model and ends. Returns whether it did.
    pub fn finish(&mut self, model: &[ModelTensor]) -> Result<bool, Error> {
        if !self.started || self.done || !self.config.final_copy {
            return Ok(false);
        }
        self.sync(model, None)?;
        self.end();
        Ok(true)
    }

    /// The method ends: the slow weights are freed.
    fn end(&mut self) {
        self.done = true;
        self.slow.clear();
    }

    /// Every selected model tensor: with `Some(w)`, `φ ← φ + w(θ − φ); θ ← φ`; with `None`,
    /// `θ ← φ`. A tensor selected now but not before (a parameter unfrozen since, a new one)
    /// starts its slow weights at its current value (the model is unchanged); slow weights of
    /// a tensor no longer selected (frozen since) are dropped.
    fn sync(&mut self, model: &[ModelTensor], weight: Option<f64>) -> Result<(), Error> {
        let mut previous: HashMap<String, Tensor> =
            std::mem::take(&mut self.slow).into_iter().collect();
        let mut next = Vec::with_capacity(previous.len());
        let result = (|| {
            for m in model.iter().filter(|m| self.selects(m)) {
                let slow = match previous.remove(&m.name) {
                    Some(mut slow) => {
                        if slow.size() != m.tensor.size() {
                            return Err(Error::from(format!(
                                "lookahead: `{}` has shape {:?} in the model but {:?} in the slow weights",
                                m.name,
                                m.tensor.size(),
                                slow.size()
                            )));
                        }
                        if slow.device() != m.tensor.device() {
                            // Restored onto another device: moved once.
                            slow = slow.f_to_device(m.tensor.device())?;
                        }
                        match weight {
                            Some(w) => sync_tensor(&slow, &m.tensor, w)?,
                            None => copy_into(&m.tensor, &slow)?,
                        }
                        slow
                    }
                    None => detached_copy(&m.tensor)?,
                };
                next.push((m.name.clone(), slow));
            }
            Ok(())
        })();
        self.slow = next;
        result
    }
}

impl Lookahead {
    /// This rank's slices of the model's parameters and buffers, sharing storage, in the
    /// host's order; only those the method may select (trainable parameters, and buffers when
    /// `buffers`) are fetched. `write`: the model will be given the slow weights. Slow weights
    /// read whole from a checkpoint are cut to the slices.
    fn model_tensors(
        &mut self,
        ctx: &mut Context<'_>,
        write: bool,
    ) -> Result<Vec<ModelTensor>, Error> {
        let mut out = Vec::new();
        for info in ctx.parameters()? {
            if !(info.trainable || (info.buffer && self.config.buffers)) {
                continue;
            }
            let name = info.name.as_str().to_owned();
            let slice = ctx.parameter_slice(&name, write)?.ok_or_else(|| {
                Error::from(format!("the host listed `{name}` but has no such tensor"))
            })?;
            self.sliced.note(&name, slice.layout);
            out.push(ModelTensor {
                name,
                tensor: slice.tensor,
                buffer: info.buffer,
                trainable: info.trainable,
            });
        }
        self.sliced
            .cut_whole(&mut self.slow, "lookahead", "the slow weights")?;
        Ok(out)
    }
}

impl Method for Lookahead {
    fn on_event(&mut self, event: Event, ctx: &mut Context<'_>) -> Result<(), Error> {
        // What was gathered for the last checkpoint has been saved.
        self.sliced.forget_gathered();
        match event {
            Event::BATCH_CHECKPOINT | Event::EPOCH_CHECKPOINT | Event::ITERATION_CHECKPOINT => {
                if ctx.checkpoint_pending()? {
                    self.sliced.gather(ctx, "slow", &self.slow)?;
                }
                Ok(())
            }
            Event::BATCH_START => {
                if !self.started && !self.done {
                    let model = self.model_tensors(ctx, false)?;
                    self.start(&model)?;
                    let c = self.config;
                    let rate = match c.variant {
                        Variant::Lookahead => format!("alpha {}", c.alpha),
                        Variant::Ema => {
                            format!("decay {}^{} · (t/T)^{}", c.decay_base, c.k, c.decay_power)
                        }
                    };
                    let msg = format!(
                        "lookahead: slow weights of {} tensors (variant {}, every {} steps, {rate}{})",
                        self.slow.len(),
                        c.variant.name(),
                        c.k,
                        if c.buffers { ", buffers too" } else { "" }
                    );
                    ctx.info(&msg);
                }
                Ok(())
            }
            Event::BATCH_END => {
                let time = ctx.time();
                let total = self.total(time.max_batches);
                let model = if self.needs_model(total) {
                    self.model_tensors(ctx, true)?
                } else {
                    Vec::new()
                };
                let outcome = self.step_end(total, &model)?;
                if outcome.synced.is_some() {
                    ctx.log_metric("lookahead/syncs", self.syncs as f64);
                    if self.config.variant == Variant::Ema {
                        let d = self
                            .config
                            .decay(outcome.step, total.unwrap_or(outcome.step));
                        ctx.log_metric("lookahead/decay", d);
                    }
                }
                if outcome.final_copy {
                    ctx.log_metric("lookahead/final_copy", 1.0);
                }
                if outcome.ended {
                    ctx.info(&format!(
                        "lookahead: ended at step {} after {} synchronisations{}",
                        outcome.step,
                        self.syncs,
                        if outcome.final_copy {
                            "; the model holds the slow weights"
                        } else {
                            ""
                        }
                    ));
                }
                Ok(())
            }
            Event::FIT_END => {
                if self.started && !self.done && self.config.final_copy {
                    let model = self.model_tensors(ctx, true)?;
                    if self.finish(&model)? {
                        ctx.log_metric("lookahead/final_copy", 1.0);
                        ctx.info(&format!(
                            "lookahead: training ended at step {} before T; the model holds the slow weights",
                            self.steps
                        ));
                    }
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Format 1: `bytes` is JSON `{"started", "steps", "syncs", "done"}`; tensors
    /// `slow/<name>`, one per slow weight.
    fn state(&self) -> Result<State, Error> {
        let counters = Counters {
            started: self.started,
            steps: self.steps,
            syncs: self.syncs,
            done: self.done,
        };
        let tensors = self
            .sliced
            .saved("slow", &self.slow, "lookahead's slow weights are")?;
        json_state("lookahead", STATE_FORMAT_VERSION, &counters, tensors)
    }

    fn load_state(&mut self, state: State) -> Result<(), Error> {
        let mut reader = StateReader::open("lookahead", state, STATE_FORMAT_VERSION)?;
        let counters: Counters = reader.json()?;
        let slow = reader.take("slow");
        reader.finish()?;
        if !slow.is_empty() && (!counters.started || counters.done) {
            return Err(format!(
                "lookahead state: {} slow weights saved for a method that {}",
                slow.len(),
                if counters.done {
                    "had ended"
                } else {
                    "had not started"
                }
            )
            .into());
        }
        // Whole tensors: cut to this rank's slices when the model is next read.
        self.sliced.set_whole(!slow.is_empty());
        self.slow = slow;
        self.started = counters.started;
        self.steps = counters.steps;
        self.syncs = counters.syncs;
        self.done = counters.done;
        Ok(())
    }
}
