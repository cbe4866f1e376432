//! Typed, located reads from one table of the tree: every failure becomes a
//! [`ConfigError`] that names the dotted key and where it was written.

use std::fmt::Display;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use super::error::{ConfigError, ErrorKind, Location};
use super::tree::{fmt_float, join, Entry, Node, Table, Val};
use crate::time::Time;

/// Units that count training progress.
pub(crate) const COUNT_UNITS: &[&str] = &["ep", "ba", "sp", "tok", "iter"];
/// Count units plus `dur`, a fraction of `max_duration`.
pub(crate) const INTERVAL_UNITS: &[&str] = &["ep", "ba", "sp", "tok", "iter", "dur"];

/// Bounds of a float setting; `(value, inclusive)`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    pub lo: Option<(f64, bool)>,
    pub hi: Option<(f64, bool)>,
}

impl Bounds {
    /// `> 0`
    pub const POSITIVE: Bounds = Bounds {
        lo: Some((0.0, false)),
        hi: None,
    };
    /// `>= 0`
    pub const NON_NEGATIVE: Bounds = Bounds {
        lo: Some((0.0, true)),
        hi: None,
    };
    /// `[0, 1]`
    pub const UNIT: Bounds = Bounds {
        lo: Some((0.0, true)),
        hi: Some((1.0, true)),
    };
    /// `[0, 1)`
    pub const UNIT_OPEN: Bounds = Bounds {
        lo: Some((0.0, true)),
        hi: Some((1.0, false)),
    };
    /// `[0, 0.5]`
    pub const HALF: Bounds = Bounds {
        lo: Some((0.0, true)),
        hi: Some((0.5, true)),
    };
    /// Any finite number.
    pub const ANY: Bounds = Bounds { lo: None, hi: None };

    fn contains(&self, v: f64) -> bool {
        let lo_ok = match self.lo {
            Some((lo, true)) => v >= lo,
            Some((lo, false)) => v > lo,
            None => true,
        };
        let hi_ok = match self.hi {
            Some((hi, true)) => v <= hi,
            Some((hi, false)) => v < hi,
            None => true,
        };
        lo_ok && hi_ok
    }

    fn describe(&self) -> String {
        let n = |x: f64| {
            if x == x.trunc() {
                format!("{x:.0}")
            } else {
                format!("{x}")
            }
        };
        match (self.lo, self.hi) {
            (Some((lo, li)), Some((hi, hi_inc))) => format!(
                "be in {}{}, {}{}",
                if li { "[" } else { "(" },
                n(lo),
                n(hi),
                if hi_inc { "]" } else { ")" }
            ),
            (Some((lo, true)), None) => format!("be >= {}", n(lo)),
            (Some((lo, false)), None) => format!("be > {}", n(lo)),
            (None, Some((hi, true))) => format!("be <= {}", n(hi)),
            (None, Some((hi, false))) => format!("be < {}", n(hi)),
            (None, None) => "be a finite number".to_string(),
        }
    }
}

/// A table being read, with its dotted path and location.
pub(crate) struct Tbl<'a> {
    pub file: &'a str,
    /// The folder relative paths resolve against.
    pub base: &'a Path,
    pub path: String,
    pub table: &'a Table,
    pub loc: Location,
}

/// Ranks `candidates` by similarity to `key`; returns the closest when close.
pub(crate) fn suggest<'k>(key: &str, candidates: &[&'k str]) -> Option<&'k str> {
    fn distance(a: &str, b: &str) -> usize {
        let b: Vec<char> = b.chars().collect();
        let mut prev: Vec<usize> = (0..=b.len()).collect();
        for (i, ca) in a.chars().enumerate() {
            let mut cur = vec![i + 1];
            for (j, cb) in b.iter().enumerate() {
                let sub = prev[j] + usize::from(ca != *cb);
                cur.push(sub.min(prev[j + 1] + 1).min(cur[j] + 1));
            }
            prev = cur;
        }
        prev[b.len()]
    }
    candidates
        .iter()
        .map(|c| (distance(key, c), *c))
        .filter(|(d, c)| {
            (*d <= 2.max(c.len() / 3) && *d < c.len())
                || (key.len() >= 3 && (c.starts_with(key) || key.starts_with(c)))
        })
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// Quotes each choice for messages: `"a", "b" or "c"`.
pub(crate) fn quote_list(items: &[&str]) -> String {
    let quoted: Vec<String> = items.iter().map(|s| format!("{s:?}")).collect();
    match quoted.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {}", rest.join(", "), last),
        Some((last, _)) => last.clone(),
        None => String::new(),
    }
}

impl<'a> Tbl<'a> {
    /// Opens `node` as the table `path`, rejecting keys not in `allowed`.
    /// `allowed = None` accepts any key.
    pub fn open(
        file: &'a str,
        base: &'a Path,
        path: &str,
        node: &'a Node,
        allowed: Option<&[&str]>,
    ) -> Result<Tbl<'a>, ConfigError> {
        let Val::Table(table) = &node.val else {
            return Err(ConfigError::new(
                file,
                node.loc.clone(),
                path,
                ErrorKind::WrongType,
                format!("expected a table, got {}", node.val.describe()),
            ));
        };
        let tbl = Tbl {
            file,
            base,
            path: path.to_string(),
            table,
            loc: node.loc.clone(),
        };
        if let Some(allowed) = allowed {
            if let Some(e) = table
                .entries
                .iter()
                .find(|e| !allowed.contains(&e.key.as_str()))
            {
                let hint = suggest(&e.key, allowed)
                    .map(|s| format!("did you mean `{s}`? "))
                    .unwrap_or_default();
                let place = if path.is_empty() {
                    "at the top level".to_string()
                } else {
                    format!("in `{path}`")
                };
                return Err(tbl.err_key(
                    &e.key,
                    ErrorKind::UnknownKey,
                    format!(
                        "unknown key; {hint}valid keys {place}: {}",
                        allowed.join(", ")
                    ),
                ));
            }
        }
        Ok(tbl)
    }

    /// The dotted path of `key` in this table.
    pub fn key(&self, key: &str) -> String {
        join(&self.path, key)
    }

    pub fn entry(&self, key: &str) -> Option<&'a Entry> {
        self.table.get(key)
    }

    /// An error about the value of `key` (at the value, or at the table when
    /// the key is absent).
    pub fn err(&self, key: &str, kind: ErrorKind, msg: impl Into<String>) -> ConfigError {
        let loc = self
            .entry(key)
            .map_or_else(|| self.loc.clone(), |e| e.node.loc.clone());
        ConfigError::new(self.file, loc, self.key(key), kind, msg)
    }

    /// An error about the key itself (at the key).
    pub fn err_key(&self, key: &str, kind: ErrorKind, msg: impl Into<String>) -> ConfigError {
        let loc = self
            .entry(key)
            .map_or_else(|| self.loc.clone(), |e| e.key_loc.clone());
        ConfigError::new(self.file, loc, self.key(key), kind, msg)
    }

    /// A missing required key; `what` says what is expected.
    pub fn missing(&self, key: &str, what: &str) -> ConfigError {
        let place = if self.path.is_empty() {
            String::new()
        } else {
            format!(" in `{}`", self.path)
        };
        ConfigError::new(
            self.file,
            self.loc.clone(),
            self.key(key),
            ErrorKind::MissingKey,
            format!("missing required key{place}; expected {what}"),
        )
    }

    pub(super) fn wrong_type(&self, key: &str, node: &Node, expected: &str) -> ConfigError {
        ConfigError::new(
            self.file,
            node.loc.clone(),
            self.key(key),
            ErrorKind::WrongType,
            format!("expected {expected}, got {}", node.val.describe()),
        )
    }

    /// Rejects `key` if present: it does not apply, `why` says when it does.
    pub fn reject(&self, key: &str, why: &str) -> Result<(), ConfigError> {
        match self.entry(key) {
            Some(_) => Err(self.err_key(key, ErrorKind::UnknownKey, why.to_string())),
            None => Ok(()),
        }
    }

    /// A sub-table, if present.
    pub fn sub(&self, key: &str, allowed: Option<&[&str]>) -> Result<Option<Tbl<'a>>, ConfigError> {
        match self.entry(key) {
            Some(e) => Tbl::open(self.file, self.base, &self.key(key), &e.node, allowed).map(Some),
            None => Ok(None),
        }
    }

    pub fn bool(&self, key: &str) -> Result<Option<bool>, ConfigError> {
        match self.entry(key) {
            None => Ok(None),
            Some(e) => match e.node.val {
                Val::Bool(b) => Ok(Some(b)),
                _ => Err(self.wrong_type(key, &e.node, "true or false")),
            },
        }
    }

    pub fn string(&self, key: &str) -> Result<Option<String>, ConfigError> {
        match self.entry(key) {
            None => Ok(None),
            Some(e) => match &e.node.val {
                Val::Str(s) => Ok(Some(s.clone())),
                _ => Err(self.wrong_type(key, &e.node, "a string")),
            },
        }
    }

    /// A path, resolved against the file's folder.
    pub fn path(&self, key: &str) -> Result<Option<PathBuf>, ConfigError> {
        Ok(self.string(key)?.map(|p| self.base.join(p)))
    }

    /// A list of paths, each resolved against the file's folder.
    pub fn path_list(&self, key: &str) -> Result<Option<Vec<PathBuf>>, ConfigError> {
        Ok(self
            .string_list(key)?
            .map(|l| l.into_iter().map(|p| self.base.join(p)).collect()))
    }

    /// A string parsed by `T::from_str`, whose error says what is allowed; `expected`
    /// describes the accepted forms for a value of the wrong type.
    pub fn parse<T: FromStr>(&self, key: &str, expected: &str) -> Result<Option<T>, ConfigError>
    where
        T::Err: Display,
    {
        let Some(e) = self.entry(key) else {
            return Ok(None);
        };
        let Val::Str(s) = &e.node.val else {
            return Err(self.wrong_type(key, &e.node, expected));
        };
        s.parse::<T>()
            .map(Some)
            .map_err(|m| self.err(key, ErrorKind::InvalidValue, m.to_string()))
    }

    /// A duration string greater than zero in one of `units`.
    pub fn time(&self, key: &str, units: &[&str]) -> Result<Option<Time>, ConfigError> {
        let Some(entry) = self.entry(key) else {
            return Ok(None);
        };
        let examples = "such as \"3ep\", \"500ba\" or \"0.5dur\"";
        let Val::Str(s) = &entry.node.val else {
            return Err(self.err(
                key,
                ErrorKind::WrongType,
                format!(
                    "expected a duration string {examples}, got {}",
                    entry.node.val.describe()
                ),
            ));
        };
        let time = s
            .parse::<Time>()
            .map_err(|e| self.err(key, ErrorKind::InvalidValue, e.to_string()))?;
        let unit = time.unit().suffix();
        if !units.contains(&unit) {
            return Err(self.err(
                key,
                ErrorKind::InvalidValue,
                format!(
                    "unit {unit:?} is not allowed here; use {}",
                    quote_list(units)
                ),
            ));
        }
        if time.value_f64() <= 0.0 {
            return Err(self.err(
                key,
                ErrorKind::InvalidValue,
                format!("must be greater than zero, got {s:?}"),
            ));
        }
        Ok(Some(time))
    }

    pub(super) fn uint_of(&self, key: &str, node: &Node, min: u64) -> Result<usize, ConfigError> {
        let expected = if min == 0 {
            "a non-negative integer".to_string()
        } else {
            format!("an integer >= {min}")
        };
        let Val::Int(i) = node.val else {
            return Err(self.wrong_type(key, node, &expected));
        };
        match u64::try_from(i) {
            Ok(u) if u >= min => usize::try_from(u).map_err(|_| {
                ConfigError::new(
                    self.file,
                    node.loc.clone(),
                    self.key(key),
                    ErrorKind::InvalidValue,
                    format!("{u} is too large"),
                )
            }),
            _ => Err(ConfigError::new(
                self.file,
                node.loc.clone(),
                self.key(key),
                ErrorKind::InvalidValue,
                format!("must be >= {min}, got {i}"),
            )),
        }
    }

    /// A non-negative integer `>= min`.
    pub fn uint(&self, key: &str, min: u64) -> Result<Option<usize>, ConfigError> {
        match self.entry(key) {
            None => Ok(None),
            Some(e) => self.uint_of(key, &e.node, min).map(Some),
        }
    }

    /// An integer of any sign.
    pub fn int(&self, key: &str) -> Result<Option<i64>, ConfigError> {
        match self.entry(key) {
            None => Ok(None),
            Some(e) => match e.node.val {
                Val::Int(i) => Ok(Some(i)),
                _ => Err(self.wrong_type(key, &e.node, "an integer")),
            },
        }
    }

    /// An integer of any sign that fits a u64 (seeds).
    pub fn u64(&self, key: &str) -> Result<Option<u64>, ConfigError> {
        match self.entry(key) {
            None => Ok(None),
            Some(e) => {
                let Val::Int(i) = e.node.val else {
                    return Err(self.wrong_type(key, &e.node, "a non-negative integer"));
                };
                u64::try_from(i).map(Some).map_err(|_| {
                    self.err(
                        key,
                        ErrorKind::InvalidValue,
                        format!("must be >= 0, got {i}"),
                    )
                })
            }
        }
    }

    fn float_of(&self, key: &str, node: &Node, bounds: Bounds) -> Result<f64, ConfigError> {
        let v = match node.val {
            Val::Float(f) => f,
            Val::Int(i) => i as f64,
            _ => return Err(self.wrong_type(key, node, "a number")),
        };
        let shown = match node.val {
            Val::Int(i) => i.to_string(),
            _ => fmt_float(v),
        };
        if !v.is_finite() {
            return Err(ConfigError::new(
                self.file,
                node.loc.clone(),
                self.key(key),
                ErrorKind::InvalidValue,
                format!("must be a finite number, got {shown}"),
            ));
        }
        if !bounds.contains(v) {
            return Err(ConfigError::new(
                self.file,
                node.loc.clone(),
                self.key(key),
                ErrorKind::InvalidValue,
                format!("must {}, got {shown}", bounds.describe()),
            ));
        }
        Ok(v)
    }

    /// A number (integer or float) within `bounds`.
    pub fn float(&self, key: &str, bounds: Bounds) -> Result<Option<f64>, ConfigError> {
        match self.entry(key) {
            None => Ok(None),
            Some(e) => self.float_of(key, &e.node, bounds).map(Some),
        }
    }

    /// The array under `key`, if present (a type error otherwise).
    fn array(&self, key: &str, expected: &str) -> Result<Option<&'a [Node]>, ConfigError> {
        match self.entry(key) {
            None => Ok(None),
            Some(e) => match &e.node.val {
                Val::Array(items) => Ok(Some(items)),
                _ => Err(self.wrong_type(key, &e.node, expected)),
            },
        }
    }

    /// A list of numbers within `bounds`; a single number counts as a list of one.
    pub fn float_list(&self, key: &str, bounds: Bounds) -> Result<Option<Vec<f64>>, ConfigError> {
        if let Some(e) = self.entry(key) {
            if matches!(e.node.val, Val::Int(_) | Val::Float(_)) {
                return self.float_of(key, &e.node, bounds).map(|v| Some(vec![v]));
            }
        }
        let Some(items) = self.array(key, "a number or an array of numbers")? else {
            return Ok(None);
        };
        items
            .iter()
            .enumerate()
            .map(|(i, n)| self.float_of(&join(key, &i.to_string()), n, bounds))
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// A list of integers `>= min`.
    pub fn uint_list(&self, key: &str, min: u64) -> Result<Option<Vec<usize>>, ConfigError> {
        let Some(items) = self.array(key, "an array of integers")? else {
            return Ok(None);
        };
        items
            .iter()
            .enumerate()
            .map(|(i, n)| self.uint_of(&join(key, &i.to_string()), n, min))
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// A list of strings.
    pub fn string_list(&self, key: &str) -> Result<Option<Vec<String>>, ConfigError> {
        let Some(items) = self.array(key, "an array of strings")? else {
            return Ok(None);
        };
        items
            .iter()
            .enumerate()
            .map(|(i, n)| match &n.val {
                Val::Str(s) => Ok(s.clone()),
                _ => Err(self.wrong_type(&join(key, &i.to_string()), n, "a string")),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// One of a fixed set of strings; `what` names the kind ("model").
    pub fn choice<T: Copy>(
        &self,
        key: &str,
        what: &str,
        choices: &[(&str, T)],
    ) -> Result<Option<T>, ConfigError> {
        let names: Vec<&str> = choices.iter().map(|(n, _)| *n).collect();
        let Some(s) = self.string(key).map_err(|mut e| {
            e.message = format!("{}; expected one of {}", e.message, quote_list(&names));
            e
        })?
        else {
            return Ok(None);
        };
        match choices.iter().find(|(n, _)| *n == s) {
            Some((_, v)) => Ok(Some(*v)),
            None => {
                let hint = suggest(&s, &names)
                    .map(|h| format!(" (did you mean {h:?}?)"))
                    .unwrap_or_default();
                Err(self.err(
                    key,
                    ErrorKind::InvalidValue,
                    format!(
                        "unknown {what} {s:?}{hint}; expected {}",
                        quote_list(&names)
                    ),
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_describe() {
        assert_eq!(Bounds::POSITIVE.describe(), "be > 0");
        assert_eq!(Bounds::NON_NEGATIVE.describe(), "be >= 0");
        assert_eq!(Bounds::UNIT.describe(), "be in [0, 1]");
        assert_eq!(Bounds::UNIT_OPEN.describe(), "be in [0, 1)");
        assert!(Bounds::UNIT_OPEN.contains(0.0));
        assert!(!Bounds::UNIT_OPEN.contains(1.0));
        assert!(!Bounds::POSITIVE.contains(f64::NAN));
    }

    #[test]
    fn suggestions() {
        assert_eq!(suggest("lrr", &["lr", "momentum"]), Some("lr"));
        assert_eq!(
            suggest("batchsize", &["batch_size", "workers"]),
            Some("batch_size")
        );
        assert_eq!(suggest("zzzzzz", &["lr", "momentum"]), None);
        assert_eq!(quote_list(&["a", "b", "c"]), "\"a\", \"b\" or \"c\"");
        assert_eq!(quote_list(&["a"]), "\"a\"");
    }
}
