//! The configuration error type and its one message format.

use std::fmt;

/// Where the offending text of a configuration error came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// A position in the file: 1-based line and column (in characters).
    File {
        /// 1-based line number.
        line: usize,
        /// 1-based column, counted in characters.
        column: usize,
    },
    /// The value was given on the command line as `--set ARG`; holds `ARG`.
    Override(String),
    /// No position is known (for example a table that is missing from the file).
    Unknown,
}

impl Location {
    /// The line number, when the error points into the file.
    pub fn line(&self) -> Option<usize> {
        match self {
            Location::File { line, .. } => Some(*line),
            _ => None,
        }
    }
}

/// The class of a configuration error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The file could not be read.
    Io,
    /// The file is not valid TOML.
    Syntax,
    /// A key that the schema does not know (or that does not apply here).
    UnknownKey,
    /// A value of the wrong TOML type.
    WrongType,
    /// A value of the right type that is not allowed (range, name, format).
    InvalidValue,
    /// A required key or table is absent.
    MissingKey,
    /// A `--set` argument that cannot be applied.
    BadOverride,
}

/// An error in `trainer.toml` or a `--set` override.
///
/// `Display` gives one line:
/// `FILE:LINE:COL: KEY: MESSAGE` for an error in the file,
/// `FILE: --set ARG: KEY: MESSAGE` for a value given with `--set`, and
/// `FILE: KEY: MESSAGE` when no position is known. `KEY` is the dotted path
/// of the offending key (`optimizer.lr`, `algorithms.0.sha256`) and is left
/// out when unknown.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub struct ConfigError {
    /// The file name as shown to the user.
    pub file: String,
    /// Where in the file (or command line) the error is.
    pub location: Location,
    /// The dotted key path, empty when not known.
    pub key: String,
    /// The error class.
    pub kind: ErrorKind,
    /// What is wrong and what is allowed.
    pub message: String,
}

impl ConfigError {
    pub(crate) fn new(
        file: &str,
        location: Location,
        key: impl Into<String>,
        kind: ErrorKind,
        message: impl Into<String>,
    ) -> Self {
        ConfigError {
            file: file.to_string(),
            location,
            key: key.into(),
            kind,
            message: message.into(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.location {
            Location::File { line, column } => write!(f, "{}:{}:{}: ", self.file, line, column)?,
            Location::Override(arg) => write!(f, "{}: --set {}: ", self.file, arg)?,
            Location::Unknown => write!(f, "{}: ", self.file)?,
        }
        if !self.key.is_empty() {
            write!(f, "{}: ", self.key)?;
        }
        f.write_str(&self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_formats() {
        let e = ConfigError::new(
            "trainer.toml",
            Location::File {
                line: 12,
                column: 6,
            },
            "optimizer.lr",
            ErrorKind::InvalidValue,
            "must be > 0, got -0.1",
        );
        assert_eq!(
            e.to_string(),
            "trainer.toml:12:6: optimizer.lr: must be > 0, got -0.1"
        );
        let e = ConfigError::new(
            "t.toml",
            Location::Override("optimizer.lr=-1".into()),
            "optimizer.lr",
            ErrorKind::InvalidValue,
            "must be > 0, got -1",
        );
        assert_eq!(
            e.to_string(),
            "t.toml: --set optimizer.lr=-1: optimizer.lr: must be > 0, got -1"
        );
        let e = ConfigError::new("t.toml", Location::Unknown, "", ErrorKind::Io, "gone");
        assert_eq!(e.to_string(), "t.toml: gone");
        assert_eq!(e.location.line(), None);
    }
}
