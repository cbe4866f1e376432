#![doc = include_str!("../README.md")]

use tessera_plugin_api::device::upload;
use tessera_plugin_api::tch::{TchError, Tensor};
use tessera_plugin_api::{
    export_plugin, keys, Context, Error, Event, Hook, Method, Plugin, Sample, SampleRandom,
    SampleTransform, Settings,
};

/// Rows (or columns) kept out of `size`: `int((1 − p) · size)`, truncated as Python's `int`.
pub fn kept_count(size: i64, p: f64) -> i64 {
    ((1.0 - p) * size as f64) as i64
}

/// When the target loses the same rows and columns as the input (Composer's `resize_target`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResizeTarget {
    /// Only a target whose last two dimensions equal the input's (segmentation masks).
    Auto,
    /// Always (the target must have at least two dimensions).
    Always,
    /// Never.
    Never,
}

impl ResizeTarget {
    /// Whether a `target` of this shape goes through the same selection as an input of
    /// `input_size`.
    pub fn applies(self, input_size: &[i64], target_size: &[i64]) -> bool {
        match self {
            ResizeTarget::Always => true,
            ResizeTarget::Never => false,
            ResizeTarget::Auto => {
                target_size.len() >= 2
                    && input_size.len() >= 2
                    && target_size[target_size.len() - 2..] == input_size[input_size.len() - 2..]
            }
        }
    }
}

/// Keeps rows `rows` (dimension −2) and columns `cols` (dimension −1) of `images`
/// (`(..., H, W)`), in the given order.
pub fn keep_rows_cols(images: &Tensor, rows: &[i64], cols: &[i64]) -> Result<Tensor, TchError> {
    let size = images.size();
    if size.len() < 2 {
        return Err(TchError::Shape(format!(
            "colout needs images (..., H, W), got shape {size:?}"
        )));
    }
    let dims = size.len() as i64;
    // Host-made indices, uploaded without a blocking copy.
    let rows = upload(&Tensor::f_from_slice(rows)?, images.device())?;
    let cols = upload(&Tensor::f_from_slice(cols)?, images.device())?;
    images
        .f_index_select(dims - 2, &rows)?
        .f_index_select(dims - 1, &cols)
}

/// Composer's `colout_batch` with its draws given: keeps the sorted row indices `rows` and
/// column indices `cols` of every image of `input`, and of `target` when `resize_target`
/// applies to it. Returns the new input and the new target (`None` when `target` was `None`).
pub fn colout_batch(
    input: &Tensor,
    target: Option<&Tensor>,
    rows: &[i64],
    cols: &[i64],
    resize_target: ResizeTarget,
) -> Result<(Tensor, Option<Tensor>), TchError> {
    let out = keep_rows_cols(input, rows, cols)?;
    let target = match target {
        Some(t) if resize_target.applies(&input.size(), &t.size()) => {
            Some(keep_rows_cols(t, rows, cols)?)
        }
        Some(t) => Some(t.shallow_clone()),
        None => None,
    };
    Ok((out, target))
}

/// `keep` distinct indices out of `0..size`, uniformly, sorted: the first `keep` entries of a
/// random permutation (a partial Fisher–Yates shuffle, one draw per kept index), as Composer's
/// `sorted(torch.randperm(size)[:keep])`. Keeping every index draws nothing.
pub fn draw_kept(ctx: &mut Context<'_>, size: i64, keep: i64) -> Vec<i64> {
    draw_kept_with(size, keep, &mut |n| ctx.rng_below(n))
}

/// [`draw_kept`] from any uniform source: `below(n)` is a uniform integer in `0..n`.
pub fn draw_kept_with(size: i64, keep: i64, below: &mut dyn FnMut(u64) -> u64) -> Vec<i64> {
    let mut perm: Vec<i64> = (0..size).collect();
    if keep >= size {
        return perm;
    }
    for i in 0..keep.max(0) as usize {
        let j = i + below((size as usize - i) as u64) as usize;
        perm.swap(i, j);
    }
    perm.truncate(keep.max(0) as usize);
    perm.sort_unstable();
    perm
}

/// The kept rows and columns of a `height × width` image, or why none would be kept.
fn kept_sizes(height: i64, width: i64, p_row: f64, p_col: f64) -> Result<(i64, i64), String> {
    let (keep_rows, keep_cols) = (kept_count(height, p_row), kept_count(width, p_col));
    if keep_rows == 0 || keep_cols == 0 {
        return Err(format!(
            "colout would keep {keep_rows} of {height} rows and {keep_cols} of {width} \
             columns (p_row = {p_row}, p_col = {p_col}): lower them so every image keeps a pixel"
        ));
    }
    Ok((keep_rows, keep_cols))
}

/// Sample-wise ColOut (`batch = false`, Composer's `ColOutTransform`): each training image
/// keeps its own random rows and columns, drawn on the host's loader threads.
pub struct ColOutSample {
    /// Fraction of rows dropped.
    pub p_row: f64,
    /// Fraction of columns dropped.
    pub p_col: f64,
}

impl SampleTransform for ColOutSample {
    fn output_shape(
        &self,
        (c, h, w): (usize, usize, usize),
    ) -> Result<(usize, usize, usize), Error> {
        let (rows, cols) = kept_sizes(h as i64, w as i64, self.p_row, self.p_col)?;
        Ok((c, rows as usize, cols as usize))
    }

    fn apply(&self, sample: &mut Sample, rng: &mut SampleRandom<'_>) -> Result<(), Error> {
        let (c, h, w) = sample.shape();
        let (keep_rows, keep_cols) = kept_sizes(h as i64, w as i64, self.p_row, self.p_col)?;
        // Rows before columns, as Composer draws them.
        let rows = draw_kept_with(h as i64, keep_rows, &mut |n| rng.below(n));
        let cols = draw_kept_with(w as i64, keep_cols, &mut |n| rng.below(n));
        let mut data = Vec::with_capacity(c * rows.len() * cols.len());
        for ch in 0..c {
            for &y in &rows {
                data.extend(cols.iter().map(|&x| sample.at(ch, y as usize, x as usize)));
            }
        }
        *sample = Sample {
            channels: c,
            height: rows.len(),
            width: cols.len(),
            data,
        };
        Ok(())
    }
}

/// The ColOut method: batch-wise at `after_dataloader`, or sample-wise through a per-sample
/// transform on the loader's threads.
pub struct ColOut {
    p_row: f64,
    p_col: f64,
    batch: bool,
    resize_target: ResizeTarget,
}

impl Method for ColOut {
    fn sample_transform(&self) -> Option<Box<dyn SampleTransform>> {
        (!self.batch).then(|| {
            Box::new(ColOutSample {
                p_row: self.p_row,
                p_col: self.p_col,
            }) as Box<dyn SampleTransform>
        })
    }

    fn on_event(&mut self, _event: Event, ctx: &mut Context<'_>) -> Result<(), Error> {
        if !self.batch {
            // Sample-wise: the loader already did it.
            return Ok(());
        }
        let input = ctx.tensor(keys::INPUT).ok_or("the batch has no `input`")?;
        let size = input.size();
        if size.len() < 3 {
            return Err(
                format!("colout needs image batches (N, C, H, W), got shape {size:?}").into(),
            );
        }
        let (height, width) = (size[size.len() - 2], size[size.len() - 1]);
        let (keep_rows, keep_cols) = kept_sizes(height, width, self.p_row, self.p_col)?;
        // Rows before columns, as Composer draws them.
        let rows = draw_kept(ctx, height, keep_rows);
        let cols = draw_kept(ctx, width, keep_cols);
        let target = ctx.tensor(keys::TARGET);
        let resized = target
            .as_ref()
            .is_some_and(|t| self.resize_target.applies(&size, &t.size()));
        let (out, new_target) =
            colout_batch(&input, target.as_ref(), &rows, &cols, self.resize_target)?;
        ctx.set_tensor(keys::INPUT, out)?;
        match new_target {
            Some(t) if resized => ctx.set_tensor(keys::TARGET, t),
            _ => Ok(()),
        }
    }
}

/// Checks a drop probability: ColOut needs `0 ≤ p < 1`.
fn probability(settings: &Settings, key: &str) -> Result<f64, Error> {
    let p = settings.f64_or(key, 0.15)?;
    if !(0.0..1.0).contains(&p) {
        return Err(Error::config(format!(
            "`{key}` must be in [0, 1) (the fraction of {} dropped), got {p}",
            if key == "p_row" { "rows" } else { "columns" }
        )));
    }
    Ok(p)
}

impl Plugin for ColOut {
    const NAME: &'static str = "colout";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const DESCRIPTION: &'static str =
        "drops random rows and columns of training images, the same for the whole batch";
    const DEFAULT_SETTINGS: &'static str =
        "p_row = 0.15\np_col = 0.15\nbatch = true\nresize_target = \"auto\"";

    fn hooks() -> Vec<Hook> {
        vec![Hook::at(Event::AFTER_DATALOADER)]
    }

    fn create(settings: &Settings) -> Result<Self, Error> {
        let p_row = probability(settings, "p_row")?;
        let p_col = probability(settings, "p_col")?;
        let batch = settings.bool("batch")?;
        let resize_target = match settings.get_or("resize_target", serde_json::json!("auto"))? {
            serde_json::Value::Bool(true) => ResizeTarget::Always,
            serde_json::Value::Bool(false) => ResizeTarget::Never,
            serde_json::Value::String(s) if s == "auto" => ResizeTarget::Auto,
            other => {
                return Err(Error::config(format!(
                    "`resize_target` must be \"auto\", true or false, got {other}"
                )))
            }
        };
        if !batch && resize_target == ResizeTarget::Always {
            return Err(Error::config(
                "`resize_target = true` needs `batch = true`: sample-wise ColOut sees only the \
                 image (Tessera's loader has class-index targets), so there is no target to resize",
            ));
        }
        Ok(ColOut {
            p_row,
            p_col,
            batch,
            resize_target,
        })
    }
}

export_plugin!(ColOut);
