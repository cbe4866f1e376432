//! `tessera export`: a checkpoint's model as a plain safetensors file that PyTorch loads.
//!
//! The file holds exactly the tensors of the model's `state_dict()` in PyTorch (parameters and
//! buffers, `num_batches_tracked` included), under the same names (`layer1.0.conv1.weight`,
//! `bn1.running_mean`, ...), and the metadata
//! - `format`: `pt` (what `safetensors.torch` writes),
//! - `tessera.model`: the run's `[model]` section as JSON (`{"name": "resnet20", "width": 16,
//!   "num_classes": 10}`),
//! - `tessera.input`: the input the model was built for, `{"channels", "height", "width"}`,
//! - `tessera.version`: the Tessera that exported it.
//!
//! `scripts/pytorch_models.py` builds the matching `torch.nn.Module` from that metadata; see
//! `docs/export.md`. Only the zoo's unmodified models are exported: a checkpoint whose model
//! was changed by surgery (BlurPool's wrappers, ...) is refused with the tensor that does not
//! fit.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use tch::{Device, TchError, Tensor};

use crate::checkpoint::{blob_of, Blob, Checkpoint, CheckpointError};
use crate::files::same_file;
use crate::model::{Model, Role};

/// Metadata key of the model's configuration (JSON).
pub const MODEL_KEY: &str = "tessera.model";
/// Metadata key of the input shape (JSON).
pub const INPUT_KEY: &str = "tessera.input";
/// Metadata key of the exporting Tessera's version.
pub const VERSION_KEY: &str = "tessera.version";

/// What [`export`] wrote.
/// Why an export wrote nothing.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// `--to` names the checkpoint itself or a folder.
    #[error("{0}")]
    Target(String),
    /// The checkpoint cannot be read or verified.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The checkpoint's recorded config cannot be read back.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// The reference model cannot be built.
    #[error("building a {model} to check the checkpoint against: {source}")]
    Build {
        /// The model's name.
        model: &'static str,
        /// libtorch's error.
        source: TchError,
    },
    /// The checkpoint's tensors are not those of the plain zoo model.
    #[error("{path}: {message}")]
    NotPlain {
        /// The checkpoint.
        path: PathBuf,
        /// Which tensor differs, and how.
        message: String,
    },
    /// Writing the file failed.
    #[error("writing {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Serializing the weights failed.
    #[error("serializing the weights: {0}")]
    Serialize(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportSummary {
    /// The file written.
    pub path: PathBuf,
    /// Tensors written (parameters and buffers).
    pub tensors: usize,
    /// Trainable scalars (the sum of the parameters' element counts, as
    /// `sum(p.numel() for p in model.parameters())` in PyTorch).
    pub parameters: i64,
    /// Size of the file in bytes.
    pub bytes: u64,
    /// The methods the run trained with (from the checkpoint): the weights are exported as
    /// stored, so a method that changes how the model uses them at each forward (weight
    /// standardization) is not applied to them.
    pub methods: Vec<String>,
}

/// Writes the model of the checkpoint at `checkpoint` to `to` as a plain safetensors file
/// (atomically: temporary file in the same folder, fsync, rename).
///
/// Fails, writing nothing, when `to` is the checkpoint itself or a folder, when the checkpoint
/// cannot be read or verified, and when its model tensors are not exactly those of the zoo
/// model its config names (a model changed by surgery, a missing or misshapen tensor).
pub fn export(checkpoint: &Path, to: &Path) -> Result<ExportSummary, ExportError> {
    if same_file(checkpoint, to) {
        return Err(ExportError::Target(format!(
            "refusing to export {} onto itself (--to {} is that file): give another --to file",
            checkpoint.display(),
            to.display()
        )));
    }
    if to.is_dir() {
        return Err(ExportError::Target(format!(
            "{} is a folder: give a file name to --to",
            to.display()
        )));
    }
    let not_plain = |message: String| ExportError::NotPlain {
        path: checkpoint.to_owned(),
        message,
    };
    let ckpt = Checkpoint::read(checkpoint)?;
    let source = format!("{} (its recorded config)", checkpoint.display());
    let config = crate::config::from_recorded(&ckpt.meta.config, &source, &[])?;
    let model_config = &config.model;
    let input = config.data.input_shape();
    let model_json = ckpt.meta.config.get("model").unwrap_or(&Value::Null);
    let name = model_config.name;
    // A fresh model of the same configuration: the names, shapes, kinds and roles to expect.
    let reference = Model::build(
        model_config,
        input,
        model_config.num_classes as i64,
        Device::Cpu,
    )
    .map_err(|source| ExportError::Build {
        model: name.as_str(),
        source,
    })?;

    let saved: HashMap<&str, &Tensor> = ckpt.with_prefix("model/").collect();
    let expected: BTreeSet<&str> = reference
        .params
        .entries()
        .iter()
        .map(|e| e.name.as_str())
        .collect();
    let methods: Vec<&str> = ckpt.meta.methods.iter().map(|m| m.name.as_str()).collect();
    let changed_by = if methods.is_empty() {
        String::new()
    } else {
        format!(" (the run used: {})", methods.join(", "))
    };
    let mut unknown: Vec<&str> = saved
        .keys()
        .copied()
        .filter(|n| !expected.contains(n))
        .collect();
    unknown.sort_unstable();
    if let Some(first) = unknown.first() {
        return Err(not_plain(format!(
            "tensor `{first}` is not part of a plain {name} model{changed_by}; the model was \
             changed (e.g. by a method's surgery) and only the zoo's unmodified models can be \
             exported{}",
            if unknown.len() > 1 {
                format!(" ({} such tensors)", unknown.len())
            } else {
                String::new()
            }
        )));
    }

    let mut blobs: Vec<(String, Blob)> = Vec::with_capacity(expected.len());
    let mut parameters = 0i64;
    for entry in reference.params.entries() {
        let t = saved.get(entry.name.as_str()).ok_or_else(|| {
            not_plain(format!(
                "the checkpoint lacks tensor `{}` of a plain {name} model{changed_by}",
                entry.name
            ))
        })?;
        if t.size() != entry.tensor.size() || t.kind() != entry.tensor.kind() {
            return Err(not_plain(format!(
                "tensor `{}` is {:?} {:?}, but a plain {name} model has {:?} {:?}",
                entry.name,
                t.kind(),
                t.size(),
                entry.tensor.kind(),
                entry.tensor.size()
            )));
        }
        if entry.role == Role::Parameter {
            parameters += t.numel() as i64;
        }
        blobs.push((entry.name.clone(), blob_of(&entry.name, t)?));
    }

    let model_text = model_json.to_string();
    let input_text = json!({
        "channels": input.channels,
        "height": input.height,
        "width": input.width,
    })
    .to_string();
    let metadata = HashMap::from([
        ("format".to_owned(), "pt".to_owned()),
        (MODEL_KEY.to_owned(), model_text),
        (INPUT_KEY.to_owned(), input_text),
        (VERSION_KEY.to_owned(), env!("CARGO_PKG_VERSION").to_owned()),
    ]);
    let bytes =
        safetensors::tensor::serialize(blobs.iter().map(|(n, b)| (n.as_str(), b)), &Some(metadata))
            .map_err(|e| ExportError::Serialize(e.to_string()))?;
    crate::files::write_atomic(to, &bytes).map_err(|source| ExportError::Write {
        path: to.to_owned(),
        source,
    })?;
    Ok(ExportSummary {
        path: to.to_owned(),
        tensors: blobs.len(),
        parameters,
        bytes: bytes.len() as u64,
        methods: methods.iter().map(|m| (*m).to_owned()).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checkpoint_itself_is_the_same_file() {
        let dir = std::env::temp_dir().join(format!("tessera-export-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("a.ckpt");
        std::fs::write(&file, b"x").unwrap();
        assert!(same_file(&file, &dir.join(".").join("a.ckpt")));
        assert!(!same_file(&file, &dir.join("b.safetensors")));
        let e = export(&file, &file).unwrap_err().to_string();
        assert!(e.contains("onto itself"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
