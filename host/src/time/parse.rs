//! The time-string grammar (Composer's `Time.from_timestring`).
//!
//! Two forms are accepted, tried in this order:
//!
//! 1. Wall clock `XhYmZs`, any non-empty subset in that order (`1h20m40s`, `90m`, `45s`, `2h30s`),
//!    giving whole seconds (`sec`).
//! 2. A number followed by a unit suffix, case-insensitive: `iter`, `ep`, `ba`, `sp`, `tok`, `dur`,
//!    `sec`. The number is read like Python's `float()`: an optional `+`, digits with single
//!    underscores allowed between digits (`4_000`), an optional fraction and an optional exponent
//!    (`1e6`, `3_0e10`). Every unit except `dur` needs a whole value (`2.0ep` is fine, `1.5ep` is
//!    not). Negative values are rejected.
//!
//! Differences from Composer, all of which only reject inputs Composer silently misreads or accept
//! inputs it rejects for no useful reason: the empty string and bare numbers (`"5"`) are errors
//! (Composer's wall-clock fallback reads them as seconds: `""` → 0 sec, `"5"` → 50 sec); wall-clock
//! fields are not limited to a clock face (`90m` is 5400 sec, Composer rejects it); surrounding
//! whitespace is ignored; `inf`/`nan` are rejected; integers without a fraction or exponent are
//! read exactly rather than through a float.

use super::{Time, TimeError, TimeUnit};

/// Parses a time string; see the module documentation for the grammar.
pub(super) fn parse_time(input: &str) -> Result<Time, TimeError> {
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
        let digits = &s[start..pos];
        let value = digits
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

/// The number part, checked against Python's float grammar with underscores removed.
struct Number {
    cleaned: String,
    /// True when the number is a plain run of digits (no fraction, no exponent).
    integer: bool,
}

fn check_number_syntax(number: &str, input: &str) -> Result<Number, TimeError> {
    let bad = || {
        invalid(
            input,
            format!("{number:?} is not a number (write e.g. 2, 0.5, 1e6 or 4_000)"),
        )
    };
    let bytes = number.as_bytes();
    let mut cleaned = String::with_capacity(number.len());
    let mut integer = true;
    let mut seen_digit = false;
    let mut seen_dot = false;
    let mut seen_exp = false;
    let mut exp_digits = false;
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
                let after_exp = matches!(prev, Some(b'e' | b'E'));
                if !(at_start || after_exp) {
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
    Ok(Number { cleaned, integer })
}

fn parse_number(number: &str, unit: TimeUnit, input: &str) -> Result<Time, TimeError> {
    let Number { cleaned, integer } = check_number_syntax(number.trim(), input)?;
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
        match parse_time(s) {
            Ok(t) => t,
            Err(e) => panic!("{s:?} should parse: {e}"),
        }
    }

    fn err(s: &str) -> String {
        match parse_time(s) {
            Ok(t) => panic!("{s:?} should fail, got {t}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn composer_valid_table() {
        let cases: &[(&str, Time)] = &[
            ("2iter", Time::new(2, TimeUnit::Iteration)),
            ("3e10sp", Time::new(30_000_000_000, TimeUnit::Sample)),
            ("3_0e10sp", Time::new(300_000_000_000, TimeUnit::Sample)),
            ("4_00_0tok", Time::new(4000, TimeUnit::Token)),
            ("0.5dur", Time::dur(0.5)),
            ("1h20m40s", Time::new(4840, TimeUnit::Second)),
            ("2ep", Time::new(2, TimeUnit::Epoch)),
            ("100ba", Time::new(100, TimeUnit::Batch)),
            ("1e6tok", Time::new(1_000_000, TimeUnit::Token)),
            ("4_000sp", Time::new(4000, TimeUnit::Sample)),
            ("30sec", Time::new(30, TimeUnit::Second)),
            ("2.0ep", Time::new(2, TimeUnit::Epoch)),
            ("030.0sp", Time::new(30, TimeUnit::Sample)),
            ("3.000ba", Time::new(3, TimeUnit::Batch)),
        ];
        for (s, want) in cases {
            assert_eq!(ok(s), *want, "{s}");
        }
    }

    #[test]
    fn composer_invalid_table() {
        for s in [
            "1.5ep", "2.1ba", "0.1sec", "ep", "5", "5xyz", "-1ep", "", "   ",
        ] {
            let msg = err(s);
            assert!(!msg.is_empty());
        }
    }

    #[test]
    fn wall_clock_subsets() {
        assert_eq!(ok("1h"), Time::new(3600, TimeUnit::Second));
        assert_eq!(ok("20m"), Time::new(1200, TimeUnit::Second));
        assert_eq!(ok("40s"), Time::new(40, TimeUnit::Second));
        assert_eq!(ok("1h40s"), Time::new(3640, TimeUnit::Second));
        assert_eq!(ok("2m3s"), Time::new(123, TimeUnit::Second));
        assert_eq!(ok("90m"), Time::new(5400, TimeUnit::Second));
        // Out of order or repeated fields are not wall-clock times, nor unit times.
        for s in ["20m1h", "1h1h", "1ms", "h", "1h2"] {
            err(s);
        }
    }

    #[test]
    fn case_insensitive_units_and_whitespace() {
        assert_eq!(ok("2EP"), Time::new(2, TimeUnit::Epoch));
        assert_eq!(ok("100Ba"), Time::new(100, TimeUnit::Batch));
        assert_eq!(ok("0.25DUR"), Time::dur(0.25));
        assert_eq!(ok(" 7iter "), Time::new(7, TimeUnit::Iteration));
        assert_eq!(ok("+3ba"), Time::new(3, TimeUnit::Batch));
    }

    #[test]
    fn python_float_forms() {
        assert_eq!(ok(".5dur"), Time::dur(0.5));
        assert_eq!(ok("5.ep"), Time::new(5, TimeUnit::Epoch));
        assert_eq!(ok("1E3ba"), Time::new(1000, TimeUnit::Batch));
        assert_eq!(ok("1.5e3sp"), Time::new(1500, TimeUnit::Sample));
        assert_eq!(ok("25e-1dur"), Time::dur(2.5));
        assert_eq!(ok("1_0.2_5dur"), Time::dur(10.25));
        for s in [
            "_4ba", "4_ba", "4__0ba", "4_.0ba", "1e_5ba", "1eba", "e5ba", "1.2.3dur", "1e5e5tok",
            "infdur", "nandur", "1-2ba", ".ep", "1,000ba",
        ] {
            err(s);
        }
    }

    #[test]
    fn exact_large_integers_and_overflow() {
        assert_eq!(
            ok("18446744073709551615tok").count(),
            Some(u64::MAX),
            "integers are read exactly"
        );
        err("18446744073709551616tok");
        err("1e20tok");
        err("1e400dur");
    }

    #[test]
    fn error_messages_name_the_input_and_the_fix() {
        let msg = err("1.5ep");
        assert!(
            msg.contains("\"1.5ep\"") && msg.contains("whole number"),
            "{msg}"
        );
        let msg = err("5xyz");
        assert!(msg.contains("\"5xyz\"") && msg.contains("\"2ep\""), "{msg}");
        let msg = err("5");
        assert!(msg.contains("iter, ep, ba, sp, tok, dur, sec"), "{msg}");
        let msg = err("ep");
        assert!(msg.contains("number before the unit is missing"), "{msg}");
        let msg = err("-1ep");
        assert!(
            msg.contains("\"-1ep\"") && msg.contains("negative"),
            "{msg}"
        );
        let msg = err("");
        assert!(msg.contains("empty"), "{msg}");
    }

    #[test]
    fn negative_values_are_rejected_in_every_form() {
        for s in ["-1ep", "-0.5dur", "-0ba", "1e-1dur"] {
            let r = parse_time(s);
            if s == "1e-1dur" {
                assert_eq!(r.ok(), Some(Time::dur(0.1)));
            } else {
                assert!(matches!(r, Err(TimeError::Negative { .. })), "{s}");
            }
        }
    }
}
