//! Gradient accumulation: one batch of 128 and four microbatches of 32 give the same gradients
//! (to float tolerance), on a model without batch statistics.

use std::path::Path;
use std::time::Instant;

use tch::{Device, Kind, Tensor};
use tessera::config;
use tessera::engine::Batch;
use tessera::trainer::Trainer;

fn trainer(dir: &Path, microbatch: usize) -> Trainer {
    let text = format!(
        r#"
run_name = "accumulation-{microbatch}"
output_dir = "{out}"
seed = 7
[data]
dataset = "synthetic"
batch_size = 128
workers = 0
[data.synthetic]
samples = 256
eval_samples = 16
channels = 1
height = 8
width = 8
classes = 10
[model]
name = "mlp"
hidden = [32, 16]
[optimizer]
name = "sgd"
lr = 0.1
momentum = 0.9
[train]
max_duration = "1ba"
microbatch_size = {microbatch}
progress = false
"#,
        out = dir.display()
    );
    Trainer::new(
        config::from_str(&text, dir, "acc.toml").unwrap(),
        Vec::new(),
    )
    .unwrap()
}

fn grads(t: &Trainer) -> Vec<(String, Tensor)> {
    t.model()
        .params
        .trainable()
        .map(|e| (e.name.clone(), e.tensor.grad().detach().copy()))
        .collect()
}

#[test]
fn one_by_128_equals_four_by_32() {
    let dir = std::env::temp_dir().join(format!("tessera-acc-{}", std::process::id()));
    tch::manual_seed(3);
    let input = Tensor::randn([128, 1, 8, 8], (Kind::Float, Device::Cpu));
    let target = Tensor::randint(10, [128], (Kind::Int64, Device::Cpu));

    let mut whole = trainer(&dir, 128);
    let mut split = trainer(&dir, 32);
    // Same seed, same init.
    for (a, b) in whole
        .model()
        .params
        .entries()
        .iter()
        .zip(split.model().params.entries())
    {
        assert!(a.tensor.equal(&b.tensor), "{} differs at init", a.name);
    }
    whole
        .step(Batch::new(input.copy(), target.copy()), Instant::now())
        .unwrap();
    split
        .step(Batch::new(input.copy(), target.copy()), Instant::now())
        .unwrap();
    assert_eq!(
        split.engine().count(tessera::engine::Event::BEFORE_FORWARD),
        4
    );
    assert_eq!(
        whole.engine().count(tessera::engine::Event::BEFORE_FORWARD),
        1
    );

    let (g1, g4) = (grads(&whole), grads(&split));
    assert_eq!(g1.len(), 6);
    for ((name, a), (_, b)) in g1.iter().zip(&g4) {
        let diff = (a - b).abs().max().double_value(&[]);
        let scale = a.abs().max().double_value(&[]).max(1e-12);
        assert!(
            diff <= 1e-5 * scale + 1e-7,
            "{name}: max diff {diff} (scale {scale})"
        );
    }
    // And so are the weights after the step.
    for (a, b) in whole
        .model()
        .params
        .entries()
        .iter()
        .zip(split.model().params.entries())
    {
        let diff = (&a.tensor - &b.tensor).abs().max().double_value(&[]);
        assert!(diff < 1e-6, "{}: {diff}", a.name);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
