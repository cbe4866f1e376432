//! BERT (`[model] name = "bert"`): Hugging Face's `BertForMaskedLM` and
//! `BertForSequenceClassification` computed and named as transformers does, and Composer's
//! GatedLinearUnits and ALiBi on it against their goldens.
//!
//! - Weights in and out: tiny BERTs saved by transformers' `save_pretrained`
//!   (`tests/support/bert_reference.py`, random weights, nothing downloaded) load with
//!   `init_weights` and give transformers' logits, padding mask included; the export loads back
//!   into transformers' models with nothing missing or unexpected and the same logits.
//! - Goldens: the real `libgated_linear_units.so` and `libalibi.so` apply their surgery at
//!   `init` of an in-process trainer whose model has the golden BERT's sizes; with Composer's
//!   weights (and the new layers' weights Composer drew) loaded by name, the logits are
//!   Composer's (`gated_linear_units`: `before`, `default`, `bias_relu`; `alibi_surgery`:
//!   `bert/before`, `bert/after`, and `T = 24` beyond the original 16 positions).
//! - Through the binary: a masked LM trains with both plugins, and resumes bit for bit.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde_json::{json, Value};
use tessera::config;
use tessera::export::export_model;
use tessera::model::{
    load_init_weights, read_state_dict, BertConfig, BertHead, InputShape, Model, ModelConfig,
    ModelName, Role,
};
use tessera::trainer::Trainer;
use tessera_plugin_api::tch::{self, Device, Kind, Tensor};
use tessera_plugin_api::testing::golden::Golden;
use tessera_tests::export::{check_hf_export, export_hf};
use tessera_tests::resume::assert_killed_and_resumed_is_exact;
use tessera_tests::*;

/// The vocabulary of the reference BERTs and of the text the runs train on.
const VOCAB: usize = 64;

/// Any image shape: a text model ignores it.
const NO_IMAGES: InputShape = InputShape {
    channels: 1,
    height: 1,
    width: 1,
};

/// The folder of the reference files, made once per test binary; `None` (after a notice) when
/// transformers does not import.
fn references() -> Option<&'static Path> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        if !transformers_imports() {
            return None;
        }
        let dir = process_dir("bert-references");
        let out = python(&[
            "tests/support/bert_reference.py",
            "make",
            &dir.display().to_string(),
            &VOCAB.to_string(),
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            out.status.success(),
            "bert_reference.py failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Some(dir)
    })
    .as_deref()
}

fn tensor<'a>(tensors: &'a [(String, Tensor)], name: &str) -> &'a Tensor {
    &tensors
        .iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("no tensor `{name}`"))
        .1
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.size(), b.size());
    (a.to_kind(Kind::Double) - b.to_kind(Kind::Double))
        .abs()
        .max()
        .double_value(&[])
}

/// The reference BERTs' sizes with `head` (a classifier of `classes`).
fn tiny_bert(head: BertHead, classes: usize) -> ModelConfig {
    let mut c = ModelConfig::new(ModelName::Bert, classes);
    c.bert = Some(BertConfig {
        n_layer: 2,
        n_head: 2,
        n_embd: 32,
        n_inner: 64,
        n_positions: 32,
        vocab_size: (head == BertHead::Classification).then_some(VOCAB),
        head,
        ..BertConfig::default()
    });
    c
}

/// The model's evaluation logits for `ids` with `mask`.
fn logits(model: &Model, ids: &Tensor, mask: Option<&Tensor>) -> Tensor {
    tch::no_grad(|| model.forward_masked(ids, mask, None, false)).unwrap_or_else(|e| panic!("{e}"))
}

/// Writes the model's export and checks it in transformers: nothing missing or unexpected, the
/// same logits for the reference ids and mask.
fn check_in_transformers(model: &Model, kind: &str, refs: &Path, ours: &Tensor, dir: &TempDir) {
    let exported = dir.join(&format!("{kind}-export.safetensors"));
    export_model(model, &json!({}), NO_IMAGES, &[], &exported).unwrap_or_else(|e| panic!("{e}"));
    let io = read_state_dict(&refs.join("io.safetensors")).unwrap();
    let check_io = dir.join(&format!("{kind}-io.safetensors"));
    Tensor::write_safetensors(
        &[
            ("ids", tensor(&io, "ids")),
            ("attention_mask", tensor(&io, "attention_mask")),
            ("logits", ours),
        ],
        &check_io,
    )
    .unwrap();
    let out = python(&[
        "tests/support/bert_reference.py",
        "check",
        kind,
        &refs.join(kind).display().to_string(),
        &exported.display().to_string(),
        &check_io.display().to_string(),
    ])
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report: Value = serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!(report["missing"], json!([]), "{kind}: {report}");
    assert_eq!(report["unexpected"], json!([]), "{kind}: {report}");
    let diff = report["max_abs_diff"].as_f64().unwrap();
    println!("{kind}: the export in transformers, max abs logits difference {diff:e}");
    assert!(diff < 1e-5, "{kind}: {report}");
}

#[test]
fn transformers_berts_load_with_their_logits_and_export_back() {
    let Some(refs) = references() else { return };
    let dir = TempDir::new("bert-hf");
    let io = read_state_dict(&refs.join("io.safetensors")).unwrap();
    let (ids, mask) = (tensor(&io, "ids"), tensor(&io, "attention_mask"));

    // BertForMaskedLM from `save_pretrained` (its tied decoder is not in the file).
    let model = Model::build(
        &tiny_bert(BertHead::MaskedLm, VOCAB),
        NO_IMAGES,
        VOCAB as i64,
        Device::Cpu,
    )
    .unwrap();
    let file = refs.join("mlm").join("model.safetensors");
    let report = load_init_weights(&model, ModelName::Bert, &file, &[], true)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(report.loaded, model.params.entries().len());
    let ours = logits(&model, ids, Some(mask));
    let diff = max_abs_diff(&ours, tensor(&io, "mlm_logits"));
    println!("bert masked LM vs transformers: max abs logits difference {diff:e}");
    assert!(diff < 1e-5, "{diff}");
    // The mask matters: without it the padded sequence's logits change, the full one's not.
    let unmasked = logits(&model, ids, None);
    assert!(unmasked.get(0).allclose(&ours.get(0), 1e-6, 1e-6, false));
    assert!(max_abs_diff(&unmasked.get(1), &ours.get(1)) > 1e-4);
    // A mask of another shape is an error, not a broadcast.
    let e = tch::no_grad(|| model.forward_masked(ids, Some(&mask.narrow(1, 0, 5)), None, false))
        .unwrap_err()
        .to_string();
    assert!(e.contains("attention_mask"), "{e}");
    check_in_transformers(&model, "mlm", refs, &ours, &dir);

    // BertForSequenceClassification (3 labels, its pooler and classifier in the file).
    let model = Model::build(
        &tiny_bert(BertHead::Classification, 3),
        NO_IMAGES,
        3,
        Device::Cpu,
    )
    .unwrap();
    let file = refs.join("cls").join("model.safetensors");
    let report = load_init_weights(&model, ModelName::Bert, &file, &[], true)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(report.loaded, model.params.entries().len());
    let ours = logits(&model, ids, Some(mask));
    assert_eq!(ours.size(), [2, 3]);
    let diff = max_abs_diff(&ours, tensor(&io, "cls_logits"));
    println!("bert classifier vs transformers: max abs logits difference {diff:e}");
    assert!(diff < 1e-5, "{diff}");
    check_in_transformers(&model, "cls", refs, &ours, &dir);

    // Fine-tuning a classifier from a masked LM: the encoder comes in, the heads start fresh.
    let fresh = Model::build(
        &tiny_bert(BertHead::Classification, 3),
        NO_IMAGES,
        3,
        Device::Cpu,
    )
    .unwrap();
    let ignore = ["cls.*", "bert.pooler.*", "classifier.*"].map(String::from);
    let report = load_init_weights(
        &fresh,
        ModelName::Bert,
        &refs.join("mlm").join("model.safetensors"),
        &ignore,
        true,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let encoder = fresh
        .params
        .entries()
        .iter()
        .filter(|e| e.name.starts_with("bert.") && !e.name.starts_with("bert.pooler."))
        .count();
    assert_eq!(report.loaded, encoder);
    // Strict without the patterns: the file's MLM head is unexpected, the pooler missing.
    let e = load_init_weights(
        &fresh,
        ModelName::Bert,
        &refs.join("mlm").join("model.safetensors"),
        &[],
        true,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("cls.predictions.bias") && e.contains("bert.pooler.dense.weight"),
        "{e}"
    );
}

// ---- goldens --------------------------------------------------------------------------------

/// The golden BERT's sizes (read from its tensors under `prefix`, heads given).
fn golden_bert(g: &Golden, prefix: &str, n_head: usize) -> (BertConfig, usize) {
    let param = |n: &str| g.tensor(&format!("{prefix}{n}")).size();
    let word = param("bert.embeddings.word_embeddings.weight");
    let layers: BTreeSet<&str> = g
        .tensors
        .keys()
        .filter_map(|k| k.strip_prefix(&format!("{prefix}bert.encoder.layer.")))
        .filter_map(|rest| rest.split('.').next())
        .collect();
    let sizes = BertConfig {
        n_layer: layers.len(),
        n_head,
        n_embd: word[1] as usize,
        n_inner: param("bert.encoder.layer.0.intermediate.dense.weight")[0] as usize,
        n_positions: param("bert.embeddings.position_embeddings.weight")[0] as usize,
        type_vocab_size: param("bert.embeddings.token_type_embeddings.weight")[0] as usize,
        ..BertConfig::default()
    };
    (sizes, word[0] as usize)
}

/// An in-process trainer of the golden BERT (masked LM over text of `vocab` tokens) with
/// `algorithm` (`[[algorithms]]` body) applied at `init`.
fn golden_trainer(sizes: &BertConfig, vocab: usize, algorithm: &str, dir: &TempDir) -> Trainer {
    let toml = format!(
        r#"run_name = "bert-golden"
seed = 3
output_dir = "runs"
[data]
{data}
[model]
name = "bert"
n_layer = {n_layer}
n_head = {n_head}
n_embd = {n_embd}
n_inner = {n_inner}
n_positions = {n_positions}
[optimizer]
name = "adamw"
lr = 1e-3
[train]
max_duration = "1ba"
progress = false
[plugins]
dirs = [{dirs}]
{algorithm}
"#,
        data = text_data(12, None).replace("vocab_size = 64", &format!("vocab_size = {vocab}")),
        n_layer = sizes.n_layer,
        n_head = sizes.n_head,
        n_embd = sizes.n_embd,
        n_inner = sizes.n_inner,
        n_positions = sizes.n_positions,
        dirs = toml_string(&target_dir().display().to_string()),
    );
    let cfg = config::from_str(&toml, dir.path(), "trainer.toml").expect("the test's config");
    Trainer::new(cfg, Vec::new()).unwrap_or_else(|e| panic!("{e}"))
}

/// Loads into `model`'s store, by name, `overrides/<name>` where the golden has it, else
/// `prefix/<name>`; buffers the surgery made are kept. Returns the names of the store.
fn load_golden(model: &Model, g: &Golden, prefix: &str, overrides: &str) -> Vec<String> {
    let mut saved = Vec::new();
    for e in model.params.entries() {
        if e.role == Role::Buffer {
            saved.push((e.name.clone(), e.tensor.copy()));
            continue;
        }
        let t = g
            .tensors
            .get(&format!("{overrides}{}", e.name))
            .or_else(|| g.tensors.get(&format!("{prefix}{}", e.name)))
            .unwrap_or_else(|| panic!("the golden has no `{}`", e.name));
        saved.push((e.name.clone(), t.shallow_clone()));
    }
    model
        .params
        .restore(&saved)
        .expect("the golden weights fit the model");
    saved.into_iter().map(|(n, _)| n).collect()
}

fn kind_at(model: &Model, path: &str) -> String {
    model
        .root
        .walk()
        .into_iter()
        .find(|m| m.path == path)
        .map(|m| m.kind)
        .unwrap_or_else(|| panic!("no module at `{path}`"))
}

#[test]
fn gated_linear_units_on_bert_give_composers_logits() {
    let g = Golden::load("gated_linear_units");
    let heads = g.json["hyperparameters"]["config"]
        .as_str()
        .and_then(|c| c.split(" heads").next())
        .and_then(|c| c.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .expect("the golden config names its heads");
    let (sizes, vocab) = golden_bert(&g, "param/", heads);
    let (ids, mask) = (g.tensor("input_ids"), g.tensor("attention_mask"));
    let dir = TempDir::new("bert-glu-golden");

    // Without the method: Hugging Face's BertForMaskedLM.
    let plain = golden_trainer(&sizes, vocab, "", &dir);
    load_golden(plain.model(), &g, "param/", "param/");
    let before = logits(plain.model(), ids, Some(mask));
    let diff = max_abs_diff(&before, g.tensor("before/logits"));
    println!("bert before GLU vs Composer: {diff:e}");
    assert!(diff < 1e-5, "{diff}");

    let cases = g.json["results"]["surgery"]
        .as_object()
        .expect("results.surgery");
    for (case, r) in cases {
        let kwargs = r["kwargs"].as_object().expect("kwargs");
        let settings: String = kwargs.iter().map(|(k, v)| format!("{k} = {v}\n")).collect();
        let trainer = golden_trainer(
            &sizes,
            vocab,
            &format!("[[algorithms]]\nplugin = \"gated_linear_units\"\n{settings}"),
            &dir,
        );
        let model = trainer.model();
        for i in 0..sizes.n_layer {
            let layer = format!("bert.encoder.layer.{i}");
            assert_eq!(kind_at(model, &format!("{layer}.intermediate")), "identity");
            assert_eq!(
                kind_at(model, &format!("{layer}.output")),
                "glu_bert_output"
            );
        }
        let names = load_golden(model, &g, "param/", &format!("{case}/param/"));
        assert!(
            names.iter().all(|n| !n.contains(".intermediate.dense.")),
            "{case}: the intermediate layer stayed: {names:?}"
        );
        let want: usize = g
            .tensors
            .keys()
            .filter(|k| k.starts_with(&format!("{case}/param/")))
            .count();
        let replaced = names
            .iter()
            .filter(|n| g.tensors.contains_key(&format!("{case}/param/{n}")))
            .count();
        assert_eq!(replaced, want, "{case}: the new layers' tensors");
        let out = logits(model, ids, Some(mask));
        let diff = max_abs_diff(&out, g.tensor(&format!("{case}/logits")));
        println!("bert + gated_linear_units ({case}) vs Composer: {diff:e}");
        assert!(diff < 1e-5, "{case}: {diff}");
        assert!(
            max_abs_diff(&out, &before) > 1e-3,
            "{case}: nothing changed"
        );
    }
}

#[test]
fn alibi_on_bert_gives_composers_logits_beyond_the_trained_positions() {
    let g = Golden::load("alibi_surgery");
    let heads = g.tensor("bert/after/layer.0.alibi").size()[1] as usize;
    let max_len = g.tensor("bert/after/layer.0.alibi").size()[2];
    let (sizes, vocab) = golden_bert(&g, "bert/param/", heads);
    let (ids, mask) = (g.tensor("bert/input_ids"), g.tensor("bert/attention_mask"));
    let dir = TempDir::new("bert-alibi-golden");

    let plain = golden_trainer(&sizes, vocab, "", &dir);
    load_golden(plain.model(), &g, "bert/param/", "bert/param/");
    let before = logits(plain.model(), ids, Some(mask));
    let diff = max_abs_diff(&before, g.tensor("bert/before/logits"));
    assert!(diff < 1e-5, "before: {diff}");

    let trainer = golden_trainer(
        &sizes,
        vocab,
        &format!("[[algorithms]]\nplugin = \"alibi\"\nmax_sequence_length = {max_len}\n"),
        &dir,
    );
    let model = trainer.model();
    assert_eq!(
        kind_at(model, "bert.embeddings.position_embeddings"),
        "alibi_zero_positions"
    );
    for i in 0..sizes.n_layer {
        let path = format!("bert.encoder.layer.{i}.attention.self");
        assert_eq!(kind_at(model, &path), "alibi_bert_self_attention");
        let alibi = &model
            .params
            .get(&format!("{path}.alibi"))
            .expect("the alibi buffer")
            .tensor;
        assert!(
            alibi.equal(g.tensor(&format!("bert/after/layer.{i}.alibi"))),
            "{path}.alibi"
        );
    }
    let positions = &model
        .params
        .get("bert.embeddings.position_embeddings.weight")
        .expect("the zero table")
        .tensor;
    assert!(positions.equal(g.tensor("bert/after/position_embeddings")));
    for e in model.params.entries() {
        let frozen = e.name.ends_with(".alibi") || e.name.contains("position_embeddings");
        assert_eq!(e.role == Role::Buffer, frozen, "{}", e.name);
    }
    load_golden(model, &g, "bert/param/", "bert/param/");
    let after = logits(model, ids, Some(mask));
    let diff = max_abs_diff(&after, g.tensor("bert/after/logits"));
    assert!(diff < 1e-5, "after: {diff}");
    assert!(
        max_abs_diff(&after, &before) > 1e-3,
        "ALiBi changed nothing"
    );
    let long = g.tensor("bert/input_ids_long");
    assert!(long.size()[1] > sizes.n_positions as i64);
    let out = logits(model, long, None);
    let long_diff = max_abs_diff(&out, g.tensor("bert/after/logits_long"));
    assert!(long_diff < 1e-5, "T = 24: {long_diff}");
    let too_long = Tensor::zeros([1, max_len + 1], (Kind::Int64, Device::Cpu));
    let e = model.forward(&too_long, false).unwrap_err().to_string();
    assert!(e.contains("max_sequence_length"), "{e}");
    // The plain BERT refuses what its position table does not cover.
    let e = plain.model().forward(long, false).unwrap_err().to_string();
    assert!(e.contains("n_positions"), "{e}");
    println!(
        "host bert + libalibi.so vs Composer: max abs logits difference {diff:e} (T = 12, \
         padded), {long_diff:e} (T = 24)"
    );
}

// ---- through the binary ---------------------------------------------------------------------

fn bert_toml(run_name: &str, batches: u32) -> TrainerToml {
    let mut t = TrainerToml::tiny_gpt(run_name);
    t.model = "name = \"bert\"\nn_layer = 2\nn_head = 2\nn_embd = 32\nn_inner = 64\n\
               n_positions = 32"
        .to_owned();
    t.data = text_data(32, None);
    t.max_duration = format!("{batches}ba");
    t
}

#[test]
fn a_bert_trains_with_gated_linear_units_and_alibi_and_resumes_exactly() {
    let dir = TempDir::new("bert-train");
    let toml = bert_toml("glu-alibi", 6)
        .algorithm("gated_linear_units", "")
        .algorithm(
            "alibi",
            "max_sequence_length = 64\ntrain_sequence_length_scaling = 0.5",
        );
    toml.write_to(&dir);
    let out = tessera(&["train", "trainer.toml"], dir.path(), &[]);
    assert!(out.status.success(), "{}", out.dump());
    let losses: Vec<f64> = read_jsonl(&run_dir(&dir, "glu-alibi").join("metrics.jsonl"))
        .iter()
        .filter_map(|l| l["data"]["loss"].as_f64())
        .collect();
    assert!(losses.len() >= 6, "{losses:?}");
    assert!(losses.iter().all(|l| l.is_finite()), "{losses:?}");
    // A random masked LM's first loss is about ln(VOCAB).
    assert!((losses[0] - (VOCAB as f64).ln()).abs() < 0.7, "{losses:?}");
    assert!(losses[losses.len() - 1] < losses[0], "{losses:?}");
    assert_killed_and_resumed_is_exact("bert-resume", |run| {
        bert_toml(run, 8)
            .algorithm("gated_linear_units", "")
            .algorithm("alibi", "max_sequence_length = 64")
    });
}

#[test]
fn the_methods_for_bert_train_with_one() {
    // docs/models.md lists these as applying to BERT.
    let methods: [(&str, &str); 12] = [
        ("gated_linear_units", ""),
        ("alibi", "max_sequence_length = 64"),
        ("low_precision_layernorm", ""),
        (
            "seq_length_warmup",
            "duration = 0.5\nmin_seq_length = 16\nmax_seq_length = 32\nstep_size = 16",
        ),
        (
            "factorize",
            "min_features = 32\nlatent_features = 8\nfactorize_convs = false",
        ),
        (
            "gradient_clipping",
            "clipping_type = \"norm\"\nclipping_threshold = 1.0",
        ),
        ("ema", "half_life = \"2ba\""),
        ("swa", "swa_start = \"0.25dur\"\nswa_end = \"0.75dur\""),
        ("sam", "rho = 0.05"),
        ("lookahead", "k = 1"),
        ("muon", ""),
        ("layer_freezing", ""),
    ];
    let dir = TempDir::new("bert-methods");
    for (plugin, settings) in methods {
        bert_toml(plugin, 2)
            .algorithm(plugin, settings)
            .write_to(&dir);
        let out = tessera(&["train", "trainer.toml"], dir.path(), &[]);
        assert!(out.status.success(), "{plugin} on BERT:\n{}", out.dump());
        let record: Value = read_json(&run_dir(&dir, plugin).join("run.json"));
        assert_eq!(record["batches"], 2, "{plugin}");
        assert!(
            !out.stderr.contains("had no effect") && !out.stderr.contains("nothing was replaced"),
            "{plugin} did nothing on BERT:\n{}",
            out.stderr
        );
    }
}

/// A small BERT classifier of the example's labelled sentences (`examples/finetune/
/// labelled-text`, Shakespeare or a State of the Union address), a BPE of 300 trained on them.
fn classifier_toml(run_name: &str, batches: u32) -> TrainerToml {
    let example = repo_root()
        .join("examples")
        .join("finetune")
        .join("labelled-text");
    let mut t = bert_toml(run_name, batches);
    t.data = format!(
        "dataset = \"labelled-text\"\ndata_dir = {}\nbatch_size = 16\neval_batch_size = 40\n\
         workers = 0\n\n[data.text]\neval_path = {}\nseq_len = 32\nvocab_size = 300\n",
        toml_string(&example.join("train.jsonl").display().to_string()),
        toml_string(&example.join("eval.jsonl").display().to_string()),
    );
    t.optimizer = "name = \"adamw\"\nlr = 1e-3".to_owned();
    t
}

#[test]
fn a_bert_classifier_of_labelled_text_trains_with_its_padding_and_resumes_exactly() {
    let dir = TempDir::new("bert-classify");
    let mut toml = classifier_toml("classify", 12);
    toml.model.push_str("\ndropout = 0.1");
    toml.write_to(&dir);
    let out = train(
        &dir,
        &[
            "train.eval_interval=6ba",
            "train.metrics=[\"f1\"]",
            "checkpoint.interval=12ba",
        ],
        &[],
    );
    out.assert_success();
    let record = read_json(&run_dir(&dir, "classify").join("run.json"));
    // The default head for labelled text, its vocabulary the BPE's and the reserved tokens.
    assert_eq!(
        record["config"]["model"]["head"], "classification",
        "{record:#}"
    );
    let vocab = record["text_data"]["vocab_size"].as_u64().expect("vocab");
    assert_eq!(record["config"]["model"]["vocab_size"], vocab, "{record:#}");
    assert_eq!(record["config"]["model"]["num_classes"], 2, "{record:#}");
    let evals = record["evals"].as_array().expect("evals");
    assert_eq!(evals.len(), 2, "{record:#}");
    for e in evals {
        let f1 = e["f1"].as_f64().expect("f1");
        assert!((0.0..=1.0).contains(&f1), "{e}");
    }
    let losses: Vec<f64> = read_jsonl(&run_dir(&dir, "classify").join("metrics.jsonl"))
        .iter()
        .filter_map(|l| l["data"]["loss"].as_f64())
        .collect();
    assert_eq!(losses.len(), 12, "{losses:?}");
    // Two classes: a fresh classifier starts near ln 2.
    assert!((losses[0] - 2f64.ln()).abs() < 0.3, "{losses:?}");
    // Exported, it is transformers' BertForSequenceClassification state_dict (the names of the
    // reference classifier, which tests above load into transformers).
    let ckpt = tessera::checkpoint::list(&run_dir(&dir, "classify").join("checkpoints"))
        .first()
        .cloned()
        .expect("a checkpoint");
    tessera(
        &[
            "export",
            &ckpt.display().to_string(),
            "--to",
            "cls.safetensors",
        ],
        dir.path(),
        &[],
    )
    .assert_success();
    let names: BTreeSet<String> = read_state_dict(&dir.join("cls.safetensors"))
        .unwrap()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert!(names.contains("classifier.weight") && names.contains("bert.pooler.dense.bias"));
    assert!(!names.iter().any(|n| n.starts_with("cls.")), "{names:?}");
    assert_killed_and_resumed_is_exact("bert-classify-resume", |run| classifier_toml(run, 8));
}

#[test]
fn a_bert_masked_lm_trains_on_masked_batches() {
    let dir = TempDir::new("bert-mlm");
    let mut toml = bert_toml("mlm", 6);
    toml.data = format!("{}\n[data.mlm]\nprobability = 0.15\n", text_data(32, None));
    toml.write_to(&dir);
    let out = train(
        &dir,
        &["train.eval_interval=3ba", "checkpoint.interval=6ba"],
        &[],
    );
    out.assert_success();
    let record = read_json(&run_dir(&dir, "mlm").join("run.json"));
    assert_eq!(record["config"]["model"]["head"], "masked_lm", "{record:#}");
    // 64 ids and the four reserved tokens: the decoder predicts one of 68.
    assert_eq!(record["text_data"]["vocab_size"], 68, "{record:#}");
    assert_eq!(record["config"]["model"]["num_classes"], 68, "{record:#}");
    let losses: Vec<f64> = read_jsonl(&run_dir(&dir, "mlm").join("metrics.jsonl"))
        .iter()
        .filter_map(|l| l["data"]["loss"].as_f64())
        .collect();
    assert_eq!(losses.len(), 6, "{losses:?}");
    // Scored over the selected positions: a random masked LM starts near ln 68.
    assert!((losses[0] - 68f64.ln()).abs() < 0.7, "{losses:?}");
    // The export holds the decoder under transformers' names as well.
    let ckpt = tessera::checkpoint::list(&run_dir(&dir, "mlm").join("checkpoints"))
        .first()
        .cloned()
        .expect("a checkpoint");
    tessera(
        &[
            "export",
            &ckpt.display().to_string(),
            "--to",
            "mlm.safetensors",
        ],
        dir.path(),
        &[],
    )
    .assert_success();
    let names: BTreeSet<String> = read_state_dict(&dir.join("mlm.safetensors"))
        .unwrap()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    for n in [
        "cls.predictions.decoder.weight",
        "cls.predictions.decoder.bias",
        "cls.predictions.bias",
    ] {
        assert!(names.contains(n), "{n}: {names:?}");
    }
    // As a Hugging Face folder, AutoModelForMaskedLM loads it with the same logits.
    let ids = Tensor::from_slice(&[3i64, 1, 4, 1, 5, 9, 2, 6, 5, 3]).view([2, 5]);
    let hf = export_hf_and_check(&dir, &ckpt, &[("input", ids)], 68);
    assert!(hf.contains("BertForMaskedLM"), "{hf}");
}

/// `tessera export --format hf` of `ckpt` into `DIR/hf`, then the folder checked by
/// scripts/check_hf_export.py: the Auto class of its architecture loads it with nothing
/// missing or unexpected, and its logits on `case` (`input`, and `attention_mask` /
/// `token_type_ids` when given) are those of Tessera's model built from the run's config with
/// the folder as `init_weights` (a classifier of `classes` classes, or a masked LM of that
/// vocabulary). Returns the script's report.
fn export_hf_and_check(
    dir: &TempDir,
    ckpt: &Path,
    case: &[(&str, Tensor)],
    classes: i64,
) -> String {
    let out = dir.join("hf");
    export_hf(dir, ckpt, &out);
    let config = config::load(&dir.join("trainer.toml"), &[]).expect("the config reads");
    let mut mc = config.model.clone();
    let hf_config = read_json(&out.join("config.json"));
    if let Some(b) = mc.bert.as_mut() {
        b.vocab_size = hf_config["vocab_size"].as_u64().map(|v| v as usize);
    }
    let model = Model::build(&mc, NO_IMAGES, classes, Device::Cpu).expect("builds");
    load_init_weights(&model, ModelName::Bert, &out, &[], true).expect("the folder loads back");
    let get = |k: &str| case.iter().find(|(n, _)| *n == k).map(|(_, t)| t);
    let ids = get("input").expect("input ids");
    let logits = tch::no_grad(|| {
        model.forward_masked(ids, get("attention_mask"), get("token_type_ids"), false)
    })
    .expect("forward");
    let mut tensors: Vec<(&str, &Tensor)> = case.iter().map(|(n, t)| (*n, t)).collect();
    tensors.push(("output", &logits));
    check_hf_export(dir, &out, &tensors, "bert").unwrap_or_default()
}

/// Sentence pairs (`data.text.pair_field`): with a WordPiece tokenizer saved by transformers,
/// every evaluation sample is what `tokenizer(text, text_pair, truncation=True, max_length,
/// padding="max_length")` gives (ids, token type ids, attention mask; pairs longer than the
/// sample cut longest first). A classifier trains on them (learning a relation between the two
/// texts) and its `--format hf` folder loads into AutoModelForSequenceClassification with the
/// run's tokenizer and the same logits for the pairs, which the token types change.
#[test]
fn sentence_pairs_are_encoded_as_transformers_pairs_them_and_export_to_hugging_face() {
    const SEQ: usize = 16;
    if !transformers_imports() {
        return;
    }
    let dir = TempDir::new("bert-pairs");
    let data = dir.join("pairs");
    let made = python(&[
        "tests/support/bert_reference.py",
        "pairs",
        &data.display().to_string(),
        &SEQ.to_string(),
    ])
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    // The samples, against the tokenizer's.
    let cfg = tessera::data::LabelledTextConfig {
        text: tessera::data::OwnTextConfig {
            path: data.join("train.jsonl"),
            eval_path: Some(data.join("eval.jsonl")),
            eval_fraction: 0.05,
            text_field: "text".into(),
            vocab_size: 300,
            tokenizer: Some(data.join("tokenizer.json")),
            cache_dir: dir.join("cache"),
        },
        label_field: "label".into(),
        pair_field: Some("text_pair".into()),
        seq_len: SEQ,
        eval_seq_len: SEQ,
    };
    let loaded = tessera::data::load_labelled_text(&cfg).unwrap_or_else(|e| panic!("{e}"));
    let reference = read_state_dict(&data.join("eval.safetensors")).unwrap();
    let (mut ids, mut mask, mut types) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..loaded.eval.len() {
        loaded.eval.write(i, &mut ids, &mut mask, &mut types);
    }
    let rows = loaded.eval.len() as i64;
    assert_eq!(rows, 24);
    assert!(loaded.eval.truncated() > 0, "some pairs are cut");
    let ours = |v: &[i64]| Tensor::from_slice(v).view([rows, SEQ as i64]);
    for (name, values) in [
        ("input_ids", &ids),
        ("token_type_ids", &types),
        ("attention_mask", &mask),
    ] {
        let want = tensor(&reference, name);
        assert!(
            ours(values).equal(want),
            "{name}: ours {:?}, transformers' {:?}",
            ours(values),
            want
        );
    }
    // Trained through the binary.
    let mut toml = bert_toml("pairs", 24);
    toml.model.push_str(
        "
vocab_size = 45",
    );
    toml.data = format!(
        "dataset = \"labelled-text\"\ndata_dir = {}\nbatch_size = 16\neval_batch_size = 24\n\
         workers = 0\n\n[data.text]\neval_path = {}\ntokenizer = {}\npair_field = \"text_pair\"\n\
         seq_len = {SEQ}\n",
        toml_string(&data.join("train.jsonl").display().to_string()),
        toml_string(&data.join("eval.jsonl").display().to_string()),
        toml_string(&data.join("tokenizer.json").display().to_string()),
    );
    toml.optimizer = "name = \"adamw\"\nlr = 3e-3".to_owned();
    toml.write_to(&dir);
    train(&dir, &["train.eval_interval=24ba"], &[]).assert_success();
    let record = read_json(&run_dir(&dir, "pairs").join("run.json"));
    assert_eq!(record["config"]["data"]["text"]["pair_field"], "text_pair");
    let losses: Vec<f64> = read_jsonl(&run_dir(&dir, "pairs").join("metrics.jsonl"))
        .iter()
        .filter_map(|l| l["data"]["loss"].as_f64())
        .collect();
    assert!(losses.iter().all(|l| l.is_finite()), "{losses:?}");
    let ckpt = run_dir(&dir, "pairs")
        .join("checkpoints")
        .join("latest.ckpt");
    let case = [
        ("input", ours(&ids)),
        ("attention_mask", ours(&mask)),
        ("token_type_ids", ours(&types)),
    ];
    let hf = export_hf_and_check(&dir, &ckpt, &case, 2);
    assert!(hf.contains("BertForSequenceClassification"), "{hf}");
    // The run's tokenizer travels with the folder.
    assert_eq!(
        std::fs::read(dir.join("hf").join("tokenizer.json")).unwrap(),
        std::fs::read(data.join("tokenizer.json")).unwrap()
    );
    // The token types count: without them the logits differ.
    let mut mc = config::load(&dir.join("trainer.toml"), &[]).unwrap().model;
    mc.bert.as_mut().unwrap().vocab_size = Some(45);
    let model = Model::build(&mc, NO_IMAGES, 2, Device::Cpu).unwrap();
    load_init_weights(&model, ModelName::Bert, &dir.join("hf"), &[], true).unwrap();
    let (x, m, t) = (ours(&ids), ours(&mask), ours(&types));
    let with = tch::no_grad(|| model.forward_masked(&x, Some(&m), Some(&t), false)).unwrap();
    let without = tch::no_grad(|| model.forward_masked(&x, Some(&m), None, false)).unwrap();
    assert!(
        max_abs_diff(&with, &without) > 1e-4,
        "the token types change nothing"
    );
}

/// Token-weighted gradient accumulation: a masked LM scores only its masked tokens, a different
/// number in each microbatch. Four microbatches of 4 weigh by their shares of the batch's scored
/// tokens, so the step's loss and gradient are the whole batch's: the same losses and weights as
/// one pass of 16, up to the order of the sums (not the mean of the microbatches' means, the
/// Hugging Face Trainer's bug, which differs at the percent level here).
#[test]
fn microbatches_of_unequal_token_counts_train_as_the_whole_batch() {
    use tessera_tests::dist::max_difference;
    let dir = TempDir::new("bert-mlm-microbatch");
    let mut toml = bert_toml("whole", 3);
    toml.data = format!("{}\n[data.mlm]\nprobability = 0.15\n", text_data(32, None))
        .replace("batch_size = 64", "batch_size = 16");
    toml.write_to(&dir);
    for (run, microbatch) in [("whole", 16), ("split", 4)] {
        let out = train(
            &dir,
            &[
                &format!("run_name={run}"),
                &format!("train.microbatch_size={microbatch}"),
                "data.batch_size=16",
                "checkpoint.interval=3ba",
            ],
            &[],
        );
        out.assert_success();
    }
    let losses = |run: &str| train_losses(&read_jsonl(&run_dir(&dir, run).join("metrics.jsonl")));
    let (whole, split) = (losses("whole"), losses("split"));
    assert_eq!(whole.len(), 3, "{whole:?}");
    for (a, b) in whole.iter().zip(&split) {
        assert!((a - b).abs() <= 1e-5 * a.abs(), "{whole:?} vs {split:?}");
    }
    let ckpt = |run: &str| run_dir(&dir, run).join("checkpoints").join("ep0-ba3.ckpt");
    let (diff, name) = max_difference(&ckpt("whole"), &ckpt("split"), &["model/"]);
    println!(
        "4 microbatches vs the whole batch: {diff:e} at `{name}`, losses {whole:?} / {split:?}"
    );
    assert!(diff <= 1e-4, "{diff:e} at `{name}`");
}
