//! The run's experiment tracking (`[logging] mlflow`): started with the run's reporter, which
//! tees every metrics line to it, and ended after the run record is written (rank 0 only).

use std::path::PathBuf;

use crate::checkpoint::MethodMeta;
use crate::config::Config;
use crate::report::{PluginRecord, Reporter};
use crate::tracking::mlflow::{flatten, KeyValue, RunStart, RunStatus, Tracker};

use super::Trainer;

/// Attaches a tracker to `reporter` when the config asks for one. `resuming`: the run continues
/// its folder's earlier run. A tracker that cannot start is a warning, never an error.
pub(super) fn start(
    config: &Config,
    plugins: &[PluginRecord],
    resuming: bool,
    reporter: &mut Reporter,
) {
    let Some(mlflow) = &config.logging.mlflow else {
        return;
    };
    let start = RunStart {
        run_name: mlflow
            .run_name
            .clone()
            .unwrap_or_else(|| config.run_name.clone()),
        run_dir: config.run_dir(),
        resuming,
        params: params(config, plugins),
        tags: vec![
            KeyValue::new(
                "mlflow.runName",
                mlflow.run_name.as_deref().unwrap_or(&config.run_name),
            ),
            KeyValue::new("recipe", config.recipe_label()),
            KeyValue::new("tessera.version", env!("CARGO_PKG_VERSION")),
        ],
    };
    match Tracker::start(mlflow, start) {
        Ok(tracker) => reporter.track(tracker),
        Err(e) => {
            tracing::warn!("mlflow: cannot start the tracking thread ({e}); the run is not tracked")
        }
    }
}

/// The run's parameters: the resolved config flattened to dotted keys (`optimizer.lr`,
/// `algorithms.0.plugin`), and `plugin.<name>.version` and `plugin.<name>.sha256` of each
/// plugin.
fn params(config: &Config, plugins: &[PluginRecord]) -> Vec<KeyValue> {
    let mut out = Vec::new();
    match serde_json::to_value(config) {
        Ok(value) => flatten("", &value, &mut out),
        Err(e) => tracing::warn!(
            "mlflow: cannot serialize the config ({e}); its parameters are not logged"
        ),
    }
    for p in plugins {
        out.push(KeyValue::new(
            format!("plugin.{}.version", p.name),
            &p.version,
        ));
        out.push(KeyValue::new(
            format!("plugin.{}.sha256", p.name),
            &p.sha256,
        ));
    }
    out
}

impl Trainer {
    /// Ends the tracking of the run (after `run.json` is written): the final weights exported
    /// into a temporary file for upload, the status set, at most `flush_timeout` of waiting; what
    /// was not delivered is a warning.
    pub(super) fn end_tracking(&mut self, status: RunStatus) {
        let Some(tracker) = self.reporter.take_tracker() else {
            return;
        };
        let weights = self
            .config
            .logging
            .mlflow
            .as_ref()
            .is_some_and(|m| m.weights)
            .then(|| self.export_weights())
            .flatten();
        let delivery = tracker.end(status, weights);
        match (delivery.warning(), &delivery.run) {
            (Some(warning), _) => tracing::warn!("{warning}"),
            (None, Some(run)) => tracing::info!("mlflow: run logged at {}", run.run_url()),
            (None, None) => {}
        }
    }

    /// The model exported as `tessera export` writes it, into a temporary file; `None` (with a
    /// warning) when that fails.
    fn export_weights(&self) -> Option<PathBuf> {
        let path = std::env::temp_dir().join(format!(
            "tessera-mlflow-{}-{}.safetensors",
            std::process::id(),
            self.config.run_name
        ));
        let model_json = serde_json::to_value(&self.config.model).unwrap_or_default();
        let methods: Vec<MethodMeta> = self
            .history
            .plugins
            .iter()
            .map(|p| MethodMeta {
                name: p.name.clone(),
                version: p.version.clone(),
                settings: p.settings.clone(),
                format_version: 0,
                has_state: false,
                tensors: Vec::new(),
            })
            .collect();
        match crate::export::export_model(
            &self.state.model,
            &model_json,
            self.input_shape(),
            &methods,
            &path,
        ) {
            Ok(_) => Some(path),
            Err(e) => {
                tracing::warn!(
                    "mlflow: cannot export the final weights ({e}); they are not uploaded"
                );
                None
            }
        }
    }
}
