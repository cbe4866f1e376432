//! `tessera eval` and `tessera predict`: a run's model evaluated on, or applied to, the test set
//! without training, as Composer's `Trainer.eval` (the evaluation loop inside
//! `eval_standalone_start`/`eval_standalone_end`) and `Trainer.predict` (`predict_start`, per
//! batch `predict_batch_start`, `predict_before_forward`, the forward,
//! `predict_after_forward`, `predict_batch_end`, then `predict_end`).

use std::path::{Path, PathBuf};

use serde_json::json;
use tch::{Device::Cpu, Kind};

use crate::checkpoint::{self, Checkpoint};
use crate::config::{self, Config};
use crate::engine::{Algorithm, Event};
use crate::files::{same_file, write_atomic};
use crate::report::EvalRecord;

use super::error::{fail, Context as _, Result};
use super::{Purpose, Trainer};

/// What [`Trainer::predict`] wrote.
#[derive(Debug, Clone)]
pub struct PredictSummary {
    /// The predictions file.
    pub path: PathBuf,
    /// Samples predicted (lines written).
    pub samples: u64,
    /// The share of predictions equal to the target.
    pub accuracy: f64,
}

/// The configuration `tessera eval` and `tessera predict` run with, `overrides` applied:
/// - a checkpoint (`.ckpt`): the config recorded in it, set to load that checkpoint (its
///   weights and method states) and nothing else (`checkpoint.autoresume` off);
/// - a `trainer.toml`: that config, whose `checkpoint.load` or `checkpoint.autoresume` say
///   which checkpoint to load, if any (else the model is freshly initialised).
pub fn standalone_config(path: &Path, overrides: &[String]) -> Result<Config> {
    let advice = "give a checkpoint (.ckpt) or a trainer.toml";
    if path.is_dir() {
        fail!("{} is a folder; {advice}", path.display());
    }
    if !path.exists() {
        fail!("{}: no such file; {advice}", path.display());
    }
    match path.extension().and_then(|e| e.to_str()) {
        Some(checkpoint::EXTENSION) => recorded_config(path, overrides),
        Some("toml") => Ok(config::load(path, overrides)?),
        _ => fail!(
            "{}: neither a checkpoint (.ckpt) nor a trainer.toml (.toml); {advice}",
            path.display()
        ),
    }
}

/// The config recorded in the checkpoint at `path`, read again as a `trainer.toml` (so it is
/// validated and `--set` works as for training), set to load that checkpoint.
fn recorded_config(path: &Path, overrides: &[String]) -> Result<Config> {
    let recorded = Checkpoint::read(path)?.meta.config;
    let source = format!("{} (its recorded config)", path.display());
    let mut config = config::from_recorded(&recorded, &source, overrides)?;
    config.checkpoint.load = Some(path.to_owned());
    config.checkpoint.autoresume = false;
    Ok(config)
}

impl Trainer {
    /// A trainer that evaluates or predicts without training: built as [`Trainer::new`] builds
    /// one (plugins, `init` with its surgery, `before_load`, the checkpoint the config names,
    /// `after_load`), but it prepares no checkpoint folder, writes no metrics file and refuses
    /// to [`fit`](Trainer::fit).
    pub fn standalone(config: Config, extra: Vec<Box<dyn Algorithm>>) -> Result<Trainer> {
        Trainer::build(config, extra, Purpose::Standalone)
    }

    /// Evaluates the model on the test set (Composer's `Trainer.eval`): the evaluation loop
    /// inside `eval_standalone_start`/`eval_standalone_end`. Nothing is recorded or written.
    pub fn eval_standalone(&mut self) -> Result<EvalRecord> {
        self.fire_as(Event::EVAL_STANDALONE_START, false)?;
        let record = self.eval_loop()?;
        self.fire_as(Event::EVAL_STANDALONE_END, false)?;
        Ok(record)
    }

    /// Predicts every sample of the test set (Composer's `Trainer.predict`) and writes the
    /// predictions to `to` atomically as JSON Lines, one line per sample in test-set order:
    /// `{"index": i, "predicted": class, "target": class, "probabilities": [p0, p1, ...]}`
    /// (probabilities are the softmax of the model output, as `f32`).
    pub fn predict(&mut self, to: &Path) -> Result<PredictSummary> {
        if to.is_dir() {
            fail!("{} is a folder: give a file name to --to", to.display());
        }
        if let Some(source) = self
            .history
            .resumed_from
            .as_deref()
            .filter(|s| same_file(s, to))
        {
            fail!(
                "refusing to write predictions onto the checkpoint {} (--to {}): give another file",
                source.display(),
                to.display()
            );
        }
        let _no_grad = tch::no_grad_guard();
        if self.data.eval_loader.is_language() {
            fail!(
                "`tessera predict` writes class predictions; this run trains a language model \
                 (use `tessera eval` for its loss and perplexity)"
            );
        }
        self.fire_as(Event::PREDICT_START, false)?;
        let mut lines = String::new();
        let (mut samples, mut correct) = (0u64, 0u64);
        for batch in self.data.eval_loader.epoch(0, 0) {
            self.state.batch = self.device_batch(batch?)?;
            self.fire_as(Event::PREDICT_BATCH_START, false)?;
            self.fire_as(Event::PREDICT_BEFORE_FORWARD, false)?;
            self.state.forward_batch(false)?;
            self.fire_as(Event::PREDICT_AFTER_FORWARD, false)?;
            let output = self
                .state
                .output
                .as_ref()
                .context("a method removed the output")?
                .f_to_kind(Kind::Float)?;
            let predicted = Vec::<i64>::try_from(output.f_argmax(1, false)?.f_to_device(Cpu)?)?;
            let probabilities = output.f_softmax(1, Kind::Float)?.f_to_device(Cpu)?;
            let classes = probabilities.size().get(1).copied().unwrap_or(0) as usize;
            let probabilities = Vec::<f32>::try_from(probabilities.f_flatten(0, -1)?)?;
            let targets = match self.state.batch.target() {
                Some(t) => Vec::<i64>::try_from(t.f_to_device(Cpu)?)?,
                None => fail!("the batch has no `target`"),
            };
            for (i, (&p, &t)) in predicted.iter().zip(&targets).enumerate() {
                let row = &probabilities[i * classes..(i + 1) * classes];
                let line =
                    json!({"index": samples, "predicted": p, "target": t, "probabilities": row});
                lines.push_str(&line.to_string());
                lines.push('\n');
                samples += 1;
                correct += u64::from(p == t);
            }
            self.fire_as(Event::PREDICT_BATCH_END, false)?;
        }
        self.state.batch = Default::default();
        self.state.output = None;
        self.fire_as(Event::PREDICT_END, false)?;
        write_atomic(to, lines.as_bytes()).with_context(|| format!("writing {}", to.display()))?;
        Ok(PredictSummary {
            path: to.to_owned(),
            samples,
            accuracy: correct as f64 / samples.max(1) as f64,
        })
    }
}
