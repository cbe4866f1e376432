#![doc = include_str!("../README.md")]

use tessera_plugin_api::kit::{walk, SurgeryModel};
use tessera_plugin_api::tch::Tensor;
use tessera_plugin_api::{
    export_plugin, Context, Error, Event, Hook, Inner, Method, ModuleInfo, Plugin, Settings,
    Wrapper,
};

/// The kind of the wrapper in the module tree.
pub const KIND: &str = "ghost_batch_norm2d";

/// A batch norm's tensors and settings, shared with the model (shallow clones).
pub struct BatchNormTensors {
    /// Scale (γ).
    pub weight: Tensor,
    /// Shift (β).
    pub bias: Tensor,
    /// Running mean (updated in place).
    pub running_mean: Tensor,
    /// Running variance (updated in place).
    pub running_var: Tensor,
    /// Training-mode forwards counted (updated in place).
    pub num_batches_tracked: Tensor,
    /// The running statistics' momentum.
    pub momentum: f64,
    /// Added to the variance.
    pub eps: f64,
}

/// The sizes `input.chunk(ceil(n / ghost))` gives along the batch: `ceil(n / nchunks)` each,
/// the last one smaller; an error (Composer's) when `n < ghost_batch_size`.
pub fn chunk_sizes(n: i64, ghost_batch_size: i64) -> Result<Vec<i64>, String> {
    if n < ghost_batch_size {
        return Err(format!(
            "Worker batch size {n} < ghost_batch_size {ghost_batch_size}"
        ));
    }
    let nchunks = (n + ghost_batch_size - 1) / ghost_batch_size;
    let size = (n + nchunks - 1) / nchunks;
    let mut sizes = Vec::new();
    let mut left = n;
    while left > 0 {
        sizes.push(size.min(left));
        left -= size;
    }
    Ok(sizes)
}

/// Composer's `_GhostBatchNorm.forward` in training mode: the batch in
/// `ceil(N / ghost_batch_size)` chunks (`torch.chunk`), each through the same batch norm in
/// sequence with the momentum divided by the number of chunks, so the running statistics get
/// one update per chunk and `num_batches_tracked` grows by the number of chunks.
pub fn ghost_batch_norm(
    input: &Tensor,
    bn: &BatchNormTensors,
    ghost_batch_size: i64,
) -> Result<Tensor, Error> {
    let n = *input
        .size()
        .first()
        .ok_or("ghost batch norm needs a batch dimension")?;
    let sizes = chunk_sizes(n, ghost_batch_size)?;
    let momentum = bn.momentum / sizes.len() as f64;
    let mut outputs = Vec::with_capacity(sizes.len());
    let mut start = 0;
    for size in &sizes {
        let chunk = input.f_narrow(0, start, *size)?;
        outputs.push(Tensor::f_batch_norm(
            &chunk,
            Some(&bn.weight),
            Some(&bn.bias),
            Some(&bn.running_mean),
            Some(&bn.running_var),
            true,
            momentum,
            bn.eps,
            true,
        )?);
        start += size;
    }
    let _ = tessera_plugin_api::tch::no_grad(|| {
        bn.num_batches_tracked
            .shallow_clone()
            .f_add_scalar_(sizes.len() as i64)
    })?;
    Ok(Tensor::f_cat(&outputs, 0)?)
}

/// The wrapper around one batch norm: ghost batches in training, the plain batch norm (called
/// through the host) in evaluation.
struct GhostWrapper {
    bn: BatchNormTensors,
    ghost_batch_size: i64,
}

impl Wrapper for GhostWrapper {
    fn kind(&self) -> &str {
        KIND
    }

    fn attrs(&self) -> Vec<(String, f64)> {
        vec![("ghost_batch_size".to_owned(), self.ghost_batch_size as f64)]
    }

    fn forward(&self, input: &Tensor, train: bool, inner: &mut Inner<'_>) -> Result<Tensor, Error> {
        if train {
            ghost_batch_norm(input, &self.bn, self.ghost_batch_size)
        } else {
            inner.forward(input, train)
        }
    }

    /// In evaluation the wrapper is the plain batch norm: it folds away, its batch norm's
    /// tensors exported under the wrapper's path (`bn1.weight`, not `bn1.batchnorm.weight`).
    fn export(&self, inner: Vec<(String, Tensor)>) -> Result<Option<Vec<(String, Tensor)>>, Error> {
        Ok(Some(inner))
    }
}

/// The batch norms GhostBatchNorm wraps: every `batch_norm2d` not already inside a ghost
/// wrapper (so applying it twice changes nothing).
pub fn targets(modules: &[ModuleInfo]) -> Vec<String> {
    walk::of_kind(modules, "batch_norm2d")
        .filter(|m| !walk::inside_kind(modules, m.path.as_str(), KIND))
        .map(|m| m.path.as_str().to_owned())
        .collect()
}

/// The surgery: every batch norm of [`targets`] is wrapped (moved below `<path>.batchnorm`,
/// its tensors renamed with it) in a ghost wrapper over the same tensors, with its momentum
/// (default 0.1) and epsilon (default 1e-5). Returns the paths wrapped; a second application
/// wraps none.
pub fn apply_ghost_batchnorm(
    model: &mut impl SurgeryModel,
    ghost_batch_size: i64,
) -> Result<Vec<String>, Error> {
    let modules = model.modules()?;
    let paths = targets(&modules);
    for path in &paths {
        let info = walk::find(&modules, path).ok_or("the module tree changed during surgery")?;
        let bn = BatchNormTensors {
            weight: model.tensor_of(info, "weight")?,
            bias: model.tensor_of(info, "bias")?,
            running_mean: model.tensor_of(info, "running_mean")?,
            running_var: model.tensor_of(info, "running_var")?,
            num_batches_tracked: model.tensor_of(info, "num_batches_tracked")?,
            momentum: info.attr("momentum").unwrap_or(0.1),
            eps: info.attr("eps").unwrap_or(1e-5),
        };
        let wrapper = GhostWrapper {
            bn,
            ghost_batch_size,
        };
        model.wrap_module(path, wrapper, Some("batchnorm"), Vec::new())?;
    }
    Ok(paths)
}

/// The GhostBatchNorm method.
pub struct GhostBatchNorm {
    ghost_batch_size: i64,
}

impl Method for GhostBatchNorm {
    fn on_event(&mut self, _event: Event, ctx: &mut Context<'_>) -> Result<(), Error> {
        let paths = apply_ghost_batchnorm(ctx, self.ghost_batch_size)?;
        ctx.info(&format!(
            "ghost_batchnorm: {} batch norms in ghost batches of {}",
            paths.len(),
            self.ghost_batch_size
        ));
        ctx.log_metric("ghost_batchnorm/replaced", paths.len() as f64);
        Ok(())
    }
}

impl Plugin for GhostBatchNorm {
    const NAME: &'static str = "ghost_batchnorm";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const DESCRIPTION: &'static str =
        "normalizes each chunk of ghost_batch_size samples separately in training";
    const DEFAULT_SETTINGS: &'static str = "ghost_batch_size = 32";

    fn hooks() -> Vec<Hook> {
        vec![Hook::at(Event::INIT)]
    }

    fn create(settings: &Settings) -> Result<Self, Error> {
        let ghost_batch_size = settings.u64("ghost_batch_size")?;
        if ghost_batch_size == 0 {
            return Err(Error::config("`ghost_batch_size` must be at least 1"));
        }
        Ok(GhostBatchNorm {
            ghost_batch_size: ghost_batch_size as i64,
        })
    }
}

export_plugin!(GhostBatchNorm);
