//! The output projection of a language model (GPT-2's, Llama's `lm_head`): tied to the token
//! embedding or its own weight.

use tch::{TchError, Tensor};

use super::{Attr, ExportTree, Exported, Layer};

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
    pub(crate) fn tied(weight: Tensor, in_features: i64, out_features: i64) -> LmHead {
        LmHead {
            weight,
            tied: true,
            in_features,
            out_features,
        }
    }

    /// A head with its own `weight` `(V, C)` (kind `linear`).
    pub(crate) fn untied(weight: Tensor, in_features: i64, out_features: i64) -> LmHead {
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
