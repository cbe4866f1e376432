#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

use tessera_plugin_api::kit::{default_init, walk, OwnTensors, SurgeryModel};
use tessera_plugin_api::tch::{Device, Kind, Tensor};
use tessera_plugin_api::{
    export_plugin, Context, Error, ErrorKind, Event, Hook, Method, Module, ModuleInfo, Plugin,
    Settings,
};

/// Module kind of the host's GPT-2 MLP.
pub const GPT2_MLP: &str = "gpt2_mlp";
/// Module kind of the gated MLP the surgery puts in.
pub const GLU_MLP: &str = "glu_gpt2_mlp";
/// Module kind of the host's BERT feed-forward input projection (`BertIntermediate`).
pub const BERT_INTERMEDIATE: &str = "bert_intermediate";
/// Module kind of the host's BERT feed-forward output (`BertOutput`, input `cat[h, residual]`).
pub const BERT_OUTPUT: &str = "bert_output";
/// Module kind of Composer's `BERTGatedFFOutput`, which replaces a `bert_output`.
pub const GLU_BERT_OUTPUT: &str = "glu_bert_output";
/// Module kind of the identity that replaces a `bert_intermediate` (Composer's `nn.Identity`).
pub const IDENTITY: &str = "identity";
/// Metric: gated MLPs in the model after the surgery.
pub const METRIC_REPLACED: &str = "gated_linear_units/num_replacements";

/// The activation of the gated branch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// Exact GELU, `x·Φ(x)` (Hugging Face `gelu`, BERT's).
    Gelu,
    /// Tanh-approximated GELU (Hugging Face `gelu_new`, GPT-2's).
    GeluNew,
    /// `max(x, 0)`.
    Relu,
    /// `x·σ(x)` (`silu`, `swish`).
    Silu,
    /// `σ(x)`.
    Sigmoid,
    /// `tanh(x)`.
    Tanh,
}

impl Activation {
    /// Every activation, in the order of [`Activation::code`].
    pub const ALL: [Activation; 6] = [
        Activation::Gelu,
        Activation::GeluNew,
        Activation::Relu,
        Activation::Silu,
        Activation::Sigmoid,
        Activation::Tanh,
    ];

    /// Hugging Face's name (`ACT2FN` key).
    pub fn name(self) -> &'static str {
        match self {
            Activation::Gelu => "gelu",
            Activation::GeluNew => "gelu_new",
            Activation::Relu => "relu",
            Activation::Silu => "silu",
            Activation::Sigmoid => "sigmoid",
            Activation::Tanh => "tanh",
        }
    }

    /// The activation named `name` (a Hugging Face `ACT2FN` key; `swish` is `silu`,
    /// `gelu_pytorch_tanh` is `gelu_new`).
    pub fn parse(name: &str) -> Option<Activation> {
        match name {
            "swish" => Some(Activation::Silu),
            "gelu_pytorch_tanh" => Some(Activation::GeluNew),
            _ => Activation::ALL.into_iter().find(|a| a.name() == name),
        }
    }

    /// Its index in [`Activation::ALL`]: the `act_fn` attribute of the module (attributes are
    /// numbers) in the export's `tessera.modules` metadata.
    pub fn code(self) -> usize {
        Activation::ALL
            .iter()
            .position(|a| *a == self)
            .unwrap_or_default()
    }

    /// Applies the activation.
    pub fn apply(self, x: &Tensor) -> Result<Tensor, Error> {
        Ok(match self {
            Activation::Gelu => x.f_gelu("none")?,
            Activation::GeluNew => x.f_gelu("tanh")?,
            Activation::Relu => x.f_relu()?,
            Activation::Silu => x.f_silu()?,
            Activation::Sigmoid => x.f_sigmoid()?,
            Activation::Tanh => x.f_tanh()?,
        })
    }
}

/// The gated feed-forward's tensors, in PyTorch `Linear` layout (`(out, in)`, `y = x Wᵀ + b`)
/// and under Composer's names (`gated_layer`, `non_gated_layer`, `wo`).
#[derive(Debug)]
pub struct GluWeights {
    /// `gated_layer.weight`, `(d_ff, d)`.
    pub gated_weight: Tensor,
    /// `gated_layer.bias`, `(d_ff)`, when `gated_layer_bias`.
    pub gated_bias: Option<Tensor>,
    /// `non_gated_layer.weight`, `(d_ff, d)`.
    pub non_gated_weight: Tensor,
    /// `non_gated_layer.bias`, `(d_ff)`, when `non_gated_layer_bias`.
    pub non_gated_bias: Option<Tensor>,
    /// `wo.weight`, `(d, d_ff)`.
    pub wo_weight: Tensor,
    /// `wo.bias`, `(d)`.
    pub wo_bias: Tensor,
}

impl GluWeights {
    /// The tensors under Composer's names, relative to the module (shallow clones).
    pub fn named(&self) -> Vec<(&'static str, Tensor)> {
        let mut out = vec![("gated_layer.weight", self.gated_weight.shallow_clone())];
        if let Some(b) = &self.gated_bias {
            out.push(("gated_layer.bias", b.shallow_clone()));
        }
        out.push((
            "non_gated_layer.weight",
            self.non_gated_weight.shallow_clone(),
        ));
        if let Some(b) = &self.non_gated_bias {
            out.push(("non_gated_layer.bias", b.shallow_clone()));
        }
        out.push(("wo.weight", self.wo_weight.shallow_clone()));
        out.push(("wo.bias", self.wo_bias.shallow_clone()));
        out
    }

    /// `(d, d_ff)` after checking every shape.
    pub fn sizes(&self) -> Result<(i64, i64), Error> {
        let s = self.gated_weight.size();
        let [d_ff, d] = s[..] else {
            return Err(format!("gated_layer.weight has shape {s:?}, expected (d_ff, d)").into());
        };
        let checks = [
            (
                "non_gated_layer.weight",
                Some(&self.non_gated_weight),
                vec![d_ff, d],
            ),
            ("gated_layer.bias", self.gated_bias.as_ref(), vec![d_ff]),
            (
                "non_gated_layer.bias",
                self.non_gated_bias.as_ref(),
                vec![d_ff],
            ),
            ("wo.weight", Some(&self.wo_weight), vec![d, d_ff]),
            ("wo.bias", Some(&self.wo_bias), vec![d]),
        ];
        for (what, t, want) in checks {
            if let Some(t) = t {
                if t.size() != want {
                    return Err(
                        format!("{what} has shape {:?}, expected {want:?}", t.size()).into(),
                    );
                }
            }
        }
        Ok((d, d_ff))
    }
}

fn linear(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor, Error> {
    Ok(x.f_linear(w, b)?)
}

/// The gate: `act(x W_gᵀ [+ b_g]) ⊙ (x W_ngᵀ [+ b_ng])`, `(..., d_ff)`.
pub fn glu_hidden(x: &Tensor, w: &GluWeights, act: Activation) -> Result<Tensor, Error> {
    let gated = act.apply(&linear(x, &w.gated_weight, w.gated_bias.as_ref())?)?;
    let non_gated = linear(x, &w.non_gated_weight, w.non_gated_bias.as_ref())?;
    Ok(gated.f_mul(&non_gated)?)
}

/// Composer's `BERTGatedFFOutput.forward(h, residual)`:
/// `LayerNorm(wo(dropout(act(W_g h) ⊙ W_ng h)) + residual)` with the block's LayerNorm
/// `(weight, bias, eps)`; dropout `p` in training only.
pub fn bert_glu_output(
    h: &Tensor,
    residual: &Tensor,
    w: &GluWeights,
    act: Activation,
    layer_norm: (&Tensor, &Tensor, f64),
    dropout: f64,
    train: bool,
) -> Result<Tensor, Error> {
    let (d, _) = w.sizes()?;
    let hidden = glu_hidden(h, w, act)?.f_dropout(dropout, train && dropout > 0.0)?;
    let out = linear(&hidden, &w.wo_weight, Some(&w.wo_bias))?.f_add(residual)?;
    Ok(out.f_layer_norm(
        [d],
        Some(layer_norm.0),
        Some(layer_norm.1),
        layer_norm.2,
        false,
    )?)
}

/// HF BERT's feed-forward after `apply_gated_linear_units`: `BertIntermediate` is the identity,
/// so `BERTGatedFFOutput` gets the attention output `h` as both its input and its residual:
/// [`bert_glu_output`]`(h, h, ...)`.
pub fn bert_glu_block(
    h: &Tensor,
    w: &GluWeights,
    act: Activation,
    layer_norm: (&Tensor, &Tensor, f64),
    dropout: f64,
    train: bool,
) -> Result<Tensor, Error> {
    bert_glu_output(h, h, w, act, layer_norm, dropout, train)
}

/// The GLU feed-forward in GPT-2's place (pre-LN, the residual outside the MLP):
/// `dropout(wo(act(W_g x [+ b_g]) ⊙ (W_ng x [+ b_ng])))` with `wo`'s bias, dropout
/// `resid_pdrop` (in training only) where GPT-2's MLP has it, after the output projection.
pub fn gpt2_glu_mlp(
    x: &Tensor,
    w: &GluWeights,
    act: Activation,
    resid_pdrop: f64,
    train: bool,
) -> Result<Tensor, Error> {
    w.sizes()?;
    let out = linear(&glu_hidden(x, w, act)?, &w.wo_weight, Some(&w.wo_bias))?;
    Ok(out.f_dropout(resid_pdrop, train && resid_pdrop > 0.0)?)
}

/// The gated MLP module that replaces a `gpt2_mlp`.
#[derive(Debug)]
pub struct GluMlp {
    weights: GluWeights,
    act: Activation,
    resid_pdrop: f64,
}

impl GluMlp {
    /// The module over `weights`; checks their shapes.
    pub fn new(weights: GluWeights, act: Activation, resid_pdrop: f64) -> Result<GluMlp, Error> {
        weights.sizes()?;
        Ok(GluMlp {
            weights,
            act,
            resid_pdrop,
        })
    }

    /// Its activation.
    pub fn activation(&self) -> Activation {
        self.act
    }
}

/// Its tensors (see [`GluWeights::named`]).
impl OwnTensors for GluMlp {
    fn tensors(&self) -> Vec<(&'static str, Tensor)> {
        self.weights.named()
    }
}

impl Module for GluMlp {
    fn kind(&self) -> &str {
        GLU_MLP
    }

    fn attrs(&self) -> Vec<(String, f64)> {
        let (d, d_ff) = self.weights.sizes().unwrap_or((0, 0));
        vec![
            ("n_embd".to_owned(), d as f64),
            ("n_inner".to_owned(), d_ff as f64),
            ("act_fn".to_owned(), self.act.code() as f64),
            (
                "gated_layer_bias".to_owned(),
                f64::from(u8::from(self.weights.gated_bias.is_some())),
            ),
            (
                "non_gated_layer_bias".to_owned(),
                f64::from(u8::from(self.weights.non_gated_bias.is_some())),
            ),
            ("resid_pdrop".to_owned(), self.resid_pdrop),
        ]
    }

    fn forward(&self, input: &Tensor, train: bool) -> Result<Tensor, Error> {
        gpt2_glu_mlp(input, &self.weights, self.act, self.resid_pdrop, train)
    }
    // `export`: the default (kept, listed in `tessera.modules`): a gated MLP does not fold into
    // GPT-2's two-matrix MLP.
}

/// Composer's `BERTGatedFFOutput` in the place of the host's `bert_output`: its input is
/// `cat[h, residual]` (last dimension, the residual the last `d` features), its output
/// [`bert_glu_output`]. Tensors: the [`GluWeights`] and `layernorm.weight`, `layernorm.bias`.
#[derive(Debug)]
pub struct BertGluOutput {
    weights: GluWeights,
    layernorm_weight: Tensor,
    layernorm_bias: Tensor,
    eps: f64,
    act: Activation,
    dropout: f64,
}

impl BertGluOutput {
    /// The module over `weights` and a fresh LayerNorm (ones, zeros) of epsilon `eps`; checks
    /// the shapes.
    pub fn new(
        weights: GluWeights,
        act: Activation,
        eps: f64,
        dropout: f64,
    ) -> Result<BertGluOutput, Error> {
        let (d, _) = weights.sizes()?;
        let w = &weights.wo_weight;
        let options = (w.kind(), w.device());
        Ok(BertGluOutput {
            layernorm_weight: Tensor::f_ones([d], options)?.set_requires_grad(true),
            layernorm_bias: Tensor::f_zeros([d], options)?.set_requires_grad(true),
            weights,
            eps,
            act,
            dropout,
        })
    }

    /// Its activation.
    pub fn activation(&self) -> Activation {
        self.act
    }
}

/// Its tensors (see [`GluWeights::named`]), then `layernorm.weight`, `layernorm.bias`.
impl OwnTensors for BertGluOutput {
    fn tensors(&self) -> Vec<(&'static str, Tensor)> {
        let mut out = self.weights.named();
        out.push(("layernorm.weight", self.layernorm_weight.shallow_clone()));
        out.push(("layernorm.bias", self.layernorm_bias.shallow_clone()));
        out
    }
}

impl Module for BertGluOutput {
    fn kind(&self) -> &str {
        GLU_BERT_OUTPUT
    }

    fn attrs(&self) -> Vec<(String, f64)> {
        let (d, d_ff) = self.weights.sizes().unwrap_or((0, 0));
        vec![
            ("d_embed".to_owned(), d as f64),
            ("d_ff".to_owned(), d_ff as f64),
            ("act_fn".to_owned(), self.act.code() as f64),
            (
                "gated_layer_bias".to_owned(),
                f64::from(u8::from(self.weights.gated_bias.is_some())),
            ),
            (
                "non_gated_layer_bias".to_owned(),
                f64::from(u8::from(self.weights.non_gated_bias.is_some())),
            ),
            ("dropout".to_owned(), self.dropout),
            ("layernorm_eps".to_owned(), self.eps),
        ]
    }

    fn forward(&self, input: &Tensor, train: bool) -> Result<Tensor, Error> {
        let (d, _) = self.weights.sizes()?;
        let width = input.size().last().copied().unwrap_or(0);
        if input.dim() != 3 || width <= d {
            return Err(format!(
                "{GLU_BERT_OUTPUT}: expected an input (batch, tokens, features + {d}) holding \
                 [h, residual], got {:?}",
                input.size()
            )
            .into());
        }
        let h = input.f_narrow(2, 0, width - d)?;
        let residual = input.f_narrow(2, width - d, d)?;
        bert_glu_output(
            &h,
            &residual,
            &self.weights,
            self.act,
            (&self.layernorm_weight, &self.layernorm_bias, self.eps),
            self.dropout,
            train,
        )
    }
}

/// The identity (Composer's `nn.Identity` in the place of `BertIntermediate`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Identity;

impl Module for Identity {
    fn kind(&self) -> &str {
        IDENTITY
    }

    fn forward(&self, input: &Tensor, _train: bool) -> Result<Tensor, Error> {
        Ok(input.shallow_clone())
    }
}

/// A module the surgery puts in.
#[derive(Debug)]
pub enum GluModule {
    /// In a `gpt2_mlp`'s place.
    Gpt2(GluMlp),
    /// In a `bert_output`'s place.
    Bert(BertGluOutput),
    /// In a `bert_intermediate`'s place.
    Identity(Identity),
}

/// Its tensors, named relative to it.
impl OwnTensors for GluModule {
    fn tensors(&self) -> Vec<(&'static str, Tensor)> {
        match self {
            GluModule::Gpt2(m) => m.tensors(),
            GluModule::Bert(m) => m.tensors(),
            GluModule::Identity(_) => Vec::new(),
        }
    }
}

impl Module for GluModule {
    fn kind(&self) -> &str {
        match self {
            GluModule::Gpt2(m) => m.kind(),
            GluModule::Bert(m) => m.kind(),
            GluModule::Identity(m) => m.kind(),
        }
    }

    fn attrs(&self) -> Vec<(String, f64)> {
        match self {
            GluModule::Gpt2(m) => m.attrs(),
            GluModule::Bert(m) => m.attrs(),
            GluModule::Identity(m) => m.attrs(),
        }
    }

    fn forward(&self, input: &Tensor, train: bool) -> Result<Tensor, Error> {
        match self {
            GluModule::Gpt2(m) => m.forward(input, train),
            GluModule::Bert(m) => m.forward(input, train),
            GluModule::Identity(m) => m.forward(input, train),
        }
    }
}

/// Fresh gated feed-forward weights for width `d` and inner width `d_ff`, drawn as Composer's
/// `BERTGatedFFOutput.__init__` creates its layers (`gated_layer` weight then bias,
/// `non_gated_layer`, `wo` weight then bias), each with plugin-api's [`default_init`] (PyTorch's
/// default `Linear` initialisation, `U(−1/√fan_in, 1/√fan_in)`).
pub fn fresh_weights(
    d: i64,
    d_ff: i64,
    gated_layer_bias: bool,
    non_gated_layer_bias: bool,
    uniform: &mut dyn FnMut() -> f64,
    options: (Kind, Device),
) -> Result<GluWeights, Error> {
    let gated_weight = default_init(&[d_ff, d], d, uniform, options)?;
    let gated_bias = gated_layer_bias
        .then(|| default_init(&[d_ff], d, uniform, options))
        .transpose()?;
    let non_gated_weight = default_init(&[d_ff, d], d, uniform, options)?;
    let non_gated_bias = non_gated_layer_bias
        .then(|| default_init(&[d_ff], d, uniform, options))
        .transpose()?;
    let wo_weight = default_init(&[d, d_ff], d_ff, uniform, options)?;
    let wo_bias = default_init(&[d], d_ff, uniform, options)?;
    Ok(GluWeights {
        gated_weight,
        gated_bias,
        non_gated_weight,
        non_gated_bias,
        wo_weight,
        wo_bias,
    })
}

/// The surgery's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GluSettings {
    /// The gate's activation; `None`: the replaced MLP's own (`gelu_new` for `gpt2_mlp`).
    pub act_fn: Option<Activation>,
    /// `gated_layer` has a bias.
    pub gated_layer_bias: bool,
    /// `non_gated_layer` has a bias.
    pub non_gated_layer_bias: bool,
}

/// Composer's `apply_gated_linear_units` on the host's BERT: in every `bert_layer`, the
/// `bert_intermediate` becomes the [`Identity`] and the `bert_output` a [`BertGluOutput`]
/// (`d` = its `dense`'s output width, `d_ff` its input width, its dropout and LayerNorm
/// epsilon, a fresh LayerNorm), weights drawn as [`fresh_weights`]; the activation is the
/// settings' or BERT's exact GELU.
fn apply_to_bert(
    model: &mut impl SurgeryModel,
    modules: &[ModuleInfo],
    m: &ModuleInfo,
    settings: &GluSettings,
) -> Result<(), Error> {
    let w = model.tensor_of(m, "dense.weight")?;
    let s = w.size();
    let [d, d_ff] = s[..] else {
        return Err(format!(
            "`{}.dense.weight` has shape {s:?}, expected (d, d_ff)",
            m.path
        )
        .into());
    };
    let eps = walk::find(modules, &format!("{}.LayerNorm", m.path))
        .and_then(|n| n.attr("eps"))
        .unwrap_or(1e-12);
    let dropout = walk::find(modules, &format!("{}.dropout", m.path))
        .and_then(|n| n.attr("p"))
        .unwrap_or(0.0);
    if !(0.0..1.0).contains(&dropout) {
        return Err(format!("{} `{}`: dropout = {dropout}", m.kind, m.path).into());
    }
    let layer = walk::parent(m.path.as_str()).unwrap_or("");
    let intermediate = if layer.is_empty() {
        "intermediate".to_owned()
    } else {
        format!("{layer}.intermediate")
    };
    match walk::find(modules, &intermediate) {
        Some(n) if n.kind.as_str() == BERT_INTERMEDIATE => {}
        _ => {
            return Err(Error::new(
                ErrorKind::HOST,
                format!(
                    "{} `{}` has no `{BERT_INTERMEDIATE}` beside it at `{intermediate}`",
                    m.kind, m.path
                ),
            ))
        }
    }
    let options = (w.kind(), w.device());
    let mut uniform = || model.uniform();
    let weights = fresh_weights(
        d,
        d_ff,
        settings.gated_layer_bias,
        settings.non_gated_layer_bias,
        &mut uniform,
        options,
    )?;
    let act = settings.act_fn.unwrap_or(Activation::Gelu);
    model.replace(&intermediate, GluModule::Identity(Identity))?;
    model.replace(
        &m.path,
        GluModule::Bert(BertGluOutput::new(weights, act, eps, dropout)?),
    )
}

/// Composer's `apply_gated_linear_units`: on the host's BERT as Composer does it
/// ([`apply_to_bert`]: every `bert_output` and the `bert_intermediate` beside it), and adapted
/// to its GPT-2: every `gpt2_mlp` becomes a [`GluMlp`] of the same widths (`n_embd`,
/// `n_inner`). New weights are drawn from the model's seeded stream in tree order
/// ([`fresh_weights`]); the trained feed-forward weights are dropped, as Composer drops BERT's
/// (golden quirk 22). Returns the replaced paths (the `bert_output`s and `gpt2_mlp`s); the
/// new modules are not candidates, so a second application changes nothing.
pub fn apply_gated_linear_units(
    model: &mut impl SurgeryModel,
    settings: &GluSettings,
) -> Result<Vec<String>, Error> {
    let modules = model.modules()?;
    let mut replaced = Vec::new();
    for m in walk::of_kind(&modules, BERT_OUTPUT) {
        apply_to_bert(model, &modules, m, settings)?;
        replaced.push(m.path.to_string());
    }
    for m in walk::of_kind(&modules, GPT2_MLP) {
        let c_fc = model.tensor_of(m, "c_fc.weight")?;
        let s = c_fc.size();
        let (d, d_ff) = match s[..] {
            [d, d_ff] => (d, d_ff),
            _ => {
                return Err(format!(
                    "`{}.c_fc.weight` has shape {s:?}, expected (n_embd, n_inner)",
                    m.path
                )
                .into())
            }
        };
        let d = m.int_attr("n_embd", Some(d))?;
        let d_ff = m.int_attr("n_inner", Some(d_ff))?;
        let resid_pdrop = m.attr("resid_pdrop").unwrap_or(0.0);
        if !(0.0..1.0).contains(&resid_pdrop) {
            return Err(format!("{} `{}`: resid_pdrop = {resid_pdrop}", m.kind, m.path).into());
        }
        let options = (c_fc.kind(), c_fc.device());
        let mut uniform = || model.uniform();
        let weights = fresh_weights(
            d,
            d_ff,
            settings.gated_layer_bias,
            settings.non_gated_layer_bias,
            &mut uniform,
            options,
        )?;
        let act = settings.act_fn.unwrap_or(Activation::GeluNew);
        model.replace(
            &m.path,
            GluModule::Gpt2(GluMlp::new(weights, act, resid_pdrop)?),
        )?;
        replaced.push(m.path.to_string());
    }
    Ok(replaced)
}

/// The GatedLinearUnits method: surgery at `init`.
#[derive(Debug)]
pub struct GatedLinearUnits {
    settings: GluSettings,
}

impl GatedLinearUnits {
    /// The method's settings.
    pub fn settings(&self) -> GluSettings {
        self.settings
    }
}

impl Method for GatedLinearUnits {
    fn on_event(&mut self, _event: Event, ctx: &mut Context<'_>) -> Result<(), Error> {
        let replaced = apply_gated_linear_units(ctx, &self.settings)?;
        let total = ctx
            .modules()?
            .iter()
            .filter(|m| [GLU_MLP, GLU_BERT_OUTPUT].contains(&m.kind.as_str()))
            .count();
        ctx.log_metric(METRIC_REPLACED, total as f64);
        if total == 0 {
            ctx.warn(
                "gated_linear_units: the model has no bert_output or gpt2_mlp block: nothing \
                 was replaced (Composer's surgery is defined for transformer feed-forward \
                 blocks only)",
            );
        } else {
            ctx.info(&format!(
                "gated_linear_units replaced {} feed-forward blocks by freshly initialised \
                 gated ones ({total} in the model)",
                replaced.len()
            ));
        }
        Ok(())
    }
}

impl Plugin for GatedLinearUnits {
    const NAME: &'static str = "gated_linear_units";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const DESCRIPTION: &'static str =
        "replaces transformer feed-forward blocks (BERT's, GPT-2's) by gated linear units \
         (model surgery at init)";
    const DEFAULT_SETTINGS: &'static str = "# act_fn = \"gelu\"  (default: the model's own)\n\
        gated_layer_bias = false\nnon_gated_layer_bias = false";

    fn hooks() -> Vec<Hook> {
        vec![Hook::at(Event::INIT)]
    }

    fn create(settings: &Settings) -> Result<Self, Error> {
        let act_fn = settings
            .get_or::<Option<String>>("act_fn", None)?
            .map(|name| {
                Activation::parse(&name).ok_or_else(|| {
                    let known: Vec<&str> = Activation::ALL.iter().map(|a| a.name()).collect();
                    Error::config(format!(
                        "`act_fn` = \"{name}\" is not one of {}",
                        known.join(", ")
                    ))
                })
            })
            .transpose()?;
        Ok(GatedLinearUnits {
            settings: GluSettings {
                act_fn,
                gated_layer_bias: settings.bool("gated_layer_bias")?,
                non_gated_layer_bias: settings.bool("non_gated_layer_bias")?,
            },
        })
    }
}

export_plugin!(GatedLinearUnits);
