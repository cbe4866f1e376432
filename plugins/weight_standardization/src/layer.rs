//! The standardization ([`standardize_weight`]) and the module surgery puts in place of a conv
//! ([`StandardizedConv2d`]).

use tessera_plugin_api::kit::{ConvSpec, OwnTensors};
use tessera_plugin_api::tch::{TchError, Tensor};
use tessera_plugin_api::{Error, Module};

use crate::WS_CONV2D;

/// Composer's `EPSILON` of `_standardize_weights`, added to the variance.
pub const EPSILON: f64 = 1e-10;

/// Composer's `_standardize_weights`: `(W − mean) / sqrt(var + 1e-10)`, with the mean and the
/// biased variance taken per output channel, over every dimension but the first.
pub fn standardize_weight(weight: &Tensor) -> Result<Tensor, TchError> {
    let dims: Vec<i64> = (1..weight.dim() as i64).collect();
    let (var, mean) = weight.f_var_mean_correction(Some(dims.as_slice()), 0, true)?;
    weight
        .f_sub(&mean)?
        .f_div(&var.f_add_scalar(EPSILON)?.f_sqrt()?)
}

/// A conv whose weight is standardized with [`standardize_weight`] at every forward, as a conv
/// with Composer's `WeightStandardizer` parametrization. It holds the conv's own (trained)
/// weight and bias, so the optimizer keeps updating the raw weight.
#[derive(Debug)]
pub struct StandardizedConv2d {
    spec: ConvSpec,
    weight: Tensor,
    bias: Option<Tensor>,
}

impl StandardizedConv2d {
    /// Wraps a conv's weight `(out, in / groups, k, k)` and optional bias `(out)` (shared, not
    /// copied: they stay the model's parameters).
    pub fn new(spec: ConvSpec, weight: &Tensor, bias: Option<&Tensor>) -> Result<Self, Error> {
        let want = spec.weight_shape();
        if weight.size() != want {
            return Err(Error::new(
                tessera_plugin_api::ErrorKind::HOST,
                format!(
                    "a conv2d with {spec:?} has a weight of shape {:?}, expected {want:?}",
                    weight.size()
                ),
            ));
        }
        Ok(StandardizedConv2d {
            spec,
            weight: weight.shallow_clone(),
            bias: bias.map(Tensor::shallow_clone),
        })
    }

    /// The conv's hyperparameters.
    pub fn spec(&self) -> ConvSpec {
        self.spec
    }

    /// The weight the conv uses now: the raw weight, standardized.
    pub fn standardized_weight(&self) -> Result<Tensor, TchError> {
        standardize_weight(&self.weight)
    }

    /// The forward: `conv2d(input, standardize(weight), bias)`.
    pub fn run(&self, input: &Tensor) -> Result<Tensor, Error> {
        self.spec
            .conv2d(input, &self.standardized_weight()?, self.bias.as_ref())
    }
}

/// The tensors to register under the module's path: `weight` (and `bias`), the conv's own
/// names, so checkpoints keep them.
impl OwnTensors for StandardizedConv2d {
    fn tensors(&self) -> Vec<(&'static str, Tensor)> {
        let mut out = vec![("weight", self.weight.shallow_clone())];
        if let Some(b) = &self.bias {
            out.push(("bias", b.shallow_clone()));
        }
        out
    }
}

impl Module for StandardizedConv2d {
    fn kind(&self) -> &str {
        WS_CONV2D
    }

    fn attrs(&self) -> Vec<(String, f64)> {
        self.spec.attrs()
    }

    fn forward(&self, input: &Tensor, _train: bool) -> Result<Tensor, Error> {
        self.run(input)
    }

    /// Folds back into a plain conv whose weight is the standardized one.
    fn export(&self) -> Result<Option<Vec<(String, Tensor)>>, Error> {
        let weight = tessera_plugin_api::tch::no_grad(|| self.standardized_weight())?;
        let mut out = vec![("weight".to_owned(), weight)];
        if let Some(b) = &self.bias {
            out.push(("bias".to_owned(), b.shallow_clone()));
        }
        Ok(Some(out))
    }
}
