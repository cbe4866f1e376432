//! The zoo's GPT-2 (`[model] name = "gpt2"`): it computes what Hugging Face's
//! `GPT2LMHeadModel` computes (Composer's golden `alibi_surgery` case holds a tiny HF GPT-2's
//! weights, token ids and logits, read generically), its module tree follows the documented
//! contract for method plugins (kinds, attributes, tensor names and shapes; `transformer.wpe`
//! replaceable so that longer inputs work), tied embeddings are one tensor, dropout acts only in
//! training, a too-long input is a clear error, bf16 autocast stays close to fp32, and its
//! export loads strictly into Hugging Face's model (and the plain-PyTorch twin of
//! `scripts/pytorch_models.py`) with the same logits.
//!
//! The PyTorch comparisons need `import torch` (see tests/models/export.rs); the one against
//! Hugging Face's own class needs `import transformers` too (`scripts/ensure-transformers.sh`
//! installs it; put the folder it prints on `TESSERA_TORCH_PYTHONPATH`). It is skipped with a
//! notice when transformers does not import, unless `TESSERA_REQUIRE_TRANSFORMERS=1`.

use std::collections::BTreeSet;

use tessera::export::{aliases, export_model};
use tessera::model::{Attr, Gpt2Config, InputShape, Layer, Model, ModelConfig, ModelName};
use tessera::precision::{AutocastGuard, Precision};
use tessera_plugin_api::tch::{self, Device, Kind, TchError, Tensor};
use tessera_plugin_api::testing::golden::Golden;
use tessera_tests::{python_can_import, python_with_env, transformers_imports, TempDir};

#[path = "../support/gpt2_golden.rs"]
mod gpt2_golden;
use gpt2_golden::{compare_unpadded, golden_sizes, PARAM};

/// gpt2 ignores the image input shape; any will do.
const INPUT: InputShape = InputShape {
    channels: 1,
    height: 1,
    width: 1,
};

fn gpt2_config(sizes: Gpt2Config, vocab: usize, dropout: f64) -> ModelConfig {
    let mut c = ModelConfig::new(ModelName::Gpt2, vocab);
    c.gpt2 = Some(sizes);
    c.dropout = dropout;
    c
}

fn build(config: &ModelConfig) -> Model {
    Model::build(config, INPUT, config.num_classes as i64, Device::Cpu).expect("gpt2 builds")
}

/// A small GPT-2: 2 layers, 2 heads, 16 features, a context of 16, `vocab` tokens.
fn small(vocab: usize, dropout: f64, tied: bool) -> ModelConfig {
    let sizes = Gpt2Config {
        n_layer: 2,
        n_head: 2,
        n_embd: 16,
        n_positions: 16,
        tie_embeddings: tied,
        ..Gpt2Config::default()
    };
    gpt2_config(sizes, vocab, dropout)
}

/// The golden model's config (see [`golden_sizes`]), without dropout.
fn golden_config(g: &Golden) -> ModelConfig {
    let (sizes, vocab) = golden_sizes(g);
    gpt2_config(sizes, vocab, 0.0)
}

/// Our GPT-2 of the golden config holding the golden (Hugging Face) weights, loaded by name.
fn golden_model(g: &Golden) -> Model {
    let model = build(&golden_config(g));
    let saved: Vec<(String, Tensor)> = model
        .params
        .entries()
        .iter()
        .map(|e| {
            let t = g.tensor(&format!("{PARAM}{}", e.name));
            (e.name.clone(), t.shallow_clone())
        })
        .collect();
    model
        .params
        .restore(&saved)
        .expect("the golden weights fit");
    model
}

#[test]
fn the_golden_hugging_face_gpt2_weights_give_its_logits() {
    let g = Golden::load("alibi_surgery");
    let model = golden_model(&g);
    // Every Hugging Face state_dict name is ours: the store's, plus the tied head's second name.
    let mut ours: BTreeSet<String> = model
        .params
        .entries()
        .iter()
        .map(|e| e.name.clone())
        .collect();
    let tied = aliases(&model).expect("aliases");
    assert_eq!(
        tied,
        [(
            "lm_head.weight".to_owned(),
            "transformer.wte.weight".to_owned()
        )]
    );
    ours.extend(tied.into_iter().map(|(alias, _)| alias));
    let theirs: BTreeSet<String> = g
        .tensors
        .keys()
        .filter_map(|k| k.strip_prefix(PARAM).map(str::to_owned))
        .collect();
    assert_eq!(ours, theirs, "parameter names");
    // Hugging Face ties them too: the golden head is the golden token embedding.
    assert!(g
        .tensor(&format!("{PARAM}lm_head.weight"))
        .equal(g.tensor(&format!("{PARAM}transformer.wte.weight"))));

    let ids = g.tensor("gpt2/input_ids");
    let logits = tch::no_grad(|| model.forward(ids, false)).expect("forward");
    let mask = g.tensor("gpt2/attention_mask");
    let diff = compare_unpadded(
        "logits before the surgery",
        &logits,
        g.tensor("gpt2/before/logits"),
        mask,
        1e-5,
    );
    println!("gpt2 vs Hugging Face GPT2LMHeadModel (golden): max abs logits difference {diff:e}");
}

/// What ALiBi puts in place of `transformer.wpe`: no learned positions (zeros), for any length.
#[derive(Debug)]
struct ZeroPositions {
    n_embd: i64,
}

impl Layer for ZeroPositions {
    fn kind(&self) -> &str {
        "zero_positions"
    }

    fn forward(&self, positions: &Tensor, _train: bool) -> Result<Tensor, TchError> {
        let mut size = positions.size();
        size.push(self.n_embd);
        Tensor::f_zeros(size.as_slice(), (Kind::Float, positions.device()))
    }
}

#[test]
fn replacing_the_position_embedding_gives_the_golden_positionless_logits_at_any_length() {
    let g = Golden::load("alibi_surgery");
    let mut model = golden_model(&g);
    let long = g.tensor("gpt2/input_ids_long");
    let n_positions = g.tensor(&format!("{PARAM}transformer.wpe.weight")).size()[0];
    assert!(long.size()[1] > n_positions);
    // Too long for the learned positions: a clear error, not a libtorch index assertion.
    let e = model.forward(long, false).unwrap_err().to_string();
    assert!(
        e.contains(&format!("{} tokens", long.size()[1]))
            && e.contains(&format!("context of {n_positions}"))
            && e.contains("n_positions"),
        "{e}"
    );
    let n_embd = g.tensor(&format!("{PARAM}transformer.wpe.weight")).size()[1];
    model
        .replace_module("transformer.wpe", Box::new(ZeroPositions { n_embd }))
        .expect("wpe is replaceable");
    assert!(model.params.get("transformer.wpe.weight").is_none());
    let logits =
        tch::no_grad(|| model.forward(g.tensor("gpt2/input_ids"), false)).expect("forward");
    let diff = compare_unpadded(
        "logits with zeroed positions",
        &logits,
        g.tensor("gpt2/zero_positions_only/logits"),
        g.tensor("gpt2/attention_mask"),
        1e-5,
    );
    println!("gpt2 with zeroed positions vs Hugging Face: max abs difference {diff:e}");
    // Nothing else limits the length.
    let out = tch::no_grad(|| model.forward(long, false)).expect("a long input runs");
    let vocab = g.tensor(&format!("{PARAM}transformer.wte.weight")).size()[0];
    assert_eq!(out.size(), [1, long.size()[1], vocab]);
}

/// The identity, for replacing a block's child.
#[derive(Debug)]
struct Identity;

impl Layer for Identity {
    fn kind(&self) -> &str {
        "identity"
    }

    fn forward(&self, xs: &Tensor, _train: bool) -> Result<Tensor, TchError> {
        Ok(xs.shallow_clone())
    }
}

#[test]
fn the_module_tree_follows_the_plugin_contract() {
    let (v, c, p, l) = (11i64, 16i64, 16i64, 2i64);
    let model = build(&small(v as usize, 0.1, true));
    let walk = model.root.walk();
    let node = |path: &str| {
        walk.iter()
            .find(|i| i.path == path)
            .unwrap_or_else(|| panic!("no module at `{path}`"))
    };
    for (path, kind) in [
        ("", "gpt2_lm_head_model"),
        ("transformer", "gpt2_model"),
        ("transformer.wte", "embedding"),
        ("transformer.wpe", "embedding"),
        ("transformer.drop", "dropout"),
        ("transformer.h.1", "gpt2_block"),
        ("transformer.h.1.ln_1", "layer_norm"),
        ("transformer.h.1.attn", "gpt2_attention"),
        ("transformer.h.1.ln_2", "layer_norm"),
        ("transformer.h.1.mlp", "gpt2_mlp"),
        ("transformer.ln_f", "layer_norm"),
        ("lm_head", "tied_lm_head"),
    ] {
        assert_eq!(node(path).kind, kind, "{path}");
    }
    let attn = &node("transformer.h.0.attn").attrs;
    assert_eq!(attn["n_head"], Attr::Int(2));
    assert_eq!(attn["n_embd"], Attr::Int(c));
    assert_eq!(attn["n_positions"], Attr::Int(p));
    assert_eq!(attn["attn_pdrop"], Attr::Float(0.1));
    assert_eq!(attn["resid_pdrop"], Attr::Float(0.1));
    let mlp = &node("transformer.h.0.mlp").attrs;
    assert_eq!(mlp["n_inner"], Attr::Int(4 * c));
    assert_eq!(mlp["resid_pdrop"], Attr::Float(0.1));
    assert_eq!(
        node("transformer.wpe").attrs["num_embeddings"],
        Attr::Int(p)
    );
    assert_eq!(node("transformer.ln_f").attrs["eps"], Attr::Float(1e-5));
    // Hugging Face's names, shapes and order; the tied head holds no tensor of its own.
    let shape = |n: &str| model.params.get(n).map(|e| e.tensor.size());
    for (name, want) in [
        ("transformer.wte.weight", vec![v, c]),
        ("transformer.wpe.weight", vec![p, c]),
        ("transformer.h.1.ln_1.weight", vec![c]),
        ("transformer.h.1.attn.c_attn.weight", vec![c, 3 * c]),
        ("transformer.h.1.attn.c_attn.bias", vec![3 * c]),
        ("transformer.h.1.attn.c_proj.weight", vec![c, c]),
        ("transformer.h.1.mlp.c_fc.weight", vec![c, 4 * c]),
        ("transformer.h.1.mlp.c_proj.weight", vec![4 * c, c]),
        ("transformer.h.1.mlp.c_proj.bias", vec![c]),
        ("transformer.ln_f.bias", vec![c]),
    ] {
        assert_eq!(shape(name), Some(want), "{name}");
    }
    assert!(model.params.get("lm_head.weight").is_none());
    assert_eq!(node("transformer.h.0.attn").tensors.len(), 4);
    // Hugging Face's `sum(p.numel() for p in model.parameters())` (tied weights once).
    let block =
        2 * c + (c * 3 * c + 3 * c) + (c * c + c) + 2 * c + (c * 4 * c + 4 * c) + (4 * c * c + c);
    assert_eq!(
        model.params.num_trainable_scalars(),
        v * c + p * c + l * block + 2 * c
    );
    // Hugging Face's initialisation: LayerNorm 1/0, zero biases, c_proj with a smaller std.
    let t = |n: &str| {
        model
            .params
            .get(n)
            .map(|e| e.tensor.shallow_clone())
            .unwrap()
    };
    assert_eq!(
        t("transformer.h.0.ln_1.weight")
            .mean(Kind::Float)
            .double_value(&[]),
        1.0
    );
    assert_eq!(
        t("transformer.h.0.attn.c_attn.bias")
            .abs()
            .sum(Kind::Float)
            .double_value(&[]),
        0.0
    );
    let std = |n: &str| t(n).std(true).double_value(&[]);
    assert!((std("transformer.h.0.mlp.c_fc.weight") - 0.02).abs() < 0.003);
    let proj = 0.02 / (2.0 * l as f64).sqrt();
    assert!((std("transformer.h.0.mlp.c_proj.weight") - proj).abs() < 0.0015);

    // Untied: the head is a bias-free `linear` with its own weight.
    let untied = build(&small(v as usize, 0.0, false));
    let head = untied
        .root
        .walk()
        .into_iter()
        .find(|i| i.path == "lm_head")
        .unwrap();
    assert_eq!(
        (head.kind.as_str(), head.tensors.as_slice()),
        ("linear", &["lm_head.weight".to_owned()][..])
    );
    assert_eq!(head.attrs["bias"], Attr::Bool(false));
    assert_eq!(
        untied.params.num_trainable_scalars(),
        v * c + v * c + p * c + l * block + 2 * c
    );
    assert!(aliases(&untied).unwrap().is_empty());

    // A block's children are replaceable by path, their tensors leaving the store.
    let mut model = model;
    model
        .replace_module("transformer.h.0.ln_1", Box::new(Identity))
        .expect("ln_1 is replaceable");
    assert!(model.params.get("transformer.h.0.ln_1.weight").is_none());
    let ids = Tensor::from_slice(&[1i64, 2, 3, 4]).view([1, 4]);
    assert_eq!(model.forward(&ids, false).unwrap().size(), [1, 4, v]);
    // Wrong inputs are errors.
    assert!(model.forward(&ids.to_kind(Kind::Float), false).is_err());
    // An id outside the vocabulary: the trainer refuses it on the host before the batch is
    // uploaded, against the token embedding's rows (`token_rows`); a direct forward gets
    // libtorch's own error (the layer checks nothing on the device: that would be a read).
    assert_eq!(model.token_rows(), Some(v));
    let out_of_vocab = Tensor::from_slice(&[1i64, v]).view([1, 2]);
    let e = model.forward(&out_of_vocab, false).unwrap_err().to_string();
    assert!(e.contains("index out of range"), "{e}");
}

#[test]
fn sizes_that_do_not_fit_are_errors_naming_the_key() {
    let mut odd = small(11, 0.0, true);
    if let Some(g) = odd.gpt2.as_mut() {
        g.n_head = 3;
    }
    let e = Model::build(&odd, INPUT, 11, Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(e.contains("n_embd") && e.contains("n_head"), "{e}");
    let mut narrow = small(11, 0.0, true);
    if let Some(g) = narrow.gpt2.as_mut() {
        g.vocab_size = Some(5);
    }
    let e = Model::build(&narrow, INPUT, 11, Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(e.contains("vocab_size"), "{e}");
}

#[test]
fn tied_embeddings_are_one_tensor_with_both_gradients() {
    tch::manual_seed(3);
    let tied = build(&small(13, 0.0, true));
    let untied = build(&small(13, 0.0, false));
    // The same weights, the untied head a copy of the token embedding.
    let mut saved: Vec<(String, Tensor)> = tied.params.named_tensors();
    let wte = tied
        .params
        .get("transformer.wte.weight")
        .unwrap()
        .tensor
        .copy();
    saved.push(("lm_head.weight".to_owned(), wte));
    untied.params.restore(&saved).expect("same weights");
    let ids = Tensor::from_slice(&[1i64, 5, 7, 2, 12, 0]).view([2, 3]);
    let loss = |m: &Model| m.forward(&ids, true).unwrap().square().sum(Kind::Float);
    loss(&tied).backward();
    loss(&untied).backward();
    let grad = |m: &Model, n: &str| m.params.get(n).unwrap().tensor.grad();
    let both = grad(&untied, "transformer.wte.weight") + grad(&untied, "lm_head.weight");
    let g = grad(&tied, "transformer.wte.weight");
    assert!(
        g.allclose(&both, 1e-5, 1e-6, false),
        "the tied gradient is the sum of both uses"
    );
    // The optimizer sees it once: no two trainable entries share storage.
    let ptrs: Vec<usize> = tied
        .params
        .trainable()
        .map(|e| e.tensor.data_ptr() as usize)
        .collect();
    let unique: BTreeSet<usize> = ptrs.iter().copied().collect();
    assert_eq!(ptrs.len(), unique.len());
    // An in-place update of the embedding (what the optimizer does) moves the head too.
    let before = tch::no_grad(|| tied.forward(&ids, false)).unwrap();
    tch::no_grad(|| {
        let mut w = tied
            .params
            .get("transformer.wte.weight")
            .unwrap()
            .tensor
            .shallow_clone();
        let step = w.randn_like() * 0.1;
        let _ = w.g_add_(&step);
    });
    let after = tch::no_grad(|| tied.forward(&ids, false)).unwrap();
    assert!(!after.allclose(&before, 1e-3, 1e-3, false));
    let tree = tied.root.export_tree().unwrap();
    let head = &tree
        .tensors
        .iter()
        .find(|(n, _)| n == "lm_head.weight")
        .unwrap()
        .1;
    assert!(head.equal(&tied.params.get("transformer.wte.weight").unwrap().tensor));
}

#[test]
fn dropout_acts_in_training_only() {
    tch::manual_seed(5);
    let dropped = build(&small(17, 0.2, true));
    let plain = build(&small(17, 0.0, true));
    plain
        .params
        .restore(&dropped.params.named_tensors())
        .expect("same names");
    let ids = Tensor::from_slice(&[3i64, 1, 4, 1, 5, 9, 2, 6]).view([2, 4]);
    let run = |m: &Model, train| tch::no_grad(|| m.forward(&ids, train)).unwrap();
    let eval = run(&dropped, false);
    assert!(
        eval.equal(&run(&dropped, false)),
        "evaluation is deterministic"
    );
    assert!(
        eval.equal(&run(&plain, false)),
        "evaluation ignores dropout"
    );
    let (a, b) = (run(&dropped, true), run(&dropped, true));
    assert!(
        !a.allclose(&b, 1e-4, 1e-4, false),
        "training draws new masks"
    );
    assert!(!a.allclose(&eval, 1e-4, 1e-4, false), "training drops");
    assert!(
        run(&plain, true).allclose(&eval, 1e-6, 1e-6, false),
        "p = 0 drops nothing"
    );
}

#[test]
fn bf16_autocast_logits_stay_close_to_fp32() {
    tch::manual_seed(7);
    let model = build(&small(50, 0.0, true));
    let ids = Tensor::randint(50, [2, 16], (Kind::Int64, Device::Cpu));
    let fp32 = tch::no_grad(|| model.forward(&ids, false)).unwrap();
    let bf16 = {
        let _guard = AutocastGuard::new(Precision::AmpBf16, Device::Cpu);
        tch::no_grad(|| model.forward(&ids, false)).unwrap()
    };
    assert_eq!(
        bf16.kind(),
        Kind::BFloat16,
        "autocast runs the head in bf16"
    );
    let diff = (bf16.to_kind(Kind::Float) - &fp32)
        .abs()
        .max()
        .double_value(&[]);
    let scale = fp32.abs().max().double_value(&[]);
    println!("gpt2 bf16 autocast vs fp32: max abs logits difference {diff:e} (scale {scale:e})");
    assert!(diff <= 0.02 * scale, "{diff} vs scale {scale}");
}

/// Runs scripts/check_export.py as tessera_tests' `check_export` does, with `twin` forcing the
/// plain-PyTorch GPT-2 of scripts/pytorch_models.py over Hugging Face's.
fn check_export(
    exported: &std::path::Path,
    case: &std::path::Path,
    twin: bool,
) -> (Option<i32>, String) {
    let out = python_with_env(
        &[
            "scripts/check_export.py",
            exported.to_str().expect("a UTF-8 temp path"),
            case.to_str().expect("a UTF-8 temp path"),
        ],
        &[("TESSERA_GPT2_TWIN", if twin { "1" } else { "0" })],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

#[test]
fn the_export_loads_strictly_into_hugging_face_gpt2_with_the_same_logits() {
    tch::manual_seed(11);
    let config = small(50, 0.1, true);
    let model = build(&config);
    // Weights as after some training (GPT-2's init gives logits too small to tell much apart).
    tch::no_grad(|| {
        for e in model.params.entries() {
            let mut t = e.tensor.shallow_clone();
            let noise = t.randn_like() * 0.3;
            let _ = t.g_add_(&noise);
        }
    });
    let dir = TempDir::new("gpt2-export");
    let exported = dir.join("gpt2.safetensors");
    let json = serde_json::to_value(&config).expect("the config serializes");
    let summary = export_model(&model, &json, INPUT, &[], &exported).expect("export");
    // The store's tensors plus `lm_head.weight`; parameters counted once, as PyTorch does.
    assert_eq!(summary.tensors, model.params.entries().len() + 1);
    assert_eq!(summary.parameters, model.params.num_trainable_scalars());
    let written = Tensor::read_safetensors(&exported).expect("the export reads");
    let names: BTreeSet<&str> = written.iter().map(|(n, _)| n.as_str()).collect();
    assert!(names.contains("lm_head.weight") && names.contains("transformer.wte.weight"));
    let get = |n: &str| &written.iter().find(|(m, _)| m == n).unwrap().1;
    assert!(get("lm_head.weight").equal(get("transformer.wte.weight")));

    let ids = Tensor::randint(50, [3, 12], (Kind::Int64, Device::Cpu));
    let logits = tch::no_grad(|| model.forward(&ids, false)).expect("eval forward");
    let case = dir.join("case.safetensors");
    Tensor::write_safetensors(&[("input", &ids), ("output", &logits)], &case).expect("case");
    if !python_can_import("torch", "the gpt2 export") {
        return;
    }
    let (code, text) = check_export(&exported, &case, true);
    assert_eq!(
        code,
        Some(0),
        "check_export.py, plain-PyTorch twin:\n{text}"
    );
    assert!(text.contains("pytorch_models.GPT2LMHeadModel"), "{text}");
    eprintln!("gpt2 export vs the PyTorch twin: {}", text.trim());
    // A wrong output fails the check.
    let bad = dir.join("bad.safetensors");
    Tensor::write_safetensors(&[("input", &ids), ("output", &(&logits + 0.5))], &bad)
        .expect("bad case");
    assert_eq!(check_export(&exported, &bad, true).0, Some(1));
    if !transformers_imports() {
        return;
    }
    let (code, text) = check_export(&exported, &case, false);
    assert_eq!(code, Some(0), "check_export.py, Hugging Face:\n{text}");
    assert!(
        text.contains("transformers.models.gpt2.modeling_gpt2.GPT2LMHeadModel"),
        "not checked against Hugging Face's class:\n{text}"
    );
    println!("gpt2 export vs Hugging Face: {}", text.trim());
}
