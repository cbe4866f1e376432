//! `[scheduler]`: the learning-rate schedule, read with [`Schedule`]'s own serde format
//! (its defaults live there) through the located tree.

use serde::Deserialize;

use super::data::DataConfig;
use super::de::{DeError, NodeDe};
use super::error::{ConfigError, ErrorKind};
use super::reader::{quote_list, suggest, Tbl};
use super::tree::{Node, Table, Val};
use crate::optim::schedule::Schedule;
use crate::report::Metric;

pub(super) fn read(top: &Tbl<'_>, data: &DataConfig) -> Result<Schedule, ConfigError> {
    let Some(entry) = top.entry("scheduler") else {
        return Ok(Schedule::default());
    };
    let s = Tbl::open(top.file, top.base, "scheduler", &entry.node, None)?;
    let schedule =
        Schedule::deserialize(NodeDe(&entry.node)).map_err(|e| located(&s, &entry.node, e))?;
    schedule
        .validate()
        .map_err(|e| s.err(e.field, ErrorKind::InvalidValue, e.to_string()))?;
    // `reduce_on_plateau` watches an evaluation metric this run reports.
    if let Some(monitor) = schedule.monitor() {
        let metric: Metric = monitor
            .parse()
            .map_err(|m: String| s.err("monitor", ErrorKind::InvalidValue, m))?;
        super::train::check_metric(&s, "monitor", metric, data)?;
    }
    Ok(schedule)
}

/// `e` as an error at the key it is about.
fn located(s: &Tbl<'_>, node: &Node, e: DeError) -> ConfigError {
    let schedule = match s.entry("name").map(|e| &e.node.val) {
        Some(Val::Str(n)) => format!("schedule {n:?}"),
        _ => "this schedule".to_string(),
    };
    match e {
        DeError::UnknownField { field, expected } => {
            let hint = suggest(&field, expected)
                .map(|h| format!("did you mean `{h}`? "))
                .unwrap_or_default();
            s.err_key(
                &field,
                ErrorKind::UnknownKey,
                format!(
                    "unknown key for this schedule; {hint}valid keys for {schedule}: name, {}",
                    expected.join(", ")
                ),
            )
        }
        DeError::MissingField("name") => s.missing("name", "the schedule's name"),
        DeError::MissingField(field) => ConfigError::new(
            s.file,
            s.loc.clone(),
            s.key(field),
            ErrorKind::MissingKey,
            format!("missing required key in `scheduler`; {schedule} needs it"),
        ),
        DeError::UnknownVariant { variant, expected } => {
            let hint = suggest(&variant, expected)
                .map(|h| format!(" (did you mean {h:?}?)"))
                .unwrap_or_default();
            // Not the schedule's name: the value of one of its keys (`decay_shape`).
            let is_name = matches!(
                s.entry("name").map(|e| &e.node.val),
                Some(Val::Str(n)) if *n == variant
            );
            let error = DeError::UnknownVariant {
                variant: variant.clone(),
                expected,
            };
            if let Some(key) = (!is_name).then(|| culprit(node, &error)).flatten() {
                return s.err(
                    &key,
                    ErrorKind::InvalidValue,
                    format!(
                        "unknown value {variant:?}{hint} for {schedule}; expected {}",
                        quote_list(expected)
                    ),
                );
            }
            s.err(
                "name",
                ErrorKind::InvalidValue,
                format!(
                    "unknown schedule {variant:?}{hint}; expected {}",
                    quote_list(expected)
                ),
            )
        }
        DeError::Other(message) => match culprit(node, &DeError::Other(message.clone())) {
            Some(key) => s.err(&key, ErrorKind::InvalidValue, message),
            None => ConfigError::new(
                s.file,
                s.loc.clone(),
                "scheduler",
                ErrorKind::InvalidValue,
                message,
            ),
        },
    }
}

/// The key a value error is about: the first key whose removal changes the error (serde
/// stops at the first bad value, and reports missing keys only after every present one).
fn culprit(node: &Node, error: &DeError) -> Option<String> {
    let Val::Table(table) = &node.val else {
        return None;
    };
    table
        .entries
        .iter()
        .filter(|e| e.key != "name")
        .find(|entry| {
            let without = Node {
                val: Val::Table(Table {
                    entries: table
                        .entries
                        .iter()
                        .filter(|e| e.key != entry.key)
                        .cloned()
                        .collect(),
                }),
                loc: node.loc.clone(),
            };
            Schedule::deserialize(NodeDe(&without)).err().as_ref() != Some(error)
        })
        .map(|e| e.key.clone())
}
