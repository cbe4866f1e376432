//! Time strings (plugin-api 1.2): `"100ba"`, `"2ep"`, `"1000sp"`, `"1e6tok"`, `"0.5dur"`,
//! `"30sec"`, `"1h20m40s"`, read exactly as the `tessera` host reads `max_duration` and the other
//! times of `trainer.toml` (Composer's `Time.from_timestring`), so a method's settings take the
//! same strings as the rest of the config.
//!
//! ```
//! use tessera_plugin_api::{Time, TimeInfo, TimeUnit};
//!
//! let start = Time::parse("100ba")?;
//! assert_eq!((start.count(), start.unit()), (Some(100), TimeUnit::Batch));
//! assert_eq!(Time::parse("0.5dur")?.fraction(), Some(0.5));
//! let now = TimeInfo { batch: 120, ..TimeInfo::default() };
//! assert_eq!(start.reached(&now), Some(true));
//! # Ok::<(), tessera_plugin_api::TimeError>(())
//! ```
//!
//! # Grammar
//! Two forms are accepted, tried in this order:
//!
//! 1. Wall clock `XhYmZs`, any non-empty subset in that order (`1h20m40s`, `90m`, `45s`,
//!    `2h30s`), giving whole seconds (`sec`).
//! 2. A number followed by a unit suffix, case-insensitive: `iter`, `ep`, `ba`, `sp`, `tok`,
//!    `dur`, `sec`. The number is read like Python's `float()`: an optional `+`, digits with
//!    single underscores allowed between digits (`4_000`), an optional fraction and an optional
//!    exponent (`1e6`, `3_0e10`). Every unit except `dur` needs a whole value (`2.0ep` is fine,
//!    `1.5ep` is not). Negative values are rejected.
//!
//! The empty string and bare numbers (`"5"`) are errors, surrounding whitespace is ignored,
//! `inf`/`nan` are rejected, and integers without a fraction or exponent are read exactly rather
//! than through a float.

use std::fmt;
use std::str::FromStr;

use crate::{Error, ErrorKind, TimeInfo};

/// What a user should write, appended to every parse error.
const TIME_HELP: &str = "write a number followed by a unit (iter, ep, ba, sp, tok, dur, sec), \
     e.g. \"2ep\", \"100ba\", \"1e6tok\", \"0.5dur\", \"30sec\", or a wall-clock time such as \
     \"1h20m40s\"";

/// A unit of training time, written as a short suffix in time strings (`"2ep"`, `"100ba"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TimeUnit {
    /// Iterations (`iter`): a group of epochs; one per run unless configured otherwise.
    Iteration,
    /// Epochs (`ep`): full passes over the training set.
    Epoch,
    /// Batches (`ba`): optimizer steps.
    Batch,
    /// Samples (`sp`): training examples seen.
    Sample,
    /// Tokens (`tok`): tokens seen.
    Token,
    /// Duration (`dur`): a fraction of the run's length (`0.5dur` is half-way through training).
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

    /// A plural name for messages (`"epochs"`, `"batches"`, ...).
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

/// Why a time string was refused. [`Error`] takes it as an invalid-settings error.
#[derive(Debug, Clone, PartialEq)]
pub enum TimeError {
    /// The time string was empty.
    Empty,
    /// The time string does not follow the grammar.
    Invalid {
        /// The string as given.
        input: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A unit that counts things was given a fractional value.
    NotInteger {
        /// The string as given.
        input: String,
        /// The unit that needs a whole number.
        unit: TimeUnit,
    },
    /// The value was negative.
    Negative {
        /// The string as given.
        input: String,
    },
}

impl fmt::Display for TimeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TimeError::Empty => write!(f, "empty time string: {TIME_HELP}"),
            TimeError::Invalid { input, reason } => {
                write!(f, "invalid time {input:?}: {reason}; {TIME_HELP}")
            }
            TimeError::NotInteger { input, unit } => write!(
                f,
                "invalid time {input:?}: {} must be a whole number (e.g. \"2{unit}\"); only dur \
                 takes fractions, e.g. \"0.5dur\"",
                unit.name()
            ),
            TimeError::Negative { input } => {
                write!(
                    f,
                    "invalid time {input:?}: times cannot be negative; {TIME_HELP}"
                )
            }
        }
    }
}

impl std::error::Error for TimeError {}

impl From<TimeError> for Error {
    fn from(e: TimeError) -> Error {
        Error::new(ErrorKind::CONFIG, e.to_string())
    }
}

/// The numeric part of a [`Time`]: whole counts for every unit except `dur`.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Value {
    Count(u64),
    Fraction(f64),
}

/// An amount of training time: a whole count of a [`TimeUnit`], or a fraction of the run for
/// [`TimeUnit::Duration`]. Displayed as a time string (`"2ep"`, `"0.5dur"`).
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

    /// A fraction of the run (`Time::dur(0.5)` is `0.5dur`).
    pub fn dur(fraction: f64) -> Time {
        Time {
            unit: TimeUnit::Duration,
            value: Value::Fraction(fraction),
        }
    }

    /// Parses a time string; see the [module documentation](self) for the grammar. Errors
    /// name the input and say what is valid.
    pub fn parse(input: &str) -> Result<Time, TimeError> {
        let s = input.trim();
        if s.is_empty() {
            return Err(TimeError::Empty);
        }
        if let Some(seconds) = parse_wall_clock(s, input)? {
            return Ok(Time::new(seconds, TimeUnit::Second));
        }
        let Some((number, unit)) = split_unit(s) else {
            let reason = if TimeUnit::from_suffix(s).is_some() {
                "the number before the unit is missing"
            } else {
                "it does not end in a known unit"
            };
            return Err(invalid(input, reason));
        };
        parse_number(number, unit, input)
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

    /// The fraction of the run for a `dur` time, `None` for every other unit.
    pub fn fraction(&self) -> Option<f64> {
        match self.value {
            Value::Count(_) => None,
            Value::Fraction(f) => Some(f),
        }
    }

    /// Whether the clock `now` has reached this time (as Composer compares a `Time` with the
    /// state's timestamp): the completed epochs, batches, samples or tokens against a count, the
    /// elapsed fraction against a `dur`. `None` for `iter` and `sec`, which [`TimeInfo`] does
    /// not count.
    pub fn reached(&self, now: &TimeInfo) -> Option<bool> {
        let done = match self.unit {
            TimeUnit::Epoch => now.epoch,
            TimeUnit::Batch => now.batch,
            TimeUnit::Sample => now.sample,
            TimeUnit::Token => now.token,
            TimeUnit::Duration => return self.fraction().map(|f| now.elapsed_fraction >= f),
            TimeUnit::Iteration | TimeUnit::Second => return None,
        };
        self.count().map(|n| done >= n)
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

fn invalid(input: &str, reason: impl Into<String>) -> TimeError {
    TimeError::Invalid {
        input: input.to_string(),
        reason: reason.into(),
    }
}

/// Reads `XhYmZs`. `Ok(None)` means "not this form", so the caller tries the unit form.
fn parse_wall_clock(s: &str, input: &str) -> Result<Option<u64>, TimeError> {
    const PARTS: [(u8, u64); 3] = [(b'h', 3600), (b'm', 60), (b's', 1)];
    let bytes = s.as_bytes();
    let mut pos = 0;
    let mut next_part = 0;
    let mut total: u64 = 0;
    while pos < bytes.len() {
        let start = pos;
        while pos < bytes.len() && bytes[pos].is_ascii_digit() {
            pos += 1;
        }
        if pos == start || pos == bytes.len() {
            return Ok(None);
        }
        let letter = bytes[pos].to_ascii_lowercase();
        let Some(offset) = PARTS[next_part..].iter().position(|(c, _)| *c == letter) else {
            return Ok(None);
        };
        let (_, factor) = PARTS[next_part + offset];
        next_part += offset + 1;
        let value = s[start..pos]
            .parse::<u64>()
            .ok()
            .and_then(|v| v.checked_mul(factor))
            .and_then(|v| v.checked_add(total));
        total = match value {
            Some(v) => v,
            None => return Err(invalid(input, "the wall-clock time is too large")),
        };
        pos += 1;
    }
    Ok(Some(total))
}

/// Splits `"<number><unit>"`; `None` if no unit suffix follows a non-empty number part.
fn split_unit(s: &str) -> Option<(&str, TimeUnit)> {
    TimeUnit::ALL.into_iter().find_map(|unit| {
        let suffix = unit.suffix();
        let cut = s.len().checked_sub(suffix.len())?;
        if cut == 0 || !s.is_char_boundary(cut) {
            return None;
        }
        let (number, tail) = s.split_at(cut);
        tail.eq_ignore_ascii_case(suffix).then_some((number, unit))
    })
}

/// The number part, checked against Python's float grammar, with underscores removed; and
/// whether it is a plain run of digits (no fraction, no exponent).
fn check_number_syntax(number: &str, input: &str) -> Result<(String, bool), TimeError> {
    let bad = || {
        invalid(
            input,
            format!("{number:?} is not a number (write e.g. 2, 0.5, 1e6 or 4_000)"),
        )
    };
    let bytes = number.as_bytes();
    let mut cleaned = String::with_capacity(number.len());
    let mut integer = true;
    let (mut seen_digit, mut seen_dot, mut seen_exp, mut exp_digits) = (false, false, false, false);
    for (i, &b) in bytes.iter().enumerate() {
        let prev = i.checked_sub(1).map(|j| bytes[j]);
        match b {
            b'0'..=b'9' => {
                if seen_exp {
                    exp_digits = true;
                } else {
                    seen_digit = true;
                }
                cleaned.push(char::from(b));
            }
            b'_' => {
                let next = bytes.get(i + 1);
                let between_digits = prev.is_some_and(|p| p.is_ascii_digit())
                    && next.is_some_and(|n| n.is_ascii_digit());
                if !between_digits {
                    return Err(bad());
                }
            }
            b'+' | b'-' => {
                let at_start = i == 0;
                if !(at_start || matches!(prev, Some(b'e' | b'E'))) {
                    return Err(bad());
                }
                if b == b'-' && at_start {
                    return Err(TimeError::Negative {
                        input: input.to_string(),
                    });
                }
                cleaned.push(char::from(b));
            }
            b'.' => {
                if seen_dot || seen_exp {
                    return Err(bad());
                }
                seen_dot = true;
                integer = false;
                cleaned.push('.');
            }
            b'e' | b'E' => {
                if seen_exp || !seen_digit {
                    return Err(bad());
                }
                seen_exp = true;
                integer = false;
                cleaned.push('e');
            }
            _ => return Err(bad()),
        }
    }
    if !seen_digit || (seen_exp && !exp_digits) {
        return Err(bad());
    }
    Ok((cleaned, integer))
}

fn parse_number(number: &str, unit: TimeUnit, input: &str) -> Result<Time, TimeError> {
    let (cleaned, integer) = check_number_syntax(number.trim(), input)?;
    let too_large = || invalid(input, "the value is too large");
    if integer && unit.is_count() {
        let digits = cleaned.strip_prefix('+').unwrap_or(&cleaned);
        let count = digits.parse::<u64>().map_err(|_| too_large())?;
        return Ok(Time::new(count, unit));
    }
    let value: f64 = cleaned
        .parse()
        .map_err(|_| invalid(input, format!("{number:?} is not a number")))?;
    if !value.is_finite() {
        return Err(too_large());
    }
    if value < 0.0 {
        return Err(TimeError::Negative {
            input: input.to_string(),
        });
    }
    if !unit.is_count() {
        return Ok(Time::dur(value));
    }
    if value.fract() != 0.0 {
        return Err(TimeError::NotInteger {
            input: input.to_string(),
            unit,
        });
    }
    // 2^64 is exactly representable; anything at or above it does not fit.
    if value >= 18_446_744_073_709_551_616.0 {
        return Err(too_large());
    }
    // Truncation is exact here: `value` is a whole number below 2^64.
    Ok(Time::new(value as u64, unit))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(s: &str) -> Time {
        Time::parse(s).unwrap_or_else(|e| panic!("{s:?} should parse: {e}"))
    }

    fn err(s: &str) -> TimeError {
        match Time::parse(s) {
            Ok(t) => panic!("{s:?} should fail, got {t}"),
            Err(e) => e,
        }
    }

    #[test]
    fn units_numbers_and_wall_clock() {
        let cases: &[(&str, Time)] = &[
            ("2iter", Time::new(2, TimeUnit::Iteration)),
            ("3e10sp", Time::new(30_000_000_000, TimeUnit::Sample)),
            ("4_00_0tok", Time::new(4000, TimeUnit::Token)),
            ("0.5dur", Time::dur(0.5)),
            (".25DUR", Time::dur(0.25)),
            ("25e-1dur", Time::dur(2.5)),
            ("1h20m40s", Time::new(4840, TimeUnit::Second)),
            ("90m", Time::new(5400, TimeUnit::Second)),
            (" 2EP ", Time::new(2, TimeUnit::Epoch)),
            ("+100ba", Time::new(100, TimeUnit::Batch)),
            ("2.0ep", Time::new(2, TimeUnit::Epoch)),
            ("1.5e3sp", Time::new(1500, TimeUnit::Sample)),
            ("30sec", Time::new(30, TimeUnit::Second)),
            (
                "18446744073709551615tok",
                Time::new(u64::MAX, TimeUnit::Token),
            ),
        ];
        for (s, want) in cases {
            assert_eq!(ok(s), *want, "{s}");
        }
    }

    #[test]
    fn refusals_name_the_input_and_the_fix() {
        for s in [
            "",
            "5",
            "ep",
            "5xyz",
            "_4ba",
            "4__0ba",
            "1eba",
            "1.2.3dur",
            "infdur",
            "1,000ba",
            "20m1h",
            "1h2",
            "18446744073709551616tok",
            "1e400dur",
        ] {
            let e = err(s);
            assert!(!matches!(e, TimeError::Negative { .. }), "{s}: {e}");
        }
        assert_eq!(err(""), TimeError::Empty);
        assert!(matches!(err("-1ep"), TimeError::Negative { .. }));
        assert!(matches!(err("-0.5dur"), TimeError::Negative { .. }));
        let e = err("1.5ep");
        assert_eq!(
            e,
            TimeError::NotInteger {
                input: "1.5ep".into(),
                unit: TimeUnit::Epoch
            }
        );
        assert!(e.to_string().contains("whole number"), "{e}");
        let e = err("5xyz").to_string();
        assert!(e.contains("\"5xyz\"") && e.contains("\"2ep\""), "{e}");
        let e = Error::from(err("ep"));
        assert_eq!(e.kind(), ErrorKind::CONFIG);
        assert!(
            e.message().contains("number before the unit is missing"),
            "{e}"
        );
    }

    #[test]
    fn display_round_trips() {
        for s in [
            "2ep", "100ba", "1000sp", "7tok", "3iter", "0.5dur", "1.0dur", "30sec",
        ] {
            assert_eq!(ok(s).to_string(), s);
            assert_eq!(ok(&ok(s).to_string()), ok(s));
        }
    }

    #[test]
    fn reached_compares_with_the_matching_counter() {
        let now = TimeInfo {
            epoch: 2,
            batch: 50,
            sample: 3200,
            token: 9,
            elapsed_fraction: 0.25,
            ..TimeInfo::default()
        };
        let cases = [
            ("2ep", Some(true)),
            ("3ep", Some(false)),
            ("50ba", Some(true)),
            ("51ba", Some(false)),
            ("3200sp", Some(true)),
            ("3201sp", Some(false)),
            ("10tok", Some(false)),
            ("0.25dur", Some(true)),
            ("0.3dur", Some(false)),
            ("1iter", None),
            ("1sec", None),
        ];
        for (s, want) in cases {
            assert_eq!(ok(s).reached(&now), want, "{s}");
        }
    }
}
