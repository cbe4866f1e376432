//! Tessera's training step against a minimal hand-written tch loop on the same model and batch
//! (ResNet-20, batch 128 of 3×32×32, SGD with momentum and weight decay, fp32, CPU), measured
//! side by side in one process: rounds alternate which loop goes first, and the ratio of the
//! medians is reported.
//!
//! Run with `cargo bench -p tessera --bench step` (after `scripts/ensure-libtorch.sh`;
//! `ROUNDS=n STEPS=k` change the sample size).

use std::time::Instant;

use tch::nn::{self, ModuleT, OptimizerConfig};
use tch::{Device, Kind, Tensor};
use tessera::engine::Batch;

mod common;
use common::{env_usize, median, resnet20_trainer, BATCH};

/// ResNet-20 written directly with tch's `nn` layers: the "minimal loop" baseline.
struct Block {
    conv1: nn::Conv2D,
    bn1: nn::BatchNorm,
    conv2: nn::Conv2D,
    bn2: nn::BatchNorm,
    shortcut: Option<(nn::Conv2D, nn::BatchNorm)>,
}

fn conv(p: nn::Path, cin: i64, cout: i64, k: i64, stride: i64) -> nn::Conv2D {
    let cfg = nn::ConvConfig {
        stride,
        padding: k / 2,
        bias: false,
        ..Default::default()
    };
    nn::conv2d(p, cin, cout, k, cfg)
}

impl Block {
    fn new(p: nn::Path, cin: i64, cout: i64, stride: i64) -> Block {
        let shortcut = (stride != 1 || cin != cout).then(|| {
            (
                conv(&p / "sc", cin, cout, 1, stride),
                nn::batch_norm2d(&p / "scbn", cout, Default::default()),
            )
        });
        Block {
            conv1: conv(&p / "conv1", cin, cout, 3, stride),
            bn1: nn::batch_norm2d(&p / "bn1", cout, Default::default()),
            conv2: conv(&p / "conv2", cout, cout, 3, 1),
            bn2: nn::batch_norm2d(&p / "bn2", cout, Default::default()),
            shortcut,
        }
    }

    fn forward(&self, x: &Tensor, train: bool) -> Tensor {
        let y = x
            .apply(&self.conv1)
            .apply_t(&self.bn1, train)
            .relu()
            .apply(&self.conv2)
            .apply_t(&self.bn2, train);
        let s = match &self.shortcut {
            Some((c, b)) => x.apply(c).apply_t(b, train),
            None => x.shallow_clone(),
        };
        (y + s).relu()
    }
}

struct ResNet20 {
    conv1: nn::Conv2D,
    bn1: nn::BatchNorm,
    blocks: Vec<Block>,
    fc: nn::Linear,
}

impl ResNet20 {
    fn new(p: &nn::Path) -> ResNet20 {
        let mut blocks = Vec::new();
        let mut cin = 16;
        for stage in 0..3 {
            let cout = 16 << stage;
            for i in 0..3 {
                let stride = if stage > 0 && i == 0 { 2 } else { 1 };
                blocks.push(Block::new(p / format!("b{stage}{i}"), cin, cout, stride));
                cin = cout;
            }
        }
        ResNet20 {
            conv1: conv(p / "conv1", 3, 16, 3, 1),
            bn1: nn::batch_norm2d(p / "bn1", 16, Default::default()),
            blocks,
            fc: nn::linear(p / "fc", 64, 10, Default::default()),
        }
    }

    fn forward(&self, x: &Tensor, train: bool) -> Tensor {
        let mut y = x.apply(&self.conv1).apply_t(&self.bn1, train).relu();
        for b in &self.blocks {
            y = b.forward(&y, train);
        }
        y.mean_dim(&[2i64, 3][..], false, Kind::Float)
            .apply(&self.fc)
    }
}

impl std::fmt::Debug for ResNet20 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ResNet20")
    }
}

impl ModuleT for ResNet20 {
    fn forward_t(&self, xs: &Tensor, train: bool) -> Tensor {
        self.forward(xs, train)
    }
}

fn main() {
    let rounds = env_usize("ROUNDS", 6);
    let steps = env_usize("STEPS", 5);
    let dir = std::env::temp_dir().join(format!("tessera-bench-{}", std::process::id()));
    tch::manual_seed(0);
    let input = Tensor::randn([BATCH, 3, 32, 32], (Kind::Float, Device::Cpu));
    let target = Tensor::randint(10, [BATCH], (Kind::Int64, Device::Cpu));

    let mut trainer = resnet20_trainer(&dir, Vec::new());
    let vs = nn::VarStore::new(Device::Cpu);
    let net = ResNet20::new(&vs.root());
    let mut opt = nn::Sgd {
        momentum: 0.9,
        dampening: 0.0,
        wd: 5e-4,
        nesterov: false,
    }
    .build(&vs, 0.1)
    .expect("sgd");

    let mut tessera_step = || {
        let t = Instant::now();
        trainer
            .step(Batch::new(input.shallow_clone(), target.shallow_clone()), t)
            .expect("tessera step");
        t.elapsed().as_secs_f64()
    };
    let mut minimal_step = || {
        let t = Instant::now();
        let loss = net
            .forward_t(&input, true)
            .cross_entropy_for_logits(&target);
        opt.backward_step(&loss);
        t.elapsed().as_secs_f64()
    };

    for _ in 0..2 {
        tessera_step();
        minimal_step();
    }
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let run = |f: &mut dyn FnMut() -> f64, out: &mut Vec<f64>| {
            for _ in 0..steps {
                out.push(f());
            }
        };
        if round % 2 == 0 {
            run(&mut tessera_step, &mut ours);
            run(&mut minimal_step, &mut theirs);
        } else {
            run(&mut minimal_step, &mut theirs);
            run(&mut tessera_step, &mut ours);
        }
    }
    let (n_ours, n_theirs) = (ours.len(), theirs.len());
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let (mean_ours, mean_theirs) = (mean(&ours), mean(&theirs));
    let (med_ours, med_theirs) = (median(&mut ours), median(&mut theirs));
    println!(
        "ResNet-20, batch {BATCH}, 3x32x32, SGD momentum 0.9, fp32, CPU, {} threads",
        tch::get_num_threads()
    );
    println!(
        "tessera step:      median {:7.1} ms  mean {:7.1} ms  ({n_ours} steps)",
        med_ours * 1e3,
        mean_ours * 1e3
    );
    println!(
        "minimal tch loop:  median {:7.1} ms  mean {:7.1} ms  ({n_theirs} steps)",
        med_theirs * 1e3,
        mean_theirs * 1e3
    );
    println!(
        "ratio tessera/minimal: median {:.3}  mean {:.3}",
        med_ours / med_theirs,
        mean_ours / mean_theirs
    );
    let _ = std::fs::remove_dir_all(&dir);
}
