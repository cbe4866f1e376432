//! The host's modules form floors: each uses only modules below it. This test reads the code
//! (every `crate::<module>` a module's files name), checks it against [`FLOORS`] and
//! [`KNOWN_UPWARD`], and checks that docs/ARCHITECTURE.md's dependency table is the one the code
//! gives; and that the files of a folder import each other (`super::<file>`) in no circle beyond
//! [`KNOWN_FILE_CIRCLES`]. A new import that runs up a floor fails here; so does removing one of the known ones
//! without taking it off the list (the list only shrinks).
//!
//! It also keeps every host file (sources, tests, benchmarks, build script) within
//! [`MAX_FILE_LINES`] and every function within [`MAX_FUNCTION_LINES`]: one concept a file, a
//! function a few named steps.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The host's top-level modules, bottom floor first: a module may use those before it.
const FLOORS: [&str; 28] = [
    "sync",
    "time",
    "files",
    "tensor_file",
    "device",
    "cost",
    "memory",
    "hf_config",
    "precision",
    "data",
    "model",
    "optim",
    "dist",
    "tracking",
    "report",
    "engine",
    "checkpoint",
    "export",
    "peft",
    "plugin",
    "config",
    "trainer",
    "generate",
    "launch",
    "explore",
    "scaffold",
    "sweep",
    "recipes",
];

/// The imports that still run up a floor, (user, used), to be taken out: none left.
const KNOWN_UPWARD: [(&str, &str); 0] = [];

/// Files of one folder that still import each other in a circle (through `super::<file>`), by
/// folder: to be taken apart, none added.
const KNOWN_FILE_CIRCLES: [(&str, &[&str]); 4] = [
    ("checkpoint", &["format", "sharded"]),
    ("data", &["decode", "folder", "source"]),
    ("data", &["fetch", "registry", "spec"]),
    ("model", &["init_weights", "weight_files"]),
];

/// `host/src`.
fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `path` (or `path` itself).
fn rust_files(path: &Path, out: &mut Vec<PathBuf>) {
    if path.is_dir() {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .map(|e| e.expect("a folder entry").path())
            .collect();
        entries.sort();
        for entry in entries {
            rust_files(&entry, out);
        }
    } else if path.is_file() && path.extension().is_some_and(|e| e == "rs") {
        out.push(path.to_owned());
    }
}

/// Each module's uses of the other modules, read from `crate::<name>` in its files (comments
/// included: a doc link to another module is a dependency of the reader's too). Tests are left
/// out (`tests.rs`, `*_tests.rs`, and a file's `#[cfg(test)] mod`): a test may use a floor above
/// to round-trip what its module makes.
fn uses() -> BTreeMap<&'static str, BTreeSet<&'static str>> {
    let mut graph = BTreeMap::new();
    for module in FLOORS {
        let mut files = Vec::new();
        rust_files(&src().join(module), &mut files);
        rust_files(&src().join(format!("{module}.rs")), &mut files);
        assert!(!files.is_empty(), "module {module} has no files");
        let mut used = BTreeSet::new();
        for text in files.iter().filter_map(|f| non_test_code(f)) {
            for name in names_after(&text, "crate::") {
                if let Some(other) = FLOORS.iter().find(|m| **m == name) {
                    if *other != module {
                        used.insert(*other);
                    }
                }
            }
        }
        graph.insert(module, used);
    }
    graph
}

/// The code of `file` that is not a test: `None` for `tests.rs` and `*_tests.rs`, else the text
/// before its `#[cfg(test)] mod` (a test may use a floor above to round-trip what its module
/// makes).
fn non_test_code(file: &Path) -> Option<String> {
    let stem = file
        .file_stem()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    if stem == "tests" || stem.ends_with("_tests") {
        return None;
    }
    let mut text = std::fs::read_to_string(file).expect("a source file");
    if let Some(at) = text.find("#[cfg(test)]\nmod ") {
        text.truncate(at);
    }
    Some(text)
}

/// The names that follow `prefix` in `text` (`crate::` → the modules named, `super::` → the
/// siblings).
fn names_after<'a>(text: &'a str, prefix: &'a str) -> impl Iterator<Item = &'a str> + 'a {
    text.match_indices(prefix).map(move |(i, _)| {
        let rest = &text[i + prefix.len()..];
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        &rest[..end]
    })
}

/// Asserts that `found` is exactly the `known` exceptions: none new, none gone (`list` names
/// the constant to update).
fn assert_ratchet<T: Ord + std::fmt::Debug>(
    found: &BTreeSet<T>,
    known: &BTreeSet<T>,
    what: &str,
    list: &str,
) {
    let new: Vec<_> = found.difference(known).collect();
    assert!(new.is_empty(), "{what}: {new:?}");
    let gone: Vec<_> = known.difference(found).collect();
    assert!(
        gone.is_empty(),
        "these are gone: take them off {list}: {gone:?}"
    );
}

fn floor(module: &str) -> usize {
    FLOORS
        .iter()
        .position(|m| *m == module)
        .expect("a module of FLOORS")
}

/// The dependency table docs/ARCHITECTURE.md holds: a line per module, bottom floor first.
fn table(graph: &BTreeMap<&str, BTreeSet<&str>>) -> String {
    let mut out = String::new();
    for module in FLOORS {
        let used: Vec<&str> = {
            let mut v: Vec<&str> = graph[module].iter().copied().collect();
            v.sort_by_key(|m| floor(m));
            v
        };
        let line = if used.is_empty() {
            format!("{module:<12}(nothing of the host)")
        } else {
            format!("{module:<12}{}", used.join(", "))
        };
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[test]
fn every_module_exists_and_no_import_runs_up_a_floor_unless_known() {
    let listed: BTreeSet<&str> = FLOORS.iter().copied().collect();
    let mut on_disk = BTreeSet::new();
    for entry in std::fs::read_dir(src()).expect("host/src") {
        let path = entry.expect("an entry").path();
        let name = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default()
            .to_owned();
        if path.is_dir() && name != "bin" || path.extension().is_some_and(|e| e == "rs") {
            on_disk.insert(name);
        }
    }
    for name in ["lib", "architecture_tests"] {
        on_disk.remove(name);
    }
    let on_disk: BTreeSet<&str> = on_disk.iter().map(String::as_str).collect();
    assert_eq!(
        on_disk, listed,
        "a module missing from FLOORS (or gone from host/src)"
    );
    let graph = uses();
    let mut upward = BTreeSet::new();
    for (module, used) in &graph {
        for other in used {
            if floor(other) > floor(module) {
                upward.insert((*module, *other));
            }
        }
    }
    let known: BTreeSet<(&str, &str)> = KNOWN_UPWARD.iter().copied().collect();
    assert_ratchet(
        &upward,
        &known,
        "imports that run up a floor (a module may use only those before it in FLOORS)",
        "KNOWN_UPWARD",
    );
}

/// The circles among the files of each folder under `host/src`: groups of files (by stem, sorted)
/// that reach each other through `super::<file>` imports (tests left out, as for [`uses`]).
fn file_circles() -> BTreeSet<(String, Vec<String>)> {
    fn walk(dir: &Path, out: &mut BTreeSet<(String, Vec<String>)>) {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .expect("a folder")
            .map(|e| e.expect("an entry").path())
            .collect();
        entries.sort();
        let stem = |p: &Path| {
            p.file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or("")
                .to_owned()
        };
        let siblings: BTreeSet<String> = entries
            .iter()
            .filter(|p| p.is_dir() || p.extension().is_some_and(|e| e == "rs"))
            .map(|p| stem(p))
            .filter(|s| s != "mod")
            .collect();
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for file in entries.iter().filter(|p| p.is_file()) {
            let name = stem(file);
            let Some(text) = non_test_code(file).filter(|_| name != "mod") else {
                continue;
            };
            let used = graph.entry(name.clone()).or_default();
            for other in names_after(&text, "super::") {
                if other != name && siblings.contains(other) {
                    used.insert(other.to_owned());
                }
            }
        }
        let reaches = |from: &str, to: &str| {
            let (mut todo, mut seen) = (vec![from.to_owned()], BTreeSet::new());
            while let Some(n) = todo.pop() {
                for d in graph.get(&n).into_iter().flatten() {
                    if d == to {
                        return true;
                    }
                    if seen.insert(d.clone()) {
                        todo.push(d.clone());
                    }
                }
            }
            false
        };
        let folder = dir.strip_prefix(src()).unwrap_or(dir).display().to_string();
        for a in graph.keys() {
            let group: Vec<String> = graph
                .keys()
                .filter(|b| *b == a || (reaches(a, b) && reaches(b, a)))
                .cloned()
                .collect();
            if group.len() > 1 {
                out.insert((folder.clone(), group));
            }
        }
        for sub in entries.iter().filter(|p| p.is_dir()) {
            walk(sub, out);
        }
    }
    let mut out = BTreeSet::new();
    walk(&src(), &mut out);
    out
}

#[test]
fn the_files_of_a_folder_import_each_other_in_no_new_circle() {
    let found = file_circles();
    let known: BTreeSet<(String, Vec<String>)> = KNOWN_FILE_CIRCLES
        .iter()
        .map(|(folder, files)| {
            (
                folder.to_string(),
                files.iter().map(|f| f.to_string()).collect(),
            )
        })
        .collect();
    assert_ratchet(
        &found,
        &known,
        "files importing each other in a circle",
        "KNOWN_FILE_CIRCLES",
    );
}

#[test]
fn the_architecture_docs_dependency_table_is_the_codes() {
    let want = table(&uses());
    let doc = std::fs::read_to_string(src().join("../../docs/ARCHITECTURE.md"))
        .expect("docs/ARCHITECTURE.md");
    let start = "<!-- dependency table: generated by host/src/architecture_tests.rs -->\n```\n";
    let begin = doc
        .find(start)
        .expect("the table's marker in docs/ARCHITECTURE.md")
        + start.len();
    let end = begin + doc[begin..].find("```").expect("the table's end");
    assert!(
        doc[begin..end] == want,
        "docs/ARCHITECTURE.md's dependency table is not the code's; it should read:\n{want}"
    );
}

/// The most lines a host source file may have (`docs/ARCHITECTURE.md`: one concept a file).
const MAX_FILE_LINES: usize = 600;

/// The most lines a host function may have, from its signature to its closing brace.
const MAX_FUNCTION_LINES: usize = 120;

/// Every `.rs` file of the host crate: its sources, tests, benchmarks and build script.
fn host_files() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for part in ["src", "tests", "benches", "build.rs"] {
        rust_files(&root.join(part), &mut files);
    }
    files
}

/// The functions of rustfmt-formatted `text` longer than `max` lines, as (name, first line,
/// lines): a `fn` item ends at the first later line that is its indentation and `}`;
/// declarations without a body (`;`) are left out.
fn long_functions(text: &str, max: usize) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let code = line.trim_start();
        let indent = &line[..line.len() - code.len()];
        let mut rest = code;
        for prefix in [
            "pub(crate) ",
            "pub(super) ",
            "pub ",
            "const ",
            "async ",
            "unsafe ",
        ] {
            rest = rest.strip_prefix(prefix).unwrap_or(rest);
        }
        rest = rest.strip_prefix("extern \"C\" ").unwrap_or(rest);
        let Some(after) = rest.strip_prefix("fn ") else {
            continue;
        };
        let name: String = after
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        // The signature ends at the first line ending in `{` (a body) or `;` (none).
        let Some(open) = (i..lines.len()).find(|&j| {
            let l = lines[j].trim_end();
            l.ends_with('{') || l.ends_with(';') || l.ends_with('}')
        }) else {
            continue;
        };
        let opened = lines[open].trim_end();
        if opened.ends_with(';') || opened.ends_with('}') {
            continue;
        }
        let close = format!("{indent}}}");
        let end = (open + 1..lines.len())
            .find(|&j| lines[j] == close)
            .unwrap_or(lines.len() - 1);
        let length = end - i + 1;
        if length > max {
            out.push((name, i + 1, length));
        }
    }
    out
}

#[test]
fn no_host_file_is_over_600_lines_and_no_function_over_120() {
    let mut over = Vec::new();
    for file in host_files() {
        let text = std::fs::read_to_string(&file).expect("a source file");
        let shown = file.display();
        let lines = text.lines().count();
        if lines > MAX_FILE_LINES {
            over.push(format!("{shown}: {lines} lines (at most {MAX_FILE_LINES})"));
        }
        for (name, line, length) in long_functions(&text, MAX_FUNCTION_LINES) {
            over.push(format!(
                "{shown}:{line}: fn {name} is {length} lines (at most {MAX_FUNCTION_LINES})"
            ));
        }
    }
    assert!(
        over.is_empty(),
        "split these by concept (one concept a file, a function a named step):\n{}",
        over.join("\n")
    );
}

#[test]
fn a_long_function_is_found_and_a_declaration_is_not() {
    let body = "    x();\n".repeat(3);
    let text = format!(
        "fn short() {{}}\n\nimpl T {{\n    pub(crate) fn long(\n        a: u8,\n    ) -> u8 {{\n{body}    }}\n\n    fn declared(&self);\n}}\n"
    );
    assert_eq!(long_functions(&text, 5), vec![("long".to_owned(), 4, 7)]);
    assert!(long_functions(&text, 7).is_empty());
}
