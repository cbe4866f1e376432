#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

use tessera_plugin_api::device::upload;
use tessera_plugin_api::kit::StateReader;
use tessera_plugin_api::tch::{self, Kind, TchError, Tensor};
use tessera_plugin_api::{
    export_plugin, Context, Error, Event, Hook, Method, Plugin, Settings, State,
};

/// The method's priority at `after_train_batch`: very low, so that it runs after every other
/// method there (gradient clipping included), as Composer's `SAMOptimizer` acts inside
/// `optimizer.step`, after the closure's `AFTER_TRAIN_BATCH` has fired.
pub const PRIORITY: i32 = -1000;

/// Version of the checkpointed state layout ([`Method::state`]).
const STATE_FORMAT: u32 = 1;

/// Whether optimizer step `step` (counted from 0) is a SAM step: `(step + 1) % interval == 0`,
/// Composer's `SAMOptimizer` test on its `global_step`. `interval` must be at least 1.
pub fn is_sam_step(step: u64, interval: u64) -> bool {
    interval > 0 && (step + 1).is_multiple_of(interval)
}

/// The global L2 norm of `grads`: the 2-norm of the vector of each gradient's 2-norm, as
/// Composer's `_grad_norm` (`torch.norm(torch.stack([g.norm(2) ...]))`). A float scalar on the
/// first gradient's device; `None` when `grads` is empty.
pub fn global_grad_norm(grads: &[Tensor]) -> Result<Option<Tensor>, TchError> {
    if grads.is_empty() {
        return Ok(None);
    }
    let device = grads[0].device();
    let norms = grads
        .iter()
        .map(|g| upload(&g.f_norm()?.f_to_kind(Kind::Float)?, device))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some(Tensor::f_stack(&norms, 0)?.f_norm()?))
}

/// The SAM ascent step for each gradient of `grads`:
/// `e = g · (rho / (‖grads‖₂ + epsilon))`, the norm global over all of them
/// ([`global_grad_norm`]); each `e` has its gradient's dtype and device. Returns the
/// perturbations (in the order of `grads`) and the global norm; nothing for no gradients.
pub fn sam_perturbation_with_norm(
    grads: &[Tensor],
    rho: f64,
    epsilon: f64,
) -> Result<Option<(Vec<Tensor>, Tensor)>, TchError> {
    let Some(norm) = global_grad_norm(grads)? else {
        return Ok(None);
    };
    // Composer: `rho / (grad_norm + epsilon)`, i.e. PyTorch's `reciprocal() * rho`.
    let scale = norm
        .f_add_scalar(epsilon)?
        .f_reciprocal()?
        .f_mul_scalar(rho)?;
    let perturbations = grads
        .iter()
        .map(|g| g.f_mul(&upload(&scale.f_to_kind(g.kind())?, g.device())?))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some((perturbations, norm)))
}

/// The SAM ascent step `e(w)` for each gradient of `grads` (see
/// [`sam_perturbation_with_norm`]); empty for no gradients.
pub fn sam_perturbation(grads: &[Tensor], rho: f64, epsilon: f64) -> Result<Vec<Tensor>, TchError> {
    Ok(sam_perturbation_with_norm(grads, rho, epsilon)?
        .map(|(e, _)| e)
        .unwrap_or_default())
}

/// Adds `alpha · delta` to `param` in place, outside autograd (`p.add_(e)` / `p.sub_(e)`).
pub fn shift_in_place(param: &mut Tensor, delta: &Tensor, alpha: f64) -> Result<(), TchError> {
    tch::no_grad(|| {
        if alpha == 1.0 {
            param.f_add_(delta).map(|_| ())
        } else if alpha == -1.0 {
            param.f_sub_(delta).map(|_| ())
        } else {
            param.f_add_(&delta.f_mul_scalar(alpha)?).map(|_| ())
        }
    })
}

/// The SAM method.
pub struct Sam {
    rho: f64,
    epsilon: f64,
    interval: u64,
    /// Log `sam/grad_norm` at every SAM step (a read on the host each time; default false).
    log_grad_norm: bool,
    /// Optimizer steps seen so far (Composer's `global_step`), checkpointed.
    global_step: u64,
    /// The perturbation currently added to the weights, by parameter name, between the two
    /// passes of a SAM step.
    perturbation: Option<Vec<(String, Tensor)>>,
}

impl Sam {
    /// Takes the stored perturbation back off the weights: `w ← (w + e) − e`.
    fn restore(&mut self, ctx: &mut Context<'_>) -> Result<bool, Error> {
        let Some(perturbation) = self.perturbation.take() else {
            return Ok(false);
        };
        for (name, e) in &perturbation {
            let mut p = ctx
                .parameter(name)?
                .ok_or_else(|| format!("sam: parameter `{name}` left the model mid-step"))?;
            shift_in_place(&mut p, e, -1.0)?;
        }
        Ok(true)
    }

    /// First pass of a SAM step: `w ← w + e(w)`, remember `e(w)`, ask for a second pass.
    fn perturb(&mut self, ctx: &mut Context<'_>) -> Result<(), Error> {
        let mut params = Vec::new();
        let mut grads = Vec::new();
        for info in ctx.parameters()? {
            if info.buffer || !info.trainable {
                continue;
            }
            let name = info.name.as_str();
            let Some(p) = ctx.parameter(name)? else {
                continue;
            };
            let g = p.grad();
            if !g.defined() {
                continue;
            }
            params.push((name.to_owned(), p));
            grads.push(g);
        }
        let Some((perturbations, norm)) =
            sam_perturbation_with_norm(&grads, self.rho, self.epsilon)?
        else {
            ctx.warn("sam: no parameter has a gradient; this step is a plain step");
            return Ok(());
        };
        let mut stored = Vec::with_capacity(params.len());
        for ((name, mut p), e) in params.into_iter().zip(perturbations) {
            shift_in_place(&mut p, &e, 1.0)?;
            stored.push((name, e));
        }
        self.perturbation = Some(stored);
        if self.log_grad_norm {
            // The one read on the host SAM makes, and only when asked for.
            ctx.log_metric("sam/grad_norm", norm.f_double_value(&[])?);
        }
        ctx.request_extra_pass()
    }
}

impl Method for Sam {
    fn on_event(&mut self, event: Event, ctx: &mut Context<'_>) -> Result<(), Error> {
        if event != Event::AFTER_TRAIN_BATCH {
            return Ok(());
        }
        let pass = ctx.pass_index()?;
        ctx.log_metric("sam/pass", f64::from(pass));
        if pass > 0 {
            // The second pass of our SAM step (or an extra pass another method asked for, when
            // nothing is stored): back to `w` before the optimizer steps.
            self.restore(ctx)?;
            return Ok(());
        }
        if self.restore(ctx)? {
            ctx.warn("sam: the second pass of the last SAM step never came; weights restored");
        }
        let sam = is_sam_step(self.global_step, self.interval);
        self.global_step += 1;
        if sam {
            self.perturb(ctx)?;
        }
        Ok(())
    }

    fn state(&self) -> Result<State, Error> {
        Ok(State {
            format_version: STATE_FORMAT,
            bytes: self.global_step.to_le_bytes().to_vec(),
            tensors: Vec::new(),
        })
    }

    fn load_state(&mut self, state: State) -> Result<(), Error> {
        let reader = StateReader::open("sam", state, STATE_FORMAT)?;
        self.global_step = reader.u64()?;
        reader.finish()?;
        self.perturbation = None;
        Ok(())
    }
}

impl Plugin for Sam {
    const NAME: &'static str = "sam";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const DESCRIPTION: &'static str =
        "sharpness-aware minimization: steps with the gradient at w + rho·g/‖g‖ (two passes)";
    const DEFAULT_SETTINGS: &'static str =
        "rho = 0.05\nepsilon = 1e-12\ninterval = 1\nlog_grad_norm = false";

    fn hooks() -> Vec<Hook> {
        vec![Hook {
            event: Event::AFTER_TRAIN_BATCH,
            priority: PRIORITY,
        }]
    }

    fn create(settings: &Settings) -> Result<Self, Error> {
        let rho = settings.f64("rho")?;
        let epsilon = settings.f64("epsilon")?;
        let interval = settings.u64("interval")?;
        let log_grad_norm = settings.bool("log_grad_norm")?;
        if !(rho.is_finite() && rho >= 0.0) {
            return Err(Error::config(format!(
                "`rho` must be a finite number >= 0, got {rho}"
            )));
        }
        if !(epsilon.is_finite() && epsilon >= 0.0) {
            return Err(Error::config(format!(
                "`epsilon` must be a finite number >= 0, got {epsilon}"
            )));
        }
        if interval == 0 {
            return Err(Error::config("`interval` must be at least 1, got 0"));
        }
        Ok(Sam {
            rho,
            epsilon,
            interval,
            log_grad_norm,
            global_step: 0,
            perturbation: None,
        })
    }
}

export_plugin!(Sam);
