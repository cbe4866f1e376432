//! Shared by the benchmarks: the ResNet-20 trainer they time and small statistics helpers.
// Each benchmark uses part of this module.
#![allow(dead_code)]

use std::path::Path;

use tessera::engine::Algorithm;
use tessera::trainer::Trainer;

/// Samples per batch.
pub const BATCH: i64 = 128;

/// A Tessera trainer for ResNet-20 on synthetic 3×32×32 batches of 128 (SGD, momentum 0.9,
/// weight decay 5e-4, fp32, no progress bar), with `extra` methods.
pub fn resnet20_trainer(dir: &Path, extra: Vec<Box<dyn Algorithm>>) -> Trainer {
    let text = format!(
        r#"
run_name = "bench"
output_dir = "{out}"
[data]
dataset = "synthetic"
batch_size = {BATCH}
workers = 0
[data.synthetic]
samples = {BATCH}
eval_samples = 16
channels = 3
height = 32
width = 32
classes = 10
[model]
name = "resnet20"
[optimizer]
name = "sgd"
lr = 0.1
momentum = 0.9
weight_decay = 5e-4
[train]
max_duration = "1000000ba"
progress = false
"#,
        out = dir.display()
    );
    let cfg = tessera::config::from_str(&text, dir, "bench.toml").expect("bench config");
    Trainer::new(cfg, extra).expect("trainer")
}

/// The median (sorts `v`).
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// An integer from the environment, or `default`.
pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
