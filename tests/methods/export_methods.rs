//! `tessera export` of runs trained with methods (plugin-api 1.4's `export`): the model is
//! rebuilt with its plugins as `tessera eval` rebuilds it, train-time-only changes are folded
//! into plain modules (weight standardization, Ghost BatchNorm, stochastic depth's evaluation
//! scaling), modules that are part of the trained network stay under Composer's names
//! (BlurPool, SqueezeExcite) and are listed in the `tessera.modules` metadata. The file loads
//! strictly into the PyTorch twin (`scripts/pytorch_models.py`, torchvision's ResNet-50 for
//! the folded stochastic depth) and gives Tessera's evaluation output.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;
use tessera_plugin_api::tch::{Kind, Tensor};
use tessera_tests::export::assert_export_matches_rebuilt_run;
use tessera_tests::*;

/// A run of 2 batches of 8 synthetic `channels`x`size`x`size` images with a checkpoint at the
/// end, the `model` and the `[[algorithms]]` entries given.
fn trainer_toml(run_name: &str, model: &str, size: u32, algorithms: &[(&str, &str)]) -> String {
    let dirs = toml_string(&target_dir().display().to_string());
    let mut text = format!(
        r#"# written by tests/methods/export_methods.rs
run_name = "{run_name}"
seed = 5
output_dir = "runs"

[data]
dataset = "synthetic"
batch_size = 8
eval_batch_size = 8
workers = 0

[data.synthetic]
samples = 16
eval_samples = 8
channels = 3
height = {size}
width = {size}
classes = 4

[model]
{model}

[optimizer]
name = "sgd"
lr = 0.05
momentum = 0.9

[train]
max_duration = "2ba"
eval_interval = "1ep"
log_interval = "1ba"
progress = false
device = "cpu"

[checkpoint]
interval = "2ba"

[plugins]
dirs = [{dirs}]
"#
    );
    for (plugin, settings) in algorithms {
        text.push_str(&format!(
            "\n[[algorithms]]\nplugin = \"{plugin}\"\n{settings}\n"
        ));
    }
    text
}

/// Trains, exports the newest checkpoint; returns (checkpoint, exported file, export stdout).
fn train_and_export(dir: &TempDir, toml: &str) -> (PathBuf, PathBuf, String) {
    dir.write("trainer.toml", toml);
    tessera(&["train", "trainer.toml"], dir.path(), &[]).assert_success();
    let cfg = tessera::config::load(&dir.join("trainer.toml"), &[]).expect("the config loads");
    let ckpt = tessera::checkpoint::list(&cfg.checkpoint.folder)
        .first()
        .cloned()
        .expect("the run wrote a checkpoint");
    let exported = dir.join("model.safetensors");
    let out = tessera(
        &[
            "export",
            &ckpt.display().to_string(),
            "--to",
            &exported.display().to_string(),
        ],
        dir.path(),
        &[],
    );
    out.assert_success();
    (ckpt, exported, out.stdout)
}

/// The tensors and metadata of a safetensors file.
fn read_export(path: &Path) -> (Vec<(String, Tensor)>, Value) {
    let tensors = Tensor::read_safetensors(path).expect("the export reads as safetensors");
    let bytes = std::fs::read(path).expect("read the export");
    let len = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + len]).expect("JSON header");
    (tensors, header["__metadata__"].clone())
}

/// Requires the kinds of the plugin modules kept in the export (`tessera.modules`) to be
/// exactly `want`.
fn assert_kept_kinds(meta: &Value, want: &[&str]) {
    let kept = json_meta(meta, "tessera.modules");
    let kinds: BTreeSet<&str> = kept
        .as_array()
        .expect("modules")
        .iter()
        .map(|m| m["kind"].as_str().expect("kind"))
        .collect();
    assert_eq!(kinds, want.iter().copied().collect(), "{kept:#}");
}

fn json_meta(meta: &Value, key: &str) -> Value {
    serde_json::from_str(
        meta[key]
            .as_str()
            .unwrap_or_else(|| panic!("no {key}: {meta:#}")),
    )
    .unwrap_or_else(|e| panic!("{key} is not JSON: {e}"))
}

/// BlurPool and SqueezeExcite stay (Composer's names, listed as kept modules); weight
/// standardization (also inside SqueezeExcite's wrapper) and Ghost BatchNorm fold away; the
/// PyTorch twin built from the metadata gives Tessera's output.
#[test]
fn surgery_is_kept_or_folded_and_the_twin_matches() {
    let dir = TempDir::new("export-methods");
    let toml = trainer_toml(
        "kept-and-folded",
        "name = \"resnet20\"\nwidth = 8",
        16,
        &[
            ("blurpool", "min_channels = 1"),
            ("squeeze_excite", "latent_channels = 0.5\nmin_channels = 16"),
            ("weight_standardization", ""),
            ("ghost_batchnorm", "ghost_batch_size = 4"),
            ("channels_last", ""),
        ],
    );
    let (ckpt, exported, stdout) = train_and_export(&dir, &toml);
    assert!(
        stdout.contains("train-time-only changes are folded") && stdout.contains("stay in"),
        "{stdout}"
    );
    let (tensors, meta) = read_export(&exported);
    let names: BTreeSet<&str> = tensors.iter().map(|(n, _)| n.as_str()).collect();

    let methods: Vec<String> = json_meta(&meta, "tessera.methods")
        .as_array()
        .expect("methods")
        .iter()
        .map(|m| m["name"].as_str().expect("name").to_owned())
        .collect();
    assert_eq!(
        methods,
        [
            "blurpool",
            "squeeze_excite",
            "weight_standardization",
            "ghost_batchnorm",
            "channels_last"
        ]
    );
    assert_kept_kinds(&meta, &["blur_conv2d", "squeeze_excite_conv2d"]);

    // Ghost BatchNorm folded: the plain names, nothing under `.batchnorm.`.
    assert!(names.contains("bn1.weight") && names.contains("bn1.running_var"));
    assert!(
        !names.iter().any(|n| n.contains(".batchnorm.")),
        "{names:?}"
    );
    // BlurPool kept: the strided conv entering layer2 under `conv`, with its filter.
    assert!(names.contains("layer2.0.conv1.conv.weight"), "{names:?}");
    assert!(names.contains("layer2.0.conv1.blur_filter"), "{names:?}");
    // SqueezeExcite kept around a standardized conv (16 channels in layer2 after the first).
    assert!(names.contains("layer2.1.conv1.se.pool_and_mlp.2.weight"));
    let get = |name: &str| -> &Tensor {
        &tensors
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no {name}"))
            .1
    };
    // Weight standardization folded: every exported conv weight has mean 0 and variance 1 per
    // output channel (the stored raw weights do not).
    for name in [
        "conv1.weight",
        "layer2.1.conv1.conv.weight",
        "layer3.1.conv2.conv.weight",
    ] {
        let w = get(name);
        let flat = w.view([w.size()[0], -1]);
        let mean = flat
            .mean_dim(1, false, Kind::Double)
            .abs()
            .max()
            .double_value(&[]);
        let var = flat.var_dim(1, false, false).to_kind(Kind::Double);
        let var_err = (var - 1.0).abs().max().double_value(&[]);
        assert!(
            mean < 1e-5 && var_err < 1e-4,
            "{name}: mean {mean}, var error {var_err}"
        );
    }
    let stored = tessera::checkpoint::Checkpoint::read(&ckpt).expect("the checkpoint reads");
    let raw = stored
        .tensor("model/conv1.weight")
        .expect("the raw weight is checkpointed");
    assert!(
        raw.view([raw.size()[0], -1])
            .var_dim(1, false, false)
            .double_value(&[0])
            < 0.5,
        "the checkpoint keeps the raw (unstandardized) weight"
    );

    assert_export_matches_rebuilt_run(
        &dir,
        &ckpt,
        &exported,
        [3, 16, 16],
        "torch",
        "resnet20 with five methods",
    );
}

/// Factorize's layers stay (Composer's `module0`/`module1` names): convs and the final linear
/// of a ResNet-20, rebuilt by the PyTorch twin from the metadata, give Tessera's output.
#[test]
fn factorized_layers_are_kept_and_the_twin_matches() {
    let dir = TempDir::new("export-factorize");
    let toml = trainer_toml(
        "factorized",
        "name = \"resnet20\"\nwidth = 8",
        16,
        &[(
            "factorize",
            "min_channels = 8\nlatent_channels = 0.5\nmin_features = 4\nlatent_features = 0.5",
        )],
    );
    let (ckpt, exported, _) = train_and_export(&dir, &toml);
    let (tensors, meta) = read_export(&exported);
    let names: BTreeSet<&str> = tensors.iter().map(|(n, _)| n.as_str()).collect();
    assert_kept_kinds(&meta, &["factorized_conv2d", "factorized_linear"]);
    assert!(names.contains("fc.module0.weight") && names.contains("fc.module1.bias"));
    assert!(names.contains("layer3.1.conv1.module1.weight"), "{names:?}");
    assert!(!names.contains("fc.weight"), "{names:?}");
    assert_export_matches_rebuilt_run(
        &dir,
        &ckpt,
        &exported,
        [3, 16, 16],
        "torch",
        "resnet20 with factorize",
    );
}

/// Stochastic depth's evaluation scaling `1 − p` folds into each bottleneck's `bn3`: the
/// exported weights load into torchvision's plain ResNet-50 and give Tessera's output.
#[test]
fn stochastic_depth_folds_into_a_plain_torchvision_resnet50() {
    let dir = TempDir::new("export-sd");
    let toml = trainer_toml(
        "sd",
        "name = \"resnet50\"",
        32,
        &[(
            "stochastic_depth",
            "drop_rate = 0.3\ndrop_distribution = \"uniform\"",
        )],
    );
    let (ckpt, exported, stdout) = train_and_export(&dir, &toml);
    assert!(
        stdout.contains("the exported network is the plain model"),
        "{stdout}"
    );
    let (tensors, meta) = read_export(&exported);
    assert_eq!(json_meta(&meta, "tessera.modules"), serde_json::json!([]));
    // bn3 scaled by 1 − 0.3 against the checkpoint; bn1 untouched.
    let stored = tessera::checkpoint::Checkpoint::read(&ckpt).expect("the checkpoint reads");
    let get = |name: &str| {
        tensors
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t.shallow_clone())
            .unwrap_or_else(|| panic!("no {name}"))
    };
    for (name, factor) in [
        ("layer1.0.bn3.weight", 0.7),
        ("layer4.2.bn3.bias", 0.7),
        ("layer1.0.bn1.weight", 1.0),
    ] {
        let want = stored.tensor(&format!("model/{name}")).expect("stored") * factor;
        let diff = (get(name) - want).abs().max().double_value(&[]);
        assert!(diff < 1e-6, "{name}: {diff}");
    }
    assert_export_matches_rebuilt_run(
        &dir,
        &ckpt,
        &exported,
        [3, 32, 32],
        "torchvision",
        "resnet50 with stochastic depth",
    );
}

/// Gyro dropout and the low-precision norms only change training (and the dtype under
/// autocast): the export folds them back into plain `Dropout`, `LayerNorm` and `GroupNorm`,
/// keeps no plugin module, and loads strictly into the plain PyTorch twin.
#[test]
fn gyro_dropout_and_low_precision_norms_fold_into_plain_modules() {
    for (label, model, algorithms) in [
        (
            "gyro-lpln",
            "name = \"mlp\"\nhidden = [16, 8]\nnorm = \"layer\"\ndropout = 0.25",
            &[
                ("gyro_dropout", "sigma = 1\ntau = 2"),
                ("low_precision_layernorm", ""),
            ][..],
        ),
        (
            "lpgn",
            "name = \"cnn\"\nwidth = 4\nnorm = \"group\"",
            &[("low_precision_groupnorm", "")][..],
        ),
    ] {
        let dir = TempDir::new(&format!("export-{label}"));
        let toml = trainer_toml(label, model, 8, algorithms).replace(
            "device = \"cpu\"",
            "device = \"cpu\"\nprecision = \"amp_bf16\"",
        );
        let (ckpt, exported, _) = train_and_export(&dir, &toml);
        let (tensors, meta) = read_export(&exported);
        let kept = json_meta(&meta, "tessera.modules");
        assert_eq!(kept, Value::Array(Vec::new()), "{label}: {kept:#}");
        let names: BTreeSet<&str> = tensors.iter().map(|(n, _)| n.as_str()).collect();
        let stored = tessera::checkpoint::Checkpoint::read(&ckpt).expect("the checkpoint reads");
        let saved: BTreeSet<&str> = stored.with_prefix("model/").map(|(n, _)| n).collect();
        assert_eq!(names, saved, "{label}");
        assert_export_matches_rebuilt_run(&dir, &ckpt, &exported, [3, 8, 8], "torch", label);
    }
}
