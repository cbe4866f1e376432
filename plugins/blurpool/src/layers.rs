//! The layers: the blur filter and its functional forms, and the modules surgery puts into the
//! model ([`BlurConv2d`], [`BlurMaxPool2d`]).

use tessera_plugin_api::kit::{ConvSpec, OwnTensors};
use tessera_plugin_api::tch::{Device, Kind, TchError, Tensor};
use tessera_plugin_api::{Error, Module};

use crate::{BLUR_CONV2D, BLUR_MAX_POOL2D};

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

/// Composer's `BlurConv2d`: a conv with a blur before (`blur_first`) or after it.
#[derive(Debug)]
pub struct BlurConv2d {
    /// The attributes of the strided conv it replaces (with the original stride).
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

    /// Runs the module (see [`blur_conv2d`]).
    pub fn run(&self, input: &Tensor) -> Result<Tensor, Error> {
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
) -> Result<Tensor, Error> {
    let (conv_stride, blur_stride) = split_stride(spec.stride, blur_first);
    let conv = ConvSpec {
        stride: conv_stride,
        ..spec
    };
    if blur_first {
        conv.conv2d(&blur_2d(input, blur_stride, blur_filter)?, weight, bias)
    } else {
        Ok(blur_2d(
            &conv.conv2d(input, weight, bias)?,
            blur_stride,
            blur_filter,
        )?)
    }
}

/// The tensors to register with the model, named relative to the module's path: `conv.weight`,
/// `conv.bias` (when present) and `blur_filter`. They share storage with the module's own.
impl OwnTensors for BlurConv2d {
    fn tensors(&self) -> Vec<(&'static str, Tensor)> {
        let mut out = vec![("conv.weight", self.weight.shallow_clone())];
        if let Some(b) = &self.bias {
            out.push(("conv.bias", b.shallow_clone()));
        }
        out.push(("blur_filter", self.blur_filter.shallow_clone()));
        out
    }
}

impl Module for BlurConv2d {
    fn kind(&self) -> &str {
        BLUR_CONV2D
    }

    fn attrs(&self) -> Vec<(String, f64)> {
        let (conv_stride, blur_stride) = split_stride(self.spec.stride, self.blur_first);
        let mut attrs = self.spec.attrs();
        attrs.extend(
            [
                ("blur_first", f64::from(u8::from(self.blur_first))),
                ("conv_stride", conv_stride as f64),
                ("blur_stride", blur_stride as f64),
            ]
            .map(|(k, v)| (k.to_owned(), v)),
        );
        attrs
    }

    fn forward(&self, input: &Tensor, _train: bool) -> Result<Tensor, Error> {
        self.run(input)
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

/// The tensors to register with the model: the filter buffer `filt2d` (Composer's name).
impl OwnTensors for BlurMaxPool2d {
    fn tensors(&self) -> Vec<(&'static str, Tensor)> {
        vec![("filt2d", self.filter.shallow_clone())]
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

/// The tensors to register, named relative to the module's path.
impl OwnTensors for BlurLayer {
    fn tensors(&self) -> Vec<(&'static str, Tensor)> {
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
