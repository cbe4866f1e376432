#![doc = include_str!("../README.md")]

use tessera_plugin_api::tch::Tensor;
use tessera_plugin_api::{
    export_plugin, Context, Error, Event, Hook, Inner, Method, ModuleInfo, Plugin, Settings,
    Wrapper,
};

/// The kind of an adapted linear layer in the module tree (`tessera export --format peft`
/// writes the adapters of the nodes of this kind).
pub const KIND: &str = "lora_linear";

/// The names of an adapter's two matrices relative to the layer, as PEFT names them (without
/// its adapter name): `lora_A.weight` `(r, in_features)` and `lora_B.weight` `(out_features, r)`.
pub const LORA_A: &str = "lora_A.weight";
/// See [`LORA_A`].
pub const LORA_B: &str = "lora_B.weight";

/// The factor of the adapter's output: `lora_alpha / r`, or `lora_alpha / √r` with rank-stabilised
/// scaling (`use_rslora`, Kalajdzievski 2023), as PEFT's `LoraLayer.update_layer`.
pub fn scaling(lora_alpha: f64, r: i64, use_rslora: bool) -> f64 {
    if use_rslora {
        lora_alpha / (r as f64).sqrt()
    } else {
        lora_alpha / r as f64
    }
}

/// One `target_modules` entry. A plain name (no `.`, `*`, `?` or `[`) is a module name and
/// matches every layer whose path is that name or ends in `.name`, as a PEFT `target_modules`
/// list does (`q_proj`); anything else is a glob over the whole path
/// (`model.layers.1*.self_attn.q_proj`, `*.mlp.*`).
#[derive(Debug, Clone)]
pub enum TargetPattern {
    /// A module name, matched as the path's last components.
    Name(String),
    /// A glob over the whole dotted path.
    Glob(glob::Pattern),
}

impl TargetPattern {
    /// Parses one entry; a glob that does not parse is an error naming it.
    pub fn parse(text: &str) -> Result<TargetPattern, Error> {
        if text.is_empty() {
            return Err(Error::config("`target_modules` has an empty entry"));
        }
        if text.contains(['.', '*', '?', '[']) {
            glob::Pattern::new(text)
                .map(TargetPattern::Glob)
                .map_err(|e| Error::config(format!("`target_modules` entry {text:?}: {e}")))
        } else {
            Ok(TargetPattern::Name(text.to_owned()))
        }
    }

    /// Whether the module at `path` matches.
    pub fn matches(&self, path: &str) -> bool {
        match self {
            TargetPattern::Name(name) => {
                path == name
                    || path
                        .strip_suffix(name.as_str())
                        .is_some_and(|p| p.ends_with('.'))
            }
            TargetPattern::Glob(g) => g.matches(path),
        }
    }

    /// The entry as written.
    pub fn as_str(&self) -> &str {
        match self {
            TargetPattern::Name(name) => name,
            TargetPattern::Glob(g) => g.as_str(),
        }
    }
}

/// PEFT's default `target_modules` for a model whose root has `root_kind`: the attention's
/// query and value projections of a Llama-family decoder (`q_proj`, `v_proj`, as PEFT's
/// `TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING` for llama, mistral and qwen2).
pub fn default_targets(root_kind: &str) -> Option<Vec<&'static str>> {
    match root_kind {
        "llama_for_causal_lm" => Some(vec!["q_proj", "v_proj"]),
        _ => None,
    }
}

/// A linear layer that gets an adapter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Its path.
    pub path: String,
    /// `in_features`.
    pub in_features: i64,
    /// `out_features`.
    pub out_features: i64,
}

/// The `linear` layers the patterns select, depth first. Every pattern must select one: one
/// that matches nothing (a typo, a model without such layers) is an error that lists the
/// names of the model's linear layers. A pattern matching a module of another kind is an error
/// naming it (adapters go on linear layers only).
pub fn targets(modules: &[ModuleInfo], patterns: &[TargetPattern]) -> Result<Vec<Target>, Error> {
    let mut chosen = Vec::new();
    let mut used = vec![false; patterns.len()];
    for m in modules {
        let path = m.path.as_str();
        let hits: Vec<usize> = (0..patterns.len())
            .filter(|&i| patterns[i].matches(path))
            .collect();
        if hits.is_empty() || m.kind.as_str() == KIND {
            continue;
        }
        if m.kind.as_str() != "linear" {
            // A container matched by a broad glob (`*.self_attn`) is passed over; a leaf of
            // another kind named exactly is a mistake worth saying.
            if hits
                .iter()
                .any(|&i| matches!(&patterns[i], TargetPattern::Glob(g) if g.as_str() == path))
            {
                return Err(Error::config(format!(
                    "`target_modules` selects `{path}`, a {} module: LoRA adapts linear layers",
                    m.kind
                )));
            }
            continue;
        }
        for i in hits {
            used[i] = true;
        }
        chosen.push(Target {
            path: path.to_owned(),
            in_features: m.int_attr("in_features", None)?,
            out_features: m.int_attr("out_features", None)?,
        });
    }
    if let Some(i) = used.iter().position(|u| !u) {
        let mut names: Vec<&str> = modules
            .iter()
            .filter(|m| matches!(m.kind.as_str(), "linear" | KIND))
            .filter_map(|m| m.path.as_str().rsplit('.').next())
            .collect();
        names.sort_unstable();
        names.dedup();
        let names = if names.is_empty() {
            "the model has none".to_owned()
        } else {
            format!("the model's are named {}", names.join(", "))
        };
        return Err(Error::config(format!(
            "`target_modules` entry {:?} matches no linear layer ({names})",
            patterns[i].as_str()
        )));
    }
    Ok(chosen)
}

/// The adapter on one linear layer: `y = W x + b + scaling · B (A dropout(x))`, as PEFT's
/// `lora.Linear.forward`.
struct LoraLinear {
    a: Tensor,
    b: Tensor,
    scaling: f64,
    dropout: f64,
    r: i64,
    lora_alpha: f64,
    use_rslora: bool,
}

impl LoraLinear {
    /// `scaling · B A`, the change the adapter makes to the weight.
    fn delta_weight(&self) -> Result<Tensor, Error> {
        Ok(self.b.f_matmul(&self.a)?.f_mul_scalar(self.scaling)?)
    }
}

impl Wrapper for LoraLinear {
    fn kind(&self) -> &str {
        KIND
    }

    fn attrs(&self) -> Vec<(String, f64)> {
        vec![
            ("r".to_owned(), self.r as f64),
            ("lora_alpha".to_owned(), self.lora_alpha),
            ("lora_dropout".to_owned(), self.dropout),
            (
                "use_rslora".to_owned(),
                f64::from(u8::from(self.use_rslora)),
            ),
        ]
    }

    fn forward(&self, x: &Tensor, train: bool, inner: &mut Inner<'_>) -> Result<Tensor, Error> {
        let y = inner.forward(x, train)?;
        let h = if train && self.dropout > 0.0 {
            x.f_dropout(self.dropout, true)?
        } else {
            x.shallow_clone()
        };
        let low = h.f_matmul(&self.a.f_tr()?)?.f_matmul(&self.b.f_tr()?)?;
        Ok(y.f_add(&low.f_mul_scalar(self.scaling)?)?)
    }

    /// The merged layer: `weight + scaling · B A` (in the weight's dtype), the bias unchanged,
    /// so the export is the plain model with the adapter folded in.
    fn export(&self, inner: Vec<(String, Tensor)>) -> Result<Option<Vec<(String, Tensor)>>, Error> {
        let _no_grad = tessera_plugin_api::tch::no_grad_guard();
        let mut out = Vec::with_capacity(inner.len());
        for (name, t) in inner {
            if name == "weight" {
                let delta = self.delta_weight()?.f_to_kind(t.kind())?;
                out.push((name, t.f_add(&delta)?));
            } else {
                out.push((name, t));
            }
        }
        Ok(Some(out))
    }
}

/// The LoRA method.
pub struct Lora {
    r: i64,
    lora_alpha: f64,
    dropout: f64,
    use_rslora: bool,
    patterns: Option<Vec<TargetPattern>>,
}

/// PEFT's default initialisation of `lora_A`: `kaiming_uniform_(a=√5)`, which is
/// `U(−1/√in, 1/√in)`, drawn from the host's seeded stream (`lora_B` starts at zero, so the
/// adapted model starts as the base model).
fn lora_a(ctx: &mut Context<'_>, r: i64, fan_in: i64, like: &Tensor) -> Result<Tensor, Error> {
    let bound = 1.0 / (fan_in as f64).sqrt();
    let values: Vec<f32> = (0..r * fan_in)
        .map(|_| ((2.0 * ctx.rng_f64() - 1.0) * bound) as f32)
        .collect();
    Ok(Tensor::f_from_slice(&values)?
        .f_view([r, fan_in])?
        .f_to_kind(like.kind())?
        .f_to_device(like.device())?
        .set_requires_grad(true))
}

impl Method for Lora {
    fn on_event(&mut self, _event: Event, ctx: &mut Context<'_>) -> Result<(), Error> {
        let modules = ctx.modules()?;
        let patterns = match &self.patterns {
            Some(p) => p.clone(),
            None => {
                let root = modules.first().map(|m| m.kind.as_str()).unwrap_or("");
                default_targets(root)
                    .ok_or_else(|| {
                        Error::config(format!(
                            "no default `target_modules` for a {root} model: name the linear \
                             layers to adapt (`target_modules = [\"q_proj\", \"v_proj\"]` or globs \
                             over their paths)"
                        ))
                    })?
                    .into_iter()
                    .map(TargetPattern::parse)
                    .collect::<Result<_, _>>()?
            }
        };
        let chosen = targets(&modules, &patterns)?;
        let scale = scaling(self.lora_alpha, self.r, self.use_rslora);
        let mut adapter_names = Vec::with_capacity(2 * chosen.len());
        let mut adapter_size = 0i64;
        for t in &chosen {
            let like = ctx
                .parameter(&format!("{}.weight", t.path))?
                .ok_or_else(|| format!("linear layer `{}` has no weight", t.path))?;
            let a = lora_a(ctx, self.r, t.in_features, &like)?;
            let b = Tensor::f_zeros([t.out_features, self.r], (like.kind(), like.device()))?
                .set_requires_grad(true);
            adapter_size += a.numel() as i64 + b.numel() as i64;
            let wrapper = LoraLinear {
                a: a.shallow_clone(),
                b: b.shallow_clone(),
                scaling: scale,
                dropout: self.dropout,
                r: self.r,
                lora_alpha: self.lora_alpha,
                use_rslora: self.use_rslora,
            };
            ctx.wrap_module(&t.path, wrapper, None, vec![(LORA_A, a), (LORA_B, b)])?;
            adapter_names.push(format!("{}.{LORA_A}", t.path));
            adapter_names.push(format!("{}.{LORA_B}", t.path));
        }
        // The base model is frozen: no gradients, no optimizer state, no updates.
        let mut frozen = 0i64;
        for p in ctx.parameters()? {
            if p.buffer || adapter_names.iter().any(|n| n == p.name.as_str()) {
                continue;
            }
            frozen += p.shape.iter().product::<i64>();
            if p.trainable {
                ctx.set_trainable(p.name.as_str(), false)?;
            }
        }
        ctx.log_metric("lora/adapted_layers", chosen.len() as f64);
        ctx.log_metric("lora/trainable_parameters", adapter_size as f64);
        ctx.info(&format!(
            "lora: rank-{} adapters on {} linear layers ({}); {} trainable parameters, {} frozen ({:.2}% trained)",
            self.r,
            chosen.len(),
            summary(&chosen),
            adapter_size,
            frozen,
            100.0 * adapter_size as f64 / (adapter_size + frozen).max(1) as f64
        ));
        Ok(())
    }
}

/// `24 × q_proj, v_proj`-style summary of the adapted layers' names.
fn summary(chosen: &[Target]) -> String {
    let mut names: Vec<&str> = chosen
        .iter()
        .filter_map(|t| t.path.rsplit('.').next())
        .collect();
    names.sort_unstable();
    let mut counted: Vec<(usize, &str)> = Vec::new();
    for n in names {
        match counted.last_mut() {
            Some((c, last)) if *last == n => *c += 1,
            _ => counted.push((1, n)),
        }
    }
    counted
        .iter()
        .map(|(c, n)| format!("{c} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl Plugin for Lora {
    const NAME: &'static str = "lora";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const DESCRIPTION: &'static str =
        "low-rank adapters on chosen linear layers; the base model is frozen (LoRA, PEFT's names)";
    const DEFAULT_SETTINGS: &'static str = "r = 8\nlora_alpha = 8.0\nlora_dropout = 0.0";

    fn hooks() -> Vec<Hook> {
        vec![Hook::at(Event::INIT)]
    }

    fn create(settings: &Settings) -> Result<Self, Error> {
        let r = settings.u64("r")?;
        if r == 0 {
            return Err(Error::config("`r` (the adapters' rank) must be at least 1"));
        }
        let lora_alpha = settings.f64("lora_alpha")?;
        if !(lora_alpha.is_finite() && lora_alpha > 0.0) {
            return Err(Error::config(format!(
                "`lora_alpha` must be a positive number, got {lora_alpha}"
            )));
        }
        let dropout = settings.f64("lora_dropout")?;
        if !(0.0..1.0).contains(&dropout) {
            return Err(Error::config(format!(
                "`lora_dropout` must be in [0, 1), got {dropout}"
            )));
        }
        let use_rslora = settings.bool_or("use_rslora", false)?;
        let patterns: Option<Vec<String>> = settings.get_or("target_modules", None)?;
        let patterns = match patterns {
            Some(p) if p.is_empty() => {
                return Err(Error::config(
                    "`target_modules` is empty: name at least one linear layer",
                ))
            }
            Some(p) => Some(
                p.iter()
                    .map(|s| TargetPattern::parse(s))
                    .collect::<Result<_, _>>()?,
            ),
            None => None,
        };
        Ok(Lora {
            r: r as i64,
            lora_alpha,
            dropout,
            use_rslora,
            patterns,
        })
    }
}

export_plugin!(Lora);

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_plugin_api::abi::Attribute;

    fn module(path: &str, kind: &str, io: Option<(i64, i64)>) -> ModuleInfo {
        let attrs = io
            .map(|(i, o)| {
                vec![
                    Attribute {
                        key: "in_features".into(),
                        value: i as f64,
                    },
                    Attribute {
                        key: "out_features".into(),
                        value: o as f64,
                    },
                ]
            })
            .unwrap_or_default();
        ModuleInfo {
            path: path.into(),
            kind: kind.into(),
            attrs: attrs.into_iter().collect(),
            params: Default::default(),
        }
    }

    fn llama() -> Vec<ModuleInfo> {
        let mut m = vec![module("", "llama_for_causal_lm", None)];
        for i in 0..2 {
            m.push(module(
                &format!("model.layers.{i}.self_attn"),
                "llama_attention",
                None,
            ));
            for p in ["q_proj", "k_proj", "v_proj", "o_proj"] {
                m.push(module(
                    &format!("model.layers.{i}.self_attn.{p}"),
                    "linear",
                    Some((32, 32)),
                ));
            }
        }
        m.push(module("lm_head", "linear", Some((32, 97))));
        m
    }

    fn parse(p: &[&str]) -> Vec<TargetPattern> {
        p.iter().map(|s| TargetPattern::parse(s).unwrap()).collect()
    }

    fn paths(t: &[Target]) -> Vec<&str> {
        t.iter().map(|t| t.path.as_str()).collect()
    }

    #[test]
    fn names_match_the_last_components_and_globs_the_whole_path() {
        let m = llama();
        let t = targets(&m, &parse(&["q_proj", "v_proj"])).unwrap();
        assert_eq!(
            paths(&t),
            [
                "model.layers.0.self_attn.q_proj",
                "model.layers.0.self_attn.v_proj",
                "model.layers.1.self_attn.q_proj",
                "model.layers.1.self_attn.v_proj"
            ]
        );
        let t = targets(&m, &parse(&["model.layers.1.*"])).unwrap();
        assert_eq!(t.len(), 4);
        assert!(t.iter().all(|t| t.path.starts_with("model.layers.1.")));
        // `proj` is not `q_proj`: a name matches whole components.
        let e = targets(&m, &parse(&["proj"])).unwrap_err().to_string();
        assert!(e.contains("\"proj\" matches no linear layer"), "{e}");
        assert!(e.contains("k_proj, lm_head, o_proj, q_proj, v_proj"), "{e}");
        let e = targets(&m, &parse(&["model.layers.0.self_attn"]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("a llama_attention module"), "{e}");
    }

    #[test]
    fn scaling_is_alpha_over_r_or_over_its_root() {
        assert_eq!(scaling(16.0, 8, false), 2.0);
        assert_eq!(scaling(16.0, 4, true), 8.0);
    }
}
