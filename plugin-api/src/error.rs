//! The error a method returns to the host.

use abi_stable::std_types::{RResult, RString};

use crate::abi::{ErrorKind, PluginError};

/// An error a method returns to the host.
#[derive(Debug, Clone)]
pub struct Error {
    pub(crate) kind: ErrorKind,
    pub(crate) message: String,
}

impl Error {
    /// An error of the given kind.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error {
            kind,
            message: message.into(),
        }
    }

    /// An error in the method's settings.
    pub fn config(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::CONFIG, message)
    }

    /// The kind of error.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.kind.name(), self.message)
    }
}

impl std::error::Error for Error {}

impl From<tch::TchError> for Error {
    fn from(e: tch::TchError) -> Error {
        Error::new(ErrorKind::TORCH, e.to_string())
    }
}

impl From<String> for Error {
    fn from(message: String) -> Error {
        Error::new(ErrorKind::OTHER, message)
    }
}

impl From<&str> for Error {
    fn from(message: &str) -> Error {
        Error::new(ErrorKind::OTHER, message)
    }
}

impl From<Error> for PluginError {
    fn from(e: Error) -> PluginError {
        PluginError {
            kind: e.kind,
            message: RString::from(e.message),
        }
    }
}

pub(crate) fn host_result<T>(r: RResult<T, RString>) -> Result<T, Error> {
    match r {
        RResult::ROk(v) => Ok(v),
        RResult::RErr(message) => Err(Error::new(ErrorKind::HOST, message.into_string())),
    }
}
