//! [`RunLength`]: `max_duration` and the facts needed to convert between time units.

use serde::{Deserialize, Serialize};

use super::{Time, TimeError, TimeUnit, Timestamp};

/// How long a run is, plus the dataloader facts that relate its units.
///
/// `max_duration` is the *effective* length: when a scale-schedule ratio is used, build the
/// run with [`RunLength::scaled`] first (Composer scales `state.max_duration` once, in the
/// trainer). `batches_per_epoch` is Composer's `dataloader_len`; `0` means unknown (an
/// unsized loader). `samples_per_batch` is the global batch size; `0` means unknown.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunLength {
    /// Total training length, in any unit except `dur` and `sec`.
    pub max_duration: Time,
    /// Batches in one epoch (`0` if unknown).
    pub batches_per_epoch: u64,
    /// Samples in one batch, summed over ranks (`0` if unknown).
    pub samples_per_batch: u64,
}

impl RunLength {
    /// Builds a checked run length; see [`RunLength::validate`] for the rules.
    pub fn new(
        max_duration: Time,
        batches_per_epoch: u64,
        samples_per_batch: u64,
    ) -> Result<RunLength, TimeError> {
        let run = RunLength {
            max_duration,
            batches_per_epoch,
            samples_per_batch,
        };
        run.validate()?;
        Ok(run)
    }

    /// Checks that `max_duration` is a positive count in `iter`, `ep`, `ba`, `sp` or `tok`
    /// (not `dur`, which would be circular, nor `sec`), and that an epoch-based run knows its
    /// number of batches per epoch.
    pub fn validate(&self) -> Result<(), TimeError> {
        let fail = |reason: &str| {
            Err(TimeError::InvalidMaxDuration {
                max_duration: self.max_duration.to_string(),
                reason: reason.to_string(),
            })
        };
        match self.max_duration.unit() {
            TimeUnit::Duration => {
                return fail(
                    "max_duration cannot be in dur (a fraction of max_duration); use ep, ba, sp, \
                     tok or iter, e.g. \"2ep\" or \"1000ba\"",
                )
            }
            TimeUnit::Second => {
                return fail(
                    "max_duration cannot be wall-clock time (sec); use ep, ba, sp, tok or iter, \
                     e.g. \"2ep\" or \"1000ba\"",
                )
            }
            _ => {}
        }
        if self.max_duration.count() == Some(0) {
            return fail("max_duration must be greater than zero");
        }
        if self.max_duration.unit() == TimeUnit::Epoch && self.batches_per_epoch == 0 {
            return fail(
                "an epoch-based max_duration needs a dataloader of known length; give \
                 max_duration in ba, sp or tok instead",
            );
        }
        Ok(())
    }

    /// This run with `max_duration` scaled by a scale-schedule ratio (Composer's
    /// `_scale_max_duration_by_ssr`): `floor(max_duration × ssr)` in the same unit. Errors if
    /// the ratio is not a positive finite number or the scaled duration is zero.
    pub fn scaled(&self, ssr: f64) -> Result<RunLength, TimeError> {
        if !(ssr.is_finite() && ssr > 0.0) {
            return Err(TimeError::InvalidMaxDuration {
                max_duration: self.max_duration.to_string(),
                reason: format!("scale_schedule_ratio must be a positive number, got {ssr}"),
            });
        }
        let max_duration = self.max_duration.scaled(ssr);
        if max_duration.count() == Some(0) {
            return Err(TimeError::InvalidMaxDuration {
                max_duration: self.max_duration.to_string(),
                reason: format!(
                    "scale_schedule_ratio {ssr} reduces it to zero; use a larger ratio or a \
                     longer max_duration"
                ),
            });
        }
        let run = RunLength {
            max_duration,
            ..self.clone()
        };
        run.validate()?;
        Ok(run)
    }

    /// The total number of batches, when it can be known: `ep × batches_per_epoch`, `ba`, or
    /// `ceil(sp / samples_per_batch)`. `None` for `iter`/`tok` runs or when the needed
    /// dataloader fact is unknown.
    pub fn max_batches(&self) -> Option<u64> {
        let count = self.max_duration.count()?;
        match self.max_duration.unit() {
            TimeUnit::Batch => Some(count),
            TimeUnit::Epoch => nonzero(self.batches_per_epoch).and_then(|b| count.checked_mul(b)),
            TimeUnit::Sample => nonzero(self.samples_per_batch).map(|s| count.div_ceil(s)),
            _ => None,
        }
    }

    /// Progress through the run in `[0, 1]`: the timestamp's counter in `max_duration`'s unit
    /// divided by `max_duration` (Composer's `get_elapsed_duration`), clamped.
    pub fn elapsed_fraction(&self, now: &Timestamp) -> f64 {
        let (Some(done), Some(total)) =
            (now.get(self.max_duration.unit()), self.max_duration.count())
        else {
            return 0.0;
        };
        if total == 0 {
            return 1.0;
        }
        (done as f64 / total as f64).clamp(0.0, 1.0)
    }

    /// Converts `time` into a whole count of `unit`, when that is well defined:
    ///
    /// * `dur` first becomes `floor(fraction × max_duration)` in `max_duration`'s unit, except
    ///   that an epoch-based `max_duration` gives `floor(fraction × batches_per_epoch ×
    ///   max_duration)` batches (Composer's `_convert_time`) unless epochs are asked for;
    /// * same unit: the count itself;
    /// * `ep` → `ba`: × `batches_per_epoch`; `ep` → `sp`: × batches × samples per batch;
    /// * `ba` → `sp`: × `samples_per_batch`; `sp` → `ba`: ÷ `samples_per_batch`, rounded up.
    ///
    /// `None` for any other pair (including any conversion into `dur`), when a needed
    /// dataloader fact is unknown (0), or on overflow. No scale-schedule ratio is applied.
    pub fn to_unit(&self, time: &Time, unit: TimeUnit) -> Option<u64> {
        let (count, from) = match time.fraction() {
            None => (time.count()?, time.unit()),
            Some(fraction) => {
                let max = self.max_duration.count()? as f64;
                let max_unit = self.max_duration.unit();
                if max_unit == TimeUnit::Epoch && unit != TimeUnit::Epoch {
                    let bpe = nonzero(self.batches_per_epoch)? as f64;
                    (floor_u64(fraction * bpe * max), TimeUnit::Batch)
                } else {
                    (floor_u64(fraction * max), max_unit)
                }
            }
        };
        let bpe = nonzero(self.batches_per_epoch);
        let spb = nonzero(self.samples_per_batch);
        match (from, unit) {
            (a, b) if a == b && a.is_count() => Some(count),
            (TimeUnit::Epoch, TimeUnit::Batch) => count.checked_mul(bpe?),
            (TimeUnit::Epoch, TimeUnit::Sample) => count.checked_mul(bpe?)?.checked_mul(spb?),
            (TimeUnit::Batch, TimeUnit::Sample) => count.checked_mul(spb?),
            (TimeUnit::Sample, TimeUnit::Batch) => Some(count.div_ceil(spb?)),
            _ => None,
        }
    }

    /// Resolves a schedule time to a whole count exactly as Composer's `_convert_time`:
    ///
    /// * `dur`: `floor(fraction × max_duration)` in `max_duration`'s unit, or
    ///   `floor(fraction × batches_per_epoch × max_duration)` batches when `max_duration` is in
    ///   epochs. `ssr` is **not** applied (the fraction is of the already-scaled
    ///   `max_duration`).
    /// * `ep`: converted to batches (`× batches_per_epoch`), then `floor(× ssr)`.
    /// * `iter`, `ba`, `sp`, `tok`: `floor(count × ssr)`.
    /// * `sec`: an error (wall-clock time is not a schedule unit).
    ///
    /// Errors also when epochs are involved and `batches_per_epoch` is unknown. Pass
    /// `ssr = 1.0` for times that must not be scaled (warmups).
    pub fn resolve(&self, time: &Time, ssr: f64) -> Result<Time, TimeError> {
        let fail = |reason: String| {
            Err(TimeError::Conversion {
                time: time.to_string(),
                reason,
            })
        };
        let unknown_epoch_length = || {
            "the number of batches per epoch is unknown (unsized dataloader); give the time in \
             ba, sp or tok instead"
                .to_string()
        };
        match time.unit() {
            TimeUnit::Second => {
                fail("wall-clock time (sec) is not allowed here; use ba, ep, sp, tok or dur".into())
            }
            TimeUnit::Duration => {
                let fraction = time.value_f64();
                let max_unit = self.max_duration.unit();
                let Some(max) = self.max_duration.count() else {
                    return fail(format!(
                        "max_duration {} is itself in dur",
                        self.max_duration
                    ));
                };
                if max_unit == TimeUnit::Epoch {
                    let Some(bpe) = nonzero(self.batches_per_epoch) else {
                        return fail(unknown_epoch_length());
                    };
                    let batches = floor_u64(fraction * bpe as f64 * max as f64);
                    Ok(Time::new(batches, TimeUnit::Batch))
                } else {
                    Ok(Time::new(floor_u64(fraction * max as f64), max_unit))
                }
            }
            TimeUnit::Epoch => {
                let Some(bpe) = nonzero(self.batches_per_epoch) else {
                    return fail(unknown_epoch_length());
                };
                let count = time.count().unwrap_or(0);
                let Some(batches) = count.checked_mul(bpe) else {
                    return fail("it is too large".into());
                };
                Ok(Time::new(batches, TimeUnit::Batch).scaled(ssr))
            }
            _ => Ok(time.scaled(ssr)),
        }
    }

    /// Whether `now` has reached `time`. `dur` times are resolved as in
    /// [`RunLength::resolve`] (a fraction of `max_duration`, in batches when `max_duration` is
    /// in epochs); other units are compared directly. `false` if the time cannot be resolved.
    pub fn reached(&self, now: &Timestamp, time: &Time) -> bool {
        if !time.is_dur() {
            return now.reached(time);
        }
        self.resolve(time, 1.0)
            .is_ok_and(|target| now.reached(&target))
    }
}

fn nonzero(x: u64) -> Option<u64> {
    (x != 0).then_some(x)
}

/// `floor(x)` as a count; saturating, with NaN and negatives giving 0 (Composer's `int()` on
/// the non-negative products used here).
fn floor_u64(x: f64) -> u64 {
    x.floor() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Time {
        match Time::parse(s) {
            Ok(t) => t,
            Err(e) => panic!("{e}"),
        }
    }

    fn run(max: &str, bpe: u64, spb: u64) -> RunLength {
        match RunLength::new(t(max), bpe, spb) {
            Ok(r) => r,
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn new_rejects_dur_sec_zero_and_unsized_epochs() {
        for (max, bpe) in [("0.5dur", 10), ("30sec", 10), ("0ba", 10), ("2ep", 0)] {
            let r = RunLength::new(t(max), bpe, 32);
            assert!(
                matches!(r, Err(TimeError::InvalidMaxDuration { .. })),
                "{max}"
            );
        }
        let msg = RunLength::new(t("1dur"), 10, 32)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(msg.contains("1.0dur") && msg.contains("\"2ep\""), "{msg}");
        for max in ["2ep", "100ba", "1000sp", "1e6tok", "1iter"] {
            assert!(RunLength::new(t(max), 10, 32).is_ok(), "{max}");
        }
    }

    #[test]
    fn scaled_floors_and_rejects_zero() {
        let r = run("90ep", 100, 32);
        assert_eq!(r.scaled(0.36).map(|r| r.max_duration), Ok(t("32ep")));
        assert_eq!(r.scaled(1.0).map(|r| r.max_duration), Ok(t("90ep")));
        assert!(run("1ep", 100, 32).scaled(0.5).is_err());
        assert!(r.scaled(0.0).is_err());
        assert!(r.scaled(f64::NAN).is_err());
    }

    #[test]
    fn max_batches() {
        assert_eq!(run("3ep", 100, 32).max_batches(), Some(300));
        assert_eq!(run("250ba", 100, 32).max_batches(), Some(250));
        assert_eq!(run("1000sp", 100, 32).max_batches(), Some(32));
        assert_eq!(run("1024sp", 100, 32).max_batches(), Some(32));
        assert_eq!(run("1000sp", 100, 0).max_batches(), None);
        assert_eq!(run("1e6tok", 100, 32).max_batches(), None);
        assert_eq!(run("2iter", 100, 32).max_batches(), None);
    }

    #[test]
    fn elapsed_fraction_uses_max_duration_unit_and_clamps() {
        let r = run("4ep", 100, 32);
        let mut now = Timestamp {
            epoch: 1,
            batch: 150,
            ..Timestamp::default()
        };
        assert_eq!(r.elapsed_fraction(&now), 0.25);
        now.epoch = 9;
        assert_eq!(r.elapsed_fraction(&now), 1.0);
        let r = run("200ba", 100, 32);
        now.batch = 50;
        assert_eq!(r.elapsed_fraction(&now), 0.25);
        assert_eq!(r.elapsed_fraction(&Timestamp::default()), 0.0);
    }

    #[test]
    fn to_unit_conversions() {
        let r = run("4ep", 100, 32);
        assert_eq!(r.to_unit(&t("0.5dur"), TimeUnit::Batch), Some(200));
        assert_eq!(r.to_unit(&t("0.5dur"), TimeUnit::Epoch), Some(2));
        assert_eq!(r.to_unit(&t("0.3dur"), TimeUnit::Epoch), Some(1));
        assert_eq!(r.to_unit(&t("0.3dur"), TimeUnit::Batch), Some(120));
        assert_eq!(r.to_unit(&t("2ep"), TimeUnit::Batch), Some(200));
        assert_eq!(r.to_unit(&t("2ep"), TimeUnit::Sample), Some(6400));
        assert_eq!(r.to_unit(&t("3ba"), TimeUnit::Sample), Some(96));
        assert_eq!(r.to_unit(&t("33sp"), TimeUnit::Batch), Some(2));
        assert_eq!(r.to_unit(&t("7ba"), TimeUnit::Batch), Some(7));
        assert_eq!(r.to_unit(&t("7ba"), TimeUnit::Epoch), None);
        assert_eq!(r.to_unit(&t("7ba"), TimeUnit::Duration), None);
        assert_eq!(r.to_unit(&t("7tok"), TimeUnit::Batch), None);
        let r = run("1000ba", 0, 0);
        assert_eq!(r.to_unit(&t("0.25dur"), TimeUnit::Batch), Some(250));
        assert_eq!(r.to_unit(&t("1ep"), TimeUnit::Batch), None);
        assert_eq!(r.to_unit(&t("1ba"), TimeUnit::Sample), None);
    }

    #[test]
    fn resolve_matches_composer_convert_time() {
        let r = run("4ep", 100, 32);
        // dur: fraction of max_duration, epochs become batches, no SSR.
        assert_eq!(r.resolve(&t("0.5dur"), 0.5), Ok(t("200ba")));
        assert_eq!(r.resolve(&t("1dur"), 2.0), Ok(t("400ba")));
        // ep: to batches, then SSR, floored.
        assert_eq!(r.resolve(&t("3ep"), 1.0), Ok(t("300ba")));
        assert_eq!(r.resolve(&t("3ep"), 0.333), Ok(t("99ba")));
        // other units: SSR, floored.
        assert_eq!(r.resolve(&t("10ba"), 0.25), Ok(t("2ba")));
        assert_eq!(r.resolve(&t("1000sp"), 1.5), Ok(t("1500sp")));
        assert_eq!(r.resolve(&t("5iter"), 1.0), Ok(t("5iter")));
        // sec is refused; unknown epoch length too.
        assert!(matches!(
            r.resolve(&t("30sec"), 1.0),
            Err(TimeError::Conversion { .. })
        ));
        let r = run("1000sp", 0, 32);
        assert_eq!(r.resolve(&t("0.1dur"), 1.0), Ok(t("100sp")));
        assert!(r.resolve(&t("1ep"), 1.0).is_err());
    }

    #[test]
    fn reached_with_dur() {
        let r = run("2ep", 10, 4);
        let now = Timestamp {
            epoch: 1,
            batch: 10,
            ..Timestamp::default()
        };
        assert!(r.reached(&now, &t("0.5dur")));
        assert!(!r.reached(&now, &t("0.55dur")));
        assert!(r.reached(&now, &t("10ba")));
        assert!(r.reached(&now, &t("1ep")));
        assert!(!r.reached(&now, &t("2ep")));
    }
}
