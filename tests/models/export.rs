//! `tessera export`: a checkpoint written by a real (short, synthetic-data) training run becomes
//! a safetensors file with exactly the model's PyTorch `state_dict` names, which
//! `scripts/check_export.py` loads strictly into the PyTorch twin of the model
//! (`scripts/pytorch_models.py`) and whose eval-mode output it compares with Tessera's.
//!
//! The PyTorch side needs `import torch` to work with `PYTHONPATH` set to the folder holding the
//! torch wheel (`$TESSERA_TORCH_PYTHONPATH`, else the parent of `$LIBTORCH`, else of
//! `~/.cache/tessera/torch-2.13.0/torch`). `scripts/test.sh` (what CI runs) sets that up and sets
//! `TESSERA_REQUIRE_PYTORCH=1`, so there a failing `import torch` fails the test. Run by hand
//! without it, the comparison is skipped with a printed notice; every other check still runs.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;
use tessera::checkpoint::Checkpoint;
use tessera::config;
use tessera::model::Model;
use tessera_plugin_api::tch::{self, Device, Kind, Tensor};
use tessera_tests::export::check_export;
use tessera_tests::*;

/// A `trainer.toml` for 4 batches of 16 synthetic `channels`x`height`x`width` images with
/// checkpoints every 2 batches.
fn trainer_toml(run_name: &str, model: &str, channels: u32, height: u32, width: u32) -> String {
    format!(
        r#"# written by tests/models/export.rs
run_name = "{run_name}"
seed = 11
output_dir = "runs"

[data]
dataset = "synthetic"
batch_size = 16
eval_batch_size = 32
workers = 0

[data.synthetic]
samples = 64
eval_samples = 32
channels = {channels}
height = {height}
width = {width}
classes = 5

[model]
{model}

[optimizer]
name = "sgd"
lr = 0.05
momentum = 0.9

[train]
max_duration = "4ba"
eval_interval = "1ep"
log_interval = "1ba"
progress = false

[checkpoint]
interval = "2ba"
"#
    )
}

/// Trains the run described by `toml` with the `tessera` binary; returns its config and the
/// newest checkpoint.
fn train(dir: &TempDir, toml: &str) -> (config::Config, PathBuf) {
    let path = dir.write("trainer.toml", toml);
    tessera(&["train", "trainer.toml"], dir.path(), &[]).assert_success();
    let cfg = config::load(&path, &[]).expect("the test's trainer.toml loads");
    let found = tessera::checkpoint::list(&cfg.checkpoint.folder);
    let newest = found.first().unwrap_or_else(|| {
        panic!(
            "the run wrote no checkpoint in {} (checkpoint.interval = \"2ba\")",
            cfg.checkpoint.folder.display()
        )
    });
    (cfg, newest.clone())
}

/// The tensor names and metadata of a safetensors file, read by hand.
fn safetensors_header(path: &Path) -> (BTreeSet<String>, Value) {
    let bytes =
        std::fs::read(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let len = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + len]).expect("the header is JSON");
    let object = header.as_object().expect("the header is an object");
    let names = object
        .keys()
        .filter(|k| *k != "__metadata__")
        .cloned()
        .collect();
    (
        names,
        object.get("__metadata__").cloned().unwrap_or(Value::Null),
    )
}

/// The model of `cfg` with the checkpoint's weights and buffers.
fn model_from_checkpoint(cfg: &config::Config, ckpt: &Checkpoint) -> Model {
    let input = cfg.data.input_shape();
    let model = Model::build(&cfg.model, input, cfg.model.num_classes as i64, Device::Cpu)
        .expect("the model builds");
    for e in model.params.entries() {
        let saved = ckpt
            .tensor(&format!("model/{}", e.name))
            .unwrap_or_else(|| panic!("the checkpoint lacks model/{}", e.name));
        tch::no_grad(|| e.tensor.shallow_clone().copy_(saved));
    }
    model
}

/// Trains, exports, checks names and metadata, and compares with PyTorch.
fn export_and_compare(label: &str, model: &str, channels: u32, height: u32, width: u32) {
    let dir = TempDir::new(&format!("export-{label}"));
    let (cfg, ckpt_path) = train(
        &dir,
        &trainer_toml(&format!("export-{label}"), model, channels, height, width),
    );
    let exported = dir.join("out/model.safetensors");
    let out = tessera(
        &[
            "export",
            &ckpt_path.display().to_string(),
            "--to",
            &exported.display().to_string(),
        ],
        dir.path(),
        &[],
    );
    out.assert_success();

    let ckpt = Checkpoint::read(&ckpt_path).expect("the checkpoint reads");
    let model = model_from_checkpoint(&cfg, &ckpt);
    let model_names: BTreeSet<String> = model
        .params
        .entries()
        .iter()
        .map(|e| e.name.clone())
        .collect();
    let parameters = model.params.num_trainable_scalars();
    let line = out.stdout.trim();
    assert_eq!(
        line,
        format!(
            "exported {} tensors ({parameters} parameters) to {}",
            model_names.len(),
            exported.display()
        ),
        "{}",
        out.dump()
    );

    // Exactly the model's tensors, under its names, with the model's config as metadata.
    let (names, metadata) = safetensors_header(&exported);
    assert_eq!(names, model_names, "exported names");
    let saved: BTreeSet<String> = ckpt
        .with_prefix("model/")
        .map(|(n, _)| n.to_owned())
        .collect();
    assert_eq!(saved, model_names, "checkpoint names");
    assert_eq!(metadata["format"], "pt", "{metadata:#}");
    let model_meta: Value =
        serde_json::from_str(metadata["tessera.model"].as_str().expect("tessera.model"))
            .expect("tessera.model is JSON");
    assert_eq!(model_meta, serde_json::to_value(&cfg.model).unwrap());
    // BatchNorm counts its training-mode forwards: one per batch here.
    let batches = ckpt.meta.timestamp.batch as i64;
    assert!(batches > 0);
    for e in model.params.entries() {
        if e.name.ends_with(".num_batches_tracked") {
            assert_eq!(e.tensor.kind(), Kind::Int64, "{}", e.name);
            assert_eq!(e.tensor.size(), Vec::<i64>::new(), "{}", e.name);
            assert_eq!(e.tensor.int64_value(&[]), batches, "{}", e.name);
        }
    }

    // Tessera's eval-mode output on a fixed input.
    tch::manual_seed(1234);
    let (h, w) = cfg.data.image_size();
    let input = Tensor::randn(
        [4, cfg.data.channels() as i64, h as i64, w as i64],
        (Kind::Float, Device::Cpu),
    );
    let output = model.forward(&input, false).expect("eval forward");
    let case = dir.join("case.safetensors");
    Tensor::write_safetensors(&[("input", &input), ("output", &output)], &case)
        .expect("write the case file");

    if !python_can_import("torch", &format!("the export of {label}")) {
        return;
    }
    let (code, text) = check_export(&exported, &case);
    assert_eq!(code, Some(0), "check_export.py failed for {label}:\n{text}");
    let diff = text
        .lines()
        .find_map(|l| l.split("max_abs_diff=").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no max_abs_diff in:\n{text}"));
    if label.starts_with("resnet") && !label.starts_with("resnet20") {
        assert!(
            text.contains("into torchvision.models.resnet.ResNet"),
            "{label} was not checked against torchvision's model:\n{text}"
        );
    }
    println!("{label}: PyTorch vs Tessera eval output, max abs difference {diff}");
    eprintln!("{label}: {}", text.trim());

    // The checker is not a rubber stamp: a wrong expected output fails it.
    if label == "mlp" {
        let bad = dir.join("bad-case.safetensors");
        let wrong = &output + 0.5;
        Tensor::write_safetensors(&[("input", &input), ("output", &wrong)], &bad)
            .expect("write the bad case file");
        let (code, text) = check_export(&exported, &bad);
        assert_eq!(code, Some(1), "a wrong output must fail the check:\n{text}");
        assert!(text.contains("FAIL"), "{text}");
    }
}

#[test]
fn mlp_exports_and_matches_pytorch() {
    export_and_compare("mlp", "name = \"mlp\"\nhidden = [24, 12]", 1, 10, 8);
}

#[test]
fn mlp_with_layer_norm_and_dropout_exports_and_matches_pytorch() {
    export_and_compare(
        "mlp-norm-dropout",
        "name = \"mlp\"\nhidden = [24, 12]\nnorm = \"layer\"\ndropout = 0.25",
        1,
        10,
        8,
    );
}

#[test]
fn cnn_with_group_norm_exports_and_matches_pytorch() {
    export_and_compare(
        "cnn-group",
        "name = \"cnn\"\nwidth = 4\nnorm = \"group\"",
        3,
        12,
        16,
    );
}

#[test]
fn cnn_exports_and_matches_pytorch() {
    export_and_compare("cnn", "name = \"cnn\"\nwidth = 4", 3, 12, 16);
}

#[test]
fn resnet20_exports_and_matches_pytorch() {
    export_and_compare("resnet20", "name = \"resnet20\"\nwidth = 4", 3, 12, 12);
}

/// The ImageNet ResNets load into torchvision's own models (`strict=True`) and compute the
/// same outputs; the checker names the class it loaded into.
fn torchvision_resnet(name: &str) {
    export_and_compare(name, &format!("name = \"{name}\""), 3, 32, 32);
}

#[test]
fn resnet18_exports_and_loads_into_torchvision() {
    torchvision_resnet("resnet18");
}

#[test]
fn resnet50_exports_and_loads_into_torchvision() {
    torchvision_resnet("resnet50");
}

#[test]
fn bad_checkpoints_and_targets_are_refused() {
    let dir = TempDir::new("export-refused");
    let (_, ckpt_path) = train(
        &dir,
        &trainer_toml("export-refused", "name = \"cnn\"\nwidth = 2", 1, 8, 8),
    );
    let ckpt_arg = ckpt_path.display().to_string();
    let export = |from: &str, to: &Path| {
        tessera(
            &["export", from, "--to", &to.display().to_string()],
            dir.path(),
            &[],
        )
    };

    // One flipped byte in the tensor data: the checksum catches it, the message names the file.
    let bytes = std::fs::read(&ckpt_path).expect("read the checkpoint");
    let mut bad = bytes.clone();
    let at = bytes.len() - 5;
    bad[at] ^= 0x40;
    let bad_path = dir.join("corrupt.ckpt");
    std::fs::write(&bad_path, &bad).expect("write the corrupt copy");
    let out_file = dir.join("corrupt.safetensors");
    export(&bad_path.display().to_string(), &out_file)
        .assert_failure(&[&bad_path.display().to_string(), "corrupt"]);
    assert!(
        !out_file.exists(),
        "nothing is written for a corrupt checkpoint"
    );

    // A missing checkpoint.
    let missing = dir.join("missing.ckpt");
    export(&missing.display().to_string(), &out_file)
        .assert_failure(&[&missing.display().to_string()]);

    // The checkpoint itself as the target, directly or through the `latest` link.
    export(&ckpt_arg, &ckpt_path).assert_failure(&["onto itself"]);
    let latest = ckpt_path.with_file_name(tessera::checkpoint::LATEST);
    assert!(latest.exists(), "{} exists", latest.display());
    export(&latest.display().to_string(), &ckpt_path).assert_failure(&["onto itself"]);
    assert_eq!(
        std::fs::read(&ckpt_path).unwrap(),
        bytes,
        "the checkpoint is untouched"
    );

    // A model changed by surgery (a BlurPool-style filter buffer next to a pooling layer).
    let mut changed = Checkpoint::read(&ckpt_path).expect("the checkpoint reads");
    changed.tensors.push((
        "model/features.3.filt2d".to_owned(),
        Tensor::ones([2, 1, 3, 3], (Kind::Float, Device::Cpu)),
    ));
    let changed_path = dir.join("changed.ckpt");
    changed
        .write(&changed_path)
        .expect("write the changed checkpoint");
    export(&changed_path.display().to_string(), &out_file)
        .assert_failure(&["`features.3.filt2d`", "not part of a plain cnn"]);

    // A tensor missing from the model.
    let mut partial = Checkpoint::read(&ckpt_path).expect("the checkpoint reads");
    partial
        .tensors
        .retain(|(n, _)| n != "model/features.1.num_batches_tracked");
    let partial_path = dir.join("partial.ckpt");
    partial
        .write(&partial_path)
        .expect("write the partial checkpoint");
    export(&partial_path.display().to_string(), &out_file)
        .assert_failure(&["lacks tensor `features.1.num_batches_tracked`"]);
    assert!(!out_file.exists());
}

#[test]
fn airbench_exports_and_matches_pytorch() {
    export_and_compare(
        "airbench",
        "name = \"airbench\"\nwidths = [4, 8, 8]",
        3,
        12,
        12,
    );
}
