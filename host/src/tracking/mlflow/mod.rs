//! Tracking a run in an MLflow server through its REST API 2.0 (MLflow 2.x and 3.x).
//!
//! [`Tracker::start`] opens the run on a background thread; [`Tracker::log_line`] tees each
//! `metrics.jsonl` line; [`Tracker::end`] uploads `run.json`, `metrics.jsonl` and the final
//! weights, sets the run's status, and waits at most `flush_timeout` for all of it to arrive.
//! The trainer never waits on the network before that: events go into a bounded buffer (the
//! oldest metrics are dropped, and counted, when it is full) and are sent in batches within
//! MLflow's limits, retried with backoff while the server is down or slow. What was not
//! delivered is reported in the [`Delivery`]; a run's own files never depend on the server.
//!
//! [`fetch_runs`] reads runs back for the Explorer.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;

mod client;
mod config;
mod convert;
mod fetch;
mod outbox;
mod saved;
mod sender;

pub use client::{ApiError, Client, RunInfo};
pub use config::{check_uri, MlflowConfig};
pub use convert::{flatten, metric_key, metrics_of_line, KeyValue, Metric};
pub use fetch::{fetch_runs, FetchError, FetchedRun};
pub use outbox::{Counts, RunStatus};
pub use saved::{SavedRun, FILE_NAME as SAVED_RUN_FILE};

use outbox::{Event, Outbox, Snapshot};
use sender::{Opening, Sender};

/// The name of the weights artifact.
pub const WEIGHTS_ARTIFACT: &str = "model.safetensors";

/// What a run tells MLflow when it starts.
#[derive(Debug, Clone)]
pub struct RunStart {
    /// The MLflow run's name.
    pub run_name: String,
    /// The run folder (`mlflow.json`, `run.json` and `metrics.jsonl` live there).
    pub run_dir: PathBuf,
    /// The run continues its folder's earlier run (a resume): log to the same MLflow run.
    pub resuming: bool,
    /// Parameters (the flattened config, the plugins' versions and hashes).
    pub params: Vec<KeyValue>,
    /// Tags (`mlflow.runName`, the recipe, Tessera's version).
    pub tags: Vec<KeyValue>,
}

/// The trainer's side of a run's tracking: hands events to the sender thread.
pub struct Tracker {
    outbox: Arc<Outbox>,
    uri: String,
    flush_timeout: Duration,
    run_dir: PathBuf,
    ended: bool,
}

impl Tracker {
    /// Starts tracking a run as `config` says: a thread opens the MLflow run (continuing the
    /// one in `mlflow.json` when `start.resuming`) and sends the parameters and tags. Fails
    /// only when the thread cannot be started.
    pub fn start(config: &MlflowConfig, start: RunStart) -> std::io::Result<Tracker> {
        let saved_at = start.run_dir.join(SAVED_RUN_FILE);
        let resume = start
            .resuming
            .then(|| SavedRun::read(&saved_at))
            .flatten()
            .filter(|saved| saved.uri == config.uri);
        let outbox = Arc::new(Outbox::default());
        outbox.push(
            start
                .tags
                .into_iter()
                .map(Event::Tag)
                .chain(start.params.into_iter().map(Event::Param)),
        );
        let sender = Sender::new(
            Client::new(&config.uri),
            Arc::clone(&outbox),
            Opening {
                experiment: config.experiment.clone(),
                run_name: start.run_name,
                start_ms: now_ms(),
                resume,
                saved_at,
            },
        );
        std::thread::Builder::new()
            .name("mlflow".to_owned())
            .spawn(move || sender.run())?;
        Ok(Tracker {
            outbox,
            uri: config.uri.clone(),
            flush_timeout: config.flush_timeout(),
            run_dir: start.run_dir,
            ended: false,
        })
    }

    /// Logs the metrics of one `metrics.jsonl` line ([`metrics_of_line`]), stamped now.
    pub fn log_line(&self, line: &Value) {
        self.outbox.push(
            metrics_of_line(line, now_ms())
                .into_iter()
                .map(Event::Metric),
        );
    }

    /// Ends the run: uploads `run.json` and `metrics.jsonl` from the run folder and `weights`
    /// (a temporary file, removed afterwards), sets `status`, and waits at most
    /// `flush_timeout` for everything to be delivered.
    pub fn end(mut self, status: RunStatus, weights: Option<PathBuf>) -> Delivery {
        let mut artifacts = vec![self.artifact("run.json"), self.artifact("metrics.jsonl")];
        artifacts.push(weights.clone().map(|file| Event::Artifact {
            name: WEIGHTS_ARTIFACT.to_owned(),
            file,
        }));
        let delivery = self.finish(artifacts.into_iter().flatten().collect(), status);
        if let Some(file) = weights {
            let _ = std::fs::remove_file(file);
        }
        delivery
    }

    /// Artifact `name` from the run folder, when the file is there.
    fn artifact(&self, name: &str) -> Option<Event> {
        let file = self.run_dir.join(name);
        file.is_file().then(|| Event::Artifact {
            name: name.to_owned(),
            file,
        })
    }

    fn finish(&mut self, artifacts: Vec<Event>, status: RunStatus) -> Delivery {
        self.ended = true;
        let end = Event::End {
            status,
            end_ms: now_ms(),
        };
        self.outbox.push(artifacts.into_iter().chain([end]));
        self.outbox.close();
        self.outbox
            .wait_until_stopped(Instant::now() + self.flush_timeout);
        self.outbox.abandon();
        Delivery {
            uri: self.uri.clone(),
            run: SavedRun::read(&self.run_dir.join(SAVED_RUN_FILE)),
            snapshot: self.outbox.snapshot(),
        }
    }
}

/// A run that ends without [`Tracker::end`] failed: it is marked `FAILED` (with its
/// `metrics.jsonl`), waiting at most `flush_timeout`.
impl Drop for Tracker {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        let metrics = self.artifact("metrics.jsonl");
        let delivery = self.finish(metrics.into_iter().collect(), RunStatus::Failed);
        if let Some(warning) = delivery.warning() {
            tracing::warn!("{warning}");
        }
    }
}

/// What became of a run's events.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    /// The server.
    pub uri: String,
    /// The MLflow run, once it was opened.
    pub run: Option<SavedRun>,
    snapshot: Snapshot,
}

impl Delivery {
    /// The counts.
    pub fn counts(&self) -> &Counts {
        &self.snapshot.counts
    }

    /// Events handed over but not delivered (dropped, refused or still waiting).
    pub fn undelivered(&self) -> u64 {
        let c = self.counts();
        c.queued.saturating_sub(c.delivered)
    }

    /// The warning to show when events are missing: how many, where to, and why.
    pub fn warning(&self) -> Option<String> {
        let missing = self.undelivered();
        if missing == 0 {
            return None;
        }
        let c = self.counts();
        let mut why: Vec<String> = self.snapshot.reason.iter().cloned().collect();
        if c.dropped > 0 {
            why.push(format!(
                "{} metrics dropped when the buffer was full",
                c.dropped
            ));
        }
        let why = if why.is_empty() {
            String::new()
        } else {
            format!(" ({})", why.join("; "))
        };
        Some(format!(
            "mlflow: {missing} of {} events not delivered to {}{why}; the run's files are complete",
            c.queued, self.uri
        ))
    }
}

/// Milliseconds since the Unix epoch.
fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
