//! Tessera's training step against a minimal hand-written tch loop on the same model and batch
//! (ResNet-20, batch 128 of 3×32×32, SGD with momentum and weight decay, fp32, CPU), measured
//! side by side in one process from the same initial weights: rounds rotate which loop goes
//! first, and the ratio of the medians is reported next to the ratio between two copies of the
//! same minimal loop (the noise floor of this comparison).
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

/// The baseline's name for one of Tessera's tensors (`layer2.0.shortcut.1.weight` →
/// `b10.scbn.weight`).
fn baseline_name(name: &str) -> String {
    let Some(rest) = name.strip_prefix("layer") else {
        return name.to_owned();
    };
    let mut parts = rest.splitn(3, '.');
    let (stage, block, tail) = (parts.next(), parts.next(), parts.next());
    let stage: usize = stage.and_then(|s| s.parse().ok()).unwrap_or(1);
    let tail = tail
        .unwrap_or_default()
        .replace("shortcut.0", "sc")
        .replace("shortcut.1", "scbn");
    format!("b{}{}.{tail}", stage - 1, block.unwrap_or("0"))
}

/// Starts the baseline from Tessera's initial weights, so both loops compute the same numbers
/// and only their overheads differ.
fn copy_weights(trainer: &tessera::trainer::Trainer, vs: &mut nn::VarStore) {
    let theirs = vs.variables();
    let _guard = tch::no_grad_guard();
    let mut copied = 0;
    // tch's BatchNorm keeps no `num_batches_tracked` counter (it only matters with momentum
    // `None`, which neither model uses).
    for e in trainer
        .model()
        .params
        .entries()
        .iter()
        .filter(|e| !e.name.ends_with(".num_batches_tracked"))
    {
        let name = baseline_name(&e.name);
        let mut target = theirs
            .get(&name)
            .unwrap_or_else(|| panic!("the baseline has no `{name}` (for `{}`)", e.name))
            .shallow_clone();
        target.copy_(&e.tensor);
        copied += 1;
    }
    assert_eq!(
        copied,
        theirs.len(),
        "every baseline tensor gets Tessera's value"
    );
}

fn main() {
    tessera::memory::tune_for_training();
    let rounds = env_usize("ROUNDS", 6);
    let steps = env_usize("STEPS", 5);
    let dir = std::env::temp_dir().join(format!("tessera-bench-{}", std::process::id()));
    tch::manual_seed(0);
    let input = Tensor::randn([BATCH, 3, 32, 32], (Kind::Float, Device::Cpu));
    let target = Tensor::randint(10, [BATCH], (Kind::Int64, Device::Cpu));

    let mut trainer = resnet20_trainer(&dir, Vec::new());
    // Two copies of the baseline: the second one measures how much two identical loops differ
    // in this process (allocation, cache and ordering effects) — the noise floor of the ratio.
    let baseline = || {
        let mut vs = nn::VarStore::new(Device::Cpu);
        let net = ResNet20::new(&vs.root());
        copy_weights(&trainer, &mut vs);
        let opt = nn::Sgd {
            momentum: 0.9,
            dampening: 0.0,
            wd: 5e-4,
            nesterov: false,
        }
        .build(&vs, 0.1)
        .expect("sgd");
        (vs, net, opt)
    };
    let (_vs_a, net_a, mut opt_a) = baseline();
    let (_vs_b, net_b, mut opt_b) = baseline();
    let minimal_step = |net: &ResNet20, opt: &mut nn::Optimizer| {
        let t = Instant::now();
        let loss = net
            .forward_t(&input, true)
            .cross_entropy_for_logits(&target);
        opt.backward_step(&loss);
        t.elapsed().as_secs_f64()
    };
    let mut tessera_step = || {
        let t = Instant::now();
        trainer
            .step(Batch::new(input.shallow_clone(), target.shallow_clone()), t)
            .expect("tessera step");
        t.elapsed().as_secs_f64()
    };

    for _ in 0..2 {
        tessera_step();
        minimal_step(&net_a, &mut opt_a);
        minimal_step(&net_b, &mut opt_b);
    }
    let (mut ours, mut theirs, mut twin) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        // Rotate which loop goes first.
        for k in 0..3 {
            for _ in 0..steps {
                match (round + k) % 3 {
                    0 => ours.push(tessera_step()),
                    1 => theirs.push(minimal_step(&net_a, &mut opt_a)),
                    _ => twin.push(minimal_step(&net_b, &mut opt_b)),
                }
            }
        }
    }
    let n = ours.len();
    let (med_ours, med_theirs, med_twin) =
        (median(&mut ours), median(&mut theirs), median(&mut twin));
    println!(
        "ResNet-20, batch {BATCH}, 3x32x32, SGD momentum 0.9, fp32, CPU, {} threads, {n} steps each",
        tch::get_num_threads()
    );
    println!("tessera step:           median {:7.1} ms", med_ours * 1e3);
    println!("minimal tch loop:       median {:7.1} ms", med_theirs * 1e3);
    println!("same loop, second copy: median {:7.1} ms", med_twin * 1e3);
    println!(
        "ratio tessera/minimal: {:.3}   noise floor (second copy/minimal): {:.3}",
        med_ours / med_theirs,
        med_twin / med_theirs
    );
    let _ = std::fs::remove_dir_all(&dir);
}
