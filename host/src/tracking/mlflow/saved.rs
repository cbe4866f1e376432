//! `mlflow.json` in the run folder: which MLflow run a run folder logs to, so that a resumed run
//! continues it.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// The file's name in the run folder.
pub const FILE_NAME: &str = "mlflow.json";

/// An MLflow run a run folder logs to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SavedRun {
    /// The tracking server.
    pub uri: String,
    /// The experiment's id.
    pub experiment_id: String,
    /// The run's id.
    pub run_id: String,
}

impl SavedRun {
    /// The run saved at `path`, if it is there and readable (a damaged file is ignored with a
    /// warning: the resumed run starts a new MLflow run).
    pub fn read(path: &Path) -> Option<SavedRun> {
        let text = std::fs::read(path).ok()?;
        serde_json::from_slice(&text)
            .map_err(|e| {
                tracing::warn!("mlflow: ignoring {} ({e})", path.display());
            })
            .ok()
    }

    /// Writes it to `path` atomically.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let text = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        crate::files::write_atomic(path, &text)
    }

    /// The run's page in the MLflow UI.
    pub fn run_url(&self) -> String {
        run_url(&self.uri, &self.experiment_id, &self.run_id)
    }
}

/// The page of run `run_id` of `experiment_id` in the UI of the server at `uri`.
pub fn run_url(uri: &str, experiment_id: &str, run_id: &str) -> String {
    format!("{uri}/#/experiments/{experiment_id}/runs/{run_id}")
}
