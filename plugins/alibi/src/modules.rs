//! The modules ALiBi's surgery puts into a GPT-2 ([`AlibiAttention`] in place of every
//! `gpt2_attention`, [`ZeroPositions`] in place of `transformer.wpe`) and a BERT
//! ([`AlibiBertAttention`] in place of every `bert_self_attention`, [`ZeroPositions`] in place
//! of `bert.embeddings.position_embeddings`).

use tessera_plugin_api::kit::OwnTensors;
use tessera_plugin_api::tch::Tensor;
use tessera_plugin_api::{Error, Module};

use crate::functional::{
    alibi_attention_with, alibi_sdpa_attention, bert_alibi_attention, AttentionOptions,
    BertAttentionWeights, Gpt2AttentionWeights,
};

/// Kind of the ALiBi attention module in the module tree.
pub const ALIBI_ATTENTION: &str = "alibi_gpt2_attention";
/// Kind of the BERT ALiBi self-attention module in the module tree.
pub const ALIBI_BERT_ATTENTION: &str = "alibi_bert_self_attention";
/// Kind of the zeroed, frozen position embedding in the module tree.
pub const ZERO_POSITIONS: &str = "alibi_zero_positions";

/// GPT-2 attention with ALiBi (Composer's patched `GPT2Attention`): the original block's
/// `c_attn`/`c_proj` tensors (shared, not copied) and a causal bias buffer `alibi`
/// `(n_head, 1, max_sequence_length)`.
#[derive(Debug)]
pub struct AlibiAttention {
    weights: Gpt2AttentionWeights,
    alibi: Tensor,
    n_head: i64,
    n_embd: i64,
    attn_pdrop: f64,
    resid_pdrop: f64,
}

impl AlibiAttention {
    /// The module over `weights` with the causal bias `alibi` `(n_head, 1, L)`; checks shapes.
    pub fn new(
        weights: Gpt2AttentionWeights,
        alibi: Tensor,
        n_head: i64,
        attn_pdrop: f64,
        resid_pdrop: f64,
    ) -> Result<AlibiAttention, Error> {
        let n_embd = weights.n_embd()?;
        if n_head < 1 || n_embd % n_head != 0 {
            return Err(format!("n_embd {n_embd} is not divisible by n_head {n_head}").into());
        }
        let s = alibi.size();
        if s.len() != 3 || s[0] != n_head || s[1] != 1 {
            return Err(
                format!("the ALiBi bias has shape {s:?}, expected ({n_head}, 1, L)").into(),
            );
        }
        Ok(AlibiAttention {
            weights,
            alibi,
            n_head,
            n_embd,
            attn_pdrop,
            resid_pdrop,
        })
    }

    /// The longest sequence the bias covers (`max_sequence_length`).
    pub fn max_sequence_length(&self) -> i64 {
        self.alibi.size()[2]
    }

    fn options<'a>(&self, padding_mask: Option<&'a Tensor>, train: bool) -> AttentionOptions<'a> {
        AttentionOptions {
            padding_mask,
            attn_pdrop: self.attn_pdrop,
            resid_pdrop: self.resid_pdrop,
            train,
        }
    }

    /// The output, with an optional padding mask (see [`AttentionOptions`]), on libtorch's fused
    /// `scaled_dot_product_attention` ([`alibi_sdpa_attention`]): what [`Module::forward`] runs.
    pub fn forward_with(
        &self,
        x: &Tensor,
        padding_mask: Option<&Tensor>,
        train: bool,
    ) -> Result<Tensor, Error> {
        alibi_sdpa_attention(
            x,
            &self.weights,
            self.n_head,
            &self.alibi,
            self.options(padding_mask, train),
        )
    }

    /// Output and attention probabilities, computed explicitly as Composer does
    /// ([`alibi_attention_with`]; the same output as [`AlibiAttention::forward_with`] within
    /// float rounding, with the `(B, H, T, T)` probabilities materialised).
    pub fn forward_with_probs(
        &self,
        x: &Tensor,
        padding_mask: Option<&Tensor>,
        train: bool,
    ) -> Result<(Tensor, Tensor), Error> {
        alibi_attention_with(
            x,
            &self.weights,
            self.n_head,
            &self.alibi,
            self.options(padding_mask, train),
        )
    }
}

/// The tensors registered under the module's path: the four original tensors (shallow clones:
/// trained and saved as before, under the same names) and the `alibi` buffer.
impl OwnTensors for AlibiAttention {
    fn tensors(&self) -> Vec<(&'static str, Tensor)> {
        let w = self.weights.shallow_clone();
        vec![
            ("c_attn.weight", w.c_attn_weight),
            ("c_attn.bias", w.c_attn_bias),
            ("c_proj.weight", w.c_proj_weight),
            ("c_proj.bias", w.c_proj_bias),
            ("alibi", self.alibi.shallow_clone()),
        ]
    }
}

impl Module for AlibiAttention {
    fn kind(&self) -> &str {
        ALIBI_ATTENTION
    }

    fn attrs(&self) -> Vec<(String, f64)> {
        vec![
            ("n_head".to_owned(), self.n_head as f64),
            ("n_embd".to_owned(), self.n_embd as f64),
            (
                "max_sequence_length".to_owned(),
                self.max_sequence_length() as f64,
            ),
            ("attn_pdrop".to_owned(), self.attn_pdrop),
            ("resid_pdrop".to_owned(), self.resid_pdrop),
        ]
    }

    fn forward(&self, input: &Tensor, train: bool) -> Result<Tensor, Error> {
        self.forward_with(input, None, train)
    }
    // `export`: the default (kept): ALiBi changes what the network computes, it does not fold
    // into a plain `gpt2_attention`.
}

/// BERT self-attention with ALiBi (Composer's patched `BertSelfAttention`): the original
/// `query`/`key`/`value` tensors (shared, not copied) and a bidirectional bias buffer `alibi`
/// `(1, n_head, L, L)`. Its input and output are the host's `bert_self_attention`'s: hidden
/// states `(B, T, C)` to the context `(B, T, C)`; the batch's padding mask arrives through
/// [`Module::forward_masked`].
#[derive(Debug)]
pub struct AlibiBertAttention {
    weights: BertAttentionWeights,
    alibi: Tensor,
    n_head: i64,
    n_embd: i64,
    dropout: f64,
}

impl AlibiBertAttention {
    /// The module over `weights` with the bias `alibi` `(1, n_head, L, L)`; checks shapes.
    pub fn new(
        weights: BertAttentionWeights,
        alibi: Tensor,
        n_head: i64,
        dropout: f64,
    ) -> Result<AlibiBertAttention, Error> {
        let n_embd = weights.n_embd()?;
        if n_head < 1 || n_embd % n_head != 0 {
            return Err(format!("n_embd {n_embd} is not divisible by n_head {n_head}").into());
        }
        let s = alibi.size();
        if s.len() != 4 || s[0] != 1 || s[1] != n_head || s[2] != s[3] {
            return Err(
                format!("the ALiBi bias has shape {s:?}, expected (1, {n_head}, L, L)").into(),
            );
        }
        Ok(AlibiBertAttention {
            weights,
            alibi,
            n_head,
            n_embd,
            dropout,
        })
    }

    /// The longest sequence the bias covers (`max_sequence_length`).
    pub fn max_sequence_length(&self) -> i64 {
        self.alibi.size()[2]
    }

    /// The context with an optional padding mask `(B, T)` ([`bert_alibi_attention`]).
    pub fn forward_with(
        &self,
        x: &Tensor,
        padding_mask: Option<&Tensor>,
        train: bool,
    ) -> Result<Tensor, Error> {
        bert_alibi_attention(
            x,
            &self.weights,
            self.n_head,
            &self.alibi,
            padding_mask,
            self.dropout,
            train,
        )
    }
}

/// The tensors registered under the module's path: the six original tensors (shallow clones,
/// under the same names) and the `alibi` buffer.
impl OwnTensors for AlibiBertAttention {
    fn tensors(&self) -> Vec<(&'static str, Tensor)> {
        let mut out = self.weights.named();
        out.push(("alibi", self.alibi.shallow_clone()));
        out
    }
}

impl Module for AlibiBertAttention {
    fn kind(&self) -> &str {
        ALIBI_BERT_ATTENTION
    }

    fn attrs(&self) -> Vec<(String, f64)> {
        vec![
            ("n_head".to_owned(), self.n_head as f64),
            ("n_embd".to_owned(), self.n_embd as f64),
            (
                "max_sequence_length".to_owned(),
                self.max_sequence_length() as f64,
            ),
            ("attention_probs_dropout_prob".to_owned(), self.dropout),
        ]
    }

    fn forward(&self, input: &Tensor, train: bool) -> Result<Tensor, Error> {
        self.forward_with(input, None, train)
    }

    fn forward_masked(
        &self,
        input: &Tensor,
        attention_mask: &Tensor,
        train: bool,
    ) -> Result<Tensor, Error> {
        self.forward_with(input, Some(attention_mask), train)
    }
}

/// The position embedding after ALiBi's surgery: `gpt_surgery`'s zero, frozen table of kind
/// [`ZERO_POSITIONS`] (made with [`ZeroPositions::with_kind`]), the one rotary uses too.
pub use gpt_surgery::ZeroPositions;

/// Either ALiBi module, as surgery hands it to the model.
#[derive(Debug)]
pub enum AlibiModule {
    /// A GPT-2 attention block.
    Attention(AlibiAttention),
    /// A BERT self-attention.
    BertAttention(AlibiBertAttention),
    /// The position embedding.
    Positions(ZeroPositions),
}

/// The tensors to register under the module's path.
impl OwnTensors for AlibiModule {
    fn tensors(&self) -> Vec<(&'static str, Tensor)> {
        match self {
            AlibiModule::Attention(m) => m.tensors(),
            AlibiModule::BertAttention(m) => m.tensors(),
            AlibiModule::Positions(m) => m.tensors(),
        }
    }
}

impl Module for AlibiModule {
    fn kind(&self) -> &str {
        match self {
            AlibiModule::Attention(m) => m.kind(),
            AlibiModule::BertAttention(m) => m.kind(),
            AlibiModule::Positions(m) => m.kind(),
        }
    }

    fn attrs(&self) -> Vec<(String, f64)> {
        match self {
            AlibiModule::Attention(m) => m.attrs(),
            AlibiModule::BertAttention(m) => m.attrs(),
            AlibiModule::Positions(m) => m.attrs(),
        }
    }

    fn forward(&self, input: &Tensor, train: bool) -> Result<Tensor, Error> {
        match self {
            AlibiModule::Attention(m) => m.forward(input, train),
            AlibiModule::BertAttention(m) => m.forward(input, train),
            AlibiModule::Positions(m) => m.forward(input, train),
        }
    }

    fn forward_masked(
        &self,
        input: &Tensor,
        attention_mask: &Tensor,
        train: bool,
    ) -> Result<Tensor, Error> {
        match self {
            AlibiModule::BertAttention(m) => m.forward_masked(input, attention_mask, train),
            other => other.forward(input, train),
        }
    }

    fn export(&self) -> Result<Option<Vec<(String, Tensor)>>, Error> {
        match self {
            AlibiModule::Attention(m) => m.export(),
            AlibiModule::BertAttention(m) => m.export(),
            AlibiModule::Positions(m) => m.export(),
        }
    }
}
