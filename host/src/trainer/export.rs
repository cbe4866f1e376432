//! `tessera export` of a checkpoint: a run without methods is written straight from its
//! checkpoint ([`crate::export::export_plain`]); a run with methods is rebuilt as `tessera eval`
//! rebuilds it (its plugins loaded, their surgery replayed, the checkpoint's weights loaded) and
//! its live model written ([`crate::export::export_model`]). The file format lives in
//! `crate::export`, which knows nothing of the trainer.

use std::path::Path;

use serde_json::Value;

use crate::checkpoint::Checkpoint;
use crate::export::{self, ExportSummary};

use super::error::{fail, Context as _, Result, TrainError};
use super::{standalone_config, Trainer};

/// Writes the model of the checkpoint at `checkpoint` to `to` as a plain safetensors file
/// (atomically). Fails, writing nothing, when `to` is the checkpoint itself or a folder, when
/// the checkpoint cannot be read or verified, when a run without methods has model tensors that
/// are not exactly those of its zoo model, and when a run with methods cannot be rebuilt (a
/// plugin or the data missing) or a plugin fails to export its module.
pub fn export_checkpoint(checkpoint: &Path, to: &Path) -> Result<ExportSummary> {
    export::check_target(checkpoint, to)?;
    let ckpt = Checkpoint::read(checkpoint)?;
    if ckpt.meta.methods.is_empty() {
        let source = format!("{} (its recorded config)", checkpoint.display());
        let config = crate::config::from_recorded(&ckpt.meta.config, &source, &[])?;
        let run = (&config.model, config.data.input_shape());
        return Ok(export::export_plain(checkpoint, &ckpt, run, to)?);
    }
    let (trainer, model_json) = rebuild_on_cpu(checkpoint, &ckpt)?;
    Ok(export::export_model(
        trainer.model(),
        &model_json,
        trainer.input_shape(),
        &ckpt.meta.methods,
        to,
    )?)
}

/// Writes the LoRA adapters of the checkpoint's run into the folder `dir` as a PEFT adapter
/// ([`crate::peft`]): the run is rebuilt as `tessera eval` rebuilds it (on the CPU), its
/// adapters read from the live model. Returns what was written.
pub fn export_peft(checkpoint: &Path, dir: &Path) -> Result<crate::peft::PeftAdapter> {
    if dir.is_file() {
        fail!(
            "{} is a file: `--format peft` writes a folder",
            dir.display()
        );
    }
    let ckpt = Checkpoint::read(checkpoint)?;
    if ckpt.meta.methods.is_empty() {
        fail!(
            "{}: the run trained no methods, so it has no LoRA adapters (train with the `lora` \
             plugin)",
            checkpoint.display()
        );
    }
    let (trainer, model_json) = rebuild_on_cpu(checkpoint, &ckpt)?;
    let named = |e: String| TrainError::Run(format!("{}: {e}", checkpoint.display()));
    let adapter = crate::peft::peft_adapter(trainer.model(), &model_json).map_err(named)?;
    crate::peft::write_adapter(&adapter, dir).map_err(named)?;
    Ok(adapter)
}

/// The checkpoint's run rebuilt as `tessera eval` rebuilds it (its plugins loaded, their
/// surgery replayed, the weights loaded), on the CPU whatever device the run used (the exported
/// files are the same), and the run's `[model]` section.
fn rebuild_on_cpu(checkpoint: &Path, ckpt: &Checkpoint) -> Result<(Trainer, Value)> {
    let rebuilding = || {
        format!(
            "{}: rebuilding the trained model with its methods (as `tessera eval` does: the \
             plugins and the data must be available)",
            checkpoint.display()
        )
    };
    let config =
        standalone_config(checkpoint, &["train.device=cpu".to_owned()]).with_context(rebuilding)?;
    let trainer = Trainer::standalone(config, Vec::new()).with_context(rebuilding)?;
    let model_json = ckpt
        .meta
        .config
        .get("model")
        .cloned()
        .unwrap_or(Value::Null);
    Ok((trainer, model_json))
}
