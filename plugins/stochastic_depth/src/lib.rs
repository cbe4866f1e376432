#![doc = include_str!("../README.md")]

use std::sync::{Arc, Mutex};

use tessera_plugin_api::device::upload;
use tessera_plugin_api::kit::{walk, StateReader};
use tessera_plugin_api::tch::{Device, Kind, Tensor};
use tessera_plugin_api::{
    export_plugin, keys, Context, Error, Event, Hook, Inner, Method, ModuleInfo, Plugin, Settings,
    State, Time, TimeUnit, Wrapper,
};

/// The kind of the wrapper in the module tree.
pub const KIND: &str = "stochastic_bottleneck";

/// Composer's `target_layer_name` for torchvision's `Bottleneck`, the one block it supports.
pub const TARGET_LAYER: &str = "ResNetBottleneck";

/// How blocks are dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StochasticMethod {
    /// The whole residual branch of a block, for the whole batch.
    Block,
    /// The residual branch per sample.
    Sample,
}

/// How the drop rate is spread over the blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Distribution {
    /// Block `i` of `n` (0-based) drops with `(i + 1) / n · drop_rate`.
    Linear,
    /// Every block drops with `drop_rate`.
    Uniform,
}

/// The drop rate of each of `n` blocks, rounded to `f32` as Composer keeps them
/// (`torch.tensor(rate)`).
pub fn drop_rates(n: usize, drop_rate: f64, distribution: Distribution) -> Vec<f32> {
    (0..n)
        .map(|i| match distribution {
            Distribution::Linear => ((i + 1) as f64 / n as f64 * drop_rate) as f32,
            Distribution::Uniform => drop_rate as f32,
        })
        .collect()
}

/// The per-sample keep mask of Composer's `_sample_drop` for drop rate `p` and uniform draws
/// `u` (one per sample): `floor(1 − p + u_k)`, in `f32` as Composer computes it for `float32`
/// inputs. Sample `k`'s branch output is multiplied by it in training (no rescaling).
pub fn sample_mask(p: f32, u: &[f32]) -> Vec<f32> {
    let keep = 1.0 - p;
    u.iter().map(|&v| (keep + v).floor()).collect()
}

/// A part of a block (its branch, its projection) as a function of the block's input.
pub type Part<'a> = &'a mut dyn FnMut(&Tensor) -> Result<Tensor, Error>;

/// This forward's decision for one block in training.
#[derive(Debug)]
pub enum Decision {
    /// Block mode: keep (`true`) or drop the residual branch.
    Keep(bool),
    /// Sample mode: the per-sample mask `(N)`.
    Mask(Tensor),
}

/// One bottleneck block as Composer's `StochasticBottleneck` computes it, over its parts:
/// `branch` (conv1 … bn3) and `downsample` (the projection, if the block has one).
///
/// - evaluation: `relu(branch(x) · (1 − p) + identity)`;
/// - training, block kept: `relu(branch(x) + identity)`; dropped: `identity`, or
///   `relu(downsample(x))` when the block has a projection;
/// - training, sample mode: `relu(branch(x) · mask + identity)`, `mask` one value per sample.
///
/// `decision` is `None` in evaluation; in training without a decision the block is kept.
pub fn stochastic_bottleneck(
    x: &Tensor,
    train: bool,
    p: f32,
    decision: Option<&Decision>,
    branch: Part<'_>,
    downsample: Option<Part<'_>>,
) -> Result<Tensor, Error> {
    let has_downsample = downsample.is_some();
    let mut identity = |x: &Tensor| -> Result<Tensor, Error> { Ok(x.shallow_clone()) };
    let shortcut: Part<'_> = match downsample {
        Some(d) => d,
        None => &mut identity,
    };
    if !train {
        let out = branch(x)?.f_mul_scalar(1.0 - p as f64)?;
        return Ok(out.f_add(&shortcut(x)?)?.f_relu()?);
    }
    match decision {
        Some(Decision::Keep(false)) => {
            let id = shortcut(x)?;
            Ok(if has_downsample { id.f_relu()? } else { id })
        }
        Some(Decision::Mask(mask)) => {
            let out = branch(x)?;
            let n = out.size()[0];
            let mut shape = vec![n];
            shape.resize(out.dim(), 1);
            let mask = mask.f_to_kind(out.kind())?.f_view(shape.as_slice())?;
            Ok(out.f_mul(&mask)?.f_add(&shortcut(x)?)?.f_relu()?)
        }
        Some(Decision::Keep(true)) | None => Ok(branch(x)?.f_add(&shortcut(x)?)?.f_relu()?),
    }
}

/// The blocks' current drop rates and this forward's decisions, shared by the method (which
/// draws them from the host's stream at `before_forward`) and its wrappers (which apply them).
#[derive(Default)]
struct Shared {
    rates: Vec<f32>,
    decisions: Vec<Option<Decision>>,
}

struct StochasticWrapper {
    index: usize,
    has_downsample: bool,
    shared: Arc<Mutex<Shared>>,
}

impl Wrapper for StochasticWrapper {
    fn kind(&self) -> &str {
        KIND
    }

    fn attrs(&self) -> Vec<(String, f64)> {
        vec![("block_index".to_owned(), self.index as f64)]
    }

    fn forward(&self, x: &Tensor, train: bool, inner: &mut Inner<'_>) -> Result<Tensor, Error> {
        let shared = self
            .shared
            .lock()
            .map_err(|_| "stochastic_depth: state poisoned")?;
        let p = shared.rates.get(self.index).copied().unwrap_or(0.0);
        let decision = if train {
            shared.decisions.get(self.index).and_then(Option::as_ref)
        } else {
            None
        };
        // The inner module is called through one `&mut Inner`, so branch and shortcut take
        // turns with it.
        let inner = std::cell::RefCell::new(inner);
        let mut branch = |x: &Tensor| -> Result<Tensor, Error> {
            let mut inner = inner.borrow_mut();
            let mut y = inner.child("conv1", x, train)?;
            y = inner.child("bn1", &y, train)?.f_relu()?;
            y = inner.child("conv2", &y, train)?;
            y = inner.child("bn2", &y, train)?.f_relu()?;
            y = inner.child("conv3", &y, train)?;
            inner.child("bn3", &y, train)
        };
        let mut down = |x: &Tensor| -> Result<Tensor, Error> {
            inner.borrow_mut().child("downsample", x, train)
        };
        let downsample: Option<Part<'_>> = if self.has_downsample {
            Some(&mut down)
        } else {
            None
        };
        stochastic_bottleneck(x, train, p, decision, &mut branch, downsample)
    }

    /// In evaluation the block is `relu((1 − p) · branch(x) + shortcut(x))`; the branch ends in
    /// `bn3`, so scaling that batch norm's affine weight and bias by `1 − p` gives a plain
    /// bottleneck with the same output: the wrapper folds away.
    fn export(&self, inner: Vec<(String, Tensor)>) -> Result<Option<Vec<(String, Tensor)>>, Error> {
        let p = self
            .shared
            .lock()
            .map_err(|_| "stochastic_depth: state poisoned")?
            .rates
            .get(self.index)
            .copied()
            .unwrap_or(0.0);
        fold_drop_rate(inner, p).map(Some)
    }
}

/// A bottleneck's tensors (named relative to it) with `1 − p` folded into `bn3.weight` and
/// `bn3.bias`, so that the plain block computes what the stochastic block computes in
/// evaluation.
pub fn fold_drop_rate(
    tensors: Vec<(String, Tensor)>,
    p: f32,
) -> Result<Vec<(String, Tensor)>, Error> {
    let keep = 1.0 - p as f64;
    let mut folded = 0;
    let out = tensors
        .into_iter()
        .map(|(name, t)| -> Result<(String, Tensor), Error> {
            if name == "bn3.weight" || name == "bn3.bias" {
                folded += 1;
                let scaled = tessera_plugin_api::tch::no_grad(|| t.f_mul_scalar(keep))?;
                Ok((name, scaled))
            } else {
                Ok((name, t))
            }
        })
        .collect::<Result<Vec<_>, Error>>()?;
    if folded != 2 {
        return Err(format!(
            "stochastic_depth: the wrapped block has no affine `bn3` (found {folded} of \
             bn3.weight, bn3.bias) to fold the drop rate into"
        )
        .into());
    }
    Ok(out)
}

/// The bottleneck blocks StochasticDepth wraps, in module order, with whether each has a
/// projection: every `bottleneck_block` not already wrapped.
pub fn targets(modules: &[ModuleInfo]) -> Vec<(String, bool)> {
    walk::of_kind(modules, "bottleneck_block")
        .map(|m| {
            let path = m.path.as_str();
            let has = walk::find(modules, &format!("{path}.downsample")).is_some();
            (path.to_owned(), has)
        })
        .collect()
}

/// The StochasticDepth method.
pub struct StochasticDepth {
    method: StochasticMethod,
    drop_rate: f64,
    distribution: Distribution,
    /// Fraction of the run over which the drop rate ramps up (0: none).
    drop_warmup: f64,
    shared: Arc<Mutex<Shared>>,
}

impl StochasticDepth {
    fn surgery(&mut self, ctx: &mut Context<'_>) -> Result<(), Error> {
        let modules = ctx.modules()?;
        if modules.iter().any(|m| m.kind.as_str() == KIND) {
            return Ok(());
        }
        let blocks = targets(&modules);
        if blocks.is_empty() {
            ctx.warn("stochastic_depth: no ResNetBottleneck (bottleneck_block) found in the model; the method does nothing");
        }
        let rates = drop_rates(blocks.len(), self.drop_rate, self.distribution);
        {
            let mut shared = self.shared.lock().map_err(|_| "state poisoned")?;
            shared.rates = rates;
            shared.decisions = (0..blocks.len()).map(|_| None).collect();
        }
        for (index, (path, has_downsample)) in blocks.iter().enumerate() {
            let wrapper = StochasticWrapper {
                index,
                has_downsample: *has_downsample,
                shared: Arc::clone(&self.shared),
            };
            ctx.wrap_module(path, wrapper, None, Vec::new())?;
        }
        ctx.log_metric(
            "stochastic_depth/num_stochastic_layers",
            blocks.len() as f64,
        );
        Ok(())
    }

    fn draw(&mut self, ctx: &mut Context<'_>) -> Result<(), Error> {
        let input = ctx.tensor(keys::INPUT);
        let n = input
            .as_ref()
            .and_then(|t| t.size().first().copied())
            .ok_or("stochastic_depth: the batch has no `input`")?;
        let device = input.map_or(Device::Cpu, |t| t.device());
        let mut shared = self.shared.lock().map_err(|_| "state poisoned")?;
        let rates = shared.rates.clone();
        shared.decisions = rates
            .iter()
            .map(|&p| -> Result<Option<Decision>, Error> {
                Ok(Some(match self.method {
                    // torch.bernoulli(1 - p): kept with probability 1 - p.
                    StochasticMethod::Block => Decision::Keep(ctx.rng_f64() < 1.0 - p as f64),
                    StochasticMethod::Sample => {
                        let u: Vec<f32> = (0..n).map(|_| ctx.rng_f64() as f32).collect();
                        // Drawn from the host's stream (exact resume), uploaded through
                        // pinned memory without a blocking copy.
                        let mask = Tensor::f_from_slice(&sample_mask(p, &u))?;
                        Decision::Mask(upload(&mask, device)?.f_to_kind(Kind::Float)?)
                    }
                }))
            })
            .collect::<Result<_, _>>()?;
        Ok(())
    }
}

const STATE_FORMAT: u32 = 1;

impl Method for StochasticDepth {
    /// The blocks' current drop rates: during a warmup they follow the clock, and after it
    /// they keep the last ramped value (Composer's behaviour), which a resume must restore.
    fn state(&self) -> Result<State, Error> {
        let shared = self.shared.lock().map_err(|_| "state poisoned")?;
        Ok(State {
            format_version: STATE_FORMAT,
            bytes: shared.rates.iter().flat_map(|r| r.to_le_bytes()).collect(),
            tensors: Vec::new(),
        })
    }

    fn load_state(&mut self, state: State) -> Result<(), Error> {
        let reader = StateReader::open("stochastic_depth", state, STATE_FORMAT)?;
        let bytes = reader.bytes();
        let mut shared = self.shared.lock().map_err(|_| "state poisoned")?;
        if bytes.len() != shared.rates.len() * 4 {
            return Err(format!(
                "stochastic_depth: the checkpoint has {} drop rates, the model {} stochastic blocks",
                bytes.len() / 4,
                shared.rates.len()
            )
            .into());
        }
        shared.rates = bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        Ok(())
    }

    fn on_event(&mut self, event: Event, ctx: &mut Context<'_>) -> Result<(), Error> {
        match event {
            Event::INIT => self.surgery(ctx),
            Event::BATCH_START if self.drop_warmup > 0.0 => {
                // As Composer: ramp while inside the warmup; the last ramped value stays after it.
                let elapsed = ctx.time().elapsed_fraction;
                if elapsed < self.drop_warmup {
                    let rate = elapsed / self.drop_warmup * self.drop_rate;
                    let mut shared = self.shared.lock().map_err(|_| "state poisoned")?;
                    let n = shared.rates.len();
                    shared.rates = drop_rates(n, rate, self.distribution);
                    drop(shared);
                    ctx.log_metric("stochastic_depth/drop_rate", rate);
                } else {
                    ctx.log_metric("stochastic_depth/drop_rate", self.drop_rate);
                }
                Ok(())
            }
            Event::BEFORE_FORWARD => self.draw(ctx),
            Event::AFTER_FORWARD => {
                let mut shared = self.shared.lock().map_err(|_| "state poisoned")?;
                shared.decisions.iter_mut().for_each(|d| *d = None);
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

fn parse_warmup(settings: &Settings) -> Result<f64, Error> {
    let value: serde_json::Value = settings.get_or("drop_warmup", serde_json::json!(0.0))?;
    let bad = || {
        Error::config(format!(
            "`drop_warmup` must be a fraction of the run in [0, 1] (0.1) or a time in `dur` (\"0.1dur\"), got {value}"
        ))
    };
    let fraction = match &value {
        serde_json::Value::Number(n) => n.as_f64().ok_or_else(bad)?,
        serde_json::Value::String(s) => {
            let t = Time::parse(s).map_err(|_| bad())?;
            if t.unit() != TimeUnit::Duration {
                return Err(bad());
            }
            t.fraction().ok_or_else(bad)?
        }
        _ => return Err(bad()),
    };
    if !(0.0..=1.0).contains(&fraction) {
        return Err(bad());
    }
    Ok(fraction)
}

impl Plugin for StochasticDepth {
    const NAME: &'static str = "stochastic_depth";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const DESCRIPTION: &'static str =
        "randomly skips the residual branch of ResNet bottleneck blocks (or of single samples)";
    const DEFAULT_SETTINGS: &'static str = "target_layer_name = \"ResNetBottleneck\"\nstochastic_method = \"block\"\ndrop_rate = 0.2\ndrop_distribution = \"linear\"\ndrop_warmup = 0.0\nuse_same_gpu_seed = true";

    fn hooks() -> Vec<Hook> {
        vec![
            Hook::at(Event::INIT),
            Hook::at(Event::BATCH_START),
            Hook::at(Event::BEFORE_FORWARD),
            Hook::at(Event::AFTER_FORWARD),
        ]
    }

    fn create(settings: &Settings) -> Result<Self, Error> {
        let target = settings.str_or("target_layer_name", TARGET_LAYER)?;
        if target != TARGET_LAYER {
            return Err(Error::config(format!(
                "`target_layer_name` = {target:?}: only \"{TARGET_LAYER}\" (torchvision's Bottleneck: the zoo's resnet50) is supported, as in Composer"
            )));
        }
        let method = match settings.str("stochastic_method")?.as_str() {
            "block" => StochasticMethod::Block,
            "sample" => StochasticMethod::Sample,
            other => {
                return Err(Error::config(format!(
                    "`stochastic_method` = {other:?}: use \"block\" or \"sample\""
                )))
            }
        };
        let drop_rate = settings.f64("drop_rate")?;
        if !(0.0..=1.0).contains(&drop_rate) {
            return Err(Error::config(format!(
                "`drop_rate` must be between 0 and 1, got {drop_rate}"
            )));
        }
        let distribution = match settings.str("drop_distribution")?.as_str() {
            "linear" => Distribution::Linear,
            "uniform" => Distribution::Uniform,
            other => {
                return Err(Error::config(format!(
                    "`drop_distribution` = {other:?}: use \"linear\" or \"uniform\""
                )))
            }
        };
        let drop_warmup = parse_warmup(settings)?;
        if method == StochasticMethod::Sample && drop_warmup != 0.0 {
            return Err(Error::config(
                "`drop_warmup` can not be used with `stochastic_method = \"sample\"` (as in Composer)",
            ));
        }
        // One process trains here: every "GPU" draws the same blocks either way.
        let _ = settings.bool("use_same_gpu_seed")?;
        Ok(StochasticDepth {
            method,
            drop_rate,
            distribution,
            drop_warmup,
            shared: Arc::default(),
        })
    }
}

export_plugin!(StochasticDepth);
