//! A stand-in for the host's GPT-2 in unit tests ([`gpt2`]): its module tree (paths, kinds,
//! attributes, tensor names and shapes as `host/src/model/zoo/gpt2/` documents them) and
//! tensors, as the kit's [`StandIn`], which records the modules surgery puts in.

use tessera_plugin_api::kit::StandIn;
use tessera_plugin_api::random::splitmix64;
use tessera_plugin_api::tch::{Device, Kind, Tensor};

use crate::kinds::{
    EMBEDDING, GPT2_ATTENTION, GPT2_BLOCK, GPT2_MLP, LINEAR, LM_HEAD_PATH, TIED_LM_HEAD, WPE_PATH,
};

/// Sizes of a stand-in GPT-2.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sizes {
    /// Blocks.
    pub n_layer: i64,
    /// Heads.
    pub n_head: i64,
    /// Width.
    pub n_embd: i64,
    /// Context (rows of `transformer.wpe`).
    pub n_positions: i64,
    /// Vocabulary.
    pub vocab_size: i64,
    /// `lm_head` multiplies by `transformer.wte.weight`.
    pub tied: bool,
    /// Embedding, attention and residual dropout.
    pub dropout: f64,
}

impl Default for Sizes {
    fn default() -> Sizes {
        Sizes {
            n_layer: 2,
            n_head: 2,
            n_embd: 16,
            n_positions: 32,
            vocab_size: 40,
            tied: true,
            dropout: 0.0,
        }
    }
}

/// Normal draws from a seeded SplitMix64 stream (Box–Muller), independent of libtorch's global
/// generator: tests that run in parallel threads of one process get the same tensors for the
/// same seed.
#[derive(Debug, Clone)]
pub struct Normal {
    state: u64,
}

impl Normal {
    /// The stream of `seed`.
    pub fn new(seed: u64) -> Normal {
        Normal { state: seed }
    }

    fn uniform(&mut self) -> f64 {
        ((splitmix64(&mut self.state) >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// One standard normal draw.
    pub fn sample(&mut self) -> f64 {
        let (u, v) = (self.uniform(), self.uniform());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }

    /// A float32 CPU tensor of `shape` with normal(0, `std`) values.
    pub fn tensor(&mut self, shape: &[i64], std: f64) -> Tensor {
        let n: i64 = shape.iter().product();
        let values: Vec<f32> = (0..n).map(|_| (self.sample() * std) as f32).collect();
        Tensor::from_slice(&values).reshape(shape)
    }
}

/// A GPT-2 of `sizes` with Hugging Face's initialisation (normal 0.02, `c_proj` weights
/// 0.02/√(2 n_layer), unit layer-norm weights), drawn from [`Normal`] seeded with `seed` (as
/// is the stand-in's own uniform stream); the attention's and MLP's biases are normal 0.02 too
/// (GPT-2's are zero) so that tests see them. Every tensor is a trainable parameter.
pub fn gpt2(sizes: Sizes, seed: u64) -> StandIn {
    let mut normal = Normal::new(seed);
    let mut randn = |shape: &[i64], std: f64| normal.tensor(shape, std).set_requires_grad(true);
    let ones = |n: i64| Tensor::ones([n], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let zeros = |n: i64| Tensor::zeros([n], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let Sizes {
        n_layer,
        n_head,
        n_embd: c,
        n_positions: p,
        vocab_size: v,
        tied,
        dropout,
    } = sizes;
    let proj = 0.02 / (2.0 * n_layer as f64).sqrt();
    let model_attrs = [
        ("vocab_size", v as f64),
        ("n_positions", p as f64),
        ("n_embd", c as f64),
        ("n_layer", n_layer as f64),
        ("n_head", n_head as f64),
    ];
    let mut root_attrs = model_attrs.to_vec();
    root_attrs.push(("tie_embeddings", f64::from(u8::from(tied))));
    let emb = |rows: i64| [("num_embeddings", rows as f64), ("embedding_dim", c as f64)];
    let wte = randn(&[v, c], 0.02);
    let wpe = randn(&[p, c], 0.02);
    let mut model = StandIn::new(seed)
        .module("", "gpt2_lm_head_model", &root_attrs, vec![])
        .module("transformer", "gpt2_model", &model_attrs, vec![])
        .module("transformer.wte", EMBEDDING, &emb(v), vec![("weight", wte)])
        .module(WPE_PATH, EMBEDDING, &emb(p), vec![("weight", wpe)])
        .module("transformer.drop", "dropout", &[("p", dropout)], vec![])
        .module("transformer.h", "sequential", &[], vec![]);
    let ln = [
        ("normalized_shape", c as f64),
        ("eps", 1e-5),
        ("elementwise_affine", 1.0),
    ];
    for i in 0..n_layer {
        let block = format!("transformer.h.{i}");
        let block_attrs = [("n_embd", c as f64), ("n_head", n_head as f64)];
        model.add_module(&block, GPT2_BLOCK, &block_attrs, vec![]);
        let ln_1 = vec![("weight", ones(c)), ("bias", zeros(c))];
        model.add_module(&format!("{block}.ln_1"), "layer_norm", &ln, ln_1);
        let attn_attrs = [
            ("n_head", n_head as f64),
            ("n_embd", c as f64),
            ("n_positions", p as f64),
            ("attn_pdrop", dropout),
            ("resid_pdrop", dropout),
        ];
        let attn = vec![
            ("c_attn.weight", randn(&[c, 3 * c], 0.02)),
            ("c_attn.bias", randn(&[3 * c], 0.02)),
            ("c_proj.weight", randn(&[c, c], proj)),
            ("c_proj.bias", randn(&[c], 0.02)),
        ];
        model.add_module(&format!("{block}.attn"), GPT2_ATTENTION, &attn_attrs, attn);
        let ln_2 = vec![("weight", ones(c)), ("bias", zeros(c))];
        model.add_module(&format!("{block}.ln_2"), "layer_norm", &ln, ln_2);
        let mlp_attrs = [
            ("n_embd", c as f64),
            ("n_inner", 4.0 * c as f64),
            ("resid_pdrop", dropout),
        ];
        let mlp = vec![
            ("c_fc.weight", randn(&[c, 4 * c], 0.02)),
            ("c_fc.bias", randn(&[4 * c], 0.02)),
            ("c_proj.weight", randn(&[4 * c, c], proj)),
            ("c_proj.bias", randn(&[c], 0.02)),
        ];
        model.add_module(&format!("{block}.mlp"), GPT2_MLP, &mlp_attrs, mlp);
    }
    let ln_f = vec![("weight", ones(c)), ("bias", zeros(c))];
    model.add_module("transformer.ln_f", "layer_norm", &ln, ln_f);
    let head_attrs = [
        ("in_features", c as f64),
        ("out_features", v as f64),
        ("bias", 0.0),
    ];
    if tied {
        model.add_module(LM_HEAD_PATH, TIED_LM_HEAD, &head_attrs, vec![]);
    } else {
        let head = vec![("weight", randn(&[v, c], 0.02))];
        model.add_module(LM_HEAD_PATH, LINEAR, &head_attrs, head);
    }
    model
}
