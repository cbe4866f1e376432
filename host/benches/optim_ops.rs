//! libtorch operator calls and time of one optimizer step, per-parameter path vs fused
//! multi-tensor path, on the parameters of ResNet-50 (ImageNet, 1000 classes) and GPT-2 small
//! (124M, vocabulary 50257) built from Tessera's model zoo, with the GPT rule's two groups
//! (no decay for biases, norms and embeddings). Operator calls are counted with an
//! `at::RecordFunction` thread-local callback (`host/csrc/optim.cpp`): "top" are the calls
//! Tessera makes, "all" include the calls operators make inside. Times are medians of
//! `ROUNDS` rounds that alternate which path goes first (each round: one step of each).
//!
//! Run with `cargo bench -p tessera --bench optim_ops` (after `scripts/ensure-libtorch.sh`);
//! `ROUNDS=n` (default 7) and `MODELS=resnet50,gpt2` change what runs.

use std::time::Instant;

use tch::{Device, Kind, Tensor};
use tessera::model::{Gpt2Config, InputShape, Model, ModelConfig, ModelName};
use tessera::optim::schedule::Schedule;
use tessera::optim::{
    AdamW, GroupSpec, Implementation, OpCounter, Optimizer, OptimizerConfig, ParamKind, Rule, Sgd,
};

mod common;
use common::{env_usize, median};

fn model(name: &str) -> Model {
    let (config, input, classes) = match name {
        "resnet50" => (
            ModelConfig {
                name: ModelName::Resnet50,
                torchscript: None,
                hidden: Vec::new(),
                widths: Vec::new(),
                width: ModelName::Resnet50.default_width(),
                num_classes: 1000,
                dropout: 0.0,
                norm: None,
                gpt2: None,
                bert: None,
                llama: None,
                vit: None,
                init: None,
            },
            InputShape {
                channels: 3,
                height: 224,
                width: 224,
            },
            1000,
        ),
        "gpt2" => (
            ModelConfig {
                name: ModelName::Gpt2,
                torchscript: None,
                hidden: Vec::new(),
                widths: Vec::new(),
                width: None,
                num_classes: 50257,
                dropout: 0.0,
                norm: None,
                gpt2: Some(Gpt2Config {
                    vocab_size: Some(50257),
                    ..Gpt2Config::default()
                }),
                bert: None,
                llama: None,
                vit: None,
                init: None,
            },
            InputShape {
                channels: 1,
                height: 1,
                width: 1024,
            },
            50257,
        ),
        other => panic!("MODELS: unknown model {other:?} (resnet50, gpt2)"),
    };
    Model::build(&config, input, classes, Device::Cpu).expect("building the model")
}

fn optimizer(model: &Model, rule: &Rule, implementation: Implementation) -> Optimizer {
    let config = OptimizerConfig {
        rule: rule.clone(),
        implementation,
        groups: vec![GroupSpec {
            kinds: vec![ParamKind::Bias, ParamKind::Norm, ParamKind::Embedding],
            weight_decay: Some(0.0),
            ..GroupSpec::named("no_decay")
        }],
    };
    Optimizer::new(
        config,
        Schedule::default(),
        1.0,
        &model.params,
        &model.root.walk(),
    )
    .expect("the GPT rule fits the model")
}

/// Gives every trainable parameter a gradient (small, deterministic) without a forward pass.
fn set_grads(model: &Model) {
    for e in model.params.trainable() {
        let g = Tensor::full(e.tensor.size(), 1e-3, (Kind::Float, Device::Cpu));
        // d(Σ p·g)/dp = g.
        (&e.tensor * g).sum(Kind::Float).backward();
    }
}

fn main() {
    let rounds = env_usize("ROUNDS", 7);
    let models = std::env::var("MODELS").unwrap_or_else(|_| "resnet50,gpt2".to_owned());
    let rules = [
        (
            "sgd",
            Rule::Sgd(Sgd {
                weight_decay: 5e-5,
                ..Sgd::default()
            }),
        ),
        ("adamw", Rule::AdamW(AdamW::default())),
    ];
    println!(
        "{:<9} {:<6} {:>7} {:>10} {:>10} {:>10} {:>10} {:>9} {:>9}",
        "model",
        "rule",
        "params",
        "top/step",
        "all/step",
        "top fused",
        "all fused",
        "ms",
        "ms fused"
    );
    for name in models.split(',') {
        // Two copies: one per path, so that each keeps its own state.
        let (per_model, fused_model) = (model(name), model(name));
        let params = per_model.params.trainable().count();
        for (label, rule) in &rules {
            let mut per = optimizer(&per_model, rule, Implementation::PerParam);
            let mut fused = optimizer(&fused_model, rule, Implementation::Fused);
            let mut counts = [None, None];
            let mut times = [Vec::new(), Vec::new()];
            // A first step makes the state (not timed, not counted), then the rounds.
            for round in 0..=rounds {
                let order: [usize; 2] = if round % 2 == 0 { [0, 1] } else { [1, 0] };
                for which in order {
                    let (opt, m) = if which == 0 {
                        (&mut per, &per_model)
                    } else {
                        (&mut fused, &fused_model)
                    };
                    opt.zero_grad();
                    set_grads(m);
                    let counter = OpCounter::start().expect("op counter");
                    let started = Instant::now();
                    opt.step().expect("optimizer step");
                    let ms = started.elapsed().as_secs_f64() * 1e3;
                    let count = counter.stop().expect("op counter");
                    if round > 0 {
                        times[which].push(ms);
                        counts[which] = Some(count);
                    }
                }
            }
            let (Some(c_per), Some(c_fused)) = (counts[0], counts[1]) else {
                panic!("ROUNDS must be at least 1");
            };
            println!(
                "{:<9} {:<6} {:>7} {:>10} {:>10} {:>10} {:>10} {:>9.1} {:>9.1}",
                name,
                label,
                params,
                c_per.top,
                c_per.all,
                c_fused.top,
                c_fused.all,
                median(&mut times[0]),
                median(&mut times[1])
            );
        }
    }
}
