//! A method's checkpoint state, written and read back with errors that name the method.

use serde::de::DeserializeOwned;
use serde::Serialize;
use tch::Tensor;

use crate::{Error, State};

/// A [`State`] of format `format_version` whose bytes are `counters` as JSON, with `tensors`.
/// `method` names the method in an error.
pub fn json_state<T: Serialize>(
    method: &str,
    format_version: u32,
    counters: &T,
    tensors: Vec<(String, Tensor)>,
) -> Result<State, Error> {
    let bytes = serde_json::to_vec(counters)
        .map_err(|e| Error::from(format!("{method} state: cannot write its counters: {e}")))?;
    Ok(State {
        format_version,
        bytes,
        tensors,
    })
}

/// A method's [`State`] from a checkpoint, being read: its format checked on opening, its
/// bytes read as JSON or a number, its tensors taken by prefix, and any tensor left over an
/// error. Every error names the method.
///
/// ```
/// # use tessera_plugin_api::{kit::StateReader, State, Error};
/// # fn f(state: State) -> Result<(), Error> {
/// let mut reader = StateReader::open("lookahead", state, 1)?;
/// let steps: u64 = reader.json()?;
/// let slow = reader.take("slow"); // `slow/<name>` tensors, as `<name>`
/// reader.finish()?; // any other tensor is an error
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct StateReader {
    method: String,
    bytes: Vec<u8>,
    tensors: Vec<(String, Tensor)>,
}

impl StateReader {
    /// Opens `state` of `method`, which this version of the method writes in format
    /// `format_version`; another format is an error naming both.
    pub fn open(method: &str, state: State, format_version: u32) -> Result<StateReader, Error> {
        if state.format_version != format_version {
            return Err(format!(
                "{method} state format {} is unknown (this plugin reads format {format_version})",
                state.format_version
            )
            .into());
        }
        Ok(StateReader {
            method: method.to_owned(),
            bytes: state.bytes,
            tensors: state.tensors,
        })
    }

    /// The state's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The bytes read as JSON.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, Error> {
        serde_json::from_slice(&self.bytes)
            .map_err(|e| format!("{} state: bad counters: {e}", self.method).into())
    }

    /// The bytes read as one little-endian `u64` (exactly 8 bytes).
    pub fn u64(&self) -> Result<u64, Error> {
        let bytes: [u8; 8] = self.bytes.as_slice().try_into().map_err(|_| {
            format!(
                "{} state holds {} bytes, not an 8-byte number",
                self.method,
                self.bytes.len()
            )
        })?;
        Ok(u64::from_le_bytes(bytes))
    }

    /// The tensors named `<prefix>/<name>`, as `<name>`, in the order they were saved.
    pub fn take(&mut self, prefix: &str) -> Vec<(String, Tensor)> {
        let prefix = format!("{prefix}/");
        let (taken, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.tensors)
            .into_iter()
            .partition(|(name, _)| name.starts_with(&prefix));
        self.tensors = rest;
        taken
            .into_iter()
            .map(|(name, t)| (name[prefix.len()..].to_owned(), t))
            .collect()
    }

    /// Every tensor not taken yet, by its saved name.
    pub fn take_all(&mut self) -> Vec<(String, Tensor)> {
        std::mem::take(&mut self.tensors)
    }

    /// Ends the reading: a tensor no [`StateReader::take`] claimed is an error naming it.
    pub fn finish(self) -> Result<(), Error> {
        match self.tensors.first() {
            None => Ok(()),
            Some((name, _)) => {
                Err(format!("{} state: unexpected tensor `{name}`", self.method).into())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(format_version: u32, bytes: &[u8], names: &[&str]) -> State {
        State {
            format_version,
            bytes: bytes.to_vec(),
            tensors: names
                .iter()
                .map(|n| ((*n).to_owned(), Tensor::from_slice(&[1.0f32])))
                .collect(),
        }
    }

    #[test]
    fn reads_counters_and_tensors_by_prefix() {
        let saved = json_state("m", 2, &(3u64, true), vec![]).unwrap();
        let mut s = state(2, &saved.bytes, &["slow/a", "slow/b.c", "fast/a"]);
        s.tensors.swap(0, 2);
        let mut r = StateReader::open("m", s, 2).unwrap();
        assert_eq!(r.json::<(u64, bool)>().unwrap(), (3, true));
        let slow: Vec<String> = r.take("slow").into_iter().map(|(n, _)| n).collect();
        assert_eq!(slow, ["b.c", "a"]);
        assert_eq!(r.take("fast").len(), 1);
        r.finish().unwrap();
    }

    #[test]
    fn errors_name_the_method_and_what_is_wrong() {
        let err = StateReader::open("EMA", state(3, b"", &[]), 1).unwrap_err();
        assert!(
            err.message()
                .contains("EMA state format 3 is unknown (this plugin reads format 1)"),
            "{err}"
        );
        let r = StateReader::open("sam", state(1, b"1234", &[]), 1).unwrap();
        assert!(r
            .u64()
            .unwrap_err()
            .message()
            .contains("sam state holds 4 bytes"));
        assert!(r.json::<u64>().is_ok());
        let r = StateReader::open("swa", state(1, b"{", &["weights"]), 1).unwrap();
        assert!(r
            .json::<u64>()
            .unwrap_err()
            .message()
            .contains("bad counters"));
        let err = r.finish().unwrap_err();
        assert!(
            err.message()
                .contains("swa state: unexpected tensor `weights`"),
            "{err}"
        );
        let r = StateReader::open("sam", state(1, &7u64.to_le_bytes(), &[]), 1).unwrap();
        assert_eq!(r.u64().unwrap(), 7);
    }
}
