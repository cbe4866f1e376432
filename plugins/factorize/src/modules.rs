//! The modules surgery puts in place of a conv or a linear layer ([`FactorizedConv2d`],
//! [`FactorizedLinear`]), the rules that size them ([`latent_size`], [`max_rank`]) and their
//! progressive re-factorization (`set_rank`).

use tessera_plugin_api::tch::{self, Device, Kind, Tensor};
use tessera_plugin_api::{Error, Module};

use crate::solve::{
    factorize_conv2d, factorize_matrix, ConvGeometry, LowRankSolution, DEFAULT_N_ITERS,
};
use crate::{FACTORIZED_CONV2D, FACTORIZED_LINEAR};

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

/// A new tensor of `shape` with PyTorch's default initialisation (`reset_parameters`:
/// kaiming-uniform with `a = √5` for weights, the same bound for biases), `U(−1/√fan_in,
/// 1/√fan_in)`, drawn element by element from `uniform` (values in `[0, 1)`), trainable.
pub fn default_init(
    shape: &[i64],
    fan_in: i64,
    uniform: &mut dyn FnMut() -> f64,
    options: (Kind, Device),
) -> Result<Tensor, Error> {
    let bound = 1.0 / (fan_in.max(1) as f64).sqrt();
    let count: i64 = shape.iter().product();
    let values: Vec<f32> = (0..count)
        .map(|_| ((2.0 * uniform() - 1.0) * bound) as f32)
        .collect();
    Ok(Tensor::f_from_slice(&values)?
        .f_view(shape)?
        .f_to_kind(options.0)?
        .f_to_device(options.1)?
        .set_requires_grad(true))
}

/// A 2-d convolution's hyperparameters, as the module tree gives them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvSpec {
    /// Input channels.
    pub in_channels: i64,
    /// Output channels.
    pub out_channels: i64,
    /// Kernel side (square kernels).
    pub kernel_size: i64,
    /// Stride.
    pub stride: i64,
    /// Zero padding on each side.
    pub padding: i64,
    /// Groups (factorization needs 1).
    pub groups: i64,
}

fn check_shape(what: &str, t: &Tensor, want: &[i64]) -> Result<(), Error> {
    if t.size() != want {
        return Err(format!("{what} has shape {:?}, expected {want:?}", t.size()).into());
    }
    Ok(())
}

fn replace_tensor(old: &Tensor, new: &Tensor) -> Result<Tensor, Error> {
    Ok(new
        .detach()
        .f_contiguous()?
        .f_to_kind(old.kind())?
        .f_to_device(old.device())?
        .set_requires_grad(old.requires_grad()))
}

fn copy_bias(bias: &Tensor, solution: &LowRankSolution) -> Result<(), Error> {
    let new = solution
        .bias
        .as_ref()
        .ok_or("the solution has no bias to apply")?;
    tch::no_grad(|| bias.shallow_clone().f_copy_(new))?;
    Ok(())
}

fn check_rank(rank: i64, latent: i64) -> Result<(), Error> {
    if rank < 1 || rank > latent {
        return Err(
            format!("requested rank {rank} is not in 1..={latent} (the current rank)").into(),
        );
    }
    Ok(())
}

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

    /// The tensors to register under the module's path, with Composer's names.
    pub fn tensors(&self) -> Vec<(&'static str, Tensor)> {
        vec![
            ("module0.weight", self.weight0.shallow_clone()),
            ("module1.weight", self.weight1.shallow_clone()),
            ("module1.bias", self.bias1.shallow_clone()),
        ]
    }

    fn geometry(&self) -> ConvGeometry {
        ConvGeometry {
            stride: self.spec.stride,
            padding: self.spec.padding,
        }
    }

    /// The forward: `conv1x1(conv(x, weight0, stride, padding), weight1, bias1)`.
    pub fn run(&self, x: &Tensor) -> Result<Tensor, Error> {
        let s = self.spec;
        let latent = x.f_conv2d(
            &self.weight0,
            None::<&Tensor>,
            [s.stride, s.stride],
            [s.padding, s.padding],
            [1, 1],
            1,
        )?;
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

impl Module for FactorizedConv2d {
    fn kind(&self) -> &str {
        FACTORIZED_CONV2D
    }

    fn attrs(&self) -> Vec<(String, f64)> {
        let s = self.spec;
        [
            ("in_channels", s.in_channels),
            ("out_channels", s.out_channels),
            ("kernel_size", s.kernel_size),
            ("stride", s.stride),
            ("padding", s.padding),
            ("groups", s.groups),
            ("latent_channels", self.latent),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v as f64))
        .collect()
    }

    fn forward(&self, input: &Tensor, _train: bool) -> Result<Tensor, Error> {
        self.run(input)
    }
}

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

    /// The tensors to register under the module's path, with Composer's names.
    pub fn tensors(&self) -> Vec<(&'static str, Tensor)> {
        let mut out = vec![
            ("module0.weight", self.weight0.shallow_clone()),
            ("module1.weight", self.weight1.shallow_clone()),
        ];
        if let Some(b) = &self.bias1 {
            out.push(("module1.bias", b.shallow_clone()));
        }
        out
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

/// Either factorized module, as surgery hands it to the model.
#[derive(Debug)]
pub enum Factorized {
    /// A factorized conv.
    Conv2d(FactorizedConv2d),
    /// A factorized linear map.
    Linear(FactorizedLinear),
}

impl Factorized {
    /// The tensors to register under the module's path (`module0.weight`, `module1.weight`,
    /// `module1.bias`).
    pub fn tensors(&self) -> Vec<(&'static str, Tensor)> {
        match self {
            Factorized::Conv2d(m) => m.tensors(),
            Factorized::Linear(m) => m.tensors(),
        }
    }

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
