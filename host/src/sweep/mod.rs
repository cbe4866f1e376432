//! `tessera sweep`: the runs of a sweep file, one after another or N at a time, each a
//! `tessera train` process in its own folder; resumable (finished runs are skipped, stopped
//! ones continue from their checkpoints), with a progress view of the whole sweep and a
//! summary file (`sweep.json`) that `tessera explore` and people can read.

mod error;
mod outcome;
mod plan;
mod progress;
mod run;
mod spread;

pub use error::SweepError;
pub use outcome::RunOutcome;
pub use plan::{plan, FolderState, Plan, PlannedRun};
pub use run::{run_sweep, SweepOptions, SweepOutcome};
pub use spread::{seed_groups, SeedGroup, Spread, SEED_AXIS};

use std::path::Path;

use serde::Serialize;
use serde_json::Value;

/// One run's line in `sweep.json`.
#[derive(Debug, Clone, Serialize)]
pub struct RunEntry {
    /// Run name (and folder name).
    pub id: String,
    /// Each axis's value.
    pub axes: serde_json::Map<String, Value>,
    /// The run folder.
    pub folder: std::path::PathBuf,
    /// `pending`, `running`, `done`, `failed` or `interrupted`.
    pub status: String,
    /// Why it failed (exit status and the log's last lines).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// From its `run.json` once done.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wall_seconds: Option<f64>,
    /// From its `run.json` once done.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub final_accuracy: Option<f64>,
    /// From its `run.json` once done (language models).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub final_perplexity: Option<f64>,
}

/// Writes `sweep.json` (atomically) into `dir`.
fn write_summary(dir: &Path, sweep_file: &Path, runs: &[RunEntry]) -> std::io::Result<()> {
    let value = serde_json::json!({
        "sweep": sweep_file,
        "runs": runs,
    });
    let mut text = serde_json::to_vec_pretty(&value).map_err(std::io::Error::other)?;
    text.push(b'\n');
    crate::files::write_atomic(&dir.join("sweep.json"), &text)
}
