//! One GPT-2 attention for every combination of the attention features: rotary position
//! embeddings and QK-norm ([`AttentionSpec`], [`ExtAttention`], kind [`EXT_ATTENTION`]).

use std::sync::Mutex;

use tessera_plugin_api::device::upload;
use tessera_plugin_api::kit::OwnTensors;
use tessera_plugin_api::tch::{Device, Kind, Tensor};
use tessera_plugin_api::{Error, ErrorKind, Module, ModuleInfo};

use crate::kinds::{EXT_ATTENTION, GPT2_ATTENTION};

/// Hugging Face's `Conv1D`: `x @ weight + bias` over the last dimension, `weight` `(in, out)`,
/// computed with one `addmm` as the host's GPT-2 computes it (so that a module over the same
/// tensors gives the host's numbers to the bit).
pub fn conv1d(xs: &Tensor, weight: &Tensor, bias: &Tensor) -> Result<Tensor, Error> {
    let mut size = xs.size();
    let nx = size.pop().unwrap_or(0);
    size.push(weight.size().last().copied().unwrap_or(0));
    Ok(bias
        .f_addmm(&xs.f_reshape([-1, nx])?, weight)?
        .f_reshape(size.as_slice())?)
}

/// Dropout with probability `p` in training, the identity otherwise (the host's GPT-2's).
pub fn dropout(xs: Tensor, p: f64, train: bool) -> Result<Tensor, Error> {
    if train && p > 0.0 {
        Ok(xs.f_dropout(p, true)?)
    } else {
        Ok(xs)
    }
}

/// Rotary position embeddings on the first `dims` features of every head (Su et al. 2021; the
/// half-split GPT-NeoX form, `rotary_pct` = `dims / head_dim`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rotary {
    /// The frequency base θ: feature pair `i` turns by `m · base^(−2i/dims)` at position `m`.
    pub base: f64,
    /// Rotated features per head: even, at least 2, at most the head width.
    pub dims: i64,
}

impl Rotary {
    /// The rotated features per head for a head of `head_dim` features and `fraction` of them
    /// rotated: `int(head_dim · fraction)` (GPT-NeoX's `rotary_ndims`) rounded down to even; an
    /// error when that leaves fewer than 2.
    pub fn dims_for(head_dim: i64, fraction: f64) -> Result<i64, Error> {
        let dims = ((head_dim as f64 * fraction).floor() as i64) / 2 * 2;
        if dims < 2 || dims > head_dim {
            return Err(Error::config(format!(
                "`fraction` = {fraction} rotates {dims} of the {head_dim} features of each head; \
                 rotary needs at least 2 (a pair)"
            )));
        }
        Ok(dims)
    }

    /// The inverse frequencies `base^(−2i/dims)`, `i < dims / 2`, computed in `f64`.
    pub fn inv_freq(&self) -> Vec<f64> {
        (0..self.dims / 2)
            .map(|i| 1.0 / self.base.powf((2 * i) as f64 / self.dims as f64))
            .collect()
    }

    /// `(cos, sin)` of the angles `m · inv_freq[i]`, each `(t, dims / 2)` in `kind` on
    /// `device`: the angles and their cosines and sines computed in `f64`, then rounded once.
    pub fn cos_sin(&self, t: i64, kind: Kind, device: Device) -> Result<(Tensor, Tensor), Error> {
        // Host-made, uploaded without a blocking copy.
        let inv = upload(&Tensor::f_from_slice(&self.inv_freq())?, device)?;
        let positions = Tensor::f_arange(t, (Kind::Double, device))?;
        let angles = positions.f_outer(&inv)?;
        Ok((
            angles.f_cos()?.f_to_kind(kind)?,
            angles.f_sin()?.f_to_kind(kind)?,
        ))
    }
}

/// Rotates the first `cos.size(-1) · 2` features of every head of `x` `(B, H, T, D)` by their
/// positions' angles, GPT-NeoX's (and Hugging Face LLaMA's) `x · cos + rotate_half(x) · sin`
/// with `rotate_half([x1, x2]) = [−x2, x1]`: for `j < d/2` (`d` the rotated features)
/// `y_j = x_j cos_{t,j} − x_{j+d/2} sin_{t,j}` and `y_{j+d/2} = x_{j+d/2} cos_{t,j} + x_j sin_{t,j}`;
/// the other features pass through. `cos` and `sin` are `(T, d/2)`. The rotation runs in the
/// dtype of `cos` (float32 for a float16/bfloat16 `x`, as modded-nanogpt rotates in float32)
/// and the result has `x`'s dtype.
pub fn apply_rotary(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor, Error> {
    let d = x.size().last().copied().unwrap_or(0);
    let half = cos.size().last().copied().unwrap_or(0);
    let rot = 2 * half;
    if half < 1 || rot > d {
        return Err(format!("rotary: {rot} rotated features in a head of {d}").into());
    }
    let kind = x.kind();
    let xr = x.f_narrow(-1, 0, rot)?;
    let xr = if xr.kind() == cos.kind() {
        xr
    } else {
        xr.f_to_kind(cos.kind())?
    };
    let x1 = xr.f_narrow(-1, 0, half)?;
    let x2 = xr.f_narrow(-1, half, half)?;
    let y1 = x1.f_mul(cos)?.f_sub(&x2.f_mul(sin)?)?;
    let y2 = x2.f_mul(cos)?.f_add(&x1.f_mul(sin)?)?;
    let mut parts = vec![y1, y2];
    if rot < d {
        let pass = x.f_narrow(-1, rot, d - rot)?;
        parts.push(if pass.kind() == cos.kind() {
            pass
        } else {
            pass.f_to_kind(cos.kind())?
        });
    }
    let y = Tensor::f_cat(&parts, -1)?;
    Ok(if y.kind() == kind {
        y
    } else {
        y.f_to_kind(kind)?
    })
}

/// modded-nanogpt's QK-norm: `F.rms_norm(x, (x.size(-1),))` over each head's features, no
/// learned weight, libtorch's default epsilon (the dtype's machine epsilon); the result has
/// `x`'s dtype (autocast may compute it in float32).
pub fn qk_rms_norm(x: &Tensor) -> Result<Tensor, Error> {
    let d = x.size().last().copied().unwrap_or(0);
    let y = x.f_rms_norm([d], None::<Tensor>, None)?;
    Ok(if y.kind() == x.kind() {
        y
    } else {
        y.f_to_kind(x.kind())?
    })
}

/// What an extended GPT-2 attention computes: the host's `gpt2_attention` sizes and dropouts
/// plus its features. The module tree's kind and attributes describe it completely
/// ([`AttentionSpec::attrs`], [`AttentionSpec::from_module`]), so a plugin can rebuild it with
/// its own feature added over the same tensors, whichever plugin ran first.
#[derive(Debug, Clone, PartialEq)]
pub struct AttentionSpec {
    /// Heads.
    pub n_head: i64,
    /// Width `C` (the head width is `C / n_head`).
    pub n_embd: i64,
    /// The model's `n_positions` (kept as an attribute; rotary attention has no length limit).
    pub n_positions: i64,
    /// Dropout on the attention weights, in training.
    pub attn_pdrop: f64,
    /// Dropout after the output projection, in training.
    pub resid_pdrop: f64,
    /// Rotary position embeddings on q and k.
    pub rotary: Option<Rotary>,
    /// RMS-normalised q and k (per head, no weight).
    pub qk_norm: bool,
}

fn bad(module: &ModuleInfo, what: String) -> Error {
    Error::new(
        ErrorKind::HOST,
        format!("{} `{}`: {what}", module.kind, module.path),
    )
}

fn probability(module: &ModuleInfo, key: &str) -> Result<f64, Error> {
    let p = module.attr(key).unwrap_or(0.0);
    if !(0.0..1.0).contains(&p) {
        return Err(bad(module, format!("`{key}` = {p} is not in [0, 1)")));
    }
    Ok(p)
}

fn flag(module: &ModuleInfo, key: &str) -> Result<bool, Error> {
    match module.attr(key) {
        None => Ok(false),
        Some(v) if v == 0.0 || v == 1.0 => Ok(v == 1.0),
        Some(v) => Err(bad(module, format!("`{key}` = {v} is not 0 or 1"))),
    }
}

impl AttentionSpec {
    /// The head width `C / n_head`.
    pub fn head_dim(&self) -> i64 {
        self.n_embd / self.n_head.max(1)
    }

    /// Whether the spec adds nothing to the host's `gpt2_attention`.
    pub fn is_plain(&self) -> bool {
        self.rotary.is_none() && !self.qk_norm
    }

    /// The spec of a `gpt2_attention` or `gpt2_attention_ext` node of the module tree; `None`
    /// for any other kind. Missing or inconsistent attributes are errors naming the node.
    pub fn from_module(module: &ModuleInfo) -> Result<Option<AttentionSpec>, Error> {
        let kind = module.kind.as_str();
        if kind != GPT2_ATTENTION && kind != EXT_ATTENTION {
            return Ok(None);
        }
        let n_head = module.int_attr("n_head", None)?;
        let n_embd = module.int_attr("n_embd", None)?;
        if n_head < 1 || n_embd < 1 || n_embd % n_head != 0 {
            return Err(bad(
                module,
                format!("n_embd {n_embd} is not a multiple of n_head {n_head}"),
            ));
        }
        let n_positions = module.int_attr("n_positions", Some(0))?;
        let mut spec = AttentionSpec {
            n_head,
            n_embd,
            n_positions,
            attn_pdrop: probability(module, "attn_pdrop")?,
            resid_pdrop: probability(module, "resid_pdrop")?,
            rotary: None,
            qk_norm: false,
        };
        if kind == EXT_ATTENTION {
            spec.qk_norm = flag(module, "qk_norm")?;
            if flag(module, "rotary")? {
                let base = module.attr("rotary_base").unwrap_or(f64::NAN);
                let dims = module.int_attr("rotary_dims", None)?;
                if !(base.is_finite() && base > 0.0) {
                    return Err(bad(module, format!("`rotary_base` = {base}")));
                }
                if dims < 2 || dims % 2 != 0 || dims > spec.head_dim() {
                    return Err(bad(
                        module,
                        format!(
                            "`rotary_dims` = {dims} is not an even count of at most {} features",
                            spec.head_dim()
                        ),
                    ));
                }
                spec.rotary = Some(Rotary { base, dims });
            }
        }
        Ok(Some(spec))
    }

    /// The module's attributes: `n_head`, `n_embd`, `n_positions`, `attn_pdrop`, `resid_pdrop`
    /// (as `gpt2_attention`'s), then `rotary` (0/1), `rotary_base`, `rotary_dims` (0 without
    /// rotary) and `qk_norm` (0/1).
    pub fn attrs(&self) -> Vec<(String, f64)> {
        let (rotary, base, dims) = match self.rotary {
            Some(r) => (1.0, r.base, r.dims as f64),
            None => (0.0, 0.0, 0.0),
        };
        vec![
            ("n_head".to_owned(), self.n_head as f64),
            ("n_embd".to_owned(), self.n_embd as f64),
            ("n_positions".to_owned(), self.n_positions as f64),
            ("attn_pdrop".to_owned(), self.attn_pdrop),
            ("resid_pdrop".to_owned(), self.resid_pdrop),
            ("rotary".to_owned(), rotary),
            ("rotary_base".to_owned(), base),
            ("rotary_dims".to_owned(), dims),
            ("qk_norm".to_owned(), f64::from(u8::from(self.qk_norm))),
        ]
    }
}

/// The four tensors of GPT-2's attention (`Conv1D` layout), shared with the model's store.
#[derive(Debug)]
pub struct AttentionWeights {
    /// `c_attn.weight`, `(C, 3C)`.
    pub c_attn_weight: Tensor,
    /// `c_attn.bias`, `(3C)`.
    pub c_attn_bias: Tensor,
    /// `c_proj.weight`, `(C, C)`.
    pub c_proj_weight: Tensor,
    /// `c_proj.bias`, `(C)`.
    pub c_proj_bias: Tensor,
}

impl AttentionWeights {
    /// Shallow clones (the same storage).
    pub fn shallow_clone(&self) -> AttentionWeights {
        AttentionWeights {
            c_attn_weight: self.c_attn_weight.shallow_clone(),
            c_attn_bias: self.c_attn_bias.shallow_clone(),
            c_proj_weight: self.c_proj_weight.shallow_clone(),
            c_proj_bias: self.c_proj_bias.shallow_clone(),
        }
    }

    /// Checks the shapes against width `c`.
    pub fn check(&self, c: i64) -> Result<(), Error> {
        for (name, t, want) in [
            ("c_attn.weight", &self.c_attn_weight, vec![c, 3 * c]),
            ("c_attn.bias", &self.c_attn_bias, vec![3 * c]),
            ("c_proj.weight", &self.c_proj_weight, vec![c, c]),
            ("c_proj.bias", &self.c_proj_bias, vec![c]),
        ] {
            if t.size() != want {
                return Err(format!("`{name}` has shape {:?}, expected {want:?}", t.size()).into());
            }
        }
        Ok(())
    }

    /// The tensors under their names relative to the module (shallow clones).
    pub fn named(&self) -> Vec<(&'static str, Tensor)> {
        let w = self.shallow_clone();
        vec![
            ("c_attn.weight", w.c_attn_weight),
            ("c_attn.bias", w.c_attn_bias),
            ("c_proj.weight", w.c_proj_weight),
            ("c_proj.bias", w.c_proj_bias),
        ]
    }
}

/// The cosines and sines of the last sequence length seen, per module.
#[derive(Debug)]
struct RotaryCache {
    t: i64,
    kind: Kind,
    device: Device,
    cos: Tensor,
    sin: Tensor,
}

/// The extended attention (kind [`EXT_ATTENTION`]), `(B, T, C)` → `(B, T, C)`:
///
/// 1. `q, k, v` = `x @ c_attn.weight + c_attn.bias` split in three, `n_head` heads each;
/// 2. with QK-norm, `q, k` = [`qk_rms_norm`] of each;
/// 3. with rotary, `q, k` = [`apply_rotary`] at positions `0..T`;
/// 4. libtorch's fused `scaled_dot_product_attention(q, k, v, is_causal = true)` (scale
///    `1/√(C/n_head)`, dropout `attn_pdrop` in training), as the host's `gpt2_attention`;
/// 5. heads merged, `@ c_proj.weight + c_proj.bias`, dropout `resid_pdrop` in training.
///
/// The order of 2 and 3 does not matter in exact arithmetic: the rotation is orthogonal on each
/// head's features, so it keeps their root mean square. Without features it computes what the
/// host's `gpt2_attention` computes, to the bit.
#[derive(Debug)]
pub struct ExtAttention {
    spec: AttentionSpec,
    weights: AttentionWeights,
    cache: Mutex<Option<RotaryCache>>,
}

impl ExtAttention {
    /// The module over `weights`; checks the spec against the shapes.
    pub fn new(spec: AttentionSpec, weights: AttentionWeights) -> Result<ExtAttention, Error> {
        if spec.n_head < 1 || spec.n_embd % spec.n_head != 0 {
            return Err(format!(
                "n_embd {} is not a multiple of n_head {}",
                spec.n_embd, spec.n_head
            )
            .into());
        }
        if let Some(r) = spec.rotary {
            if r.dims < 2 || r.dims % 2 != 0 || r.dims > spec.head_dim() {
                return Err(format!(
                    "rotary_dims {} is not an even count of at most {} features",
                    r.dims,
                    spec.head_dim()
                )
                .into());
            }
            if !(r.base.is_finite() && r.base > 0.0) {
                return Err(format!("rotary base {} is not a positive number", r.base).into());
            }
        }
        weights.check(spec.n_embd)?;
        Ok(ExtAttention {
            spec,
            weights,
            cache: Mutex::new(None),
        })
    }

    /// What it computes.
    pub fn spec(&self) -> &AttentionSpec {
        &self.spec
    }

    /// `(cos, sin)` for `t` positions, `(t, dims/2)`, in `kind` on `device` (cached).
    fn cos_sin(
        &self,
        rotary: Rotary,
        t: i64,
        kind: Kind,
        device: Device,
    ) -> Result<(Tensor, Tensor), Error> {
        let mut cache = self
            .cache
            .lock()
            .map_err(|_| Error::from("rotary: the cosine cache was poisoned"))?;
        if let Some(c) = cache.as_ref() {
            if c.t == t && c.kind == kind && c.device == device {
                return Ok((c.cos.shallow_clone(), c.sin.shallow_clone()));
            }
        }
        let (cos, sin) = rotary.cos_sin(t, kind, device)?;
        *cache = Some(RotaryCache {
            t,
            kind,
            device,
            cos: cos.shallow_clone(),
            sin: sin.shallow_clone(),
        });
        Ok((cos, sin))
    }

    /// q and k after the features (steps 2 and 3), `(B, H, T, D)` each.
    pub fn transform_qk(&self, q: Tensor, k: Tensor) -> Result<(Tensor, Tensor), Error> {
        let (mut q, mut k) = (q, k);
        if self.spec.qk_norm {
            q = qk_rms_norm(&q)?;
            k = qk_rms_norm(&k)?;
        }
        if let Some(rotary) = self.spec.rotary {
            let t = q.size()[2];
            // Half-precision heads rotate in float32 (modded-nanogpt's `x.float()`).
            let kind = match q.kind() {
                Kind::Double => Kind::Double,
                _ => Kind::Float,
            };
            let (cos, sin) = self.cos_sin(rotary, t, kind, q.device())?;
            q = apply_rotary(&q, &cos, &sin)?;
            k = apply_rotary(&k, &cos, &sin)?;
        }
        Ok((q, k))
    }

    /// The output (see the type's documentation).
    pub fn forward_with(&self, x: &Tensor, train: bool) -> Result<Tensor, Error> {
        let (b, t, c) = match x.size()[..] {
            [b, t, c] if c == self.spec.n_embd => (b, t, c),
            ref s => {
                return Err(format!(
                    "{EXT_ATTENTION}: expected an input (batch, tokens, {}), got {s:?}",
                    self.spec.n_embd
                )
                .into())
            }
        };
        let (h, d) = (self.spec.n_head, self.spec.head_dim());
        let w = &self.weights;
        let qkv = conv1d(x, &w.c_attn_weight, &w.c_attn_bias)?;
        let parts = qkv.f_split(c, 2)?;
        let [q, k, v] = parts.as_slice() else {
            return Err(
                format!("{EXT_ATTENTION}: c_attn gave {} parts, not 3", parts.len()).into(),
            );
        };
        let heads = |part: &Tensor| -> Result<Tensor, Error> {
            Ok(part.f_reshape([b, t, h, d])?.f_transpose(1, 2)?)
        };
        let (q, k) = self.transform_qk(heads(q)?, heads(k)?)?;
        let v = heads(v)?;
        let p = if train { self.spec.attn_pdrop } else { 0.0 };
        let y = Tensor::f_scaled_dot_product_attention(
            &q,
            &k,
            &v,
            None::<Tensor>,
            p,
            true,
            None,
            false,
        )?;
        let y = y.f_transpose(1, 2)?.f_contiguous()?.f_reshape([b, t, c])?;
        let y = conv1d(&y, &w.c_proj_weight, &w.c_proj_bias)?;
        dropout(y, self.spec.resid_pdrop, train)
    }
}

/// The tensors to register under the module's path: the four original ones (shallow clones:
/// trained and saved under the same names as before).
impl OwnTensors for ExtAttention {
    fn tensors(&self) -> Vec<(&'static str, Tensor)> {
        self.weights.named()
    }
}

impl Module for ExtAttention {
    fn kind(&self) -> &str {
        EXT_ATTENTION
    }

    fn attrs(&self) -> Vec<(String, f64)> {
        self.spec.attrs()
    }

    fn forward(&self, input: &Tensor, train: bool) -> Result<Tensor, Error> {
        self.forward_with(input, train)
    }
    // `export`: the default (kept, with its attributes in `tessera.modules`): rotary positions
    // and QK-norm change what the network computes and do not fold into a plain
    // `gpt2_attention`. scripts/pytorch_models.py has its PyTorch twin.
}
