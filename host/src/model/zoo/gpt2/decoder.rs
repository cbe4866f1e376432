//! The decoder without its head (Hugging Face's `GPT2Model`, path `transformer`).

use tch::{Kind, TchError, Tensor};

use crate::model::layers::{Attr, KvCache, Layer};
use crate::model::zoo::transformer::embedding_rows;
use crate::model::Gpt2Config;

/// The decoder without its head (Hugging Face's `GPT2Model`, path `transformer`), kind
/// `gpt2_model`: token ids `(B, T)` to the final hidden states `(B, T, C)`.
#[derive(Debug)]
pub struct Gpt2Model {
    pub(super) wte: Box<dyn Layer>,
    pub(super) wpe: Box<dyn Layer>,
    pub(super) drop: Box<dyn Layer>,
    pub(super) h: Box<dyn Layer>,
    pub(super) ln_f: Box<dyn Layer>,
    pub(super) config: Gpt2Config,
    pub(super) vocab_size: i64,
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
