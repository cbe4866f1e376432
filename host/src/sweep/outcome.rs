//! How a run of the sweep ended, and the end of its log: what the sweep loop records and the
//! progress view shows.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use crate::report::RunRecord;

/// How one run of the sweep ended.
#[derive(Debug, Clone)]
pub enum RunOutcome {
    /// Finished, now or in an earlier invocation: its `run.json`.
    Done(Box<RunRecord>),
    /// Its process failed: why.
    Failed(String),
    /// Stopped by a signal; it continues from its checkpoint next time.
    Interrupted,
    /// Never started (the sweep was stopped first).
    NotStarted,
}

/// The last `n` lines of a text file (read from its end).
pub(super) fn log_tail(path: &Path, n: usize) -> Vec<String> {
    let Ok(mut file) = File::open(path) else {
        return Vec::new();
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let from = len.saturating_sub(16 * 1024);
    if file.seek(SeekFrom::Start(from)).is_err() {
        return Vec::new();
    }
    let mut bytes = Vec::new();
    if file.read_to_end(&mut bytes).is_err() {
        return Vec::new();
    }
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|l| l.to_string())
        .collect()
}
