//! GPT-2 (Radford et al. 2019) as Hugging Face's `GPT2LMHeadModel` writes it: the same module
//! tree, parameter names, shapes (`Conv1D` weights stored `(in, out)`), initialisation and
//! computation, so that weights map 1:1 to its `state_dict` and the logits agree.
//!
//! # The module tree (the contract with method plugins)
//!
//! Paths, kinds and attributes as the module tree lists them; `C` = `n_embd`, `V` =
//! `vocab_size`, `P` = `n_positions`, `L` = `n_layer`, `i` in `0..L`:
//!
//! | path | kind | attributes | tensors (shape) |
//! | --- | --- | --- | --- |
//! | `` (root) | `gpt2_lm_head_model` | `vocab_size`, `n_positions`, `n_embd`, `n_layer`, `n_head`, `tie_embeddings` | |
//! | `transformer` | `gpt2_model` | `vocab_size`, `n_positions`, `n_embd`, `n_layer`, `n_head` | |
//! | `transformer.wte` | `embedding` | `num_embeddings` = V, `embedding_dim` = C | `weight` (V, C) |
//! | `transformer.wpe` | `embedding` | `num_embeddings` = P, `embedding_dim` = C | `weight` (P, C) |
//! | `transformer.drop` | `dropout` | `p` | |
//! | `transformer.h` | `sequential` | | |
//! | `transformer.h.{i}` | `gpt2_block` | `n_embd`, `n_head` | |
//! | `transformer.h.{i}.ln_1` | `layer_norm` | `normalized_shape` = C, `eps`, `elementwise_affine` | `weight`, `bias` (C) |
//! | `transformer.h.{i}.attn` | `gpt2_attention` | `n_head`, `n_embd`, `n_positions`, `attn_pdrop`, `resid_pdrop` | `c_attn.weight` (C, 3C), `c_attn.bias` (3C), `c_proj.weight` (C, C), `c_proj.bias` (C) |
//! | `transformer.h.{i}.ln_2` | `layer_norm` | as `ln_1` | `weight`, `bias` (C) |
//! | `transformer.h.{i}.mlp` | `gpt2_mlp` | `n_embd`, `n_inner` = 4C, `resid_pdrop` | `c_fc.weight` (C, 4C), `c_fc.bias` (4C), `c_proj.weight` (4C, C), `c_proj.bias` (C) |
//! | `transformer.ln_f` | `layer_norm` | as `ln_1` | `weight`, `bias` (C) |
//! | `lm_head` | `tied_lm_head` (tied) or `linear` (untied) | `in_features` = C, `out_features` = V, `bias` = false | untied: `weight` (V, C); tied: none of its own |
//!
//! What each module receives and returns (B sequences of T tokens):
//! - the root and `transformer`: int64 token ids `(B, T)`; the root returns logits `(B, T, V)`,
//!   `transformer` the final hidden states `(B, T, C)`. While `transformer.wpe` is an
//!   `embedding`, T may be at most its `num_embeddings` (P); a longer input is an error.
//! - `transformer.wte`: the token ids `(B, T)` → `(B, T, C)`.
//! - `transformer.wpe`: the position ids `arange(T)` as int64 `(1, T)` → `(1, T, C)` (anything
//!   that broadcasts against `(B, T, C)`), added to the token embeddings. A plugin that removes
//!   learned positions (ALiBi) replaces this module, e.g. by one returning zeros; the rest of
//!   the model then accepts any T.
//! - `transformer.h.{i}`: `(B, T, C)` → `(B, T, C)`, computing
//!   `x = x + attn(ln_1(x)); x = x + mlp(ln_2(x))` through its children, which surgery may
//!   replace (a `layer_norm` by LowPrecisionLayerNorm's, ...).
//! - `attn`: causal self-attention, `(B, T, C)` → `(B, T, C)`: `qkv = x @ c_attn.weight +
//!   c_attn.bias` split into q, k, v of `n_head` heads of `C / n_head`; libtorch's fused
//!   `scaled_dot_product_attention` with `is_causal` (scale `1/sqrt(C / n_head)`, dropout
//!   `attn_pdrop` on the weights in training only); heads merged; `@ c_proj.weight +
//!   c_proj.bias`; dropout `resid_pdrop` in training. No mask buffer: any T works.
//! - `mlp`: `dropout(gelu_tanh(x @ c_fc.weight + c_fc.bias) @ c_proj.weight + c_proj.bias)`
//!   (Hugging Face's `gelu_new`).
//! - `lm_head`: `(B, T, C)` → `(B, T, V)`, `x @ weightᵀ` without bias.
//!
//! # Tied embeddings
//!
//! With `tie_embeddings` (the default), `lm_head` multiplies by `transformer.wte.weight` itself
//! (the same tensor, so gradients of both uses add up in it). The store — and so the optimizer,
//! checkpoints and resume — holds that tensor once, as `transformer.wte.weight`; the tree lists no
//! tensor under `lm_head`. `tessera export` writes it a second time as `lm_head.weight`, because
//! Hugging Face's `state_dict()` holds both names ([`Layer::export`] of the tied head).

use tch::{nn::Init, Kind, TchError, Tensor};

use super::{
    Attr, Dropout, Embedding, ExportTree, Exported, KvCache, Layer, LayerNorm, Sequential,
};
use crate::model::{tree::join, Gpt2Config, ParamStore};

/// Hugging Face's `initializer_range`: the standard deviation of every weight's normal init.
const INIT_STD: f64 = 0.02;

/// Hugging Face's `Conv1D`: `x @ weight + bias` over the last dimension, `weight` `(in, out)`,
/// computed as its `addmm` is.
fn conv1d(xs: &Tensor, weight: &Tensor, bias: &Tensor) -> Result<Tensor, TchError> {
    let mut size = xs.size();
    let nx = size.pop().unwrap_or(0);
    size.push(weight.size().last().copied().unwrap_or(0));
    bias.f_addmm(&xs.f_reshape([-1, nx])?, weight)?
        .f_reshape(size.as_slice())
}

/// Dropout with probability `p` in training, the identity otherwise.
fn dropout(xs: Tensor, p: f64, train: bool) -> Result<Tensor, TchError> {
    if train && p > 0.0 {
        xs.f_dropout(p, true)
    } else {
        Ok(xs)
    }
}

/// `(B, T, C)` of a hidden-state input, checking its rank and width (GPT-2's and BERT's).
pub(super) fn btc(xs: &Tensor, n_embd: i64, what: &str) -> Result<(i64, i64, i64), TchError> {
    match xs.size().as_slice() {
        &[b, t, c] if c == n_embd => Ok((b, t, c)),
        s => Err(TchError::Shape(format!(
            "{what}: expected an input (batch, tokens, {n_embd}), got {s:?}"
        ))),
    }
}

/// GPT-2's causal self-attention (Hugging Face's `GPT2Attention`), kind `gpt2_attention`.
#[derive(Debug)]
pub struct Gpt2Attention {
    c_attn_weight: Tensor,
    c_attn_bias: Tensor,
    c_proj_weight: Tensor,
    c_proj_bias: Tensor,
    n_head: i64,
    n_embd: i64,
    n_positions: i64,
    attn_pdrop: f64,
    resid_pdrop: f64,
}

impl Gpt2Attention {
    /// The attention of a model with `config`'s sizes whose tensors join `store` under `path`
    /// (`c_attn.weight` (C, 3C), `c_attn.bias`, `c_proj.weight` (C, C), `c_proj.bias`), weights
    /// normal(0, 0.02), `c_proj.weight` normal(0, 0.02/sqrt(2 n_layer)), biases zero.
    pub fn new(
        store: &mut ParamStore,
        path: &str,
        config: &Gpt2Config,
        dropout: f64,
    ) -> Result<Gpt2Attention, TchError> {
        let c = config.n_embd as i64;
        let at = |name| join(path, name);
        Ok(Gpt2Attention {
            c_attn_weight: store.parameter(at("c_attn.weight"), &[c, 3 * c], normal(INIT_STD))?,
            c_attn_bias: store.parameter(at("c_attn.bias"), &[3 * c], Init::Const(0.0))?,
            c_proj_weight: store.parameter(at("c_proj.weight"), &[c, c], proj_init(config))?,
            c_proj_bias: store.parameter(at("c_proj.bias"), &[c], Init::Const(0.0))?,
            n_head: config.n_head as i64,
            n_embd: c,
            n_positions: config.n_positions as i64,
            attn_pdrop: dropout,
            resid_pdrop: dropout,
        })
    }
}

/// normal(0, `std`).
pub(super) fn normal(std: f64) -> Init {
    Init::Randn {
        mean: 0.0,
        stdev: std,
    }
}

/// Hugging Face's init of every `c_proj.weight`: normal(0, 0.02 / sqrt(2 n_layer)).
fn proj_init(config: &Gpt2Config) -> Init {
    normal(INIT_STD / (2.0 * config.n_layer as f64).sqrt())
}

impl Layer for Gpt2Attention {
    fn kind(&self) -> &str {
        "gpt2_attention"
    }

    fn attrs(&self) -> Vec<(&str, Attr)> {
        vec![
            ("n_head", Attr::Int(self.n_head)),
            ("n_embd", Attr::Int(self.n_embd)),
            ("n_positions", Attr::Int(self.n_positions)),
            ("attn_pdrop", Attr::Float(self.attn_pdrop)),
            ("resid_pdrop", Attr::Float(self.resid_pdrop)),
        ]
    }

    fn tensors(&self) -> Vec<(&str, &Tensor)> {
        vec![
            ("c_attn.weight", &self.c_attn_weight),
            ("c_attn.bias", &self.c_attn_bias),
            ("c_proj.weight", &self.c_proj_weight),
            ("c_proj.bias", &self.c_proj_bias),
        ]
    }

    fn forward(&self, xs: &Tensor, train: bool) -> Result<Tensor, TchError> {
        let [q, k, v] = self.qkv(xs)?;
        let p = if train { self.attn_pdrop } else { 0.0 };
        let y = Tensor::f_scaled_dot_product_attention(
            &q,
            &k,
            &v,
            None::<Tensor>,
            p,
            true,
            None,
            false,
        )?;
        let y = conv1d(&merge_heads(&y)?, &self.c_proj_weight, &self.c_proj_bias)?;
        dropout(y, self.resid_pdrop, train)
    }

    fn forward_cached(&self, xs: &Tensor, cache: &mut KvCache) -> Result<Tensor, TchError> {
        let [q, k, v] = self.qkv(xs)?;
        let (k, v) = cache.append(&k, &v)?;
        let mask = cache.mask().map(Tensor::shallow_clone);
        let causal = mask.is_none() && q.size()[2] > 1;
        let y = Tensor::f_scaled_dot_product_attention(&q, &k, &v, mask, 0.0, causal, None, false)?;
        conv1d(&merge_heads(&y)?, &self.c_proj_weight, &self.c_proj_bias)
    }
}

impl Gpt2Attention {
    /// The queries, keys and values of `xs` `(B, T, C)` in heads `(B, n_head, T, C / n_head)`.
    fn qkv(&self, xs: &Tensor) -> Result<[Tensor; 3], TchError> {
        let (b, t, c) = btc(xs, self.n_embd, "gpt2 attention")?;
        let (h, d) = (self.n_head, self.n_embd / self.n_head);
        let qkv = conv1d(xs, &self.c_attn_weight, &self.c_attn_bias)?;
        let heads = |part: &Tensor| -> Result<Tensor, TchError> {
            part.f_reshape([b, t, h, d])?.f_transpose(1, 2)
        };
        let parts = qkv.f_split(c, 2)?;
        let [q, k, v] = parts.as_slice() else {
            return Err(TchError::Shape(format!(
                "gpt2 attention: c_attn gave {} parts, not 3",
                parts.len()
            )));
        };
        Ok([heads(q)?, heads(k)?, heads(v)?])
    }
}

/// Attention heads `(B, H, T, D)` merged back into features `(B, T, H·D)`.
pub(super) fn merge_heads(y: &Tensor) -> Result<Tensor, TchError> {
    let (b, h, t, d) = y.size4()?;
    y.f_transpose(1, 2)?
        .f_contiguous()?
        .f_reshape([b, t, h * d])
}

/// GPT-2's feed-forward block (Hugging Face's `GPT2MLP`), kind `gpt2_mlp`.
#[derive(Debug)]
pub struct Gpt2Mlp {
    c_fc_weight: Tensor,
    c_fc_bias: Tensor,
    c_proj_weight: Tensor,
    c_proj_bias: Tensor,
    n_embd: i64,
    n_inner: i64,
    resid_pdrop: f64,
}

impl Gpt2Mlp {
    /// The MLP (inner width 4C) whose tensors join `store` under `path` (`c_fc.weight` (C, 4C),
    /// `c_fc.bias`, `c_proj.weight` (4C, C), `c_proj.bias`), initialised as
    /// [`Gpt2Attention::new`]'s.
    pub fn new(
        store: &mut ParamStore,
        path: &str,
        config: &Gpt2Config,
        dropout: f64,
    ) -> Result<Gpt2Mlp, TchError> {
        let c = config.n_embd as i64;
        let inner = 4 * c;
        let at = |name| join(path, name);
        Ok(Gpt2Mlp {
            c_fc_weight: store.parameter(at("c_fc.weight"), &[c, inner], normal(INIT_STD))?,
            c_fc_bias: store.parameter(at("c_fc.bias"), &[inner], Init::Const(0.0))?,
            c_proj_weight: store.parameter(at("c_proj.weight"), &[inner, c], proj_init(config))?,
            c_proj_bias: store.parameter(at("c_proj.bias"), &[c], Init::Const(0.0))?,
            n_embd: c,
            n_inner: inner,
            resid_pdrop: dropout,
        })
    }
}

impl Layer for Gpt2Mlp {
    fn kind(&self) -> &str {
        "gpt2_mlp"
    }

    fn attrs(&self) -> Vec<(&str, Attr)> {
        vec![
            ("n_embd", Attr::Int(self.n_embd)),
            ("n_inner", Attr::Int(self.n_inner)),
            ("resid_pdrop", Attr::Float(self.resid_pdrop)),
        ]
    }

    fn tensors(&self) -> Vec<(&str, &Tensor)> {
        vec![
            ("c_fc.weight", &self.c_fc_weight),
            ("c_fc.bias", &self.c_fc_bias),
            ("c_proj.weight", &self.c_proj_weight),
            ("c_proj.bias", &self.c_proj_bias),
        ]
    }

    fn is_position_wise(&self) -> bool {
        true
    }

    fn forward(&self, xs: &Tensor, train: bool) -> Result<Tensor, TchError> {
        btc(xs, self.n_embd, "gpt2 mlp")?;
        let h = conv1d(xs, &self.c_fc_weight, &self.c_fc_bias)?.f_gelu("tanh")?;
        let y = conv1d(&h, &self.c_proj_weight, &self.c_proj_bias)?;
        dropout(y, self.resid_pdrop, train)
    }
}

/// A transformer block (Hugging Face's `GPT2Block`), kind `gpt2_block`:
/// `x = x + attn(ln_1(x)); x = x + mlp(ln_2(x))`, its four children replaceable by path.
#[derive(Debug)]
pub struct Gpt2Block {
    ln_1: Box<dyn Layer>,
    attn: Box<dyn Layer>,
    ln_2: Box<dyn Layer>,
    mlp: Box<dyn Layer>,
    n_embd: i64,
    n_head: i64,
}

impl Gpt2Block {
    /// Block `path` (`transformer.h.{i}`) of a model with `config`'s sizes.
    pub fn new(
        store: &mut ParamStore,
        path: &str,
        config: &Gpt2Config,
        dropout: f64,
    ) -> Result<Gpt2Block, TchError> {
        let c = config.n_embd as i64;
        let eps = config.layer_norm_epsilon;
        let at = |name| join(path, name);
        let ln_1 = LayerNorm::with_eps(store, &at("ln_1"), c, eps)?;
        let attn = Gpt2Attention::new(store, &at("attn"), config, dropout)?;
        let ln_2 = LayerNorm::with_eps(store, &at("ln_2"), c, eps)?;
        let mlp = Gpt2Mlp::new(store, &at("mlp"), config, dropout)?;
        Ok(Gpt2Block {
            ln_1: Box::new(ln_1),
            attn: Box::new(attn),
            ln_2: Box::new(ln_2),
            mlp: Box::new(mlp),
            n_embd: c,
            n_head: config.n_head as i64,
        })
    }
}

impl Layer for Gpt2Block {
    fn kind(&self) -> &str {
        "gpt2_block"
    }

    fn attrs(&self) -> Vec<(&str, Attr)> {
        vec![
            ("n_embd", Attr::Int(self.n_embd)),
            ("n_head", Attr::Int(self.n_head)),
        ]
    }

    fn children(&self) -> Vec<(&str, &dyn Layer)> {
        vec![
            ("ln_1", self.ln_1.as_ref()),
            ("attn", self.attn.as_ref()),
            ("ln_2", self.ln_2.as_ref()),
            ("mlp", self.mlp.as_ref()),
        ]
    }

    fn child_mut(&mut self, name: &str) -> Option<&mut Box<dyn Layer>> {
        match name {
            "ln_1" => Some(&mut self.ln_1),
            "attn" => Some(&mut self.attn),
            "ln_2" => Some(&mut self.ln_2),
            "mlp" => Some(&mut self.mlp),
            _ => None,
        }
    }

    fn forward(&self, xs: &Tensor, train: bool) -> Result<Tensor, TchError> {
        let a = self.attn.forward(&self.ln_1.forward(xs, train)?, train)?;
        let xs = xs.f_add(&a)?;
        let m = self.mlp.forward(&self.ln_2.forward(&xs, train)?, train)?;
        xs.f_add(&m)
    }

    fn forward_cached(&self, xs: &Tensor, cache: &mut KvCache) -> Result<Tensor, TchError> {
        let normed = self.ln_1.forward_cached(xs, cache)?;
        let xs = xs.f_add(&self.attn.forward_cached(&normed, cache)?)?;
        let normed = self.ln_2.forward_cached(&xs, cache)?;
        xs.f_add(&self.mlp.forward_cached(&normed, cache)?)
    }
}

/// The decoder without its head (Hugging Face's `GPT2Model`, path `transformer`), kind
/// `gpt2_model`: token ids `(B, T)` to the final hidden states `(B, T, C)`.
#[derive(Debug)]
pub struct Gpt2Model {
    wte: Box<dyn Layer>,
    wpe: Box<dyn Layer>,
    drop: Box<dyn Layer>,
    h: Box<dyn Layer>,
    ln_f: Box<dyn Layer>,
    config: Gpt2Config,
    vocab_size: i64,
}

/// Whether `layer` is an `embedding`, and then its row count: the positions a learned position
/// table covers (GPT-2's `wpe`, BERT's `position_embeddings`) while no method replaced it.
pub(super) fn embedding_rows(layer: &dyn Layer) -> Option<i64> {
    if layer.kind() != "embedding" {
        return None;
    }
    layer.attrs().into_iter().find_map(|(k, v)| match (k, v) {
        ("num_embeddings", Attr::Int(n)) => Some(n),
        _ => None,
    })
}

impl Layer for Gpt2Model {
    fn kind(&self) -> &str {
        "gpt2_model"
    }

    fn attrs(&self) -> Vec<(&str, Attr)> {
        let c = &self.config;
        vec![
            ("vocab_size", Attr::Int(self.vocab_size)),
            ("n_positions", Attr::Int(c.n_positions as i64)),
            ("n_embd", Attr::Int(c.n_embd as i64)),
            ("n_layer", Attr::Int(c.n_layer as i64)),
            ("n_head", Attr::Int(c.n_head as i64)),
        ]
    }

    fn children(&self) -> Vec<(&str, &dyn Layer)> {
        vec![
            ("wte", self.wte.as_ref()),
            ("wpe", self.wpe.as_ref()),
            ("drop", self.drop.as_ref()),
            ("h", self.h.as_ref()),
            ("ln_f", self.ln_f.as_ref()),
        ]
    }

    fn child_mut(&mut self, name: &str) -> Option<&mut Box<dyn Layer>> {
        match name {
            "wte" => Some(&mut self.wte),
            "wpe" => Some(&mut self.wpe),
            "drop" => Some(&mut self.drop),
            "h" => Some(&mut self.h),
            "ln_f" => Some(&mut self.ln_f),
            _ => None,
        }
    }

    fn forward(&self, ids: &Tensor, train: bool) -> Result<Tensor, TchError> {
        let t = match (ids.kind(), ids.size().as_slice()) {
            (Kind::Int64, &[_, t]) => t,
            (kind, size) => {
                return Err(TchError::Shape(format!(
                    "gpt2: expected int64 token ids (batch, tokens), got {kind:?} {size:?}"
                )))
            }
        };
        self.check_context(t)?;
        let positions = Tensor::f_arange(t, (Kind::Int64, ids.device()))?.f_unsqueeze(0)?;
        let x = self
            .wte
            .forward(ids, train)?
            .f_add(&self.wpe.forward(&positions, train)?)?;
        let x = self.drop.forward(&x, train)?;
        let x = self.h.forward(&x, train)?;
        self.ln_f.forward(&x, train)
    }

    fn forward_cached(&self, ids: &Tensor, cache: &mut KvCache) -> Result<Tensor, TchError> {
        self.check_context(cache.past() + ids.size().last().copied().unwrap_or(0))?;
        let positions = cache.positions()?.shallow_clone();
        let x = self
            .wte
            .forward_cached(ids, cache)?
            .f_add(&self.wpe.forward_cached(&positions, cache)?)?;
        let x = self.drop.forward_cached(&x, cache)?;
        let x = self.h.forward_cached(&x, cache)?;
        self.ln_f.forward_cached(&x, cache)
    }
}

impl Gpt2Model {
    /// Refuses sequences of `t` tokens beyond the learned position table (while `wpe` is one).
    fn check_context(&self, t: i64) -> Result<(), TchError> {
        match embedding_rows(self.wpe.as_ref()) {
            Some(rows) if t > rows => Err(TchError::Shape(format!(
                "gpt2: the input has {t} tokens per sequence, more than the model's context of \
                 {rows} (`[model] n_positions`, the rows of the position embedding \
                 `transformer.wpe`)"
            ))),
            _ => Ok(()),
        }
    }
}

/// GPT-2's output projection: `x @ weightᵀ`, no bias. Tied (kind `tied_lm_head`), `weight` is
/// the token embedding's (held by the store as `transformer.wte.weight` only; exported a second
/// time as `lm_head.weight`); untied (kind `linear`), its own `weight` `(V, C)`.
#[derive(Debug)]
pub struct LmHead {
    weight: Tensor,
    tied: bool,
    in_features: i64,
    out_features: i64,
}

impl LmHead {
    /// A head multiplying by `weight`, the token embedding's (`tied_lm_head`).
    pub(super) fn tied(weight: Tensor, in_features: i64, out_features: i64) -> LmHead {
        LmHead {
            weight,
            tied: true,
            in_features,
            out_features,
        }
    }

    /// A head with its own `weight` `(V, C)` (kind `linear`).
    pub(super) fn untied(weight: Tensor, in_features: i64, out_features: i64) -> LmHead {
        LmHead {
            weight,
            tied: false,
            in_features,
            out_features,
        }
    }
}

impl Layer for LmHead {
    fn kind(&self) -> &str {
        if self.tied {
            "tied_lm_head"
        } else {
            "linear"
        }
    }

    fn attrs(&self) -> Vec<(&str, Attr)> {
        vec![
            ("in_features", Attr::Int(self.in_features)),
            ("out_features", Attr::Int(self.out_features)),
            ("bias", Attr::Bool(false)),
        ]
    }

    fn tensors(&self) -> Vec<(&str, &Tensor)> {
        if self.tied {
            Vec::new()
        } else {
            vec![("weight", &self.weight)]
        }
    }

    fn is_position_wise(&self) -> bool {
        true
    }

    fn forward(&self, xs: &Tensor, _train: bool) -> Result<Tensor, TchError> {
        xs.f_linear(&self.weight, None::<Tensor>)
    }

    fn export(&self) -> Result<Exported, TchError> {
        if !self.tied {
            return Ok(Exported::Plain);
        }
        Ok(Exported::Folded(ExportTree {
            tensors: vec![("weight".to_owned(), self.weight.shallow_clone())],
            kept: Vec::new(),
        }))
    }
}

/// GPT-2 with its language-model head (Hugging Face's `GPT2LMHeadModel`), the root, kind
/// `gpt2_lm_head_model`: token ids `(B, T)` to logits `(B, T, vocab_size)`. See the module
/// documentation for the tree.
#[derive(Debug)]
pub struct Gpt2LmHeadModel {
    transformer: Box<dyn Layer>,
    lm_head: Box<dyn Layer>,
    config: Gpt2Config,
    vocab_size: i64,
}

impl Gpt2LmHeadModel {
    /// A GPT-2 of `config`'s sizes whose logits cover `vocab_size` tokens (the config's
    /// `vocab_size`, else `num_classes`), with `dropout` as its embedding, attention and residual
    /// dropout, its tensors in `store` under Hugging Face's names. Sizes that do not fit (a zero
    /// count, `n_embd` not a multiple of `n_head`, a `vocab_size` below `num_classes`) are errors
    /// naming the `[model]` key.
    pub fn new(
        store: &mut ParamStore,
        config: &Gpt2Config,
        dropout: f64,
        num_classes: i64,
    ) -> Result<Gpt2LmHeadModel, TchError> {
        let vocab_size = validate(config, num_classes)?;
        let c = config.n_embd as i64;
        let wte = Embedding::new(store, "transformer.wte", vocab_size, c, normal(INIT_STD))?;
        let wpe = Embedding::new(
            store,
            "transformer.wpe",
            config.n_positions as i64,
            c,
            normal(INIT_STD),
        )?;
        let mut h = Sequential::new();
        for i in 0..config.n_layer {
            let path = format!("transformer.h.{i}");
            h = h.add(
                i.to_string(),
                Gpt2Block::new(store, &path, config, dropout)?,
            );
        }
        let eps = config.layer_norm_epsilon;
        let ln_f = LayerNorm::with_eps(store, "transformer.ln_f", c, eps)?;
        let weight = if config.tie_embeddings {
            wte.weight().shallow_clone()
        } else {
            store.parameter(
                "lm_head.weight".to_owned(),
                &[vocab_size, c],
                normal(INIT_STD),
            )?
        };
        let lm_head = LmHead {
            weight,
            tied: config.tie_embeddings,
            in_features: c,
            out_features: vocab_size,
        };
        let transformer = Gpt2Model {
            wte: Box::new(wte),
            wpe: Box::new(wpe),
            drop: Box::new(Dropout::new(dropout)),
            h: Box::new(h),
            ln_f: Box::new(ln_f),
            config: config.clone(),
            vocab_size,
        };
        Ok(Gpt2LmHeadModel {
            transformer: Box::new(transformer),
            lm_head: Box::new(lm_head),
            config: config.clone(),
            vocab_size,
        })
    }
}

/// Checks `config` against itself and `num_classes`; returns the vocabulary size.
fn validate(config: &Gpt2Config, num_classes: i64) -> Result<i64, TchError> {
    check_sizes(
        "gpt2",
        &[
            ("n_layer", config.n_layer),
            ("n_head", config.n_head),
            ("n_embd", config.n_embd),
            ("n_positions", config.n_positions),
        ],
        (config.n_embd, config.n_head),
        config.layer_norm_epsilon,
        (config.vocab_size, num_classes),
    )
}

/// Checks a transformer's `[model]` sizes (GPT-2's, BERT's): every count in `counts` at least 1,
/// `n_embd` a multiple of `n_head`, a positive layer-norm epsilon, and the vocabulary (the
/// config's `vocab_size`, else the data's `vocabulary`) at least the data's; returns the
/// vocabulary size. Errors name the key, prefixed with `model`.
pub(super) fn check_sizes(
    model: &str,
    counts: &[(&str, usize)],
    (n_embd, n_head): (usize, usize),
    layer_norm_epsilon: f64,
    (vocab_size, vocabulary): (Option<usize>, i64),
) -> Result<i64, TchError> {
    let bad = |msg: String| Err(TchError::Shape(format!("{model}: {msg}")));
    for (key, v) in counts {
        if *v == 0 {
            return bad(format!("`[model] {key}` must be at least 1, got 0"));
        }
    }
    if !n_embd.is_multiple_of(n_head) {
        return bad(format!(
            "`[model] n_embd` ({n_embd}) must be a multiple of `n_head` ({n_head})"
        ));
    }
    if layer_norm_epsilon.is_nan() || layer_norm_epsilon <= 0.0 {
        return bad(format!(
            "`[model] layer_norm_epsilon` must be > 0, got {layer_norm_epsilon}"
        ));
    }
    let vocab = vocab_size.map_or(vocabulary, |v| v as i64);
    if vocab < vocabulary.max(1) {
        return bad(format!(
            "`[model] vocab_size` ({vocab}) must be at least the {vocabulary} tokens of the \
             data's vocabulary"
        ));
    }
    Ok(vocab)
}

impl Layer for Gpt2LmHeadModel {
    fn kind(&self) -> &str {
        "gpt2_lm_head_model"
    }

    fn attrs(&self) -> Vec<(&str, Attr)> {
        let c = &self.config;
        vec![
            ("vocab_size", Attr::Int(self.vocab_size)),
            ("n_positions", Attr::Int(c.n_positions as i64)),
            ("n_embd", Attr::Int(c.n_embd as i64)),
            ("n_layer", Attr::Int(c.n_layer as i64)),
            ("n_head", Attr::Int(c.n_head as i64)),
            ("tie_embeddings", Attr::Bool(c.tie_embeddings)),
        ]
    }

    fn children(&self) -> Vec<(&str, &dyn Layer)> {
        vec![
            ("transformer", self.transformer.as_ref()),
            ("lm_head", self.lm_head.as_ref()),
        ]
    }

    fn child_mut(&mut self, name: &str) -> Option<&mut Box<dyn Layer>> {
        match name {
            "transformer" => Some(&mut self.transformer),
            "lm_head" => Some(&mut self.lm_head),
            _ => None,
        }
    }

    fn forward(&self, ids: &Tensor, train: bool) -> Result<Tensor, TchError> {
        let hidden = self.transformer.forward(ids, train)?;
        self.lm_head.forward(&hidden, train)
    }

    /// The logits of the last new token only `(B, 1, V)`: generation needs no other.
    fn forward_cached(&self, ids: &Tensor, cache: &mut KvCache) -> Result<Tensor, TchError> {
        let hidden = self.transformer.forward_cached(ids, cache)?;
        let t = hidden.size().get(1).copied().unwrap_or(1);
        self.lm_head
            .forward_cached(&hidden.f_narrow(1, t - 1, 1)?, cache)
    }
}
