//! The export file: a model as a plain safetensors file that PyTorch loads (`tessera export`
//! reads a checkpoint and rebuilds a run with methods in `trainer::export_checkpoint`; this
//! module knows nothing of the trainer, which also uses it for the weights it hands to MLflow).
//!
//! The file holds exactly the tensors of the model's `state_dict()` in PyTorch (parameters and
//! buffers, `num_batches_tracked` included), under the same names (`layer1.0.conv1.weight`,
//! `bn1.running_mean`, ...; a tied weight under each of its names, as gpt2's `lm_head.weight`
//! beside `transformer.wte.weight`, see [`aliases`]), and the metadata
//! - `format`: `pt` (what `safetensors.torch` writes),
//! - `tessera.model`: the run's `[model]` section as JSON (`{"name": "resnet20", "width": 16,
//!   "num_classes": 10}`),
//! - `tessera.input`: the input the model was built for, `{"channels", "height", "width"}`,
//! - `tessera.version`: the Tessera that exported it,
//! - `tessera.methods`: the methods the run trained with, `[{"name", "version", "settings"}]`,
//! - `tessera.modules`: the plugin modules that stay in the exported network (BlurPool's
//!   `blur_conv2d`, SqueezeExcite's wrapper), `[{"path", "kind", "attrs"}]`, so that a PyTorch
//!   twin of the changed network can be built (`scripts/pytorch_models.py` does).
//!
//! A run without methods is checked against a fresh zoo model of its config: every tensor must
//! be there with its shape and dtype, nothing else. A run with methods is rebuilt as
//! `tessera eval` rebuilds it (its plugins loaded, their surgery replayed at `init`, the
//! checkpoint's weights loaded) and the live model is written: each plugin module or wrapper
//! either stays (its tensors under the names it registered — Composer's names) or is folded
//! back into the plain module it replaced (weight standardization writes standardized weights,
//! Ghost BatchNorm its batch norm), as its plugin says (plugin-api 1.4's `export`; a plugin
//! built against an older interface stays as it is). See `docs/export.md`.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use tch::{Device, TchError, Tensor};

use crate::checkpoint::{blob_of, Blob, Checkpoint, CheckpointError, MethodMeta};
use crate::files::same_file;
pub use crate::model::aliases;
use crate::model::{Attr, InputShape, LayerInfo, Model, ModelConfig, Role};

/// Metadata key of the model's configuration (JSON).
pub const MODEL_KEY: &str = "tessera.model";
/// Metadata key of the input shape (JSON).
pub const INPUT_KEY: &str = "tessera.input";
/// Metadata key of the exporting Tessera's version.
pub const VERSION_KEY: &str = "tessera.version";
/// Metadata key of the methods the run trained with (JSON).
pub const METHODS_KEY: &str = "tessera.methods";
/// Metadata key of the plugin modules kept in the exported network (JSON).
pub const MODULES_KEY: &str = "tessera.modules";

/// Why an export wrote nothing.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// `--to` names the checkpoint itself or a folder.
    #[error("{0}")]
    Target(String),
    /// The checkpoint cannot be read or verified.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
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
    /// A plugin's module could not be written.
    #[error("exporting the model's plugin modules: {0}")]
    Fold(String),
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

/// What an export wrote.
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
    /// The methods the run trained with (from the checkpoint).
    pub methods: Vec<String>,
    /// The plugin modules kept in the exported network, as (path, kind).
    pub kept: Vec<(String, String)>,
}

/// Refuses an export onto the checkpoint itself or onto a folder.
pub fn check_target(checkpoint: &Path, to: &Path) -> Result<(), ExportError> {
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
    Ok(())
}

/// Writes the model of `ckpt` (read from `checkpoint`), a run without methods, to `to` as a
/// plain safetensors file (atomically: temporary file in the same folder, fsync, rename).
/// `model_config` and `input` are the run's, as its recorded config gives them.
///
/// Fails, writing nothing, when the checkpoint's model tensors are not exactly those of the zoo
/// model its config names (a missing, extra or misshapen tensor). A run with methods is
/// rebuilt first (`trainer::export_checkpoint`), then written by [`export_model`].
pub fn export_plain(
    checkpoint: &Path,
    ckpt: &Checkpoint,
    (model_config, input): (&ModelConfig, InputShape),
    to: &Path,
) -> Result<ExportSummary, ExportError> {
    let not_plain = |message: String| ExportError::NotPlain {
        path: checkpoint.to_owned(),
        message,
    };
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
    let mut unknown: Vec<&str> = saved
        .keys()
        .copied()
        .filter(|n| !expected.contains(n))
        .collect();
    unknown.sort_unstable();
    if let Some(first) = unknown.first() {
        return Err(not_plain(format!(
            "tensor `{first}` is not part of a plain {name} model; the run recorded \
             no method, so nothing should have changed the model: the checkpoint does not \
             belong to its recorded config{}",
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
                "the checkpoint lacks tensor `{}` of a plain {name} model",
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
    // A tensor the model uses under a second name (GPT-2's `lm_head.weight`, tied to
    // `transformer.wte.weight`) is stored once and written under both names, as PyTorch's
    // `state_dict()` lists it.
    let aliases = aliases(&reference).map_err(|e| ExportError::Fold(e.to_string()))?;
    for (alias, of) in aliases {
        if let Some(t) = saved.get(of.as_str()) {
            blobs.push((alias.clone(), blob_of(&alias, t)?));
        }
    }

    write(
        to,
        &blobs,
        Metadata {
            model: model_json,
            input,
            methods: &ckpt.meta.methods,
            kept: &[],
        },
        parameters,
    )
}

/// The metadata written beside the tensors.
struct Metadata<'a> {
    model: &'a Value,
    input: InputShape,
    methods: &'a [MethodMeta],
    kept: &'a [LayerInfo],
}

/// Writes `blobs` with `meta` to `to` atomically.
fn write(
    to: &Path,
    blobs: &[(String, Blob)],
    meta: Metadata<'_>,
    parameters: i64,
) -> Result<ExportSummary, ExportError> {
    let input_text = json!({
        "channels": meta.input.channels,
        "height": meta.input.height,
        "width": meta.input.width,
    })
    .to_string();
    let methods: Vec<Value> = meta
        .methods
        .iter()
        .map(|m| json!({"name": m.name, "version": m.version, "settings": m.settings}))
        .collect();
    let kept: Vec<Value> = meta
        .kept
        .iter()
        .map(|k| {
            let attrs: serde_json::Map<String, Value> = k
                .attrs
                .iter()
                .map(|(key, value)| {
                    let v = match value {
                        Attr::Int(i) => json!(i),
                        Attr::Float(f) => json!(f),
                        Attr::Bool(b) => json!(b),
                    };
                    (key.clone(), v)
                })
                .collect();
            json!({"path": k.path, "kind": k.kind, "attrs": attrs})
        })
        .collect();
    // Where the weights came from (`init_weights`, `init_ignore`, `init_strict`) is part of
    // the run, not of the model: an exported model re-imported and exported again gives the
    // same file.
    let mut model = meta.model.clone();
    if let Value::Object(m) = &mut model {
        m.retain(|k, _| !k.starts_with("init_"));
    }
    let metadata = HashMap::from([
        ("format".to_owned(), "pt".to_owned()),
        (MODEL_KEY.to_owned(), model.to_string()),
        (INPUT_KEY.to_owned(), input_text),
        (VERSION_KEY.to_owned(), env!("CARGO_PKG_VERSION").to_owned()),
        (METHODS_KEY.to_owned(), Value::Array(methods).to_string()),
        (MODULES_KEY.to_owned(), Value::Array(kept).to_string()),
    ]);
    let bytes =
        safetensors::tensor::serialize(blobs.iter().map(|(n, b)| (n.as_str(), b)), &Some(metadata))
            .map_err(|e| ExportError::Serialize(e.to_string()))?;
    let bytes = canonical_header(bytes).map_err(ExportError::Serialize)?;
    crate::files::write_atomic(to, &bytes).map_err(|source| ExportError::Write {
        path: to.to_owned(),
        source,
    })?;
    Ok(ExportSummary {
        path: to.to_owned(),
        tensors: blobs.len(),
        parameters,
        bytes: bytes.len() as u64,
        methods: meta.methods.iter().map(|m| m.name.clone()).collect(),
        kept: meta
            .kept
            .iter()
            .map(|k| (k.path.clone(), k.kind.clone()))
            .collect(),
    })
}

/// `bytes` (a safetensors file) with its JSON header's keys sorted at every level, so that the
/// same tensors and metadata always give the same bytes (the `safetensors` crate writes the
/// metadata from a hash map, in a different order each time). The tensors' offsets are
/// relative to the data, so only the header changes; it stays padded to 8 bytes with spaces.
fn canonical_header(bytes: Vec<u8>) -> Result<Vec<u8>, String> {
    fn sorted(v: Value) -> Value {
        match v {
            Value::Object(m) => {
                let mut entries: Vec<(String, Value)> = m.into_iter().collect();
                entries.sort_by(|a, b| a.0.cmp(&b.0));
                Value::Object(entries.into_iter().map(|(k, v)| (k, sorted(v))).collect())
            }
            Value::Array(a) => Value::Array(a.into_iter().map(sorted).collect()),
            other => other,
        }
    }
    let len_bytes: [u8; 8] = bytes
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .ok_or("the serialized file is shorter than its header length")?;
    let len = u64::from_le_bytes(len_bytes) as usize;
    let header = bytes
        .get(8..8 + len)
        .ok_or("the serialized header is cut short")?;
    let value: Value = serde_json::from_slice(header).map_err(|e| e.to_string())?;
    let mut text = serde_json::to_string(&sorted(value)).map_err(|e| e.to_string())?;
    while text.len() % 8 != 0 {
        text.push(' ');
    }
    let mut out = Vec::with_capacity(8 + text.len() + bytes.len() - 8 - len);
    out.extend_from_slice(&(text.len() as u64).to_le_bytes());
    out.extend_from_slice(text.as_bytes());
    out.extend_from_slice(&bytes[8 + len..]);
    Ok(out)
}

/// BatchNorm's statistics: buffers, whatever module holds them.
const STATISTICS: [&str; 3] = ["running_mean", "running_var", "num_batches_tracked"];

/// Writes the live `model` to `to` as `tessera export` does (atomically): the tensors of its
/// export tree ([`crate::model::Layer::export`]: plugin modules kept or folded, tied weights
/// under each of their names), with `model_json` (the run's `[model]` section), `input` and
/// `methods` as metadata.
pub fn export_model(
    model: &Model,
    model_json: &Value,
    input: InputShape,
    methods: &[MethodMeta],
    to: &Path,
) -> Result<ExportSummary, ExportError> {
    let tree = model
        .root
        .export_tree()
        .map_err(|e| ExportError::Fold(e.to_string()))?;
    let aliases: HashMap<String, String> = aliases(model)
        .map_err(|e| ExportError::Fold(e.to_string()))?
        .into_iter()
        .collect();
    let roles: HashMap<&str, Role> = model
        .params
        .entries()
        .iter()
        .map(|e| (e.name.as_str(), e.role))
        .collect();
    let mut seen = BTreeSet::new();
    let mut blobs = Vec::with_capacity(tree.tensors.len());
    let mut parameters = 0i64;
    for (name, t) in &tree.tensors {
        if !seen.insert(name.as_str()) {
            return Err(ExportError::Fold(format!(
                "two tensors are named `{name}` in the exported model (a plugin's export \
                 folds a module onto names another module uses)"
            )));
        }
        // A tensor of the live model keeps its role; a second name of one (a tied weight) is
        // counted once, as PyTorch's `parameters()` does; a folded one (computed by a plugin)
        // is a parameter unless it is floating-point-free or a batch-norm statistic.
        let is_parameter = match roles.get(name.as_str()) {
            Some(role) => *role == Role::Parameter,
            None if aliases.contains_key(name) => false,
            None => {
                t.is_floating_point()
                    && !STATISTICS
                        .iter()
                        .any(|s| name.rsplit('.').next() == Some(*s))
            }
        };
        if is_parameter {
            parameters += t.numel() as i64;
        }
        blobs.push((name.clone(), blob_of(name, t)?));
    }
    write(
        to,
        &blobs,
        Metadata {
            model: model_json,
            input,
            methods,
            kept: &tree.kept,
        },
        parameters,
    )
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
        let e = check_target(&file, &file).unwrap_err().to_string();
        assert!(e.contains("onto itself"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
