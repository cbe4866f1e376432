//! The Vision Transformer (Dosovitskiy et al. 2021) as timm's `VisionTransformer` builds its
//! `vit_{tiny,small,base}_patch16_*` models: the same module tree, parameter names and shapes,
//! initialisation (in distribution) and computation, so that weights map 1:1 to its
//! `state_dict` and the logits agree.
//!
//! # The module tree (the contract with method plugins)
//!
//! `D` = `embed_dim`, `P` = `patch_size`, `N` = patches (`H/P · W/P`), `L` = `depth`, `i` in
//! `0..L`:
//!
//! | path | kind | attributes | tensors (shape) |
//! | --- | --- | --- | --- |
//! | `` (root) | `vision_transformer` | `embed_dim`, `depth`, `num_heads`, `patch_size`, `num_patches`, `num_classes` | `cls_token` (1, 1, D), `pos_embed` (1, N + 1, D) |
//! | `patch_embed` | `patch_embed` | `patch_size`, `embed_dim` | |
//! | `patch_embed.proj` | `conv2d` | kernel and stride P | `weight` (D, C, P, P), `bias` (D) |
//! | `pos_drop` | `dropout` | `p` | |
//! | `blocks` | `sequential` | | |
//! | `blocks.{i}` | `vit_block` | `embed_dim`, `num_heads` | |
//! | `blocks.{i}.norm1` | `layer_norm` | `eps` = 1e-6 | `weight`, `bias` (D) |
//! | `blocks.{i}.attn` | `vit_attention` | `embed_dim`, `num_heads` | |
//! | `blocks.{i}.attn.qkv` | `linear` | D → 3D | `weight` (3D, D), `bias` (3D) |
//! | `blocks.{i}.attn.proj` | `linear` | D → D | `weight`, `bias` |
//! | `blocks.{i}.norm2` | `layer_norm` | `eps` = 1e-6 | `weight`, `bias` (D) |
//! | `blocks.{i}.mlp` | `vit_mlp` | `hidden_features` = 4D | |
//! | `blocks.{i}.mlp.fc1` | `linear` | D → 4D | `weight`, `bias` |
//! | `blocks.{i}.mlp.act` | `gelu` | | |
//! | `blocks.{i}.mlp.fc2` | `linear` | 4D → D | `weight`, `bias` |
//! | `norm` | `layer_norm` | `eps` = 1e-6 | `weight`, `bias` (D) |
//! | `head` | `linear` | D → classes | `weight`, `bias` |
//!
//! What each module receives and returns (B images):
//! - the root: images `(B, C, H, W)`, H and W multiples of P → logits `(B, classes)`:
//!   `x = patch_embed(images)` `(B, N, D)`; the class token in front; `+ pos_embed`;
//!   `pos_drop`; `blocks`; `norm`; the class token's features `x[:, 0]`; `head`.
//! - `patch_embed`: `(B, C, H, W)` → `(B, N, D)`: `proj` (a P×P convolution of stride P), then
//!   the `(h, w)` grid flattened row by row.
//! - `blocks.{i}`: `(B, N + 1, D)` → same: `x = x + attn(norm1(x)); x = x + mlp(norm2(x))`
//!   through its children, which surgery may replace.
//! - `attn`: multi-head self-attention without a mask: `qkv(x)` split into q, k, v of
//!   `num_heads` heads of `D / num_heads`, libtorch's `scaled_dot_product_attention` (scale
//!   `1/sqrt(D / num_heads)`), heads merged, `proj`.
//! - `mlp`: `fc2(gelu(fc1(x)))`, the exact (erf) GELU.
//!
//! Initialisation, as timm's `init_weights_vit_timm`: every linear weight normal(0, 0.02)
//! (timm truncates at ±2, 100 standard deviations away), linear biases zero, `pos_embed`
//! normal(0, 0.02), `cls_token` normal(0, 1e-6), `patch_embed.proj` PyTorch's default
//! convolution init, layer norms ones and zeros.

use tch::nn::Init;
use tch::{TchError, Tensor};

use crate::model::layers::init::TORCH_DEFAULT_WEIGHT;
use crate::model::layers::{
    Attr, Conv2d, Conv2dConfig, Dropout, Gelu, Layer, LayerNorm, Linear, Sequential,
};
use crate::model::{tree::join, InputShape, ParamStore};

/// timm's `init_weights_vit_timm` standard deviation for linear weights and `pos_embed`.
const INIT_STD: f64 = 0.02;
/// timm's layer-norm epsilon for ViTs.
const EPS: f64 = 1e-6;

/// The sizes of a ViT (`[model]` keys of the same names, timm's keyword arguments).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct VitConfig {
    /// Width of every token (`embed_dim`).
    pub embed_dim: usize,
    /// Transformer blocks (`depth`).
    pub depth: usize,
    /// Attention heads per block (`num_heads`); divides `embed_dim`.
    pub num_heads: usize,
    /// Side of the square patches (`patch_size`); divides the image's height and width.
    pub patch_size: usize,
}

impl VitConfig {
    /// timm's `vit_tiny_patch16_*`: 192 features, 12 blocks, 3 heads, 16-pixel patches.
    pub const TINY: VitConfig = VitConfig {
        embed_dim: 192,
        depth: 12,
        num_heads: 3,
        patch_size: 16,
    };
    /// timm's `vit_small_patch16_*`: 384 features, 12 blocks, 6 heads.
    pub const SMALL: VitConfig = VitConfig {
        embed_dim: 384,
        depth: 12,
        num_heads: 6,
        patch_size: 16,
    };
    /// timm's `vit_base_patch16_*`: 768 features, 12 blocks, 12 heads.
    pub const BASE: VitConfig = VitConfig {
        embed_dim: 768,
        depth: 12,
        num_heads: 12,
        patch_size: 16,
    };
}

/// normal(0, `std`).
fn normal(std: f64) -> Init {
    Init::Randn {
        mean: 0.0,
        stdev: std,
    }
}

/// Multi-head self-attention (timm's `Attention`), kind `vit_attention`: children `qkv` and
/// `proj`, both `linear`.
#[derive(Debug)]
pub struct VitAttention {
    qkv: Box<dyn Layer>,
    proj: Box<dyn Layer>,
    embed_dim: i64,
    num_heads: i64,
}

impl VitAttention {
    fn new(store: &mut ParamStore, path: &str, d: i64, heads: i64) -> Result<Self, TchError> {
        Ok(VitAttention {
            qkv: Box::new(Linear::with_init(
                store,
                &join(path, "qkv"),
                d,
                3 * d,
                normal(INIT_STD),
            )?),
            proj: Box::new(Linear::with_init(
                store,
                &join(path, "proj"),
                d,
                d,
                normal(INIT_STD),
            )?),
            embed_dim: d,
            num_heads: heads,
        })
    }
}

impl Layer for VitAttention {
    fn kind(&self) -> &str {
        "vit_attention"
    }

    fn attrs(&self) -> Vec<(&str, Attr)> {
        vec![
            ("embed_dim", Attr::Int(self.embed_dim)),
            ("num_heads", Attr::Int(self.num_heads)),
        ]
    }

    fn children(&self) -> Vec<(&str, &dyn Layer)> {
        vec![("qkv", self.qkv.as_ref()), ("proj", self.proj.as_ref())]
    }

    fn child_mut(&mut self, name: &str) -> Option<&mut Box<dyn Layer>> {
        match name {
            "qkv" => Some(&mut self.qkv),
            "proj" => Some(&mut self.proj),
            _ => None,
        }
    }

    fn forward(&self, xs: &Tensor, train: bool) -> Result<Tensor, TchError> {
        let (b, n, d) = match xs.size().as_slice() {
            &[b, n, d] if d == self.embed_dim => (b, n, d),
            size => {
                return Err(TchError::Shape(format!(
                    "vit attention: expected (batch, tokens, {}), got {size:?}",
                    self.embed_dim
                )))
            }
        };
        let h = self.num_heads;
        // (B, N, 3, H, d) -> (3, B, H, N, d), as timm's reshape and permute.
        let qkv = self
            .qkv
            .forward(xs, train)?
            .f_reshape([b, n, 3, h, d / h])?
            .f_permute([2, 0, 3, 1, 4])?;
        let (q, k, v) = (qkv.f_get(0)?, qkv.f_get(1)?, qkv.f_get(2)?);
        let y = Tensor::f_scaled_dot_product_attention(
            &q,
            &k,
            &v,
            None::<Tensor>,
            0.0,
            false,
            None,
            false,
        )?;
        let y = y.f_transpose(1, 2)?.f_reshape([b, n, d])?;
        self.proj.forward(&y, train)
    }
}

/// The feed-forward block (timm's `Mlp`), kind `vit_mlp`: `fc1`, `act` (GELU), `fc2`.
#[derive(Debug)]
pub struct VitMlp {
    fc1: Box<dyn Layer>,
    act: Box<dyn Layer>,
    fc2: Box<dyn Layer>,
    hidden: i64,
}

impl Layer for VitMlp {
    fn kind(&self) -> &str {
        "vit_mlp"
    }

    fn attrs(&self) -> Vec<(&str, Attr)> {
        vec![("hidden_features", Attr::Int(self.hidden))]
    }

    fn children(&self) -> Vec<(&str, &dyn Layer)> {
        vec![
            ("fc1", self.fc1.as_ref()),
            ("act", self.act.as_ref()),
            ("fc2", self.fc2.as_ref()),
        ]
    }

    fn child_mut(&mut self, name: &str) -> Option<&mut Box<dyn Layer>> {
        match name {
            "fc1" => Some(&mut self.fc1),
            "act" => Some(&mut self.act),
            "fc2" => Some(&mut self.fc2),
            _ => None,
        }
    }

    fn forward(&self, xs: &Tensor, train: bool) -> Result<Tensor, TchError> {
        let x = self.fc1.forward(xs, train)?;
        let x = self.act.forward(&x, train)?;
        self.fc2.forward(&x, train)
    }
}

/// A pre-norm transformer block (timm's `Block` without layer scale or drop path), kind
/// `vit_block`.
#[derive(Debug)]
pub struct VitBlock {
    norm1: Box<dyn Layer>,
    attn: Box<dyn Layer>,
    norm2: Box<dyn Layer>,
    mlp: Box<dyn Layer>,
    embed_dim: i64,
    num_heads: i64,
}

impl VitBlock {
    fn new(store: &mut ParamStore, path: &str, d: i64, heads: i64) -> Result<Self, TchError> {
        let at = |name| join(path, name);
        let norm1 = LayerNorm::with_eps(store, &at("norm1"), d, EPS)?;
        let attn = VitAttention::new(store, &at("attn"), d, heads)?;
        let norm2 = LayerNorm::with_eps(store, &at("norm2"), d, EPS)?;
        let mlp = VitMlp {
            fc1: Box::new(Linear::with_init(
                store,
                &at("mlp.fc1"),
                d,
                4 * d,
                normal(INIT_STD),
            )?),
            act: Box::new(Gelu),
            fc2: Box::new(Linear::with_init(
                store,
                &at("mlp.fc2"),
                4 * d,
                d,
                normal(INIT_STD),
            )?),
            hidden: 4 * d,
        };
        Ok(VitBlock {
            norm1: Box::new(norm1),
            attn: Box::new(attn),
            norm2: Box::new(norm2),
            mlp: Box::new(mlp),
            embed_dim: d,
            num_heads: heads,
        })
    }
}

impl Layer for VitBlock {
    fn kind(&self) -> &str {
        "vit_block"
    }

    fn attrs(&self) -> Vec<(&str, Attr)> {
        vec![
            ("embed_dim", Attr::Int(self.embed_dim)),
            ("num_heads", Attr::Int(self.num_heads)),
        ]
    }

    fn children(&self) -> Vec<(&str, &dyn Layer)> {
        vec![
            ("norm1", self.norm1.as_ref()),
            ("attn", self.attn.as_ref()),
            ("norm2", self.norm2.as_ref()),
            ("mlp", self.mlp.as_ref()),
        ]
    }

    fn child_mut(&mut self, name: &str) -> Option<&mut Box<dyn Layer>> {
        match name {
            "norm1" => Some(&mut self.norm1),
            "attn" => Some(&mut self.attn),
            "norm2" => Some(&mut self.norm2),
            "mlp" => Some(&mut self.mlp),
            _ => None,
        }
    }

    fn forward(&self, xs: &Tensor, train: bool) -> Result<Tensor, TchError> {
        let a = self.attn.forward(&self.norm1.forward(xs, train)?, train)?;
        let xs = xs.f_add(&a)?;
        let m = self.mlp.forward(&self.norm2.forward(&xs, train)?, train)?;
        xs.f_add(&m)
    }
}

/// Images to patch tokens (timm's `PatchEmbed`), kind `patch_embed`: its child `proj`.
#[derive(Debug)]
pub struct PatchEmbed {
    proj: Box<dyn Layer>,
    patch_size: i64,
    embed_dim: i64,
}

impl Layer for PatchEmbed {
    fn kind(&self) -> &str {
        "patch_embed"
    }

    fn attrs(&self) -> Vec<(&str, Attr)> {
        vec![
            ("patch_size", Attr::Int(self.patch_size)),
            ("embed_dim", Attr::Int(self.embed_dim)),
        ]
    }

    fn children(&self) -> Vec<(&str, &dyn Layer)> {
        vec![("proj", self.proj.as_ref())]
    }

    fn child_mut(&mut self, name: &str) -> Option<&mut Box<dyn Layer>> {
        (name == "proj").then_some(&mut self.proj)
    }

    fn forward(&self, xs: &Tensor, train: bool) -> Result<Tensor, TchError> {
        // (B, D, h, w) -> (B, h·w, D)
        self.proj
            .forward(xs, train)?
            .f_flatten(2, 3)?
            .f_transpose(1, 2)
    }
}

/// timm's `VisionTransformer` with a class token and token pooling, kind
/// `vision_transformer` (see the module docs).
#[derive(Debug)]
pub struct VisionTransformer {
    cls_token: Tensor,
    pos_embed: Tensor,
    patch_embed: Box<dyn Layer>,
    pos_drop: Box<dyn Layer>,
    blocks: Box<dyn Layer>,
    norm: Box<dyn Layer>,
    head: Box<dyn Layer>,
    config: VitConfig,
    num_patches: i64,
    num_classes: i64,
}

impl VisionTransformer {
    /// A ViT of `config`'s sizes for `input` images and `num_classes` classes; `dropout` is
    /// `pos_drop`'s probability (timm's `pos_drop_rate`, 0 by default). Fails, naming the
    /// setting, when a size does not fit (heads not dividing the width, an image side not a
    /// multiple of the patch).
    pub fn new(
        store: &mut ParamStore,
        config: VitConfig,
        input: InputShape,
        dropout: f64,
        num_classes: i64,
    ) -> Result<VisionTransformer, TchError> {
        let (d, heads, p) = (
            config.embed_dim as i64,
            config.num_heads as i64,
            config.patch_size as i64,
        );
        if heads == 0 || d % heads != 0 {
            return Err(TchError::Shape(format!(
                "vit: `embed_dim` ({d}) must be a multiple of `num_heads` ({heads})"
            )));
        }
        if p == 0 || input.height % p != 0 || input.width % p != 0 {
            return Err(TchError::Shape(format!(
                "vit: the images are {}x{}, not a multiple of `patch_size` ({p}) in both sides; \
                 resize them (data transforms) or choose another patch size",
                input.height, input.width
            )));
        }
        let num_patches = (input.height / p) * (input.width / p);
        let cls_token = store.parameter("cls_token".to_owned(), &[1, 1, d], normal(1e-6))?;
        let pos_embed = store.parameter(
            "pos_embed".to_owned(),
            &[1, num_patches + 1, d],
            normal(INIT_STD),
        )?;
        let conv = Conv2dConfig {
            stride: p,
            bias: true,
            ..Conv2dConfig::default()
        };
        let proj = Conv2d::new(
            store,
            "patch_embed.proj",
            input.channels,
            d,
            p,
            conv,
            TORCH_DEFAULT_WEIGHT,
        )?;
        let patch_embed = PatchEmbed {
            proj: Box::new(proj),
            patch_size: p,
            embed_dim: d,
        };
        let mut blocks = Sequential::new();
        for i in 0..config.depth {
            let block = VitBlock::new(store, &format!("blocks.{i}"), d, heads)?;
            blocks = blocks.add(i.to_string(), block);
        }
        let norm = LayerNorm::with_eps(store, "norm", d, EPS)?;
        let head = Linear::with_init(store, "head", d, num_classes, normal(INIT_STD))?;
        Ok(VisionTransformer {
            cls_token,
            pos_embed,
            patch_embed: Box::new(patch_embed),
            pos_drop: Box::new(Dropout::new(dropout)),
            blocks: Box::new(blocks),
            norm: Box::new(norm),
            head: Box::new(head),
            config,
            num_patches,
            num_classes,
        })
    }
}

impl Layer for VisionTransformer {
    fn kind(&self) -> &str {
        "vision_transformer"
    }

    fn attrs(&self) -> Vec<(&str, Attr)> {
        let c = &self.config;
        vec![
            ("embed_dim", Attr::Int(c.embed_dim as i64)),
            ("depth", Attr::Int(c.depth as i64)),
            ("num_heads", Attr::Int(c.num_heads as i64)),
            ("patch_size", Attr::Int(c.patch_size as i64)),
            ("num_patches", Attr::Int(self.num_patches)),
            ("num_classes", Attr::Int(self.num_classes)),
        ]
    }

    fn tensors(&self) -> Vec<(&str, &Tensor)> {
        vec![
            ("cls_token", &self.cls_token),
            ("pos_embed", &self.pos_embed),
        ]
    }

    fn children(&self) -> Vec<(&str, &dyn Layer)> {
        vec![
            ("patch_embed", self.patch_embed.as_ref()),
            ("pos_drop", self.pos_drop.as_ref()),
            ("blocks", self.blocks.as_ref()),
            ("norm", self.norm.as_ref()),
            ("head", self.head.as_ref()),
        ]
    }

    fn child_mut(&mut self, name: &str) -> Option<&mut Box<dyn Layer>> {
        match name {
            "patch_embed" => Some(&mut self.patch_embed),
            "pos_drop" => Some(&mut self.pos_drop),
            "blocks" => Some(&mut self.blocks),
            "norm" => Some(&mut self.norm),
            "head" => Some(&mut self.head),
            _ => None,
        }
    }

    fn forward(&self, xs: &Tensor, train: bool) -> Result<Tensor, TchError> {
        let x = self.patch_embed.forward(xs, train)?;
        let b = x.size().first().copied().unwrap_or(0);
        let n = x.size().get(1).copied().unwrap_or(0);
        if n != self.num_patches {
            return Err(TchError::Shape(format!(
                "vit: the input gives {n} patches, the model was built for {} (its position \
                 embedding `pos_embed`): give images of the size it was built for",
                self.num_patches
            )));
        }
        let cls = self
            .cls_token
            .f_expand([b, 1, self.config.embed_dim as i64], false)?;
        let x = Tensor::f_cat(&[cls, x], 1)?.f_add(&self.pos_embed)?;
        let x = self.pos_drop.forward(&x, train)?;
        let x = self.blocks.forward(&x, train)?;
        let x = self.norm.forward(&x, train)?;
        let x = x.f_select(1, 0)?;
        self.head.forward(&x, train)
    }
}
