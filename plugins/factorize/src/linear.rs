//! Composer's `FactorizedLinear` ([`FactorizedLinear`]).

use tessera_plugin_api::kit::{default_init, OwnTensors};
use tessera_plugin_api::tch::{self, Device, Kind, Tensor};
use tessera_plugin_api::{Error, Module};

use crate::modules::{check_rank, check_shape, copy_bias, replace_tensor};
use crate::solve::{factorize_matrix, LowRankSolution, DEFAULT_N_ITERS};
use crate::FACTORIZED_LINEAR;

/// Composer's `FactorizedLinear`: a linear map from `in` to `latent` features without bias
/// (`module0`), then one from `latent` to `out` features with the original's bias, if it had one
/// (`module1`).
#[derive(Debug)]
pub struct FactorizedLinear {
    in_features: i64,
    out_features: i64,
    latent: i64,
    /// `(latent, in)`.
    weight0: Tensor,
    /// `(out, latent)`.
    weight1: Tensor,
    /// `(out)`.
    bias1: Option<Tensor>,
}

impl FactorizedLinear {
    /// A freshly initialised factorization of a linear map `in → out` with `latent` features,
    /// as Composer's `FactorizedLinear.from_linear` (`module0.weight`, `module1.weight`, then
    /// `module1.bias` when `bias`, each with [`default_init`]).
    pub fn new(
        in_features: i64,
        out_features: i64,
        latent: i64,
        bias: bool,
        uniform: &mut dyn FnMut() -> f64,
        options: (Kind, Device),
    ) -> Result<Self, Error> {
        if latent < 1 {
            return Err(format!("the latent size must be at least 1, got {latent}").into());
        }
        let weight0 = default_init(&[latent, in_features], in_features, uniform, options)?;
        let weight1 = default_init(&[out_features, latent], latent, uniform, options)?;
        let bias1 = if bias {
            Some(default_init(&[out_features], latent, uniform, options)?)
        } else {
            None
        };
        Ok(FactorizedLinear {
            in_features,
            out_features,
            latent,
            weight0,
            weight1,
            bias1,
        })
    }

    /// The factorization with the given tensors (shared, not copied): `weight0` `(latent, in)`,
    /// `weight1` `(out, latent)`, `bias1` `(out)`.
    pub fn from_tensors(
        weight0: &Tensor,
        weight1: &Tensor,
        bias1: Option<&Tensor>,
    ) -> Result<Self, Error> {
        let (w0, w1) = (weight0.size(), weight1.size());
        if w0.len() != 2 || w1.len() != 2 || w0[0] != w1[1] {
            return Err(
                format!("weights {w0:?} and {w1:?} are not a factorized linear map").into(),
            );
        }
        if let Some(b) = bias1 {
            check_shape("module1.bias", b, &[w1[0]])?;
        }
        Ok(FactorizedLinear {
            in_features: w0[1],
            out_features: w1[0],
            latent: w0[0],
            weight0: weight0.shallow_clone(),
            weight1: weight1.shallow_clone(),
            bias1: bias1.map(Tensor::shallow_clone),
        })
    }

    /// Input features.
    pub fn in_features(&self) -> i64 {
        self.in_features
    }

    /// Output features.
    pub fn out_features(&self) -> i64 {
        self.out_features
    }

    /// The latent features (`module0`'s outputs).
    pub fn latent_features(&self) -> i64 {
        self.latent
    }

    /// The forward: `linear(linear(x, weight0), weight1, bias1)`.
    pub fn run(&self, x: &Tensor) -> Result<Tensor, Error> {
        Ok(x.f_linear(&self.weight0, None::<&Tensor>)?
            .f_linear(&self.weight1, self.bias1.as_ref())?)
    }

    /// Composer's `solution_for_rank`: [`factorize_matrix`] of the current pair, with the
    /// module's output on `input` as the target and its bias passed along (so the reported nmse
    /// has Composer's bias quirk).
    pub fn solution_for_rank(&self, input: &Tensor, rank: i64) -> Result<LowRankSolution, Error> {
        let target = tch::no_grad(|| self.run(input))?;
        factorize_matrix(
            input,
            &target,
            &self.weight0.f_tr()?,
            Some(&self.weight1.f_tr()?),
            self.bias1.as_ref(),
            rank as f64,
            DEFAULT_N_ITERS,
        )
    }

    /// Composer's `apply_solution`: the solution's factors (transposed) become the module's
    /// (new tensors for the weights; the bias is copied in place).
    pub fn apply_solution(&mut self, solution: &LowRankSolution) -> Result<(), Error> {
        let wb = solution
            .wb
            .as_ref()
            .ok_or("the solution is not a factorization")?;
        check_shape("Wa", &solution.wa, &[self.in_features, solution.rank])?;
        check_shape("Wb", wb, &[solution.rank, self.out_features])?;
        let bias = self
            .bias1
            .as_ref()
            .ok_or("set_rank needs a factorized linear map with a bias")?;
        copy_bias(bias, solution)?;
        self.weight0 = replace_tensor(&self.weight0, &solution.wa.f_tr()?)?;
        self.weight1 = replace_tensor(&self.weight1, &wb.f_tr()?)?;
        self.latent = solution.rank;
        Ok(())
    }

    /// Composer's `set_rank(input, rank)`: re-factorizes to `rank` latent features, fitted on
    /// `input`. `rank` must be between 1 and the current latent size; the current size changes
    /// nothing.
    pub fn set_rank(&mut self, input: &Tensor, rank: i64) -> Result<(), Error> {
        check_rank(rank, self.latent)?;
        if rank == self.latent {
            return Ok(());
        }
        if self.bias1.is_none() {
            return Err("set_rank needs a factorized linear map with a bias".into());
        }
        let solution = self.solution_for_rank(input, rank)?;
        self.apply_solution(&solution)
    }
}

/// The tensors to register under the module's path, with Composer's names.
impl OwnTensors for FactorizedLinear {
    fn tensors(&self) -> Vec<(&'static str, Tensor)> {
        let mut out = vec![
            ("module0.weight", self.weight0.shallow_clone()),
            ("module1.weight", self.weight1.shallow_clone()),
        ];
        if let Some(b) = &self.bias1 {
            out.push(("module1.bias", b.shallow_clone()));
        }
        out
    }
}

impl Module for FactorizedLinear {
    fn kind(&self) -> &str {
        FACTORIZED_LINEAR
    }

    fn attrs(&self) -> Vec<(String, f64)> {
        [
            ("in_features", self.in_features),
            ("out_features", self.out_features),
            ("latent_features", self.latent),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v as f64))
        .collect()
    }

    fn forward(&self, input: &Tensor, _train: bool) -> Result<Tensor, Error> {
        self.run(input)
    }
}
