//! Pretrained weights in: a PyTorch `state_dict` saved as safetensors (what `tessera export`,
//! `transformers`' `save_pretrained`, `safetensors.torch.save_file` and timm write), matched to
//! the model by name (`[model] init_weights`).
//!
//! The names are PyTorch's (`layer1.0.conv1.weight`, `transformer.h.0.attn.c_attn.weight`), as
//! the zoo's models use them. Loading is strict by default: a tensor of the model that the file
//! lacks, a tensor of the file that the model lacks and a tensor whose shape differs are each
//! an error, and the error lists them all (the first 20 of each), copying nothing. Beside that:
//! - `init_ignore` patterns (globs, `fc.*`, `*.attn.bias`) name tensors left as the model drew
//!   them, on either side;
//! - the classifier head (the last linear layer of an image or text classifier) whose class
//!   count differs from the file's is left fresh, and reported (`new_head`), as fine-tuning a
//!   1000-class ImageNet model on 10 classes needs;
//! - a tied weight (GPT-2's `lm_head.weight`, which is `transformer.wte.weight`) is found under
//!   either name; when the file holds both, they must be equal;
//! - a floating-point tensor of another precision (a float16 file) is converted to the model's.
//!
//! A `.pt`/`.bin` file (a pickled `state_dict`) is refused with the one-line conversion
//! (`scripts/to_safetensors.py`).
//!
//! The path may also be a Hugging Face `save_pretrained` folder: its `model.safetensors`, or the
//! shards its `model.safetensors.index.json` lists, checked from their headers and then read one
//! at a time ([`super::weight_files`]); the report's sha256 is then that of the shards' names
//! and sha256s.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tch::{TchError, Tensor};

use super::{Model, ModelName};

/// How many names of each kind an error or a report lists.
const LISTED: usize = 20;

/// What `[model] init_weights` loaded, recorded in `run.json` (`init_weights`) and logged.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct InitReport {
    /// The file.
    pub file: PathBuf,
    /// Its sha256 (hex).
    pub sha256: String,
    /// Tensors of the model given the file's values.
    pub loaded: usize,
    /// Tensors of the model the file lacks (left as drawn; only without `init_strict`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub missing: Vec<String>,
    /// Tensors of the file the model lacks (skipped; only without `init_strict`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unexpected: Vec<String>,
    /// Tensors whose shapes differ, as `name: file [..] vs model [..]` (left as drawn; only
    /// without `init_strict`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub mismatched: Vec<String>,
    /// Tensors of the model left as drawn because `init_ignore` names them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ignored: Vec<String>,
    /// The classifier head's tensors, left as drawn because the file's class count differs.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub new_head: Vec<String>,
    /// Tensors converted from another floating-point precision, as `name: Half -> Float`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub converted: Vec<String>,
}

/// Why `init_weights` loaded nothing.
#[derive(Debug, thiserror::Error)]
pub enum InitWeightsError {
    /// The file cannot be read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The file is not a safetensors file (or is a pickled one).
    #[error("{}: {message}", path.display())]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The file's tensors do not fit the model (strict loading).
    #[error("{} does not fit this {model} model: {}", path.display(), problems.join("; "))]
    Mismatch {
        /// The file.
        path: PathBuf,
        /// The model's name.
        model: String,
        /// Each kind of difference, with the names.
        problems: Vec<String>,
    },
    /// Copying into the model failed.
    #[error("copying {} into the model: {source}", path.display())]
    Copy {
        /// The file.
        path: PathBuf,
        /// libtorch's error.
        source: TchError,
    },
}

/// Reads every tensor of the safetensors file at `path`, sorted by name.
pub fn read_state_dict(path: &Path) -> Result<Vec<(String, Tensor)>, InitWeightsError> {
    read_weights_file(path).map(|(tensors, _)| tensors)
}

/// The tensors of the safetensors file at `path` (sorted by name) and the file's sha256,
/// reading it once. A pickled PyTorch file is refused with the conversion to run.
fn read_weights_file(path: &Path) -> Result<(Vec<(String, Tensor)>, String), InitWeightsError> {
    let format = |message: String| InitWeightsError::Format {
        path: path.to_owned(),
        message,
    };
    let bytes = std::fs::read(path).map_err(|source| InitWeightsError::Io {
        path: path.to_owned(),
        source,
    })?;
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or_default()
        .to_ascii_lowercase();
    // A safetensors file starts with its 8-byte header length, then the header's `{`.
    if matches!(ext.as_str(), "pt" | "pth" | "bin" | "ckpt") && bytes.get(8) != Some(&b'{') {
        return Err(format(format!(
            "a pickled PyTorch file (`.{ext}`) cannot be read safely; convert it once with \
             `python scripts/to_safetensors.py {} model.safetensors` (the state_dict's tensors, \
             same names) and give that file (a Tessera checkpoint goes to `checkpoint.load` \
             with `weights_only = true`)",
            path.display()
        )));
    }
    let tensors = crate::tensor_file::read_plain_tensors(&bytes)
        .map_err(|e| format(format!("not a safetensors file ({e})")))?;
    Ok((tensors, crate::files::sha256_hex(&bytes)))
}

/// Whether any pattern matches `name`.
fn matches_any(patterns: &[glob::Pattern], name: &str) -> bool {
    patterns.iter().any(|p| p.matches(name))
}

/// The tensors of the classifier head: the last linear layer's, for the zoo's classifiers (not
/// gpt2 and BERT's masked LM, whose last linear layers are not class heads).
fn head_tensors(model: &Model, name: ModelName) -> Vec<String> {
    if matches!(
        name,
        ModelName::Gpt2 | ModelName::Llama | ModelName::Torchscript
    ) {
        return Vec::new();
    }
    // A masked LM's last linear layer is its prediction transform, not a class head.
    if model.root.kind() == "bert_for_masked_lm" {
        return Vec::new();
    }
    model
        .root
        .walk()
        .into_iter()
        .rev()
        .find(|i| i.kind == "linear")
        .map(|i| i.tensors)
        .unwrap_or_default()
}

/// `items` for a message: the first [`LISTED`] (in backticks when `quoted`), then how many
/// more.
pub(crate) fn listed(items: &[String], quoted: bool) -> String {
    let mut text = items
        .iter()
        .take(LISTED)
        .map(|n| if quoted { format!("`{n}`") } else { n.clone() })
        .collect::<Vec<_>>()
        .join(", ");
    if items.len() > LISTED {
        text.push_str(&format!(" and {} more", items.len() - LISTED));
    }
    text
}

/// Loads the state_dict in `path` into `model` (built as `name`), as described in the module
/// docs: `ignore` are glob patterns; `strict` makes any missing, unexpected or mis-shaped
/// tensor an error (nothing is copied then). Returns what was loaded.
pub fn load_init_weights(
    model: &Model,
    name: ModelName,
    path: &Path,
    ignore: &[String],
    strict: bool,
) -> Result<InitReport, InitWeightsError> {
    let patterns: Vec<glob::Pattern> = ignore
        .iter()
        .filter_map(|p| glob::Pattern::new(p).ok())
        .collect();
    let files = super::weight_files::weight_files(path)?;
    let (shard_of, file) = stand_ins(&files)?;
    let mismatch = |problems: Vec<String>| InitWeightsError::Mismatch {
        path: path.to_owned(),
        model: name.as_str().to_owned(),
        problems,
    };
    let aliases: BTreeMap<String, String> = super::aliases(model)
        .map_err(|source| InitWeightsError::Copy {
            path: path.to_owned(),
            source,
        })?
        .into_iter()
        .collect();
    let head: BTreeSet<String> = head_tensors(model, name).into_iter().collect();

    let mut report = InitReport {
        file: path.to_owned(),
        ..InitReport::default()
    };
    let (by_store, tied_later) = by_store_name(&file, &patterns, &aliases, model, &mut report);

    let mut copies: Vec<(&Tensor, &str)> = Vec::new();
    let mut head_shapes = Vec::new();
    for entry in model.params.entries() {
        let n = &entry.name;
        if matches_any(&patterns, n) {
            report.ignored.push(n.clone());
            continue;
        }
        let Some((file_name, t)) = by_store.get(n) else {
            report.missing.push(n.clone());
            continue;
        };
        if t.size() != entry.tensor.size() {
            // The head's class count is its first dimension; the rest must fit.
            if head.contains(n)
                && !t.size().is_empty()
                && t.size().get(1..) == entry.tensor.size().get(1..)
            {
                report.new_head.push(n.clone());
                head_shapes.push(format!(
                    "`{n}` {:?} in the file, {:?} here",
                    t.size(),
                    entry.tensor.size()
                ));
            } else {
                report.mismatched.push(format!(
                    "{file_name}: {:?} in the file, {:?} in the model",
                    t.size(),
                    entry.tensor.size()
                ));
            }
            continue;
        }
        let (from, to) = (t.kind(), entry.tensor.kind());
        if from != to {
            if !(t.is_floating_point() && entry.tensor.is_floating_point()) {
                report.mismatched.push(format!(
                    "{file_name}: {from:?} in the file, {to:?} in the model"
                ));
                continue;
            }
            report
                .converted
                .push(format!("{file_name}: {from:?} -> {to:?}"));
        }
        copies.push((&entry.tensor, file_name.as_str()));
    }
    let mut problems = if strict {
        strict_problems(&report)
    } else {
        Vec::new()
    };
    if !problems.is_empty() {
        if strict {
            problems.push(
                "set `init_ignore` to leave named tensors as drawn, or `init_strict = false` to \
                 load what fits"
                    .to_owned(),
            );
        }
        return Err(mismatch(problems));
    }
    report.sha256 = copy_shards(path, &files, &shard_of, &copies, &tied_later, model, name)?;
    report.loaded = copies.len();
    if !head_shapes.is_empty() {
        tracing::warn!(
            "init_weights: the classifier head ({}) has another class count in {}: it starts \
             fresh",
            head_shapes.join(", "),
            path.display()
        );
    }
    Ok(report)
}

/// The file's tensors as stand-ins (name, shape and dtype, no data), by name.
type StandIns = Vec<(String, Tensor)>;

/// The file's tensors by the model's store name: (file name, stand-in).
type ByStore<'f> = BTreeMap<String, (String, &'f Tensor)>;

/// Stand-ins of the tensors (shape and dtype, no data) from the files' headers, sorted by name,
/// and which file holds each: names and shapes are checked before any data is read, then the
/// files (one, or a folder's shards) are read one at a time, each copied straight into the model
/// ([`copy_shards`]).
fn stand_ins(files: &[PathBuf]) -> Result<(BTreeMap<String, usize>, StandIns), InitWeightsError> {
    let mut shard_of: BTreeMap<String, usize> = BTreeMap::new();
    let mut file = Vec::new();
    for (i, f) in files.iter().enumerate() {
        for (name, shape, kind) in super::weight_files::header(f)? {
            let t = super::weight_files::stand_in(&shape, kind).map_err(|source| {
                InitWeightsError::Copy {
                    path: f.clone(),
                    source,
                }
            })?;
            shard_of.insert(name.clone(), i);
            file.push((name, t));
        }
    }
    file.sort_by(|a, b| a.0.cmp(&b.0));
    Ok((shard_of, file))
}

/// The file's tensors by the model's store name (a tied weight's second name folded onto its
/// first), leaving out the `ignore`d ones and noting those the model lacks in `report`; and
/// a tied weight's second names (store name, file name), compared once the data is read.
fn by_store_name<'f>(
    file: &'f [(String, Tensor)],
    patterns: &[glob::Pattern],
    aliases: &BTreeMap<String, String>,
    model: &Model,
    report: &mut InitReport,
) -> (ByStore<'f>, Vec<(String, String)>) {
    let mut by_store: BTreeMap<String, (String, &Tensor)> = BTreeMap::new();
    let mut tied_later: Vec<(String, String)> = Vec::new();
    for (file_name, t) in file {
        if matches_any(patterns, file_name) {
            continue;
        }
        let store_name = aliases.get(file_name).unwrap_or(file_name);
        if model.params.get(store_name).is_none() {
            report.unexpected.push(file_name.clone());
            continue;
        }
        match by_store.get(store_name) {
            Some(_) => tied_later.push((store_name.clone(), file_name.clone())),
            None => {
                by_store.insert(store_name.clone(), (file_name.clone(), t));
            }
        }
    }
    (by_store, tied_later)
}

/// What `init_strict` refuses: tensors missing from the file or the model, or that differ.
fn strict_problems(report: &InitReport) -> Vec<String> {
    let mut problems = Vec::new();
    if !report.missing.is_empty() {
        problems.push(format!(
            "{} tensor(s) of the model are not in the file: {}",
            report.missing.len(),
            listed(&report.missing, true)
        ));
    }
    if !report.unexpected.is_empty() {
        problems.push(format!(
            "{} tensor(s) of the file are not in the model: {}",
            report.unexpected.len(),
            listed(&report.unexpected, true)
        ));
    }
    if !report.mismatched.is_empty() {
        problems.push(format!(
            "{} tensor(s) differ: {}",
            report.mismatched.len(),
            listed(&report.mismatched, false)
        ));
    }
    problems
}

/// Reads the files (one, or a folder's shards) one at a time and copies each one's planned
/// tensors (`copies`: model tensor, file name) into the model straight from the file's bytes,
/// dropping them before the next file, so that loading holds at most the largest file beside the
/// model; then checks a tied weight's second name (`tied`: store name, file name) against what
/// the first put in. Returns the file's sha256, or for shards the sha256 of their names and
/// sha256s.
fn copy_shards(
    path: &Path,
    files: &[PathBuf],
    shard_of: &BTreeMap<String, usize>,
    copies: &[(&Tensor, &str)],
    tied: &[(String, String)],
    model: &Model,
    name: ModelName,
) -> Result<String, InitWeightsError> {
    let mut digests = String::new();
    let mut single = String::new();
    let mut differ = Vec::new();
    for (i, shard) in files.iter().enumerate() {
        // What building the model drew and freed (its random init's temporaries) goes back to
        // the system before a file's bytes come in, and each file's after it.
        release_freed_memory();
        let bytes = std::fs::read(shard).map_err(|source| InitWeightsError::Io {
            path: shard.clone(),
            source,
        })?;
        let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| {
            InitWeightsError::Format {
                path: shard.clone(),
                message: format!("not a safetensors file ({e})"),
            }
        })?;
        let view = |name: &str| -> Result<Option<Tensor>, InitWeightsError> {
            match st.tensor(name) {
                Ok(v) => crate::tensor_file::borrowed(&v)
                    .map(Some)
                    .map_err(|source| InitWeightsError::Copy {
                        path: shard.clone(),
                        source,
                    }),
                Err(_) => Ok(None),
            }
        };
        for (to, name) in copies {
            if shard_of.get(*name) == Some(&i) {
                if let Some(from) = view(name)? {
                    tch::no_grad(|| to.shallow_clone().f_copy_(&from)).map_err(|source| {
                        InitWeightsError::Copy {
                            path: shard.clone(),
                            source,
                        }
                    })?;
                }
            }
        }
        for (store, file_name) in tied {
            if shard_of.get(file_name.as_str()) != Some(&i) {
                continue;
            }
            let Some(t) = view(file_name)? else { continue };
            let same = model.params.get(store).is_some_and(|e| {
                e.tensor.size() == t.size()
                    && t.f_to_kind(e.tensor.kind())
                        .map(|c| c.equal(&e.tensor))
                        .unwrap_or(false)
            });
            if !same {
                differ.push(format!("`{store}` and `{file_name}`"));
            }
        }
        let sha256 = crate::files::sha256_hex(&bytes);
        let file_name = shard.file_name().map(|n| n.to_string_lossy().into_owned());
        digests.push_str(&format!("{} {sha256}\n", file_name.unwrap_or_default()));
        single = sha256;
    }
    if !differ.is_empty() {
        return Err(InitWeightsError::Mismatch {
            path: path.to_owned(),
            model: name.as_str().to_owned(),
            problems: vec![format!(
                "tied weights differ in the {} (one tensor in this model): {}",
                if files.len() > 1 { "shards" } else { "file" },
                differ.join(", ")
            )],
        });
    }
    Ok(if files.len() == 1 {
        single
    } else {
        crate::files::sha256_hex(digests.as_bytes())
    })
}

/// Returns the heap memory the process freed to the system (glibc keeps freed blocks for reuse:
/// after building a large model that can be a hundred megabytes). A no-op elsewhere.
fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free heap pages to the kernel; it takes no pointers.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Checks `init_ignore` patterns, naming the first bad one.
pub fn check_patterns(patterns: &[String]) -> Result<(), String> {
    for p in patterns {
        glob::Pattern::new(p).map_err(|e| format!("`{p}` is not a valid pattern: {e}"))?;
    }
    Ok(())
}

#[cfg(test)]
#[path = "init_weights_tests.rs"]
mod tests;
