//! Reading a Hugging Face `config.json` key by key, as `LlamaConfig::from_hf_config` and
//! `Gpt2Config::from_hf_config` do: a `null` value counts as absent, and a value of the wrong
//! type is an error naming the key.

use serde_json::Value;

/// The value of `key`, unless absent or `null`.
pub(crate) fn field<'a>(json: &'a Value, key: &str) -> Option<&'a Value> {
    json.get(key).filter(|v| !v.is_null())
}

/// `key` as a whole number, if given.
pub(crate) fn count(json: &Value, key: &str) -> Result<Option<usize>, String> {
    match field(json, key) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .map(|n| Some(n as usize))
            .ok_or_else(|| format!("`{key}` must be a whole number, got {v}")),
    }
}

/// `key` as true or false, if given.
pub(crate) fn flag(json: &Value, key: &str) -> Result<Option<bool>, String> {
    match field(json, key) {
        None => Ok(None),
        Some(v) => v
            .as_bool()
            .map(Some)
            .ok_or_else(|| format!("`{key}` must be true or false, got {v}")),
    }
}

/// The number `v`, the value of `key`.
pub(crate) fn number(v: &Value, key: &str) -> Result<f64, String> {
    v.as_f64()
        .ok_or_else(|| format!("`{key}` must be a number, got {v}"))
}
