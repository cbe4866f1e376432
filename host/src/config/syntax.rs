//! TOML syntax errors, located and named by the key written on the offending line.

use std::collections::HashMap;

use super::error::{ConfigError, ErrorKind, Location};
use super::tree::SourceMap;

/// Turns a TOML syntax error into a located [`ConfigError`].
pub(super) fn syntax_error(
    e: &toml_edit::TomlError,
    map: &SourceMap<'_>,
    file: &str,
) -> ConfigError {
    let loc = map.loc(e.span(), &Location::Unknown);
    let key = loc.line().map(|l| key_on_line(map, l)).unwrap_or_default();
    let message: Vec<&str> = e
        .message()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    ConfigError::new(
        file,
        loc,
        key,
        ErrorKind::Syntax,
        format!("invalid TOML: {}", message.join("; ")),
    )
}

/// Best-effort dotted key written on `line` (for syntax errors, where no tree
/// exists): the last table header above it plus the key before `=`.
fn key_on_line(map: &SourceMap<'_>, line: usize) -> String {
    let clean = |s: &str| -> String {
        s.split('.')
            .map(|p| p.trim().trim_matches(['"', '\'']))
            .collect::<Vec<_>>()
            .join(".")
    };
    let is_key = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_alphanumeric() || "_-.\"' ".contains(c))
    };
    let mut header = String::new();
    let mut counts: HashMap<String, usize> = HashMap::new();
    for l in 1..line {
        let t = map.line_text(l).trim();
        if let Some(h) = t.strip_prefix("[[") {
            let name = clean(h.split("]]").next().unwrap_or(""));
            let n = counts.entry(name.clone()).or_insert(0);
            header = format!("{name}.{n}");
            *n += 1;
        } else if let Some(h) = t.strip_prefix('[') {
            header = clean(h.split(']').next().unwrap_or(""));
        }
    }
    let current = map.line_text(line).trim();
    if current.starts_with('[') {
        let h = current.trim_start_matches('[');
        let h = h.split(']').next().unwrap_or("");
        return if is_key(h) { clean(h) } else { String::new() };
    }
    match current.split_once('=') {
        Some((k, _)) if is_key(k) => super::tree::join(&header, &clean(k)),
        _ => String::new(),
    }
}
