//! GPT-2's feed-forward block (Hugging Face's `GPT2MLP`).

use tch::{nn::Init, TchError, Tensor};

use super::functional::{conv1d, dropout, proj_init, INIT_STD};
use crate::model::layers::{Attr, Layer};
use crate::model::zoo::transformer::{btc, normal};
use crate::model::{tree::join, Gpt2Config, ParamStore};

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
