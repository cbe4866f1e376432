//! The progress view of a sweep: a bar of the whole sweep (runs done, running, left, time
//! left) and a line per running run (its last logged batch and loss) on a terminal; a log line
//! per run started and ended otherwise.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use serde_json::Value;

use super::outcome::{log_tail, RunOutcome};
use super::plan::PlannedRun;

pub(super) struct Progress {
    bars: Option<Bars>,
    total: usize,
    /// Runs that ended (done, failed or stopped), including those done before this sweep.
    ended: usize,
    running: usize,
    parallel: usize,
    /// Seconds each run finished by this invocation took, for the estimate.
    durations: Vec<f64>,
}

struct Bars {
    multi: MultiProgress,
    sweep: ProgressBar,
    runs: HashMap<String, ProgressBar>,
}

impl Progress {
    pub(super) fn new(show: bool, total: usize, already: usize, parallel: usize) -> Progress {
        let bars = (show && std::io::stderr().is_terminal()).then(|| {
            let multi = MultiProgress::new();
            let sweep = multi.add(ProgressBar::new(total as u64));
            sweep.set_style(
                ProgressStyle::with_template("sweep {bar:30.cyan/blue} {pos}/{len} runs {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            sweep.set_position(already as u64);
            Bars {
                multi,
                sweep,
                runs: HashMap::new(),
            }
        });
        Progress {
            bars,
            total,
            ended: already,
            running: 0,
            parallel: parallel.max(1),
            durations: Vec::new(),
        }
    }

    /// A message above the bars (or a log line).
    pub(super) fn note(&self, text: &str) {
        match &self.bars {
            Some(b) => {
                let _ = b.multi.println(text);
            }
            None => tracing::info!("{text}"),
        }
    }

    pub(super) fn started(&mut self, run: &PlannedRun) {
        self.running += 1;
        let text = format!(
            "run `{}` started ({} of {}); its output: {}",
            run.id,
            self.ended + self.running,
            self.total,
            run.log_path().display()
        );
        match &mut self.bars {
            Some(b) => {
                let bar = b.multi.add(ProgressBar::new_spinner());
                bar.set_style(
                    ProgressStyle::with_template("  {spinner} {prefix} {msg}")
                        .unwrap_or_else(|_| ProgressStyle::default_spinner()),
                );
                bar.set_prefix(run.id.clone());
                b.runs.insert(run.id.clone(), bar);
            }
            None => tracing::info!("{text}"),
        }
    }

    pub(super) fn finished(&mut self, run: &PlannedRun, outcome: &RunOutcome, took: Duration) {
        self.running = self.running.saturating_sub(1);
        self.ended += 1;
        let seconds = took.as_secs_f64();
        let what = match outcome {
            RunOutcome::Done(record) => {
                self.durations.push(seconds);
                format!("done in {}: {}", clock(seconds), record.quality_text())
            }
            RunOutcome::Failed(why) => format!("FAILED: {why}"),
            RunOutcome::Interrupted => {
                "stopped with a checkpoint; it continues when the sweep is run again".to_owned()
            }
            RunOutcome::NotStarted => "not started".to_owned(),
        };
        let text = format!("run `{}` {what} — {}", run.id, self.counts());
        match &mut self.bars {
            Some(b) => {
                if let Some(bar) = b.runs.remove(&run.id) {
                    bar.finish_and_clear();
                    b.multi.remove(&bar);
                }
                b.sweep.set_position(self.ended as u64);
                let _ = b.multi.println(text);
            }
            None => match outcome {
                RunOutcome::Failed(_) => tracing::error!("{text}"),
                _ => tracing::info!("{text}"),
            },
        }
    }

    /// Refreshes the bars: each running run's last logged batch and loss, the sweep's counts.
    pub(super) fn tick<'a>(
        &mut self,
        running: impl Iterator<Item = (&'a PlannedRun, Duration)>,
        left: usize,
    ) {
        let Some(b) = &self.bars else {
            return;
        };
        let mut elapsed = Vec::new();
        for (run, took) in running {
            elapsed.push(took.as_secs_f64());
            if let Some(bar) = b.runs.get(&run.id) {
                let last = last_train_line(run)
                    .map(|d| {
                        format!(
                            "epoch {} batch {} loss {:.4} · ",
                            d["epoch"],
                            d["batch"],
                            d["loss"].as_f64().unwrap_or(f64::NAN)
                        )
                    })
                    .unwrap_or_default();
                bar.set_message(format!("{last}{}", clock(took.as_secs_f64())));
                bar.tick();
            }
        }
        let counts = self.counts_with(left, &elapsed);
        if let Some(b) = &self.bars {
            b.sweep.set_message(counts);
        }
    }

    pub(super) fn finish(&mut self) {
        if let Some(b) = &self.bars {
            b.sweep.finish_and_clear();
        }
    }

    /// `3 ended · 2 running · 3 left`, with no estimate.
    fn counts(&self) -> String {
        let left = self.total.saturating_sub(self.ended + self.running);
        format!(
            "{} ended · {} running · {left} left",
            self.ended, self.running
        )
    }

    /// The counts and, once a run has finished here, an estimate of the time left.
    fn counts_with(&self, left: usize, elapsed: &[f64]) -> String {
        let counts = format!("· {} running · {left} left", self.running);
        if self.durations.is_empty() {
            return counts;
        }
        let mean = self.durations.iter().sum::<f64>() / self.durations.len() as f64;
        let remaining: f64 =
            left as f64 * mean + elapsed.iter().map(|e| (mean - e).max(0.0)).sum::<f64>();
        format!(
            "{counts} · about {} left",
            clock(remaining / self.parallel as f64)
        )
    }
}

/// The last `train` line of the run's metrics file (its `data`).
fn last_train_line(run: &PlannedRun) -> Option<Value> {
    log_tail(&run.dir().join("metrics.jsonl"), 20)
        .iter()
        .rev()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["kind"] == "train")
        .map(|v| v["data"].clone())
}

/// Seconds as `42s`, `3m05s` or `1h02m`.
pub(super) fn clock(seconds: f64) -> String {
    let s = seconds.max(0.0).round() as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_a_clock() {
        assert_eq!(clock(4.4), "4s");
        assert_eq!(clock(185.0), "3m05s");
        assert_eq!(clock(3720.0), "1h02m");
    }

    #[test]
    fn the_estimate_counts_runs_left_and_the_rest_of_running_ones() {
        let mut p = Progress::new(false, 6, 1, 2);
        p.running = 2;
        p.durations = vec![100.0];
        // 2 left x 100 s + (100 - 40) s of a running one, on 2 at a time: 130 s.
        assert_eq!(
            p.counts_with(2, &[40.0, 120.0]),
            "· 2 running · 2 left · about 2m10s left"
        );
        p.durations.clear();
        assert_eq!(p.counts_with(2, &[]), "· 2 running · 2 left");
    }
}
