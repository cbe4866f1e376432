//! Reading JSONL text: its objects and lines, with errors that name the file, the line and the
//! field.

use std::path::Path;

use crate::data::DataError;

/// Calls `each(line number, text, the object)` for each non-blank line of a
/// `.jsonl` file's bytes, a JSON object whose `text_field` is a string. Errors name the file and
/// the line (`each` makes its own with [`line_error`]).
pub(super) fn jsonl_objects(
    path: &Path,
    bytes: &[u8],
    text_field: &str,
    mut each: impl FnMut(
        usize,
        String,
        serde_json::Map<String, serde_json::Value>,
    ) -> Result<(), DataError>,
) -> Result<(), DataError> {
    jsonl_lines(path, bytes, |number, line| {
        let bad = |why: String| line_error(path, number, why);
        let value: serde_json::Value =
            serde_json::from_str(line).map_err(|e| bad(format!("is not valid JSON: {e}")))?;
        let serde_json::Value::Object(object) = value else {
            return Err(bad(format!(
                "is not a JSON object (each line must be an object with a \"{text_field}\" \
                 field)"
            )));
        };
        // The text stays in the object, so that an error about another field lists it too.
        let text = match object.get(text_field) {
            Some(serde_json::Value::String(text)) => text.clone(),
            Some(other) => {
                return Err(bad(format!(
                    "field \"{text_field}\" is {}, not a string",
                    json_kind(other)
                )))
            }
            None => return Err(bad(missing_field(text_field, "text_field", &object))),
        };
        each(number, text, object)
    })
}

/// Calls `each(line number, line)` for each non-blank line of a `.jsonl` file's bytes (UTF-8,
/// a trailing `\r` dropped); a line that is not UTF-8 is an error naming the file and the line.
pub(super) fn jsonl_lines(
    path: &Path,
    bytes: &[u8],
    mut each: impl FnMut(usize, &str) -> Result<(), DataError>,
) -> Result<(), DataError> {
    for (n, line) in bytes.split(|&b| b == b'\n').enumerate() {
        let number = n + 1;
        let line = std::str::from_utf8(line).map_err(|e| {
            line_error(
                path,
                number,
                format!(
                    "is not UTF-8 (invalid byte at column {})",
                    e.valid_up_to() + 1
                ),
            )
        })?;
        let line = line.strip_suffix('\r').unwrap_or(line);
        if !line.trim().is_empty() {
            each(number, line)?;
        }
    }
    Ok(())
}

/// The error of line `number` of `path`: `PATH: line N: why`.
pub(super) fn line_error(path: &Path, number: usize, why: String) -> DataError {
    DataError::format(path, format!("line {number}: {why}"))
}

/// `has no field "FIELD" (data.text.KEY); its fields: ...`.
pub(super) fn missing_field(
    field: &str,
    key: &str,
    object: &serde_json::Map<String, serde_json::Value>,
) -> String {
    let keys: Vec<&str> = object.keys().map(String::as_str).collect();
    format!(
        "has no field \"{field}\" (data.text.{key}); its fields: {}",
        if keys.is_empty() {
            "none".to_owned()
        } else {
            keys.join(", ")
        }
    )
}

pub(super) fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}
