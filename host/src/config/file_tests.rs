//! Tests of `--set` overrides, reading a file from disk, and the reference file (docs/trainer-reference.toml).

use super::*;
use crate::data::{Dataset, HorizontalFlip, Normalize, RandomCrop, SyntheticConfig, Transforms};
use crate::device::Device;
use crate::model::ModelConfig;
use crate::optim::{AdamW, Rule, Sgd};
use crate::time::TimeUnit;

use super::tests::*;

#[test]
fn overrides() {
    let c = parse_with(
        FULL,
        &[
            "optimizer.lr=0.05",
            "train.max_duration=1ep",
            "data.transforms.random_crop.padding=2",
            "algorithms.0.smoothing=0.2",
            "algorithms.1.sizes=[3, 4]",
            "run_name=\"quoted\"",
            "seed = 9",
            "train.device=cpu",
        ],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.optimizer.lr(), 0.05);
    assert!(matches!(c.train.max_duration.unit(), TimeUnit::Epoch));
    assert_eq!(
        c.data.transforms.random_crop.as_ref().map(|r| r.padding),
        Some(2)
    );
    assert_eq!(
        c.algorithms[0].settings["smoothing"],
        serde_json::json!(0.2)
    );
    assert_eq!(c.algorithms[1].settings["sizes"], serde_json::json!([3, 4]));
    assert_eq!(c.run_name, "quoted");
    assert_eq!(c.seed, 9);
    assert_eq!(c.train.device, Device::Cpu);
}

#[test]
fn overrides_create_missing_tables() {
    let c = parse_with(
        MINIMAL,
        &[
            "data.transforms.horizontal_flip.p=0.3",
            "optimizer.name=adamw",
            "plugins.dirs=[\"p\"]",
            "algorithms.0.plugin=cutout",
            "algorithms.0.length=4",
            "algorithms.1.plugin=label_smoothing",
            "scheduler.name=constant",
        ],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        c.data.transforms.horizontal_flip,
        Some(HorizontalFlip { p: 0.3 })
    );
    assert_eq!(c.optimizer.rule, Rule::AdamW(AdamW::default()));
    assert_eq!(c.plugins.dirs, vec![PathBuf::from("/base/dir/p")]);
    assert_eq!(c.algorithms.len(), 2);
    assert_eq!(c.algorithms[0].plugin, "cutout");
    assert_eq!(c.algorithms[0].settings["length"], serde_json::json!(4));
    assert_eq!(c.algorithms[0].line, 0);
    // A required table can come entirely from overrides.
    let c = parse_with(
        "",
        &[
            "data.dataset=mnist",
            "model.name=mlp",
            "train.max_duration=2ba",
        ],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.data.dataset, Dataset::Mnist);
}

#[test]
fn bad_overrides() {
    let run = |set: &'static [&'static str], text: &str| -> ConfigError {
        match parse_with(text, set) {
            Ok(_) => panic!("{set:?}: expected an error"),
            Err(e) => e,
        }
    };
    let cases: Vec<(&'static [&'static str], &str, ErrorKind, &str, &str)> = vec![
        (
            &["optimizer.lr=-1"],
            MINIMAL,
            ErrorKind::InvalidValue,
            "optimizer.lr",
            "must be > 0, got -1",
        ),
        (
            &["train.max_duration=3dur"],
            MINIMAL,
            ErrorKind::InvalidValue,
            "train.max_duration",
            "unit \"dur\" is not allowed",
        ),
        (
            &["optimizer.lrr=1"],
            MINIMAL,
            ErrorKind::UnknownKey,
            "optimizer.lrr",
            "did you mean `lr`?",
        ),
        (
            &["data.batch_size=big"],
            MINIMAL,
            ErrorKind::WrongType,
            "data.batch_size",
            "got a string (\"big\")",
        ),
        (
            &["nonsense"],
            MINIMAL,
            ErrorKind::BadOverride,
            "",
            "expected KEY=VALUE",
        ),
        (
            &["data.dataset.x=1"],
            MINIMAL,
            ErrorKind::BadOverride,
            "data.dataset",
            "not a table",
        ),
        (
            &["algorithms.3.plugin=x"],
            FULL,
            ErrorKind::BadOverride,
            "algorithms.3",
            "out of range",
        ),
        (
            &["data.transforms.random_crop.size=40"],
            MINIMAL,
            ErrorKind::InvalidValue,
            "data.transforms.random_crop.size",
            "must be <= 28",
        ),
        (
            &["algorithms.0.smoothing=0.1"],
            MINIMAL,
            ErrorKind::MissingKey,
            "algorithms.0.plugin",
            "missing required key",
        ),
    ];
    for (set, text, kind, key, needle) in cases {
        let e = run(set, text);
        let shown = e.to_string();
        assert_eq!(e.kind, kind, "{set:?}: {shown}");
        assert_eq!(e.key, key, "{set:?}: {shown}");
        assert_eq!(
            e.location,
            Location::Override(set[0].to_string()),
            "{set:?}: {shown}"
        );
        assert!(
            shown.starts_with(&format!("trainer.toml: --set {}: ", set[0])),
            "{shown}"
        );
        assert!(
            shown.contains(needle),
            "{set:?}: {shown:?} lacks {needle:?}"
        );
    }
    // An override of one key leaves errors elsewhere pointing into the file.
    let e = match parse_with(&with("[optimizer]\nlr = -1\n"), &["optimizer.momentum=0.5"]) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e,
    };
    assert_eq!(e.location.line(), Some(11), "{e}");
}

#[test]
fn relative_paths_resolve_against_the_file_folder() {
    let text = with("[plugins]\ndirs = [\"plugins\", \"/opt/p\"]\n").replace(
        "dataset = \"fashion-mnist\"",
        "dataset = \"mnist\"\ndata_dir = \"../cache\"",
    );
    let text = format!("output_dir = \"out\"\n{text}");
    let c = from_str(&text, Path::new("exp/one"), "exp/one/trainer.toml")
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.output_dir, PathBuf::from("exp/one/out"));
    assert_eq!(c.data.data_dir, Some(PathBuf::from("exp/one/../cache")));
    assert_eq!(
        c.plugins.dirs,
        vec![PathBuf::from("exp/one/plugins"), PathBuf::from("/opt/p")]
    );
    assert_eq!(c.run_name, "trainer");
}

#[test]
fn load_reads_a_file_and_names_it() {
    let dir = std::env::temp_dir().join(format!("tessera-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    let path = dir.join("my-run.toml");
    std::fs::write(&path, with("[optimizer]\nlr = 0\n")).unwrap_or_else(|e| panic!("{e}"));
    let e = match load(&path, &[]) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e,
    };
    assert!(
        e.to_string()
            .starts_with(&format!("{}:11:6: optimizer.lr:", path.display())),
        "{e}"
    );
    let c = load(&path, &["optimizer.lr=0.5".to_string()]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.run_name, "my-run");
    assert_eq!(c.output_dir, dir.join("runs"));
    let missing = dir.join("absent.toml");
    let e = match load(&missing, &[]) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e,
    };
    assert_eq!(e.kind, ErrorKind::Io);
    assert!(
        e.to_string().starts_with(&missing.display().to_string()),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn reference_file_parses() {
    let path = Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/trainer-reference.toml"
    ));
    let c = load(path, &[]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.run_name, "fmnist-cnn");
    assert_eq!(c.data.dataset, Dataset::FashionMnist);
    assert_eq!(c.algorithms.len(), 2);
    assert_eq!(c.algorithms[0].plugin, "label_smoothing");
}

#[test]
fn loading_is_deterministic_and_overrides_are_ordered() {
    assert_eq!(ok(FULL), ok(FULL));
    let later_wins = parse_with(MINIMAL, &["optimizer.lr=0.2", "optimizer.lr=0.3"])
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(later_wins.optimizer.lr(), 0.3);
}

/// Every file in `tests/fuzz_regressions/config` (crash reproducers and hand-made nasty inputs)
/// and in the seed corpus `fuzz/corpus/config` loads without a panic, the way the `config` fuzz
/// target feeds it: as a whole, and with its first line as a `--set` override. Errors name the
/// source; each seed file is valid one way or the other.
#[test]
fn fuzz_regressions_and_seed_corpus() {
    let base = Path::new("/fuzz/base");
    let mut checked = 0;
    for (folder, path) in
        crate::test_support::files_in(&["tests/fuzz_regressions/config", "fuzz/corpus/config"])
    {
        let bytes = std::fs::read(&path).unwrap();
        let text = String::from_utf8_lossy(&bytes);
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let whole = from_str(&text, base, &name);
        let overridden = text
            .split_once('\n')
            .map(|(first, rest)| from_str_with_overrides(rest, base, &name, &[first.to_string()]));
        for e in [
            whole.as_ref().err(),
            overridden.as_ref().and_then(|r| r.as_ref().err()),
        ]
        .into_iter()
        .flatten()
        {
            let msg = e.to_string();
            assert!(msg.starts_with(&name), "error does not name {name}: {msg}");
        }
        if folder.ends_with("fuzz/corpus/config") && path.extension() == Some("toml".as_ref()) {
            assert!(
                whole.is_ok() || matches!(overridden, Some(Ok(_))),
                "seed {name} is not a valid configuration: {:?}",
                whole.err()
            );
        }
        checked += 1;
    }
    assert!(checked >= 10, "only {checked} files checked");
}

/// Every key the reader knows (each section's `KEYS`, and each schedule's fields as serde
/// reports them) is mentioned in its table's part of `docs/trainer-reference.toml`.
#[test]
fn reference_documents_every_key() {
    use super::de::{DeError, NodeDe};
    use super::section::Section;
    use crate::optim::schedule::Schedule;
    use serde::Deserialize;

    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/trainer-reference.toml"
    ))
    .unwrap();
    // The text of each table, commented-out headers included; "" is the top level.
    let mut parts: Vec<(String, String)> = vec![(String::new(), String::new())];
    for line in text.lines() {
        let bare = line.trim_start_matches(['#', ' ']);
        let name = bare.trim_start_matches('[').trim_end_matches(']');
        if bare.starts_with('[')
            && bare.ends_with(']')
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || "_.".contains(c))
        {
            parts.push((name.to_string(), String::new()));
        } else if let Some((_, part)) = parts.last_mut() {
            part.push_str(line);
            part.push('\n');
        }
    }
    let headers: Vec<&str> = parts.iter().map(|(n, _)| n.as_str()).collect();
    let mentions = |table: &str, key: &str| {
        let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
        parts.iter().filter(|(n, _)| n == table).any(|(_, part)| {
            part.match_indices(key).any(|(i, _)| {
                !part[..i].ends_with(word) && !part[i + key.len()..].starts_with(word)
            })
        })
    };
    let probe = |toml: &str| {
        let map = tree::SourceMap::new(toml);
        let doc = toml_edit::ImDocument::parse(toml).unwrap();
        Schedule::deserialize(NodeDe(&tree::from_document(&doc, &map))).err()
    };
    let Some(DeError::UnknownVariant {
        expected: names, ..
    }) = probe("name = \"?\"")
    else {
        panic!("no schedule names");
    };
    let mut tables: Vec<(&str, &[&str])> = vec![
        ("", Config::KEYS),
        ("data", DataConfig::KEYS),
        ("data.synthetic", SyntheticConfig::KEYS),
        ("data.text", crate::data::TextConfig::KEYS),
        ("data.mlm", crate::data::MlmConfig::KEYS),
        ("data.transforms", Transforms::KEYS),
        ("data.transforms", Normalize::KEYS),
        ("data.transforms", RandomCrop::KEYS),
        ("data.transforms", HorizontalFlip::KEYS),
        ("model", ModelConfig::KEYS),
        ("optimizer", Sgd::KEYS),
        ("optimizer", AdamW::KEYS),
        ("train", TrainConfig::KEYS),
        ("train", crate::model::ActivationCheckpointing::KEYS),
        ("checkpoint", CheckpointConfig::KEYS),
        ("logging", LoggingConfig::KEYS),
        ("logging", crate::tracking::mlflow::MlflowConfig::KEYS),
        ("distributed", DistributedConfig::KEYS),
        ("plugins", PluginsConfig::KEYS),
        ("algorithms", &["plugin", "sha256", "on_error"]),
        ("scheduler", names),
    ];
    for name in names {
        let Some(DeError::UnknownField { expected, .. }) =
            probe(&format!("name = {name:?}\n\"?\" = 1"))
        else {
            panic!("no fields for schedule {name}");
        };
        tables.push(("scheduler", expected));
    }
    for (table, keys) in tables {
        for key in keys {
            let sub = tree::join(table, key);
            assert!(
                mentions(table, key) || headers.contains(&sub.as_str()),
                "docs/trainer-reference.toml does not document `{sub}`"
            );
        }
    }
}
