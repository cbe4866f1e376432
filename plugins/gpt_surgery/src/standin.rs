//! A stand-in for the host's GPT-2 in unit tests: its module tree (paths, kinds, attributes,
//! tensor names and shapes as `host/src/model/layers/gpt2.rs` documents them) and tensors,
//! with surgery recorded ([`StandIn`]). It runs the modules plugins put in, not the model.

use std::collections::{BTreeMap, HashMap};

use tessera_plugin_api::abi::Attribute;
use tessera_plugin_api::abi_stable::std_types::{RString, RVec};
use tessera_plugin_api::tch::{Device, Kind, Tensor};
use tessera_plugin_api::{Error, Module, ModuleInfo, Wrapper};

use crate::kinds::{
    EMBEDDING, GPT2_ATTENTION, GPT2_BLOCK, GPT2_MLP, LINEAR, LM_HEAD_PATH, TIED_LM_HEAD, WPE_PATH,
};
use crate::model::Model;

/// Sizes of a stand-in GPT-2.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sizes {
    /// Blocks.
    pub n_layer: i64,
    /// Heads.
    pub n_head: i64,
    /// Width.
    pub n_embd: i64,
    /// Context (rows of `transformer.wpe`).
    pub n_positions: i64,
    /// Vocabulary.
    pub vocab_size: i64,
    /// `lm_head` multiplies by `transformer.wte.weight`.
    pub tied: bool,
    /// Embedding, attention and residual dropout.
    pub dropout: f64,
}

impl Default for Sizes {
    fn default() -> Sizes {
        Sizes {
            n_layer: 2,
            n_head: 2,
            n_embd: 16,
            n_positions: 32,
            vocab_size: 40,
            tied: true,
            dropout: 0.0,
        }
    }
}

/// The module tree and tensors of a GPT-2, with the modules and wrappers surgery put in.
pub struct StandIn {
    /// The tree, depth first.
    pub infos: Vec<ModuleInfo>,
    /// Every tensor by full name.
    pub tensors: BTreeMap<String, Tensor>,
    /// The modules put in by [`Model::replace`], by path.
    pub replaced: HashMap<String, Box<dyn Module>>,
    /// The wrappers put in by [`Model::wrap`], by path.
    pub wrapped: HashMap<String, Box<dyn Wrapper>>,
}

fn info(path: &str, kind: &str, attrs: &[(&str, f64)], tensors: &[&str]) -> ModuleInfo {
    ModuleInfo {
        path: RString::from(path),
        kind: RString::from(kind),
        attrs: attrs
            .iter()
            .map(|(k, v)| Attribute {
                key: RString::from(*k),
                value: *v,
            })
            .collect(),
        params: tensors
            .iter()
            .map(|t| {
                RString::from(if path.is_empty() {
                    (*t).to_owned()
                } else {
                    format!("{path}.{t}")
                })
            })
            .collect::<RVec<RString>>(),
    }
}

/// Normal draws from a seeded SplitMix64 stream (Box–Muller), independent of libtorch's global
/// generator: tests that run in parallel threads of one process get the same tensors for the
/// same seed.
#[derive(Debug, Clone)]
pub struct Normal {
    state: u64,
}

impl Normal {
    /// The stream of `seed`.
    pub fn new(seed: u64) -> Normal {
        Normal { state: seed }
    }

    fn uniform(&mut self) -> f64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        ((z >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// One standard normal draw.
    pub fn sample(&mut self) -> f64 {
        let (u, v) = (self.uniform(), self.uniform());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }

    /// A float32 CPU tensor of `shape` with normal(0, `std`) values.
    pub fn tensor(&mut self, shape: &[i64], std: f64) -> Tensor {
        let n: i64 = shape.iter().product();
        let values: Vec<f32> = (0..n).map(|_| (self.sample() * std) as f32).collect();
        Tensor::from_slice(&values).reshape(shape)
    }
}

fn zeros(shape: &[i64]) -> Tensor {
    Tensor::zeros(shape, (Kind::Float, Device::Cpu)).set_requires_grad(true)
}

impl StandIn {
    /// A GPT-2 of `sizes` with Hugging Face's initialisation (normal 0.02, `c_proj` weights
    /// 0.02/√(2 n_layer), unit layer-norm weights), drawn from [`Normal`] seeded with `seed`;
    /// the attention's and MLP's biases are normal 0.02 too (GPT-2's are zero) so that tests
    /// see them. Every tensor is a trainable parameter.
    pub fn gpt2(sizes: Sizes, seed: u64) -> StandIn {
        let mut normal = Normal::new(seed);
        let mut randn = |shape: &[i64], std: f64| normal.tensor(shape, std).set_requires_grad(true);
        let Sizes {
            n_layer,
            n_head,
            n_embd: c,
            n_positions: p,
            vocab_size: v,
            tied,
            dropout,
        } = sizes;
        let proj = 0.02 / (2.0 * n_layer as f64).sqrt();
        let mut infos = Vec::new();
        let mut tensors = BTreeMap::new();
        let model_attrs = [
            ("vocab_size", v as f64),
            ("n_positions", p as f64),
            ("n_embd", c as f64),
            ("n_layer", n_layer as f64),
            ("n_head", n_head as f64),
        ];
        let mut root_attrs = model_attrs.to_vec();
        root_attrs.push(("tie_embeddings", f64::from(u8::from(tied))));
        infos.push(info("", "gpt2_lm_head_model", &root_attrs, &[]));
        infos.push(info("transformer", "gpt2_model", &model_attrs, &[]));
        let emb = |rows: i64| [("num_embeddings", rows as f64), ("embedding_dim", c as f64)];
        infos.push(info("transformer.wte", EMBEDDING, &emb(v), &["weight"]));
        tensors.insert("transformer.wte.weight".to_owned(), randn(&[v, c], 0.02));
        infos.push(info(WPE_PATH, EMBEDDING, &emb(p), &["weight"]));
        tensors.insert(format!("{WPE_PATH}.weight"), randn(&[p, c], 0.02));
        infos.push(info("transformer.drop", "dropout", &[("p", dropout)], &[]));
        infos.push(info("transformer.h", "sequential", &[], &[]));
        let ln = [
            ("normalized_shape", c as f64),
            ("eps", 1e-5),
            ("elementwise_affine", 1.0),
        ];
        for i in 0..n_layer {
            let block = format!("transformer.h.{i}");
            infos.push(info(
                &block,
                GPT2_BLOCK,
                &[("n_embd", c as f64), ("n_head", n_head as f64)],
                &[],
            ));
            for (name, kind, attrs, shapes) in [
                (
                    "ln_1",
                    "layer_norm",
                    ln.to_vec(),
                    vec![("weight", vec![c]), ("bias", vec![c])],
                ),
                (
                    "attn",
                    GPT2_ATTENTION,
                    vec![
                        ("n_head", n_head as f64),
                        ("n_embd", c as f64),
                        ("n_positions", p as f64),
                        ("attn_pdrop", dropout),
                        ("resid_pdrop", dropout),
                    ],
                    vec![
                        ("c_attn.weight", vec![c, 3 * c]),
                        ("c_attn.bias", vec![3 * c]),
                        ("c_proj.weight", vec![c, c]),
                        ("c_proj.bias", vec![c]),
                    ],
                ),
                (
                    "ln_2",
                    "layer_norm",
                    ln.to_vec(),
                    vec![("weight", vec![c]), ("bias", vec![c])],
                ),
                (
                    "mlp",
                    GPT2_MLP,
                    vec![
                        ("n_embd", c as f64),
                        ("n_inner", 4.0 * c as f64),
                        ("resid_pdrop", dropout),
                    ],
                    vec![
                        ("c_fc.weight", vec![c, 4 * c]),
                        ("c_fc.bias", vec![4 * c]),
                        ("c_proj.weight", vec![4 * c, c]),
                        ("c_proj.bias", vec![c]),
                    ],
                ),
            ] {
                let path = format!("{block}.{name}");
                let names: Vec<&str> = shapes.iter().map(|(n, _)| *n).collect();
                infos.push(info(&path, kind, &attrs, &names));
                for (leaf, shape) in shapes {
                    let t = match (name, leaf) {
                        ("ln_1" | "ln_2", "weight") => {
                            Tensor::ones(shape.as_slice(), (Kind::Float, Device::Cpu))
                                .set_requires_grad(true)
                        }
                        ("ln_1" | "ln_2", _) => zeros(&shape),
                        (_, "c_proj.weight") => randn(&shape, proj),
                        _ => randn(&shape, 0.02),
                    };
                    tensors.insert(format!("{path}.{leaf}"), t);
                }
            }
        }
        infos.push(info(
            "transformer.ln_f",
            "layer_norm",
            &ln,
            &["weight", "bias"],
        ));
        tensors.insert(
            "transformer.ln_f.weight".to_owned(),
            Tensor::ones([c], (Kind::Float, Device::Cpu)).set_requires_grad(true),
        );
        tensors.insert("transformer.ln_f.bias".to_owned(), zeros(&[c]));
        let head_attrs = [
            ("in_features", c as f64),
            ("out_features", v as f64),
            ("bias", 0.0),
        ];
        if tied {
            infos.push(info(LM_HEAD_PATH, TIED_LM_HEAD, &head_attrs, &[]));
        } else {
            infos.push(info(LM_HEAD_PATH, LINEAR, &head_attrs, &["weight"]));
            tensors.insert("lm_head.weight".to_owned(), randn(&[v, c], 0.02));
        }
        StandIn {
            infos,
            tensors,
            replaced: HashMap::new(),
            wrapped: HashMap::new(),
        }
    }

    /// The kind of the module at `path`.
    pub fn kind(&self, path: &str) -> Option<&str> {
        self.infos
            .iter()
            .find(|m| m.path.as_str() == path)
            .map(|m| m.kind.as_str())
    }

    /// The tree's node at `path`.
    pub fn info(&self, path: &str) -> Option<&ModuleInfo> {
        self.infos.iter().find(|m| m.path.as_str() == path)
    }

    /// The module surgery put at `path`.
    pub fn module(&self, path: &str) -> Option<&dyn Module> {
        self.replaced.get(path).map(|m| m.as_ref())
    }

    /// The tensor `name`.
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.tensors.get(name)
    }
}

impl Model for StandIn {
    fn modules(&self) -> Result<Vec<ModuleInfo>, Error> {
        Ok(self.infos.clone())
    }

    fn parameter(&self, name: &str) -> Result<Option<Tensor>, Error> {
        Ok(self.tensors.get(name).map(Tensor::shallow_clone))
    }

    fn replace<M: Module>(
        &mut self,
        path: &str,
        module: M,
        tensors: Vec<(&str, Tensor)>,
    ) -> Result<(), Error> {
        let at = self
            .infos
            .iter()
            .position(|m| m.path.as_str() == path)
            .ok_or_else(|| format!("no module at `{path}`"))?;
        // The old module's subtree leaves, with its tensors.
        let prefix = format!("{path}.");
        self.infos.retain(|m| !m.path.as_str().starts_with(&prefix));
        self.tensors.retain(|name, _| !name.starts_with(&prefix));
        let attrs: Vec<(String, f64)> = module.attrs();
        let attrs: Vec<(&str, f64)> = attrs.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        let names: Vec<&str> = tensors.iter().map(|(n, _)| *n).collect();
        self.infos[at] = info(path, module.kind(), &attrs, &names);
        for (name, t) in tensors {
            self.tensors.insert(format!("{path}.{name}"), t);
        }
        self.replaced.insert(path.to_owned(), Box::new(module));
        Ok(())
    }

    fn wrap<W: Wrapper>(&mut self, path: &str, wrapper: W) -> Result<(), Error> {
        let node = self
            .infos
            .iter_mut()
            .find(|m| m.path.as_str() == path)
            .ok_or_else(|| format!("no module at `{path}`"))?;
        node.kind = RString::from(wrapper.kind());
        node.attrs
            .extend(wrapper.attrs().into_iter().map(|(k, v)| Attribute {
                key: RString::from(k),
                value: v,
            }));
        self.wrapped.insert(path.to_owned(), Box::new(wrapper));
        Ok(())
    }
}
