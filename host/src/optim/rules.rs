//! The update rules an [`Optimizer`](super::Optimizer) runs (SGD, AdamW, Adam, Lion) with their
//! hyperparameters, how the update is computed, and `[optimizer]` as a whole.

use serde::Serialize;

use super::groups::GroupSpec;

/// SGD hyperparameters, with PyTorch's semantics (`[optimizer] name = "sgd"`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sgd {
    /// Learning rate, > 0 (default 0.1); schedules multiply it.
    pub lr: f64,
    /// Momentum factor, in [0, 1); 0 disables momentum (default 0.9).
    pub momentum: f64,
    /// Nesterov momentum (default false); needs momentum > 0 and dampening 0.
    pub nesterov: bool,
    /// Dampening of the momentum, in [0, 1] (default 0).
    pub dampening: f64,
    /// Weight decay, >= 0 (default 0).
    pub weight_decay: f64,
    /// Decay weights directly instead of through the gradient; scaled by `lr / initial_lr` as
    /// in Composer's `DecoupledSGDW` (default false).
    pub decoupled_weight_decay: bool,
}

impl Default for Sgd {
    fn default() -> Self {
        Sgd {
            lr: 0.1,
            momentum: 0.9,
            nesterov: false,
            dampening: 0.0,
            weight_decay: 0.0,
            decoupled_weight_decay: false,
        }
    }
}

/// AdamW hyperparameters, with PyTorch's `torch.optim.AdamW` semantics
/// (`[optimizer] name = "adamw"`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AdamW {
    /// Learning rate, > 0 (default 0.001); schedules multiply it.
    pub lr: f64,
    /// Exponential decay rates of the first and second moments, each in [0, 1)
    /// (default `[0.9, 0.999]`).
    pub betas: (f64, f64),
    /// Added to the denominator, > 0 (default 1e-8).
    pub eps: f64,
    /// Decoupled weight decay: `p ← p·(1 − lr·wd)`, >= 0 (default 0.01).
    pub weight_decay: f64,
}

impl Default for AdamW {
    fn default() -> Self {
        AdamW {
            lr: 1e-3,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.01,
        }
    }
}

/// Adam hyperparameters, with PyTorch's `torch.optim.Adam` semantics: weight decay is L2
/// regularization added to the gradient (`[optimizer] name = "adam"`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Adam {
    /// Learning rate, > 0 (default 0.001); schedules multiply it.
    pub lr: f64,
    /// Exponential decay rates of the first and second moments, each in [0, 1)
    /// (default `[0.9, 0.999]`).
    pub betas: (f64, f64),
    /// Added to the denominator, > 0 (default 1e-8).
    pub eps: f64,
    /// L2 penalty: `g ← g + wd·p`, >= 0 (default 0).
    pub weight_decay: f64,
}

impl Default for Adam {
    fn default() -> Self {
        Adam {
            lr: 1e-3,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.0,
        }
    }
}

/// Lion hyperparameters (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms", as
/// lucidrains' lion-pytorch; `[optimizer] name = "lion"`): `c = sign(β1·m + (1−β1)·g)`,
/// `p ← p·(1 − lr·wd) − lr·c`, `m ← β2·m + (1−β2)·g`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Lion {
    /// Learning rate, > 0 (default 1e-4: Lion's updates have unit size, so its rate is 3–10×
    /// smaller than AdamW's); schedules multiply it.
    pub lr: f64,
    /// Interpolation of the update and decay rate of the momentum, each in [0, 1)
    /// (default `[0.9, 0.99]`).
    pub betas: (f64, f64),
    /// Decoupled weight decay: `p ← p·(1 − lr·wd)`, >= 0 (default 0).
    pub weight_decay: f64,
}

impl Default for Lion {
    fn default() -> Self {
        Lion {
            lr: 1e-4,
            betas: (0.9, 0.99),
            weight_decay: 0.0,
        }
    }
}

/// The update rule an [`Optimizer`] runs, with its hyperparameters (`[optimizer]`, tagged by
/// `name`; default SGD).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "name")]
pub enum Rule {
    /// Stochastic gradient descent.
    #[serde(rename = "sgd")]
    Sgd(Sgd),
    /// Adam with decoupled weight decay.
    #[serde(rename = "adamw")]
    AdamW(AdamW),
    /// Adam with L2 weight decay.
    #[serde(rename = "adam")]
    Adam(Adam),
    /// Lion (sign of an interpolated momentum).
    #[serde(rename = "lion")]
    Lion(Lion),
}

impl Default for Rule {
    fn default() -> Self {
        Rule::Sgd(Sgd::default())
    }
}

impl Rule {
    /// The base learning rate.
    pub fn lr(&self) -> f64 {
        match self {
            Rule::Sgd(h) => h.lr,
            Rule::AdamW(h) => h.lr,
            Rule::Adam(h) => h.lr,
            Rule::Lion(h) => h.lr,
        }
    }

    /// The base weight decay (the default group's).
    pub fn weight_decay(&self) -> f64 {
        match self {
            Rule::Sgd(h) => h.weight_decay,
            Rule::AdamW(h) => h.weight_decay,
            Rule::Adam(h) => h.weight_decay,
            Rule::Lion(h) => h.weight_decay,
        }
    }

    /// The name as written in `[optimizer] name` and in checkpoints.
    pub fn name(&self) -> &'static str {
        match self {
            Rule::Sgd(_) => "sgd",
            Rule::AdamW(_) => "adamw",
            Rule::Adam(_) => "adam",
            Rule::Lion(_) => "lion",
        }
    }

    /// Whether the rule keeps a step count per parameter (Adam's bias correction).
    pub(super) fn counts_steps(&self) -> bool {
        matches!(self, Rule::Adam(_) | Rule::AdamW(_))
    }

    /// The names of the state buffers kept per parameter.
    pub(super) fn buffer_names(&self) -> &'static [&'static str] {
        match self {
            Rule::Sgd(_) => &["momentum_buffer"],
            Rule::AdamW(_) | Rule::Adam(_) => &["exp_avg", "exp_avg_sq"],
            Rule::Lion(_) => &["exp_avg"],
        }
    }
}

/// How the update is computed (`[optimizer] implementation`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Implementation {
    /// Multi-tensor kernels, one call per group and operation (default): libtorch's fused
    /// SGD, Adam and AdamW; Lion on `_foreach_*` operators.
    #[default]
    Fused,
    /// One parameter at a time with plain tensor operations (the reference).
    PerParam,
}

impl Implementation {
    /// The names written in `implementation = ...`, with their values.
    pub const CHOICES: [(&'static str, Implementation); 2] = [
        ("fused", Implementation::Fused),
        ("per_param", Implementation::PerParam),
    ];
}

/// `[optimizer]`: the update rule, its parameter groups and implementation.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct OptimizerConfig {
    /// The update rule and its base hyperparameters (`name`, `lr`, ...).
    #[serde(flatten)]
    pub rule: Rule,
    /// How the update is computed.
    pub implementation: Implementation,
    /// `[[optimizer.groups]]`, in file order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<GroupSpec>,
}

impl OptimizerConfig {
    /// The base learning rate.
    pub fn lr(&self) -> f64 {
        self.rule.lr()
    }
}

impl From<Rule> for OptimizerConfig {
    fn from(rule: Rule) -> Self {
        OptimizerConfig {
            rule,
            ..OptimizerConfig::default()
        }
    }
}
