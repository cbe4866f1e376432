//! Precision and device settings, end to end on a tiny synthetic run.

use std::path::{Path, PathBuf};

use tessera::config;
use tessera::trainer::Trainer;

fn dir(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("tessera-{tag}-{}", std::process::id()))
}

fn config_text(out: &Path, model: &str, extra_train: &str) -> String {
    format!(
        r#"
run_name = "tiny"
output_dir = "{out}"
[data]
dataset = "synthetic"
batch_size = 16
eval_batch_size = 32
workers = 0
[data.synthetic]
samples = 64
eval_samples = 32
channels = 3
height = 12
width = 12
classes = 4
[model]
name = "{model}"
[optimizer]
name = "adamw"
lr = 0.01
[train]
max_duration = "4ba"
progress = false
{extra_train}
"#,
        out = out.display()
    )
}

#[test]
fn amp_bf16_trains_with_finite_loss_and_fp32_weights() {
    let d = dir("bf16");
    let cfg = config::from_str(
        &config_text(&d, "cnn", r#"precision = "amp_bf16""#),
        &d,
        "t.toml",
    )
    .unwrap();
    let mut trainer = Trainer::new(cfg, Vec::new()).unwrap();
    let summary = trainer.fit().unwrap();
    let eval = summary
        .record
        .evals
        .last()
        .expect("an evaluation at the end");
    assert!(eval.cross_entropy.is_finite(), "{eval:?}");
    // Autocast computes in bf16 but the weights stay fp32 (BatchNorm's int64 counters stay
    // int64).
    for e in trainer.model().params.entries() {
        let want = if e.name.ends_with(".num_batches_tracked") {
            tch::Kind::Int64
        } else {
            tch::Kind::Float
        };
        assert_eq!(e.tensor.kind(), want, "{}", e.name);
    }
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_missing_cuda_device_is_a_clear_error() {
    if tch::Cuda::is_available() {
        return; // this machine has a GPU: the case below cannot be produced
    }
    let d = dir("cuda");
    let cfg = config::from_str(
        &config_text(&d, "mlp", r#"device = "cuda:3""#),
        &d,
        "t.toml",
    )
    .unwrap();
    let err = Trainer::new(cfg, Vec::new())
        .err()
        .expect("refused")
        .to_string();
    assert!(
        err.contains("cuda:3") && err.contains("CUDA device"),
        "{err}"
    );
}

#[test]
fn auto_device_trains_and_writes_the_run_record() {
    let d = dir("auto");
    let cfg = config::from_str(
        &config_text(&d, "resnet20", r#"device = "auto""#),
        &d,
        "t.toml",
    )
    .unwrap();
    let run_dir = cfg.run_dir();
    let mut trainer = Trainer::new(cfg, Vec::new()).unwrap();
    trainer.fit().unwrap();
    assert_eq!(trainer.timestamp().batch, 4);
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run_dir.join("run.json")).unwrap()).unwrap();
    assert_eq!(record["batches"], 4);
    assert_eq!(record["samples"], 64);
    assert!(record["config"]["model"]["name"] == "resnet20");
    let metrics = std::fs::read_to_string(run_dir.join("metrics.jsonl")).unwrap();
    assert!(
        metrics.lines().any(|l| l.contains("\"kind\":\"eval\"")),
        "{metrics}"
    );
    let _ = std::fs::remove_dir_all(&d);
}
