//! A method's settings: its `[[algorithms]]` table from `trainer.toml`, less the host's keys.

use std::cell::RefCell;
use std::collections::BTreeSet;

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::Error;

/// The settings a user gave a method, with typed accessors that produce clear errors.
///
/// Every accessor marks its key as used; after [`crate::Plugin::create`] returns, a key that
/// was never read is reported as unknown, so typos never pass silently.
#[derive(Debug, Default)]
pub struct Settings {
    values: Map<String, Value>,
    used: RefCell<BTreeSet<String>>,
}

impl Settings {
    /// Parses settings from a JSON object.
    pub fn from_json(json: &str) -> Result<Settings, Error> {
        let value: Value = serde_json::from_str(json)
            .map_err(|e| Error::config(format!("settings are not valid JSON: {e}")))?;
        match value {
            Value::Object(values) => Ok(Settings {
                values,
                used: RefCell::default(),
            }),
            Value::Null => Ok(Settings::default()),
            other => Err(Error::config(format!(
                "settings must be a table, got {other}"
            ))),
        }
    }

    fn take(&self, key: &str) -> Option<&Value> {
        self.used.borrow_mut().insert(key.to_owned());
        self.values.get(key)
    }

    /// The setting `key` deserialized as `T`, or `default` when absent.
    pub fn get_or<T: DeserializeOwned>(&self, key: &str, default: T) -> Result<T, Error> {
        match self.take(key) {
            None => Ok(default),
            Some(v) => serde_json::from_value(v.clone())
                .map_err(|e| Error::config(format!("setting `{key}`: {e} (got {v})"))),
        }
    }

    /// A number setting, or `default` when absent. Integers are accepted.
    pub fn f64_or(&self, key: &str, default: f64) -> Result<f64, Error> {
        match self.take(key) {
            None => Ok(default),
            Some(v) => v
                .as_f64()
                .ok_or_else(|| Error::config(format!("setting `{key}` must be a number, got {v}"))),
        }
    }

    /// A non-negative integer setting, or `default` when absent.
    pub fn u64_or(&self, key: &str, default: u64) -> Result<u64, Error> {
        match self.take(key) {
            None => Ok(default),
            Some(v) => v.as_u64().ok_or_else(|| {
                Error::config(format!(
                    "setting `{key}` must be a non-negative integer, got {v}"
                ))
            }),
        }
    }

    /// A boolean setting, or `default` when absent.
    pub fn bool_or(&self, key: &str, default: bool) -> Result<bool, Error> {
        match self.take(key) {
            None => Ok(default),
            Some(v) => v.as_bool().ok_or_else(|| {
                Error::config(format!("setting `{key}` must be true or false, got {v}"))
            }),
        }
    }

    /// A string setting, or `default` when absent.
    pub fn str_or(&self, key: &str, default: &str) -> Result<String, Error> {
        match self.take(key) {
            None => Ok(default.to_owned()),
            Some(v) => v
                .as_str()
                .map(str::to_owned)
                .ok_or_else(|| Error::config(format!("setting `{key}` must be a string, got {v}"))),
        }
    }

    /// All settings deserialized as `T` (use `#[serde(deny_unknown_fields)]` on `T`).
    pub fn deserialize<T: DeserializeOwned>(&self) -> Result<T, Error> {
        self.used.borrow_mut().extend(self.values.keys().cloned());
        serde_json::from_value(Value::Object(self.values.clone()))
            .map_err(|e| Error::config(e.to_string()))
    }

    /// Fails naming the first key no accessor has read.
    pub fn reject_unused(&self) -> Result<(), Error> {
        let used = self.used.borrow();
        let mut unknown = self.values.keys().filter(|k| !used.contains(*k)).peekable();
        if unknown.peek().is_none() {
            return Ok(());
        }
        let unknown: Vec<&str> = unknown.map(String::as_str).collect();
        let known: Vec<&str> = used.iter().map(String::as_str).collect();
        Err(Error::config(format!(
            "unknown setting{} {} (known: {})",
            if unknown.len() > 1 { "s" } else { "" },
            unknown
                .iter()
                .map(|k| format!("`{k}`"))
                .collect::<Vec<_>>()
                .join(", "),
            if known.is_empty() {
                "none".to_owned()
            } else {
                known.join(", ")
            }
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_access_and_unknown_keys() {
        let s = Settings::from_json(r#"{"smoothing": 0.2, "typo": 1}"#).unwrap();
        assert_eq!(s.f64_or("smoothing", 0.1).unwrap(), 0.2);
        assert_eq!(s.u64_or("holes", 1).unwrap(), 1);
        let err = s.reject_unused().unwrap_err();
        assert!(err.message().contains("`typo`"), "{err}");
        assert!(err.message().contains("smoothing"), "{err}");
    }

    #[test]
    fn wrong_types_name_the_key() {
        let s = Settings::from_json(r#"{"smoothing": "high"}"#).unwrap();
        let err = s.f64_or("smoothing", 0.1).unwrap_err();
        assert!(
            err.message().contains("`smoothing` must be a number"),
            "{err}"
        );
    }
}
