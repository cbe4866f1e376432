//! RMSNorm (`LlamaRMSNorm`), kind `rms_norm`.

use tch::{Kind, TchError, Tensor};

use super::{Attr, Layer};
use crate::model::tree::join;
use crate::model::ParamStore;

/// RMSNorm (`LlamaRMSNorm`), kind `rms_norm`.
#[derive(Debug)]
pub struct RmsNorm {
    weight: Tensor,
    eps: f64,
    size: i64,
}

impl RmsNorm {
    /// A norm of width `size` whose weight (ones) joins `store` as `{path}.weight`.
    pub fn new(store: &mut ParamStore, path: &str, size: i64, eps: f64) -> Result<Self, TchError> {
        let weight = store.parameter(join(path, "weight"), &[size], tch::nn::Init::Const(1.0))?;
        Ok(RmsNorm { weight, eps, size })
    }
}

impl Layer for RmsNorm {
    fn kind(&self) -> &str {
        "rms_norm"
    }

    fn attrs(&self) -> Vec<(&str, Attr)> {
        vec![
            ("normalized_shape", Attr::Int(self.size)),
            ("eps", Attr::Float(self.eps)),
        ]
    }

    fn tensors(&self) -> Vec<(&str, &Tensor)> {
        vec![("weight", &self.weight)]
    }

    fn is_position_wise(&self) -> bool {
        true
    }

    fn forward(&self, xs: &Tensor, _train: bool) -> Result<Tensor, TchError> {
        let kind = xs.kind();
        let x = xs.f_to_kind(Kind::Float)?;
        let variance = x
            .f_pow_tensor_scalar(2)?
            .f_mean_dim(-1, true, Kind::Float)?;
        let normed = x.f_mul(&variance.f_add_scalar(self.eps)?.f_rsqrt()?)?;
        self.weight.f_mul(&normed.f_to_kind(kind)?)
    }
}
