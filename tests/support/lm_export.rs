//! Exporting a trained GPT-2 run with plugin modules kept, and checking the file against the
//! PyTorch twins ([`export_and_check_twins`]): what each row of the export table in
//! tests/methods/table.rs (alibi, gated_linear_units, logit_softcap, modded_nanogpt, qk_norm,
//! relu_squared, rotary) checks, besides the method's own assertions (`#[path]` module).

use std::path::{Path, PathBuf};

use serde_json::Value;
use tessera::config;
use tessera_plugin_api::tch::{self, Device, Kind, Tensor};
use tessera_tests::export::assert_export_matches_rebuilt_run_on;
use tessera_tests::*;

/// What an exported GPT-2 run holds, for the method's own assertions.
pub struct Export {
    /// The exported tensors.
    pub tensors: Vec<(String, Tensor)>,
    /// The export's `tessera.modules`: the plugin modules it kept.
    pub modules: Value,
}

/// Trains the GPT-2 run `toml` in `dir`, exports its last checkpoint and checks the file: it
/// keeps exactly the modules `kept` (`(path, kind)`, in order); on `t` tokens it computes what
/// the rebuilt run computes (Hugging Face's class, through scripts/check_export.py) and so does
/// the plain-PyTorch twin. `label` names the case in messages.
pub fn export_and_check_twins(
    dir: &TempDir,
    toml: &TrainerToml,
    kept: &[(&str, &str)],
    t: i64,
    label: &str,
) -> Export {
    let (ckpt, exported, tensors, modules) = train_and_export(dir, toml);
    let got: Vec<(&str, &str)> = modules
        .as_array()
        .expect("a list")
        .iter()
        .map(|m| (m["path"].as_str().unwrap(), m["kind"].as_str().unwrap()))
        .collect();
    assert_eq!(got, kept, "{modules:#}");
    assert_export_matches_rebuilt_run_on(dir, &ckpt, &exported, &tokens(t), "torch", label);
    if let Some(text) = check_with_plain_twin(&exported, &dir.join("case.safetensors")) {
        eprintln!("{label}, plain twin: {}", text.trim());
    }
    Export { tensors, modules }
}

/// Trains `toml` and exports its last checkpoint; returns (checkpoint, export, tensors,
/// `tessera.modules`).
fn train_and_export(
    dir: &TempDir,
    toml: &TrainerToml,
) -> (PathBuf, PathBuf, Vec<(String, Tensor)>, Value) {
    toml.write_to(dir);
    train(dir, &[], &[]).assert_success();
    let cfg = config::load(&dir.join("trainer.toml"), &[]).expect("the config loads");
    let ckpt = tessera::checkpoint::list(&cfg.checkpoint.folder)
        .last()
        .cloned()
        .expect("the run wrote a checkpoint");
    let exported = dir.join("model.safetensors");
    tessera(
        &[
            "export",
            &ckpt.display().to_string(),
            "--to",
            &exported.display().to_string(),
        ],
        dir.path(),
        &[],
    )
    .assert_success();
    let tensors = Tensor::read_safetensors(&exported).expect("the export reads");
    let bytes = std::fs::read(&exported).expect("read the export");
    let len = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + len]).expect("JSON header");
    let modules = serde_json::from_str(
        header["__metadata__"]["tessera.modules"]
            .as_str()
            .expect("tessera.modules"),
    )
    .expect("tessera.modules is JSON");
    (ckpt, exported, tensors, modules)
}

/// scripts/check_export.py with the plain-PyTorch GPT-2 twin forced (`TESSERA_GPT2_TWIN=1`)
/// over Hugging Face's class; `None` when torch does not import (see `python_can_import`).
fn check_with_plain_twin(exported: &Path, case: &Path) -> Option<String> {
    if !python_can_import("torch", "the export against the plain twin") {
        return None;
    }
    let out = python_with_env(
        &[
            "scripts/check_export.py",
            exported.to_str().expect("a UTF-8 temp path"),
            case.to_str().expect("a UTF-8 temp path"),
        ],
        &[("TESSERA_GPT2_TWIN", "1")],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(0), "plain twin:\n{text}");
    assert!(text.contains("pytorch_models.GPT2LMHeadModel"), "{text}");
    Some(text)
}

/// Token ids `(3, t)` below 64.
fn tokens(t: i64) -> Tensor {
    tch::manual_seed(99);
    Tensor::randint(64, [3, t], (Kind::Int64, Device::Cpu))
}
