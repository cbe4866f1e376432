//! `[[algorithms]]`: the plugins to load, each with its own settings.

use serde::Serialize;

use super::error::{ConfigError, ErrorKind};
use super::reader::Tbl;
use super::tree::Val;
use crate::engine::OnError;

/// One `[[algorithms]]` entry.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AlgorithmConfig {
    /// The plugin's name.
    pub plugin: String,
    /// Expected SHA-256 of the plugin file, 64 lower-case hex digits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// What to do when the plugin fails.
    pub on_error: OnError,
    /// Every other key of the entry: the plugin's own settings, types intact.
    pub settings: serde_json::Map<String, serde_json::Value>,
    /// Line of the entry's `[[algorithms]]` header; 0 when it came from `--set`.
    pub line: usize,
}

impl AlgorithmConfig {
    /// The plugin settings as one JSON object text.
    pub fn settings_json(&self) -> String {
        serde_json::Value::Object(self.settings.clone()).to_string()
    }
}

pub(super) fn read(top: &Tbl<'_>) -> Result<Vec<AlgorithmConfig>, ConfigError> {
    let Some(entry) = top.entry("algorithms") else {
        return Ok(Vec::new());
    };
    let Val::Array(items) = &entry.node.val else {
        return Err(top.err(
            "algorithms",
            ErrorKind::WrongType,
            format!(
                "expected [[algorithms]] tables, got {}",
                entry.node.val.describe()
            ),
        ));
    };
    let mut out = Vec::with_capacity(items.len());
    for (i, node) in items.iter().enumerate() {
        let a = Tbl::open(top.file, top.base, &format!("algorithms.{i}"), node, None)?;
        let plugin = a
            .string("plugin")?
            .ok_or_else(|| a.missing("plugin", "the plugin's name, such as \"label_smoothing\""))?;
        if plugin.is_empty()
            || !plugin
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(a.err(
                "plugin",
                ErrorKind::InvalidValue,
                format!("{plugin:?} is not a plugin name; use letters, digits, _ and -"),
            ));
        }
        let sha256 = match a.string("sha256")? {
            Some(h) if h.len() == 64 && h.chars().all(|c| c.is_ascii_hexdigit()) => {
                Some(h.to_ascii_lowercase())
            }
            Some(h) => {
                return Err(a.err(
                    "sha256",
                    ErrorKind::InvalidValue,
                    format!(
                        "must be 64 hexadecimal digits, got {} character(s) {h:?}",
                        h.chars().count()
                    ),
                ))
            }
            None => None,
        };
        let on_error = a
            .choice("on_error", "on_error policy", &OnError::CHOICES)?
            .unwrap_or_default();
        let mut settings = serde_json::Map::new();
        for e in &a.table.entries {
            if matches!(e.key.as_str(), "plugin" | "sha256" | "on_error") {
                continue;
            }
            let value = super::tree::to_json(&e.node).map_err(|(sub, loc, msg)| {
                ConfigError::new(
                    top.file,
                    loc,
                    super::tree::join(&a.key(&e.key), &sub),
                    ErrorKind::InvalidValue,
                    msg,
                )
            })?;
            settings.insert(e.key.clone(), value);
        }
        out.push(AlgorithmConfig {
            plugin,
            sha256,
            on_error,
            settings,
            line: node.loc.line().unwrap_or(0),
        });
    }
    Ok(out)
}
