//! `[model]`: the architecture and its sizes, or a TorchScript file made in PyTorch.

use std::path::{Path, PathBuf};

use super::data::DataConfig;
use super::error::{ConfigError, ErrorKind};
use super::reader::{quote_list, Bounds, Tbl};
use super::required_table;
use super::section::{section, Section};
use crate::model::{ModelConfig, ModelName, Norm, TorchscriptFile};

section!(ModelConfig {
    name,
    torchscript,
    sha256,
    hidden: uint_list(1),
    width: uint(1),
    num_classes: uint(1),
    dropout: float(Bounds::UNIT_OPEN),
    norm: choice("normalization", &Norm::CHOICES),
});

pub(super) fn read(top: &Tbl<'_>, data: &DataConfig) -> Result<ModelConfig, ConfigError> {
    let m = required_table(
        top,
        "model",
        ModelConfig::KEYS,
        "`name` (a zoo model) or `torchscript` (a model file)",
    )?;
    let names: Vec<&str> = ModelName::CHOICES.iter().map(|(n, _)| *n).collect();
    let classes = data.num_classes();
    let model = match (m.entry("name"), m.entry("torchscript")) {
        (Some(_), Some(_)) => {
            return Err(m.err_key(
                "torchscript",
                ErrorKind::InvalidValue,
                "give either `name` (a zoo model) or `torchscript` (a model file made in \
                 PyTorch), not both",
            ))
        }
        (None, Some(_)) => {
            for key in ["hidden", "width", "dropout", "norm"] {
                m.reject(
                    key,
                    &format!(
                        "`{key}` applies to the zoo's models; a TorchScript model's sizes are \
                         fixed by its file"
                    ),
                )?;
            }
            ModelConfig::torchscript(torchscript_file(&m)?, classes)
        }
        (_, None) => {
            m.reject("sha256", "`sha256` pins a `torchscript` model file")?;
            if m.string("name")?.as_deref() == Some(ModelName::Torchscript.as_str()) {
                return Err(m.err(
                    "name",
                    ErrorKind::InvalidValue,
                    "a TorchScript model is named by its file: write `torchscript = \
                     \"model.pt\"` instead of `name`",
                ));
            }
            let name = m
                .choice("name", "model", &ModelName::CHOICES)?
                .ok_or_else(|| {
                    m.missing(
                        "name",
                        &format!(
                            "{} (or `torchscript = \"model.pt\"`, a model made in PyTorch)",
                            quote_list(&names)
                        ),
                    )
                })?;
            if name == ModelName::Mlp {
                m.reject(
                    "width",
                    "`width` applies to models \"cnn\" and the resnets, not \"mlp\" (use `hidden`)",
                )?;
            } else {
                m.reject(
                    "dropout",
                    &format!(
                        "`dropout` only applies to model \"mlp\", not {:?}",
                        name.as_str()
                    ),
                )?;
                m.reject(
                    "hidden",
                    &format!(
                        "`hidden` only applies to model \"mlp\", not {:?}",
                        name.as_str()
                    ),
                )?;
            }
            ModelConfig::new(name, classes)
        }
    };
    let model = model.read_keys(&m)?;
    if let Some(norm) = model.norm {
        let allowed = Norm::choices(model.name);
        if !allowed.contains(&norm) {
            let names: Vec<&str> = allowed.iter().map(|n| n.as_str()).collect();
            return Err(m.err(
                "norm",
                ErrorKind::InvalidValue,
                format!(
                    "model {:?} can be built with {}, not {:?}",
                    model.name.as_str(),
                    quote_list(&names),
                    norm.as_str()
                ),
            ));
        }
    }
    if model.num_classes < classes {
        return Err(m.err(
            "num_classes",
            ErrorKind::InvalidValue,
            format!(
                "must be >= {classes} (the classes of {}), got {}",
                data.dataset, model.num_classes
            ),
        ));
    }
    Ok(model)
}

/// `torchscript` (resolved against the file's folder, made absolute) and its sha256, which
/// must equal `sha256` when that is given.
fn torchscript_file(m: &Tbl<'_>) -> Result<TorchscriptFile, ConfigError> {
    let given = m.path("torchscript")?.unwrap_or_default();
    let path = absolute(&given);
    let invalid = |msg: String| m.err("torchscript", ErrorKind::InvalidValue, msg);
    if !path.is_file() {
        return Err(invalid(format!(
            "the TorchScript model {} does not exist{}",
            path.display(),
            if path.exists() { " as a file" } else { "" }
        )));
    }
    let sha256 = crate::files::sha256_file(&path)
        .map_err(|e| invalid(format!("cannot read {}: {e}", path.display())))?;
    if let Some(pinned) = m.string("sha256")? {
        if !pinned.eq_ignore_ascii_case(&sha256) {
            return Err(m.err(
                "sha256",
                ErrorKind::InvalidValue,
                format!(
                    "{} has sha256 {sha256}, but the config pins {pinned}: the model file \
                     changed since (restore it; in a trainer.toml, drop `sha256` to accept the \
                     new one)",
                    path.display()
                ),
            ));
        }
    }
    Ok(TorchscriptFile { path, sha256 })
}

/// `path` made absolute against the working folder (links are kept), so a recorded config
/// still finds the file from another folder.
fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_owned())
}
