//! `train.activation_checkpointing` gives the gradients and the training of the model without
//! it, bit for bit on the CPU: a GPT-2 with dropout (the generators' states replayed in the
//! recompute) and a ResNet with BatchNorm (its running statistics move once per step).
//!
//! Dropout draws from libtorch's one CPU generator, shared by every thread of the process, so
//! these tests live in their own test binary and take turns.

use std::path::Path;
use std::sync::Mutex;

use tch::{Device, Kind, Tensor};
use tessera::config;
use tessera::model::{
    ActivationCheckpointing, Gpt2Config, InputShape, Model, ModelConfig, ModelName,
};
use tessera::trainer::Trainer;

static GENERATOR: Mutex<()> = Mutex::new(());

/// `name`'s model built from seed 0, with its blocks checkpointed when `checkpointed`.
fn model(name: ModelName, checkpointed: bool) -> Model {
    let mut config = ModelConfig::new(name, 16);
    config.gpt2 = Some(Gpt2Config {
        n_layer: 2,
        n_embd: 16,
        n_head: 2,
        n_positions: 8,
        ..Gpt2Config::default()
    });
    config.dropout = 0.1;
    config.width = Some(4);
    let input = InputShape {
        channels: 3,
        height: 8,
        width: 8,
    };
    tch::manual_seed(0);
    let mut m = Model::build(&config, input, 16, Device::Cpu).unwrap();
    if checkpointed {
        let paths = ActivationCheckpointing::default().select(&m);
        assert!(!paths.is_empty());
        m.checkpoint_activations(&paths).unwrap();
    }
    m
}

/// One training forward and backward from seed 1: the loss, then a draw from the CPU generator
/// (the recompute must leave the generator where the forward left it).
fn step(m: &Model, input: &Tensor, target: &Tensor) -> (Tensor, Tensor) {
    tch::manual_seed(1);
    let out = m.forward(input, true).unwrap();
    let classes = *out.size().last().unwrap();
    let loss = out
        .reshape([-1, classes])
        .cross_entropy_for_logits(&target.reshape([-1]));
    loss.backward();
    (loss, Tensor::rand([4], (Kind::Float, Device::Cpu)))
}

/// Every gradient and buffer of the checkpointed model equals the plain one's.
fn assert_same_gradients(name: ModelName, input: &Tensor, target: &Tensor) {
    let (plain, checkpointed) = (model(name, false), model(name, true));
    let kinds: Vec<String> = checkpointed
        .root
        .walk()
        .into_iter()
        .map(|l| l.kind)
        .collect();
    assert!(kinds.iter().any(|k| k == "activation_checkpoint"));
    let (loss_a, draw_a) = step(&plain, input, target);
    let (loss_b, draw_b) = step(&checkpointed, input, target);
    assert!(loss_a.equal(&loss_b), "{name:?}: the losses differ");
    assert!(draw_a.equal(&draw_b), "{name:?}: the generator moved");
    let (a, b) = (plain.params.entries(), checkpointed.params.entries());
    assert_eq!(a.len(), b.len());
    for (a, b) in a.iter().zip(b) {
        assert_eq!(a.name, b.name);
        assert!(a.tensor.equal(&b.tensor), "{name:?}: `{}` differs", a.name);
        if a.tensor.requires_grad() {
            let (ga, gb) = (a.tensor.grad(), b.tensor.grad());
            assert!(ga.defined(), "{name:?}: `{}` has no gradient", a.name);
            assert!(
                ga.equal(&gb),
                "{name:?}: the gradient of `{}` differs",
                a.name
            );
        }
    }
}

#[test]
fn gradients_equal_the_plain_models_bit_for_bit() {
    let _turn = GENERATOR.lock().unwrap_or_else(|p| p.into_inner());
    tch::manual_seed(5);
    let ids = Tensor::randint(16, [3, 8], (Kind::Int64, Device::Cpu));
    assert_same_gradients(ModelName::Gpt2, &ids, &ids.roll([-1], [1]));
    let images = Tensor::randn([4, 3, 8, 8], (Kind::Float, Device::Cpu));
    let labels = Tensor::randint(16, [4], (Kind::Int64, Device::Cpu));
    assert_same_gradients(ModelName::Resnet20, &images, &labels);
}

/// Trains 3 batches of `data` and `model` (with `train` lines) in `dir`; the training losses
/// logged and the trainer.
fn train(dir: &Path, run: &str, data: &str, model: &str, train: &str) -> (Vec<f64>, Trainer) {
    let text = format!(
        "run_name = \"{run}\"\noutput_dir = \"{out}\"\nseed = 7\n[data]\n{data}\n[model]\n\
         {model}\n[optimizer]\nname = \"adamw\"\nlr = 0.003\n[train]\nmax_duration = \"3ba\"\n\
         log_interval = \"1ba\"\nprogress = false\n{train}\n",
        out = dir.display()
    );
    let mut trainer = Trainer::new(config::from_str(&text, dir, "ac.toml").unwrap(), Vec::new())
        .unwrap_or_else(|e| panic!("{e}"));
    trainer.fit().unwrap_or_else(|e| panic!("{e}"));
    let metrics = std::fs::read_to_string(dir.join(run).join("metrics.jsonl")).unwrap();
    let losses = metrics
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|l| l["kind"] == "train")
        .map(|l| l["data"]["loss"].as_f64().unwrap())
        .collect();
    (losses, trainer)
}

#[test]
fn training_through_the_trainer_is_the_same() {
    let _turn = GENERATOR.lock().unwrap_or_else(|p| p.into_inner());
    let dir = std::env::temp_dir().join(format!("tessera-ac-{}", std::process::id()));
    let text = "dataset = \"synthetic-text\"\nbatch_size = 4\neval_batch_size = 4\nworkers = 0\n\
                [data.text]\nseq_len = 16\nvocab_size = 32\ntokens = 4000\neval_tokens = 200";
    let gpt2 = "name = \"gpt2\"\nn_layer = 2\nn_head = 2\nn_embd = 16\nn_positions = 16\n\
                dropout = 0.1";
    let images = "dataset = \"synthetic\"\nbatch_size = 8\neval_batch_size = 8\nworkers = 0\n\
                  [data.synthetic]\nsamples = 32\neval_samples = 8\nchannels = 3\nheight = 8\n\
                  width = 8\nclasses = 10";
    let resnet = "name = \"resnet20\"\nwidth = 4";
    for (label, data, model) in [("gpt2", text, gpt2), ("resnet", images, resnet)] {
        let on = "activation_checkpointing = { unit = \"block\" }";
        let (plain_losses, plain) = train(&dir, &format!("{label}-plain"), data, model, "");
        let (losses, checkpointed) = train(&dir, &format!("{label}-ac"), data, model, on);
        assert_eq!(plain_losses.len(), 3, "{label}");
        assert_eq!(losses, plain_losses, "{label}");
        let walk = checkpointed.model().root.walk();
        assert!(
            walk.iter().any(|l| l.kind == "activation_checkpoint"),
            "{label}"
        );
        let entries = checkpointed.model().params.entries();
        for (a, b) in plain.model().params.entries().iter().zip(entries) {
            assert!(a.tensor.equal(&b.tensor), "{label}: `{}` differs", a.name);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
