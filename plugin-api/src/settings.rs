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
///
/// Since plugin-api 1.11 the settings also know the plugin's documented defaults
/// ([`crate::Plugin::DEFAULT_SETTINGS`], given by [`crate::boxed_method`]), so a default is
/// written once: [`Settings::f64`], [`Settings::u64`], [`Settings::bool`], [`Settings::str`]
/// and [`Settings::get`] answer the user's value or that default. The `*_or` accessors ignore
/// the documented defaults (a method that must know whether the user gave a key uses them).
#[derive(Debug, Default)]
pub struct Settings {
    values: Map<String, Value>,
    defaults: Map<String, Value>,
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
                defaults: Map::new(),
                used: RefCell::default(),
            }),
            Value::Null => Ok(Settings::default()),
            other => Err(Error::config(format!(
                "settings must be a table, got {other}"
            ))),
        }
    }

    /// These settings with `defaults` (a plugin's `DEFAULT_SETTINGS`: TOML, commented lines
    /// are documentation) as the documented defaults; a value that is not TOML is an error.
    pub fn with_defaults(&self, defaults: &str) -> Result<Settings, Error> {
        Ok(Settings {
            values: self.values.clone(),
            defaults: parse_defaults(defaults)?,
            used: RefCell::new(self.used.borrow().clone()),
        })
    }

    /// The user's value of `key`, else its documented default; an error naming the key when it
    /// has neither.
    fn take_or_default(&self, key: &str) -> Result<&Value, Error> {
        match self.take(key).or_else(|| self.defaults.get(key)) {
            Some(v) => Ok(v),
            None => Err(Error::config(format!(
                "setting `{key}` is required (the plugin documents no default for it)"
            ))),
        }
    }

    /// The setting `key` deserialized as `T`, or its documented default.
    pub fn get<T: DeserializeOwned>(&self, key: &str) -> Result<T, Error> {
        let v = self.take_or_default(key)?;
        serde_json::from_value(v.clone())
            .map_err(|e| Error::config(format!("setting `{key}`: {e} (got {v})")))
    }

    /// A number setting, or its documented default. Integers are accepted.
    pub fn f64(&self, key: &str) -> Result<f64, Error> {
        number(key, self.take_or_default(key)?)
    }

    /// A non-negative integer setting, or its documented default.
    pub fn u64(&self, key: &str) -> Result<u64, Error> {
        whole(key, self.take_or_default(key)?)
    }

    /// A boolean setting, or its documented default.
    pub fn bool(&self, key: &str) -> Result<bool, Error> {
        boolean(key, self.take_or_default(key)?)
    }

    /// A string setting, or its documented default.
    pub fn str(&self, key: &str) -> Result<String, Error> {
        string(key, self.take_or_default(key)?)
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
        self.take(key).map_or(Ok(default), |v| number(key, v))
    }

    /// A non-negative integer setting, or `default` when absent.
    pub fn u64_or(&self, key: &str, default: u64) -> Result<u64, Error> {
        self.take(key).map_or(Ok(default), |v| whole(key, v))
    }

    /// A boolean setting, or `default` when absent.
    pub fn bool_or(&self, key: &str, default: bool) -> Result<bool, Error> {
        self.take(key).map_or(Ok(default), |v| boolean(key, v))
    }

    /// A string setting, or `default` when absent.
    pub fn str_or(&self, key: &str, default: &str) -> Result<String, Error> {
        self.take(key)
            .map_or(Ok(default.to_owned()), |v| string(key, v))
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

fn number(key: &str, v: &Value) -> Result<f64, Error> {
    v.as_f64()
        .ok_or_else(|| Error::config(format!("setting `{key}` must be a number, got {v}")))
}

fn whole(key: &str, v: &Value) -> Result<u64, Error> {
    v.as_u64().ok_or_else(|| {
        Error::config(format!(
            "setting `{key}` must be a non-negative integer, got {v}"
        ))
    })
}

fn boolean(key: &str, v: &Value) -> Result<bool, Error> {
    v.as_bool()
        .ok_or_else(|| Error::config(format!("setting `{key}` must be true or false, got {v}")))
}

fn string(key: &str, v: &Value) -> Result<String, Error> {
    v.as_str()
        .map(str::to_owned)
        .ok_or_else(|| Error::config(format!("setting `{key}` must be a string, got {v}")))
}

/// A plugin's `DEFAULT_SETTINGS` (TOML) as JSON values.
pub(crate) fn parse_defaults(toml_text: &str) -> Result<Map<String, Value>, Error> {
    match toml::from_str::<Value>(toml_text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(other) => Err(format!("the plugin's DEFAULT_SETTINGS are not a table: {other}").into()),
        Err(e) => Err(format!("the plugin's DEFAULT_SETTINGS are not TOML: {e}").into()),
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

    #[test]
    fn documented_defaults_are_written_once() {
        let defaults =
            "alpha = 0.2\nwidth = 3\nname = \"all\"\nflag = true\n# beta = 1.0 (optional)";
        let user = Settings::from_json(r#"{"width": 5}"#).unwrap();
        let s = user.with_defaults(defaults).unwrap();
        assert_eq!(s.f64("alpha").unwrap(), 0.2);
        assert_eq!(s.u64("width").unwrap(), 5);
        assert_eq!(s.f64("width").unwrap(), 5.0);
        assert_eq!(s.str("name").unwrap(), "all");
        assert!(s.bool("flag").unwrap());
        assert_eq!(
            s.get::<Vec<u8>>("width").unwrap_err().kind(),
            crate::ErrorKind::CONFIG
        );
        let err = s.f64("beta").unwrap_err();
        assert!(err.message().contains("`beta` is required"), "{err}");
        // The `*_or` accessors see only what the user gave.
        assert_eq!(s.f64_or("alpha", 0.5).unwrap(), 0.5);
        s.reject_unused().unwrap();
        let typo = Settings::from_json(r#"{"alpah": 1}"#).unwrap();
        let err = typo
            .with_defaults(defaults)
            .unwrap()
            .reject_unused()
            .unwrap_err();
        assert!(err.message().contains("`alpah`"), "{err}");
        assert!(user.with_defaults("alpha = ").is_err());
    }
}
