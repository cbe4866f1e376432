//! Where a run's weights come from: the checkpoint it continues (or, weights only, starts)
//! from, or `[model] init_weights` loaded into the freshly built model.

use std::path::PathBuf;
use std::time::Instant;

use crate::checkpoint;
use crate::config::Config;
use crate::model::Model;

use super::error::{fail, Context as _, Result};
use super::resume::{find_resume_checkpoint, weights_checkpoint};

/// Where the run's weights come from: the checkpoint it continues (or, weights only, starts)
/// from, or `[model] init_weights` (loaded into the model here).
pub(super) struct Start {
    pub(super) resume: Option<(PathBuf, checkpoint::Checkpoint)>,
    /// Milliseconds reading and verifying `resume` took.
    pub(super) read_ms: f64,
    pub(super) weights_from: Option<(PathBuf, checkpoint::Checkpoint)>,
    pub(super) init_report: Option<crate::model::InitReport>,
}

impl Start {
    pub(super) fn find(config: &Config, model: &Model) -> Result<Start> {
        // Read before the pretrained weights, which a resumed run does not need.
        let read_started = Instant::now();
        let resume = find_resume_checkpoint(&config.checkpoint)?;
        let read_ms = read_started.elapsed().as_secs_f64() * 1e3;
        let weights_from = weights_checkpoint(&config.checkpoint, resume.is_some())?;
        // Pretrained weights go in before the methods' surgery, as a model built with its
        // pretrained weights (torchvision's `weights=`, `from_pretrained`) in Composer.
        let init_report = match &config.model.init {
            Some(_) if weights_from.is_some() => fail!(
                "give either `[model] init_weights` (a PyTorch state_dict) or `checkpoint.load` with `weights_only` (a Tessera checkpoint), not both"
            ),
            Some(init) if resume.is_none() => Some(load_init_weights(config, model, init)?),
            Some(init) => {
                tracing::info!(
                    "resuming: the weights come from the checkpoint, not from init_weights {}",
                    init.path.display()
                );
                None
            }
            None => None,
        };
        Ok(Start {
            resume,
            read_ms,
            weights_from,
            init_report,
        })
    }
}

/// Loads `[model] init_weights` into the freshly built `model`, logging what it loaded.
fn load_init_weights(
    config: &Config,
    model: &Model,
    init: &crate::model::InitWeights,
) -> Result<crate::model::InitReport> {
    let started = Instant::now();
    let report = crate::model::load_init_weights(
        model,
        config.model.name,
        &init.path,
        &init.ignore,
        init.strict,
    )
    .context("[model] init_weights")?;
    tracing::info!(
        "init_weights: loaded {} tensors from {} in {:.0} ms{}",
        report.loaded,
        init.path.display(),
        started.elapsed().as_secs_f64() * 1e3,
        [
            ("ignored", report.ignored.len()),
            ("new head", report.new_head.len()),
            ("converted", report.converted.len())
        ]
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(what, n)| format!(", {n} {what}"))
        .collect::<String>()
    );
    for (what, names) in [
        ("the file lacks (left as drawn)", &report.missing),
        ("the model lacks (skipped)", &report.unexpected),
        ("differ (left as drawn)", &report.mismatched),
    ] {
        if !names.is_empty() {
            tracing::warn!(
                "init_weights: {} tensor(s) {what}: {}",
                names.len(),
                crate::model::listed(names, false)
            );
        }
    }
    Ok(report)
}
