//! The settings, read as Composer's `SWA` reads them (time strings in the host's grammar,
//! [`tessera_plugin_api::Time`]), plus `swa_lr_mode`, which chooses between Composer's
//! learning-rate behaviour and PyTorch's intended one.

use serde_json::Value;
use tessera_plugin_api::{Error, Event, Settings, Time, TimeInfo, TimeUnit};

/// How the SWA learning rate is annealed: `f(t)` for `t` in `[0, 1]`, PyTorch's `SWALR`
/// `anneal_strategy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AnnealStrategy {
    /// `f(t) = t` (`"linear"` or `"lin"`).
    Linear,
    /// `f(t) = (1 − cos(π·t)) / 2` (`"cos"` or `"cosine"`).
    Cos,
}

impl AnnealStrategy {
    /// Reads `"linear"`/`"lin"` or `"cos"`/`"cosine"`, in any case, as Composer does.
    pub fn parse(text: &str) -> Option<AnnealStrategy> {
        match text.to_lowercase().as_str() {
            "linear" | "lin" => Some(AnnealStrategy::Linear),
            "cos" | "cosine" => Some(AnnealStrategy::Cos),
            _ => None,
        }
    }

    /// The annealing function `f(t)`.
    pub fn alpha(self, t: f64) -> f64 {
        match self {
            AnnealStrategy::Linear => t,
            AnnealStrategy::Cos => (1.0 - (std::f64::consts::PI * t).cos()) / 2.0,
        }
    }

    /// The setting's canonical spelling.
    pub fn name(self) -> &'static str {
        match self {
            AnnealStrategy::Linear => "linear",
            AnnealStrategy::Cos => "cos",
        }
    }
}

/// Where the SWA learning rate comes from and how long it holds (only with
/// `schedule_swa_lr = true`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SwaLrMode {
    /// Composer 0.32.1 (the default): `swa_lr` is ignored and the target is the schedule's
    /// rate when averaging starts; each `SWALR` step back-solves its base from the host's
    /// current rate and sets the rate of the next optimizer step only, after which the host's
    /// schedule takes over again.
    Composer,
    /// PyTorch's `SWALR` as intended (and Composer's behaviour in a run without any scheduler):
    /// anneal from the rate at the start towards `swa_lr` over `anneal_steps` updates, then hold
    /// `swa_lr`; the plugin sets every step's rate from the first update to the end of the run.
    Hold,
}

impl SwaLrMode {
    /// The setting's spelling.
    pub fn name(self) -> &'static str {
        match self {
            SwaLrMode::Composer => "composer",
            SwaLrMode::Hold => "hold",
        }
    }
}

/// The method's resolved settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SwaConfig {
    /// When averaging starts: epochs (`ep`) or a fraction of the run (`dur`, measured in the
    /// unit of `max_duration`).
    pub swa_start: Time,
    /// When the averaged weights replace the model's; the same unit as `swa_start`, later.
    pub swa_end: Time,
    /// How often the average is updated: every `n` batches (`batch_end`) or epochs
    /// (`epoch_end`).
    pub update_interval: Time,
    /// Whether `SWALR` anneals the learning rate while averaging.
    pub schedule_swa_lr: bool,
    /// `SWALR`'s annealing function.
    pub anneal_strategy: AnnealStrategy,
    /// The number of updates over which the rate is annealed (positive).
    pub anneal_steps: u64,
    /// The rate to anneal towards (used by [`SwaLrMode::Hold`] only, as Composer ignores it).
    pub swa_lr: Option<f64>,
    /// Composer's learning-rate behaviour or PyTorch's.
    pub swa_lr_mode: SwaLrMode,
}

impl Default for SwaConfig {
    /// Composer's defaults: `swa_start = "0.7dur"`, `swa_end = "0.97dur"`,
    /// `update_interval = "1ep"`, no learning-rate schedule, linear annealing over 10 updates,
    /// `swa_lr = None`.
    fn default() -> SwaConfig {
        SwaConfig {
            swa_start: Time::dur(0.7),
            swa_end: Time::dur(0.97),
            update_interval: Time::new(1, TimeUnit::Epoch),
            schedule_swa_lr: false,
            anneal_strategy: AnnealStrategy::Linear,
            anneal_steps: 10,
            swa_lr: None,
            swa_lr_mode: SwaLrMode::Composer,
        }
    }
}

/// A time setting, naming the setting in the error.
fn parse_time(setting: &str, text: &str) -> Result<Time, Error> {
    Time::parse(text).map_err(|e| Error::config(format!("setting `{setting}`: {e}")))
}

/// A string setting, naming the setting when it is not a string.
fn string(settings: &Settings, key: &str, default: &str) -> Result<String, Error> {
    match settings.get_or::<Value>(key, Value::String(default.to_owned()))? {
        Value::String(s) => Ok(s),
        other => Err(Error::config(format!(
            "setting `{key}` must be a string, got {other}"
        ))),
    }
}

/// `swa_start` / `swa_end`: epochs or a fraction of the run in `[0, 1]`.
fn boundary(setting: &str, text: &str) -> Result<Time, Error> {
    let time = parse_time(setting, text)?;
    match time.unit() {
        TimeUnit::Epoch => Ok(time),
        TimeUnit::Duration => match time.fraction() {
            Some(f) if (0.0..=1.0).contains(&f) => Ok(time),
            _ => Err(Error::config(format!(
                "setting `{setting}`: a duration must be in [0, 1], got {text:?}"
            ))),
        },
        _ => Err(Error::config(format!(
            "setting `{setting}` must be in epochs (ep) or a fraction of the run (dur), got {text:?}"
        ))),
    }
}

/// The position of a `dur` or `ep` time on one axis, to order `swa_start` and `swa_end`.
fn position(time: &Time) -> f64 {
    match time.fraction() {
        Some(f) => f,
        None => time.count().unwrap_or(0) as f64,
    }
}

impl SwaConfig {
    /// Reads the settings with Composer's defaults; a bad value is an invalid-settings error
    /// naming the setting.
    pub fn from_settings(settings: &Settings) -> Result<SwaConfig, Error> {
        let swa_start = boundary("swa_start", &string(settings, "swa_start", "0.7dur")?)?;
        let swa_end = boundary("swa_end", &string(settings, "swa_end", "0.97dur")?)?;
        if swa_start.unit() != swa_end.unit() {
            return Err(Error::config(format!(
                "settings `swa_start` and `swa_end` must use the same unit, got {swa_start} and {swa_end}"
            )));
        }
        if position(&swa_start) >= position(&swa_end) {
            return Err(Error::config(format!(
                "setting `swa_end` ({swa_end}) must be later than `swa_start` ({swa_start})"
            )));
        }
        let interval_text = string(settings, "update_interval", "1ep")?;
        let update_interval = parse_time("update_interval", &interval_text)?;
        match (update_interval.unit(), update_interval.count()) {
            (TimeUnit::Batch | TimeUnit::Epoch, Some(n)) if n > 0 => {}
            (TimeUnit::Batch | TimeUnit::Epoch, _) => {
                return Err(Error::config(format!(
                    "setting `update_interval` must be positive, got {interval_text:?}"
                )))
            }
            _ => {
                return Err(Error::config(format!(
                    "setting `update_interval` must be in batches (ba) or epochs (ep), got {interval_text:?}"
                )))
            }
        }
        let schedule_swa_lr = settings.bool("schedule_swa_lr")?;
        let strategy_text = string(settings, "anneal_strategy", "linear")?;
        let anneal_strategy = AnnealStrategy::parse(&strategy_text).ok_or_else(|| {
            Error::config(format!(
                "setting `anneal_strategy` must be \"linear\" or \"cos\", got {strategy_text:?}"
            ))
        })?;
        let anneal_steps = match settings.get_or::<Value>("anneal_steps", Value::from(10))? {
            Value::Number(n) if n.as_u64().is_some_and(|n| n > 0) => n.as_u64().unwrap_or(10),
            other => {
                return Err(Error::config(format!(
                    "setting `anneal_steps` must be a whole number of updates greater than 0, got {other}"
                )))
            }
        };
        let swa_lr = match settings.get_or::<Value>("swa_lr", Value::Null)? {
            Value::Null => None,
            Value::Number(n) => match n.as_f64() {
                Some(lr) if lr.is_finite() && lr >= 0.0 => Some(lr),
                _ => {
                    return Err(Error::config(format!(
                        "setting `swa_lr` must be a finite number ≥ 0, got {n}"
                    )))
                }
            },
            other => {
                return Err(Error::config(format!(
                    "setting `swa_lr` must be a number, got {other}"
                )))
            }
        };
        let mode_text = string(settings, "swa_lr_mode", "composer")?;
        let swa_lr_mode = match mode_text.as_str() {
            "composer" => SwaLrMode::Composer,
            "hold" => SwaLrMode::Hold,
            _ => {
                return Err(Error::config(format!(
                    "setting `swa_lr_mode` must be \"composer\" or \"hold\", got {mode_text:?}"
                )))
            }
        };
        if swa_lr_mode == SwaLrMode::Hold && schedule_swa_lr && swa_lr.is_none() {
            return Err(Error::config(
                "setting `swa_lr` is required with `swa_lr_mode = \"hold\"` and `schedule_swa_lr = true`",
            ));
        }
        Ok(SwaConfig {
            swa_start,
            swa_end,
            update_interval,
            schedule_swa_lr,
            anneal_strategy,
            anneal_steps,
            swa_lr,
            swa_lr_mode,
        })
    }

    /// The event at which the average may be updated: `batch_end` (`ba`) or `epoch_end`
    /// (`ep`).
    pub fn update_event(&self) -> Event {
        match self.update_interval.unit() {
            TimeUnit::Epoch => Event::EPOCH_END,
            _ => Event::BATCH_END,
        }
    }

    /// The update interval's count (every `n`-th matching event updates).
    pub fn interval(&self) -> u64 {
        self.update_interval.count().unwrap_or(1).max(1)
    }

    /// Whether `swa_start` has been reached: the completed epochs for `ep`, the elapsed
    /// fraction (in the unit of `max_duration`) for `dur`.
    pub fn started_at(&self, time: &TimeInfo) -> bool {
        self.swa_start.reached(time) == Some(true)
    }

    /// Whether `swa_end` has been reached (as [`SwaConfig::started_at`]).
    pub fn ended_at(&self, time: &TimeInfo) -> bool {
        self.swa_end.reached(time) == Some(true)
    }

    /// Whether the learning rate is taken over, and how.
    pub fn lr_mode(&self) -> Option<SwaLrMode> {
        self.schedule_swa_lr.then_some(self.swa_lr_mode)
    }
}
