//! Which layers are factorized ([`plan`]) and the surgery over any [`SurgeryModel`]
//! ([`apply_factorization`]).

use tessera_plugin_api::kit::{walk, ConvSpec, SurgeryModel};
use tessera_plugin_api::{Error, ErrorKind, ModuleInfo};

use crate::conv::FactorizedConv2d;
use crate::linear::FactorizedLinear;
use crate::modules::{latent_size, max_rank, Factorized};
use crate::{CONV2D, FACTORIZED_CONV2D, FACTORIZED_LINEAR, LINEAR};

/// The surgery's settings, with the `Factorize` algorithm's defaults.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FactorizeSettings {
    /// Whether `conv2d` layers are considered.
    pub factorize_convs: bool,
    /// Whether `linear` layers are considered.
    pub factorize_linears: bool,
    /// Convs need `min(in_channels, out_channels) ≥ min_channels`.
    pub min_channels: i64,
    /// Latent channels: a count when ≥ 1, else a share of `min(in, out)`.
    pub latent_channels: f64,
    /// Linear maps need `min(in_features, out_features) ≥ min_features`.
    pub min_features: i64,
    /// Latent features: a count when ≥ 1, else a share of `min(in, out)`.
    pub latent_features: f64,
}

impl Default for FactorizeSettings {
    /// Composer's `Factorize` algorithm defaults.
    fn default() -> Self {
        FactorizeSettings {
            factorize_convs: true,
            factorize_linears: true,
            min_channels: 256,
            latent_channels: 0.25,
            min_features: 256,
            latent_features: 128.0,
        }
    }
}

impl FactorizeSettings {
    /// The defaults of Composer's functional `apply_factorization` (which differ from the
    /// algorithm's): minimum 512 channels and features, latent share 0.25 for both.
    pub fn functional_defaults() -> Self {
        FactorizeSettings {
            min_channels: 512,
            min_features: 512,
            latent_features: 0.25,
            ..FactorizeSettings::default()
        }
    }
}

/// What the surgery decided for one conv or linear layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// The layer's path.
    pub path: String,
    /// `conv2d` or `linear`.
    pub kind: String,
    /// The latent size it would get.
    pub latent: i64,
    /// The largest latent size that saves multiply-adds.
    pub max_rank: i64,
    /// `min(in, out)` reaches the minimum.
    pub wide_enough: bool,
    /// Composer's `factorizing_could_speedup`: `groups == 1` and `latent ≤ max_rank`.
    pub could_speedup: bool,
}

impl Decision {
    /// The layer is factorized: wide enough and it could speed up.
    pub fn factorize(&self) -> bool {
        self.wide_enough && self.could_speedup
    }
}

/// `(in_features, out_features)` of the linear layer `info`.
pub fn linear_features(info: &ModuleInfo) -> Result<(i64, i64), Error> {
    Ok((
        info.int_attr("in_features", None)?,
        info.int_attr("out_features", None)?,
    ))
}

/// Composer's choice for every plain `conv2d` (when `factorize_convs`), then every plain
/// `linear` (when `factorize_linears`), each in tree order. Factorized modules are not
/// candidates, so planning again after the surgery factorizes nothing (idempotence).
pub fn plan(modules: &[ModuleInfo], settings: &FactorizeSettings) -> Result<Vec<Decision>, Error> {
    let mut out = Vec::new();
    if settings.factorize_convs {
        for m in walk::of_kind(modules, CONV2D) {
            let s = ConvSpec::of(m)?;
            let latent = latent_size(settings.latent_channels, s.in_channels, s.out_channels);
            let max_rank = max_rank(s.in_channels, s.out_channels, s.kernel_size);
            out.push(Decision {
                path: m.path.to_string(),
                kind: CONV2D.to_owned(),
                latent,
                max_rank,
                wide_enough: s.in_channels.min(s.out_channels) >= settings.min_channels,
                could_speedup: s.groups == 1 && latent <= max_rank,
            });
        }
    }
    if settings.factorize_linears {
        for m in walk::of_kind(modules, LINEAR) {
            let (fin, fout) = linear_features(m)?;
            let latent = latent_size(settings.latent_features, fin, fout);
            let max_rank = max_rank(fin, fout, 1);
            out.push(Decision {
                path: m.path.to_string(),
                kind: LINEAR.to_owned(),
                latent,
                max_rank,
                wide_enough: fin.min(fout) >= settings.min_features,
                could_speedup: latent <= max_rank,
            });
        }
    }
    Ok(out)
}

/// What one application did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The decision for every candidate layer, convs first.
    pub decisions: Vec<Decision>,
    /// Convs factorized by this application.
    pub convs_replaced: usize,
    /// Linear layers factorized by this application.
    pub linears_replaced: usize,
    /// Factorized convs in the model afterwards (Composer's logged count).
    pub factorized_convs: usize,
    /// Factorized linear layers in the model afterwards (Composer's logged count).
    pub factorized_linears: usize,
}

/// Composer's `apply_factorization(model, factorize_convs, factorize_linears, min_channels,
/// latent_channels, min_features, latent_features)`: every layer [`plan`] picks becomes a
/// freshly initialised [`FactorizedConv2d`] or [`FactorizedLinear`] (it does not approximate
/// the trained weights: that is what `set_rank` and the solvers are for), drawn from the
/// model's seeded stream in plan order, with the original weight's dtype and device.
pub fn apply_factorization(
    model: &mut impl SurgeryModel,
    settings: &FactorizeSettings,
) -> Result<Outcome, Error> {
    let modules = model.modules()?;
    let decisions = plan(&modules, settings)?;
    let (mut convs_replaced, mut linears_replaced) = (0, 0);
    for d in decisions.iter().filter(|d| d.factorize()) {
        let info = walk::find(&modules, &d.path)
            .ok_or_else(|| Error::new(ErrorKind::HOST, format!("no module `{}`", d.path)))?;
        let weight = model.tensor_of(info, "weight")?;
        let options = (weight.kind(), weight.device());
        let mut uniform = || model.uniform();
        let module = if d.kind == CONV2D {
            convs_replaced += 1;
            Factorized::Conv2d(FactorizedConv2d::new(
                ConvSpec::of(info)?,
                d.latent,
                &mut uniform,
                options,
            )?)
        } else {
            let (fin, fout) = linear_features(info)?;
            let bias_name = format!("{}.bias", d.path);
            let bias = info.params.iter().any(|p| p.as_str() == bias_name);
            linears_replaced += 1;
            Factorized::Linear(FactorizedLinear::new(
                fin,
                fout,
                d.latent,
                bias,
                &mut uniform,
                options,
            )?)
        };
        model.replace(&d.path, module)?;
    }
    let count = |kind: &str| walk::of_kind(&modules, kind).count();
    Ok(Outcome {
        factorized_convs: count(FACTORIZED_CONV2D) + convs_replaced,
        factorized_linears: count(FACTORIZED_LINEAR) + linears_replaced,
        decisions,
        convs_replaced,
        linears_replaced,
    })
}
