//! A configuration recorded in a checkpoint or run record (the serialized [`Config`]) read back
//! as a `trainer.toml`, so it is validated like any other and `--set` works on it.

use std::path::Path;

use serde_json::Value;

use super::error::{ConfigError, ErrorKind, Location};
use super::{from_str_with_overrides, Config};

/// The configuration `recorded` (a serialized [`Config`]) with `overrides` applied; `source`
/// names it in messages. Recorded paths are already resolved (absolute, or relative to the
/// working folder).
pub fn from_recorded(
    recorded: &Value,
    source: &str,
    overrides: &[String],
) -> Result<Config, ConfigError> {
    let mut recorded = recorded.clone();
    // A price set by `instance` is recorded as `usd_per_hour` too; reading both back would be
    // refused, so the instance sets it again.
    if let Some(map) = recorded.as_object_mut() {
        if map.get("instance").is_some_and(|i| !i.is_null()) {
            map.remove("usd_per_hour");
        }
    }
    let text = recorded_toml(&recorded).map_err(|e| {
        ConfigError::new(
            source,
            Location::Unknown,
            "",
            ErrorKind::Syntax,
            format!("the recorded config cannot be written as TOML: {e}"),
        )
    })?;
    from_str_with_overrides(&text, Path::new(""), source, overrides)
}

/// A recorded (serialized) [`Config`] written as `trainer.toml` text, which reads back as the
/// same configuration (its paths are already resolved).
pub fn recorded_toml(recorded: &Value) -> Result<String, toml::ser::Error> {
    toml::to_string(&as_toml_tree(recorded.clone()))
}

/// The recorded (serialized) config in the shape of a `trainer.toml`: without nulls (TOML has
/// none; absent means default), and with each `[[algorithms]]` entry's `settings` inline and
/// its source `line` dropped.
fn as_toml_tree(value: Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| {
                    let v = match (k.as_str(), v) {
                        ("algorithms", Value::Array(entries)) => {
                            Value::Array(entries.into_iter().map(inline_settings).collect())
                        }
                        (_, v) => v,
                    };
                    (k, as_toml_tree(v))
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(as_toml_tree).collect()),
        other => other,
    }
}

fn inline_settings(entry: Value) -> Value {
    let Value::Object(mut map) = entry else {
        return entry;
    };
    map.remove("line");
    if let Some(Value::Object(settings)) = map.remove("settings") {
        map.extend(settings);
    }
    Value::Object(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorded_config_reads_back_as_the_same_config() {
        let text = r#"
run_name = "recorded"
output_dir = "/tmp/tessera-recorded"
seed = 7
[data]
dataset = "synthetic"
batch_size = 16
[data.synthetic]
samples = 64
eval_samples = 32
channels = 1
height = 8
width = 8
classes = 4
[model]
name = "mlp"
hidden = [16]
[optimizer]
name = "adamw"
lr = 0.01
[scheduler]
name = "cosine_with_warmup"
t_warmup = "0.1dur"
[train]
max_duration = "4ep"
iteration_length = "2ep"
precision = "amp_bf16"
target = "cross_entropy < 0.25"
stop_at_target = false
[[algorithms]]
plugin = "label_smoothing"
on_error = "disable"
smoothing = 0.1
"#;
        let original = crate::config::from_str(text, Path::new("/base"), "recorded.toml").unwrap();
        let recorded = serde_json::to_value(&original).unwrap();
        let mut read = from_recorded(&recorded, "again", &[]).unwrap();
        // The entry's line is where it stands in the file read.
        read.algorithms[0].line = original.algorithms[0].line;
        assert_eq!(read, original, "{recorded:#}");
    }
}
