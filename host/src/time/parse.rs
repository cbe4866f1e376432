//! The time-string grammar (Composer's `Time.from_timestring`), implemented once, in
//! `tessera_plugin_api::Time::parse` (methods' settings use it too); the host converts its result.
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

use super::{Time, TimeError};
use tessera_plugin_api as api;

/// Parses a time string; see the module documentation for the grammar.
pub(super) fn parse_time(input: &str) -> Result<Time, TimeError> {
    let parsed = api::Time::parse(input).map_err(|e| match e {
        api::TimeError::Empty => TimeError::Empty,
        api::TimeError::Invalid { input, reason } => TimeError::Invalid { input, reason },
        api::TimeError::NotInteger { input, unit } => TimeError::NotInteger { input, unit },
        api::TimeError::Negative { input } => TimeError::Negative { input },
    })?;
    let unit = parsed.unit();
    Ok(match parsed.count() {
        Some(count) => Time::new(count, unit),
        // Only `dur` times are fractions.
        None => Time::dur(parsed.fraction().unwrap_or_default()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::TimeUnit;

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
