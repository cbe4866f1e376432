//! The `lora` plugin: low-rank adapters on a llama's linear layers, the base model frozen.
//! A tiny random llama made by transformers (`scripts/llama_reference.py`) is the base model,
//! loaded from its `save_pretrained` folder; LoRA trains a few batches; the adapters export as a
//! PEFT folder that the installed peft loads onto the base model with Tessera's logits, and
//! merged into a plain Hugging Face folder; the base weights never move; a stopped run resumes
//! bit for bit; two ranks train what one process trains; bad settings are errors naming them.

use std::path::{Path, PathBuf};

use tessera::model::{load_init_weights, InputShape, Model};
use tessera_plugin_api::tch::{Device, Tensor};
use tessera_tests::resume::{assert_continues, with_checkpoints};
use tessera_tests::{
    python_can_import, python_with_env, run_dir, tessera, train, transformers_imports, TempDir,
    TrainerToml,
};

/// llama ignores the image input shape; any will do.
const INPUT: InputShape = InputShape {
    channels: 1,
    height: 1,
    width: 1,
};

/// The base model: transformers' tiny random llama with grouped-query attention, saved by
/// `save_pretrained` (`None` without transformers).
fn base_model(dir: &TempDir) -> Option<PathBuf> {
    if !transformers_imports() {
        return None;
    }
    let out = dir.path().join("reference");
    let out_s = out.display().to_string();
    let run = python_with_env(&["scripts/llama_reference.py", "gqa", &out_s], &[])
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    Some(out.join("single"))
}

/// A run fine-tuning `base` with LoRA (`settings`) on synthetic text for `batches` batches.
fn lora_run(run: &str, base: &Path, settings: &str, batches: u32) -> TrainerToml {
    let mut toml = TrainerToml::tiny_gpt(run).algorithm("lora", settings);
    toml.model = format!(
        "name = \"llama\"\nconfig = {:?}\ninit_weights = {:?}",
        base.join("config.json").display().to_string(),
        base.display().to_string()
    );
    toml.optimizer = "name = \"adamw\"\nlr = 0.01".to_owned();
    toml.max_duration = format!("{batches}ba");
    toml
}

fn export(dir: &TempDir, ckpt: &Path, format: &str, to: &Path) -> String {
    let out = tessera(
        &[
            "export",
            &ckpt.display().to_string(),
            "--format",
            format,
            "--to",
            &to.display().to_string(),
        ],
        dir.path(),
        &[],
    );
    out.assert_success();
    out.stdout
}

fn tensors(file: &Path) -> Vec<(String, Tensor)> {
    Tensor::read_safetensors(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}

#[test]
fn adapters_train_with_the_base_frozen_and_export_for_peft_and_merged() {
    let dir = TempDir::new("lora-peft");
    let Some(base) = base_model(&dir) else {
        return;
    };
    let settings = "r = 4\nlora_alpha = 16.0\nlora_dropout = 0.1\n\
                    target_modules = [\"q_proj\", \"v_proj\", \"model.layers.1.mlp.down_proj\"]";
    dir.write(
        "trainer.toml",
        &lora_run("lora", &base, settings, 4).render(),
    );
    let out = train(&dir, &[], &[]);
    out.assert_success();
    let log = format!("{}{}", out.stdout, out.stderr);
    // 2 blocks: q_proj and v_proj in each, one down_proj; A (4, in) and B (out, 4).
    assert!(
        log.contains("rank-4 adapters on 5 linear layers (1 down_proj, 2 q_proj, 2 v_proj)"),
        "{log}"
    );
    let ckpt = run_dir(&dir, "lora")
        .join("checkpoints")
        .join("latest.ckpt");
    // The optimizer holds state for the adapters alone (AdamW's two moments each).
    let saved = tessera::checkpoint::Checkpoint::read(&ckpt).expect("the checkpoint reads");
    let optimizer: Vec<&str> = saved
        .tensors
        .iter()
        .filter_map(|(n, _)| n.strip_prefix("optim/"))
        .collect();
    assert!(!optimizer.is_empty());
    for name in &optimizer {
        assert!(
            name.contains(".lora_A.weight.") || name.contains(".lora_B.weight."),
            "{name}"
        );
    }
    // q (32 -> 32) and v (32 -> 16) in both blocks, one down_proj (48 -> 32): A (4, in), B (out, 4).
    let adapters = 2 * (4 * 32 + 32 * 4) + 2 * (4 * 32 + 16 * 4) + (4 * 48 + 32 * 4);
    let metrics = tessera_tests::read_jsonl(&run_dir(&dir, "lora").join("metrics.jsonl"));
    assert!(
        metrics
            .iter()
            .any(|m| m["name"] == "lora/trainable_parameters" && m["value"] == adapters as f64),
        "no `lora/trainable_parameters` = {adapters} in the metrics"
    );
    let peft_dir = dir.path().join("adapter");
    let said = export(&dir, &ckpt, "peft", &peft_dir);
    assert!(said.contains("LoRA adapters of 5 layers"), "{said}");
    let config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(peft_dir.join("adapter_config.json")).expect("config"),
    )
    .expect("adapter_config.json parses");
    assert_eq!(config["r"], 4);
    assert_eq!(config["lora_alpha"], 16.0);
    assert_eq!(config["peft_type"], "LORA");
    // `down_proj` alone would select both blocks': the config names that layer by its path.
    assert_eq!(
        config["target_modules"],
        serde_json::json!([
            "model.layers.0.self_attn.q_proj",
            "model.layers.0.self_attn.v_proj",
            "model.layers.1.self_attn.q_proj",
            "model.layers.1.self_attn.v_proj",
            "model.layers.1.mlp.down_proj"
        ])
    );
    let adapter = tensors(&peft_dir.join("adapter_model.safetensors"));
    assert_eq!(adapter.len(), 10);
    for (name, t) in &adapter {
        assert!(name.starts_with("base_model.model.model.layers."), "{name}");
        if name.ends_with("lora_B.weight") {
            assert!(
                t.abs().max().double_value(&[]) > 0.0,
                "{name} never trained (still zero)"
            );
        }
    }

    // Generation through the adapters: the KV cache runs through the wrapped projections
    // (position-wise), giving the tokens a full recomputation gives.
    let generate = |extra: &[&str]| {
        let ckpt_s = ckpt.display().to_string();
        let mut args = vec![
            "generate",
            ckpt_s.as_str(),
            "--prompt-ids",
            "3 1 4 1 5",
            "--max-new-tokens",
            "6",
            "--json",
        ];
        args.extend_from_slice(extra);
        let out = tessera(&args, dir.path(), &[]);
        out.assert_success();
        // The cached run says so (a module that cannot run incrementally would make it
        // recompute whole sequences, and say that).
        assert_eq!(
            extra.is_empty(),
            out.stderr.contains("tokens/s, kv cache)"),
            "{}",
            out.stderr
        );
        out.stdout
    };
    assert_eq!(generate(&[]), generate(&["--no-kv-cache"]));

    // Merged: the base model with W + (alpha / r) B A; every other tensor is the base's, bit
    // for bit (frozen).
    let merged_dir = dir.path().join("merged");
    export(&dir, &ckpt, "hf", &merged_dir);
    let base_tensors = tensors(&base.join("model.safetensors"));
    let merged = tensors(&merged_dir.join("model.safetensors"));
    let adapted = |name: &str| {
        name.ends_with("q_proj.weight")
            || name.ends_with("v_proj.weight")
            || name == "model.layers.1.mlp.down_proj.weight"
    };
    let mut compared = 0;
    for (name, t) in &base_tensors {
        let Some((_, m)) = merged.iter().find(|(n, _)| n == name) else {
            panic!("the merged export has no `{name}`")
        };
        if adapted(name) {
            assert!(!m.equal(t), "{name}: the adapter was not merged");
        } else {
            assert!(m.equal(t), "{name}: a frozen weight moved");
            compared += 1;
        }
    }
    assert!(compared >= 10, "{compared}");

    // Tessera's logits of the merged model, then peft's with the adapter loaded on the base.
    let config = tessera::config::load(&dir.path().join("trainer.toml"), &[]).expect("config");
    let mut mc = config.model.clone();
    mc.init = None;
    let classes = mc.llama.as_ref().and_then(|l| l.vocab_size).unwrap_or(64) as i64;
    let model = Model::build(&mc, INPUT, classes, Device::Cpu).expect("builds");
    load_init_weights(
        &model,
        mc.name,
        &merged_dir.join("model.safetensors"),
        &[],
        true,
    )
    .expect("the merged export loads");
    let ids = Tensor::from_slice(&[3i64, 1, 4, 1, 5, 9, 2, 6, 5, 3]).view([2, 5]);
    let logits = tessera_plugin_api::tch::no_grad(|| model.forward(&ids, false)).expect("forward");
    let case = dir.path().join("case.safetensors");
    Tensor::write_safetensors(&[("input", &ids), ("output", &logits)], &case).expect("case");
    if !python_can_import("peft", "the LoRA adapter with PEFT") {
        return;
    }
    let args = [
        "scripts/check_peft_adapter.py".to_owned(),
        base.display().to_string(),
        peft_dir.display().to_string(),
        case.display().to_string(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let check = python_with_env(&args, &[]).unwrap_or_else(|e| panic!("{e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    assert!(check.status.success(), "{text}");
    println!("peft: {}", text.trim());
}

#[test]
fn a_stopped_lora_run_resumes_bit_for_bit_and_two_ranks_train_as_one() {
    let dir = TempDir::new("lora-resume");
    let Some(base) = base_model(&dir) else {
        return;
    };
    // Dropout on the adapters' input draws from libtorch's generator: resumed with the run.
    let settings = "r = 2\nlora_dropout = 0.2";
    let straight = lora_run("straight", &base, settings, 6);
    dir.write("trainer.toml", &with_checkpoints(&straight, ""));
    train(&dir, &[], &[]).assert_success();
    dir.write(
        "trainer.toml",
        &with_checkpoints(&lora_run("resumed", &base, settings, 6), ""),
    );
    train(&dir, &["train.max_duration=2ba"], &[]).assert_success();
    train(&dir, &["checkpoint.autoresume=true"], &[]).assert_success();
    assert_continues(&dir, "straight", "resumed", 2);

    // Two ranks of 4 sequences against one process of 8, without dropout: the same step.
    use tessera_tests::dist::{assert_all_succeeded, train_ranks};
    let toml = lora_run("ranks", &base, "r = 2", 3);
    dir.write("trainer.toml", &toml.render());
    assert_all_succeeded(&train_ranks(
        &dir,
        2,
        &["data.batch_size=4", "train.threads=1"],
    ));
    let toml = lora_run("one", &base, "r = 2", 3);
    dir.write("trainer.toml", &toml.render());
    train(&dir, &["data.batch_size=8", "train.threads=1"], &[]).assert_success();
    let losses = |run: &str| {
        tessera_tests::train_losses(&tessera_tests::read_jsonl(
            &run_dir(&dir, run).join("metrics.jsonl"),
        ))
    };
    let (ranks, one) = (losses("ranks"), losses("one"));
    assert_eq!(ranks.len(), 3);
    for (a, b) in ranks.iter().zip(&one) {
        assert!((a - b).abs() < 1e-5, "{ranks:?} vs {one:?}");
    }
}

#[test]
fn bad_settings_are_errors_naming_them() {
    let dir = TempDir::new("lora-errors");
    let llama = "name = \"llama\"\nnum_hidden_layers = 1\nhidden_size = 16\n\
                 intermediate_size = 32\nnum_attention_heads = 2\nmax_position_embeddings = 64";
    for (model, settings, want) in [
        (
            llama,
            "target_modules = [\"qproj\"]",
            "\"qproj\" matches no linear layer",
        ),
        (
            llama,
            "target_modules = [\"qproj\"]",
            "q_proj, up_proj, v_proj",
        ),
        (llama, "r = 0", "`r`"),
        (llama, "lora_dropout = 1.5", "`lora_dropout`"),
        (llama, "target_modules = []", "`target_modules` is empty"),
        (
            llama,
            "target_modules = [\"model.layers.0.self_attn\"]",
            "a llama_attention module",
        ),
        (
            "name = \"gpt2\"\nn_layer = 1\nn_head = 2\nn_embd = 16\nn_positions = 64",
            "",
            "no default `target_modules` for a gpt2_lm_head_model model",
        ),
    ] {
        let mut toml = TrainerToml::tiny_gpt("bad").algorithm("lora", settings);
        toml.model = model.to_owned();
        dir.write("trainer.toml", &toml.render());
        let out = train(&dir, &[], &[]);
        assert!(!out.status.success(), "{settings}: {}", out.dump());
        assert!(out.stderr.contains(want), "{settings}: {}", out.stderr);
    }
}

/// Frozen base weights under sharding: every `[distributed] sharding` mode trains a LoRA run as
/// DDP does on 2 ranks (the same losses, to the bit, and the same adapters).
#[test]
fn every_sharding_mode_trains_lora_as_ddp() {
    use tessera_tests::dist::{assert_all_succeeded, max_difference, train_ranks};
    let dir = TempDir::new("lora-sharding");
    let mut toml = TrainerToml::tiny_gpt("ddp").algorithm("lora", "r = 2");
    toml.model = "name = \"llama\"\nnum_hidden_layers = 2\nhidden_size = 32\n\
                  intermediate_size = 64\nnum_attention_heads = 4\nnum_key_value_heads = 2\n\
                  max_position_embeddings = 64"
        .to_owned();
    dir.write("trainer.toml", &with_checkpoints(&toml, ""));
    let losses = |run: &str| {
        tessera_tests::train_losses(&tessera_tests::read_jsonl(
            &run_dir(&dir, run).join("metrics.jsonl"),
        ))
    };
    for mode in ["ddp", "optimizer", "gradients", "full"] {
        let run = format!("run_name={mode}");
        let sharding = format!("distributed.sharding=\"{mode}\"");
        let mut args = vec![run.as_str(), "train.threads=1"];
        if mode != "ddp" {
            args.push(&sharding);
        }
        assert_all_succeeded(&train_ranks(&dir, 2, &args));
        if mode != "ddp" {
            assert_eq!(losses(mode), losses("ddp"), "{mode}");
            let ckpt = |run: &str| run_dir(&dir, run).join("checkpoints").join("ep0-ba2.ckpt");
            let (diff, name) = max_difference(&ckpt(mode), &ckpt("ddp"), &["model/"]);
            assert_eq!(diff, 0.0, "{mode}: {diff:e} at `{name}`");
        }
    }
}
