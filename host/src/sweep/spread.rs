//! The sweep's runs over their seeds: for the runs that differ only in `seed`, the mean and
//! the spread (smallest to largest) of their final result and wall time, so that a difference
//! between two recipes can be read against the noise of one.

use super::RunOutcome;
use crate::report::RunRecord;

/// The name of the sweep axis that varies the seed.
pub const SEED_AXIS: &str = "seed";

/// Mean, smallest and largest of some numbers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    /// The mean.
    pub mean: f64,
    /// The smallest.
    pub min: f64,
    /// The largest.
    pub max: f64,
}

impl Spread {
    /// The spread of `values`; `None` when there are none.
    pub fn of(values: &[f64]) -> Option<Spread> {
        if values.is_empty() {
            return None;
        }
        let mean = values.iter().sum::<f64>() / values.len() as f64;
        let min = values.iter().copied().fold(f64::INFINITY, f64::min);
        let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        Some(Spread { mean, min, max })
    }

    /// Half the range: the ± printed after the mean.
    pub fn half_range(&self) -> f64 {
        (self.max - self.min) / 2.0
    }
}

/// The finished runs of one point of the sweep (its axes but the seed) over their seeds.
#[derive(Debug, Clone, PartialEq)]
pub struct SeedGroup {
    /// The point: the other axes' values joined by `-` (`mild`, `baseline-ssr0.5`).
    pub label: String,
    /// Finished runs (seeds) behind the numbers.
    pub seeds: usize,
    /// The final result: accuracy, or perplexity for language models (`"acc"`, `"ppl"`).
    pub quality: Option<(&'static str, Spread)>,
    /// Wall seconds.
    pub wall: Spread,
}

/// The finished runs grouped over `seed`, in plan order of each group's first run; empty
/// when the sweep has no `seed` axis. `runs`: each run's axes (key, value) and outcome.
pub fn seed_groups<'a>(
    runs: impl IntoIterator<Item = (&'a [(String, String)], &'a RunOutcome)> + Clone,
) -> Vec<SeedGroup> {
    let has_seeds = runs
        .clone()
        .into_iter()
        .any(|(axes, _)| axes.iter().any(|(key, _)| key == SEED_AXIS));
    if !has_seeds {
        return Vec::new();
    }
    let mut groups: Vec<(String, Vec<&RunRecord>)> = Vec::new();
    for (axes, outcome) in runs {
        let RunOutcome::Done(record) = outcome else {
            continue;
        };
        let label = axes
            .iter()
            .filter(|(key, _)| key != SEED_AXIS)
            .map(|(_, value)| value.as_str())
            .collect::<Vec<_>>()
            .join("-");
        let label = if label.is_empty() {
            "all".to_owned()
        } else {
            label
        };
        match groups.iter_mut().find(|(l, _)| *l == label) {
            Some((_, records)) => records.push(record),
            None => groups.push((label, vec![record])),
        }
    }
    groups
        .into_iter()
        .filter_map(|(label, records)| {
            let wall: Vec<f64> = records.iter().map(|r| r.wall_seconds).collect();
            let perplexity: Vec<f64> = records.iter().filter_map(|r| r.final_perplexity).collect();
            let accuracy: Vec<f64> = records.iter().filter_map(|r| r.final_accuracy).collect();
            let quality = if perplexity.len() == records.len() {
                Spread::of(&perplexity).map(|s| ("ppl", s))
            } else if accuracy.len() == records.len() {
                Spread::of(&accuracy).map(|s| ("acc", s))
            } else {
                None
            };
            Some(SeedGroup {
                label,
                seeds: records.len(),
                quality,
                wall: Spread::of(&wall)?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(accuracy: f64, wall: f64) -> RunOutcome {
        let r: RunRecord = serde_json::from_value(serde_json::json!({
            "run_name": "r",
            "wall_seconds": wall,
            "final_accuracy": accuracy,
        }))
        .expect("a run record");
        RunOutcome::Done(Box::new(r))
    }

    #[test]
    fn spread_is_mean_min_and_max() {
        let s = Spread::of(&[1.0, 4.0, 2.5]).unwrap();
        assert_eq!((s.mean, s.min, s.max), (2.5, 1.0, 4.0));
        assert_eq!(s.half_range(), 1.5);
        assert!(Spread::of(&[]).is_none());
    }

    #[test]
    fn runs_group_over_their_seeds_only() {
        let plan = |axes: &[(&str, &str)]| -> Vec<(String, String)> {
            axes.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let runs = [
            (plan(&[("recipe", "a"), ("seed", "1")]), record(0.8, 10.0)),
            (plan(&[("recipe", "b"), ("seed", "1")]), record(0.9, 20.0)),
            (plan(&[("recipe", "a"), ("seed", "2")]), record(0.6, 14.0)),
            (
                plan(&[("recipe", "b"), ("seed", "2")]),
                RunOutcome::NotStarted,
            ),
        ];
        let groups = seed_groups(runs.iter().map(|(a, o)| (a.as_slice(), o)));
        assert_eq!(groups.len(), 2);
        assert_eq!(groups[0].label, "a");
        assert_eq!(groups[0].seeds, 2);
        let (kind, acc) = groups[0].quality.unwrap();
        assert_eq!(kind, "acc");
        assert!((acc.mean - 0.7).abs() < 1e-12 && (acc.half_range() - 0.1).abs() < 1e-12);
        assert_eq!(groups[0].wall.mean, 12.0);
        assert_eq!((groups[1].label.as_str(), groups[1].seeds), ("b", 1));
        // Without a seed axis there is nothing to group.
        let unseeded = [(plan(&[("recipe", "a")]), record(0.8, 1.0))];
        assert!(seed_groups(unseeded.iter().map(|(a, o)| (a.as_slice(), o))).is_empty());
    }
}
