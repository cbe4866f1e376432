//! `[logging] mlflow = { ... }`: where a run is tracked.

use std::time::Duration;

use serde::Serialize;

use crate::time::{Time, TimeUnit};

/// Where and how a run is logged to an MLflow tracking server.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MlflowConfig {
    /// The tracking server, `http://` or `https://`, without a trailing `/` (a path prefix is
    /// kept, for a server behind a reverse proxy).
    pub uri: String,
    /// The experiment the run belongs to; created when missing.
    pub experiment: String,
    /// The MLflow run's name (default: the run's `run_name`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_name: Option<String>,
    /// How long the end of the run waits for undelivered events (default `30sec`).
    pub flush_timeout: Time,
    /// Upload the final weights (safetensors, as `tessera export` writes them) as an artifact
    /// (default true).
    pub weights: bool,
}

impl MlflowConfig {
    /// The settings for `uri` (checked with [`check_uri`]) and `experiment`, others at their
    /// defaults.
    pub fn new(uri: String, experiment: String) -> MlflowConfig {
        MlflowConfig {
            uri,
            experiment,
            run_name: None,
            flush_timeout: Time::new(30, TimeUnit::Second),
            weights: true,
        }
    }

    /// [`MlflowConfig::flush_timeout`] as a duration.
    pub fn flush_timeout(&self) -> Duration {
        Duration::from_secs(self.flush_timeout.count().unwrap_or(0))
    }
}

/// `uri` as the tracking server's base URL (no trailing `/`), or why it is not one: it must be
/// `http://` or `https://` with a host, and carry no credentials, query or fragment (the URI is
/// recorded with the run's config; a token goes in `MLFLOW_TRACKING_TOKEN`).
pub fn check_uri(uri: &str) -> Result<String, String> {
    let rest = uri
        .strip_prefix("http://")
        .or_else(|| uri.strip_prefix("https://"))
        .ok_or_else(|| {
            format!("{uri:?} is not an http:// or https:// URL of an MLflow tracking server")
        })?;
    let authority = rest.split('/').next().unwrap_or_default();
    if authority.is_empty() {
        return Err(format!("{uri:?} names no host"));
    }
    if authority.contains('@') {
        return Err(format!(
            "{uri:?} holds credentials, which would be recorded with the run's config; give a \
             token in the MLFLOW_TRACKING_TOKEN environment variable instead"
        ));
    }
    if rest.contains(['?', '#']) || rest.chars().any(char::is_whitespace) {
        return Err(format!(
            "{uri:?} has a query, a fragment or spaces; give the server's base URL"
        ));
    }
    Ok(uri.trim_end_matches('/').to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris() {
        assert_eq!(
            check_uri("http://127.0.0.1:5000/").as_deref(),
            Ok("http://127.0.0.1:5000")
        );
        assert_eq!(
            check_uri("https://example.org/mlflow").as_deref(),
            Ok("https://example.org/mlflow")
        );
        for bad in [
            "127.0.0.1:5000",
            "file:///tmp/mlruns",
            "http://",
            "http://u:p@host",
            "http://host/?x=1",
        ] {
            assert!(check_uri(bad).is_err(), "{bad}");
        }
    }
}
