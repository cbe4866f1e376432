#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

use tessera_plugin_api::abi::ParamInfo;
use tessera_plugin_api::tch::{self, Kind, TchError, Tensor};
use tessera_plugin_api::{
    export_plugin, keys, Context, Error, Event, Hook, Method, Plugin, Settings,
};

/// The whitening filters of `images` `(N, C, H, W)` for a `kh` × `kw` convolution, as airbench's
/// `CifarNet.init_whiten`: the covariance `Pᵀ P / n` of every `kh` × `kw` patch `P` (stride 1,
/// no padding; each patch flattened in `(c, y, x)` order, not centred), its eigen-decomposition
/// `Σ = V diag(λ) Vᵀ` (eigenvalues ascending, as `torch.linalg.eigh`), and the filters
/// `Vᵀ / sqrt(λ + eps)` reshaped to `(C·kh·kw, C, kh, kw)`, then the same negated: the result
/// has `2·C·kh·kw` filters. Computed in float64 on `images`' device; returned in float64.
pub fn whitening_filters(images: &Tensor, kh: i64, kw: i64, eps: f64) -> Result<Tensor, TchError> {
    let size = images.size();
    let [_, c, h, w] = size[..] else {
        return Err(TchError::Shape(format!(
            "patch whitening needs images (N, C, H, W), got shape {size:?}"
        )));
    };
    if h < kh || w < kw {
        return Err(TchError::Shape(format!(
            "images of {h}x{w} are smaller than the {kh}x{kw} patches"
        )));
    }
    let d = c * kh * kw;
    let covariance = patch_covariance(images, kh, kw)?;
    let (eigenvalues, eigenvectors) = covariance.f_linalg_eigh("U")?;
    let scaled = eigenvectors
        .f_transpose(0, 1)?
        .f_reshape([d, c, kh, kw])?
        .f_div(
            &eigenvalues
                .f_add_scalar(eps)?
                .f_sqrt()?
                .f_view([d, 1, 1, 1])?,
        )?;
    Tensor::f_cat(&[&scaled, &scaled.f_neg()?], 0)
}

/// `Pᵀ P / n` over every `kh` × `kw` patch of `images`, in float64, `(C·kh·kw)²`.
pub fn patch_covariance(images: &Tensor, kh: i64, kw: i64) -> Result<Tensor, TchError> {
    let c = images.size()[1];
    let d = c * kh * kw;
    // (N, C, H', W', kh, kw) -> (N, W', H', C, kh, kw): one row per patch, (c, y, x) inside.
    let patches = images
        .f_to_kind(Kind::Double)?
        .f_unfold(2, kh, 1)?
        .f_unfold(3, kw, 1)?
        .f_transpose(1, 3)?
        .f_reshape([-1, d])?;
    let n = patches.size()[0] as f64;
    patches.f_transpose(0, 1)?.f_mm(&patches)?.f_div_scalar(n)
}

/// The first convolution of the model and its bias: the first 4-dimensional parameter in the
/// host's (registration) order, and the parameter with its prefix and `bias`, if any.
pub fn first_conv(params: &[ParamInfo]) -> Result<(String, Vec<i64>, Option<String>), Error> {
    let conv = params
        .iter()
        .find(|p| !p.buffer && p.shape.len() == 4)
        .ok_or("patch_whitening: the model has no convolution (no 4-dimensional parameter)")?;
    let name = conv.name.to_string();
    let bias = name
        .strip_suffix("weight")
        .map(|prefix| format!("{prefix}bias"))
        .filter(|b| params.iter().any(|p| p.name.as_str() == b && !p.buffer));
    Ok((name, conv.shape.to_vec(), bias))
}

/// The patch-whitening method.
#[derive(Debug, Clone, PartialEq)]
pub struct PatchWhitening {
    /// Training samples whose patches give the covariance.
    pub samples: usize,
    /// Added to each eigenvalue before the inverse square root.
    pub eps: f64,
    /// Epochs during which the first convolution's bias trains; frozen from then on.
    pub bias_epochs: u64,
    /// The first convolution's bias, found at `init`.
    bias: Option<String>,
}

impl PatchWhitening {
    fn init(&mut self, ctx: &mut Context<'_>) -> Result<(), Error> {
        let (weight_name, shape, bias) = first_conv(&ctx.parameters()?)?;
        let [out, cin, kh, kw] = shape[..] else {
            return Err("patch_whitening: a convolution weight has 4 dimensions".into());
        };
        if out != 2 * cin * kh * kw {
            return Err(format!(
                "patch_whitening: the first convolution `{weight_name}` has shape {shape:?}; \
                 whitening fills 2·C·kh·kw = {} output channels (the eigenvectors of the \
                 {kh}x{kw} patches and their negatives), not {out}: use a whitening-ready first \
                 conv such as the zoo's airbench (`whiten`, 2x2, {} channels for {cin} input \
                 channel(s))",
                2 * cin * kh * kw,
                8 * cin
            )
            .into());
        }
        let sample = ctx.training_sample(self.samples)?;
        let images = sample
            .iter()
            .find(|(name, _)| name == keys::INPUT)
            .map(|(_, t)| t.shallow_clone())
            .ok_or("patch_whitening: the training sample has no `input`")?;
        let channels = images.size().get(1).copied().unwrap_or(0);
        if channels != cin {
            return Err(format!(
                "patch_whitening: the first convolution `{weight_name}` takes {cin} channel(s), \
                 the training images have {channels}"
            )
            .into());
        }
        let filters = whitening_filters(&images, kh, kw, self.eps)?;
        let weight = ctx
            .parameter(&weight_name)?
            .ok_or_else(|| format!("the model has no parameter `{weight_name}`"))?;
        tch::no_grad(|| -> Result<(), TchError> {
            let filters = filters
                .f_to_device(weight.device())?
                .f_to_kind(weight.kind())?;
            weight.shallow_clone().f_copy_(&filters)?;
            Ok(())
        })?;
        ctx.set_trainable(&weight_name, false)?;
        self.bias = bias;
        self.set_bias_trainable(ctx, 0)?;
        ctx.info(&format!(
            "patch_whitening: `{weight_name}` set from the {kh}x{kw} patches of {} training \
             images and frozen; {}",
            images.size()[0],
            match &self.bias {
                Some(b) => format!("`{b}` trains for {} epoch(s)", self.bias_epochs),
                None => "the convolution has no bias".to_owned(),
            }
        ));
        Ok(())
    }

    /// The bias trains while `epoch < bias_epochs`.
    fn set_bias_trainable(&self, ctx: &mut Context<'_>, epoch: u64) -> Result<(), Error> {
        match &self.bias {
            Some(bias) => ctx.set_trainable(bias, epoch < self.bias_epochs),
            None => Ok(()),
        }
    }
}

impl Method for PatchWhitening {
    fn on_event(&mut self, event: Event, ctx: &mut Context<'_>) -> Result<(), Error> {
        match event {
            Event::INIT => self.init(ctx),
            // `fit_start` too: a run resumed in the middle of an epoch gets no `epoch_start`.
            Event::FIT_START | Event::EPOCH_START => {
                let epoch = ctx.time().epoch;
                self.set_bias_trainable(ctx, epoch)
            }
            _ => Ok(()),
        }
    }
}

impl Plugin for PatchWhitening {
    const NAME: &'static str = "patch_whitening";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const DESCRIPTION: &'static str =
        "sets the first conv to the whitening filters of the training images' patches, frozen; its bias trains for the first epochs (airbench)";
    const DEFAULT_SETTINGS: &'static str = "samples = 5000\neps = 5e-4\nbias_epochs = 3";

    fn hooks() -> Vec<Hook> {
        vec![
            Hook::at(Event::INIT),
            Hook::at(Event::FIT_START),
            Hook::at(Event::EPOCH_START),
        ]
    }

    fn create(settings: &Settings) -> Result<Self, Error> {
        let samples = settings.u64("samples")?;
        if samples == 0 {
            return Err(Error::config("setting `samples` must be at least 1"));
        }
        let eps = settings.f64("eps")?;
        if !(eps.is_finite() && eps >= 0.0) {
            return Err(Error::config(format!(
                "setting `eps` must be a finite number >= 0, got {eps}"
            )));
        }
        Ok(PatchWhitening {
            samples: samples as usize,
            eps,
            bias_epochs: settings.u64("bias_epochs")?,
            bias: None,
        })
    }
}

export_plugin!(PatchWhitening);
