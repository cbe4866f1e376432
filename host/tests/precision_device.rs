//! Precision and device settings, end to end on a tiny synthetic run.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tch::Kind;
use tessera::config;
use tessera::engine::{Algorithm, Event, Hook, MethodError, Stage};
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

/// Records the dtype of the model's output at every training and evaluation forward.
struct OutputKinds(Arc<Mutex<Vec<(Event, Kind)>>>);

impl Algorithm for OutputKinds {
    fn name(&self) -> &str {
        "output_kinds"
    }
    fn hooks(&self) -> Vec<Hook> {
        vec![
            Hook::at(Event::AFTER_FORWARD),
            Hook::at(Event::EVAL_AFTER_FORWARD),
        ]
    }
    fn on_event(&mut self, event: Event, stage: &mut Stage<'_>) -> Result<(), MethodError> {
        let output = stage
            .run("output")?
            .tensor("output")
            .ok_or_else(|| MethodError("no output after the forward".into()))?;
        self.0.lock().unwrap().push((event, output.kind()));
        Ok(())
    }
}

/// Trains the tiny cnn at `precision`; returns the trainer and the output dtypes it saw.
fn train_cnn(tag: &str, precision: &str) -> (Trainer, Vec<(Event, Kind)>) {
    let d = dir(tag);
    let cfg = config::from_str(
        &config_text(&d, "cnn", &format!("precision = \"{precision}\"")),
        &d,
        "t.toml",
    )
    .unwrap();
    let kinds = Arc::new(Mutex::new(Vec::new()));
    let mut trainer = Trainer::new(cfg, vec![Box::new(OutputKinds(kinds.clone()))]).unwrap();
    let summary = trainer.fit().unwrap();
    let eval = summary
        .record
        .evals
        .last()
        .expect("an evaluation at the end");
    assert!(eval.cross_entropy.is_finite(), "{eval:?}");
    let _ = std::fs::remove_dir_all(&d);
    let kinds = kinds.lock().unwrap().clone();
    (trainer, kinds)
}

/// Every forward of training (4 batches) and evaluation produced an output of `kind`.
fn assert_outputs(kinds: &[(Event, Kind)], kind: Kind) {
    for event in [Event::AFTER_FORWARD, Event::EVAL_AFTER_FORWARD] {
        let seen: Vec<Kind> = kinds
            .iter()
            .filter(|(e, _)| *e == event)
            .map(|(_, k)| *k)
            .collect();
        assert!(!seen.is_empty(), "no {event:?} in {kinds:?}");
        assert!(seen.iter().all(|k| *k == kind), "{event:?}: {seen:?}");
    }
}

#[test]
fn amp_bf16_computes_in_bf16_and_keeps_fp32_weights() {
    // Under bf16 autocast the model's convolutions and linear layers compute in bf16, so the
    // output the trainer hands to methods (training and evaluation) is bf16; in fp32 it is fp32.
    let (trainer, kinds) = train_cnn("bf16", "amp_bf16");
    assert_outputs(&kinds, Kind::BFloat16);
    let (_, kinds) = train_cnn("fp32", "fp32");
    assert_outputs(&kinds, Kind::Float);
    // Autocast computes in bf16 but the weights stay fp32 (BatchNorm's int64 counters stay
    // int64).
    for e in trainer.model().params.entries() {
        let want = if e.name.ends_with(".num_batches_tracked") {
            Kind::Int64
        } else {
            Kind::Float
        };
        assert_eq!(e.tensor.kind(), want, "{}", e.name);
    }
}

#[test]
fn a_missing_cuda_device_is_a_clear_error() {
    // One past the last usable device (cuda:0 without CUDA) never exists.
    let usable = if tch::Cuda::is_available() {
        tch::Cuda::device_count()
    } else {
        0
    };
    let device = format!("cuda:{usable}");
    let d = dir("cuda");
    let cfg = config::from_str(
        &config_text(&d, "mlp", &format!("device = \"{device}\"")),
        &d,
        "t.toml",
    )
    .unwrap();
    let err = Trainer::new(cfg, Vec::new())
        .err()
        .expect("refused")
        .to_string();
    assert!(
        err.contains(&format!(
            "device = \"{device}\" but {usable} CUDA device(s) are usable"
        )),
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
