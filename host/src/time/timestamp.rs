//! [`Timestamp`]: a snapshot of a run's progress counters.

use serde::{Deserialize, Serialize};

use super::{Time, TimeUnit};

/// A snapshot of training progress (Composer's `Timestamp`).
///
/// Counts are global across ranks (the trainer sums samples and tokens over ranks before
/// advancing). Timestamps are advanced by value: [`to_next_batch`](Timestamp::to_next_batch),
/// [`to_next_epoch`](Timestamp::to_next_epoch) and
/// [`to_next_iteration`](Timestamp::to_next_iteration) return a new timestamp. Serialized
/// field-by-field for checkpoints; missing fields read as zero.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Timestamp {
    /// Iterations completed.
    pub iteration: u64,
    /// Epochs completed.
    pub epoch: u64,
    /// Batches (optimizer steps) completed.
    pub batch: u64,
    /// Samples trained on.
    pub sample: u64,
    /// Tokens trained on.
    pub token: u64,
    /// Epochs completed in the current iteration.
    pub epoch_in_iteration: u64,
    /// Tokens trained on in the current iteration.
    pub token_in_iteration: u64,
    /// Batches completed in the current epoch.
    pub batch_in_epoch: u64,
    /// Samples trained on in the current epoch.
    pub sample_in_epoch: u64,
    /// Tokens trained on in the current epoch.
    pub token_in_epoch: u64,
    /// Wall-clock seconds spent training, in total (evaluation excluded).
    pub total_wall_seconds: f64,
    /// Wall-clock seconds spent training in the current epoch.
    pub epoch_wall_seconds: f64,
    /// Wall-clock seconds the last batch took.
    pub batch_wall_seconds: f64,
}

impl Timestamp {
    /// The timestamp after one more batch of `samples` samples and `tokens` tokens that took
    /// `wall_seconds`: `batch`/`batch_in_epoch` + 1; `sample`/`sample_in_epoch` + samples;
    /// `token`/`token_in_epoch`/`token_in_iteration` + tokens; total and epoch wall time +
    /// `wall_seconds`; `batch_wall_seconds` = `wall_seconds`.
    pub fn to_next_batch(&self, samples: u64, tokens: u64, wall_seconds: f64) -> Timestamp {
        Timestamp {
            batch: self.batch.saturating_add(1),
            batch_in_epoch: self.batch_in_epoch.saturating_add(1),
            sample: self.sample.saturating_add(samples),
            sample_in_epoch: self.sample_in_epoch.saturating_add(samples),
            token: self.token.saturating_add(tokens),
            token_in_epoch: self.token_in_epoch.saturating_add(tokens),
            token_in_iteration: self.token_in_iteration.saturating_add(tokens),
            total_wall_seconds: self.total_wall_seconds + wall_seconds,
            epoch_wall_seconds: self.epoch_wall_seconds + wall_seconds,
            batch_wall_seconds: wall_seconds,
            ..self.clone()
        }
    }

    /// The timestamp at the start of the next epoch: `epoch`/`epoch_in_iteration` + 1; the
    /// `*_in_epoch` counters and the epoch and batch wall times reset to 0.
    pub fn to_next_epoch(&self) -> Timestamp {
        Timestamp {
            epoch: self.epoch.saturating_add(1),
            epoch_in_iteration: self.epoch_in_iteration.saturating_add(1),
            batch_in_epoch: 0,
            sample_in_epoch: 0,
            token_in_epoch: 0,
            epoch_wall_seconds: 0.0,
            batch_wall_seconds: 0.0,
            ..self.clone()
        }
    }

    /// The timestamp at the start of the next iteration: `iteration` + 1; the `*_in_iteration`
    /// and `*_in_epoch` counters and the epoch and batch wall times reset to 0.
    pub fn to_next_iteration(&self) -> Timestamp {
        Timestamp {
            iteration: self.iteration.saturating_add(1),
            epoch_in_iteration: 0,
            token_in_iteration: 0,
            batch_in_epoch: 0,
            sample_in_epoch: 0,
            token_in_epoch: 0,
            epoch_wall_seconds: 0.0,
            batch_wall_seconds: 0.0,
            ..self.clone()
        }
    }

    /// The global counter for `unit`: iterations, epochs, batches, samples or tokens; whole
    /// seconds of total wall time (rounded down) for `sec`; `None` for `dur`, which needs
    /// `max_duration` (see [`RunLength::elapsed_fraction`](super::RunLength::elapsed_fraction)).
    pub fn get(&self, unit: TimeUnit) -> Option<u64> {
        match unit {
            TimeUnit::Iteration => Some(self.iteration),
            TimeUnit::Epoch => Some(self.epoch),
            TimeUnit::Batch => Some(self.batch),
            TimeUnit::Sample => Some(self.sample),
            TimeUnit::Token => Some(self.token),
            // Saturating float-to-int conversion; negative or NaN wall time reads as 0.
            TimeUnit::Second => Some(self.total_wall_seconds.floor() as u64),
            TimeUnit::Duration => None,
        }
    }

    /// Whether this timestamp has reached `t` (its counter in `t`'s unit is ≥ `t`'s count),
    /// Composer's `timestamp >= t`. Always `false` for `dur` times; resolve those with
    /// [`RunLength::reached`](super::RunLength::reached).
    pub fn reached(&self, t: &Time) -> bool {
        match (self.get(t.unit()), t.count()) {
            (Some(now), Some(target)) => now >= target,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_batch_accumulates() {
        let t = Timestamp::default()
            .to_next_batch(32, 100, 0.5)
            .to_next_batch(16, 50, 0.25);
        assert_eq!(t.batch, 2);
        assert_eq!(t.batch_in_epoch, 2);
        assert_eq!(t.sample, 48);
        assert_eq!(t.sample_in_epoch, 48);
        assert_eq!(t.token, 150);
        assert_eq!(t.token_in_epoch, 150);
        assert_eq!(t.token_in_iteration, 150);
        assert_eq!(t.total_wall_seconds, 0.75);
        assert_eq!(t.epoch_wall_seconds, 0.75);
        assert_eq!(t.batch_wall_seconds, 0.25);
        assert_eq!((t.epoch, t.iteration, t.epoch_in_iteration), (0, 0, 0));
    }

    #[test]
    fn next_epoch_resets_epoch_counters_only() {
        let t = Timestamp::default()
            .to_next_batch(32, 100, 1.0)
            .to_next_epoch();
        assert_eq!(t.epoch, 1);
        assert_eq!(t.epoch_in_iteration, 1);
        assert_eq!(
            (t.batch_in_epoch, t.sample_in_epoch, t.token_in_epoch),
            (0, 0, 0)
        );
        assert_eq!((t.batch, t.sample, t.token), (1, 32, 100));
        assert_eq!(t.token_in_iteration, 100);
        assert_eq!(t.total_wall_seconds, 1.0);
        assert_eq!((t.epoch_wall_seconds, t.batch_wall_seconds), (0.0, 0.0));
        let t = t.to_next_batch(8, 10, 2.0);
        assert_eq!((t.batch, t.batch_in_epoch, t.sample_in_epoch), (2, 1, 8));
    }

    #[test]
    fn next_iteration_resets_iteration_and_epoch_counters() {
        let t = Timestamp::default()
            .to_next_batch(32, 100, 1.0)
            .to_next_epoch()
            .to_next_batch(32, 100, 1.0)
            .to_next_iteration();
        assert_eq!(t.iteration, 1);
        assert_eq!((t.epoch_in_iteration, t.token_in_iteration), (0, 0));
        assert_eq!(
            (t.batch_in_epoch, t.sample_in_epoch, t.token_in_epoch),
            (0, 0, 0)
        );
        assert_eq!((t.epoch, t.batch, t.sample, t.token), (1, 2, 64, 200));
        assert_eq!(t.total_wall_seconds, 2.0);
    }

    #[test]
    fn get_and_reached() {
        let t = Timestamp {
            iteration: 1,
            epoch: 2,
            batch: 30,
            sample: 960,
            token: 5000,
            total_wall_seconds: 59.9,
            ..Timestamp::default()
        };
        assert_eq!(t.get(TimeUnit::Iteration), Some(1));
        assert_eq!(t.get(TimeUnit::Epoch), Some(2));
        assert_eq!(t.get(TimeUnit::Batch), Some(30));
        assert_eq!(t.get(TimeUnit::Sample), Some(960));
        assert_eq!(t.get(TimeUnit::Token), Some(5000));
        assert_eq!(t.get(TimeUnit::Second), Some(59));
        assert_eq!(t.get(TimeUnit::Duration), None);
        assert!(t.reached(&Time::new(30, TimeUnit::Batch)));
        assert!(!t.reached(&Time::new(31, TimeUnit::Batch)));
        assert!(t.reached(&Time::new(2, TimeUnit::Epoch)));
        assert!(!t.reached(&Time::new(60, TimeUnit::Second)));
        assert!(!t.reached(&Time::dur(0.0)));
    }

    #[test]
    fn serde_round_trip_and_missing_fields() {
        let t = Timestamp::default()
            .to_next_batch(3, 4, 0.125)
            .to_next_epoch();
        let json = serde_json::to_string(&t).unwrap_or_default();
        let back: Option<Timestamp> = serde_json::from_str(&json).ok();
        assert_eq!(back, Some(t));
        let partial: Option<Timestamp> = serde_json::from_str("{\"batch\": 7}").ok();
        assert_eq!(partial.map(|p| p.batch), Some(7));
    }
}
