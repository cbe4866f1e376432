//! The settings: `half_life` or `smoothing`, `update_interval` and `ema_start`, read as
//! Composer's `EMA` reads them, with time strings in the host's grammar
//! ([`tessera_plugin_api::Time`]).

use serde_json::Value;
use tessera_plugin_api::{Error, Event, Settings, Time, TimeInfo, TimeUnit};

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
    /// When averaging starts (epochs, batches, samples, tokens or a fraction of the run); the
    /// shadow weights are reset to the model's then.
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

/// A time setting, naming the setting in the error.
fn parse_time(setting: &str, text: &str) -> Result<Time, Error> {
    Time::parse(text).map_err(|e| Error::config(format!("setting `{setting}`: {e}")))
}

/// `half_life` and `update_interval`: a positive whole number of batches or epochs.
fn interval(setting: &str, text: &str) -> Result<Time, Error> {
    let time = parse_time(setting, text)?;
    match (time.unit(), time.count()) {
        (TimeUnit::Batch | TimeUnit::Epoch, Some(0)) => Err(Error::config(format!(
            "setting `{setting}` must be positive, got {text:?}"
        ))),
        (TimeUnit::Batch | TimeUnit::Epoch, Some(_)) => Ok(time),
        _ => Err(Error::config(format!(
            "setting `{setting}` must be in batches (ba) or epochs (ep), got {text:?}"
        ))),
    }
}

/// `ema_start`: a time the clock counts (`reached` can tell), a duration at most the run.
fn start(text: &str) -> Result<Time, Error> {
    let time = parse_time("ema_start", text)?;
    if time.reached(&TimeInfo::default()).is_none() {
        return Err(Error::config(format!(
            "setting `ema_start` must be in epochs (ep), batches (ba), samples (sp), tokens (tok) \
             or a fraction of the run (dur), got {text:?}"
        )));
    }
    if time.fraction().is_some_and(|f| f > 1.0) {
        return Err(Error::config(format!(
            "setting `ema_start`: a duration must be in [0, 1], got {text:?}"
        )));
    }
    Ok(time)
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
        let ema_start = start(&settings.str("ema_start")?)?;

        let half_life = match (half_life, smoothing) {
            (Some(_), Some(_)) => {
                return Err(Error::config(
                    "give either `half_life` or `smoothing`, not both",
                ))
            }
            (Some(h), None) => Some(interval("half_life", &h)?),
            (None, Some(_)) => None,
            (None, None) => Some(interval("half_life", "1000ba")?),
        };
        let update_interval = match update_interval {
            Some(text) => interval("update_interval", &text)?,
            // One unit of half_life's unit, or one batch with `smoothing`.
            None => Time::new(1, half_life.map_or(TimeUnit::Batch, |h| h.unit())),
        };
        let smoothing = match half_life {
            Some(h) => {
                if h.unit() != update_interval.unit() {
                    return Err(Error::config(format!(
                        "settings `half_life` and `update_interval` must use the same unit, got {h} and {update_interval}"
                    )));
                }
                // Both are positive counts (`interval`).
                smoothing_from_half_life(
                    update_interval.count().unwrap_or(1),
                    h.count().unwrap_or(1),
                )
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
        match self.update_interval.unit() {
            TimeUnit::Epoch => Event::EPOCH_END,
            _ => Event::BATCH_END,
        }
    }

    /// Whether an update is due at the update event: the completed batch (or epoch) count is a
    /// multiple of the interval.
    pub fn update_due(&self, time: &TimeInfo) -> bool {
        let done = match self.update_interval.unit() {
            TimeUnit::Batch => time.batch,
            TimeUnit::Epoch => time.epoch,
            _ => return false,
        };
        self.update_interval
            .count()
            .is_some_and(|n| n > 0 && done.is_multiple_of(n))
    }
}
