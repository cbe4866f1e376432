//! Exponential moving average of the weights (EMA), as Composer's `EMA`
//! (`composer/algorithms/ema/ema.py`).
//!
//! The method keeps a shadow copy of every parameter and buffer of the model and, at each update,
//! moves it towards the trained weights: `ema ← s·ema + (1 − s)·θ`, with the smoothing
//! `s = 2^(−update_interval / half_life)`. Evaluation (and checkpoints, once the host writes
//! them) use the shadow weights: they are copied into the model at `eval_start` and the
//! training weights are copied back at `eval_end`.
//!
//! The pure function [`compute_ema`] is usable from Rust directly (the crate is also an rlib);
//! the time strings of the settings are parsed by [`Time::parse`].

#![warn(missing_docs)]

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tessera_plugin_api::tch::{self, Device, Kind, Tensor};
use tessera_plugin_api::{
    export_plugin, Context, Error, Event, Hook, Method, Plugin, Settings, State, TimeInfo,
};

// ------------------------------------------------------------------------------------------
// Time strings
// ------------------------------------------------------------------------------------------

/// A time string of the settings, as Composer's `Time.from_timestring`: `"1000ba"`, `"3ep"`,
/// `"0.5dur"`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Time {
    /// Optimizer steps (`ba`), a whole number.
    Batches(u64),
    /// Epochs (`ep`), a whole number.
    Epochs(u64),
    /// A fraction of the run (`dur`), in `[0, 1]`.
    Duration(f64),
}

impl Time {
    /// Parses `text`, naming `setting` in errors. Units: `ba` and `ep` take a whole number
    /// (`"100ba"`), `dur` a decimal in `[0, 1]` (`"0.25dur"`). No spaces, signs or exponents.
    pub fn parse(setting: &str, text: &str) -> Result<Time, Error> {
        let bad = |why: &str| {
            Error::config(format!(
                "setting `{setting}`: {why} in {text:?} (write e.g. \"100ba\", \"2ep\" or \"0.5dur\")"
            ))
        };
        let split = text
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| bad("no unit"))?;
        let (number, unit) = text.split_at(split);
        if number.is_empty() {
            return Err(bad("no number"));
        }
        let whole = || -> Result<u64, Error> {
            if !number.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad(&format!("`{unit}` needs a whole number")));
            }
            number.parse::<u64>().map_err(|_| bad("number too large"))
        };
        match unit {
            "ba" => Ok(Time::Batches(whole()?)),
            "ep" => Ok(Time::Epochs(whole()?)),
            "dur" => {
                if number == "." || number.matches('.').count() > 1 {
                    return Err(bad("not a number"));
                }
                let value: f64 = number.parse().map_err(|_| bad("not a number"))?;
                if !(0.0..=1.0).contains(&value) {
                    return Err(bad("a duration must be in [0, 1]"));
                }
                Ok(Time::Duration(value))
            }
            other => Err(bad(&format!("unknown unit `{other}` (use ba, ep or dur)"))),
        }
    }

    /// The whole count and unit name of a `ba`/`ep` time; `None` for a duration.
    fn count(self) -> Option<(u64, &'static str)> {
        match self {
            Time::Batches(n) => Some((n, "ba")),
            Time::Epochs(n) => Some((n, "ep")),
            Time::Duration(_) => None,
        }
    }

    /// Whether the clock has reached this time (Composer's `EMA._should_start`): a count of
    /// batches or epochs, or a fraction of the run.
    pub fn reached(self, time: &TimeInfo) -> bool {
        match self {
            Time::Batches(n) => time.batch >= n,
            Time::Epochs(n) => time.epoch >= n,
            Time::Duration(f) => time.elapsed_fraction >= f,
        }
    }
}

impl fmt::Display for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Time::Batches(n) => write!(f, "{n}ba"),
            Time::Epochs(n) => write!(f, "{n}ep"),
            Time::Duration(v) => write!(f, "{v}dur"),
        }
    }
}

// ------------------------------------------------------------------------------------------
// Settings
// ------------------------------------------------------------------------------------------

/// `2^(−update_interval / half_life)`: the smoothing that halves an observation's weight after
/// `half_life` (both counts in the same unit).
pub fn smoothing_from_half_life(update_interval: u64, half_life: u64) -> f64 {
    2f64.powf(-(update_interval as f64 / half_life as f64))
}

/// The method's resolved settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EmaConfig {
    /// `s` in `ema ← s·ema + (1 − s)·θ`.
    pub smoothing: f64,
    /// How often to update: every `n` batches (at `batch_end`) or epochs (at `epoch_end`).
    pub update_interval: Time,
    /// When averaging starts; the shadow weights are reset to the model's then.
    pub ema_start: Time,
}

/// An optional string setting: absent or `null` is `None`.
fn optional_string(settings: &Settings, key: &str) -> Result<Option<String>, Error> {
    match settings.get_or::<Value>(key, Value::Null)? {
        Value::Null => Ok(None),
        Value::String(s) => Ok(Some(s)),
        other => Err(Error::config(format!(
            "setting `{key}` must be a time string such as \"10ba\" or \"1ep\", got {other}"
        ))),
    }
}

impl EmaConfig {
    /// Reads `half_life`, `smoothing`, `ema_start` and `update_interval` as Composer's `EMA`
    /// does. `smoothing` replaces the default `half_life`; giving both is an error.
    pub fn from_settings(settings: &Settings) -> Result<EmaConfig, Error> {
        let half_life = optional_string(settings, "half_life")?;
        let smoothing = match settings.get_or::<Value>("smoothing", Value::Null)? {
            Value::Null => None,
            Value::Number(n) => n.as_f64(),
            other => {
                return Err(Error::config(format!(
                    "setting `smoothing` must be a number in (0, 1), got {other}"
                )))
            }
        };
        let update_interval = optional_string(settings, "update_interval")?;
        let ema_start = Time::parse("ema_start", &settings.str_or("ema_start", "0.0dur")?)?;

        let half_life = match (&half_life, smoothing) {
            (Some(_), Some(_)) => {
                return Err(Error::config(
                    "give either `half_life` or `smoothing`, not both",
                ))
            }
            (Some(h), None) => Some(h.clone()),
            (None, Some(_)) => None,
            (None, None) => Some("1000ba".to_owned()),
        };
        let half_life = match half_life {
            Some(text) => {
                let t = Time::parse("half_life", &text)?;
                let (n, unit) = t.count().ok_or_else(|| {
                    Error::config(format!(
                        "setting `half_life` must be in batches (ba) or epochs (ep), got {text:?}"
                    ))
                })?;
                if n == 0 {
                    return Err(Error::config(format!(
                        "setting `half_life` must be positive, got {text:?}"
                    )));
                }
                Some((n, unit))
            }
            None => None,
        };
        let update_interval = match update_interval {
            Some(text) => {
                let t = Time::parse("update_interval", &text)?;
                match t.count() {
                    Some((0, _)) => {
                        return Err(Error::config(format!(
                            "setting `update_interval` must be positive, got {text:?}"
                        )))
                    }
                    Some(_) => t,
                    None => {
                        return Err(Error::config(format!(
                            "setting `update_interval` must be in batches (ba) or epochs (ep), got {text:?}"
                        )))
                    }
                }
            }
            // One unit of half_life's unit, or one batch with `smoothing`.
            None => match half_life {
                Some((_, "ep")) => Time::Epochs(1),
                _ => Time::Batches(1),
            },
        };
        let (interval, interval_unit) = update_interval
            .count()
            .ok_or_else(|| Error::config("setting `update_interval` must be ba or ep"))?;
        let smoothing = match half_life {
            Some((n, unit)) => {
                if unit != interval_unit {
                    return Err(Error::config(format!(
                        "settings `half_life` and `update_interval` must use the same unit, got {n}{unit} and {update_interval}"
                    )));
                }
                smoothing_from_half_life(interval, n)
            }
            None => {
                // `half_life` is only absent when `smoothing` was given.
                let s = smoothing.unwrap_or(f64::NAN);
                if !(s > 0.0 && s < 1.0) {
                    return Err(Error::config(format!(
                        "setting `smoothing` must be in (0, 1), got {s}"
                    )));
                }
                s
            }
        };
        Ok(EmaConfig {
            smoothing,
            update_interval,
            ema_start,
        })
    }

    /// The event at which the average is updated: `batch_end` or `epoch_end`.
    pub fn update_event(&self) -> Event {
        match self.update_interval {
            Time::Epochs(_) => Event::EPOCH_END,
            _ => Event::BATCH_END,
        }
    }

    /// Whether an update is due at the update event: the completed batch (or epoch) count is a
    /// multiple of the interval.
    pub fn update_due(&self, time: &TimeInfo) -> bool {
        match self.update_interval {
            Time::Batches(n) => n > 0 && time.batch.is_multiple_of(n),
            Time::Epochs(n) => n > 0 && time.epoch.is_multiple_of(n),
            Time::Duration(_) => false,
        }
    }
}

// ------------------------------------------------------------------------------------------
// The update
// ------------------------------------------------------------------------------------------

/// One tensor's update, in place: `ema ← ema·s + θ·(1 − s)`, computed as Composer does
/// (`ema * s + (1 - s) * θ`) and written back with `copy_`, so an integer tensor (BatchNorm's
/// `num_batches_tracked`) receives the float result truncated toward zero.
pub fn ema_update(ema: &mut Tensor, model: &Tensor, smoothing: f64) -> Result<(), Error> {
    let _no_grad = tch::no_grad_guard();
    let model = model.f_detach()?;
    let mixed = ema
        .f_mul_scalar(smoothing)?
        .f_add(&model.f_mul_scalar(1.0 - smoothing)?)?;
    ema.f_copy_(&mixed)?;
    Ok(())
}

/// Composer's `compute_ema` on named tensors: every tensor of `ema` (which shares storage with
/// the caller's, and is updated in place) moves towards the model tensor of the same name.
/// A name of `ema` missing from `model`, or a shape mismatch, is an error.
pub fn compute_ema(
    ema: &[(String, Tensor)],
    model: &[(String, Tensor)],
    smoothing: f64,
) -> Result<(), Error> {
    for (name, e) in ema {
        let m = model
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t)
            .ok_or_else(|| Error::from(format!("compute_ema: the model has no `{name}`")))?;
        if e.size() != m.size() {
            return Err(format!(
                "compute_ema: `{name}` has shape {:?} in the average but {:?} in the model",
                e.size(),
                m.size()
            )
            .into());
        }
        ema_update(&mut e.shallow_clone(), m, smoothing)?;
    }
    Ok(())
}

/// A detached copy of `t` (same shape, kind and device) that shares nothing with it.
fn detached_copy(t: &Tensor) -> Result<Tensor, Error> {
    let _no_grad = tch::no_grad_guard();
    let mut out = t.f_detach()?.f_zeros_like()?;
    out.f_copy_(t)?;
    Ok(out)
}

/// `dst ← src` in place, without recording a gradient.
fn copy_into(dst: &Tensor, src: &Tensor) -> Result<(), Error> {
    let _no_grad = tch::no_grad_guard();
    dst.shallow_clone().f_copy_(src)?;
    Ok(())
}

// ------------------------------------------------------------------------------------------
// The method
// ------------------------------------------------------------------------------------------

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

    /// Shadow (and spare training) copies of every parameter and buffer of the model.
    fn snapshot(&mut self, ctx: &Context<'_>) -> Result<(), Error> {
        let mut ema = Vec::new();
        let mut training = Vec::new();
        for info in ctx.parameters()? {
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

    /// Takes the shadow weights at `init`; at `fit_start` checks them against the model (and
    /// moves them to its device), taking them again when surgery changed the model and nothing
    /// depends on the old ones yet.
    fn attach(&mut self, ctx: &mut Context<'_>) -> Result<(), Error> {
        if self.ema.is_empty() && !self.loaded {
            return self.snapshot(ctx);
        }
        let model: Vec<(String, Vec<i64>)> = ctx
            .parameters()?
            .into_iter()
            .map(|p| (p.name.into_string(), p.shape.into_vec()))
            .collect();
        let ours: Vec<(String, Vec<i64>)> = self
            .ema
            .iter()
            .map(|(n, t)| (n.clone(), t.size()))
            .collect();
        if model != ours {
            if !self.started && !self.loaded {
                ctx.info("ema: the model changed since init; taking the shadow weights again");
                return self.snapshot(ctx);
            }
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
        if !self.started && self.config.ema_start.reached(&time) {
            // As Composer: averaging starts from the model's weights at that moment.
            let model = self.model_tensors(ctx)?;
            for ((_, e), m) in self.ema.iter().zip(&model) {
                copy_into(e, m)?;
            }
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
            Event::BATCH_CHECKPOINT | Event::EPOCH_CHECKPOINT => {
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
            if ours != theirs {
                return Err(format!(
                    "EMA state: the saved weights {theirs:?} do not match the model's {ours:?}"
                )
                .into());
            }
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
        ]
    }

    fn create(settings: &Settings) -> Result<Self, Error> {
        Ok(Ema::new(EmaConfig::from_settings(settings)?))
    }
}

export_plugin!(Ema);
