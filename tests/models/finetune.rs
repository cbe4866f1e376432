//! Fine-tuning: pretrained weights in (`[model] init_weights`) and a new run from a
//! checkpoint's weights (`checkpoint.load` with `weights_only`).
//!
//! The pretrained files are made by the installed wheels, as users get them, by
//! `tests/support/pretrained_reference.py` (torchvision's `resnet18` saved with `torch.save` and
//! `safetensors`, a tiny Hugging Face `GPT2LMHeadModel` saved by `save_pretrained`, random
//! weights: nothing is downloaded), with the logits PyTorch computes. Without `import
//! torchvision`/`transformers` the tests that need those files print a notice and stop, unless
//! `TESSERA_REQUIRE_PYTORCH=1` (as `scripts/test.sh`, what CI runs, sets).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use tessera::checkpoint::Checkpoint;
use tessera::model::{
    load_init_weights, read_state_dict, Gpt2Config, InputShape, Model, ModelConfig, ModelName,
};
use tessera_plugin_api::tch::{self, Device, Tensor};
use tessera_tests::*;

/// The vocabulary of the reference GPT-2 and of the text the runs train on.
const VOCAB: usize = 64;

/// The folder of the reference files, made once per test binary; `None` (after a notice) when
/// torchvision or transformers do not import.
fn references() -> Option<&'static Path> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        if !python_can_import("torchvision", "pretrained torchvision weights")
            || !transformers_imports()
        {
            return None;
        }
        let dir = process_dir("finetune-references");
        let out = python(&[
            "tests/support/pretrained_reference.py",
            &dir.display().to_string(),
            &VOCAB.to_string(),
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            out.status.success(),
            "pretrained_reference.py failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Some(dir)
    })
    .as_deref()
}

fn tensor<'a>(tensors: &'a [(String, Tensor)], name: &str) -> &'a Tensor {
    &tensors
        .iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("no tensor `{name}`"))
        .1
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.size(), b.size());
    (a - b).abs().max().double_value(&[])
}

/// The reference tiny GPT-2's sizes.
fn tiny_gpt2() -> ModelConfig {
    let mut c = ModelConfig::new(ModelName::Gpt2, VOCAB);
    c.gpt2 = Some(Gpt2Config {
        n_layer: 2,
        n_head: 2,
        n_embd: 16,
        n_positions: 32,
        ..Gpt2Config::default()
    });
    c
}

#[test]
fn torchvision_and_transformers_files_give_pytorchs_logits() {
    let Some(refs) = references() else { return };
    // torchvision's ResNet-18, 1000 classes, from `safetensors.torch.save_file`.
    let config = ModelConfig::new(ModelName::Resnet18, 1000);
    let input = InputShape {
        channels: 3,
        height: 32,
        width: 32,
    };
    let model = Model::build(&config, input, 1000, Device::Cpu).unwrap();
    let report = load_init_weights(
        &model,
        ModelName::Resnet18,
        &refs.join("resnet18.safetensors"),
        &[],
        true,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(report.loaded, model.params.entries().len());
    assert!(report.new_head.is_empty() && report.missing.is_empty());
    let io = read_state_dict(&refs.join("resnet18_io.safetensors")).unwrap();
    let logits = tch::no_grad(|| model.forward(tensor(&io, "x"), false)).unwrap();
    let diff = max_abs_diff(&logits, tensor(&io, "logits"));
    println!("resnet18 vs torchvision: max abs logits difference {diff:e}");
    assert!(diff < 1e-4, "{diff}");

    // The `torch.save` file, converted by the documented script, holds the same tensors.
    let converted = refs.join("resnet18-converted.safetensors");
    let out = python(&[
        "scripts/to_safetensors.py",
        &refs.join("resnet18.pt").display().to_string(),
        &converted.display().to_string(),
    ])
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let a = read_state_dict(&refs.join("resnet18.safetensors")).unwrap();
    let b = read_state_dict(&converted).unwrap();
    assert_eq!(a.len(), b.len());
    for ((na, ta), (nb, tb)) in a.iter().zip(&b) {
        assert_eq!(na, nb);
        assert!(ta.equal(tb), "{na}");
    }
    // The pickle itself is refused, naming the script.
    let e = load_init_weights(
        &model,
        ModelName::Resnet18,
        &refs.join("resnet18.pt"),
        &[],
        true,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("scripts/to_safetensors.py"), "{e}");

    // Hugging Face's GPT2LMHeadModel from `save_pretrained` (its tied head is not in the file).
    let config = tiny_gpt2();
    let model = Model::build(&config, input, VOCAB as i64, Device::Cpu).unwrap();
    let file = refs.join("gpt2").join("model.safetensors");
    let report = load_init_weights(&model, ModelName::Gpt2, &file, &[], true)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(report.loaded, model.params.entries().len());
    let io = read_state_dict(&refs.join("gpt2_io.safetensors")).unwrap();
    let logits = tch::no_grad(|| model.forward(tensor(&io, "ids"), false)).unwrap();
    let diff = max_abs_diff(&logits, tensor(&io, "logits"));
    println!("gpt2 vs transformers: max abs logits difference {diff:e}");
    assert!(diff < 1e-5, "{diff}");
}

/// The `[scheduler]` of a run whose weights must not move: SGD's rate times 0 (`lr` must be
/// > 0), so each step subtracts exactly 0 and the weights stay bit for bit.
const FROZEN: &str = "\n[scheduler]\nname = \"constant\"\nalpha = 0.0\n";

/// A `trainer.toml` ([`TrainerToml`]) of `batches` batches of `data` for `model` (the `[model]`
/// body), SGD at `lr` (0: frozen, [`FROZEN`]); `extra` ends the file.
fn sgd_toml(
    run_name: &str,
    data: String,
    model: &str,
    lr: f64,
    batches: u32,
    extra: &str,
) -> String {
    let (lr, scheduler) = if lr == 0.0 { (0.1, FROZEN) } else { (lr, "") };
    let toml = TrainerToml {
        seed: 5,
        model: model.to_owned(),
        optimizer: format!("name = \"sgd\"\nlr = {lr}"),
        max_duration: format!("{batches}ba"),
        data,
        ..TrainerToml::new(run_name)
    };
    format!("{}{scheduler}{extra}", toml.render())
}

/// [`sgd_toml`] on 64 synthetic 3x32x32 images of 10 classes.
fn image_toml(run_name: &str, model: &str, lr: f64, batches: u32, extra: &str) -> String {
    sgd_toml(run_name, synthetic_rgb_data(64), model, lr, batches, extra)
}

/// [`sgd_toml`] for a tiny GPT-2 (the reference's sizes) starting from `init`, on synthetic
/// text over [`VOCAB`] tokens.
fn gpt_toml(run_name: &str, init: &Path, lr: f64, batches: u32) -> String {
    let model = format!(
        "name = \"gpt2\"\nn_layer = 2\nn_head = 2\nn_embd = 16\nn_positions = 32\ninit_weights = {}",
        toml_string(&init.display().to_string())
    );
    sgd_toml(run_name, text_data(32, None), &model, lr, batches, "")
}

fn newest_checkpoint(dir: &TempDir, run_name: &str) -> PathBuf {
    let folder = run_dir(dir, run_name).join("checkpoints");
    tessera::checkpoint::list(&folder)
        .first()
        .unwrap_or_else(|| panic!("no checkpoint in {}", folder.display()))
        .clone()
}

fn model_tensors(ckpt: &Path) -> Vec<(String, Tensor)> {
    let c = Checkpoint::read(ckpt).unwrap_or_else(|e| panic!("{e}"));
    let mut t: Vec<(String, Tensor)> = c
        .with_prefix("model/")
        .map(|(n, t)| (n.to_owned(), t.shallow_clone()))
        .collect();
    t.sort_by(|a, b| a.0.cmp(&b.0));
    t
}

#[test]
fn fine_tuning_an_imported_resnet18_starts_its_new_head_fresh() {
    let Some(refs) = references() else { return };
    let dir = TempDir::new("finetune-resnet18");
    let file = refs.join("resnet18.safetensors");
    let model = format!(
        "name = \"resnet18\"\ninit_weights = {}",
        toml_string(&file.display().to_string())
    );
    dir.write("trainer.toml", &image_toml("ft", &model, 0.01, 2, ""));
    let out = tessera(&["train", "trainer.toml"], dir.path(), &[]);
    out.assert_success();
    let log = out.stderr.clone();
    assert!(
        log.contains("classifier head") && log.contains("fc.weight"),
        "no warning naming the head: {log}"
    );
    let record = read_json(&run_dir(&dir, "ft").join("run.json"));
    let init = &record["init_weights"];
    assert_eq!(
        init["new_head"],
        serde_json::json!(["fc.weight", "fc.bias"])
    );
    assert_eq!(init["loaded"], 120, "{init}");
    assert_eq!(init["sha256"], sha256_hex(&file));
    assert_eq!(record["batches"], 2);
    // The trained backbone is the file's, moved by two steps: relatively, it is much nearer the
    // file's than an independent draw (whose relative distance is about √2) would be.
    let trained = model_tensors(&newest_checkpoint(&dir, "ft"));
    let pretrained = read_state_dict(&file).unwrap();
    let (after, before) = (
        tensor(&trained, "conv1.weight"),
        tensor(&pretrained, "conv1.weight"),
    );
    let relative = (after - before).norm().double_value(&[]) / before.norm().double_value(&[]);
    println!("conv1 moved by {relative:.4} of its norm in two steps");
    assert!(relative > 0.0 && relative < 0.5, "{relative}");
    assert_eq!(tensor(&trained, "fc.weight").size(), [10, 512]);
}

#[test]
fn a_transformers_gpt2_continues_and_export_import_export_is_bit_identical() {
    let Some(refs) = references() else { return };
    let dir = TempDir::new("finetune-gpt2");
    let hf = refs.join("gpt2").join("model.safetensors");
    // At lr 0 one step leaves the weights as loaded: the checkpoint holds the file's tensors.
    dir.write("trainer.toml", &gpt_toml("same", &hf, 0.0, 1));
    tessera(&["train", "trainer.toml"], dir.path(), &[]).assert_success();
    let ckpt = newest_checkpoint(&dir, "same");
    let loaded = model_tensors(&ckpt);
    for (name, t) in read_state_dict(&hf).unwrap() {
        assert!(
            tensor(&loaded, &name).equal(&t),
            "{name} differs from the file"
        );
    }
    let first = dir.join("first.safetensors");
    tessera(
        &[
            "export",
            &ckpt.display().to_string(),
            "--to",
            "first.safetensors",
        ],
        dir.path(),
        &[],
    )
    .assert_success();
    // Imported again and exported again: the same bytes.
    dir.write("trainer.toml", &gpt_toml("again", &first, 0.0, 1));
    tessera(&["train", "trainer.toml"], dir.path(), &[]).assert_success();
    let second = dir.join("second.safetensors");
    let ckpt = newest_checkpoint(&dir, "again");
    tessera(
        &[
            "export",
            &ckpt.display().to_string(),
            "--to",
            "second.safetensors",
        ],
        dir.path(),
        &[],
    )
    .assert_success();
    assert!(
        std::fs::read(&first).unwrap() == std::fs::read(&second).unwrap(),
        "export -> import -> export changed the file"
    );
    // And it trains on from there: the loss falls over a few steps at a real rate.
    dir.write("trainer.toml", &gpt_toml("train", &hf, 0.5, 6));
    tessera(&["train", "trainer.toml"], dir.path(), &[]).assert_success();
    let record = read_json(&run_dir(&dir, "train").join("run.json"));
    let in_file = read_state_dict(&hf).unwrap().len();
    assert_eq!(record["init_weights"]["loaded"], in_file as u64);
    let losses: Vec<f64> = read_jsonl(&run_dir(&dir, "train").join("metrics.jsonl"))
        .iter()
        .filter_map(|l| l["data"]["loss"].as_f64())
        .collect();
    assert!(losses.len() >= 6, "{losses:?}");
    assert!(losses[losses.len() - 1] < losses[0], "{losses:?}");
    // A random GPT-2's first loss is about ln(VOCAB).
    assert!((losses[0] - (VOCAB as f64).ln()).abs() < 0.5, "{losses:?}");
}

#[test]
fn weights_only_starts_a_new_run_from_a_checkpoints_weights() {
    let dir = TempDir::new("finetune-weights-only");
    let mlp = "name = \"mlp\"\nhidden = [32]";
    dir.write("trainer.toml", &image_toml("base", mlp, 0.1, 3, ""));
    tessera(&["train", "trainer.toml"], dir.path(), &[]).assert_success();
    let base = newest_checkpoint(&dir, "base");
    let base_model = model_tensors(&base);

    // A new run with EMA, at lr 0: its weights and EMA's average stay the checkpoint's.
    let extra = format!(
        "\n[checkpoint]\nload = {}\nweights_only = true\nautoresume = true\n\n[[algorithms]]\nplugin = \"ema\"\nhalf_life = \"1ba\"\n",
        toml_string(&base.display().to_string())
    );
    dir.write("trainer.toml", &image_toml("tuned", mlp, 0.0, 1, &extra));
    let out = tessera(&["train", "trainer.toml"], dir.path(), &[]);
    out.assert_success();
    let log = out.stderr.clone();
    assert!(log.contains("started from the weights of"), "{log}");
    let record = read_json(&run_dir(&dir, "tuned").join("run.json"));
    assert_eq!(record["batches"], 1, "a fresh clock");
    assert_eq!(record["epochs"], 0);
    assert!(record["weights_from"].as_str().unwrap().ends_with(".ckpt"));
    assert!(record.get("resumed_from").is_none(), "{record}");
    let tuned = newest_checkpoint(&dir, "tuned");
    let c = Checkpoint::read(&tuned).unwrap();
    for (name, t) in &base_model {
        let ours = c.tensor(&format!("model/{name}")).unwrap();
        assert!(ours.equal(t), "{name} is not the checkpoint's");
        let ema = c
            .tensor(&format!("method/ema/ema/{name}"))
            .unwrap_or_else(|| panic!("no EMA tensor for {name}"));
        assert!(
            max_abs_diff(ema, t) < 1e-6,
            "EMA's average of {name} is not the loaded weights (taken before the load?)"
        );
    }
    // The optimizer started afresh: one step, not the base run's three and one.
    assert_eq!(c.meta.optimizer.steps, 1);

    // Run again, longer: autoresume continues the run's own checkpoint, not the weights.
    dir.write("trainer.toml", &image_toml("tuned", mlp, 0.0, 2, &extra));
    let out = tessera(&["train", "trainer.toml"], dir.path(), &[]);
    out.assert_success();
    let log = out.stderr.clone();
    assert!(log.contains("continuing this run's checkpoint"), "{log}");
    let record = read_json(&run_dir(&dir, "tuned").join("run.json"));
    assert_eq!(record["batches"], 2);
    assert!(record["resumed_from"].is_string(), "{record}");
}

#[test]
fn init_weights_errors_name_the_key_the_file_and_the_tensors() {
    let dir = TempDir::new("finetune-errors");
    let toml = |model: &str, extra: &str| image_toml("e", model, 0.1, 1, extra);
    let text = toml("name = \"mlp\"\ninit_ignore = [\"fc.*\"]", "");
    dir.write("trainer.toml", &text);
    let out = tessera(&["train", "trainer.toml"], dir.path(), &[]);
    let at = format!("trainer.toml:{}:", line_of(&text, "init_ignore"));
    out.assert_failure(&["init_ignore", "init_weights", &at]);

    dir.write(
        "trainer.toml",
        &toml("name = \"mlp\"", "\n[checkpoint]\nweights_only = true\n"),
    );
    let out = tessera(&["train", "trainer.toml"], dir.path(), &[]);
    out.assert_failure(&["weights_only", "load"]);

    dir.write(
        "trainer.toml",
        &toml("name = \"mlp\"\ninit_weights = \"nowhere.safetensors\"", ""),
    );
    let out = tessera(&["train", "trainer.toml"], dir.path(), &[]);
    out.assert_failure(&["init_weights", "nowhere.safetensors"]);

    // A file of another model: every difference named, nothing trained.
    let mlp = "name = \"mlp\"\nhidden = [32]";
    dir.write("trainer.toml", &image_toml("small", mlp, 0.1, 1, ""));
    tessera(&["train", "trainer.toml"], dir.path(), &[]).assert_success();
    let ckpt = newest_checkpoint(&dir, "small");
    tessera(
        &[
            "export",
            &ckpt.display().to_string(),
            "--to",
            "small.safetensors",
        ],
        dir.path(),
        &[],
    )
    .assert_success();
    dir.write(
        "trainer.toml",
        &toml(
            "name = \"mlp\"\nhidden = [48]\ninit_weights = \"small.safetensors\"",
            "",
        ),
    );
    let out = tessera(&["train", "trainer.toml"], dir.path(), &[]);
    let e = out.assert_failure(&["small.safetensors", "layers.0.weight", "init_strict"]);
    assert!(e.contains("[48, 3072]") || e.contains("[32, 3072]"), "{e}");
    // Not strict: it trains, reporting what did not fit.
    dir.write(
        "trainer.toml",
        &toml(
            "name = \"mlp\"\nhidden = [48]\ninit_weights = \"small.safetensors\"\ninit_strict = false",
            "",
        ),
    );
    tessera(&["train", "trainer.toml"], dir.path(), &[]).assert_success();
    let record = read_json(&run_dir(&dir, "e").join("run.json"));
    assert_eq!(
        record["init_weights"]["mismatched"]
            .as_array()
            .unwrap()
            .len(),
        3,
        "{}",
        record["init_weights"]
    );
}

#[test]
fn the_finetune_examples_run_at_two_batches() {
    // examples/finetune/run.sh in a copy (its runs, weights and data stay out of the checkout),
    // every run cut to two batches; the ResNet-18 stand-in is made with torchvision.
    if !python_can_import("torchvision", "the fine-tuning examples") {
        return;
    }
    let dir = TempDir::new("finetune-examples");
    let copy = dir.join("examples").join("finetune");
    std::fs::create_dir_all(&copy).unwrap();
    let source = repo_root().join("examples").join("finetune");
    for entry in std::fs::read_dir(&source).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            std::fs::copy(&path, copy.join(path.file_name().unwrap())).unwrap();
        }
    }
    // The labelled sentences of the BERT classifier.
    let labelled = copy.join("labelled-text");
    std::fs::create_dir_all(&labelled).unwrap();
    for name in ["train.jsonl", "eval.jsonl"] {
        std::fs::copy(source.join("labelled-text").join(name), labelled.join(name)).unwrap();
    }
    let mut cmd = std::process::Command::new("bash");
    cmd.arg(copy.join("run.sh"))
        .env("STEPS", "2")
        .env("TESSERA", tessera_bin())
        .env("PYTHONPATH", torch_pythonpath())
        .env("PYTHONWARNINGS", "ignore")
        .env_remove("LD_LIBRARY_PATH")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let out = run_with_timeout(
        cmd,
        "examples/finetune/run.sh",
        std::time::Duration::from_secs(900),
    );
    assert!(out.status.success(), "run.sh failed:\n{}", out.dump());
    let runs = dir.join("runs");
    let tuned = read_json(&runs.join("finetune-gpt2-shakespeare").join("run.json"));
    assert_eq!(tuned["batches"], 2);
    let report = &tuned["init_weights"];
    // The export lists the tied head's weight a second time (`lm_head.weight`): one tensor less.
    let exported = read_state_dict(&copy.join("weights").join("gpt2-sotu.safetensors")).unwrap();
    assert_eq!(report["loaded"], exported.len() as u64 - 1, "{report}");
    assert!(report["file"]
        .as_str()
        .unwrap()
        .ends_with("gpt2-sotu.safetensors"));
    let resnet = read_json(&runs.join("finetune-resnet18").join("run.json"));
    assert_eq!(
        resnet["init_weights"]["new_head"],
        serde_json::json!(["fc.weight", "fc.bias"])
    );
    assert_eq!(resnet["batches"], 2);
    // BERT: the masked LM's encoder in a classifier whose pooler and head start fresh.
    let bert = read_json(&runs.join("finetune-bert-classify").join("run.json"));
    assert_eq!(bert["batches"], 2);
    let exported = read_state_dict(&copy.join("weights").join("bert-sotu.safetensors")).unwrap();
    let encoder = exported
        .iter()
        .filter(|(n, _)| n.starts_with("bert."))
        .count();
    assert_eq!(bert["init_weights"]["loaded"], encoder as u64, "{bert:#}");
    assert_eq!(bert["text_data"]["classes"]["count"], 2, "{bert:#}");
    let f1 = bert["evals"]
        .as_array()
        .and_then(|e| e.last())
        .and_then(|e| e["f1"].as_f64())
        .unwrap_or_else(|| panic!("no f1 in the evaluation: {bert:#}"));
    assert!((0.0..=1.0).contains(&f1), "{bert:#}");
}
