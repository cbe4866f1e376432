//! Affine map (PyTorch `Linear`).

use tch::{TchError, Tensor};

use super::init::{torch_default_bias, TORCH_DEFAULT_WEIGHT};
use super::{Attr, Layer};
use crate::model::{tree::join, ParamStore};

/// `xs · weightᵀ + bias`.
#[derive(Debug)]
pub struct Linear {
    /// `(out, in)`.
    weight: Tensor,
    /// `(out)`; `None` for a layer built with [`Linear::no_bias`].
    bias: Option<Tensor>,
    in_features: i64,
    out_features: i64,
}

impl Linear {
    /// A linear layer whose tensors join `store` as `{path}.weight` and `{path}.bias`, with
    /// PyTorch's default init.
    pub fn new(
        store: &mut ParamStore,
        path: &str,
        in_features: i64,
        out_features: i64,
    ) -> Result<Linear, TchError> {
        Linear::initialised(
            store,
            path,
            (in_features, out_features),
            TORCH_DEFAULT_WEIGHT,
            torch_default_bias(in_features),
        )
    }

    /// A linear layer with `weight_init` for its weight and a zero bias (timm's and Hugging
    /// Face's transformer init: normal(0, 0.02) weights, zero biases).
    pub fn with_init(
        store: &mut ParamStore,
        path: &str,
        in_features: i64,
        out_features: i64,
        weight_init: tch::nn::Init,
    ) -> Result<Linear, TchError> {
        Linear::initialised(
            store,
            path,
            (in_features, out_features),
            weight_init,
            tch::nn::Init::Const(0.0),
        )
    }

    /// `weight` `(out, in)` and `bias` `(out)` drawn from the given inits.
    fn initialised(
        store: &mut ParamStore,
        path: &str,
        (in_features, out_features): (i64, i64),
        weight_init: tch::nn::Init,
        bias_init: tch::nn::Init,
    ) -> Result<Linear, TchError> {
        let weight = store.parameter(
            join(path, "weight"),
            &[out_features, in_features],
            weight_init,
        )?;
        let bias = store.parameter(join(path, "bias"), &[out_features], bias_init)?;
        Ok(Linear {
            weight,
            bias: Some(bias),
            in_features,
            out_features,
        })
    }

    /// A linear layer with `weight_init` for its weight and, with `bias`, a zero bias (Hugging
    /// Face's Llama init: normal(0, `initializer_range`), biases zero); without, only
    /// `{path}.weight`.
    pub fn with_init_and_bias(
        store: &mut ParamStore,
        path: &str,
        in_features: i64,
        out_features: i64,
        weight_init: tch::nn::Init,
        bias: bool,
    ) -> Result<Linear, TchError> {
        if bias {
            return Linear::with_init(store, path, in_features, out_features, weight_init);
        }
        let weight = store.parameter(
            join(path, "weight"),
            &[out_features, in_features],
            weight_init,
        )?;
        Ok(Linear {
            weight,
            bias: None,
            in_features,
            out_features,
        })
    }

    /// The same without a bias (PyTorch `Linear(..., bias=False)`): only `{path}.weight`.
    pub fn no_bias(
        store: &mut ParamStore,
        path: &str,
        in_features: i64,
        out_features: i64,
    ) -> Result<Linear, TchError> {
        Linear::with_init_and_bias(
            store,
            path,
            in_features,
            out_features,
            TORCH_DEFAULT_WEIGHT,
            false,
        )
    }
}

impl Layer for Linear {
    fn kind(&self) -> &str {
        "linear"
    }

    fn attrs(&self) -> Vec<(&str, Attr)> {
        vec![
            ("in_features", Attr::Int(self.in_features)),
            ("out_features", Attr::Int(self.out_features)),
        ]
    }

    fn tensors(&self) -> Vec<(&str, &Tensor)> {
        let mut tensors = vec![("weight", &self.weight)];
        if let Some(bias) = &self.bias {
            tensors.push(("bias", bias));
        }
        tensors
    }

    fn is_position_wise(&self) -> bool {
        true
    }

    fn forward(&self, xs: &Tensor, _train: bool) -> Result<Tensor, TchError> {
        xs.f_linear(&self.weight, self.bias.as_ref())
    }
}
