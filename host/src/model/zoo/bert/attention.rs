//! BERT's attention (`BertAttention`, `BertSelfAttention`) and the key mask it passes to SDPA.

use tch::{TchError, Tensor};

use crate::model::layers::mask::attention_mask;
use crate::model::layers::{Attr, Layer};
use crate::model::zoo::transformer::btc;

/// The padding mask of the running forward as `scaled_dot_product_attention` takes it:
/// `(B, 1, 1, T)` booleans, true where a key may be attended; `None` without padding. A mask
/// whose shape is not the input's `(B, T)` is an error.
pub fn sdpa_key_mask(b: i64, t: i64, what: &str) -> Result<Option<Tensor>, TchError> {
    let Some(mask) = attention_mask() else {
        return Ok(None);
    };
    if mask.size() != [b, t] {
        return Err(TchError::Shape(format!(
            "{what}: the batch's attention_mask has shape {:?}, but the input has {b} sequences \
             of {t} tokens",
            mask.size()
        )));
    }
    Ok(Some(mask.f_ne(0)?.f_view([b, 1, 1, t])?))
}

/// Self-attention (Hugging Face's `BertSelfAttention`), kind `bert_self_attention`: the
/// attention context before the output projection.
#[derive(Debug)]
pub struct BertSelfAttention {
    pub(super) query: Box<dyn Layer>,
    pub(super) key: Box<dyn Layer>,
    pub(super) value: Box<dyn Layer>,
    pub(super) n_head: i64,
    pub(super) n_embd: i64,
    pub(super) dropout: f64,
}

impl Layer for BertSelfAttention {
    fn kind(&self) -> &str {
        "bert_self_attention"
    }

    fn attrs(&self) -> Vec<(&str, Attr)> {
        vec![
            ("n_head", Attr::Int(self.n_head)),
            ("n_embd", Attr::Int(self.n_embd)),
            ("attention_probs_dropout_prob", Attr::Float(self.dropout)),
        ]
    }

    fn children(&self) -> Vec<(&str, &dyn Layer)> {
        vec![
            ("query", self.query.as_ref()),
            ("key", self.key.as_ref()),
            ("value", self.value.as_ref()),
        ]
    }

    fn child_mut(&mut self, name: &str) -> Option<&mut Box<dyn Layer>> {
        match name {
            "query" => Some(&mut self.query),
            "key" => Some(&mut self.key),
            "value" => Some(&mut self.value),
            _ => None,
        }
    }

    fn forward(&self, xs: &Tensor, train: bool) -> Result<Tensor, TchError> {
        let (b, t, c) = btc(xs, self.n_embd, "bert self-attention")?;
        let (h, d) = (self.n_head, self.n_embd / self.n_head);
        let heads = |layer: &dyn Layer| -> Result<Tensor, TchError> {
            layer
                .forward(xs, train)?
                .f_reshape([b, t, h, d])?
                .f_transpose(1, 2)
        };
        let mask = sdpa_key_mask(b, t, "bert self-attention")?;
        let p = if train { self.dropout } else { 0.0 };
        let y = Tensor::f_scaled_dot_product_attention(
            &heads(self.query.as_ref())?,
            &heads(self.key.as_ref())?,
            &heads(self.value.as_ref())?,
            mask,
            p,
            false,
            None,
            false,
        )?;
        y.f_transpose(1, 2)?.f_contiguous()?.f_reshape([b, t, c])
    }
}

/// Self-attention and its output (Hugging Face's `BertAttention`), kind `bert_attention`:
/// `output(cat[self(x), x])`.
#[derive(Debug)]
pub struct BertAttention {
    pub(super) self_attention: Box<dyn Layer>,
    pub(super) output: Box<dyn Layer>,
}

impl Layer for BertAttention {
    fn kind(&self) -> &str {
        "bert_attention"
    }

    fn children(&self) -> Vec<(&str, &dyn Layer)> {
        vec![
            ("self", self.self_attention.as_ref()),
            ("output", self.output.as_ref()),
        ]
    }

    fn child_mut(&mut self, name: &str) -> Option<&mut Box<dyn Layer>> {
        match name {
            "self" => Some(&mut self.self_attention),
            "output" => Some(&mut self.output),
            _ => None,
        }
    }

    fn forward(&self, xs: &Tensor, train: bool) -> Result<Tensor, TchError> {
        let context = self.self_attention.forward(xs, train)?;
        self.output
            .forward(&Tensor::f_cat(&[&context, xs], -1)?, train)
    }
}
