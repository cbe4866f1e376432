//! `[scheduler]`: the learning-rate schedule.

use super::error::{ConfigError, ErrorKind, Location};
use super::reader::{quote_list, Tbl};
use super::tree::{Node, Val};
use crate::optim::schedule::Schedule;

/// The first `` `word` `` quoted in a serde message after `marker`.
fn quoted_after<'m>(message: &'m str, marker: &str) -> Option<&'m str> {
    let rest = &message[message.find(marker)? + marker.len()..];
    let rest = rest.strip_prefix('`')?;
    rest.split('`').next()
}

/// Whether a serde message quotes a value of `node` (or of its items).
fn mentions(node: &Node, msg: &str) -> bool {
    let forms = match &node.val {
        Val::Str(v) | Val::Datetime(v) => vec![format!("{v:?}")],
        Val::Int(i) => vec![format!("`{i}`"), format!("number {i}")],
        Val::Float(f) => vec![format!("`{f}`"), format!("number {f}")],
        Val::Bool(b) => vec![format!("`{b}`")],
        Val::Array(items) => return items.iter().any(|n| mentions(n, msg)),
        Val::Table(t) => return t.entries.iter().any(|e| mentions(&e.node, msg)),
    };
    forms.iter().any(|f| msg.contains(f.as_str()))
}

pub(super) fn read(top: &Tbl<'_>) -> Result<Schedule, ConfigError> {
    use serde::Deserialize;
    let Some(entry) = top.entry("scheduler") else {
        let mut t = toml::map::Map::new();
        t.insert("name".into(), toml::Value::String("constant".into()));
        return Schedule::deserialize(toml::Value::Table(t)).map_err(|e| {
            ConfigError::new(
                top.file,
                Location::Unknown,
                "scheduler",
                ErrorKind::InvalidValue,
                format!("the default schedule is rejected: {}", e.message()),
            )
        });
    };
    let s = Tbl::open(top.file, top.base, "scheduler", &entry.node, None)?;
    let one_line = |m: &str| m.lines().map(str::trim).collect::<Vec<_>>().join(" ");
    let schedule = Schedule::deserialize(super::tree::to_toml(&entry.node)).map_err(|e| {
        let msg = one_line(e.message());
        if let Some(k) = quoted_after(&msg, "unknown field ") {
            s.err_key(
                k,
                ErrorKind::UnknownKey,
                format!("unknown key for this schedule: {msg}"),
            )
        } else if let Some(k) = quoted_after(&msg, "missing field ") {
            if k == "name" {
                s.missing(k, "the schedule's name")
            } else {
                let name = match s.entry("name").map(|e| &e.node.val) {
                    Some(Val::Str(n)) => format!("schedule {n:?}"),
                    _ => "this schedule".to_string(),
                };
                ConfigError::new(
                    top.file,
                    s.loc.clone(),
                    s.key(k),
                    ErrorKind::MissingKey,
                    format!("missing required key in `scheduler`; {name} needs it"),
                )
            }
        } else if let Some(v) = quoted_after(&msg, "unknown variant ") {
            let names: Vec<&str> = msg
                .split_once("expected")
                .map(|(_, rest)| rest.split('`').skip(1).step_by(2).collect())
                .unwrap_or_default();
            let hint = super::reader::suggest(v, &names)
                .map(|h| format!(" (did you mean {h:?}?)"))
                .unwrap_or_default();
            s.err(
                "name",
                ErrorKind::InvalidValue,
                format!(
                    "unknown schedule {v:?}{hint}; expected {}",
                    quote_list(&names)
                ),
            )
        } else {
            // Point at the first key the message quotes, else at the first
            // value it quotes, else at the table.
            let key = msg
                .split('`')
                .skip(1)
                .step_by(2)
                .find(|k| s.entry(k).is_some())
                .map(str::to_string)
                .or_else(|| {
                    s.table
                        .entries
                        .iter()
                        .find(|e| e.key != "name" && mentions(&e.node, &msg))
                        .map(|e| e.key.clone())
                });
            match key {
                Some(k) => s.err(&k, ErrorKind::InvalidValue, msg.clone()),
                None => ConfigError::new(
                    top.file,
                    s.loc.clone(),
                    "scheduler",
                    ErrorKind::InvalidValue,
                    msg.clone(),
                ),
            }
        }
    })?;
    schedule.validate().map_err(|msg| {
        let key = msg
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .find(|k| !k.is_empty() && k != &"name" && s.entry(k).is_some());
        match key {
            Some(k) => s.err(k, ErrorKind::InvalidValue, msg.clone()),
            None => ConfigError::new(
                top.file,
                s.loc.clone(),
                "scheduler",
                ErrorKind::InvalidValue,
                msg.clone(),
            ),
        }
    })?;
    Ok(schedule)
}
