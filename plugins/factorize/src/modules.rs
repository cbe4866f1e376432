//! What the factorized modules share: the rules that size them ([`latent_size`],
//! [`max_rank`]), the helpers of their `set_rank`, and [`Factorized`], either module as surgery
//! hands it to the model.

use tessera_plugin_api::kit::OwnTensors;
use tessera_plugin_api::tch::{self, Tensor};
use tessera_plugin_api::{Error, Module};

use crate::conv::FactorizedConv2d;
use crate::linear::FactorizedLinear;
use crate::solve::LowRankSolution;

/// Composer's `_clean_latent_size`: a `latent` below 1 is that share of `min(in, out)`
/// (truncated, at least 1); otherwise `latent` truncated to an integer.
pub fn latent_size(latent: f64, in_size: i64, out_size: i64) -> i64 {
    if latent < 1.0 {
        ((latent * in_size.min(out_size) as f64) as i64).max(1)
    } else {
        latent as i64
    }
}

/// Composer's `_max_rank_with_possible_speedup`: the largest latent size for which the two
/// factors take fewer multiply-adds than the original, `ceil(fan_in·out / (fan_in + out) − 1)`
/// with `fan_in = in·kernel²` (in exact integer arithmetic).
pub fn max_rank(in_size: i64, out_size: i64, kernel_size: i64) -> i64 {
    let fan_in = in_size * kernel_size * kernel_size;
    let (num, den) = (fan_in * out_size, fan_in + out_size);
    if den <= 0 {
        return 0;
    }
    (num + den - 1) / den - 1
}

pub(crate) fn check_shape(what: &str, t: &Tensor, want: &[i64]) -> Result<(), Error> {
    if t.size() != want {
        return Err(format!("{what} has shape {:?}, expected {want:?}", t.size()).into());
    }
    Ok(())
}

pub(crate) fn replace_tensor(old: &Tensor, new: &Tensor) -> Result<Tensor, Error> {
    Ok(new
        .detach()
        .f_contiguous()?
        .f_to_kind(old.kind())?
        .f_to_device(old.device())?
        .set_requires_grad(old.requires_grad()))
}

pub(crate) fn copy_bias(bias: &Tensor, solution: &LowRankSolution) -> Result<(), Error> {
    let new = solution
        .bias
        .as_ref()
        .ok_or("the solution has no bias to apply")?;
    tch::no_grad(|| bias.shallow_clone().f_copy_(new))?;
    Ok(())
}

pub(crate) fn check_rank(rank: i64, latent: i64) -> Result<(), Error> {
    if rank < 1 || rank > latent {
        return Err(
            format!("requested rank {rank} is not in 1..={latent} (the current rank)").into(),
        );
    }
    Ok(())
}

/// Either factorized module, as surgery hands it to the model.
#[derive(Debug)]
pub enum Factorized {
    /// A factorized conv.
    Conv2d(FactorizedConv2d),
    /// A factorized linear map.
    Linear(FactorizedLinear),
}

/// The tensors to register under the module's path (`module0.weight`, `module1.weight`,
/// `module1.bias`).
impl OwnTensors for Factorized {
    fn tensors(&self) -> Vec<(&'static str, Tensor)> {
        match self {
            Factorized::Conv2d(m) => m.tensors(),
            Factorized::Linear(m) => m.tensors(),
        }
    }
}

impl Factorized {
    /// The latent size (channels or features).
    pub fn latent(&self) -> i64 {
        match self {
            Factorized::Conv2d(m) => m.latent_channels(),
            Factorized::Linear(m) => m.latent_features(),
        }
    }

    /// The module's `set_rank`.
    pub fn set_rank(&mut self, input: &Tensor, rank: i64) -> Result<(), Error> {
        match self {
            Factorized::Conv2d(m) => m.set_rank(input, rank),
            Factorized::Linear(m) => m.set_rank(input, rank),
        }
    }
}

impl Module for Factorized {
    fn kind(&self) -> &str {
        match self {
            Factorized::Conv2d(m) => m.kind(),
            Factorized::Linear(m) => m.kind(),
        }
    }

    fn attrs(&self) -> Vec<(String, f64)> {
        match self {
            Factorized::Conv2d(m) => m.attrs(),
            Factorized::Linear(m) => m.attrs(),
        }
    }

    fn forward(&self, input: &Tensor, train: bool) -> Result<Tensor, Error> {
        match self {
            Factorized::Conv2d(m) => m.run(input),
            Factorized::Linear(m) => m.forward(input, train),
        }
    }
}
