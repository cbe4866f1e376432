//! The plugins of this repository loaded at once from their `.so` files, training together
//! on Fashion-MNIST: first the six original ones — surgery (blurpool), batch selection
//! (selective_backprop), batch transforms (cutout), target smoothing (label_smoothing), two
//! passes per step (sam) and weight averaging (ema) — then every plugin crate in `plugins/`
//! (found by reading the folder, so a new plugin joins the test by existing) on a ResNet-50,
//! exported and checked against PyTorch.

use std::collections::BTreeSet;

use tessera_tests::export::assert_export_matches_rebuilt_run;
use tessera_tests::plugins::{plugin_settings, repository_plugins};
use tessera_tests::*;

/// `toml` with the six plugins.
fn with_six_plugins(toml: TrainerToml) -> TrainerToml {
    toml.algorithm("blurpool", "")
        .algorithm(
            "selective_backprop",
            "start = 0.0\nend = 1.0\ninterrupt = 0",
        )
        .algorithm("cutout", "length = 0.25")
        .algorithm("label_smoothing", "smoothing = 0.1")
        .algorithm("sam", "rho = 0.05")
        .algorithm("ema", "half_life = \"2ba\"")
}

#[test]
fn six_plugins_train_together() {
    let dir = TempDir::new("all-six");
    let mut toml = with_six_plugins(TrainerToml::new("all-six"));
    toml.model = "name = \"resnet20\"".to_owned();
    toml.write_to(&dir);
    let out = train(&dir, &[], &[]);
    out.assert_success();
    let record = read_json(&run_dir(&dir, "all-six").join("run.json"));
    let mut names: Vec<&str> = record["plugins"]
        .as_array()
        .expect("plugins")
        .iter()
        .map(|p| p["name"].as_str().expect("name"))
        .collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "blurpool",
            "cutout",
            "ema",
            "label_smoothing",
            "sam",
            "selective_backprop"
        ]
    );
    assert_eq!(record["batches"], 3, "{record:#}");
    // The clock counts every loaded sample, as Composer does; selective backprop trained on
    // half of each batch of 64.
    assert_eq!(record["samples"], 3 * 64, "{record:#}");
    assert_eq!(record["trained_samples"], 3 * 32, "{record:#}");
    let eval = &record["evals"][0];
    assert!(eval["accuracy"].is_f64(), "{record:#}");
    assert!(
        eval["cross_entropy"].as_f64().expect("ce").is_finite(),
        "{record:#}"
    );
}

#[test]
fn six_plugins_learn_together() {
    // The same six methods on the small CNN (blurpool replaces its max-pools), long enough to
    // learn: selective backprop trains on half of each batch and the evaluation uses EMA weights.
    let toml = with_six_plugins(TrainerToml::new("all-six-learn"));
    let record = train_batches("all-six-learn", toml, 40);
    // Measured: 0.458 after 40 batches (0.210 after 20); 0.102 with a learning rate of 1e-9 (a
    // step that does nothing).
    assert_learned(&record, 0.3);
}

/// A 3-batch ResNet-50 run with every plugin of the repository, exported: its folder, checkpoint
/// and exported file. Both tests below check it; they share one run ([`shared`]).
struct EveryPluginRun {
    dir: TempDir,
    ckpt: std::path::PathBuf,
    exported: std::path::PathBuf,
}

fn every_plugin_run() -> std::sync::Arc<EveryPluginRun> {
    shared("all-plugins", || {
        train_and_export_every_plugin("all-plugins")
    })
}

/// Trains a 3-batch ResNet-50 run with every plugin of the repository and exports it.
fn train_and_export_every_plugin(label: &str) -> EveryPluginRun {
    // patch_whitening needs a whitening-ready first conv (the zoo's airbench), not ResNet-50's
    // 7x7 stem; tests/methods/patch_whitening.rs covers it.
    let plugins: Vec<String> = repository_plugins()
        .into_iter()
        .filter(|p| p != "patch_whitening")
        .collect();
    assert!(plugins.len() >= 19, "{plugins:?}");
    let dir = TempDir::new(label);
    let mut toml = TrainerToml::new(label);
    toml.model = "name = \"resnet50\"".to_owned();
    toml.device = Some("cpu".to_owned());
    for p in &plugins {
        toml = toml.algorithm(p, plugin_settings(p));
    }
    let text = format!("{}\n[checkpoint]\ninterval = \"3ba\"\n", toml.render());
    dir.write("trainer.toml", &text);
    let out = train(&dir, &["data.batch_size=32"], &[]);
    out.assert_success();
    let record = read_json(&run_dir(&dir, label).join("run.json"));
    let loaded: BTreeSet<&str> = record["plugins"]
        .as_array()
        .expect("plugins")
        .iter()
        .map(|p| p["name"].as_str().expect("name"))
        .collect();
    let wanted: BTreeSet<&str> = plugins.iter().map(String::as_str).collect();
    assert_eq!(loaded, wanted);
    assert_eq!(record["batches"], 3, "{record:#}");
    // Each surgery acted on the model.
    let lines = read_jsonl(&run_dir(&dir, label).join("metrics.jsonl"));
    for metric in [
        "blurpool/num_blurconv_layers",
        "factorize/num_conv2d_replacements",
        "squeeze_excite/replaced",
        "weight_standardization/num_layers",
        "stochastic_depth/num_stochastic_layers",
    ] {
        let values = method_metric(&lines, metric);
        assert!(
            values.first().is_some_and(|(_, v)| *v > 0.0),
            "{metric}: {values:?}\n{}",
            out.dump()
        );
    }
    let folder = run_dir(&dir, label).join("checkpoints");
    let ckpt = tessera::checkpoint::list(&folder)
        .first()
        .cloned()
        .expect("a checkpoint");
    let exported = dir.join("model.safetensors");
    tessera(
        &[
            "export",
            &ckpt.display().to_string(),
            "--to",
            &exported.display().to_string(),
        ],
        dir.path(),
        &[],
    )
    .assert_success();
    EveryPluginRun {
        dir,
        ckpt,
        exported,
    }
}

/// Every plugin of the repository in one run: surgery of several kinds on the same ResNet-50
/// (BlurPool, Factorize, SqueezeExcite, weight standardization, Ghost BatchNorm, stochastic
/// depth, ChannelsLast), per-sample transforms on the loader threads (RandAugment, AugMix),
/// batch and size changes (ColOut, progressive resizing, MixUp, CutMix, CutOut), the loss
/// (label smoothing), clipping, freezing, selection, two passes, averaging (EMA, SWA), early
/// stopping: the run trains and exports.
#[test]
fn every_plugin_of_the_repository_trains_together_and_exports() {
    let run = every_plugin_run();
    assert!(run.ckpt.is_file() && run.exported.is_file());
}

/// The export of that run loaded into torchvision's ResNet-50 with the kept modules' twins
/// gives the rebuilt run's output, with weight standardization folded in convs that sit inside
/// stochastic depth's blocks and inside SqueezeExcite's wrapper, in a channels-last model.
#[test]
fn every_plugin_export_matches_pytorch() {
    let run = every_plugin_run();
    let (dir, ckpt, exported) = (&run.dir, &run.ckpt, &run.exported);
    // Where the standardized convs are: the combinations this export must get right.
    let cfg = tessera::trainer::standalone_config(ckpt, &[]).expect("the recorded config loads");
    let trainer = tessera::trainer::Trainer::standalone(cfg, Vec::new()).expect("the run rebuilds");
    let layers = trainer.model().root.walk();
    let kind_of = |path: &str| {
        layers
            .iter()
            .find(|l| l.path == path)
            .map(|l| l.kind.clone())
            .unwrap_or_default()
    };
    let standardized: Vec<&str> = layers
        .iter()
        .filter(|l| l.kind == "weight_standardized_conv2d")
        .map(|l| l.path.as_str())
        .collect();
    let parent = |path: &str| {
        path.rsplit_once('.')
            .map_or(String::new(), |(p, _)| p.to_owned())
    };
    assert!(
        standardized
            .iter()
            .any(|p| kind_of(&parent(p)) == "stochastic_bottleneck"),
        "no standardized conv inside a stochastic-depth block: {standardized:?}"
    );
    assert!(
        standardized
            .iter()
            .any(|p| kind_of(&parent(p)) == "squeeze_excite_conv2d"),
        "no standardized conv inside SqueezeExcite: {standardized:?}"
    );
    drop(trainer);
    assert_export_matches_rebuilt_run(
        dir,
        ckpt,
        exported,
        [1, 28, 28],
        "torchvision",
        "resnet50 with every plugin",
    );
}
