//! The step without host reads, proven by what libtorch sees: every zoo model at every
//! precision, and every plugin of the repository on a model it applies to, trains a few steps
//! through the real binary on the CPU, and run.json's `host_reads` — counted by the observer in
//! the C++ shim (a `RecordFunction` callback, `host/csrc/observe.cpp`), not by the trainer —
//! holds 0 reads inside the steps. A method that truly needs a host value is listed in
//! [`NEEDS_HOST_VALUES`] with its reason and the reads it makes, and its card says so; any other
//! read fails the test, naming its source (the trainer, a method, a plugin's module) and the
//! operator.
//!
//! On a CPU run a "read" is what would be one on a GPU: `item` and the `*_value` reads,
//! data-dependent shapes (`nonzero`, `masked_select`, `unique`), and every blocking copy to or
//! from a device (`to(cpu)`, an upload of a host-made tensor without `non_blocking`).

use serde_json::Value;
use tessera_tests::plugins::{
    plugin_settings, repository_plugins, COMPOSER_LANGUAGE_PLUGINS, MODDED_NANOGPT_PLUGINS,
};
use tessera_tests::*;

/// Sources that read on the host inside a step by design: (source as run.json names it, why,
/// reads in the steps of the run that trains it here).
const NEEDS_HOST_VALUES: &[(&str, &str, u64)] = &[];

/// The precisions every zoo model trains at.
const PRECISIONS: [&str; 3] = ["fp32", "amp_bf16", "amp_fp16"];

/// Steps per run.
const STEPS: u64 = 3;

/// Trains `toml` (on the CPU, `STEPS` batches, a log line at the end only) in a fresh folder and
/// returns run.json's `host_reads`.
fn host_reads(label: &str, mut toml: TrainerToml, overrides: &[&str]) -> Value {
    let dir = TempDir::new(label);
    toml.max_duration = format!("{STEPS}ba");
    toml.device = Some("cpu".to_owned());
    let text = toml
        .render()
        .replace("log_interval = \"1ba\"", "log_interval = \"50ba\"");
    dir.write("trainer.toml", &text);
    let out = train(&dir, overrides, &[]);
    out.assert_success();
    let record = read_json(&run_dir(&dir, &toml.run_name).join("run.json"));
    let reads = record["host_reads"].clone();
    assert_eq!(
        reads["observed"], true,
        "{label}: the observer was not armed: {reads:#}"
    );
    assert_eq!(reads["steps"], STEPS, "{label}: {reads:#}");
    // The trainer's own reads are among the observer's: the end of the run reads the losses.
    let total = reads["total"].as_u64().expect("total");
    let counted = reads["counted"]["total"].as_u64().expect("counted");
    assert!(counted >= 1 && total >= counted, "{label}: {reads:#}");
    reads
}

/// Asserts that the steps read nothing on the host but what [`NEEDS_HOST_VALUES`] lists.
fn assert_no_reads(label: &str, reads: &Value) {
    let by_source = reads["in_steps_by_source"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let mut unexpected = Vec::new();
    for (source, ops) in &by_source {
        let n: u64 = ops
            .as_object()
            .map(|o| o.values().filter_map(Value::as_u64).sum())
            .unwrap_or(0);
        match NEEDS_HOST_VALUES.iter().find(|(s, _, _)| s == source) {
            Some((_, _, expected)) if *expected == n => {}
            Some((_, why, expected)) => unexpected.push(format!(
                "{source}: {n} reads, listed with {expected} ({why}): {ops}"
            )),
            None => unexpected.push(format!("{source}: {n} reads ({ops})")),
        }
    }
    assert!(
        unexpected.is_empty(),
        "{label}: reads on the host inside the steps:\n  {}\n{reads:#}",
        unexpected.join("\n  ")
    );
    let listed: u64 = by_source
        .keys()
        .filter_map(|s| NEEDS_HOST_VALUES.iter().find(|(n, _, _)| n == s))
        .map(|(_, _, n)| n)
        .sum();
    assert_eq!(
        reads["in_steps"].as_u64(),
        Some(listed),
        "{label}: {reads:#}"
    );
}

/// `toml` at every precision of [`PRECISIONS`]: no reads in the steps.
fn at_every_precision(label: &str, toml: TrainerToml, overrides: &[&str]) {
    for precision in PRECISIONS {
        let mut t = toml.clone();
        t.run_name = format!("{label}-{precision}");
        t.precision = Some(precision.to_owned());
        let run = t.run_name.clone();
        let reads = host_reads(&run, t, overrides);
        assert_no_reads(&run, &reads);
    }
}

/// Fashion-MNIST in batches of 4, one evaluation batch of 4: what the step reads does not
/// depend on the batch size, and ResNet-50 at three precisions stays cheap on the CPU.
const SMALL_BATCHES: [&str; 2] = ["data.batch_size=4", "data.eval_batch_size=4"];

fn vision(run: &str, model: &str) -> TrainerToml {
    require_fashion_mnist();
    let mut toml = TrainerToml::new(run);
    toml.model = model.to_owned();
    toml
}

#[test]
fn cnn_and_mlp_steps_read_nothing() {
    at_every_precision(
        "cnn",
        vision("cnn", "name = \"cnn\"\nwidth = 8"),
        &SMALL_BATCHES,
    );
    at_every_precision("mlp", vision("mlp", "name = \"mlp\""), &SMALL_BATCHES);
}

/// ResNet-20 as it is; ResNet-18 and ResNet-50 at a quarter of their width (16 channels in the
/// stem instead of 64): the same modules and operators in the same order, a sixteenth of the
/// arithmetic (what a step reads does not depend on the channel count, as it does not on the
/// batch size).
#[test]
fn resnet_steps_read_nothing() {
    for (name, model) in [
        ("resnet20", "name = \"resnet20\""),
        ("resnet18", "name = \"resnet18\"\nwidth = 16"),
        ("resnet50", "name = \"resnet50\"\nwidth = 16"),
    ] {
        at_every_precision(name, vision(name, model), &SMALL_BATCHES);
    }
}

#[test]
fn airbench_steps_read_nothing() {
    at_every_precision(
        "airbench",
        vision("airbench", "name = \"airbench\"\nwidths = [8, 16, 16]"),
        &SMALL_BATCHES,
    );
}

#[test]
fn vit_steps_read_nothing() {
    let toml = TrainerToml {
        model: "name = \"vit_tiny\"\nembed_dim = 32\ndepth = 2\nnum_heads = 2\npatch_size = 8"
            .to_owned(),
        optimizer: "name = \"adamw\"\nlr = 0.001".to_owned(),
        data: synthetic_rgb_data(64),
        ..TrainerToml::new("vit")
    };
    at_every_precision("vit", toml, &[]);
}

#[test]
fn gpt2_steps_read_nothing() {
    at_every_precision("gpt2", TrainerToml::tiny_gpt("gpt2"), &[]);
}

fn tiny_bert(run: &str) -> TrainerToml {
    let mut toml = TrainerToml::tiny_gpt(run);
    toml.model = "name = \"bert\"\nn_layer = 2\nn_head = 2\nn_embd = 32\nn_inner = 64\n\
                  n_positions = 32"
        .to_owned();
    toml.data = format!("{}\n[data.mlm]\nprobability = 0.15\n", text_data(32, None));
    toml
}

#[test]
fn bert_steps_read_nothing() {
    at_every_precision("bert", tiny_bert("bert"), &[]);
}

#[test]
fn torchscript_steps_read_nothing() {
    if !python_can_import("torch", "TorchScript models") {
        return;
    }
    let models = TempDir::new("reads-ts-model");
    let file = models.join("cnn.pt");
    let path = file.display().to_string();
    let out =
        python(&["scripts/make_torchscript_model.py", &path]).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        out.status.success(),
        "scripting the model failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let toml = vision(
        "torchscript",
        &format!("torchscript = {}", toml_string(&path)),
    );
    at_every_precision("torchscript", toml, &SMALL_BATCHES);
}

/// Every vision plugin of the repository in one ResNet-50 run (the reads are told apart by
/// source: each method's hooks, each plugin module's forward).
#[test]
fn every_vision_plugin_reads_nothing_but_what_it_lists() {
    let plugins: Vec<String> = repository_plugins()
        .into_iter()
        .filter(|p| p != "patch_whitening")
        .collect();
    let mut toml = vision("vision-plugins", "name = \"resnet50\"");
    for p in &plugins {
        toml = toml.algorithm(p, plugin_settings(p));
    }
    // Batches of 32, as tests/methods/all_plugins.rs trains them (ghost batch norm's ghost batches of 16
    // need at least that).
    let reads = host_reads(
        "vision-plugins",
        toml,
        &["data.batch_size=32", "data.eval_batch_size=32"],
    );
    assert_no_reads("every vision plugin on ResNet-50", &reads);
}

#[test]
fn patch_whitening_reads_nothing() {
    let toml = vision("whitening", "name = \"airbench\"\nwidths = [8, 16, 16]")
        .algorithm("patch_whitening", "");
    let reads = host_reads("whitening", toml, &SMALL_BATCHES);
    assert_no_reads("patch_whitening on airbench", &reads);
}

#[test]
fn language_plugins_read_nothing_but_what_they_list() {
    for (label, group) in [
        ("composer-lm", &COMPOSER_LANGUAGE_PLUGINS[..]),
        ("modded-nanogpt", &MODDED_NANOGPT_PLUGINS[..]),
    ] {
        let mut toml = TrainerToml::tiny_gpt(label);
        for p in group {
            toml = toml.algorithm(p, language_settings(p));
        }
        let reads = host_reads(label, toml, &[]);
        assert_no_reads(label, &reads);
    }
    // BERT's own variants of GLU and ALiBi.
    let toml = tiny_bert("bert-methods")
        .algorithm("gated_linear_units", "")
        .algorithm("alibi", "max_sequence_length = 32");
    let reads = host_reads("bert-methods", toml, &[]);
    assert_no_reads("GLU and ALiBi on BERT", &reads);
}

/// Settings that make a language method act within the run's 3 steps.
fn language_settings(plugin: &str) -> &'static str {
    match plugin {
        "seq_length_warmup" => {
            "duration = 0.67\nmin_seq_length = 16\nmax_seq_length = 32\nstep_size = 16"
        }
        "alibi" => "max_sequence_length = 32",
        _ => "",
    }
}

/// `train.cuda_graphs` is refused at start, naming what cannot be captured: a method hooked
/// inside the step, a plugin module, an optimizer whose step needs host numbers, and (last) a
/// device that is not CUDA. Nothing trains.
#[test]
fn cuda_graphs_are_refused_cleanly_naming_the_reason() {
    require_fashion_mnist();
    let dir = TempDir::new("graphs");
    let cases: Vec<(&str, TrainerToml, &[&str])> = vec![
        (
            "cpu",
            TrainerToml::new("graphs-cpu"),
            &[
                "train.cuda_graphs = true: needs a CUDA device",
                "on the CPU",
            ],
        ),
        (
            "method",
            TrainerToml::new("graphs-method").algorithm("label_smoothing", "smoothing = 0.1"),
            &["method `label_smoothing` runs at `", "cuda_graphs = false"],
        ),
        (
            "module",
            TrainerToml::new("graphs-module").algorithm("blurpool", ""),
            &[
                "the model holds the plugin module `blur_",
                "from a method's surgery",
            ],
        ),
        (
            "optimizer",
            TrainerToml {
                optimizer: "name = \"lion\"\nlr = 0.0001".to_owned(),
                ..TrainerToml::new("graphs-lion")
            },
            &["optimizer.name = \"lion\""],
        ),
    ];
    for (label, mut toml, wanted) in cases {
        toml.device = Some("cpu".to_owned());
        dir.write("trainer.toml", &toml.render());
        let out = train(&dir, &["train.cuda_graphs=true"], &[]);
        let mut expected = vec!["train.cuda_graphs = true"];
        expected.extend_from_slice(wanted);
        out.assert_failure(&expected);
        assert!(
            !run_dir(&dir, &toml.run_name).join("run.json").exists(),
            "{label}: nothing trains"
        );
    }
}
