//! `[logging]`: where a run is tracked besides its run folder (see docs/tracking.md).

use serde::Serialize;

use super::error::{ConfigError, ErrorKind};
use super::reader::Tbl;
use super::section::{section, Section};
use crate::tracking::mlflow::{check_uri, MlflowConfig};

/// Whole seconds, the unit of `flush_timeout`.
const SECONDS: &[&str] = &["sec"];

/// `[logging]`
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LoggingConfig {
    /// `mlflow = { uri, experiment, ... }`: log the run to an MLflow tracking server.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mlflow: Option<MlflowConfig>,
}

section!(LoggingConfig { mlflow });

section!(MlflowConfig {
    uri,
    experiment,
    run_name: string(),
    flush_timeout: time(SECONDS),
    weights: bool(),
});

pub(super) fn read(top: &Tbl<'_>) -> Result<LoggingConfig, ConfigError> {
    let Some(t) = top.sub("logging", Some(LoggingConfig::KEYS))? else {
        return Ok(LoggingConfig::default());
    };
    let Some(m) = t.sub("mlflow", Some(MlflowConfig::KEYS))? else {
        return Ok(LoggingConfig::default());
    };
    let uri = m.string("uri")?.ok_or_else(|| {
        m.missing(
            "uri",
            "the tracking server's URL, e.g. \"http://127.0.0.1:5000\"",
        )
    })?;
    let uri = check_uri(&uri).map_err(|e| m.err("uri", ErrorKind::InvalidValue, e))?;
    let experiment = m
        .string("experiment")?
        .ok_or_else(|| m.missing("experiment", "the experiment's name, e.g. \"fmnist\""))?;
    if experiment.trim().is_empty() {
        return Err(m.err("experiment", ErrorKind::InvalidValue, "must not be empty"));
    }
    let mlflow = MlflowConfig::new(uri, experiment).read_keys(&m)?;
    if mlflow
        .run_name
        .as_deref()
        .is_some_and(|n| n.trim().is_empty())
    {
        return Err(m.err("run_name", ErrorKind::InvalidValue, "must not be empty"));
    }
    Ok(LoggingConfig {
        mlflow: Some(mlflow),
    })
}
