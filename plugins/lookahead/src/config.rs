//! The settings: the variant, the period `k`, the variant's own rate (`alpha`, or airbench's
//! `decay_base` and `decay_power`), which tensors, and the end of training.

use serde_json::Value;
use tessera_plugin_api::{Error, Settings};

/// Which update the method makes every `k` steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// Zhang et al.'s Lookahead: `φ ← φ + α(θ − φ); θ ← φ` with a constant `α`.
    Lookahead,
    /// airbench's EMA written back into the weights: `φ ← lerp(φ, θ, 1 − d(t)); θ ← φ` with
    /// `d(t) = decay_base^k · (t / T)^decay_power`.
    Ema,
}

impl Variant {
    /// The name in `trainer.toml`.
    pub fn name(self) -> &'static str {
        match self {
            Variant::Lookahead => "lookahead",
            Variant::Ema => "ema",
        }
    }
}

/// The method's resolved settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LookaheadConfig {
    /// The update.
    pub variant: Variant,
    /// Steps between two updates (Lookahead's `k`; airbench updates every 5).
    pub k: u64,
    /// Lookahead's slow-weights step size `α`, in `(0, 1]` (unused by [`Variant::Ema`]).
    pub alpha: f64,
    /// airbench's per-step decay base (`0.95`); the decay at step `t` is
    /// `decay_base^k · (t / T)^decay_power` (unused by [`Variant::Lookahead`]).
    pub decay_base: f64,
    /// airbench's exponent of the run fraction (`3`).
    pub decay_power: f64,
    /// Whether floating-point buffers (batch-norm running statistics) are updated too.
    pub buffers: bool,
    /// Whether the slow weights are written into the model at the end of training (`T`, or
    /// `fit_end` if the run stops earlier), after which the method stops.
    pub final_copy: bool,
    /// `T`: the step at which training ends for the method (and airbench's schedule reaches
    /// its end); `None`: the run's length in batches as the host reports it.
    pub total_steps: Option<u64>,
}

impl Default for LookaheadConfig {
    /// Lookahead with the paper's defaults `k = 5`, `α = 0.5`, parameters only.
    fn default() -> Self {
        LookaheadConfig {
            variant: Variant::Lookahead,
            k: 5,
            alpha: 0.5,
            decay_base: 0.95,
            decay_power: 3.0,
            buffers: false,
            final_copy: true,
            total_steps: None,
        }
    }
}

/// A setting's value, `None` when absent (or `null`).
fn given(settings: &Settings, key: &str) -> Result<Option<Value>, Error> {
    Ok(match settings.get_or::<Value>(key, Value::Null)? {
        Value::Null => None,
        v => Some(v),
    })
}

fn number(key: &str, v: &Value) -> Result<f64, Error> {
    v.as_f64()
        .ok_or_else(|| Error::config(format!("setting `{key}` must be a number, got {v}")))
}

fn positive_integer(key: &str, v: &Value) -> Result<u64, Error> {
    match v.as_u64() {
        Some(n) if n > 0 => Ok(n),
        _ => Err(Error::config(format!(
            "setting `{key}` must be a whole number ≥ 1, got {v}"
        ))),
    }
}

impl LookaheadConfig {
    /// Reads the settings. A key of the other variant (`alpha` with `variant = "ema"`,
    /// `decay_base` or `decay_power` with `"lookahead"`), a value out of range, an unknown
    /// variant or (through the host) an unknown key is an error naming the setting.
    pub fn from_settings(settings: &Settings) -> Result<LookaheadConfig, Error> {
        let d = LookaheadConfig::default();
        let variant = match settings.str("variant")?.as_str() {
            "lookahead" => Variant::Lookahead,
            "ema" | "airbench" => Variant::Ema,
            other => {
                return Err(Error::config(format!(
                    "setting `variant` must be \"lookahead\" or \"ema\" (airbench's), got {other:?}"
                )))
            }
        };
        let k = match given(settings, "k")? {
            Some(v) => positive_integer("k", &v)?,
            None => d.k,
        };
        let alpha = given(settings, "alpha")?;
        let decay_base = given(settings, "decay_base")?;
        let decay_power = given(settings, "decay_power")?;
        let only = |key: &str, v: &Option<Value>, variant_needed: Variant| {
            if v.is_some() && variant != variant_needed {
                return Err(Error::config(format!(
                    "setting `{key}` applies only to variant = \"{}\" (this is variant = \"{}\")",
                    variant_needed.name(),
                    variant.name()
                )));
            }
            Ok(())
        };
        only("alpha", &alpha, Variant::Lookahead)?;
        only("decay_base", &decay_base, Variant::Ema)?;
        only("decay_power", &decay_power, Variant::Ema)?;
        let alpha = match alpha {
            Some(v) => number("alpha", &v)?,
            None => d.alpha,
        };
        if !(alpha > 0.0 && alpha <= 1.0) {
            return Err(Error::config(format!(
                "setting `alpha` must be in (0, 1], got {alpha}"
            )));
        }
        let decay_base = match decay_base {
            Some(v) => number("decay_base", &v)?,
            None => d.decay_base,
        };
        if !(decay_base > 0.0 && decay_base <= 1.0) {
            return Err(Error::config(format!(
                "setting `decay_base` must be in (0, 1], got {decay_base}"
            )));
        }
        let decay_power = match decay_power {
            Some(v) => number("decay_power", &v)?,
            None => d.decay_power,
        };
        if !(decay_power >= 0.0 && decay_power.is_finite()) {
            return Err(Error::config(format!(
                "setting `decay_power` must be a finite number ≥ 0, got {decay_power}"
            )));
        }
        // airbench averages the whole state_dict (its float buffers included); Lookahead
        // optimizers hold the parameters only.
        let buffers = settings.bool_or("buffers", variant == Variant::Ema)?;
        let final_copy = settings.bool_or("final_copy", d.final_copy)?;
        let total_steps = match given(settings, "total_steps")? {
            Some(v) => Some(positive_integer("total_steps", &v)?),
            None => None,
        };
        Ok(LookaheadConfig {
            variant,
            k,
            alpha,
            decay_base,
            decay_power,
            buffers,
            final_copy,
            total_steps,
        })
    }

    /// Whether step `t` (1-based: the count of completed steps at `batch_end`) ends an inner
    /// loop.
    pub fn sync_due(&self, t: u64) -> bool {
        t > 0 && t.is_multiple_of(self.k)
    }

    /// The interpolation weight `w` of the update at step `t` of `total`
    /// (`φ ← φ + w(θ − φ)`): `α`, or `1 − d(t)` for airbench's variant.
    pub fn weight(&self, t: u64, total: u64) -> f64 {
        match self.variant {
            Variant::Lookahead => self.alpha,
            Variant::Ema => 1.0 - self.decay(t, total),
        }
    }

    /// The share of the slow weights kept at step `t` of `total`, `1 − w`: airbench's decay
    /// ([`airbench_decay`]), or `1 − α` for Lookahead.
    pub fn decay(&self, t: u64, total: u64) -> f64 {
        match self.variant {
            Variant::Lookahead => 1.0 - self.alpha,
            Variant::Ema => airbench_decay(self.decay_base, self.k, self.decay_power, t, total),
        }
    }
}

/// airbench's `alpha_schedule[t]`, `base**every * (torch.arange(T + 1) / T)**power` read with
/// `.item()`, computed as PyTorch computes it: the fraction `t / T` in float32, raised to the
/// power in float32 (PyTorch multiplies for the powers 2 and 3, takes the square root for 0.5;
/// other powers go through `powf`, which may differ from PyTorch's vectorised `pow` in the last
/// bit), multiplied by `base^every` rounded to float32, and widened to a double. `total` must
/// be positive.
pub fn airbench_decay(base: f64, every: u64, power: f64, t: u64, total: u64) -> f64 {
    let scale = base.powf(every as f64) as f32;
    let x = t as f32 / total.max(1) as f32;
    let p = if power == 0.0 {
        1.0
    } else if power == 1.0 {
        x
    } else if power == 2.0 {
        x * x
    } else if power == 3.0 {
        x * x * x
    } else if power == 0.5 {
        x.sqrt()
    } else {
        x.powf(power as f32)
    };
    f64::from(p * scale)
}
