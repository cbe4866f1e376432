//! The thread that owns the client: opens (or reopens) the MLflow run, then sends the buffered
//! events in batches, retrying with backoff while the server does not answer.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::client::{ApiError, Client, RunInfo};
use super::convert::KeyValue;
use super::outbox::{Event, Outbox};
use super::saved::SavedRun;

/// The first pause after a failure; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(250);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// What the sender needs to open the run.
pub struct Opening {
    /// The experiment's name.
    pub experiment: String,
    /// The MLflow run's name.
    pub run_name: String,
    /// When the run started, ms since the Unix epoch.
    pub start_ms: i64,
    /// The run this one continues (a resumed run), if any.
    pub resume: Option<SavedRun>,
    /// Where the run's MLflow identity is remembered (`mlflow.json`).
    pub saved_at: PathBuf,
}

/// The sender's state.
pub struct Sender {
    client: Client,
    outbox: Arc<Outbox>,
    opening: Opening,
    run: Option<RunInfo>,
    /// Parameters the run already has (a resumed run): MLflow refuses to change one.
    logged_params: BTreeMap<String, String>,
    backoff: Duration,
}

impl Sender {
    /// A sender of `outbox`'s events through `client`.
    pub fn new(client: Client, outbox: Arc<Outbox>, opening: Opening) -> Sender {
        Sender {
            client,
            outbox,
            opening,
            run: None,
            logged_params: BTreeMap::new(),
            backoff: FIRST_BACKOFF,
        }
    }

    /// Runs until every event is sent, the buffer is abandoned, or the server refuses the run
    /// for good.
    pub fn run(mut self) {
        let outbox = Arc::clone(&self.outbox);
        // However the thread ends, the trainer stops waiting for it.
        struct Stopped(Arc<Outbox>);
        impl Drop for Stopped {
            fn drop(&mut self) {
                self.0.stopped();
            }
        }
        let _stopped = Stopped(outbox);
        while !self.outbox.abandoned() {
            if self.run.is_none() {
                match self.call(Sender::open) {
                    Ok(()) => self.backoff = FIRST_BACKOFF,
                    Err(e) if e.is_transient() => {
                        self.outbox.failed_attempt(e.to_string());
                        self.pause();
                    }
                    Err(e) => return self.outbox.give_up(e.to_string()),
                }
                continue;
            }
            let Some(batch) = self.outbox.next_batch() else {
                return;
            };
            match self.call(|s| s.send(&batch)) {
                Ok(()) => {
                    self.outbox.delivered(batch.len());
                    self.backoff = FIRST_BACKOFF;
                }
                Err(e) if e.is_transient() => {
                    self.outbox.retry_later(batch, e.to_string());
                    self.pause();
                }
                Err(e) => self.outbox.refused(batch.len(), e.to_string()),
            }
        }
    }

    /// Runs one request, marked in flight while it waits for the server.
    fn call(
        &mut self,
        f: impl FnOnce(&mut Sender) -> Result<(), ApiError>,
    ) -> Result<(), ApiError> {
        self.outbox.in_flight(true);
        let result = f(self);
        self.outbox.in_flight(false);
        result
    }

    fn pause(&mut self) {
        self.outbox.pause(self.backoff);
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
    }

    /// Opens the run: the resumed one set back to `RUNNING` (its parameters noted), else a new
    /// one in the experiment (created when missing), remembered in `mlflow.json`.
    fn open(&mut self) -> Result<(), ApiError> {
        let o = &self.opening;
        if let Some(saved) = &o.resume {
            match self.client.get_run(&saved.run_id) {
                Ok((info, params)) => {
                    self.client.update_run(&info.run_id, "RUNNING", None)?;
                    self.logged_params = params.into_iter().map(|p| (p.key, p.value)).collect();
                    tracing::info!("mlflow: continuing run {}", info.run_id);
                    self.run = Some(info);
                    return Ok(());
                }
                Err(e) if e.is_transient() => return Err(e),
                Err(e) => tracing::warn!(
                    "mlflow: cannot continue run {} ({e}); starting a new MLflow run",
                    saved.run_id
                ),
            }
        }
        let experiment_id = self.client.experiment_id(&o.experiment)?;
        let info = self
            .client
            .create_run(&experiment_id, &o.run_name, o.start_ms)?;
        let saved = SavedRun {
            uri: self.client.base().to_owned(),
            experiment_id: info.experiment_id.clone(),
            run_id: info.run_id.clone(),
        };
        if let Err(e) = saved.write(&o.saved_at) {
            tracing::warn!(
                "mlflow: cannot write {} ({e}); a resumed run will start a new MLflow run",
                o.saved_at.display()
            );
        }
        tracing::info!("mlflow: logging to {}", saved.run_url());
        self.run = Some(info);
        Ok(())
    }

    /// Sends one batch of [`Outbox::next_batch`].
    fn send(&mut self, batch: &[Event]) -> Result<(), ApiError> {
        let Some(run) = &self.run else {
            return Err(ApiError::BadAnswer("no run is open".to_owned()));
        };
        match batch {
            [Event::Artifact { name, file }] => {
                let bytes = std::fs::read(file).map_err(|e| {
                    ApiError::BadAnswer(format!("cannot read {}: {e}", file.display()))
                })?;
                self.client.upload_artifact(&run.artifact_uri, name, &bytes)
            }
            [Event::End { status, end_ms }] => {
                self.client
                    .update_run(&run.run_id, status.as_str(), Some(*end_ms))
            }
            _ => {
                let (mut params, mut tags, mut metrics) = (Vec::new(), Vec::new(), Vec::new());
                for event in batch {
                    match event {
                        Event::Param(p) => params.push(p.clone()),
                        Event::Tag(t) => tags.push(t.clone()),
                        Event::Metric(m) => metrics.push(m.clone()),
                        Event::Artifact { .. } | Event::End { .. } => {}
                    }
                }
                let params = self.new_params(params);
                self.client.log_batch(&run.run_id, &params, &tags, &metrics)
            }
        }
    }

    /// `params` without those a resumed run already has: MLflow keeps a parameter's first
    /// value (a changed one is said once, in a warning).
    fn new_params(&self, params: Vec<KeyValue>) -> Vec<KeyValue> {
        params
            .into_iter()
            .filter(|p| match self.logged_params.get(&p.key) {
                None => true,
                Some(old) if *old == p.value => false,
                Some(old) => {
                    tracing::warn!(
                        "mlflow: parameter {} changed on resume ({old} -> {}); MLflow keeps the first value",
                        p.key,
                        p.value
                    );
                    false
                }
            })
            .collect()
    }
}
