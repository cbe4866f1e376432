//! Plugins built against older minor versions of `tessera-plugin-api` (kept as binary fixtures
//! in `fixtures/plugin-api-<version>/`) load and run in the current host, next to plugins built
//! against the current interface, whichever is loaded first, and their method state survives a
//! checkpoint and a resume.

use std::path::PathBuf;

use serde_json::Value;
use tessera_tests::*;

/// Each fixture folder's interface version and the plugins it holds, with their settings.
const FIXTURES: &[(&str, &[(&str, &str)])] = &[
    ("1.0.0", &[("label_smoothing", "smoothing = 0.1")]),
    (
        "1.1.0",
        &[
            ("blurpool", "min_channels = 1"),
            (
                "selective_backprop",
                "start = 0.0\nend = 1.0\nkeep = 0.5\ninterrupt = 0",
            ),
            ("ema", "half_life = \"2ba\""),
        ],
    ),
    ("1.2.0", &[("sam", "rho = 0.05")]),
    ("1.3.0", &[("ghost_batchnorm", "ghost_batch_size = 4")]),
    ("1.4.0", &[("low_precision_layernorm", "")]),
    (
        "1.5.0",
        &[(
            "gradient_clipping",
            "clipping_type = \"norm\"\nclipping_threshold = 1.0",
        )],
    ),
    ("1.6.0", &[("alternating_flip", "")]),
    ("1.7.0", &[("mixup", "alpha = 0.2")]),
    ("1.8.0", &[("cutmix", "alpha = 1.0")]),
    ("1.9.0", &[("muon", "lr = 0.02")]),
    // A fixed length and no final copy: the resumed run is first cut short at 2 batches.
    (
        "1.10.0",
        &[(
            "lookahead",
            "k = 2\nalpha = 0.5\nfinal_copy = false\ntotal_steps = 4",
        )],
    ),
];

/// The plugin built against the current interface that runs beside the old ones.
const CURRENT: (&str, &str) = ("cutout", "num_holes = 1\nlength = 0.25");

fn fixture_dir(version: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures"))
        .join(format!("plugin-api-{version}"))
}

/// Every fixture folder, then the target folder (the first match wins, so the old builds are
/// the ones loaded).
fn plugin_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = FIXTURES.iter().map(|(v, _)| fixture_dir(v)).collect();
    dirs.push(target_dir());
    dirs
}

#[test]
fn the_fixtures_really_are_built_against_their_versions() {
    let dir = TempDir::new("compat-inspect");
    for (version, plugins) in FIXTURES {
        for (name, _) in *plugins {
            let file = fixture_dir(version).join(format!("lib{name}.so"));
            let out = tessera(
                &["plugins", "inspect", &file.to_string_lossy()],
                dir.path(),
                &[],
            );
            out.assert_success();
            assert!(
                out.stdout.contains(&format!("plugin-api: {version}")),
                "{}",
                out.dump()
            );
        }
    }
}

/// A config with every fixture plugin and the current one, in `order` (`true`: old ones first).
fn config(tag: &str, old_first: bool) -> TrainerToml {
    let mut toml = TrainerToml::new(tag);
    toml.plugin_dirs = plugin_dirs();
    let old = FIXTURES.iter().flat_map(|(_, plugins)| plugins.iter());
    let mut entries: Vec<&(&str, &str)> = old.collect();
    if old_first {
        entries.push(&CURRENT);
    } else {
        entries.insert(0, &CURRENT);
    }
    for (name, settings) in entries {
        toml = toml.algorithm(name, settings);
    }
    toml
}

/// Checks that each fixture plugin of the run was loaded from its fixture folder.
fn assert_loaded_from_fixtures(record: &Value) {
    let plugins = record["plugins"].as_array().expect("plugins");
    for (version, names) in FIXTURES {
        let folder = std::fs::canonicalize(fixture_dir(version)).expect("fixture dir");
        for (name, _) in *names {
            let plugin = plugins
                .iter()
                .find(|p| p["name"] == *name)
                .unwrap_or_else(|| panic!("{name} is not in the run record: {record:#}"));
            let path = PathBuf::from(plugin["path"].as_str().expect("path"));
            assert!(path.starts_with(&folder), "{name}: {path:?}");
        }
    }
}

fn train_with(old_first: bool, tag: &str) {
    let dir = TempDir::new(tag);
    config(tag, old_first).write_to(&dir);
    let out = train(&dir, &[], &[]);
    out.assert_success();
    let record = read_json(&run_dir(&dir, tag).join("run.json"));
    assert_loaded_from_fixtures(&record);
    assert_eq!(record["batches"], 3);
}

#[test]
fn older_plugins_run_beside_a_current_one_loaded_after_them() {
    train_with(true, "compat-old-first");
}

#[test]
fn older_plugins_run_beside_a_current_one_loaded_before_them() {
    train_with(false, "compat-new-first");
}

/// The old EMA's state (its shadow weights, handed across as tensors) goes into a checkpoint
/// and comes back on resume: the resumed run evaluates and trains exactly as the straight one.
#[test]
fn older_plugins_state_survives_a_checkpoint_and_a_resume() {
    let dir = TempDir::new("compat-resume");
    let write = |run: &str| {
        let mut toml = config(run, true);
        toml.max_duration = "4ba".into();
        dir.write(
            "trainer.toml",
            &format!("{}\n[checkpoint]\ninterval = \"2ba\"\n", toml.render()),
        );
    };
    let every_2 = "train.eval_interval=2ba";
    write("straight");
    train(&dir, &[every_2], &[]).assert_success();
    write("resumed");
    train(&dir, &[every_2, "train.max_duration=2ba"], &[]).assert_success();
    let out = train(&dir, &[every_2, "checkpoint.autoresume=true"], &[]);
    out.assert_success();
    assert!(out.stderr.contains("resumed from"), "{}", out.dump());

    let record = |run: &str| read_json(&run_dir(&dir, run).join("run.json"));
    let (straight, resumed) = (record("straight"), record("resumed"));
    assert_loaded_from_fixtures(&resumed);
    assert_eq!(resumed["batches"], 4, "{resumed:#}");
    assert_eq!(straight["evals"], resumed["evals"]);
    // The training losses (selective backprop's and BlurPool's doing) and what EMA and
    // Lookahead logged.
    let lines = |run: &str| -> (Vec<Value>, Vec<Value>) {
        let lines = read_jsonl(&run_dir(&dir, run).join("metrics.jsonl"));
        let losses = lines_of_kind(&lines, "train")
            .iter()
            .map(|l| l["data"]["loss"].clone())
            .collect();
        let ema = lines_of_kind(&lines, "method")
            .into_iter()
            .filter(|l| {
                l["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("ema/") || n.starts_with("lookahead/"))
            })
            .cloned()
            .collect();
        (losses, ema)
    };
    let (losses, ema) = lines("straight");
    assert_eq!(losses.len(), 4, "{losses:?}");
    let distances = ema.iter().filter(|l| l["name"] == "ema/distance").count();
    assert_eq!(distances, 2, "EMA swapped in at both evaluations: {ema:?}");
    let syncs = ema
        .iter()
        .filter(|l| l["name"] == "lookahead/syncs")
        .count();
    assert_eq!(syncs, 2, "Lookahead synchronised every 2 steps: {ema:?}");
    assert_eq!((losses, ema), lines("resumed"));
}

/// `tessera export` asks every plugin module and wrapper how to write it (plugin-api 1.4's
/// `export`); the 1.1 BlurPool module and the 1.3 Ghost BatchNorm wrapper predate that call, so
/// the host gets abi_stable's default body (keep the module as it is) instead of calling into
/// a vtable slot that is not there.
#[test]
fn older_plugins_modules_are_exported_as_they_are() {
    let dir = TempDir::new("compat-export");
    let toml = config("compat-export", true);
    dir.write(
        "trainer.toml",
        &format!("{}\n[checkpoint]\ninterval = \"3ba\"\n", toml.render()),
    );
    train(&dir, &[], &[]).assert_success();
    let folder = run_dir(&dir, "compat-export").join("checkpoints");
    let ckpt = tessera::checkpoint::list(&folder)
        .first()
        .cloned()
        .expect("a checkpoint");
    let out = tessera(
        &[
            "export",
            &ckpt.display().to_string(),
            "--to",
            "model.safetensors",
        ],
        dir.path(),
        &[],
    );
    out.assert_success();
    assert!(
        out.stdout.contains("2 blur_max_pool2d") && out.stdout.contains("2 ghost_batch_norm2d"),
        "the old modules are kept: {}",
        out.dump()
    );
    let names: Vec<String> =
        tessera_plugin_api::tch::Tensor::read_safetensors(dir.join("model.safetensors"))
            .expect("the export reads")
            .into_iter()
            .map(|(n, _)| n)
            .collect();
    assert!(
        names.iter().any(|n| n.ends_with(".batchnorm.running_mean")),
        "the 1.3 wrapper is exported as it is: {names:?}"
    );
}

/// With padding (a BERT classifier of labelled text: every batch has an `attention_mask`), the
/// host offers each plugin module the batch's mask through plugin-api 1.7's `forward_masked`;
/// the 1.4 LowPrecisionLayerNorm's modules predate that call, so abi_stable's default body
/// answers "none" and the host runs their `forward`, and the evaluation is the same as with the
/// current build of the plugin (whose `forward_masked` is the default: `forward`).
#[test]
fn older_plugins_modules_run_in_padded_batches() {
    let example = repo_root()
        .join("examples")
        .join("finetune")
        .join("labelled-text");
    let dir = TempDir::new("compat-padded");
    let write = |run: &str, old: bool| {
        let mut toml = TrainerToml::tiny_gpt(run);
        toml.model = "name = \"bert\"\nn_layer = 2\nn_head = 2\nn_embd = 32\nn_inner = 64\n\
                      n_positions = 32"
            .to_owned();
        toml.data = format!(
            "dataset = \"labelled-text\"\ndata_dir = {}\nbatch_size = 16\neval_batch_size = 40\n\
             workers = 0\n\n[data.text]\neval_path = {}\nseq_len = 32\nvocab_size = 300\n",
            toml_string(&example.join("train.jsonl").display().to_string()),
            toml_string(&example.join("eval.jsonl").display().to_string()),
        );
        toml.max_duration = "2ba".to_owned();
        toml.plugin_dirs = if old {
            vec![fixture_dir("1.4.0"), target_dir()]
        } else {
            vec![target_dir()]
        };
        toml.algorithm("low_precision_layernorm", "").write_to(&dir);
    };
    let mut evals = Vec::new();
    for (run, old) in [("old", true), ("current", false)] {
        write(run, old);
        train(&dir, &[], &[]).assert_success();
        let record = read_json(&run_dir(&dir, run).join("run.json"));
        let plugin = record["plugins"]
            .as_array()
            .and_then(|p| p.iter().find(|p| p["name"] == "low_precision_layernorm"))
            .unwrap_or_else(|| panic!("{record:#}"));
        let path = PathBuf::from(plugin["path"].as_str().expect("path"));
        let folder = std::fs::canonicalize(fixture_dir("1.4.0")).unwrap();
        assert_eq!(path.starts_with(&folder), old, "{path:?}");
        assert_eq!(record["batches"], 2, "{record:#}");
        evals.push(record["evals"].clone());
    }
    assert!(
        evals[0].as_array().is_some_and(|e| !e.is_empty()),
        "{evals:?}"
    );
    assert_eq!(evals[0], evals[1]);
}
