//! What MLflow receives: `metrics.jsonl` lines as metrics, the resolved config as parameters,
//! within MLflow's limits.

use serde::Serialize;
use serde_json::Value;

/// MLflow's longest parameter value (`MAX_PARAM_VAL_LENGTH`, MLflow 2.x and 3.x).
pub const MAX_PARAM_VALUE_CHARS: usize = 6000;
/// MLflow's longest parameter, tag or metric key (`MAX_ENTITY_KEY_LENGTH`).
pub const MAX_KEY_CHARS: usize = 250;

/// One metric value (MLflow's `Metric`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Metric {
    /// The metric's name.
    pub key: String,
    /// Its value.
    pub value: f64,
    /// Milliseconds since the Unix epoch.
    pub timestamp: i64,
    /// The training batch it belongs to.
    pub step: i64,
}

/// A parameter or tag (MLflow's `Param` and `RunTag`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KeyValue {
    /// The key.
    pub key: String,
    /// The value.
    pub value: String,
}

impl KeyValue {
    /// `key = value`, the value cut to [`MAX_PARAM_VALUE_CHARS`] (with a trailing `...`).
    pub fn new(key: impl Into<String>, value: impl Into<String>) -> KeyValue {
        let mut value = value.into();
        if value.chars().count() > MAX_PARAM_VALUE_CHARS {
            value = value.chars().take(MAX_PARAM_VALUE_CHARS - 3).collect();
            value.push_str("...");
        }
        KeyValue {
            key: key.into(),
            value,
        }
    }
}

/// The metrics of one `metrics.jsonl` line, stamped `timestamp` (ms): a `train` line's numbers
/// under their own names, an `eval` line's under `eval/<name>` (its `train_seconds` and
/// `wall_seconds` too), a `method` line's value under the method's metric name; the step is
/// the line's `batch`. Values that are not finite numbers (JSON `null`) are left out.
pub fn metrics_of_line(line: &Value, timestamp: i64) -> Vec<Metric> {
    let number = |v: &Value| v.as_f64().filter(|x| x.is_finite());
    let metric = |key: String, value: f64, step: i64| Metric {
        key: metric_key(&key),
        value,
        timestamp,
        step,
    };
    let fields = |data: &Value, prefix: &str, step: i64| -> Vec<Metric> {
        let Some(map) = data.as_object() else {
            return Vec::new();
        };
        map.iter()
            .filter(|(k, _)| k.as_str() != "batch")
            .filter_map(|(k, v)| number(v).map(|x| metric(format!("{prefix}{k}"), x, step)))
            .collect()
    };
    let step_of = |v: &Value| v.get("batch").and_then(Value::as_i64).unwrap_or(0);
    match line.get("kind").and_then(Value::as_str) {
        Some("train") => {
            let data = &line["data"];
            fields(data, "", step_of(data))
        }
        Some("eval") => {
            let data = &line["data"];
            let step = step_of(data);
            let mut out = fields(data, "eval/", step);
            for key in ["train_seconds", "wall_seconds"] {
                if let Some(x) = line.get(key).and_then(number) {
                    out.push(metric(format!("eval/{key}"), x, step));
                }
            }
            out
        }
        Some("method") => {
            let name = line.get("name").and_then(Value::as_str);
            let value = line.get("value").and_then(number);
            match (name, value) {
                (Some(name), Some(value)) => vec![metric(name.to_owned(), value, step_of(line))],
                _ => Vec::new(),
            }
        }
        _ => Vec::new(),
    }
}

/// `name` as an MLflow key: characters MLflow refuses (it allows letters, digits, `_ - . /`
/// and spaces) become `_`, and it is cut to [`MAX_KEY_CHARS`].
pub fn metric_key(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_alphanumeric() || "_-./ ".contains(c) {
                c
            } else {
                '_'
            }
        })
        .take(MAX_KEY_CHARS)
        .collect()
}

/// `value` flattened to dotted keys under `prefix`: objects by key (`optimizer.lr`), arrays by
/// index (`algorithms.0.plugin`); strings as they are, other scalars as JSON, empty objects and
/// arrays as `{}` and `[]`; nulls are left out.
pub fn flatten(prefix: &str, value: &Value, out: &mut Vec<KeyValue>) {
    let join = |key: &str| {
        if prefix.is_empty() {
            key.to_owned()
        } else {
            format!("{prefix}.{key}")
        }
    };
    match value {
        Value::Null => {}
        Value::Object(map) if !map.is_empty() => {
            for (k, v) in map {
                flatten(&join(k), v, out);
            }
        }
        Value::Array(items) if !items.is_empty() => {
            for (i, v) in items.iter().enumerate() {
                flatten(&join(&i.to_string()), v, out);
            }
        }
        Value::String(s) => out.push(KeyValue::new(metric_key(prefix), s.clone())),
        other => out.push(KeyValue::new(metric_key(prefix), other.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn lines_become_metrics_with_the_batch_as_step() {
        let train =
            json!({"kind": "train", "data": {"epoch": 0, "batch": 3, "loss": 1.5, "lr": 0.1}});
        let m = metrics_of_line(&train, 7);
        let keys: Vec<(&str, f64, i64)> = m
            .iter()
            .map(|m| (m.key.as_str(), m.value, m.step))
            .collect();
        assert_eq!(keys, [("epoch", 0.0, 3), ("loss", 1.5, 3), ("lr", 0.1, 3)]);
        assert!(m.iter().all(|m| m.timestamp == 7));
        let eval = json!({"kind": "eval", "data": {"batch": 4, "accuracy": 0.5, "perplexity": null},
            "train_seconds": 1.0, "wall_seconds": 2.0});
        let keys: Vec<String> = metrics_of_line(&eval, 0)
            .into_iter()
            .map(|m| m.key)
            .collect();
        assert_eq!(
            keys,
            ["eval/accuracy", "eval/train_seconds", "eval/wall_seconds"]
        );
        let method = json!({"kind": "method", "batch": 9, "name": "sam/rho:x", "value": 2});
        assert_eq!(
            metrics_of_line(&method, 0),
            [Metric {
                key: "sam/rho_x".into(),
                value: 2.0,
                timestamp: 0,
                step: 9
            }]
        );
        assert!(metrics_of_line(&json!({"kind": "other"}), 0).is_empty());
    }

    #[test]
    fn an_evaluations_top_k_and_f1_become_eval_metrics() {
        let mut record = crate::report::EvalRecord {
            epoch: 1,
            batch: 20,
            accuracy: 0.5,
            cross_entropy: 1.25,
            samples: 200,
            tokens: None,
            perplexity: None,
            extra: Default::default(),
        };
        record.extra.0.insert("top5".to_owned(), 0.875);
        record.extra.0.insert("f1".to_owned(), 0.375);
        // As the reporter writes the line.
        let line = json!({"kind": "eval", "data": record});
        let got: Vec<(String, f64, i64)> = metrics_of_line(&line, 0)
            .into_iter()
            .map(|m| (m.key, m.value, m.step))
            .collect();
        for (key, value) in [("eval/top5", 0.875), ("eval/f1", 0.375)] {
            assert!(
                got.contains(&(key.to_owned(), value, 20)),
                "{key} missing from {got:?}"
            );
        }
    }

    #[test]
    fn config_flattens_to_dotted_keys() {
        let config = json!({"optimizer": {"lr": 0.1, "name": "sgd"}, "algorithms": [{"plugin": "ema"}],
            "recipe": null, "plugins": {"dirs": []}});
        let mut out = Vec::new();
        flatten("", &config, &mut out);
        let pairs: Vec<(&str, &str)> = out
            .iter()
            .map(|p| (p.key.as_str(), p.value.as_str()))
            .collect();
        assert_eq!(
            pairs,
            [
                ("algorithms.0.plugin", "ema"),
                ("optimizer.lr", "0.1"),
                ("optimizer.name", "sgd"),
                ("plugins.dirs", "[]")
            ]
        );
        let long = KeyValue::new("k", "x".repeat(MAX_PARAM_VALUE_CHARS + 10));
        assert_eq!(long.value.chars().count(), MAX_PARAM_VALUE_CHARS);
        assert!(long.value.ends_with("..."));
    }
}
