//! Reading runs back from a tracking server, for the Explorer: each run's `run.json` and
//! `metrics.jsonl` artifacts.

use serde_json::Value;

use super::client::{ApiError, Client};
use super::saved::run_url;

/// A run read back from MLflow.
#[derive(Debug, Clone, PartialEq)]
pub struct FetchedRun {
    /// Where it came from: `mlflow:<uri>/#/experiments/<id>/runs/<run id>`.
    pub source: String,
    /// MLflow's run id.
    pub run_id: String,
    /// Its `run.json` artifact (the run record).
    pub record: Value,
    /// The lines of its `metrics.jsonl` artifact (empty when it has none).
    pub metrics: Vec<Value>,
}

/// Why runs could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The URI is not a tracking server's.
    #[error("{0}")]
    Uri(String),
    /// A call failed.
    #[error("reading experiment {experiment:?} from {uri}: {source}")]
    Api {
        /// The server.
        uri: String,
        /// The experiment.
        experiment: String,
        /// The failed call.
        source: Box<ApiError>,
    },
}

/// The runs of `experiment` on the tracking server at `uri` that have a run record (newest
/// first); runs without one (still running, or whose artifacts never arrived) are left out,
/// with a note in the log.
pub fn fetch_runs(uri: &str, experiment: &str) -> Result<Vec<FetchedRun>, FetchError> {
    let base = super::check_uri(uri).map_err(FetchError::Uri)?;
    let client = Client::new(&base);
    let api = |source| FetchError::Api {
        uri: base.clone(),
        experiment: experiment.to_owned(),
        source: Box::new(source),
    };
    let experiment_id = client.experiment_id(experiment).map_err(api)?;
    let mut fetched = Vec::new();
    let mut without_record = 0;
    for run in client.search_runs(&experiment_id).map_err(api)? {
        let info = &run["info"];
        let (Some(run_id), Some(artifacts)) =
            (info["run_id"].as_str(), info["artifact_uri"].as_str())
        else {
            continue;
        };
        let Some(record) = download_json(&client, artifacts, "run.json").map_err(api)? else {
            without_record += 1;
            continue;
        };
        let metrics = client
            .download_artifact(artifacts, "metrics.jsonl")
            .map_err(api)?
            .map(|bytes| jsonl(&bytes))
            .unwrap_or_default();
        fetched.push(FetchedRun {
            source: format!("mlflow:{}", run_url(&base, &experiment_id, run_id)),
            run_id: run_id.to_owned(),
            record,
            metrics,
        });
    }
    if without_record > 0 {
        tracing::info!(
            "mlflow: {without_record} run(s) of experiment {experiment:?} have no run.json artifact (still running, or not Tessera runs); left out"
        );
    }
    Ok(fetched)
}

/// Artifact `name` parsed as JSON; `None` when missing or not JSON.
fn download_json(client: &Client, artifacts: &str, name: &str) -> Result<Option<Value>, ApiError> {
    Ok(client
        .download_artifact(artifacts, name)?
        .and_then(|bytes| serde_json::from_slice(&bytes).ok()))
}

/// The JSON values of the lines of `bytes` (lines that are not JSON are skipped).
fn jsonl(bytes: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(bytes)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}
