//! The method: the average started at `swa_start`, updated every `update_interval`, loaded into
//! the model at `swa_end`, the optional `SWALR` learning rate, and the method's state.
//!
//! [`Swa::train_event`] and [`Swa::finish`] are the whole behaviour, as functions of the clock,
//! the host's learning rate and the model's tensors, so that a test can drive them without a
//! host; the [`Method`] implementation only gathers those from the [`Context`] and applies the
//! result.
//!
//! Under `[distributed] sharding` the model's tensors it is given are this rank's slices
//! (plugin-api 1.10, [`Context::parameter_slice`]): the average is element by element, so each
//! rank averages its slice only, and the average is gathered whole for a checkpoint
//! ([`Context::gather_slices`]). Without sharding a slice is the whole tensor.

use serde::{Deserialize, Serialize};
use tessera_plugin_api::kit::{json_state, StateReader};
use tessera_plugin_api::tch::Tensor;
use tessera_plugin_api::{Context, Error, Event, Method, SlicedCopies, State, TimeInfo};

use crate::average::{check_matches, update_average, ModelTensor};
use crate::config::{SwaConfig, SwaLrMode};
use crate::swalr::Swalr;
use tessera_plugin_api::kit::{copy_into, detached_copy};

/// The current layout of [`Method::state`].
pub const STATE_FORMAT_VERSION: u32 = 1;

/// The counters saved in [`State::bytes`] (JSON).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq)]
struct Counters {
    started: bool,
    completed: bool,
    step_counter: u64,
    n_averaged: u64,
    swalr: Option<Swalr>,
    held_lr: Option<f64>,
}

/// What one `batch_end` or `epoch_end` did.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Outcome {
    /// The event matched (averaging running at this event: `swa_start` reached, not completed).
    pub matched: bool,
    /// The average was updated.
    pub updated: bool,
    /// `SWALR` stepped, setting this rate.
    pub swalr_lr: Option<f64>,
    /// The averaged weights were loaded into the model.
    pub replaced: bool,
    /// The rate the host must use for the next optimizer step (`None`: leave it).
    pub next_lr: Option<f64>,
}

/// The SWA method.
pub struct Swa {
    config: SwaConfig,
    /// The averaged parameters and the buffers copied at the last update, by model name, in
    /// the host's order; empty before the start.
    average: Vec<(String, Tensor)>,
    /// `swa_start` was reached at an update event.
    started: bool,
    /// The averaged weights went into the model (`swa_end`, or the end of training).
    completed: bool,
    /// Matching events since the start (Composer's `step_counter`).
    step_counter: u64,
    /// Models averaged (`AveragedModel.n_averaged`).
    n_averaged: u64,
    /// The learning-rate scheduler, from the start when `schedule_swa_lr`.
    swalr: Option<Swalr>,
    /// [`SwaLrMode::Hold`]: the rate every step uses from the first update on.
    held_lr: Option<f64>,
    /// Under sharding: the slices' layouts, whether `average` holds whole tensors from a
    /// checkpoint, and the average gathered whole for a checkpoint.
    sliced: SlicedCopies,
}

impl Swa {
    /// A method with these settings; nothing is averaged before `swa_start`.
    pub fn new(config: SwaConfig) -> Swa {
        Swa {
            config,
            average: Vec::new(),
            started: false,
            completed: false,
            step_counter: 0,
            n_averaged: 0,
            swalr: None,
            held_lr: None,
            sliced: SlicedCopies::default(),
        }
    }

    /// The resolved settings.
    pub fn config(&self) -> &SwaConfig {
        &self.config
    }

    /// The averaged weights by name (parameters averaged, buffers as at the last update).
    pub fn average(&self) -> &[(String, Tensor)] {
        &self.average
    }

    /// Whether averaging has started.
    pub fn started(&self) -> bool {
        self.started
    }

    /// Whether the averaged weights have replaced the model's.
    pub fn completed(&self) -> bool {
        self.completed
    }

    /// Matching events since the start.
    pub fn step_counter(&self) -> u64 {
        self.step_counter
    }

    /// Models averaged so far.
    pub fn n_averaged(&self) -> u64 {
        self.n_averaged
    }

    /// The `SWALR` scheduler, once started with `schedule_swa_lr`.
    pub fn swalr(&self) -> Option<&Swalr> {
        self.swalr.as_ref()
    }

    /// One training event (`batch_end` or `epoch_end`) at clock `time`, with the host's rate
    /// for the next step `lr` and the model's tensors (sharing storage: the replacement writes
    /// into them), as Composer's `SWA.match` and `SWA.apply`:
    ///
    /// - at the update event (`batch_end` for `ba` intervals, `epoch_end` for `ep`), while not
    ///   completed, once `swa_start` is reached: the first time, the average and `SWALR` are
    ///   (re)initialised (the target rate is the host's `lr` in Composer's mode); then every
    ///   `update_interval`-th such event updates the average and steps `SWALR`; then, once
    ///   `swa_end` is reached, the averaged weights (and the buffers copied at the last update)
    ///   are loaded into the model;
    /// - in [`SwaLrMode::Hold`], every `batch_end` after the first update asks for the held rate.
    pub fn train_event(
        &mut self,
        event: Event,
        time: &TimeInfo,
        lr: f64,
        model: &[ModelTensor],
    ) -> Result<Outcome, Error> {
        let mut outcome = Outcome::default();
        if event == self.config.update_event() && !self.completed && self.config.started_at(time) {
            outcome.matched = true;
            if !self.started {
                self.start(lr, model)?;
            }
            if self.step_counter.is_multiple_of(self.config.interval()) {
                self.ensure_device(model)?;
                update_average(&self.average, model, self.n_averaged)?;
                self.n_averaged += 1;
                outcome.updated = true;
                if let Some(swalr) = &mut self.swalr {
                    let current = self.held_lr.unwrap_or(lr);
                    let new = swalr.step(
                        current,
                        self.config.anneal_strategy,
                        self.config.anneal_steps,
                    );
                    outcome.swalr_lr = Some(new);
                    outcome.next_lr = Some(new);
                    if self.config.swa_lr_mode == SwaLrMode::Hold {
                        self.held_lr = Some(new);
                    }
                }
            }
            self.step_counter += 1;
            if self.config.ended_at(time) {
                self.replace(model)?;
                outcome.replaced = true;
            }
        }
        if event == Event::BATCH_END && outcome.next_lr.is_none() {
            outcome.next_lr = self.held_lr;
        }
        Ok(outcome)
    }

    /// At the end of training: if averaging started but `swa_end` was never reached at an
    /// update event, loads the averaged weights into the model now. Returns whether it did.
    pub fn finish(&mut self, model: &[ModelTensor]) -> Result<bool, Error> {
        if !self.started || self.completed || self.n_averaged == 0 {
            return Ok(false);
        }
        self.replace(model)?;
        Ok(true)
    }

    /// The first matching event: a fresh average (a copy of the model) and `SWALR`.
    fn start(&mut self, lr: f64, model: &[ModelTensor]) -> Result<(), Error> {
        self.average = model
            .iter()
            .map(|m| Ok((m.name.clone(), detached_copy(&m.tensor)?)))
            .collect::<Result<_, Error>>()?;
        self.swalr = match self.config.lr_mode() {
            None => None,
            // Composer overwrites `swa_lr` with the scheduler's last rate.
            Some(SwaLrMode::Composer) => Some(Swalr::new(lr)),
            Some(SwaLrMode::Hold) => Some(Swalr::new(self.config.swa_lr.unwrap_or(lr))),
        };
        self.started = true;
        Ok(())
    }

    /// Moves the average to the model's device (after a resume from another device).
    fn ensure_device(&mut self, model: &[ModelTensor]) -> Result<(), Error> {
        check_matches(&self.average, model)?;
        for ((_, a), m) in self.average.iter_mut().zip(model) {
            if a.device() != m.tensor.device() {
                *a = a.f_to_device(m.tensor.device())?;
            }
        }
        Ok(())
    }

    /// `model.load_state_dict(average)`.
    fn replace(&mut self, model: &[ModelTensor]) -> Result<(), Error> {
        self.ensure_device(model)?;
        for ((_, a), m) in self.average.iter().zip(model) {
            copy_into(&m.tensor, a)?;
        }
        self.completed = true;
        Ok(())
    }
}

impl Swa {
    /// This rank's slices of the model's parameters and buffers, sharing storage, in the
    /// host's order; `write`: the average will be put into them. An average read whole from a
    /// checkpoint is cut to the slices.
    fn model_tensors(
        &mut self,
        ctx: &mut Context<'_>,
        write: bool,
    ) -> Result<Vec<ModelTensor>, Error> {
        let mut out = Vec::new();
        for info in ctx.parameters()? {
            let name = info.name.as_str().to_owned();
            let slice = ctx.parameter_slice(&name, write)?.ok_or_else(|| {
                Error::from(format!("the host listed `{name}` but has no such tensor"))
            })?;
            self.sliced.note(&name, slice.layout);
            out.push(ModelTensor {
                name,
                tensor: slice.tensor,
                buffer: info.buffer,
            });
        }
        self.sliced
            .cut_whole(&mut self.average, "SWA", "the average")?;
        Ok(out)
    }
}

/// Makes the host's next step use `lr` (the host only scales its own rate).
fn set_next_lr(ctx: &mut Context<'_>, lr: f64) -> Result<(), Error> {
    let current = ctx.lr()?;
    if current == lr {
        return Ok(());
    }
    if current == 0.0 || !current.is_finite() {
        return Err(format!(
            "cannot set the SWA learning rate {lr}: the host's rate for the next step is {current}, \
             which no scale turns into it"
        )
        .into());
    }
    ctx.scale_lr(lr / current)
}

impl Method for Swa {
    fn on_event(&mut self, event: Event, ctx: &mut Context<'_>) -> Result<(), Error> {
        // What was gathered for the last checkpoint has been saved.
        self.sliced.forget_gathered();
        match event {
            Event::BATCH_CHECKPOINT | Event::EPOCH_CHECKPOINT | Event::ITERATION_CHECKPOINT => {
                if ctx.checkpoint_pending()? {
                    self.sliced.gather(ctx, "average", &self.average)?;
                }
                Ok(())
            }
            Event::BATCH_END | Event::EPOCH_END => {
                let update_event = event == self.config.update_event();
                let due = update_event && !self.completed && self.config.started_at(&ctx.time());
                if !due && self.held_lr.is_none() {
                    return Ok(());
                }
                // The average goes into the model when `swa_end` is reached.
                let model = if due {
                    let write = self.config.ended_at(&ctx.time());
                    self.model_tensors(ctx, write)?
                } else {
                    Vec::new()
                };
                let first = !self.started && due;
                let lr = ctx.lr()?;
                let time = ctx.time();
                let outcome = self.train_event(event, &time, lr, &model)?;
                if first {
                    ctx.info(&format!(
                        "swa: averaging starts at batch {} (every {}, until {})",
                        time.batch, self.config.update_interval, self.config.swa_end
                    ));
                    if self.config.swa_lr.is_some()
                        && self.config.lr_mode() != Some(SwaLrMode::Hold)
                    {
                        ctx.warn(
                            "swa: `swa_lr` is ignored (as in Composer) unless `schedule_swa_lr = true` \
                             and `swa_lr_mode = \"hold\"`",
                        );
                    }
                }
                if let Some(lr) = outcome.next_lr {
                    set_next_lr(ctx, lr)?;
                }
                if outcome.updated {
                    ctx.log_metric("swa/n_averaged", self.n_averaged as f64);
                }
                if let Some(lr) = outcome.swalr_lr {
                    ctx.log_metric("swa/lr", lr);
                }
                if outcome.replaced {
                    ctx.log_metric("swa/replaced", 1.0);
                    ctx.info(&format!(
                        "swa: the average of {} models replaced the model's weights at batch {}",
                        self.n_averaged, time.batch
                    ));
                }
                Ok(())
            }
            Event::FIT_END => {
                if self.started && !self.completed {
                    let model = self.model_tensors(ctx, true)?;
                    if self.finish(&model)? {
                        ctx.log_metric("swa/replaced", 1.0);
                        ctx.warn(&format!(
                            "swa: `swa_end` ({}) was not reached at an update event; the average of \
                             {} models replaced the model's weights at the end of training",
                            self.config.swa_end, self.n_averaged
                        ));
                    }
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Format 1: `bytes` is JSON `{"started", "completed", "step_counter", "n_averaged",
    /// "swalr": null | {"swa_lr", "steps"}, "held_lr"}`; tensors `average/<name>` once
    /// averaging has started.
    fn state(&self) -> Result<State, Error> {
        let counters = Counters {
            started: self.started,
            completed: self.completed,
            step_counter: self.step_counter,
            n_averaged: self.n_averaged,
            swalr: self.swalr,
            held_lr: self.held_lr,
        };
        let tensors = self
            .sliced
            .saved("average", &self.average, "SWA's average is")?;
        json_state("SWA", STATE_FORMAT_VERSION, &counters, tensors)
    }

    fn load_state(&mut self, state: State) -> Result<(), Error> {
        let mut reader = StateReader::open("SWA", state, STATE_FORMAT_VERSION)?;
        let counters: Counters = reader.json()?;
        let average = reader.take("average");
        reader.finish()?;
        if counters.started == average.is_empty() {
            return Err(format!(
                "SWA state: {} averaged tensors for a run where averaging {} started",
                average.len(),
                if counters.started { "has" } else { "has not" }
            )
            .into());
        }
        // Whole tensors: cut to this rank's slices when the model is next read.
        self.sliced.set_whole(!average.is_empty());
        self.average = average;
        self.started = counters.started;
        self.completed = counters.completed;
        self.step_counter = counters.step_counter;
        self.n_averaged = counters.n_averaged;
        self.swalr = counters.swalr;
        self.held_lr = counters.held_lr;
        Ok(())
    }
}
