//! Steps in a CUDA graph (`train.cuda_graphs`): the learning rates kept on the device, what
//! a step needs to exist before it is captured, and why a configuration cannot be.

use tch::{TchError, Tensor};

use super::{Implementation, Optimizer, Rule};

impl Optimizer {
    /// Keeps the learning rates on `device` from now on (see [`Optimizer::stage_lr`]): the
    /// fused SGD, Adam and AdamW kernels read them there. The arithmetic is the same (the
    /// kernels round the rate to float32 either way).
    pub fn keep_lr_on_device(&mut self, device: tch::Device) -> Result<(), TchError> {
        let rates = (0..self.hyper.len())
            .map(|_| Tensor::f_zeros([] as [i64; 0], (tch::Kind::Float, device)))
            .collect::<Result<Vec<_>, _>>()?;
        self.device_lr = Some(rates);
        self.lr_staged = false;
        Ok(())
    }

    /// Writes the next step's rates into the device rates (a fill on the device, not a
    /// copy from the host); the next [`Optimizer::step_masked`] uses them as they are. Called
    /// before a captured step is replayed, whose fills would otherwise be the captured ones.
    pub fn stage_lr(&mut self) -> Result<(), TchError> {
        let lr = self.lr();
        if let Some(rates) = &self.device_lr {
            for (rate, h) in rates.iter().zip(&self.hyper) {
                let _ = rate.shallow_clone().f_fill_(lr * h.lr_multiplier)?;
            }
        }
        self.lr_staged = true;
        Ok(())
    }

    /// Makes the optimizer ready for its step to be captured in a CUDA graph and replayed:
    /// every piece of state the step writes exists already (so that the graph updates it in
    /// place), and the rates are on the device. Fails naming what cannot be captured: the
    /// `per_param` implementation, Lion (its masking and rate are host numbers of each call),
    /// Composer's decoupled SGD (its decay factor is), a momentum buffer not made yet.
    pub fn prepare_capture(&mut self) -> Result<(), String> {
        self.capturable()?;
        let device = self.slots.first().map(|s| s.param.device());
        let Some(device) = device else {
            return Err("the optimizer trains no parameter".into());
        };
        let error = |e: TchError| e.to_string();
        if self.device_lr.is_none() {
            self.keep_lr_on_device(device).map_err(error)?;
        }
        if self.skipped.is_none() {
            self.skipped =
                Some(Tensor::f_zeros([] as [i64; 0], (tch::Kind::Double, device)).map_err(error)?);
        }
        let buffers = self.algorithm.buffer_names().len();
        let counts = self.algorithm.counts_steps();
        for slot in &mut self.slots {
            match &self.algorithm {
                Rule::Sgd(s) if s.momentum != 0.0 && slot.state.is_empty() => {
                    return Err(format!(
                        "`{}` has no momentum buffer yet (it had no gradient in the steps \
                         before the capture)",
                        slot.name
                    ))
                }
                Rule::Sgd(_) => {}
                _ => slot.ensure_state(buffers, counts).map_err(error)?,
            }
        }
        Ok(())
    }

    /// Why this optimizer's step cannot be captured in a CUDA graph, naming the setting; `Ok`
    /// when it can (see [`Optimizer::prepare_capture`]).
    pub fn capturable(&self) -> Result<(), String> {
        if self.implementation != Implementation::Fused {
            return Err(
                "optimizer.implementation = \"per_param\" steps one parameter at a \
                        time with host numbers; use \"fused\""
                    .into(),
            );
        }
        match &self.algorithm {
            Rule::Lion(_) => {
                return Err(
                    "optimizer.name = \"lion\" has no fused kernel that reads its rate \
                            on the device; use sgd, adam or adamw"
                        .into(),
                )
            }
            Rule::Sgd(s) if s.decoupled_weight_decay && self.rule_decays() => {
                return Err(
                    "optimizer.decoupled_weight_decay = true scales the decay by a host \
                            number each step; leave it false"
                        .into(),
                )
            }
            _ => {}
        }
        Ok(())
    }

    /// Counts a step that a replayed CUDA graph took (its kernels updated parameters, state and
    /// the device counters; the host's bookkeeping is this).
    pub fn replayed_step(&mut self) {
        self.lr_scale = 1.0;
        self.steps += 1;
        self.lr_staged = false;
    }

    /// Whether any group decays its weights.
    fn rule_decays(&self) -> bool {
        self.hyper.iter().any(|h| h.weight_decay != 0.0)
    }
}
