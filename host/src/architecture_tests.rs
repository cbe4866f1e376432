//! The host's modules form floors: each uses only modules below it. This test reads the code
//! (every `crate::<module>` a module's files name), checks it against [`FLOORS`] and
//! [`KNOWN_UPWARD`], and checks that docs/ARCHITECTURE.md's dependency table is the one the code
//! gives. A new import that runs up a floor fails here; so does removing one of the known ones
//! without taking it off the list (the list only shrinks).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The host's top-level modules, bottom floor first: a module may use those before it.
const FLOORS: [&str; 27] = [
    "sync",
    "time",
    "files",
    "device",
    "cost",
    "memory",
    "hf_config",
    "precision",
    "data",
    "model",
    "dist",
    "optim",
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

/// The imports that still run up a floor, (user, used): issue 38 takes them out one by one.
const KNOWN_UPWARD: [(&str, &str); 7] = [
    // The safetensors reader and the export's name aliases, used by init_weights.
    ("model", "checkpoint"),
    ("model", "export"),
    // Sharded parameters (the model's store holds rank slices).
    ("model", "dist"),
    // The sharded optimizer's state.
    ("dist", "optim"),
    // The tracker tees metrics lines (report's record types).
    ("tracking", "report"),
    // The plugin folders a trainer.toml names (`PluginsConfig`).
    ("plugin", "config"),
    // The recorded config an export rebuilds.
    ("export", "config"),
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
    } else if path.extension().is_some_and(|e| e == "rs") {
        out.push(path.to_owned());
    }
}

/// Each module's uses of the other modules, read from `crate::<name>` in its files (comments
/// included: a doc link to another module is a dependency of the reader's too).
fn uses() -> BTreeMap<&'static str, BTreeSet<&'static str>> {
    let mut graph = BTreeMap::new();
    for module in FLOORS {
        let mut files = Vec::new();
        rust_files(&src().join(module), &mut files);
        rust_files(&src().join(format!("{module}.rs")), &mut files);
        assert!(!files.is_empty(), "module {module} has no files");
        let mut used = BTreeSet::new();
        for file in files {
            let text = std::fs::read_to_string(&file).expect("a source file");
            for (i, _) in text.match_indices("crate::") {
                let rest = &text[i + "crate::".len()..];
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
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

fn floor(module: &str) -> usize {
    FLOORS.iter().position(|m| *m == module).expect("a module of FLOORS")
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
        let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or_default().to_owned();
        if path.is_dir() && name != "bin" || path.extension().is_some_and(|e| e == "rs") {
            on_disk.insert(name);
        }
    }
    for name in ["lib", "architecture_tests"] {
        on_disk.remove(name);
    }
    let on_disk: BTreeSet<&str> = on_disk.iter().map(String::as_str).collect();
    assert_eq!(on_disk, listed, "a module missing from FLOORS (or gone from host/src)");
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
    let new: Vec<_> = upward.difference(&known).collect();
    assert!(
        new.is_empty(),
        "imports that run up a floor (a module may use only those before it in FLOORS): {new:?}"
    );
    let gone: Vec<_> = known.difference(&upward).collect();
    assert!(
        gone.is_empty(),
        "these known upward imports are gone: take them off KNOWN_UPWARD: {gone:?}"
    );
}

#[test]
fn the_architecture_docs_dependency_table_is_the_codes() {
    let want = table(&uses());
    let doc = std::fs::read_to_string(src().join("../../docs/ARCHITECTURE.md"))
        .expect("docs/ARCHITECTURE.md");
    let start = "<!-- dependency table: generated by host/src/architecture_tests.rs -->\n```\n";
    let begin = doc.find(start).expect("the table's marker in docs/ARCHITECTURE.md") + start.len();
    let end = begin + doc[begin..].find("```").expect("the table's end");
    assert!(
        doc[begin..end] == want,
        "docs/ARCHITECTURE.md's dependency table is not the code's; it should read:\n{want}"
    );
}
