#![doc = include_str!("../README.md")]

use tessera_plugin_api::device::upload;
use tessera_plugin_api::tch::{Device, TchError, Tensor};
use tessera_plugin_api::{
    export_plugin, keys, Context, Error, Event, Hook, Method, Plugin, Settings,
};

/// The method's priority at `after_dataloader`: high, so it runs before the other batch
/// transforms there whatever the `trainer.toml` order.
pub const PRIORITY: i32 = 1000;

/// Composer's `should_selective_backprop`: whether the batch `batch_idx` (within its epoch) at
/// elapsed fraction `current_duration` is pruned — `start ≤ t < end`, and, unless
/// `interrupt == 0`, `(batch_idx + 1) % interrupt != 0` (every `interrupt`-th batch is a full
/// one).
pub fn should_selective_backprop(
    current_duration: f64,
    batch_idx: u64,
    start: f64,
    end: f64,
    interrupt: u64,
) -> bool {
    let in_interval = current_duration >= start && current_duration < end;
    let is_step = interrupt == 0 || !(batch_idx + 1).is_multiple_of(interrupt);
    in_interval && is_step
}

/// The number of samples kept from a batch of `n`: Composer's `int(keep · N)`, but at least 1
/// (Tessera refuses an empty batch).
pub fn n_select(keep: f64, n: usize) -> usize {
    ((keep * n as f64) as usize).clamp(1.min(n), n)
}

/// numpy's pairwise summation of `a` (`np.sum` on a contiguous float64 array), so that the
/// normalised probabilities match Composer's to the last bit.
pub fn numpy_sum(a: &[f64]) -> f64 {
    const BLOCK: usize = 128;
    let n = a.len();
    if n < 8 {
        let mut res = 0.0;
        for &v in a {
            res += v;
        }
        res
    } else if n <= BLOCK {
        let mut r = [0.0f64; 8];
        r.copy_from_slice(&a[..8]);
        let mut i = 8;
        while i < n - n % 8 {
            for (j, rj) in r.iter_mut().enumerate() {
                *rj += a[i + j];
            }
            i += 8;
        }
        let mut res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for &v in &a[i..] {
            res += v;
        }
        res
    } else {
        let mut n2 = n / 2;
        n2 -= n2 % 8;
        numpy_sum(&a[..n2]) + numpy_sum(&a[n2..])
    }
}

/// The selection probability of each loss rank (index 0 = smallest loss) in a batch of `n`:
/// `p_r ∝ ((r + 0.5)/n)^(1/keep − 1)`, computed as Composer does with numpy.
pub fn rank_probabilities(n: usize, keep: f64) -> Vec<f64> {
    let exponent = (1.0 / keep) - 1.0;
    let weights: Vec<f64> = (0..n)
        .map(|r| ((r as f64 + 0.5) / n as f64).powf(exponent))
        .collect();
    let total = numpy_sum(&weights);
    weights.into_iter().map(|w| w / total).collect()
}

/// The indices that sort `losses` ascending (`torch.argsort`); ties keep index order and NaN
/// sorts last, as in torch.
pub fn argsort(losses: &[f64]) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..losses.len()).collect();
    idx.sort_by(|&a, &b| {
        let (x, y) = (losses[a], losses[b]);
        match (x.is_nan(), y.is_nan()) {
            (true, true) => std::cmp::Ordering::Equal,
            (true, false) => std::cmp::Ordering::Greater,
            (false, true) => std::cmp::Ordering::Less,
            (false, false) => x.total_cmp(&y),
        }
        .then(a.cmp(&b))
    });
    idx
}

/// Draws `k` distinct indices of `0..p.len()` without replacement with weights `p` (successive
/// sampling: each draw picks among the remaining indices with probability proportional to its
/// weight), in draw order — the distribution of numpy's `choice(n, k, replace=False, p=p)`.
/// `uniform` yields numbers in `[0, 1)`; one is used per index (Efraimidis–Spirakis keys
/// `ln(u)/w`, whose descending order is distributed as successive sampling's draw order).
pub fn weighted_sample_without_replacement(
    p: &[f64],
    k: usize,
    mut uniform: impl FnMut() -> f64,
) -> Vec<usize> {
    let mut keyed: Vec<(f64, usize)> = p
        .iter()
        .enumerate()
        .map(|(i, &w)| {
            // u in (0, 1], so ln(u) in (-inf, 0]; a zero weight gives -inf (picked last).
            let u = 1.0 - uniform();
            let key = if w > 0.0 {
                u.ln() / w
            } else {
                f64::NEG_INFINITY
            };
            (key, i)
        })
        .collect();
    keyed.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    keyed.into_iter().take(k).map(|(_, i)| i).collect()
}

/// Downsamples `input` by `scale_factor` as Composer does (`F.interpolate(input,
/// scale_factor=s, mode=...)`: `linear` for 3-D, `bilinear` for 4-D, `trilinear` for 5-D
/// inputs, `align_corners=False`, output side `floor(side · s)`, the scale passed to the
/// kernel). `scale_factor == 1` returns the input itself.
pub fn downsample(input: &Tensor, scale_factor: f64) -> Result<Tensor, TchError> {
    if scale_factor == 1.0 {
        return Ok(input.shallow_clone());
    }
    let size = input.size();
    let spatial = size.len().saturating_sub(2);
    if !(1..=3).contains(&spatial) {
        return Err(TchError::Shape(format!(
            "selective backprop's scale_factor needs a 3-D, 4-D or 5-D input, got shape {size:?}"
        )));
    }
    let out: Vec<i64> = size[2..]
        .iter()
        .map(|&s| (s as f64 * scale_factor).floor() as i64)
        .collect();
    if out.iter().any(|&s| s < 1) {
        return Err(TchError::Shape(format!(
            "scale_factor {scale_factor} shrinks input {size:?} to nothing"
        )));
    }
    let s = Some(scale_factor);
    match spatial {
        1 => input.f_upsample_linear1d(&out, false, s),
        2 => input.f_upsample_bilinear2d(&out, false, s, s),
        _ => input.f_upsample_trilinear3d(&out, false, s, s, s),
    }
}

/// Composer's `select_using_loss`, with the model, the loss and the random numbers supplied by
/// the caller: scores the samples of `input` with `loss(model(downsample(input)), target)`
/// (per sample, shape `(N,)`), ranks them by ascending loss, and returns the indices of the
/// [`n_select`] samples kept, in draw order (`sorted_idx[choice(...)]`), read back to the host
/// (see [`select_on_device`], which the method uses).
pub fn select_using_loss(
    input: &Tensor,
    target: &Tensor,
    keep: f64,
    scale_factor: f64,
    model: impl FnOnce(&Tensor) -> Result<Tensor, Error>,
    loss: impl FnOnce(&Tensor, &Tensor) -> Result<Tensor, Error>,
    uniform: impl FnMut() -> f64,
) -> Result<Vec<i64>, Error> {
    let idx = select_on_device(input, target, keep, scale_factor, model, loss, uniform)?;
    Ok(Vec::try_from(idx.f_to_device(Device::Cpu)?)?)
}

/// [`select_using_loss`] without a read on the host: the indices stay on the losses' device.
/// The draw (which ranks are kept) does not depend on the losses, only the order does: the
/// ranks are drawn on the host and uploaded, the losses sorted on the device (a stable sort:
/// ties keep sample order and NaN losses rank last, as [`argsort`]), and the kept samples are
/// `sorted[ranks]`.
pub fn select_on_device(
    input: &Tensor,
    target: &Tensor,
    keep: f64,
    scale_factor: f64,
    model: impl FnOnce(&Tensor) -> Result<Tensor, Error>,
    loss: impl FnOnce(&Tensor, &Tensor) -> Result<Tensor, Error>,
    uniform: impl FnMut() -> f64,
) -> Result<Tensor, Error> {
    let n = usize::try_from(input.size().first().copied().unwrap_or(0)).unwrap_or(0);
    if n == 0 {
        return Err("selective backprop got an empty batch".into());
    }
    let scaled = downsample(input, scale_factor)?;
    let output = model(&scaled)?;
    let losses = loss(&output, target)?.f_detach()?.f_reshape([-1])?;
    let scored = losses.size().first().copied().unwrap_or(0);
    if scored != n as i64 {
        return Err(format!("the per-sample loss has {scored} values for a batch of {n}").into());
    }
    let sorted = losses.f_argsort_stable(true, 0, false)?;
    let probs = rank_probabilities(n, keep);
    let ranks: Vec<i64> = weighted_sample_without_replacement(&probs, n_select(keep, n), uniform)
        .into_iter()
        .map(|r| r as i64)
        .collect();
    let ranks = upload(&Tensor::f_from_slice(&ranks)?, sorted.device())?;
    Ok(sorted.f_index_select(0, &ranks)?)
}

/// The Selective Backprop method.
pub struct SelectiveBackprop {
    start: f64,
    end: f64,
    keep: f64,
    scale_factor: f64,
    interrupt: u64,
}

impl Method for SelectiveBackprop {
    fn on_event(&mut self, _event: Event, ctx: &mut Context<'_>) -> Result<(), Error> {
        // As Composer's `match`: keep >= 1 never prunes (and costs nothing).
        if self.keep >= 1.0 {
            return Ok(());
        }
        let time = ctx.time();
        if !time.training
            || !should_selective_backprop(
                time.elapsed_fraction,
                time.batch_in_epoch,
                self.start,
                self.end,
                self.interrupt,
            )
        {
            return Ok(());
        }
        let input = ctx.tensor(keys::INPUT).ok_or("the batch has no `input`")?;
        let target = ctx
            .tensor(keys::TARGET)
            .ok_or("the batch has no `target`")?;
        let idx = {
            let host = std::cell::RefCell::new(&mut *ctx);
            // The indices stay on the device: no read on the host.
            select_on_device(
                &input,
                &target,
                self.keep,
                self.scale_factor,
                |x| host.borrow_mut().forward(x, false),
                |o, t| host.borrow_mut().loss(o, t, true),
                || host.borrow_mut().rng_f64(),
            )?
        };
        let kept = idx.size().first().copied().unwrap_or(0);
        let idx = upload(&idx, input.device())?;
        // Every batch tensor shrinks alike: `input`, `target` (Composer's pair), then any other.
        let mut entries = vec![
            (keys::INPUT.to_owned(), input.f_index_select(0, &idx)?),
            (keys::TARGET.to_owned(), target.f_index_select(0, &idx)?),
        ];
        for key in ctx.batch_keys()? {
            if key != keys::INPUT && key != keys::TARGET {
                if let Some(t) = ctx.tensor(&key) {
                    let shrunk = t.f_index_select(0, &upload(&idx, t.device())?)?;
                    entries.push((key, shrunk));
                }
            }
        }
        ctx.set_batch(
            entries
                .iter()
                .map(|(k, t)| (k.as_str(), t.shallow_clone()))
                .collect(),
        )?;
        ctx.log_metric("selective_backprop/kept", kept as f64);
        Ok(())
    }
}

impl Plugin for SelectiveBackprop {
    const NAME: &'static str = "selective_backprop";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const DESCRIPTION: &'static str =
        "trains on the higher-loss part of each batch, chosen by an extra no-grad forward pass";
    const DEFAULT_SETTINGS: &'static str =
        "start = 0.5\nend = 0.9\nkeep = 0.5\nscale_factor = 1.0\ninterrupt = 2";

    fn hooks() -> Vec<Hook> {
        vec![Hook {
            event: Event::AFTER_DATALOADER,
            priority: PRIORITY,
        }]
    }

    fn create(settings: &Settings) -> Result<Self, Error> {
        let start = settings.f64("start")?;
        let end = settings.f64("end")?;
        let keep = settings.f64("keep")?;
        let scale_factor = settings.f64("scale_factor")?;
        let interrupt = settings.u64("interrupt")?;
        if !start.is_finite() {
            return Err(Error::config(format!(
                "`start` must be finite, got {start}"
            )));
        }
        if !end.is_finite() {
            return Err(Error::config(format!("`end` must be finite, got {end}")));
        }
        if !(keep > 0.0 && keep <= 1.0) {
            return Err(Error::config(format!(
                "`keep` must be in (0, 1], got {keep}"
            )));
        }
        if !(scale_factor > 0.0 && scale_factor <= 1.0) {
            return Err(Error::config(format!(
                "`scale_factor` must be in (0, 1], got {scale_factor}"
            )));
        }
        Ok(SelectiveBackprop {
            start,
            end,
            keep,
            scale_factor,
            interrupt,
        })
    }
}

export_plugin!(SelectiveBackprop);
