//! Which model to build: the architecture and its sizes (`[model]` in `trainer.toml`).

use std::path::PathBuf;

use serde::Serialize;

pub use super::zoo::{BertConfig, BertHead, LlamaConfig, VitConfig};

/// A model architecture (`[model] name`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelName {
    /// Multi-layer perceptron.
    Mlp,
    /// Small convolutional network.
    Cnn,
    /// ResNet-20 (CIFAR style).
    Resnet20,
    /// ResNet-56 (CIFAR style).
    Resnet56,
    /// ResNet-18 (ImageNet style, torchvision's `resnet18` names).
    Resnet18,
    /// ResNet-50 (ImageNet style, torchvision's `resnet50` names).
    Resnet50,
    /// A GPT-2 decoder over token ids (Hugging Face's `GPT2LMHeadModel` names), sized by
    /// [`ModelConfig::gpt2`].
    Gpt2,
    /// Keller Jordan's airbench CIFAR-10 network (a 2×2 whitening-ready convolution, three
    /// conv groups of [`ModelConfig::widths`], GELU, global max-pool, a scaled linear head).
    Airbench,
    /// A model made in PyTorch, from the file [`ModelConfig::torchscript`] names (`[model]
    /// torchscript = "model.pt"` instead of `name`).
    Torchscript,
    /// BERT over token ids (Hugging Face's `BertForMaskedLM` or `BertForSequenceClassification`
    /// names), sized by [`ModelConfig::bert`].
    Bert,
    /// timm's `vit_tiny_patch16_*` (192 features, 12 blocks, 3 heads), sized by
    /// [`ModelConfig::vit`].
    VitTiny,
    /// timm's `vit_small_patch16_*` (384 features, 12 blocks, 6 heads).
    VitSmall,
    /// timm's `vit_base_patch16_*` (768 features, 12 blocks, 12 heads).
    VitBase,
    /// A Llama-family decoder over token ids (Hugging Face's `LlamaForCausalLM` names; Qwen2
    /// and Mistral without a sliding window too), sized by [`ModelConfig::llama`].
    Llama,
}

impl ModelName {
    /// Every zoo architecture with the name used in `trainer.toml` (a TorchScript model is named
    /// by its file instead).
    pub const CHOICES: [(&'static str, ModelName); 13] = [
        ("mlp", ModelName::Mlp),
        ("cnn", ModelName::Cnn),
        ("resnet20", ModelName::Resnet20),
        ("resnet56", ModelName::Resnet56),
        ("resnet18", ModelName::Resnet18),
        ("resnet50", ModelName::Resnet50),
        ("gpt2", ModelName::Gpt2),
        ("llama", ModelName::Llama),
        ("bert", ModelName::Bert),
        ("airbench", ModelName::Airbench),
        ("vit_tiny", ModelName::VitTiny),
        ("vit_small", ModelName::VitSmall),
        ("vit_base", ModelName::VitBase),
    ];

    /// The name used in `trainer.toml`.
    pub fn as_str(self) -> &'static str {
        match self {
            ModelName::Mlp => "mlp",
            ModelName::Cnn => "cnn",
            ModelName::Resnet20 => "resnet20",
            ModelName::Resnet56 => "resnet56",
            ModelName::Resnet18 => "resnet18",
            ModelName::Resnet50 => "resnet50",
            ModelName::Gpt2 => "gpt2",
            ModelName::Llama => "llama",
            ModelName::Bert => "bert",
            ModelName::Airbench => "airbench",
            ModelName::Torchscript => "torchscript",
            ModelName::VitTiny => "vit_tiny",
            ModelName::VitSmall => "vit_small",
            ModelName::VitBase => "vit_base",
        }
    }

    /// A ViT's default sizes (timm's); `None` for the other models.
    pub fn vit_sizes(self) -> Option<VitConfig> {
        match self {
            ModelName::VitTiny => Some(VitConfig::TINY),
            ModelName::VitSmall => Some(VitConfig::SMALL),
            ModelName::VitBase => Some(VitConfig::BASE),
            _ => None,
        }
    }

    /// The base width when none is given: 32 for cnn, 16 for the CIFAR resnets, 64 for the
    /// ImageNet ones (torchvision's), `None` for mlp (which has hidden widths instead), for gpt2
    /// (sized by [`Gpt2Config`]), for airbench (which has [`ModelConfig::widths`]) and for a
    /// TorchScript model (whose file fixes its sizes).
    pub fn default_width(self) -> Option<usize> {
        match self {
            ModelName::Mlp
            | ModelName::Gpt2
            | ModelName::Llama
            | ModelName::Bert
            | ModelName::Airbench
            | ModelName::Torchscript
            | ModelName::VitTiny
            | ModelName::VitSmall
            | ModelName::VitBase => None,
            ModelName::Cnn => Some(32),
            ModelName::Resnet20 | ModelName::Resnet56 => Some(16),
            ModelName::Resnet18 | ModelName::Resnet50 => Some(64),
        }
    }

    /// Whether this is [`ModelName::Torchscript`] (which the recorded config leaves out: the
    /// `torchscript` key names that model).
    fn is_torchscript(&self) -> bool {
        *self == ModelName::Torchscript
    }
}

impl std::fmt::Display for ModelName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The TorchScript file of a model made in PyTorch (`[model] torchscript`, `sha256`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TorchscriptFile {
    /// The file, absolute (resolved against the `trainer.toml`'s folder), so that a recorded
    /// config (checkpoint, run record) still finds it from elsewhere.
    #[serde(rename = "torchscript")]
    pub path: PathBuf,
    /// sha256 of the file (hex) when the config was read. A config that gives it (a recorded
    /// one always does) refuses a file with other contents.
    pub sha256: String,
}

/// The normalization layers of a zoo model (`[model] norm`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Norm {
    /// No normalization (the mlp's default).
    None,
    /// `BatchNorm2d` (the cnn's default).
    Batch,
    /// `GroupNorm` in [`Norm::groups`] groups (cnn).
    Group,
    /// `LayerNorm` over each hidden layer's features, after its `Linear` (mlp).
    Layer,
}

impl Norm {
    /// Every normalization with the name used in `trainer.toml`.
    pub const CHOICES: [(&'static str, Norm); 4] = [
        ("none", Norm::None),
        ("batch", Norm::Batch),
        ("group", Norm::Group),
        ("layer", Norm::Layer),
    ];

    /// The name used in `trainer.toml`.
    pub fn as_str(self) -> &'static str {
        match self {
            Norm::None => "none",
            Norm::Batch => "batch",
            Norm::Group => "group",
            Norm::Layer => "layer",
        }
    }

    /// The normalizations model `name` can be built with, its default first: mlp `none` or
    /// `layer`, cnn `batch` or `group`; the resnets only their batch norms, gpt2 its layer norms.
    pub fn choices(name: ModelName) -> &'static [Norm] {
        match name {
            ModelName::Mlp => &[Norm::None, Norm::Layer],
            ModelName::Gpt2
            | ModelName::Bert
            | ModelName::VitTiny
            | ModelName::VitSmall
            | ModelName::VitBase => &[Norm::Layer],
            ModelName::Cnn => &[Norm::Batch, Norm::Group],
            // RMSNorm, which `norm` does not choose.
            ModelName::Torchscript | ModelName::Llama => &[],
            _ => &[Norm::Batch],
        }
    }

    /// The group count of a `GroupNorm` over `channels` channels: `gcd(channels, 8)`, 8 groups
    /// for the usual widths (a multiple of 8), so that each group holds several channels, as
    /// in Wu & He's small-model settings.
    pub fn groups(channels: i64) -> i64 {
        let (mut a, mut b) = (channels, 8);
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    }
}

/// Which model to build (`[model]`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelConfig {
    /// Architecture.
    #[serde(skip_serializing_if = "ModelName::is_torchscript")]
    pub name: ModelName,
    /// The file of a [`ModelName::Torchscript`] model; `None` for the zoo's.
    #[serde(flatten)]
    pub torchscript: Option<TorchscriptFile>,
    /// Hidden layer widths; mlp only (default `[256, 128]`), empty for other models.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hidden: Vec<usize>,
    /// airbench only (default `[64, 256, 256]`, airbench94's), empty for other models: the
    /// widths of its three conv groups.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub widths: Vec<usize>,
    /// Base width: `Some` for cnn and the resnets ([`ModelName::default_width`]), `None` for mlp.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub width: Option<usize>,
    /// Output classes.
    pub num_classes: usize,
    /// mlp: the probability of a `Dropout` after each hidden `ReLU` (default 0: no
    /// dropout layers, today's model and names); gpt2: the embedding, attention and residual
    /// dropout (Hugging Face's `embd_pdrop`, `attn_pdrop`, `resid_pdrop`, all this value).
    #[serde(skip_serializing_if = "is_zero")]
    pub dropout: f64,
    /// The normalization layers; `None`: the model's default ([`Norm::choices`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub norm: Option<Norm>,
    /// gpt2 only (`Some` for it, `None` for every other model): its sizes.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub gpt2: Option<Gpt2Config>,
    /// bert only (`Some` for it): its sizes and head.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub bert: Option<BertConfig>,
    /// llama only (`Some` for it): its sizes, Hugging Face's `LlamaConfig` keys.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub llama: Option<LlamaConfig>,
    /// The ViTs only (`Some` for them): their sizes (`embed_dim`, `depth`, `num_heads`,
    /// `patch_size`), timm's for the name unless given.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub vit: Option<VitConfig>,
    /// Pretrained weights the run starts from (`init_weights`, `init_ignore`, `init_strict`);
    /// `None`: the weights are drawn.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub init: Option<InitWeights>,
}

/// Pretrained weights a run starts from (`[model] init_weights`, `init_ignore`,
/// `init_strict`): a PyTorch `state_dict` as safetensors, loaded by name before the methods'
/// surgery at `init` (see [`super::load_init_weights`]). A resumed run takes its weights from
/// its checkpoint instead.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InitWeights {
    /// The file, absolute (resolved against the `trainer.toml`'s folder).
    #[serde(rename = "init_weights")]
    pub path: PathBuf,
    /// Glob patterns of tensors left as drawn (on either side: the model's and the file's).
    #[serde(rename = "init_ignore", skip_serializing_if = "Vec::is_empty")]
    pub ignore: Vec<String>,
    /// Whether a missing, unexpected or mis-shaped tensor is an error (default true) rather
    /// than a warning.
    #[serde(rename = "init_strict")]
    pub strict: bool,
}

/// The sizes of a [`ModelName::Gpt2`] model (`[model]` keys of the same names). The defaults
/// are GPT-2 small's (the 125M configuration): 12 layers, 12 heads, 768 features, a context of
/// 1024 tokens, tied embeddings, layer-norm epsilon 1e-5.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Gpt2Config {
    /// Transformer blocks (`n_layer`).
    pub n_layer: usize,
    /// Attention heads per block (`n_head`); divides `n_embd`.
    pub n_head: usize,
    /// Width of the residual stream (`n_embd`).
    pub n_embd: usize,
    /// The context: the most tokens a sequence may have, the rows of the position embedding
    /// (`n_positions`).
    pub n_positions: usize,
    /// Rows of the token embedding and logits per token (`vocab_size`); `None`: the model's
    /// `num_classes` (the dataset's vocabulary). At least that when given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vocab_size: Option<usize>,
    /// Whether `lm_head` shares the token embedding's weight (`tie_embeddings`, Hugging Face's
    /// `tie_word_embeddings`).
    pub tie_embeddings: bool,
    /// The epsilon of every layer norm (`layer_norm_epsilon`).
    pub layer_norm_epsilon: f64,
}

impl Default for Gpt2Config {
    fn default() -> Self {
        Gpt2Config {
            n_layer: 12,
            n_head: 12,
            n_embd: 768,
            n_positions: 1024,
            vocab_size: None,
            tie_embeddings: true,
            layer_norm_epsilon: 1e-5,
        }
    }
}

impl Gpt2Config {
    /// The sizes of a Hugging Face `config.json` of a `GPT2LMHeadModel` (what `tessera export
    /// --format hf` writes). What this model does not compute (another activation, an inner
    /// width other than 4·n_embd, cross-attention, per-layer attention scaling) is an error
    /// naming the key.
    pub fn from_hf_config(json: &serde_json::Value) -> Result<Gpt2Config, String> {
        let get = |key: &str| super::hf_json::field(json, key);
        let count = |key: &str| super::hf_json::count(json, key);
        let flag = |key: &str| super::hf_json::flag(json, key);
        let model_type = get("model_type").and_then(|v| v.as_str()).unwrap_or("gpt2");
        if model_type != "gpt2" {
            return Err(format!("`model_type` {model_type:?} is not \"gpt2\""));
        }
        if let Some(act) = get("activation_function").and_then(|v| v.as_str()) {
            if act != "gelu_new" {
                return Err(format!(
                    "`activation_function` {act:?}: only \"gelu_new\" is computed"
                ));
            }
        }
        for key in [
            "add_cross_attention",
            "scale_attn_by_inverse_layer_idx",
            "reorder_and_upcast_attn",
        ] {
            if flag(key)? == Some(true) {
                return Err(format!("`{key}` = true is not computed"));
            }
        }
        let defaults = Gpt2Config::default();
        let n_embd = count("n_embd")?.unwrap_or(defaults.n_embd);
        if let Some(inner) = count("n_inner")?.filter(|&i| i != 4 * n_embd) {
            return Err(format!(
                "`n_inner` {inner}: only an inner width of 4·n_embd ({}) is computed",
                4 * n_embd
            ));
        }
        Ok(Gpt2Config {
            n_layer: count("n_layer")?.unwrap_or(defaults.n_layer),
            n_head: count("n_head")?.unwrap_or(defaults.n_head),
            n_embd,
            n_positions: count("n_positions")?.unwrap_or(defaults.n_positions),
            vocab_size: count("vocab_size")?,
            // transformers' default for `tie_word_embeddings` is true.
            tie_embeddings: flag("tie_word_embeddings")?.unwrap_or(true),
            layer_norm_epsilon: match get("layer_norm_epsilon") {
                Some(v) => super::hf_json::number(v, "layer_norm_epsilon")?,
                None => defaults.layer_norm_epsilon,
            },
        })
    }
}

/// airbench94's conv-group widths, the default of [`ModelConfig::widths`].
pub const AIRBENCH_WIDTHS: [usize; 3] = [64, 256, 256];

fn is_zero(v: &f64) -> bool {
    *v == 0.0
}

impl ModelConfig {
    /// Model `name` for `num_classes` classes, every other setting at its default.
    pub fn new(name: ModelName, num_classes: usize) -> ModelConfig {
        ModelConfig {
            name,
            torchscript: None,
            hidden: match name {
                ModelName::Mlp => vec![256, 128],
                _ => Vec::new(),
            },
            widths: match name {
                ModelName::Airbench => AIRBENCH_WIDTHS.to_vec(),
                _ => Vec::new(),
            },
            width: name.default_width(),
            num_classes,
            dropout: 0.0,
            norm: None,
            gpt2: (name == ModelName::Gpt2).then(Gpt2Config::default),
            bert: (name == ModelName::Bert).then(BertConfig::default),
            llama: (name == ModelName::Llama).then(LlamaConfig::default),
            vit: name.vit_sizes(),
            init: None,
        }
    }

    /// The TorchScript model in `file` for `num_classes` classes.
    pub fn torchscript(file: TorchscriptFile, num_classes: usize) -> ModelConfig {
        ModelConfig {
            torchscript: Some(file),
            ..ModelConfig::new(ModelName::Torchscript, num_classes)
        }
    }

    /// The normalization used to build: the given one, else the model's default.
    pub(crate) fn norm_or_default(&self) -> Norm {
        self.norm
            .or(Norm::choices(self.name).first().copied())
            .unwrap_or(Norm::None)
    }

    /// airbench's three conv-group widths: the given ones (the config reader makes sure there
    /// are three), else [`AIRBENCH_WIDTHS`].
    pub(crate) fn airbench_widths(&self) -> [i64; 3] {
        match self.widths[..] {
            [a, b, c] => [a as i64, b as i64, c as i64],
            _ => AIRBENCH_WIDTHS.map(|w| w as i64),
        }
    }

    /// The base width used to build: the given one, else the architecture's default.
    pub(crate) fn base_width(&self) -> i64 {
        self.width.or(self.name.default_width()).unwrap_or_default() as i64
    }
}
