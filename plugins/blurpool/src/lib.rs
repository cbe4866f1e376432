//! BlurPool (Zhang 2019, "Making Convolutional Networks Shift-Invariant Again",
//! arXiv:1904.11486), as Composer's `BlurPool` / `apply_blurpool`: model surgery at `init` that
//! adds an anti-aliasing low-pass filter to every downsampling layer.
//!
//! - The filter is `[[1, 2, 1], [2, 4, 2], [1, 2, 1]] / 16`, applied depthwise (one copy per
//!   channel, `groups = C`) with "same" padding (1 for the 3×3 filter): [`blur_2d`].
//! - A strided `conv2d` (`stride > 1` and `in_channels >= min_channels`) becomes a
//!   `blur_conv2d` ([`BlurConv2d`]): with `blur_first`, blur at stride 1 then the original conv
//!   (original stride); otherwise the conv at stride 1 then blur with the original stride. The
//!   original weight and bias are copied into the new module as trainable tensors `conv.weight`
//!   and `conv.bias`, next to the filter buffer `blur_filter` (Composer's names).
//! - A `max_pool2d(k, s)` becomes a `blur_max_pool2d` ([`BlurMaxPool2d`]): max-pool with kernel
//!   `k` at stride 1, then blur with stride `s` ([`blur_max_pool2d`]).
//!
//! The surgery is idempotent: modules that already are `blur_*` are never touched, so applying
//! it to an already-modified model changes nothing. After surgery the method logs the model's
//! `blurpool/num_blurpool_layers` and `blurpool/num_blurconv_layers` (counted over the whole
//! model, as Composer does) and warns when nothing was replaced.
//!
//! Composer's quirks are kept: `min_channels` applies to `in_channels`; strided 1×1 convs
//! (projection shortcuts) are replaced too; an input too small for the filter even with padding
//! is passed through unblurred.

#![warn(missing_docs)]

use tessera_plugin_api::tch::{Device, Kind, TchError, Tensor};
use tessera_plugin_api::{
    export_plugin, Context, Error, ErrorKind, Event, Hook, Method, Module, ModuleInfo, Plugin,
    Settings,
};

/// Module kind of a conv2d wrapped with a blur filter.
pub const BLUR_CONV2D: &str = "blur_conv2d";
/// Module kind of an anti-aliased max-pool.
pub const BLUR_MAX_POOL2D: &str = "blur_max_pool2d";
/// Metric: `blur_max_pool2d` modules in the model after surgery.
pub const METRIC_BLURPOOL_LAYERS: &str = "blurpool/num_blurpool_layers";
/// Metric: `blur_conv2d` modules in the model after surgery.
pub const METRIC_BLURCONV_LAYERS: &str = "blurpool/num_blurconv_layers";

// ------------------------------------------------------------------------------------------
// Functional forms
// ------------------------------------------------------------------------------------------

/// The default 3×3 binomial filter `[[1, 2, 1], [2, 4, 2], [1, 2, 1]] / 16`, shape `(1, 1, 3, 3)`.
pub fn default_filter(kind: Kind, device: Device) -> Result<Tensor, TchError> {
    let taps: [f32; 9] = [1.0, 2.0, 1.0, 2.0, 4.0, 2.0, 1.0, 2.0, 1.0];
    Tensor::f_from_slice(&taps)?
        .f_div_scalar(16.0)?
        .f_view([1, 1, 3, 3])?
        .f_to_kind(kind)?
        .f_to_device(device)
}

/// Composer's `blur_2d`: cross-correlates every channel of `input` (`(N, C, H, W)`) with
/// `filter` (`(1, 1, kH, kW)`, repeated over the channels, or `(C, 1, kH, kW)`), depthwise, with
/// "same" padding `(kH / 2, kW / 2)` and `stride`. The filter must have odd sides. An input too
/// small for the filter even with padding comes back unchanged, as in Composer.
pub fn blur_2d(input: &Tensor, stride: i64, filter: &Tensor) -> Result<Tensor, TchError> {
    let size = input.size();
    let fsize = filter.size();
    if size.len() != 4 || fsize.len() != 4 {
        return Err(TchError::Shape(format!(
            "blur_2d needs an (N, C, H, W) input and a 4-d filter, got {size:?} and {fsize:?}"
        )));
    }
    let (channels, height, width) = (size[1], size[2], size[3]);
    let (fh, fw) = (fsize[2], fsize[3]);
    if fh % 2 == 0 || fw % 2 == 0 {
        return Err(TchError::Shape(format!(
            "the blur filter must have odd height and width, got {fh}×{fw}"
        )));
    }
    if stride < 1 {
        return Err(TchError::Shape(format!(
            "blur stride must be ≥ 1, got {stride}"
        )));
    }
    let padding = [fh / 2, fw / 2];
    if height + 2 * padding[0] < fh || width + 2 * padding[1] < fw {
        return Ok(input.shallow_clone());
    }
    let mut filter = if fsize[0] == 1 && channels > 1 {
        filter.f_repeat([channels, 1, 1, 1])?
    } else {
        filter.shallow_clone()
    };
    if filter.kind() != input.kind() {
        filter = filter.f_to_kind(input.kind())?;
    }
    if filter.device() != input.device() {
        filter = filter.f_to_device(input.device())?;
    }
    input.f_conv2d::<&Tensor>(&filter, None, [stride, stride], padding, [1, 1], channels)
}

/// Composer's `blurmax_pool2d`: max-pool with `kernel_size` and `padding` at stride 1, then
/// [`blur_2d`] with `stride`.
pub fn blur_max_pool2d(
    input: &Tensor,
    kernel_size: i64,
    stride: i64,
    padding: i64,
    filter: &Tensor,
) -> Result<Tensor, TchError> {
    let maxes = input.f_max_pool2d(
        [kernel_size, kernel_size],
        [1, 1],
        [padding, padding],
        [1, 1],
        false,
    )?;
    blur_2d(&maxes, stride, filter)
}

/// Where the stride of a [`BlurConv2d`] goes: `(conv stride, blur stride)`. With `blur_first`
/// the conv keeps its stride and the blur runs at 1; otherwise the conv runs at 1 and the blur
/// takes the stride.
pub fn split_stride(stride: i64, blur_first: bool) -> (i64, i64) {
    if blur_first {
        (stride, 1)
    } else {
        (1, stride)
    }
}

/// The channel count of a [`BlurConv2d`]'s filter: the conv's input channels with
/// `blur_first`, its output channels otherwise.
pub fn blur_channels(in_channels: i64, out_channels: i64, blur_first: bool) -> i64 {
    if blur_first {
        in_channels
    } else {
        out_channels
    }
}

// ------------------------------------------------------------------------------------------
// Modules
// ------------------------------------------------------------------------------------------

/// The attributes of the strided conv a [`BlurConv2d`] replaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvSpec {
    /// Input channels.
    pub in_channels: i64,
    /// Output channels.
    pub out_channels: i64,
    /// Square kernel side.
    pub kernel_size: i64,
    /// The original stride.
    pub stride: i64,
    /// Zero padding.
    pub padding: i64,
    /// Groups.
    pub groups: i64,
}

/// Composer's `BlurConv2d`: a conv with a blur before (`blur_first`) or after it.
#[derive(Debug)]
pub struct BlurConv2d {
    /// The conv's attributes (with the original stride).
    pub spec: ConvSpec,
    /// Blur before the conv (`true`) or after it.
    pub blur_first: bool,
    /// The conv weight (`conv.weight`), trainable.
    pub weight: Tensor,
    /// The conv bias (`conv.bias`), trainable, when the original conv had one.
    pub bias: Option<Tensor>,
    /// The filter buffer (`blur_filter`): the default filter repeated to `(C, 1, 3, 3)`.
    pub blur_filter: Tensor,
}

impl BlurConv2d {
    /// Wraps copies of `weight` and `bias` (detached, requiring gradient: new parameters) with
    /// a new filter buffer on the weight's device and dtype.
    pub fn from_conv(
        spec: ConvSpec,
        weight: &Tensor,
        bias: Option<&Tensor>,
        blur_first: bool,
    ) -> Result<BlurConv2d, TchError> {
        // A fresh leaf with the same values: a new parameter, outside any autograd graph.
        let copy = |t: &Tensor| -> Result<Tensor, TchError> {
            let source = t.f_detach()?;
            let mut leaf = source.f_zeros_like()?;
            leaf.f_copy_(&source)?;
            leaf.f_set_requires_grad(true)
        };
        let channels = blur_channels(spec.in_channels, spec.out_channels, blur_first);
        let blur_filter = default_filter(weight.kind(), weight.device())?
            .f_repeat([channels, 1, 1, 1])?
            .f_contiguous()?;
        Ok(BlurConv2d {
            spec,
            blur_first,
            weight: copy(weight)?,
            bias: bias.map(copy).transpose()?,
            blur_filter,
        })
    }

    /// The tensors to register with the model, named relative to the module's path:
    /// `conv.weight`, `conv.bias` (when present) and `blur_filter`. They share storage with the
    /// module's own.
    pub fn tensors(&self) -> Vec<(&'static str, Tensor)> {
        let mut out = vec![("conv.weight", self.weight.shallow_clone())];
        if let Some(b) = &self.bias {
            out.push(("conv.bias", b.shallow_clone()));
        }
        out.push(("blur_filter", self.blur_filter.shallow_clone()));
        out
    }

    /// Runs the module (see [`blur_conv2d`]).
    pub fn run(&self, input: &Tensor) -> Result<Tensor, TchError> {
        blur_conv2d(
            input,
            &self.weight,
            self.bias.as_ref(),
            &self.blur_filter,
            self.spec,
            self.blur_first,
        )
    }
}

/// The forward of Composer's `BlurConv2d`: with `blur_first`, [`blur_2d`] at stride 1 then the
/// conv at `spec.stride`; otherwise the conv at stride 1 then [`blur_2d`] at `spec.stride`.
pub fn blur_conv2d(
    input: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    blur_filter: &Tensor,
    spec: ConvSpec,
    blur_first: bool,
) -> Result<Tensor, TchError> {
    let (conv_stride, blur_stride) = split_stride(spec.stride, blur_first);
    let conv = |x: &Tensor| {
        x.f_conv2d(
            weight,
            bias,
            [conv_stride, conv_stride],
            [spec.padding, spec.padding],
            [1, 1],
            spec.groups,
        )
    };
    if blur_first {
        conv(&blur_2d(input, blur_stride, blur_filter)?)
    } else {
        blur_2d(&conv(input)?, blur_stride, blur_filter)
    }
}

impl Module for BlurConv2d {
    fn kind(&self) -> &str {
        BLUR_CONV2D
    }

    fn attrs(&self) -> Vec<(String, f64)> {
        let s = self.spec;
        let (conv_stride, blur_stride) = split_stride(s.stride, self.blur_first);
        [
            ("in_channels", s.in_channels as f64),
            ("out_channels", s.out_channels as f64),
            ("kernel_size", s.kernel_size as f64),
            ("stride", s.stride as f64),
            ("padding", s.padding as f64),
            ("groups", s.groups as f64),
            ("blur_first", f64::from(u8::from(self.blur_first))),
            ("conv_stride", conv_stride as f64),
            ("blur_stride", blur_stride as f64),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }

    fn forward(&self, input: &Tensor, _train: bool) -> Result<Tensor, Error> {
        Ok(self.run(input)?)
    }
}

/// Composer's `BlurMaxPool2d`: [`blur_max_pool2d`] with a fixed kernel, stride and padding.
#[derive(Debug)]
pub struct BlurMaxPool2d {
    /// Max-pool kernel side.
    pub kernel_size: i64,
    /// The original stride, now the blur's.
    pub stride: i64,
    /// The max-pool's zero padding.
    pub padding: i64,
    /// The filter buffer (`filt2d`), `(1, 1, 3, 3)`, repeated over the channels at run time.
    pub filter: Tensor,
}

impl BlurMaxPool2d {
    /// A blur max-pool with a new filter buffer of `kind` on `device`.
    pub fn new(
        kernel_size: i64,
        stride: i64,
        padding: i64,
        kind: Kind,
        device: Device,
    ) -> Result<BlurMaxPool2d, TchError> {
        Ok(BlurMaxPool2d {
            kernel_size,
            stride,
            padding,
            filter: default_filter(kind, device)?,
        })
    }

    /// The tensors to register with the model: the filter buffer `filt2d` (Composer's name).
    pub fn tensors(&self) -> Vec<(&'static str, Tensor)> {
        vec![("filt2d", self.filter.shallow_clone())]
    }

    /// Runs the module.
    pub fn run(&self, input: &Tensor) -> Result<Tensor, TchError> {
        blur_max_pool2d(
            input,
            self.kernel_size,
            self.stride,
            self.padding,
            &self.filter,
        )
    }
}

impl Module for BlurMaxPool2d {
    fn kind(&self) -> &str {
        BLUR_MAX_POOL2D
    }

    fn attrs(&self) -> Vec<(String, f64)> {
        vec![
            ("kernel_size".to_owned(), self.kernel_size as f64),
            ("stride".to_owned(), self.stride as f64),
            ("padding".to_owned(), self.padding as f64),
        ]
    }

    fn forward(&self, input: &Tensor, _train: bool) -> Result<Tensor, Error> {
        Ok(self.run(input)?)
    }
}

/// A module the surgery puts into the model.
#[derive(Debug)]
pub enum BlurLayer {
    /// Replaces a strided conv.
    Conv(BlurConv2d),
    /// Replaces a max-pool.
    MaxPool(BlurMaxPool2d),
}

impl BlurLayer {
    /// The tensors to register, named relative to the module's path.
    pub fn tensors(&self) -> Vec<(&'static str, Tensor)> {
        match self {
            BlurLayer::Conv(m) => m.tensors(),
            BlurLayer::MaxPool(m) => m.tensors(),
        }
    }
}

impl Module for BlurLayer {
    fn kind(&self) -> &str {
        match self {
            BlurLayer::Conv(m) => m.kind(),
            BlurLayer::MaxPool(m) => m.kind(),
        }
    }

    fn attrs(&self) -> Vec<(String, f64)> {
        match self {
            BlurLayer::Conv(m) => m.attrs(),
            BlurLayer::MaxPool(m) => m.attrs(),
        }
    }

    fn forward(&self, input: &Tensor, train: bool) -> Result<Tensor, Error> {
        match self {
            BlurLayer::Conv(m) => m.forward(input, train),
            BlurLayer::MaxPool(m) => m.forward(input, train),
        }
    }
}

// ------------------------------------------------------------------------------------------
// Surgery
// ------------------------------------------------------------------------------------------

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

fn attr(info: &ModuleInfo, key: &str) -> Option<f64> {
    info.attrs
        .iter()
        .find(|a| a.key.as_str() == key)
        .map(|a| a.value)
}

fn int_attr(info: &ModuleInfo, key: &str, default: Option<i64>) -> Result<i64, Error> {
    match attr(info, key) {
        Some(v) if v.fract() == 0.0 && v.is_finite() => Ok(v as i64),
        Some(v) => Err(Error::new(
            ErrorKind::HOST,
            format!(
                "{} `{}`: attribute `{key}` = {v} is not an integer",
                info.kind, info.path
            ),
        )),
        None => default.ok_or_else(|| {
            Error::new(
                ErrorKind::HOST,
                format!("{} `{}` has no `{key}` attribute", info.kind, info.path),
            )
        }),
    }
}

/// The surgery's decision for one module of the tree: `None` keeps it.
pub fn decide(info: &ModuleInfo, options: &Options) -> Result<Option<Replacement>, Error> {
    match info.kind.as_str() {
        "conv2d" if options.replace_convs => {
            let spec = ConvSpec {
                in_channels: int_attr(info, "in_channels", None)?,
                out_channels: int_attr(info, "out_channels", None)?,
                kernel_size: int_attr(info, "kernel_size", None)?,
                stride: int_attr(info, "stride", None)?,
                padding: int_attr(info, "padding", Some(0))?,
                groups: int_attr(info, "groups", Some(1))?,
            };
            Ok(
                conv_is_replaced(spec.stride, spec.in_channels, options.min_channels)
                    .then_some(Replacement::Conv(spec)),
            )
        }
        "max_pool2d" if options.replace_maxpools => {
            let kernel_size = int_attr(info, "kernel_size", None)?;
            Ok(Some(Replacement::MaxPool {
                kernel_size,
                stride: int_attr(info, "stride", Some(kernel_size))?,
                padding: int_attr(info, "padding", Some(0))?,
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
    let blurred: Vec<&str> = modules
        .iter()
        .filter(|m| is_blur_kind(m.kind.as_str()))
        .map(|m| m.path.as_str())
        .collect();
    let inside_blur = |path: &str| {
        blurred
            .iter()
            .any(|b| path == *b || path.strip_prefix(b).is_some_and(|r| r.starts_with('.')))
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

/// The model as the surgery sees it: the host's [`Context`], or a stand-in in tests.
pub trait Model {
    /// The module tree, depth first.
    fn modules(&self) -> Result<Vec<ModuleInfo>, Error>;
    /// The parameter or buffer `name` (full dotted name).
    fn parameter(&self, name: &str) -> Result<Option<Tensor>, Error>;
    /// Replaces the module at `path` by `layer`, registering `layer.tensors()` under `path`.
    fn replace(&mut self, path: &str, layer: BlurLayer) -> Result<(), Error>;
}

impl Model for Context<'_> {
    fn modules(&self) -> Result<Vec<ModuleInfo>, Error> {
        Context::modules(self)
    }

    fn parameter(&self, name: &str) -> Result<Option<Tensor>, Error> {
        Context::parameter(self, name)
    }

    fn replace(&mut self, path: &str, layer: BlurLayer) -> Result<(), Error> {
        let tensors = layer.tensors();
        self.replace_module(path, layer, tensors)
    }
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

fn full_name(path: &str, name: &str) -> String {
    format!("{path}.{name}")
}

/// Composer's `apply_blurpool` on `model`: plans with [`plan`], builds each replacement from
/// the module's current tensors and swaps it in, then counts the `blur_*` modules.
pub fn apply_blurpool(model: &mut impl Model, options: &Options) -> Result<Outcome, Error> {
    let modules = model.modules()?;
    let mut outcome = Outcome::default();
    for (path, replacement) in plan(&modules, options)? {
        let layer = match replacement {
            Replacement::Conv(spec) => {
                let weight_name = full_name(&path, "weight");
                let weight = model.parameter(&weight_name)?.ok_or_else(|| {
                    Error::new(
                        ErrorKind::HOST,
                        format!("conv2d `{path}` has no tensor `{weight_name}`"),
                    )
                })?;
                let bias_name = full_name(&path, "bias");
                let has_bias = modules
                    .iter()
                    .find(|m| m.path.as_str() == path)
                    .is_some_and(|m| m.params.iter().any(|p| p.as_str() == bias_name));
                let bias = if has_bias {
                    model.parameter(&bias_name)?
                } else {
                    None
                };
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
fn model_kind_device(model: &impl Model, modules: &[ModuleInfo]) -> Result<(Kind, Device), Error> {
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

// ------------------------------------------------------------------------------------------
// The method
// ------------------------------------------------------------------------------------------

/// The BlurPool method: surgery at `init`.
#[derive(Debug)]
pub struct BlurPool {
    options: Options,
}

impl BlurPool {
    /// The method's settings.
    pub fn options(&self) -> &Options {
        &self.options
    }
}

impl Method for BlurPool {
    fn on_event(&mut self, _event: Event, ctx: &mut Context<'_>) -> Result<(), Error> {
        let o = self.options;
        if !o.replace_convs && !o.replace_maxpools {
            ctx.warn(
                "blurpool: replace_convs and replace_maxpools are both false; \
                 the model is left unchanged",
            );
        }
        let outcome = apply_blurpool(ctx, &o)?;
        ctx.log_metric(METRIC_BLURPOOL_LAYERS, outcome.num_blurpool_layers as f64);
        ctx.log_metric(METRIC_BLURCONV_LAYERS, outcome.num_blurconv_layers as f64);
        let total = outcome.num_blurpool_layers + outcome.num_blurconv_layers;
        if outcome.replaced() == 0 {
            if total == 0 {
                ctx.warn(
                    "blurpool did not change any layers: no strided conv2d (with in_channels \
                     >= min_channels) or max_pool2d layers were found",
                );
            } else {
                ctx.warn(&format!(
                    "blurpool did not change any layers: the model already has {} \
                     blur_max_pool2d and {} blur_conv2d layers",
                    outcome.num_blurpool_layers, outcome.num_blurconv_layers
                ));
            }
        }
        ctx.info(&format!(
            "blurpool replaced {} conv2d and {} max_pool2d layers (blur_first = {}); the model \
             now has {} blur_max_pool2d and {} blur_conv2d layers",
            outcome.replaced_convs,
            outcome.replaced_maxpools,
            o.blur_first,
            outcome.num_blurpool_layers,
            outcome.num_blurconv_layers
        ));
        Ok(())
    }
}

impl Plugin for BlurPool {
    const NAME: &'static str = "blurpool";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const DESCRIPTION: &'static str =
        "anti-aliasing: blurs before strided convs and max-pools (model surgery at init)";
    const DEFAULT_SETTINGS: &'static str = "replace_convs = true\nreplace_maxpools = true\n\
         blur_first = true\nmin_channels = 16";

    fn hooks() -> Vec<Hook> {
        vec![Hook::at(Event::INIT)]
    }

    fn create(settings: &Settings) -> Result<Self, Error> {
        let defaults = Options::default();
        let min_channels = settings.u64_or("min_channels", defaults.min_channels as u64)?;
        let min_channels = i64::try_from(min_channels)
            .map_err(|_| Error::config(format!("`min_channels` is too large: {min_channels}")))?;
        Ok(BlurPool {
            options: Options {
                replace_convs: settings.bool_or("replace_convs", defaults.replace_convs)?,
                replace_maxpools: settings
                    .bool_or("replace_maxpools", defaults.replace_maxpools)?,
                blur_first: settings.bool_or("blur_first", defaults.blur_first)?,
                min_channels,
            },
        })
    }
}

export_plugin!(BlurPool);
