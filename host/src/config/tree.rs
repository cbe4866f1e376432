//! A small TOML value tree that remembers where every key and value came
//! from (a file position or a `--set` argument), built from a spanned
//! `toml_edit` document and edited by overrides.

use super::error::{ConfigError, ErrorKind, Location};
use std::ops::Range;

/// A TOML value.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Val {
    Str(String),
    Int(i64),
    Float(f64),
    Bool(bool),
    Datetime(String),
    Array(Vec<Node>),
    Table(Table),
}

/// A value and where it came from.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Node {
    pub val: Val,
    pub loc: Location,
}

/// One `key = value` of a table.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Entry {
    pub key: String,
    pub key_loc: Location,
    pub node: Node,
}

/// A table, in document order.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Table {
    pub entries: Vec<Entry>,
}

impl Table {
    pub fn get(&self, key: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.key == key)
    }

    fn get_mut(&mut self, key: &str) -> Option<&mut Entry> {
        self.entries.iter_mut().find(|e| e.key == key)
    }
}

impl Val {
    /// The TOML type with an article, for messages ("an integer").
    pub fn type_name(&self) -> &'static str {
        match self {
            Val::Str(_) => "a string",
            Val::Int(_) => "an integer",
            Val::Float(_) => "a float",
            Val::Bool(_) => "a boolean",
            Val::Datetime(_) => "a datetime",
            Val::Array(_) => "an array",
            Val::Table(_) => "a table",
        }
    }

    /// The type and, for scalars, the value: `a string ("abc")`.
    pub fn describe(&self) -> String {
        match self {
            Val::Str(s) => format!("a string ({s:?})"),
            Val::Int(i) => format!("an integer ({i})"),
            Val::Float(f) => format!("a float ({})", fmt_float(*f)),
            Val::Bool(b) => format!("a boolean ({b})"),
            Val::Datetime(d) => format!("a datetime ({d})"),
            Val::Array(_) | Val::Table(_) => self.type_name().to_string(),
        }
    }
}

/// Formats a float the way it would be written in TOML.
pub(crate) fn fmt_float(f: f64) -> String {
    if f.is_nan() {
        "nan".into()
    } else if f.is_infinite() {
        if f > 0.0 { "inf" } else { "-inf" }.into()
    } else if f == f.trunc() && f.abs() < 1e15 {
        format!("{f:.1}")
    } else {
        format!("{f}")
    }
}

/// Maps byte offsets of a source text to 1-based line/column.
pub(crate) struct SourceMap<'a> {
    text: &'a str,
    line_starts: Vec<usize>,
}

impl<'a> SourceMap<'a> {
    pub fn new(text: &'a str) -> Self {
        let mut line_starts = vec![0];
        line_starts.extend(text.match_indices('\n').map(|(i, _)| i + 1));
        SourceMap { text, line_starts }
    }

    /// 1-based (line, column) of a byte offset; the column counts characters.
    pub fn line_col(&self, offset: usize) -> (usize, usize) {
        let offset = offset.min(self.text.len());
        let line = match self.line_starts.binary_search(&offset) {
            Ok(i) => i,
            Err(i) => i.saturating_sub(1),
        };
        let start = self.line_starts.get(line).copied().unwrap_or(0);
        let column = self
            .text
            .get(start..offset)
            .map_or(offset - start, |s| s.chars().count());
        (line + 1, column + 1)
    }

    pub fn loc(&self, span: Option<Range<usize>>, fallback: &Location) -> Location {
        match span {
            Some(span) => {
                let (line, column) = self.line_col(span.start);
                Location::File { line, column }
            }
            None => fallback.clone(),
        }
    }

    /// The text of a 1-based line, without its line break.
    pub fn line_text(&self, line: usize) -> &'a str {
        let start = self.line_starts.get(line.wrapping_sub(1)).copied();
        let end = self
            .line_starts
            .get(line)
            .copied()
            .unwrap_or(self.text.len());
        match start {
            Some(start) => self
                .text
                .get(start..end)
                .unwrap_or("")
                .trim_end_matches(['\n', '\r']),
            None => "",
        }
    }
}

/// Builds the tree of a parsed document.
pub(crate) fn from_document(doc: &toml_edit::ImDocument<&str>, map: &SourceMap<'_>) -> Node {
    let root_loc = Location::File { line: 1, column: 1 };
    Node {
        val: Val::Table(from_table(doc.as_table(), map)),
        loc: root_loc,
    }
}

fn from_table(t: &toml_edit::Table, map: &SourceMap<'_>) -> Table {
    let mut entries = Vec::new();
    for (name, _) in t.iter() {
        let Some((key, item)) = t.get_key_value(name) else {
            continue;
        };
        let key_loc = map.loc(key.span(), &Location::Unknown);
        if let Some(node) = from_item(item, map, &key_loc) {
            entries.push(Entry {
                key: name.to_string(),
                key_loc,
                node,
            });
        }
    }
    Table { entries }
}

fn from_inline(t: &toml_edit::InlineTable, map: &SourceMap<'_>) -> Table {
    let mut entries = Vec::new();
    for (name, _) in t.iter() {
        let Some((key, item)) = t.get_key_value(name) else {
            continue;
        };
        let key_loc = map.loc(key.span(), &Location::Unknown);
        if let Some(node) = from_item(item, map, &key_loc) {
            entries.push(Entry {
                key: name.to_string(),
                key_loc,
                node,
            });
        }
    }
    Table { entries }
}

fn from_item(item: &toml_edit::Item, map: &SourceMap<'_>, key_loc: &Location) -> Option<Node> {
    match item {
        toml_edit::Item::None => None,
        toml_edit::Item::Value(v) => Some(from_value(v, map, key_loc)),
        toml_edit::Item::Table(t) => Some(Node {
            val: Val::Table(from_table(t, map)),
            loc: map.loc(t.span(), key_loc),
        }),
        toml_edit::Item::ArrayOfTables(a) => {
            let items = a
                .iter()
                .map(|t| Node {
                    val: Val::Table(from_table(t, map)),
                    loc: map.loc(t.span(), key_loc),
                })
                .collect();
            Some(Node {
                val: Val::Array(items),
                loc: map.loc(a.span(), key_loc),
            })
        }
    }
}

fn from_value(v: &toml_edit::Value, map: &SourceMap<'_>, fallback: &Location) -> Node {
    use toml_edit::Value as V;
    let loc = map.loc(v.span(), fallback);
    let val = match v {
        V::String(s) => Val::Str(s.value().clone()),
        V::Integer(i) => Val::Int(*i.value()),
        V::Float(f) => Val::Float(*f.value()),
        V::Boolean(b) => Val::Bool(*b.value()),
        V::Datetime(d) => Val::Datetime(d.value().to_string()),
        V::Array(a) => Val::Array(a.iter().map(|x| from_value(x, map, &loc)).collect()),
        V::InlineTable(t) => Val::Table(from_inline(t, map)),
    };
    Node { val, loc }
}

/// Gives every node of a tree the same location (used for `--set` values).
fn relocate(node: &mut Node, loc: &Location) {
    node.loc = loc.clone();
    match &mut node.val {
        Val::Array(items) => items.iter_mut().for_each(|n| relocate(n, loc)),
        Val::Table(t) => {
            for e in &mut t.entries {
                e.key_loc = loc.clone();
                relocate(&mut e.node, loc);
            }
        }
        _ => {}
    }
}

/// Parses the value part of `--set key=value`: a TOML value, else the raw text
/// as a string.
fn parse_override_value(raw: &str, loc: &Location) -> Node {
    let trimmed = raw.trim();
    let mut node = match trimmed.parse::<toml_edit::Value>() {
        Ok(v) => {
            let text = v.to_string();
            let map = SourceMap::new(&text);
            from_value(&v, &map, loc)
        }
        Err(_) => Node {
            val: Val::Str(trimmed.to_string()),
            loc: loc.clone(),
        },
    };
    relocate(&mut node, loc);
    node
}

/// Applies one `--set key.path=value` to the tree. Missing tables on the way
/// are created; a number indexes an array (one past the end appends a table).
pub(crate) fn apply_override(root: &mut Node, arg: &str, file: &str) -> Result<(), ConfigError> {
    let loc = Location::Override(arg.to_string());
    let bad = |key: &str, msg: String| {
        ConfigError::new(file, loc.clone(), key, ErrorKind::BadOverride, msg)
    };
    let Some((path, raw)) = arg.split_once('=') else {
        return Err(bad(
            "",
            "expected KEY=VALUE, such as optimizer.lr=0.05".to_string(),
        ));
    };
    let segs: Vec<&str> = path.trim().split('.').map(str::trim).collect();
    if segs.iter().any(|s| s.is_empty()) {
        return Err(bad(
            path.trim(),
            "empty key segment; use a dotted path such as train.max_duration".to_string(),
        ));
    }
    // Keys are at most a few levels deep (`algorithms.0.smoothing`); a bound keeps the
    // recursive walk below from exhausting the stack on a hostile argument.
    const MAX_DEPTH: usize = 32;
    if segs.len() > MAX_DEPTH {
        return Err(bad(
            "",
            format!(
                "the key has {} dotted parts; at most {MAX_DEPTH} are allowed",
                segs.len()
            ),
        ));
    }
    let value = parse_override_value(raw, &loc);
    set_path(root, &segs, 0, value, &loc).map_err(|(at, msg)| bad(&segs[..=at].join("."), msg))
}

fn set_path(
    node: &mut Node,
    segs: &[&str],
    depth: usize,
    value: Node,
    loc: &Location,
) -> Result<(), (usize, String)> {
    let seg = segs[depth];
    let last = depth + 1 == segs.len();
    // Only built for an error message: building it at every depth made a long key quadratic.
    let here = || {
        if depth == 0 {
            "the top level".to_string()
        } else {
            format!("`{}`", segs[..depth].join("."))
        }
    };
    match &mut node.val {
        Val::Table(t) => {
            if last {
                match t.get_mut(seg) {
                    Some(e) => {
                        e.key_loc = loc.clone();
                        e.node = value;
                    }
                    None => t.entries.push(Entry {
                        key: seg.to_string(),
                        key_loc: loc.clone(),
                        node: value,
                    }),
                }
                return Ok(());
            }
            if t.get(seg).is_none() {
                // `algorithms.0.x` on a file without [[algorithms]] makes an array.
                let next_is_index = segs[depth + 1].parse::<usize>().is_ok();
                t.entries.push(Entry {
                    key: seg.to_string(),
                    key_loc: loc.clone(),
                    node: Node {
                        val: if next_is_index {
                            Val::Array(Vec::new())
                        } else {
                            Val::Table(Table::default())
                        },
                        loc: loc.clone(),
                    },
                });
            }
            match t.get_mut(seg) {
                Some(e) => set_path(&mut e.node, segs, depth + 1, value, loc),
                None => Err((depth, "internal error: key vanished".to_string())),
            }
        }
        Val::Array(items) => {
            let Ok(idx) = seg.parse::<usize>() else {
                return Err((
                    depth,
                    format!("{} is an array; index it with a number (0, 1, ...)", here()),
                ));
            };
            if idx > items.len() {
                return Err((
                    depth,
                    format!(
                        "index {idx} is out of range: {} has {} entries (use {} to append)",
                        here(),
                        items.len(),
                        items.len()
                    ),
                ));
            }
            if last {
                if idx == items.len() {
                    items.push(value);
                } else {
                    items[idx] = value;
                }
                return Ok(());
            }
            if idx == items.len() {
                items.push(Node {
                    val: Val::Table(Table::default()),
                    loc: loc.clone(),
                });
            }
            set_path(&mut items[idx], segs, depth + 1, value, loc)
        }
        other => Err((
            depth.saturating_sub(1),
            format!(
                "{} is {}, not a table, so `{seg}` cannot be set inside it",
                here(),
                other.type_name()
            ),
        )),
    }
}

/// Converts a tree to JSON, keeping integers as integers. On failure returns
/// the dotted sub-path (relative to `node`), its location and a message.
pub(crate) fn to_json(node: &Node) -> Result<serde_json::Value, (String, Location, String)> {
    Ok(match &node.val {
        Val::Str(s) | Val::Datetime(s) => serde_json::Value::String(s.clone()),
        Val::Int(i) => serde_json::Value::from(*i),
        Val::Float(f) => match serde_json::Number::from_f64(*f) {
            Some(n) => serde_json::Value::Number(n),
            None => {
                return Err((
                    String::new(),
                    node.loc.clone(),
                    format!(
                        "{} cannot be passed to a plugin (JSON has no nan or inf)",
                        fmt_float(*f)
                    ),
                ))
            }
        },
        Val::Bool(b) => serde_json::Value::Bool(*b),
        Val::Array(items) => {
            let mut out = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                out.push(to_json(item).map_err(|(p, l, m)| (join(&i.to_string(), &p), l, m))?);
            }
            serde_json::Value::Array(out)
        }
        Val::Table(t) => {
            let mut out = serde_json::Map::new();
            for e in &t.entries {
                out.insert(
                    e.key.clone(),
                    to_json(&e.node).map_err(|(p, l, m)| (join(&e.key, &p), l, m))?,
                );
            }
            serde_json::Value::Object(out)
        }
    })
}

/// Joins two dotted paths, either of which may be empty.
pub(crate) fn join(a: &str, b: &str) -> String {
    match (a.is_empty(), b.is_empty()) {
        (true, _) => b.to_string(),
        (_, true) => a.to_string(),
        _ => format!("{a}.{b}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Node {
        let doc = toml_edit::ImDocument::parse(text).expect("test TOML parses");
        from_document(&doc, &SourceMap::new(text))
    }

    fn table(node: &Node) -> &Table {
        match &node.val {
            Val::Table(t) => t,
            other => panic!("not a table: {other:?}"),
        }
    }

    #[test]
    fn line_and_column() {
        let map = SourceMap::new("a = 1\nbé = 2\n");
        assert_eq!(map.line_col(0), (1, 1));
        assert_eq!(map.line_col(6), (2, 1));
        // "bé = " : the value starts after a two-byte character.
        assert_eq!(map.line_col(12), (2, 6));
        assert_eq!(map.line_text(2), "bé = 2");
        assert_eq!(map.line_text(9), "");
    }

    #[test]
    fn spans_of_keys_values_and_tables() {
        let text = "x = 1\n[opt]\nlr = 0.5\n[[alg]]\nplugin = \"a\"\n[[alg]]\nplugin = \"b\"\n";
        let root = parse(text);
        let t = table(&root);
        let opt = t.get("opt").expect("opt");
        assert_eq!(opt.node.loc, Location::File { line: 2, column: 1 });
        let lr = table(&opt.node).get("lr").expect("lr");
        assert_eq!(lr.key_loc, Location::File { line: 3, column: 1 });
        assert_eq!(lr.node.loc, Location::File { line: 3, column: 6 });
        let Val::Array(algs) = &t.get("alg").expect("alg").node.val else {
            panic!("alg is not an array")
        };
        assert_eq!(algs[1].loc.line(), Some(6));
    }

    #[test]
    fn override_sets_creates_and_indexes() {
        let mut root = parse("[a]\nb = 1\n[[alg]]\nx = 1\n");
        apply_override(&mut root, "a.b=2", "f").expect("set");
        apply_override(&mut root, "c.d.e=\"s\"", "f").expect("create");
        apply_override(&mut root, "alg.0.x=[1, 2]", "f").expect("index");
        apply_override(&mut root, "alg.1.x=oops{", "f").expect("append");
        let t = table(&root);
        let b = table(&t.get("a").expect("a").node).get("b").expect("b");
        assert_eq!(b.node.val, Val::Int(2));
        assert_eq!(b.node.loc, Location::Override("a.b=2".into()));
        let c = table(&t.get("c").expect("c").node);
        let d = table(&c.get("d").expect("d").node);
        assert_eq!(d.get("e").expect("e").node.val, Val::Str("s".into()));
        let Val::Array(algs) = &t.get("alg").expect("alg").node.val else {
            panic!("alg")
        };
        assert_eq!(algs.len(), 2);
        assert_eq!(
            table(&algs[1]).get("x").expect("x").node.val,
            Val::Str("oops{".into())
        );
    }

    #[test]
    fn bad_overrides() {
        let mut root = parse("a = 1\n[[alg]]\n");
        for (arg, key, needle) in [
            ("novalue", "", "KEY=VALUE"),
            ("a..b=1", "a..b", "empty key segment"),
            ("a.b=1", "a", "not a table"),
            ("alg.x=1", "alg.x", "index it with a number"),
            ("alg.5.x=1", "alg.5", "out of range"),
        ] {
            let e = apply_override(&mut root, arg, "f").expect_err(arg);
            assert_eq!(e.kind, ErrorKind::BadOverride, "{arg}");
            assert_eq!(e.key, key, "{arg}");
            assert!(e.message.contains(needle), "{arg}: {e}");
        }
    }

    #[test]
    fn json_keeps_types_and_rejects_nan() {
        let root = parse("a = 1\nb = 1.5\nc = \"s\"\nd = [true, 2]\ne = { f = 3 }\n");
        let j = to_json(&root).expect("json");
        assert_eq!(
            j,
            serde_json::json!({"a": 1, "b": 1.5, "c": "s", "d": [true, 2], "e": {"f": 3}})
        );
        assert!(j["a"].is_i64());
        let root = parse("x = { y = [1.0, nan] }\n");
        let (path, loc, _) = to_json(&root).expect_err("nan");
        assert_eq!(path, "x.y.1");
        assert_eq!(loc.line(), Some(1));
    }
}
