//! Composer's `FactorizedConv2d` ([`FactorizedConv2d`]).

use tessera_plugin_api::kit::{default_init, ConvSpec, OwnTensors};
use tessera_plugin_api::tch::{Device, Kind, Tensor};
use tessera_plugin_api::{Error, Module};

use crate::modules::{check_rank, check_shape, copy_bias, replace_tensor};
use crate::solve::{factorize_conv2d, ConvGeometry, LowRankSolution, DEFAULT_N_ITERS};
use crate::FACTORIZED_CONV2D;

/// Composer's `FactorizedConv2d`: a `k × k` conv from `in` to `latent` channels without bias
/// (`module0`, with the original stride and padding), then a 1×1 conv from `latent` to `out`
/// channels with bias (`module1`).
#[derive(Debug)]
pub struct FactorizedConv2d {
    spec: ConvSpec,
    latent: i64,
    /// `(latent, in, k, k)`.
    weight0: Tensor,
    /// `(out, latent, 1, 1)`.
    weight1: Tensor,
    /// `(out)`.
    bias1: Tensor,
}

impl FactorizedConv2d {
    /// A freshly initialised factorization of the conv `spec` with `latent` channels, as
    /// Composer's `FactorizedConv2d.from_conv2d` (`reset_parameters`: `module0.weight`, then
    /// `module1.weight`, then `module1.bias`, each with [`default_init`]).
    pub fn new(
        spec: ConvSpec,
        latent: i64,
        uniform: &mut dyn FnMut() -> f64,
        options: (Kind, Device),
    ) -> Result<Self, Error> {
        if spec.groups != 1 {
            return Err(
                format!("cannot factorize a grouped conv (groups = {})", spec.groups).into(),
            );
        }
        if latent < 1 {
            return Err(format!("the latent size must be at least 1, got {latent}").into());
        }
        let k = spec.kernel_size;
        let weight0 = default_init(
            &[latent, spec.in_channels, k, k],
            spec.in_channels * k * k,
            uniform,
            options,
        )?;
        let weight1 = default_init(&[spec.out_channels, latent, 1, 1], latent, uniform, options)?;
        let bias1 = default_init(&[spec.out_channels], latent, uniform, options)?;
        Ok(FactorizedConv2d {
            spec,
            latent,
            weight0,
            weight1,
            bias1,
        })
    }

    /// The factorization with the given tensors (shared, not copied): `weight0` `(latent, in,
    /// k, k)`, `weight1` `(out, latent, 1, 1)`, `bias1` `(out)`.
    pub fn from_tensors(
        spec: ConvSpec,
        weight0: &Tensor,
        weight1: &Tensor,
        bias1: &Tensor,
    ) -> Result<Self, Error> {
        let latent = weight0.size().first().copied().unwrap_or(0);
        let k = spec.kernel_size;
        check_shape("module0.weight", weight0, &[latent, spec.in_channels, k, k])?;
        check_shape(
            "module1.weight",
            weight1,
            &[spec.out_channels, latent, 1, 1],
        )?;
        check_shape("module1.bias", bias1, &[spec.out_channels])?;
        Ok(FactorizedConv2d {
            spec,
            latent,
            weight0: weight0.shallow_clone(),
            weight1: weight1.shallow_clone(),
            bias1: bias1.shallow_clone(),
        })
    }

    /// The original conv's hyperparameters.
    pub fn spec(&self) -> ConvSpec {
        self.spec
    }

    /// The latent channels (`module0`'s outputs).
    pub fn latent_channels(&self) -> i64 {
        self.latent
    }

    fn geometry(&self) -> ConvGeometry {
        ConvGeometry {
            stride: self.spec.stride,
            padding: self.spec.padding,
        }
    }

    /// The forward: `conv1x1(conv(x, weight0, stride, padding), weight1, bias1)`.
    pub fn run(&self, x: &Tensor) -> Result<Tensor, Error> {
        let first = ConvSpec {
            groups: 1,
            ..self.spec
        };
        let latent = first.conv2d(x, &self.weight0, None)?;
        Ok(latent.f_conv2d(&self.weight1, Some(&self.bias1), [1, 1], [0, 0], [1, 1], 1)?)
    }

    /// Composer's `solution_for_rank`: [`factorize_conv2d`] of the current pair on `input`.
    pub fn solution_for_rank(&self, input: &Tensor, rank: i64) -> Result<LowRankSolution, Error> {
        factorize_conv2d(
            input,
            &self.weight0,
            Some(&self.weight1),
            None,
            Some(&self.bias1),
            rank as f64,
            DEFAULT_N_ITERS,
            self.geometry(),
        )
    }

    /// Composer's `apply_solution`: the solution's factors become the module's (new tensors
    /// for the weights; the bias is copied in place).
    pub fn apply_solution(&mut self, solution: &LowRankSolution) -> Result<(), Error> {
        let wb = solution
            .wb
            .as_ref()
            .ok_or("the solution is not a factorization")?;
        let k = self.spec.kernel_size;
        check_shape(
            "Wa",
            &solution.wa,
            &[solution.rank, self.spec.in_channels, k, k],
        )?;
        check_shape("Wb", wb, &[self.spec.out_channels, solution.rank, 1, 1])?;
        copy_bias(&self.bias1, solution)?;
        self.weight0 = replace_tensor(&self.weight0, &solution.wa)?;
        self.weight1 = replace_tensor(&self.weight1, wb)?;
        self.latent = solution.rank;
        Ok(())
    }

    /// Composer's `set_rank(input, rank)`: re-factorizes to `rank` latent channels, fitted on
    /// `input` so the module's output changes as little as possible. `rank` must be between 1
    /// and the current latent size; the current size changes nothing.
    pub fn set_rank(&mut self, input: &Tensor, rank: i64) -> Result<(), Error> {
        check_rank(rank, self.latent)?;
        if rank == self.latent {
            return Ok(());
        }
        let solution = self.solution_for_rank(input, rank)?;
        self.apply_solution(&solution)
    }
}

/// The tensors to register under the module's path, with Composer's names.
impl OwnTensors for FactorizedConv2d {
    fn tensors(&self) -> Vec<(&'static str, Tensor)> {
        vec![
            ("module0.weight", self.weight0.shallow_clone()),
            ("module1.weight", self.weight1.shallow_clone()),
            ("module1.bias", self.bias1.shallow_clone()),
        ]
    }
}

impl Module for FactorizedConv2d {
    fn kind(&self) -> &str {
        FACTORIZED_CONV2D
    }

    fn attrs(&self) -> Vec<(String, f64)> {
        let mut attrs = self.spec.attrs();
        attrs.push(("latent_channels".to_owned(), self.latent as f64));
        attrs
    }

    fn forward(&self, input: &Tensor, _train: bool) -> Result<Tensor, Error> {
        self.run(input)
    }
}
