//! Tessera's fixed cost per training step: `Trainer::step` on a model so small that its
//! arithmetic takes microseconds (an MLP 16-8-2 on batches of 8, SGD with momentum, fp32,
//! CPU, one libtorch thread), against the same network and optimizer written as a minimal tch
//! loop, from the same initial weights, side by side in one process. The difference of the
//! medians is what Tessera adds to every step (events, clock, schedule, loss bookkeeping,
//! its optimizer over libtorch ops); a second copy of the minimal loop gives the noise floor.
//!
//! Run with `cargo bench -p tessera --bench overhead` (`ROUNDS=n STEPS=k` change the sample
//! sizes).

use std::time::Instant;

use tch::nn::{self, Module, OptimizerConfig};
use tch::{Device, Kind, Tensor};
use tessera::engine::Batch;
use tessera::trainer::Trainer;

mod common;
use common::{env_usize, median};

const BATCH: i64 = 8;

fn trainer(dir: &std::path::Path) -> Trainer {
    let text = format!(
        r#"
run_name = "overhead"
output_dir = "{out}"
[data]
dataset = "synthetic"
batch_size = {BATCH}
workers = 0
[data.synthetic]
samples = {BATCH}
eval_samples = 8
channels = 1
height = 4
width = 4
classes = 2
[model]
name = "mlp"
hidden = [8]
[optimizer]
name = "sgd"
lr = 0.01
momentum = 0.9
[train]
max_duration = "100000000ba"
threads = 1
progress = false
"#,
        out = dir.display()
    );
    let cfg = tessera::config::from_str(&text, dir, "overhead.toml").expect("bench config");
    Trainer::new(cfg, Vec::new()).expect("trainer")
}

/// The same MLP with tch's layers, named like Tessera's so the weights copy by name.
fn baseline(trainer: &Trainer) -> (nn::VarStore, nn::Sequential, nn::Optimizer) {
    let vs = nn::VarStore::new(Device::Cpu);
    let root = vs.root() / "layers";
    let net = nn::seq()
        .add_fn(|x| x.flatten(1, -1))
        .add(nn::linear(&root / "0", 16, 8, Default::default()))
        .add_fn(|x| x.relu())
        .add(nn::linear(&root / "2", 8, 2, Default::default()));
    {
        let _guard = tch::no_grad_guard();
        let theirs = vs.variables();
        for e in trainer.model().params.entries() {
            let mut target = theirs
                .get(&e.name)
                .unwrap_or_else(|| panic!("the baseline has no `{}`", e.name))
                .shallow_clone();
            target.copy_(&e.tensor);
        }
    }
    let opt = nn::Sgd {
        momentum: 0.9,
        ..Default::default()
    }
    .build(&vs, 0.01)
    .expect("sgd");
    (vs, net, opt)
}

fn main() {
    tessera::memory::tune_for_training();
    let rounds = env_usize("ROUNDS", 8);
    let steps = env_usize("STEPS", 500);
    let dir = std::env::temp_dir().join(format!("tessera-overhead-{}", std::process::id()));
    let mut trainer = trainer(&dir);
    tch::set_num_threads(1);
    tch::manual_seed(0);
    let input = Tensor::randn([BATCH, 1, 4, 4], (Kind::Float, Device::Cpu));
    let target = Tensor::randint(2, [BATCH], (Kind::Int64, Device::Cpu));
    let (_vs_a, net_a, mut opt_a) = baseline(&trainer);
    let (_vs_b, net_b, mut opt_b) = baseline(&trainer);

    let minimal = |net: &nn::Sequential, opt: &mut nn::Optimizer| {
        let t = Instant::now();
        let loss = net.forward(&input).cross_entropy_for_logits(&target);
        opt.backward_step(&loss);
        t.elapsed().as_secs_f64()
    };
    let mut ours = || {
        let t = Instant::now();
        trainer
            .step(Batch::new(input.shallow_clone(), target.shallow_clone()), t)
            .expect("tessera step");
        t.elapsed().as_secs_f64()
    };
    for _ in 0..50 {
        ours();
        minimal(&net_a, &mut opt_a);
        minimal(&net_b, &mut opt_b);
    }
    let (mut t, mut m, mut c) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        for k in 0..3 {
            for _ in 0..steps {
                match (round + k) % 3 {
                    0 => t.push(ours()),
                    1 => m.push(minimal(&net_a, &mut opt_a)),
                    _ => c.push(minimal(&net_b, &mut opt_b)),
                }
            }
        }
    }
    let n = t.len();
    let (t, m, c) = (median(&mut t), median(&mut m), median(&mut c));
    println!("MLP 16-8-2, batch {BATCH}, SGD momentum 0.9, fp32, CPU, 1 thread, {n} steps each");
    println!("tessera step:           median {:7.1} µs", t * 1e6);
    println!("minimal tch loop:       median {:7.1} µs", m * 1e6);
    println!("same loop, second copy: median {:7.1} µs", c * 1e6);
    println!(
        "fixed cost per step (tessera - minimal): {:+.1} µs   noise floor (copy - minimal): {:+.1} µs",
        (t - m) * 1e6,
        (c - m) * 1e6
    );
    let _ = std::fs::remove_dir_all(&dir);
}
