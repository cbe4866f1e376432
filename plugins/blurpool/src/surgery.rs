//! The surgery: which modules are replaced ([`decide`], [`plan`]) and the replacement itself
//! over any [`SurgeryModel`] ([`apply_blurpool`]).

use tessera_plugin_api::kit::{walk, ConvSpec, SurgeryModel};
use tessera_plugin_api::tch::{Device, Kind};
use tessera_plugin_api::{Error, ModuleInfo};

use crate::layers::{BlurConv2d, BlurLayer, BlurMaxPool2d};
use crate::{BLUR_CONV2D, BLUR_MAX_POOL2D};

/// The method's settings, with Composer's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Replace strided convs.
    pub replace_convs: bool,
    /// Replace max-pools.
    pub replace_maxpools: bool,
    /// In a [`BlurConv2d`], blur before the conv.
    pub blur_first: bool,
    /// Convs with fewer input channels are kept.
    pub min_channels: i64,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            replace_convs: true,
            replace_maxpools: true,
            blur_first: true,
            min_channels: 16,
        }
    }
}

/// Composer's condition for replacing a conv: `max(stride) > 1 and in_channels >= min_channels`.
pub fn conv_is_replaced(stride: i64, in_channels: i64, min_channels: i64) -> bool {
    stride > 1 && in_channels >= min_channels
}

/// What the surgery does to one module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replacement {
    /// A strided conv becomes a [`BlurConv2d`].
    Conv(ConvSpec),
    /// A max-pool becomes a [`BlurMaxPool2d`] (`kernel_size`, `stride`, `padding`).
    MaxPool {
        /// Kernel side.
        kernel_size: i64,
        /// Stride.
        stride: i64,
        /// Padding.
        padding: i64,
    },
}

/// Whether `kind` is one of the surgery's own module kinds (never replaced again).
pub fn is_blur_kind(kind: &str) -> bool {
    kind == BLUR_CONV2D || kind == BLUR_MAX_POOL2D
}

/// The surgery's decision for one module of the tree: `None` keeps it.
pub fn decide(info: &ModuleInfo, options: &Options) -> Result<Option<Replacement>, Error> {
    match info.kind.as_str() {
        "conv2d" if options.replace_convs => {
            let spec = ConvSpec::of(info)?;
            Ok(
                conv_is_replaced(spec.stride, spec.in_channels, options.min_channels)
                    .then_some(Replacement::Conv(spec)),
            )
        }
        "max_pool2d" if options.replace_maxpools => {
            let kernel_size = info.int_attr("kernel_size", None)?;
            Ok(Some(Replacement::MaxPool {
                kernel_size,
                stride: info.int_attr("stride", Some(kernel_size))?,
                padding: info.int_attr("padding", Some(0))?,
            }))
        }
        _ => Ok(None),
    }
}

/// The replacements for a whole module tree, in tree order. Modules of the surgery's own kinds,
/// and anything inside them, are left alone, so planning on a modified tree finds nothing new.
pub fn plan(
    modules: &[ModuleInfo],
    options: &Options,
) -> Result<Vec<(String, Replacement)>, Error> {
    let inside_blur = |path: &str| {
        [BLUR_CONV2D, BLUR_MAX_POOL2D]
            .iter()
            .any(|kind| walk::inside_kind(modules, path, kind))
    };
    let mut out = Vec::new();
    for m in modules {
        if m.path.is_empty() || inside_blur(m.path.as_str()) {
            continue;
        }
        if let Some(r) = decide(m, options)? {
            out.push((m.path.to_string(), r));
        }
    }
    Ok(out)
}

/// What one application of the surgery did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Convs replaced by this application.
    pub replaced_convs: usize,
    /// Max-pools replaced by this application.
    pub replaced_maxpools: usize,
    /// `blur_max_pool2d` modules in the model afterwards.
    pub num_blurpool_layers: usize,
    /// `blur_conv2d` modules in the model afterwards.
    pub num_blurconv_layers: usize,
}

impl Outcome {
    /// Modules replaced by this application.
    pub fn replaced(&self) -> usize {
        self.replaced_convs + self.replaced_maxpools
    }
}

/// Composer's `apply_blurpool` on `model`: plans with [`plan`], builds each replacement from
/// the module's current tensors and swaps it in, then counts the `blur_*` modules.
pub fn apply_blurpool(model: &mut impl SurgeryModel, options: &Options) -> Result<Outcome, Error> {
    let modules = model.modules()?;
    let mut outcome = Outcome::default();
    for (path, replacement) in plan(&modules, options)? {
        let layer = match replacement {
            Replacement::Conv(spec) => {
                let info = walk::find(&modules, &path).ok_or("planned a module not in the tree")?;
                let weight = model.tensor_of(info, "weight")?;
                let bias = model.optional_tensor_of(info, "bias")?;
                outcome.replaced_convs += 1;
                BlurLayer::Conv(BlurConv2d::from_conv(
                    spec,
                    &weight,
                    bias.as_ref(),
                    options.blur_first,
                )?)
            }
            Replacement::MaxPool {
                kernel_size,
                stride,
                padding,
            } => {
                // The filter follows the model's floating-point parameters.
                let (kind, device) = model_kind_device(model, &modules)?;
                outcome.replaced_maxpools += 1;
                BlurLayer::MaxPool(BlurMaxPool2d::new(
                    kernel_size,
                    stride,
                    padding,
                    kind,
                    device,
                )?)
            }
        };
        model.replace(&path, layer)?;
    }
    for m in model.modules()? {
        match m.kind.as_str() {
            BLUR_CONV2D => outcome.num_blurconv_layers += 1,
            BLUR_MAX_POOL2D => outcome.num_blurpool_layers += 1,
            _ => {}
        }
    }
    Ok(outcome)
}

/// The dtype and device of the model's first floating-point tensor (float32 on the CPU for a
/// model without any).
fn model_kind_device(
    model: &impl SurgeryModel,
    modules: &[ModuleInfo],
) -> Result<(Kind, Device), Error> {
    for m in modules {
        for name in m.params.iter() {
            if let Some(t) = model.parameter(name.as_str())? {
                if t.is_floating_point() {
                    return Ok((t.kind(), t.device()));
                }
            }
        }
    }
    Ok((Kind::Float, Device::Cpu))
}
