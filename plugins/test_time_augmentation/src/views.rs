//! The functional form: logits averaged over augmented views, as airbench's `infer`
//! (`infer_mirror`, `infer_mirror_translate`), and the selective variant of
//! hiverge/cifar10-speedrun (only the samples the model is unsure of are augmented).

use tessera_plugin_api::tch::{Kind, Tensor};
use tessera_plugin_api::Error;

/// How many views are averaged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// No augmentation: the output is left as it is.
    None,
    /// The image and its horizontal mirror, weighted ½ each (airbench's `infer_mirror`).
    Mirror,
    /// ½ · mirror(image) + ½ · mean(mirror(image shifted up-left by 1 px), mirror(image
    /// shifted down-right by 1 px)), the shifts made by reflect padding (airbench's
    /// `infer_mirror_translate`): six forwards, weights ¼, ¼ and ⅛ for each of the four
    /// shifted views.
    MirrorTranslate,
}

impl Level {
    /// The level of airbench's `tta_level` number (0, 1 or 2).
    pub fn from_number(level: u64) -> Option<Level> {
        match level {
            0 => Some(Level::None),
            1 => Some(Level::Mirror),
            2 => Some(Level::MirrorTranslate),
            _ => None,
        }
    }

    /// Forwards per image, the plain one included (1, 2 or 6).
    pub fn forwards(self) -> u32 {
        match self {
            Level::None => 1,
            Level::Mirror => 2,
            Level::MirrorTranslate => 6,
        }
    }
}

/// ½ · `own` + ½ · forward(`input` mirrored left–right): `own` is the logits of `input`.
fn mirror(
    forward: &mut dyn FnMut(&Tensor) -> Result<Tensor, Error>,
    input: &Tensor,
    own: &Tensor,
) -> Result<Tensor, Error> {
    let flipped = forward(&input.f_flip([-1])?)?.f_to_kind(Kind::Float)?;
    Ok(own.f_mul_scalar(0.5)?.f_add(&flipped.f_mul_scalar(0.5)?)?)
}

/// The logits of `input` (`N, C, H, W`, with `H, W ≥ 2`) averaged over the views of `level`,
/// in float32. `output` is the model's logits of `input` itself (the host has computed them);
/// `forward` runs the model in evaluation mode on another batch of images.
pub fn averaged_logits(
    forward: &mut dyn FnMut(&Tensor) -> Result<Tensor, Error>,
    input: &Tensor,
    output: &Tensor,
    level: Level,
) -> Result<Tensor, Error> {
    let own = output.f_to_kind(Kind::Float)?;
    match level {
        Level::None => Ok(own),
        Level::Mirror => mirror(forward, input, &own),
        Level::MirrorTranslate => {
            let plain = mirror(forward, input, &own)?;
            let size = input.size();
            let (h, w) = (size[2], size[3]);
            let padded = input.f_reflection_pad2d([1, 1, 1, 1])?;
            let mut shifted = Vec::with_capacity(2);
            // Rows and columns 0..H of the padded image (its content moves down-right by one
            // pixel) and 2..H+2 (up-left), as airbench's `padded_inputs[:, :, 0:32, 0:32]` and
            // `[:, :, 2:34, 2:34]`.
            for start in [0, 2] {
                let view = padded
                    .f_narrow(2, start, h)?
                    .f_narrow(3, start, w)?
                    .f_contiguous()?;
                let own = forward(&view)?.f_to_kind(Kind::Float)?;
                shifted.push(mirror(forward, &view, &own)?);
            }
            let translated = Tensor::f_stack(&shifted, 0)?.f_mean_dim(0, false, Kind::Float)?;
            Ok(plain
                .f_mul_scalar(0.5)?
                .f_add(&translated.f_mul_scalar(0.5)?)?)
        }
    }
}

/// [`averaged_logits`] for the samples whose top softmax probability is below `confidence`
/// only (hiverge/cifar10-speedrun's selective TTA); the others keep `output` (as float32). The
/// extra forwards see only those samples. Returns the logits and how many were augmented.
/// `output` must be `(N, classes)`.
pub fn selective_logits(
    forward: &mut dyn FnMut(&Tensor) -> Result<Tensor, Error>,
    input: &Tensor,
    output: &Tensor,
    level: Level,
    confidence: f64,
) -> Result<(Tensor, i64), Error> {
    let own = output.f_to_kind(Kind::Float)?;
    let top = own.f_softmax(1, Kind::Float)?.f_amax([1], false)?;
    let unsure = top.f_lt(confidence)?.f_nonzero()?.f_squeeze_dim(1)?;
    let n = unsure.size()[0];
    if n == 0 || level == Level::None {
        return Ok((own, 0));
    }
    let part = averaged_logits(
        forward,
        &input.f_index_select(0, &unsure)?,
        &own.f_index_select(0, &unsure)?,
        level,
    )?;
    Ok((own.f_index_copy(0, &unsure, &part)?, n))
}
