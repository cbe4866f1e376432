//! [`TimeUnit`]: the units training time can be measured in.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::TimeError;

/// A unit of training time, written as a short suffix in time strings (`"2ep"`, `"100ba"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TimeUnit {
    /// Iterations (`iter`): a group of epochs; one per run unless configured otherwise.
    Iteration,
    /// Epochs (`ep`): full passes over the training set.
    Epoch,
    /// Batches (`ba`): optimizer steps.
    Batch,
    /// Samples (`sp`): training examples seen, summed over all ranks.
    Sample,
    /// Tokens (`tok`): tokens seen, summed over all ranks.
    Token,
    /// Duration (`dur`): a fraction of `max_duration` (`0.5dur` is half-way through training).
    Duration,
    /// Wall-clock seconds (`sec`).
    Second,
}

impl TimeUnit {
    /// Every unit, in declaration order.
    pub const ALL: [TimeUnit; 7] = [
        TimeUnit::Iteration,
        TimeUnit::Epoch,
        TimeUnit::Batch,
        TimeUnit::Sample,
        TimeUnit::Token,
        TimeUnit::Duration,
        TimeUnit::Second,
    ];

    /// The suffix used in time strings: `iter`, `ep`, `ba`, `sp`, `tok`, `dur` or `sec`.
    pub fn suffix(self) -> &'static str {
        match self {
            TimeUnit::Iteration => "iter",
            TimeUnit::Epoch => "ep",
            TimeUnit::Batch => "ba",
            TimeUnit::Sample => "sp",
            TimeUnit::Token => "tok",
            TimeUnit::Duration => "dur",
            TimeUnit::Second => "sec",
        }
    }

    /// A human-readable plural name (`"epochs"`, `"batches"`, ...), used in error messages.
    pub fn name(self) -> &'static str {
        match self {
            TimeUnit::Iteration => "iterations",
            TimeUnit::Epoch => "epochs",
            TimeUnit::Batch => "batches",
            TimeUnit::Sample => "samples",
            TimeUnit::Token => "tokens",
            TimeUnit::Duration => "duration fractions",
            TimeUnit::Second => "seconds",
        }
    }

    /// Whether values in this unit are whole counts (every unit except `dur`).
    pub fn is_count(self) -> bool {
        self != TimeUnit::Duration
    }

    /// Looks a suffix up, ignoring ASCII case (`"EP"` is [`TimeUnit::Epoch`]).
    pub fn from_suffix(suffix: &str) -> Option<TimeUnit> {
        TimeUnit::ALL
            .into_iter()
            .find(|u| u.suffix().eq_ignore_ascii_case(suffix))
    }
}

impl fmt::Display for TimeUnit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.suffix())
    }
}

impl FromStr for TimeUnit {
    type Err = TimeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TimeUnit::from_suffix(s.trim()).ok_or_else(|| TimeError::UnknownUnit {
            input: s.to_string(),
        })
    }
}

impl Serialize for TimeUnit {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.suffix())
    }
}

impl<'de> Deserialize<'de> for TimeUnit {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suffixes_round_trip() {
        for unit in TimeUnit::ALL {
            assert_eq!(unit.to_string().parse::<TimeUnit>().ok(), Some(unit));
            assert_eq!(
                unit.suffix().to_uppercase().parse::<TimeUnit>().ok(),
                Some(unit)
            );
        }
    }

    #[test]
    fn unknown_unit_is_an_error_naming_the_valid_ones() {
        let err = "epoch".parse::<TimeUnit>().err().map(|e| e.to_string());
        let msg = err.unwrap_or_default();
        assert!(msg.contains("\"epoch\""), "{msg}");
        assert!(msg.contains("iter, ep, ba, sp, tok, dur, sec"), "{msg}");
    }

    #[test]
    fn only_duration_is_fractional() {
        assert!(!TimeUnit::Duration.is_count());
        assert!(TimeUnit::ALL
            .into_iter()
            .filter(|u| *u != TimeUnit::Duration)
            .all(TimeUnit::is_count));
    }
}
