//! Exporting a trained GPT-2 run with plugin modules kept, and checking the file against the
//! PyTorch twins: shared by tests/methods/alibi.rs and tests/methods/gated_linear_units.rs (`#[path]` module).

use std::path::{Path, PathBuf};

use serde_json::Value;
use tessera::config;
use tessera_plugin_api::tch::{self, Device, Kind, Tensor};
use tessera_tests::*;

/// Trains `toml` and exports its last checkpoint; returns (checkpoint, export, tensors,
/// `tessera.modules`).
pub fn train_and_export(
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
pub fn check_with_plain_twin(exported: &Path, case: &Path) -> Option<String> {
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
pub fn tokens(t: i64) -> Tensor {
    tch::manual_seed(99);
    Tensor::randint(64, [3, t], (Kind::Int64, Device::Cpu))
}
