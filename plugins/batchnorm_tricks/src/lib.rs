#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

use tessera_plugin_api::abi::{ParamGroup, ParamInfo};
use tessera_plugin_api::tch;
use tessera_plugin_api::{export_plugin, Context, Error, Event, Hook, Method, Plugin, Settings};

/// The batch norms among `params`, as `(scale, shift)` parameter names: a 1-dimensional
/// parameter `<p>weight` with a buffer `<p>running_mean` (batch norms keep running statistics;
/// layer and group norms do not), and its `<p>bias` when it has one.
pub fn batch_norms(params: &[ParamInfo]) -> Vec<(String, Option<String>)> {
    let has = |name: &str, buffer: bool| {
        params
            .iter()
            .any(|p| p.name.as_str() == name && p.buffer == buffer)
    };
    params
        .iter()
        .filter(|p| !p.buffer && p.shape.len() == 1)
        .filter_map(|p| {
            let prefix = p.name.as_str().strip_suffix("weight")?;
            has(&format!("{prefix}running_mean"), true).then(|| {
                let bias = format!("{prefix}bias");
                (p.name.to_string(), has(&bias, false).then_some(bias))
            })
        })
        .collect()
}

/// The decay that keeps a group's decay step unscaled by its learning-rate multiplier, as
/// airbench's `weight_decay = wd / lr_biases` (the step `lr · multiplier · decay` stays
/// `lr · default_decay`).
pub fn unscaled_decay(default_decay: f64, lr_multiplier: f64) -> f64 {
    if lr_multiplier == 0.0 {
        default_decay
    } else {
        default_decay / lr_multiplier
    }
}

/// The batchnorm_tricks method.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchnormTricks {
    /// Whether the batch norms' scales are set to 1 and frozen.
    pub freeze_scale: bool,
    /// The learning-rate multiplier of the batch-norm biases' parameter group; `None`: the
    /// group is left as configured.
    pub bias_lr_multiplier: Option<f64>,
    /// The name of the parameter group (`[[optimizer.groups]] name`) holding the biases.
    pub group: String,
    /// The group's weight decay; `None`: the default group's divided by the multiplier.
    pub bias_weight_decay: Option<f64>,
    /// The batch norms' biases, found at `init`.
    biases: Vec<String>,
}

impl BatchnormTricks {
    fn init(&mut self, ctx: &mut Context<'_>) -> Result<(), Error> {
        let norms = batch_norms(&ctx.parameters()?);
        if norms.is_empty() {
            return Err(
                "batchnorm_tricks: the model has no batch norm (a 1-dimensional \
                        `*weight` with a `*running_mean` buffer)"
                    .into(),
            );
        }
        if self.freeze_scale {
            for (scale, _) in &norms {
                let t = ctx
                    .parameter(scale)?
                    .ok_or_else(|| format!("the model has no parameter `{scale}`"))?;
                let _ = tch::no_grad(|| t.shallow_clone().f_fill_(1.0))?;
                ctx.set_trainable(scale, false)?;
            }
        }
        self.biases = norms.into_iter().filter_map(|(_, b)| b).collect();
        ctx.info(&format!(
            "batchnorm_tricks: {} batch norm(s){}",
            self.biases.len(),
            if self.freeze_scale {
                ", scales set to 1 and frozen"
            } else {
                ""
            }
        ));
        Ok(())
    }

    fn fit_start(&self, ctx: &mut Context<'_>) -> Result<(), Error> {
        let Some(multiplier) = self.bias_lr_multiplier else {
            return Ok(());
        };
        let groups = ctx.param_groups()?;
        let group = find_group(&groups, &self.group)?;
        let default_decay = groups.last().map_or(0.0, |g| g.weight_decay);
        let strangers: Vec<&str> = group
            .params
            .iter()
            .map(|p| p.as_str())
            .filter(|p| !self.biases.iter().any(|b| b == p))
            .collect();
        if !strangers.is_empty() {
            ctx.warn(&format!(
                "batchnorm_tricks: parameter group `{}` also trains {} parameter(s) that are \
                 not batch-norm biases ({}); they get the ×{multiplier} rate too",
                self.group,
                strangers.len(),
                strangers.join(", ")
            ));
        }
        let decay = self
            .bias_weight_decay
            .unwrap_or_else(|| unscaled_decay(default_decay, multiplier));
        ctx.set_param_group(&self.group, multiplier, decay)?;
        ctx.info(&format!(
            "batchnorm_tricks: group `{}` ({} parameter(s)): learning rate ×{multiplier}, \
             weight decay {decay}",
            self.group,
            group.params.len()
        ));
        Ok(())
    }
}

/// The group named `name`, or an error saying how to define it.
fn find_group<'a>(groups: &'a [ParamGroup], name: &str) -> Result<&'a ParamGroup, Error> {
    groups
        .iter()
        .find(|g| g.name.as_str() == name)
        .ok_or_else(|| {
            let known: Vec<&str> = groups.iter().map(|g| g.name.as_str()).collect();
            Error::config(format!(
                "setting `group`: the optimizer has no parameter group `{name}` (groups: {}); \
                 put the batch-norm biases in one in trainer.toml: `[[optimizer.groups]]` with \
                 `name = \"{name}\"` and `kinds = [\"norm\"]`",
                known.join(", ")
            ))
        })
}

impl Method for BatchnormTricks {
    fn on_event(&mut self, event: Event, ctx: &mut Context<'_>) -> Result<(), Error> {
        match event {
            Event::INIT => self.init(ctx),
            Event::FIT_START => self.fit_start(ctx),
            _ => Ok(()),
        }
    }
}

impl Plugin for BatchnormTricks {
    const NAME: &'static str = "batchnorm_tricks";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const DESCRIPTION: &'static str =
        "batch-norm scales fixed at 1 and frozen; optionally a learning-rate multiplier for the batch-norm biases' parameter group (airbench)";
    const DEFAULT_SETTINGS: &'static str = "freeze_scale = true\ngroup = \"norm\"";

    fn hooks() -> Vec<Hook> {
        vec![Hook::at(Event::INIT), Hook::at(Event::FIT_START)]
    }

    fn create(settings: &Settings) -> Result<Self, Error> {
        let finite = |key: &str, v: Option<f64>| -> Result<Option<f64>, Error> {
            match v {
                Some(x) if !(x.is_finite() && x >= 0.0) => Err(Error::config(format!(
                    "setting `{key}` must be a finite number >= 0, got {x}"
                ))),
                other => Ok(other),
            }
        };
        let bias_lr_multiplier = finite(
            "bias_lr_multiplier",
            settings.get_or("bias_lr_multiplier", None)?,
        )?;
        let bias_weight_decay = finite(
            "bias_weight_decay",
            settings.get_or("bias_weight_decay", None)?,
        )?;
        if bias_weight_decay.is_some() && bias_lr_multiplier.is_none() {
            return Err(Error::config(
                "setting `bias_weight_decay` applies with `bias_lr_multiplier`",
            ));
        }
        Ok(BatchnormTricks {
            freeze_scale: settings.bool("freeze_scale")?,
            bias_lr_multiplier,
            group: settings.str("group")?,
            bias_weight_decay,
            biases: Vec::new(),
        })
    }
}

export_plugin!(BatchnormTricks);
