//! `[model] torchscript`: a model made in PyTorch, trained by Tessera.
//!
//! `scripts/make_torchscript_model.py` scripts a small CNN (Conv2d + BatchNorm2d + Linear) with
//! the installed PyTorch; the real `tessera` binary trains it on Fashion-MNIST: the loss falls
//! and accuracy rises above chance, the checkpoints hold its parameters and buffers under
//! their `state_dict` names, a batch-level method (label smoothing, CutOut) works on it, a
//! surgery method is told that the model is opaque, a run killed and resumed equals the
//! straight run bit for bit, a changed model file refuses the resume, and the trained weights,
//! exported and loaded strictly into the TorchScript module in PyTorch, give Tessera's outputs.
//! Files that do not fit are refused at start-up, naming the file.
//!
//! Scripting needs `import torch` (`PYTHONPATH` as for `tests/models/export.rs`); without it these
//! tests are skipped with a notice, unless `TESSERA_REQUIRE_PYTORCH=1` (CI) makes that a failure.

use std::path::{Path, PathBuf};

use tessera::checkpoint::Checkpoint;
use tessera::config;
use tessera::model::{Model, Role};
use tessera::precision::{AutocastGuard, Precision};
use tessera_plugin_api::tch::{self, Device, Kind, Tensor};
use tessera_tests::export::check_export;
use tessera_tests::resume::{assert_killed_and_resumed_is_exact, with_checkpoints};
use tessera_tests::*;

/// Scripts the example CNN into `dir/name` (with extra arguments to the script); `None` when
/// PyTorch cannot be imported here (the notice is printed).
fn scripted(dir: &TempDir, name: &str, args: &[&str]) -> Option<PathBuf> {
    if !python_can_import("torch", "TorchScript models") {
        return None;
    }
    let path = dir.join(name);
    let path_arg = path.display().to_string();
    let mut all = vec!["scripts/make_torchscript_model.py", path_arg.as_str()];
    all.extend_from_slice(args);
    let out = python(&all).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        out.status.success(),
        "scripting the model failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Some(path)
}

/// A Fashion-MNIST run (CPU) of the TorchScript model in `file`.
fn fashion(run: &str, file: &Path) -> TrainerToml {
    require_fashion_mnist();
    let mut toml = TrainerToml::new(run);
    toml.model = format!("torchscript = {}", toml_string(&file.display().to_string()));
    toml.device = Some("cpu".to_owned());
    toml
}

/// The example CNN's `state_dict` names, in PyTorch's order.
const STATE_DICT: [&str; 14] = [
    "features.0.weight",
    "features.1.weight",
    "features.1.bias",
    "features.1.running_mean",
    "features.1.running_var",
    "features.1.num_batches_tracked",
    "features.4.weight",
    "features.5.weight",
    "features.5.bias",
    "features.5.running_mean",
    "features.5.running_var",
    "features.5.num_batches_tracked",
    "classifier.weight",
    "classifier.bias",
];

#[test]
fn a_scripted_model_trains_checkpoints_and_matches_pytorch() {
    let models = TempDir::new("ts-models");
    let Some(file) = scripted(&models, "net.pt", &[]) else {
        return;
    };
    let dir = TempDir::new("ts-train");
    let mut toml = fashion("ts", &file);
    toml.max_duration = "60ba".to_owned();
    toml.optimizer = "name = \"sgd\"\nlr = 0.2\nmomentum = 0.9".to_owned();
    let path = dir.write(
        "trainer.toml",
        &format!("{}\n[checkpoint]\ninterval = \"30ba\"\n", toml.render()),
    );
    let out = train(&dir, &[], &[]);
    out.assert_success();
    assert!(
        out.stderr
            .contains(&format!("model: TorchScript {}", file.display())),
        "{}",
        out.dump()
    );

    // It learned: the loss falls, accuracy is well above chance (0.34 measured).
    let lines = read_jsonl(&run_dir(&dir, "ts").join("metrics.jsonl"));
    let losses = train_losses(&lines);
    assert_eq!(losses.len(), 60, "{losses:?}");
    let mean = |l: &[f64]| l.iter().sum::<f64>() / l.len() as f64;
    assert!(
        mean(&losses[50..]) < 0.8 * mean(&losses[..10]),
        "the loss did not fall: {losses:?}"
    );
    let record = read_json(&run_dir(&dir, "ts").join("run.json"));
    assert_learned(&record, 0.25);
    // The run record names the file and its sha256.
    assert_eq!(
        record["config"]["model"]["torchscript"],
        file.display().to_string(),
        "{record:#}"
    );
    assert_eq!(
        record["config"]["model"]["sha256"],
        sha256_hex(&file),
        "{record:#}"
    );

    // The checkpoint holds every tensor under its state_dict name; BatchNorm counted batches.
    let cfg = config::load(&path, &[]).expect("the config loads");
    let ckpt_path = cfg.checkpoint.folder.join("ep0-ba60.ckpt");
    let ckpt = Checkpoint::read(&ckpt_path).expect("the checkpoint reads");
    let mut saved: Vec<&str> = ckpt.with_prefix("model/").map(|(n, _)| n).collect();
    saved.sort_unstable();
    let mut expected = STATE_DICT.to_vec();
    expected.sort_unstable();
    assert_eq!(saved, expected);
    let tracked = ckpt
        .tensor("model/features.1.num_batches_tracked")
        .expect("num_batches_tracked");
    assert_eq!(tracked.int64_value(&[]), 60);

    // Built again from the checkpoint's recorded config (as export does), its tensors are the
    // file's, in state_dict order, with their roles; the checkpoint's weights differ from them.
    let source = format!("{} (recorded)", ckpt_path.display());
    let recorded = config::from_recorded(&ckpt.meta.config, &source, &[]).expect("recorded");
    let input = recorded.data.input_shape();
    let model = Model::build(&recorded.model, input, 10, Device::Cpu).expect("the model builds");
    let names: Vec<&str> = model
        .params
        .entries()
        .iter()
        .map(|e| e.name.as_str())
        .collect();
    assert_eq!(names, STATE_DICT);
    let role = |n: &str| model.params.get(n).map(|e| e.role);
    assert_eq!(role("features.1.running_var"), Some(Role::Buffer));
    assert_eq!(role("classifier.weight"), Some(Role::Parameter));
    let kinds: Vec<String> = model.root.walk().into_iter().map(|i| i.kind).collect();
    assert_eq!(kinds, ["torchscript"], "one opaque module");
    let initial = model
        .params
        .get("classifier.weight")
        .expect("fc")
        .tensor
        .copy();
    let trained = ckpt.tensor("model/classifier.weight").expect("trained fc");
    assert!(!initial.equal(trained), "training changed the weights");
    model
        .params
        .restore(
            &ckpt
                .with_prefix("model/")
                .map(|(n, t)| (n.to_owned(), t.shallow_clone()))
                .collect::<Vec<_>>(),
        )
        .expect("the checkpoint restores");

    // Exported and loaded strictly into the TorchScript module in PyTorch, the trained weights
    // give Tessera's eval-mode outputs.
    let exported = dir.join("net.safetensors");
    tessera(
        &[
            "export",
            &ckpt_path.display().to_string(),
            "--to",
            &exported.display().to_string(),
        ],
        dir.path(),
        &[],
    )
    .assert_success();
    tch::manual_seed(99);
    let batch = Tensor::randn([8, 1, 28, 28], (Kind::Float, Device::Cpu));
    let output = model.forward(&batch, false).expect("eval forward");
    assert_eq!(output.size(), [8, 10]);
    // The host's mixed precision reaches inside the scripted graph (its Linear runs in bf16).
    {
        let _autocast = AutocastGuard::new(Precision::AmpBf16, Device::Cpu);
        let low = model.forward(&batch, false).expect("autocast forward");
        assert_eq!(low.kind(), Kind::BFloat16);
        let diff = (low.to_kind(Kind::Float) - &output)
            .abs()
            .max()
            .double_value(&[]);
        assert!(diff < 0.1, "bf16 output differs by {diff}");
    }
    let case = dir.join("case.safetensors");
    Tensor::write_safetensors(&[("input", &batch), ("output", &output)], &case)
        .expect("write the case");
    let (code, text) = check_export(&exported, &case);
    assert_eq!(code, Some(0), "check_export.py failed:\n{text}");
    assert!(text.contains("14 tensors"), "{text}");
    eprintln!("torchscript: {}", text.trim());
}

#[test]
fn batch_methods_work_and_surgery_is_told_the_model_is_opaque() {
    let models = TempDir::new("ts-methods-models");
    let Some(file) = scripted(&models, "net.pt", &[]) else {
        return;
    };
    let toml = fashion("ts-methods", &file)
        .with_both_plugins()
        .algorithm("blurpool", "");
    let dir = TempDir::new("ts-methods");
    toml.write_to(&dir);
    let out = train(&dir, &["checkpoint.interval=3ba"], &[]);
    out.assert_success();
    assert!(
        out.stderr.contains(&format!(
            "the TorchScript model {} is opaque to surgery",
            file.display()
        )),
        "{}",
        out.dump()
    );
    assert!(
        out.stderr.contains("blurpool did not change any layers"),
        "{}",
        out.dump()
    );
    let lines = read_jsonl(&run_dir(&dir, "ts-methods").join("metrics.jsonl"));
    assert_eq!(train_losses(&lines).len(), 3);
    // A run with methods is exported from the model rebuilt with them: here nothing changed
    // the scripted module, so the file holds its plain state_dict.
    let ckpt = tessera::checkpoint::list(&run_dir(&dir, "ts-methods").join("checkpoints"))
        .first()
        .cloned()
        .expect("a checkpoint");
    let export = tessera(
        &[
            "export",
            &ckpt.display().to_string(),
            "--to",
            "m.safetensors",
        ],
        dir.path(),
        &[],
    );
    export.assert_success();
    assert!(
        export
            .stdout
            .contains("the exported network is the plain model"),
        "{}",
        export.dump()
    );

    // Without methods the losses differ: label smoothing and CutOut acted on the run.
    let plain_dir = TempDir::new("ts-plain");
    fashion("ts-methods", &file).write_to(&plain_dir);
    let plain = train(&plain_dir, &[], &[]);
    plain.assert_success();
    assert!(
        !plain.stderr.contains("opaque to surgery"),
        "{}",
        plain.dump()
    );
    let plain_lines = read_jsonl(&run_dir(&plain_dir, "ts-methods").join("metrics.jsonl"));
    assert_ne!(train_losses(&plain_lines), train_losses(&lines));
}

#[test]
fn killed_and_resumed_run_equals_the_straight_run_bit_for_bit() {
    let models = TempDir::new("ts-resume-models");
    let Some(file) = scripted(&models, "net.pt", &[]) else {
        return;
    };
    assert_killed_and_resumed_is_exact("ts-resume", |run| {
        let mut toml = fashion(run, &file);
        toml.max_duration = "8ba".to_owned();
        toml
    });
}

#[test]
fn a_changed_model_file_refuses_the_resume() {
    let models = TempDir::new("ts-changed-models");
    let Some(file) = scripted(&models, "net.pt", &[]) else {
        return;
    };
    let dir = TempDir::new("ts-changed");
    let mut toml = fashion("ts-changed", &file);
    toml.max_duration = "2ba".to_owned();
    dir.write("trainer.toml", &with_checkpoints(&toml, ""));
    train(&dir, &[], &[]).assert_success();
    let old = sha256_hex(&file);
    scripted(&models, "net.pt", &["--seed", "1"]).expect("scripted again");
    let out = train(
        &dir,
        &["checkpoint.autoresume=true", "train.max_duration=4ba"],
        &[],
    );
    out.assert_failure(&[
        &format!("trained from a TorchScript model with sha256 {old}"),
        &format!("{} now has sha256 {}", file.display(), sha256_hex(&file)),
    ]);
}

#[test]
fn files_that_do_not_fit_are_refused_naming_the_file() {
    let models = TempDir::new("ts-misfits");
    let Some(three) = scripted(&models, "rgb.pt", &["--channels", "3"]) else {
        return;
    };
    let seven = scripted(&models, "seven.pt", &["--classes", "7"]).expect("scripted");
    let junk = models.write("junk.pt", "not a zip archive");
    let missing = models.join("absent.pt");
    for (file, fragments) in [
        (
            &three,
            vec!["does not run on a batch of 1 x 28 x 28 images", "channels"],
        ),
        (&seven, vec!["an output of shape [2, 7]", "(N, 10)"]),
        (&junk, vec!["is not a TorchScript model"]),
        (&missing, vec!["model.torchscript", "does not exist"]),
    ] {
        let dir = TempDir::new("ts-misfit");
        fashion("ts-misfit", file).write_to(&dir);
        let shown = file.display().to_string();
        let mut all = vec![shown.as_str()];
        all.extend(fragments.iter().copied());
        train(&dir, &[], &[]).assert_failure(&all);
    }
}
