//! BERT's two residual outputs (`BertSelfOutput`, `BertOutput`): a dense layer, dropout, the
//! residual and a layer norm, over one input that carries both.

use tch::{TchError, Tensor};

use super::config::{linear, BertConfig};
use crate::model::layers::{Attr, Dropout, Layer, LayerNorm};
use crate::model::{tree::join, ParamStore};

/// `LayerNorm(dropout(dense(h)) + residual)` over an input `cat[h, residual]` (Hugging Face's
/// `BertSelfOutput` and `BertOutput`, whose forward takes `h` and the residual), kinds
/// `bert_self_output` and `bert_output`.
#[derive(Debug)]
pub struct BertResidualOutput {
    dense: Box<dyn Layer>,
    layer_norm: Box<dyn Layer>,
    dropout: Box<dyn Layer>,
    kind: &'static str,
    in_features: i64,
    n_embd: i64,
}

impl BertResidualOutput {
    pub(super) fn new(
        store: &mut ParamStore,
        path: &str,
        kind: &'static str,
        in_features: i64,
        config: &BertConfig,
        dropout: f64,
    ) -> Result<BertResidualOutput, TchError> {
        let c = config.n_embd as i64;
        Ok(BertResidualOutput {
            dense: Box::new(linear(store, &join(path, "dense"), in_features, c)?),
            layer_norm: Box::new(LayerNorm::with_eps(
                store,
                &join(path, "LayerNorm"),
                c,
                config.layer_norm_epsilon,
            )?),
            dropout: Box::new(Dropout::new(dropout)),
            kind,
            in_features,
            n_embd: c,
        })
    }
}

impl Layer for BertResidualOutput {
    fn kind(&self) -> &str {
        self.kind
    }

    fn attrs(&self) -> Vec<(&str, Attr)> {
        vec![
            ("in_features", Attr::Int(self.in_features)),
            ("n_embd", Attr::Int(self.n_embd)),
        ]
    }

    fn children(&self) -> Vec<(&str, &dyn Layer)> {
        vec![
            ("dense", self.dense.as_ref()),
            ("LayerNorm", self.layer_norm.as_ref()),
            ("dropout", self.dropout.as_ref()),
        ]
    }

    fn child_mut(&mut self, name: &str) -> Option<&mut Box<dyn Layer>> {
        match name {
            "dense" => Some(&mut self.dense),
            "LayerNorm" => Some(&mut self.layer_norm),
            "dropout" => Some(&mut self.dropout),
            _ => None,
        }
    }

    fn forward(&self, xs: &Tensor, train: bool) -> Result<Tensor, TchError> {
        let (h, residual) = split_residual(xs, self.n_embd, self.kind)?;
        let y = self
            .dropout
            .forward(&self.dense.forward(&h, train)?, train)?;
        self.layer_norm.forward(&y.f_add(&residual)?, train)
    }
}

/// `cat[h, residual]` (last dimension) split into `h` and the residual (its last `n_embd`
/// features).
pub fn split_residual(xs: &Tensor, n_embd: i64, what: &str) -> Result<(Tensor, Tensor), TchError> {
    let width = xs.size().last().copied().unwrap_or(0);
    if xs.dim() != 3 || width <= n_embd {
        return Err(TchError::Shape(format!(
            "{what}: expected an input (batch, tokens, features + {n_embd}) holding [h, \
             residual], got {:?}",
            xs.size()
        )));
    }
    Ok((
        xs.f_narrow(2, 0, width - n_embd)?,
        xs.f_narrow(2, width - n_embd, n_embd)?,
    ))
}
