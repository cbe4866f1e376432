#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

use gpt_surgery::kinds::{GLU_MLP, GPT2_MLP, RELU_SQUARED_MLP, SURGERY_PRIORITY};
use gpt_surgery::{conv1d, dropout};
use tessera_plugin_api::kit::{walk, OwnTensors, SurgeryModel};
use tessera_plugin_api::tch::Tensor;
use tessera_plugin_api::{
    export_plugin, Context, Error, Event, Hook, Method, Module, ModuleInfo, Plugin, Settings,
};

/// Metric: `relu_squared_gpt2_mlp` blocks in the model after the surgery.
pub const METRIC_REPLACED: &str = "relu_squared/num_replacements";

/// `relu(x)²` (Primer's squared ReLU; modded-nanogpt's `F.relu(x).square()`).
pub fn relu_squared(x: &Tensor) -> Result<Tensor, Error> {
    Ok(x.f_relu()?.f_square()?)
}

/// GPT-2's feed-forward tensors (`Conv1D` layout), shared with the model's store.
#[derive(Debug)]
pub struct MlpWeights {
    /// `c_fc.weight`, `(C, n_inner)`.
    pub c_fc_weight: Tensor,
    /// `c_fc.bias`, `(n_inner)`.
    pub c_fc_bias: Tensor,
    /// `c_proj.weight`, `(n_inner, C)`.
    pub c_proj_weight: Tensor,
    /// `c_proj.bias`, `(C)`.
    pub c_proj_bias: Tensor,
}

impl MlpWeights {
    /// `(C, n_inner)` after checking every shape.
    pub fn sizes(&self) -> Result<(i64, i64), Error> {
        let s = self.c_fc_weight.size();
        let [c, inner] = s[..] else {
            return Err(format!("c_fc.weight has shape {s:?}, expected (n_embd, n_inner)").into());
        };
        for (name, t, want) in [
            ("c_fc.bias", &self.c_fc_bias, vec![inner]),
            ("c_proj.weight", &self.c_proj_weight, vec![inner, c]),
            ("c_proj.bias", &self.c_proj_bias, vec![c]),
        ] {
            if t.size() != want {
                return Err(format!("{name} has shape {:?}, expected {want:?}", t.size()).into());
            }
        }
        Ok((c, inner))
    }

    /// The tensors under their names relative to the module (shallow clones).
    pub fn named(&self) -> Vec<(&'static str, Tensor)> {
        vec![
            ("c_fc.weight", self.c_fc_weight.shallow_clone()),
            ("c_fc.bias", self.c_fc_bias.shallow_clone()),
            ("c_proj.weight", self.c_proj_weight.shallow_clone()),
            ("c_proj.bias", self.c_proj_bias.shallow_clone()),
        ]
    }
}

/// The feed-forward block with squared ReLU:
/// `dropout(relu(x @ c_fc.weight + c_fc.bias)² @ c_proj.weight + c_proj.bias)`, dropout
/// `resid_pdrop` in training: the host's `gpt2_mlp` with `relu(·)²` in place of GELU.
pub fn relu_squared_mlp(
    x: &Tensor,
    w: &MlpWeights,
    resid_pdrop: f64,
    train: bool,
) -> Result<Tensor, Error> {
    let h = relu_squared(&conv1d(x, &w.c_fc_weight, &w.c_fc_bias)?)?;
    let y = conv1d(&h, &w.c_proj_weight, &w.c_proj_bias)?;
    dropout(y, resid_pdrop, train)
}

/// The module that replaces a `gpt2_mlp` (kind [`RELU_SQUARED_MLP`]), over its tensors.
#[derive(Debug)]
pub struct ReluSquaredMlp {
    weights: MlpWeights,
    n_embd: i64,
    n_inner: i64,
    resid_pdrop: f64,
}

impl ReluSquaredMlp {
    /// The module over `weights`; checks their shapes.
    pub fn new(weights: MlpWeights, resid_pdrop: f64) -> Result<ReluSquaredMlp, Error> {
        let (n_embd, n_inner) = weights.sizes()?;
        Ok(ReluSquaredMlp {
            weights,
            n_embd,
            n_inner,
            resid_pdrop,
        })
    }
}

/// The tensors to register under the module's path (the original four, shallow clones).
impl OwnTensors for ReluSquaredMlp {
    fn tensors(&self) -> Vec<(&'static str, Tensor)> {
        self.weights.named()
    }
}

impl Module for ReluSquaredMlp {
    fn kind(&self) -> &str {
        RELU_SQUARED_MLP
    }

    fn attrs(&self) -> Vec<(String, f64)> {
        vec![
            ("n_embd".to_owned(), self.n_embd as f64),
            ("n_inner".to_owned(), self.n_inner as f64),
            ("resid_pdrop".to_owned(), self.resid_pdrop),
        ]
    }

    fn forward(&self, input: &Tensor, train: bool) -> Result<Tensor, Error> {
        match input.size().last() {
            Some(&c) if c == self.n_embd => {}
            _ => {
                return Err(format!(
                    "{RELU_SQUARED_MLP}: expected an input (..., {}), got {:?}",
                    self.n_embd,
                    input.size()
                )
                .into())
            }
        }
        relu_squared_mlp(input, &self.weights, self.resid_pdrop, train)
    }
    // `export`: the default (kept, listed in `tessera.modules`): a squared ReLU is not GPT-2's
    // GELU, so the block does not fold into a plain `gpt2_mlp`. scripts/pytorch_models.py has
    // its PyTorch twin.
}

fn replacement(model: &impl SurgeryModel, m: &ModuleInfo) -> Result<ReluSquaredMlp, Error> {
    let weights = MlpWeights {
        c_fc_weight: model.tensor_of(m, "c_fc.weight")?,
        c_fc_bias: model.tensor_of(m, "c_fc.bias")?,
        c_proj_weight: model.tensor_of(m, "c_proj.weight")?,
        c_proj_bias: model.tensor_of(m, "c_proj.bias")?,
    };
    let resid_pdrop = m.attr("resid_pdrop").unwrap_or(0.0);
    if !(0.0..1.0).contains(&resid_pdrop) {
        return Err(format!("{} `{}`: resid_pdrop = {resid_pdrop}", m.kind, m.path).into());
    }
    ReluSquaredMlp::new(weights, resid_pdrop)
        .map_err(|e| format!("{} `{}`: {}", m.kind, m.path, e.message()).into())
}

/// The surgery: refuses a model with gated linear units' MLPs; every `gpt2_mlp` becomes a
/// [`ReluSquaredMlp`] over the same tensors (trained weights kept, names kept). Returns the
/// replaced paths; a second application changes nothing.
pub fn apply_relu_squared(model: &mut impl SurgeryModel) -> Result<Vec<String>, Error> {
    let modules = model.modules()?;
    if let Some(m) = walk::of_kind(&modules, GLU_MLP).next() {
        return Err(Error::config(format!(
            "relu_squared cannot be combined with gated_linear_units: the model's MLPs are \
             already gated ({GLU_MLP} at `{}`) and relu_squared replaces the {GPT2_MLP} blocks \
             only; for a gated MLP with another activation use gated_linear_units' `act_fn`",
            m.path
        )));
    }
    let mut replaced = Vec::new();
    for m in walk::of_kind(&modules, GPT2_MLP) {
        let module = replacement(model, m)?;
        model.replace(&m.path, module)?;
        replaced.push(m.path.to_string());
    }
    Ok(replaced)
}

/// The squared-ReLU method: surgery at `init`.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReluSquared;

impl Method for ReluSquared {
    fn on_event(&mut self, _event: Event, ctx: &mut Context<'_>) -> Result<(), Error> {
        let replaced = apply_relu_squared(ctx)?;
        let total = ctx
            .modules()?
            .iter()
            .filter(|m| m.kind.as_str() == RELU_SQUARED_MLP)
            .count();
        ctx.log_metric(METRIC_REPLACED, total as f64);
        if total == 0 {
            ctx.warn(&format!(
                "relu_squared: the model has no {GPT2_MLP} block: nothing was replaced"
            ));
        } else {
            ctx.info(&format!(
                "relu_squared: {} {GPT2_MLP} blocks use relu(x)^2 instead of GELU ({total} in \
                 the model)",
                replaced.len()
            ));
        }
        Ok(())
    }
}

impl Plugin for ReluSquared {
    const NAME: &'static str = "relu_squared";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const DESCRIPTION: &'static str =
        "squared ReLU instead of GELU in the GPT-2's MLPs (Primer; surgery at init)";
    const DEFAULT_SETTINGS: &'static str = "";

    fn hooks() -> Vec<Hook> {
        vec![Hook {
            event: Event::INIT,
            priority: SURGERY_PRIORITY,
        }]
    }

    fn create(_settings: &Settings) -> Result<Self, Error> {
        Ok(ReluSquared)
    }
}

export_plugin!(ReluSquared);
