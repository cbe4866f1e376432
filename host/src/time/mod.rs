//! Training time as a typed quantity (Composer's `composer/core/time.py`).
//!
//! * [`TimeUnit`]: `iter`, `ep`, `ba`, `sp`, `tok`, `dur` (fraction of `max_duration`), `sec`.
//! * [`Time`]: a value with a unit, written and parsed as strings such as `"2ep"`, `"100ba"`,
//!   `"1e6tok"`, `"0.5dur"`, `"1h20m40s"` (grammar in [`Time::parse`]). Config files hold times
//!   as strings; serde reads and writes that form.
//! * [`Timestamp`]: the counters of a run (batches, samples, epochs, ...), advanced immutably.
//! * [`RunLength`]: `max_duration` plus the dataloader facts needed to convert between units and
//!   to resolve `dur` times.
//!
//! Scale-schedule ratio (SSR) follows Composer: the trainer scales `max_duration` once
//! ([`RunLength::scaled`]), and schedule times are scaled when resolved ([`RunLength::resolve`]);
//! `dur` times are never scaled themselves, because they are fractions of the already-scaled
//! `max_duration`.

mod parse;
mod run;
mod timestamp;
mod unit;

use std::fmt;
use std::str::FromStr;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub use run::RunLength;
pub use timestamp::Timestamp;
pub use unit::TimeUnit;

/// What a user should write, appended to every parse error.
const TIME_HELP: &str = "write a number followed by a unit (iter, ep, ba, sp, tok, dur, sec), \
     e.g. \"2ep\", \"100ba\", \"1e6tok\", \"0.5dur\", \"30sec\", or a wall-clock time such as \
     \"1h20m40s\"";

/// Everything that can go wrong when reading or converting times.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TimeError {
    /// The time string was empty.
    #[error("empty time string: {TIME_HELP}")]
    Empty,
    /// The time string does not follow the grammar.
    #[error("invalid time {input:?}: {reason}; {TIME_HELP}")]
    Invalid {
        /// The string as given.
        input: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A unit that counts things was given a fractional value.
    #[error(
        "invalid time {input:?}: {} must be a whole number (e.g. \"2{unit}\"); only dur takes \
         fractions, e.g. \"0.5dur\"",
        unit.name()
    )]
    NotInteger {
        /// The string as given.
        input: String,
        /// The unit that needs a whole number.
        unit: TimeUnit,
    },
    /// The value was negative.
    #[error("invalid time {input:?}: times cannot be negative; {TIME_HELP}")]
    Negative {
        /// The string as given.
        input: String,
    },
    /// `max_duration` (or the dataloader facts next to it) cannot describe a run.
    #[error("invalid max_duration {max_duration}: {reason}")]
    InvalidMaxDuration {
        /// The offending `max_duration`, as a time string.
        max_duration: String,
        /// What is wrong and what to do instead.
        reason: String,
    },
    /// A time cannot be converted into the unit needed.
    #[error("cannot use time {time}: {reason}")]
    Conversion {
        /// The time being converted, as a time string.
        time: String,
        /// Why it cannot be converted.
        reason: String,
    },
}

/// The numeric part of a [`Time`]: whole counts for every unit except `dur`.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Value {
    Count(u64),
    Fraction(f64),
}

/// An amount of training time: a whole count of a [`TimeUnit`], or a fraction of
/// `max_duration` for [`TimeUnit::Duration`].
///
/// Displayed and serialized as a time string (`"2ep"`, `"100ba"`, `"0.5dur"`, `"30sec"`);
/// parsed with [`Time::parse`] / [`FromStr`]; deserialized only from strings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Time {
    unit: TimeUnit,
    value: Value,
}

impl Time {
    /// A whole number of `unit`s. For [`TimeUnit::Duration`] the count becomes the fraction
    /// `count as f64` (so `Time::new(1, TimeUnit::Duration)` is `1.0dur`, the whole run).
    pub fn new(count: u64, unit: TimeUnit) -> Time {
        let value = if unit.is_count() {
            Value::Count(count)
        } else {
            Value::Fraction(count as f64)
        };
        Time { unit, value }
    }

    /// A fraction of `max_duration` (`Time::dur(0.5)` is `0.5dur`). The fraction should be
    /// finite and non-negative; [`Time::parse`] guarantees that for parsed times.
    pub fn dur(fraction: f64) -> Time {
        Time {
            unit: TimeUnit::Duration,
            value: Value::Fraction(fraction),
        }
    }

    /// Parses a time string.
    ///
    /// Grammar (Composer's `Time.from_timestring`): first a wall-clock `XhYmZs` (any non-empty
    /// subset in that order, `1h20m40s` is 4840 sec); otherwise a number followed by a
    /// case-insensitive unit suffix (`iter`, `ep`, `ba`, `sp`, `tok`, `dur`, `sec`). The number
    /// is read like Python's `float()`: scientific notation (`1e6tok`) and underscores between
    /// digits (`4_000sp`) are allowed. Only `dur` may be fractional (`2.0ep` is fine, `1.5ep` is
    /// an error); negative values are errors. Errors name the input and say what is valid.
    pub fn parse(s: &str) -> Result<Time, TimeError> {
        parse::parse_time(s)
    }

    /// The unit.
    pub fn unit(&self) -> TimeUnit {
        self.unit
    }

    /// The whole count, or `None` for a `dur` time.
    pub fn count(&self) -> Option<u64> {
        match self.value {
            Value::Count(c) => Some(c),
            Value::Fraction(_) => None,
        }
    }

    /// The fraction of `max_duration` for a `dur` time, `None` for every other unit.
    pub fn fraction(&self) -> Option<f64> {
        match self.value {
            Value::Count(_) => None,
            Value::Fraction(f) => Some(f),
        }
    }

    /// The value as a float, whatever the unit.
    pub fn value_f64(&self) -> f64 {
        match self.value {
            Value::Count(c) => c as f64,
            Value::Fraction(f) => f,
        }
    }

    /// Whether this is a `dur` time.
    pub fn is_dur(&self) -> bool {
        self.unit == TimeUnit::Duration
    }

    /// Applies a scale-schedule ratio: counts become `floor(count × ratio)` (Composer's
    /// `int(value * ssr)`, saturating; a negative or NaN ratio gives 0), in the same unit.
    ///
    /// `dur` times are returned unchanged: they are fractions of `max_duration`, which is
    /// itself scaled, so scaling them too would apply the ratio twice (Composer's
    /// `_convert_time` likewise never applies SSR to `dur` times). Epochs are scaled as epochs
    /// here; [`RunLength::resolve`] converts schedule epochs to batches before scaling, as
    /// Composer does.
    pub fn scaled(&self, ratio: f64) -> Time {
        match self.value {
            // `as` saturates and maps NaN to 0, which is the documented behaviour.
            Value::Count(c) => Time::new((c as f64 * ratio).floor() as u64, self.unit),
            Value::Fraction(_) => *self,
        }
    }
}

impl fmt::Display for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.value {
            Value::Count(c) => write!(f, "{c}{}", self.unit),
            // `{:?}` keeps a decimal point (`1.0dur`) and round-trips exactly.
            Value::Fraction(x) => write!(f, "{x:?}{}", self.unit),
        }
    }
}

impl FromStr for Time {
    type Err = TimeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Time::parse(s)
    }
}

impl Serialize for Time {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// The message for numbers where a time string was expected.
fn number_instead_of_string(found: &dyn fmt::Display) -> String {
    format!(
        "expected a time string, found the number {found}: durations are strings with a unit, \
         e.g. \"2ep\", \"100ba\", \"0.5dur\""
    )
}

struct TimeVisitor;

impl Visitor<'_> for TimeVisitor {
    type Value = Time;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a time string with a unit, e.g. \"2ep\", \"100ba\", \"0.5dur\"")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Time, E> {
        Time::parse(v).map_err(E::custom)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Time, E> {
        Err(E::custom(number_instead_of_string(&v)))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Time, E> {
        Err(E::custom(number_instead_of_string(&v)))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Time, E> {
        Err(E::custom(number_instead_of_string(&v)))
    }
}

impl<'de> Deserialize<'de> for Time {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(TimeVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize, Serialize, PartialEq)]
    struct Cfg {
        max_duration: Time,
    }

    #[test]
    fn accessors() {
        let t = Time::new(3, TimeUnit::Epoch);
        assert_eq!(t.unit(), TimeUnit::Epoch);
        assert_eq!(t.count(), Some(3));
        assert_eq!(t.fraction(), None);
        assert_eq!(t.value_f64(), 3.0);
        assert!(!t.is_dur());
        let d = Time::dur(0.25);
        assert_eq!(d.unit(), TimeUnit::Duration);
        assert_eq!(d.count(), None);
        assert_eq!(d.fraction(), Some(0.25));
        assert_eq!(d.value_f64(), 0.25);
        assert!(d.is_dur());
        assert_eq!(Time::new(1, TimeUnit::Duration), Time::dur(1.0));
    }

    #[test]
    fn display_round_trips() {
        let cases = [
            (Time::new(2, TimeUnit::Epoch), "2ep"),
            (Time::new(100, TimeUnit::Batch), "100ba"),
            (Time::dur(0.5), "0.5dur"),
            (Time::dur(1.0), "1.0dur"),
            (Time::new(30, TimeUnit::Second), "30sec"),
            (Time::new(7, TimeUnit::Iteration), "7iter"),
            (Time::new(1_000_000, TimeUnit::Token), "1000000tok"),
            (Time::new(64, TimeUnit::Sample), "64sp"),
        ];
        for (t, s) in cases {
            assert_eq!(t.to_string(), s);
            assert_eq!(s.parse::<Time>(), Ok(t));
        }
        let odd = Time::dur(0.1 + 0.2);
        assert_eq!(odd.to_string().parse::<Time>(), Ok(odd));
    }

    #[test]
    fn scaled_floors_counts_and_keeps_dur() {
        assert_eq!(
            Time::new(90, TimeUnit::Epoch).scaled(0.36),
            Time::new(32, TimeUnit::Epoch)
        );
        assert_eq!(
            Time::new(1000, TimeUnit::Batch).scaled(0.5),
            Time::new(500, TimeUnit::Batch)
        );
        assert_eq!(
            Time::new(3, TimeUnit::Batch).scaled(0.5),
            Time::new(1, TimeUnit::Batch)
        );
        assert_eq!(
            Time::new(10, TimeUnit::Sample).scaled(1.0),
            Time::new(10, TimeUnit::Sample)
        );
        assert_eq!(Time::dur(0.3).scaled(0.5), Time::dur(0.3));
        assert_eq!(
            Time::new(5, TimeUnit::Batch).scaled(-1.0),
            Time::new(0, TimeUnit::Batch)
        );
    }

    #[test]
    fn serde_reads_and_writes_strings() {
        let cfg: Cfg = match toml::from_str("max_duration = \"2ep\"") {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(cfg.max_duration, Time::new(2, TimeUnit::Epoch));
        let text = toml::to_string(&Cfg {
            max_duration: Time::dur(0.5),
        })
        .unwrap_or_default();
        assert_eq!(text.trim(), "max_duration = \"0.5dur\"");
        let json = serde_json::to_string(&Time::new(100, TimeUnit::Batch)).unwrap_or_default();
        assert_eq!(json, "\"100ba\"");
        let back: Result<Time, _> = serde_json::from_str(&json);
        assert_eq!(back.ok(), Some(Time::new(100, TimeUnit::Batch)));
    }

    #[test]
    fn serde_numbers_get_a_helpful_error() {
        for text in [
            "max_duration = 5",
            "max_duration = 0.5",
            "max_duration = -3",
        ] {
            let msg = toml::from_str::<Cfg>(text)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(
                msg.contains(
                    "durations are strings with a unit, e.g. \"2ep\", \"100ba\", \"0.5dur\""
                ),
                "{text}: {msg}"
            );
        }
        let msg = toml::from_str::<Cfg>("max_duration = \"1.5ep\"")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(msg.contains("\"1.5ep\""), "{msg}");
        let msg = toml::from_str::<Cfg>("max_duration = true")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(msg.contains("time string"), "{msg}");
    }
}
