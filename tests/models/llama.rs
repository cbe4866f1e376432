//! `[model] name = "llama"`: Llama-family decoders as Hugging Face's `LlamaForCausalLM` and
//! `Qwen2ForCausalLM` compute them. Tiny random models made by transformers
//! (`scripts/llama_reference.py`: grouped-query attention with an untied head, Llama 3's
//! `rope_scaling` with a tied head and a `head_dim` of its own, Qwen2's q/k/v biases) are read
//! from their `config.json` and their `state_dict` by name, and give transformers' logits within
//! float rounding; the module tree follows the documented contract; sizes that do not fit are
//! errors naming the key.

use serde_json::Value;
use tessera::model::{InputShape, LlamaConfig, Model, ModelConfig, ModelName};
use tessera_plugin_api::tch::{Device, Tensor};
use tessera_tests::{python_with_env, transformers_imports, TempDir};

/// llama ignores the image input shape; any will do.
const INPUT: InputShape = InputShape {
    channels: 1,
    height: 1,
    width: 1,
};

fn build(config: LlamaConfig, vocab: usize) -> Model {
    let mut c = ModelConfig::new(ModelName::Llama, vocab);
    c.llama = Some(config);
    Model::build(&c, INPUT, vocab as i64, Device::Cpu).expect("llama builds")
}

/// Runs the reference script for `variant`; `None` (with a notice) without transformers.
fn reference(dir: &TempDir, variant: &str) -> Option<(LlamaConfig, Vec<(String, Tensor)>)> {
    if !transformers_imports() {
        return None;
    }
    let out = dir.path().join(variant);
    let out_s = out.display().to_string();
    let run = python_with_env(&["scripts/llama_reference.py", variant, &out_s], &[])
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let json: Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("config.json")).expect("config.json"),
    )
    .expect("config.json parses");
    let config = LlamaConfig::from_hf_config(&json).expect("the config reads");
    let tensors = Tensor::read_safetensors(out.join("case.safetensors")).expect("the case reads");
    Some((config, tensors))
}

fn tensor<'a>(tensors: &'a [(String, Tensor)], name: &str) -> &'a Tensor {
    &tensors
        .iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("the case has no `{name}`"))
        .1
}

#[test]
fn hugging_face_llama_and_qwen2_weights_give_their_logits() {
    let dir = TempDir::new("llama-parity");
    for variant in ["gqa", "rope3", "qwen2"] {
        let Some((config, tensors)) = reference(&dir, variant) else {
            return;
        };
        let vocab = config.vocab_size.expect("the config has a vocabulary");
        let model = build(config, vocab);
        // Every tensor of ours under its Hugging Face name (a tied head's `lm_head.weight` is
        // the embedding's, which the store holds once).
        let saved: Vec<(String, Tensor)> = model
            .params
            .entries()
            .iter()
            .map(|e| {
                let t = tensor(&tensors, &format!("param/{}", e.name));
                (e.name.clone(), t.shallow_clone())
            })
            .collect();
        model.params.restore(&saved).expect("the weights fit");
        let theirs = tensors
            .iter()
            .filter(|(n, _)| n.starts_with("param/"))
            .count();
        let tied = usize::from(tensors.iter().any(|(n, _)| n == "param/lm_head.weight"))
            * usize::from(model.params.get("lm_head.weight").is_none());
        assert_eq!(
            saved.len() + tied,
            theirs,
            "{variant}: every tensor is used"
        );
        let ids = tensor(&tensors, "input");
        let logits =
            tessera_plugin_api::tch::no_grad(|| model.forward(ids, false)).expect("forward");
        let want = tensor(&tensors, "logits");
        assert_eq!(logits.size(), want.size(), "{variant}");
        let diff = (&logits - want).abs().max().double_value(&[]);
        let scale = want.abs().max().double_value(&[]);
        println!(
            "llama {variant} vs transformers: max abs logits difference {diff:e} (scale {scale:e})"
        );
        assert!(
            diff <= 1e-5 * scale.max(1.0),
            "{variant}: {diff:e} (scale {scale:e})"
        );
    }
}

/// `init_weights` takes a `save_pretrained` folder: its `model.safetensors`, or the shards its
/// index lists (read one at a time): the same weights, the same logits as transformers'.
#[test]
fn save_pretrained_folders_load_whole_or_sharded() {
    use tessera::model::load_init_weights;
    let dir = TempDir::new("llama-folders");
    for variant in ["gqa", "rope3"] {
        let Some((config, tensors)) = reference(&dir, variant) else {
            return;
        };
        let vocab = config.vocab_size.expect("the config has a vocabulary");
        let ids = tensor(&tensors, "input");
        let want = tensor(&tensors, "logits");
        let out = dir.path().join(variant);
        let shards = std::fs::read_dir(out.join("sharded"))
            .expect("the sharded folder")
            .filter(|e| {
                e.as_ref()
                    .is_ok_and(|e| e.file_name().to_string_lossy().starts_with("model-0"))
            })
            .count();
        assert!(shards >= 3, "{variant}: {shards} shards");
        for folder in ["single", "sharded"] {
            let model = build(config.clone(), vocab);
            let report = load_init_weights(&model, ModelName::Llama, &out.join(folder), &[], true)
                .unwrap_or_else(|e| panic!("{variant} {folder}: {e}"));
            assert_eq!(
                report.loaded,
                model.params.entries().len(),
                "{variant} {folder}"
            );
            assert_eq!(report.sha256.len(), 64, "{report:?}");
            let logits =
                tessera_plugin_api::tch::no_grad(|| model.forward(ids, false)).expect("forward");
            let diff = (&logits - want).abs().max().double_value(&[]);
            println!("llama {variant} from {folder} folder: max abs logits difference {diff:e}");
            assert!(diff <= 1e-5 * want.abs().max().double_value(&[]).max(1.0));
        }
    }
    // A folder without weights, and a shard the index lists but that is gone, are named.
    let empty = dir.path().join("empty");
    std::fs::create_dir_all(&empty).expect("mkdir");
    let model = build(
        LlamaConfig {
            num_hidden_layers: 1,
            hidden_size: 8,
            intermediate_size: 8,
            num_attention_heads: 2,
            num_key_value_heads: None,
            ..LlamaConfig::default()
        },
        11,
    );
    let e = load_init_weights(&model, ModelName::Llama, &empty, &[], true)
        .unwrap_err()
        .to_string();
    assert!(e.contains("model.safetensors.index.json"), "{e}");
    let gone = dir.path().join("gqa").join("sharded");
    std::fs::remove_file(gone.join("model-00002-of-00005.safetensors")).expect("remove");
    let e = load_init_weights(&model, ModelName::Llama, &gone, &[], true)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("model-00002-of-00005.safetensors") && e.contains("missing"),
        "{e}"
    );
}

#[test]
fn the_module_tree_follows_the_plugin_contract() {
    let config = LlamaConfig {
        num_hidden_layers: 2,
        hidden_size: 16,
        intermediate_size: 24,
        num_attention_heads: 4,
        num_key_value_heads: Some(2),
        max_position_embeddings: 32,
        ..LlamaConfig::default()
    };
    let model = build(config, 11);
    let walk = model.root.walk();
    let node = |path: &str| {
        walk.iter()
            .find(|i| i.path == path)
            .unwrap_or_else(|| panic!("no module at `{path}`"))
    };
    for (path, kind) in [
        ("", "llama_for_causal_lm"),
        ("model", "llama_model"),
        ("model.embed_tokens", "embedding"),
        ("model.layers", "sequential"),
        ("model.layers.1", "llama_block"),
        ("model.layers.1.input_layernorm", "rms_norm"),
        ("model.layers.1.self_attn", "llama_attention"),
        ("model.layers.1.self_attn.q_proj", "linear"),
        ("model.layers.1.self_attn.k_proj", "linear"),
        ("model.layers.1.self_attn.v_proj", "linear"),
        ("model.layers.1.self_attn.o_proj", "linear"),
        ("model.layers.1.post_attention_layernorm", "rms_norm"),
        ("model.layers.1.mlp", "llama_mlp"),
        ("model.layers.1.mlp.gate_proj", "linear"),
        ("model.layers.1.mlp.up_proj", "linear"),
        ("model.layers.1.mlp.down_proj", "linear"),
        ("model.norm", "rms_norm"),
        ("lm_head", "tied_lm_head"),
    ] {
        assert_eq!(node(path).kind, kind, "{path}");
    }
    let shape = |n: &str| model.params.get(n).map(|e| e.tensor.size());
    for (name, want) in [
        ("model.embed_tokens.weight", vec![11, 16]),
        ("model.layers.0.self_attn.q_proj.weight", vec![16, 16]),
        ("model.layers.0.self_attn.k_proj.weight", vec![8, 16]),
        ("model.layers.0.self_attn.v_proj.weight", vec![8, 16]),
        ("model.layers.0.self_attn.o_proj.weight", vec![16, 16]),
        ("model.layers.0.mlp.gate_proj.weight", vec![24, 16]),
        ("model.layers.0.mlp.down_proj.weight", vec![16, 24]),
        ("model.norm.weight", vec![16]),
    ] {
        assert_eq!(shape(name), Some(want), "{name}");
    }
    assert!(shape("model.layers.0.self_attn.q_proj.bias").is_none());
    assert!(
        shape("lm_head.weight").is_none(),
        "the tied head holds no tensor"
    );
    // A forward pass over (2, 5) ids gives (2, 5, 11) logits; a sequence past the context is
    // refused naming the key.
    let ids = Tensor::from_slice(&[1i64, 2, 3, 4, 5, 6, 7, 8, 9, 10]).view([2, 5]);
    let logits = model.forward(&ids, true).expect("forward");
    assert_eq!(logits.size(), vec![2, 5, 11]);
    let long = Tensor::zeros([1, 33], (tessera_plugin_api::tch::Kind::Int64, Device::Cpu));
    let e = model.forward(&long, false).unwrap_err().to_string();
    assert!(e.contains("max_position_embeddings"), "{e}");
}

#[test]
fn sizes_that_do_not_fit_are_errors_naming_the_key() {
    let base = LlamaConfig {
        num_hidden_layers: 1,
        hidden_size: 16,
        intermediate_size: 24,
        num_attention_heads: 4,
        num_key_value_heads: Some(2),
        ..LlamaConfig::default()
    };
    let cases: [(LlamaConfig, &str); 4] = [
        (
            LlamaConfig {
                num_key_value_heads: Some(3),
                ..base.clone()
            },
            "num_key_value_heads",
        ),
        (
            LlamaConfig {
                hidden_size: 18,
                ..base.clone()
            },
            "hidden_size",
        ),
        (
            LlamaConfig {
                rms_norm_eps: 0.0,
                ..base.clone()
            },
            "rms_norm_eps",
        ),
        (
            LlamaConfig {
                vocab_size: Some(3),
                ..base.clone()
            },
            "vocab_size",
        ),
    ];
    for (config, key) in cases {
        let mut c = ModelConfig::new(ModelName::Llama, 11);
        c.llama = Some(config);
        let e = Model::build(&c, INPUT, 11, Device::Cpu)
            .unwrap_err()
            .to_string();
        assert!(e.contains(key), "{key}: {e}");
    }
    // A config.json of something this model does not compute names the key.
    for (json, key) in [
        (r#"{"model_type": "gpt_neox"}"#, "model_type"),
        (
            r#"{"num_hidden_layers": 1, "hidden_size": 8, "intermediate_size": 8, "num_attention_heads": 2, "hidden_act": "gelu"}"#,
            "hidden_act",
        ),
        (
            r#"{"num_hidden_layers": 1, "hidden_size": 8, "intermediate_size": 8, "num_attention_heads": 2, "rope_parameters": {"rope_type": "yarn", "factor": 2.0}}"#,
            "rope_type",
        ),
        (r#"{"hidden_size": 8}"#, "num_hidden_layers"),
    ] {
        let v: Value = serde_json::from_str(json).expect("json");
        let e = LlamaConfig::from_hf_config(&v).unwrap_err();
        assert!(e.contains(key), "{key}: {e}");
    }
}

/// The `[model]` keys: Hugging Face's names, a `config.json` to read them from (keys given
/// override it), errors naming the key and its line.
#[test]
fn trainer_toml_reads_llama_keys_and_config_json() {
    use tessera_tests::TrainerToml;
    let dir = TempDir::new("llama-config");
    let parse = |model: &str| {
        let mut toml = TrainerToml::gpt("llama");
        toml.model = model.to_owned();
        tessera::config::from_str(&toml.render(), dir.path(), "trainer.toml")
    };
    let c = parse(
        "name = \"llama\"\nnum_hidden_layers = 2\nhidden_size = 32\nintermediate_size = 48\n\
         num_attention_heads = 4\nnum_key_value_heads = 2\nrope_theta = 500.0\n\
         rope_scaling = { factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0, original_max_position_embeddings = 16 }",
    )
    .expect("the keys read");
    let l = c.model.llama.expect("llama sizes");
    assert_eq!(
        (l.num_hidden_layers, l.hidden_size, l.kv_heads()),
        (2, 32, 2)
    );
    assert_eq!(l.rope_theta, 500.0);
    assert_eq!(l.rope_scaling.map(|s| s.factor), Some(8.0));
    // A config.json, one key overridden.
    std::fs::write(
        dir.path().join("config.json"),
        r#"{"model_type": "qwen2", "num_hidden_layers": 3, "hidden_size": 16, "intermediate_size": 24,
            "num_attention_heads": 4, "num_key_value_heads": 1, "rope_parameters": {"rope_theta": 1000.0, "rope_type": "default"},
            "tie_word_embeddings": false, "rms_norm_eps": 1e-6}"#,
    )
    .expect("write");
    let c = parse("name = \"llama\"\nconfig = \"config.json\"\nnum_hidden_layers = 1")
        .expect("the config.json reads");
    let l = c.model.llama.expect("llama sizes");
    assert_eq!(
        (l.num_hidden_layers, l.hidden_size, l.kv_heads()),
        (1, 16, 1)
    );
    assert!(l.attention_bias && l.o_bias == Some(false) && !l.tie_embeddings);
    assert_eq!((l.rope_theta, l.rms_norm_eps), (1000.0, 1e-6));
    for (model, key) in [
        ("name = \"llama\"\nn_layer = 2", "n_layer"),
        (
            "name = \"llama\"\nnum_attention_heads = 4\nnum_key_value_heads = 3",
            "num_key_value_heads",
        ),
        (
            "name = \"llama\"\nhidden_size = 30\nnum_attention_heads = 4",
            "hidden_size",
        ),
        ("name = \"llama\"\nconfig = \"missing.json\"", "config"),
        (
            "name = \"gpt2\"\nnum_hidden_layers = 2",
            "num_hidden_layers",
        ),
        (
            "name = \"llama\"\nrope_scaling = { factor = 8.0 }",
            "low_freq_factor",
        ),
    ] {
        let e = parse(model).expect_err(model).to_string();
        // `trainer.toml:LINE:COLUMN: model.KEY: ...`
        assert!(
            e.contains(key) && e.contains("trainer.toml:"),
            "{model}: {e}"
        );
    }
}

/// A small llama trains on text with the usual loop: the loss falls.
#[test]
fn a_small_llama_trains_on_text() {
    use tessera_tests::{read_jsonl, run_dir, train, train_losses, TrainerToml};
    let dir = TempDir::new("llama-train");
    let mut toml = TrainerToml::tiny_gpt("llama");
    toml.model =
        "name = \"llama\"\nnum_hidden_layers = 2\nhidden_size = 32\nintermediate_size = 64\n\
                  num_attention_heads = 4\nnum_key_value_heads = 2\nmax_position_embeddings = 64"
            .to_owned();
    toml.max_duration = "20ba".to_owned();
    dir.write("trainer.toml", &toml.render());
    train(&dir, &[], &[]).assert_success();
    let losses = train_losses(&read_jsonl(&run_dir(&dir, "llama").join("metrics.jsonl")));
    assert_eq!(losses.len(), 20, "{losses:?}");
    let first: f64 = losses[..3].iter().sum::<f64>() / 3.0;
    let last: f64 = losses[17..].iter().sum::<f64>() / 3.0;
    assert!(last < first, "the loss did not fall: {losses:?}");
}

/// The blocks are units: `full` sharding gathers one `llama_block` at a time, and activation
/// checkpointing recomputes them; both train what DDP trains on 2 ranks, bit for bit.
#[test]
fn llama_blocks_are_units_for_full_sharding_and_activation_checkpointing() {
    use tessera_tests::dist::{assert_all_succeeded, train_ranks};
    use tessera_tests::{read_jsonl, run_dir, train_losses, TrainerToml};
    let dir = TempDir::new("llama-units");
    let mut toml = TrainerToml::tiny_gpt("llama");
    toml.model =
        "name = \"llama\"\nnum_hidden_layers = 3\nhidden_size = 32\nintermediate_size = 64\n\
                  num_attention_heads = 4\nnum_key_value_heads = 2\nmax_position_embeddings = 64"
            .to_owned();
    toml.max_duration = "6ba".to_owned();
    dir.write("trainer.toml", &toml.render());
    let runs: [(&str, &[&str]); 3] = [
        ("ddp", &[]),
        ("full", &["distributed.sharding=\"full\""]),
        (
            "checkpointed",
            &[
                "train.activation_checkpointing={ unit = \"block\", every = 1 }",
                "distributed.find_unused_parameters=false",
            ],
        ),
    ];
    for (name, extra) in runs {
        let run = format!("run_name={name}");
        let mut args = vec![run.as_str(), "train.threads=1"];
        args.extend_from_slice(extra);
        let outputs = train_ranks(&dir, 2, &args);
        assert_all_succeeded(&outputs);
        if name == "full" {
            let log = format!("{}{}", outputs[0].stdout, outputs[0].stderr);
            assert!(log.contains("3 units gathered as they run"), "{log}");
        }
    }
    let losses = |run: &str| train_losses(&read_jsonl(&run_dir(&dir, run).join("metrics.jsonl")));
    let ddp = losses("ddp");
    assert_eq!(ddp.len(), 6, "{ddp:?}");
    assert_eq!(losses("full"), ddp);
    assert_eq!(losses("checkpointed"), ddp);
}

/// `tessera export --format hf`: a trained llama (and a Qwen2-style one, and gpt2) becomes a
/// folder `AutoModelForCausalLM.from_pretrained` loads with nothing missing, giving Tessera's
/// logits.
#[test]
fn the_hf_export_loads_into_transformers_with_the_same_logits() {
    use tessera::model::{load_init_weights, Gpt2Config};
    use tessera_tests::export::{check_hf_export, export_hf};
    use tessera_tests::{run_dir, train, TrainerToml};
    let dir = TempDir::new("llama-hf-export");
    let sizes = "num_hidden_layers = 2\nhidden_size = 32\nintermediate_size = 64\n\
                 num_attention_heads = 4\nnum_key_value_heads = 2\nmax_position_embeddings = 64";
    let cases = [
        (
            "llama",
            // Llama 3's rotary scaling goes into config.json as transformers reads it.
            format!(
                "name = \"llama\"\n{sizes}\ntie_embeddings = false\nrope_scaling = {{ factor = \
                 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0, \
                 original_max_position_embeddings = 16 }}"
            ),
        ),
        (
            "qwen2",
            format!("name = \"llama\"\n{sizes}\nattention_bias = true\no_bias = false"),
        ),
        (
            "gpt2",
            "name = \"gpt2\"\nn_layer = 2\nn_head = 2\nn_embd = 16\nn_positions = 64".to_owned(),
        ),
    ];
    for (run, model) in cases {
        let mut toml = TrainerToml::tiny_gpt(run);
        toml.model = model;
        toml.max_duration = "3ba".to_owned();
        dir.write("trainer.toml", &toml.render());
        train(&dir, &[], &[]).assert_success();
        let ckpt = run_dir(&dir, run).join("checkpoints").join("latest.ckpt");
        let out = dir.path().join(format!("{run}-hf"));
        export_hf(&dir, &ckpt, &out);
        assert!(out.join("config.json").is_file() && out.join("model.safetensors").is_file());
        // Tessera's logits: the exported weights in a model built from the run's config.
        let config =
            tessera::config::load(&dir.path().join("trainer.toml"), &[]).expect("the config reads");
        let vocab = config.model.num_classes;
        let mut mc = config.model.clone();
        if mc.gpt2.is_none() && mc.name == ModelName::Gpt2 {
            mc.gpt2 = Some(Gpt2Config::default());
        }
        let classes = mc
            .llama
            .as_ref()
            .and_then(|l| l.vocab_size)
            .unwrap_or(vocab) as i64;
        let model = Model::build(&mc, INPUT, classes, Device::Cpu).expect("builds");
        let file = out.join("model.safetensors");
        load_init_weights(&model, mc.name, &file, &[], true).expect("the export loads back");
        let ids = Tensor::from_slice(&[3i64, 1, 4, 1, 5, 9, 2, 6, 5, 3]).view([2, 5]);
        let logits =
            tessera_plugin_api::tch::no_grad(|| model.forward(&ids, false)).expect("forward");
        if check_hf_export(&dir, &out, &[("input", &ids), ("output", &logits)], run).is_none() {
            return;
        }
    }
}

/// The methods that apply to a llama act on it: QK-norm wraps every attention's `q_proj` and
/// `k_proj`, the logits are soft-capped, the attention and MLP output projections start at
/// zero, Muon trains the hidden matrices, sequence-length warmup shortens the early batches.
/// None warns that it had no effect; a stopped run resumes bit for bit. Composer's
/// low_precision_layernorm has no RMSNorm to convert and is refused, naming the reason.
#[test]
fn methods_act_on_a_llama_and_resume_bit_for_bit() {
    use tessera_tests::resume::{assert_continues, with_checkpoints};
    use tessera_tests::{train, TrainerToml};
    let dir = TempDir::new("llama-methods");
    let make = |run: &str| {
        let mut toml = TrainerToml::tiny_gpt(run)
            .algorithm("qk_norm", "")
            .algorithm("logit_softcap", "cap = 15.0")
            .algorithm("zero_init_projections", "")
            .algorithm("muon", "lr = 0.02")
            .algorithm(
                "seq_length_warmup",
                "duration = 0.5\nmin_seq_length = 8\nmax_seq_length = 32\nstep_size = 8",
            );
        toml.model =
            "name = \"llama\"\nnum_hidden_layers = 2\nhidden_size = 32\nintermediate_size = 64\n\
             num_attention_heads = 4\nnum_key_value_heads = 2\nmax_position_embeddings = 64\n\
             tie_embeddings = false"
                .to_owned();
        toml.max_duration = "6ba".to_owned();
        toml
    };
    dir.write("trainer.toml", &with_checkpoints(&make("straight"), ""));
    let out = train(&dir, &[], &[]);
    out.assert_success();
    let log = format!("{}{}", out.stdout, out.stderr);
    for said in [
        "qk_norm: 2 llama attention blocks RMS-normalise q and k per head",
        "logit_softcap: the logits of the untied lm_head are capped at 15",
        "zero_init_projections: 4 output projections start at zero",
    ] {
        assert!(log.contains(said), "{said}: {log}");
    }
    assert!(
        !log.contains("no effect") && !log.contains("nothing was zeroed"),
        "{log}"
    );
    // The same run resumed from the straight run's batch-2 checkpoint (the same length, so
    // the warmup's schedule is the same).
    let from = tessera_tests::run_dir(&dir, "straight")
        .join("checkpoints")
        .join("ep0-ba2.ckpt");
    dir.write("trainer.toml", &with_checkpoints(&make("resumed"), ""));
    let load = format!("checkpoint.load={:?}", from.display().to_string());
    let out = train(&dir, &[&load], &[]);
    out.assert_success();
    assert!(out.stderr.contains("resumed from"), "{}", out.dump());
    assert_continues(&dir, "straight", "resumed", 2);

    let mut toml = make("lowp").algorithm("low_precision_layernorm", "");
    toml.precision = Some("amp_bf16".to_owned());
    dir.write("trainer.toml", &toml.render());
    let out = train(&dir, &[], &[]);
    assert!(!out.status.success(), "{}", out.dump());
    assert!(
        out.stderr
            .contains("RMSNorms (rms_norm, e.g. `model.layers.0.input_layernorm`)")
            && out.stderr.contains("leave the method out"),
        "{}",
        out.stderr
    );
}
