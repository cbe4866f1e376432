//! `[model]`: the architecture and its sizes.

use super::data::DataConfig;
use super::error::{ConfigError, ErrorKind};
use super::reader::{quote_list, Tbl};
use super::required_table;
use super::section::{section, Section};
use crate::model::{ModelConfig, ModelName};

section!(ModelConfig {
    name,
    hidden: uint_list(1),
    width: uint(1),
    num_classes: uint(1),
});

pub(super) fn read(top: &Tbl<'_>, data: &DataConfig) -> Result<ModelConfig, ConfigError> {
    let m = required_table(top, "model", ModelConfig::KEYS, "`name`")?;
    let names: Vec<&str> = ModelName::CHOICES.iter().map(|(n, _)| *n).collect();
    let name = m
        .choice("name", "model", &ModelName::CHOICES)?
        .ok_or_else(|| m.missing("name", &quote_list(&names)))?;
    if name == ModelName::Mlp {
        m.reject(
            "width",
            "`width` applies to models \"cnn\" and the resnets, not \"mlp\" (use `hidden`)",
        )?;
    } else {
        m.reject(
            "hidden",
            &format!(
                "`hidden` only applies to model \"mlp\", not {:?}",
                name.as_str()
            ),
        )?;
    }
    let classes = data.num_classes();
    let model = ModelConfig::new(name, classes).read_keys(&m)?;
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
