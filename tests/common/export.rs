//! Checking a file written by `tessera export` against PyTorch (`scripts/check_export.py`).

use std::path::Path;
use std::process::ExitStatus;

use tch::{Device, Kind, Tensor};
use tessera::trainer::{standalone_config, Trainer};

use crate::{python, python_can_import, transformers_imports, TempDir};

/// Runs scripts/check_export.py on `exported` and the case file `case` (a batch `input` and
/// Tessera's eval-mode `output` for it); returns (exit code, stdout + stderr).
pub fn check_export(exported: &Path, case: &Path) -> (Option<i32>, String) {
    let (status, text) = run_check("scripts/check_export.py", exported, case);
    (status.code(), text)
}

/// `python SCRIPT FOLDER_OR_FILE CASE` (a check script of `scripts/`): its exit status and its
/// stdout followed by its stderr.
fn run_check(script: &str, exported: &Path, case: &Path) -> (ExitStatus, String) {
    let out = python(&[
        script,
        &exported.display().to_string(),
        &case.display().to_string(),
    ])
    .unwrap_or_else(|e| panic!("{e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status, text)
}

/// Tessera's evaluation output for `input`: the run of the checkpoint `ckpt` rebuilt with its
/// plugins, as `tessera eval` rebuilds it.
pub fn rebuilt_output(ckpt: &Path, input: &Tensor) -> Tensor {
    let cfg = standalone_config(ckpt, &[]).expect("the recorded config loads");
    let trainer = Trainer::standalone(cfg, Vec::new()).expect("the run rebuilds");
    tch::no_grad(|| trainer.model().root.forward(input, false)).expect("eval forward")
}

/// Writes a case file (3 random `shape` inputs and the rebuilt run's output for them) and
/// requires scripts/check_export.py to load `exported` strictly and match that output (when
/// torch and, for `needs`, that module import; see [`python_can_import`]).
pub fn assert_export_matches_rebuilt_run(
    dir: &TempDir,
    ckpt: &Path,
    exported: &Path,
    shape: [i64; 3],
    needs: &str,
    label: &str,
) {
    tch::manual_seed(99);
    let input = Tensor::randn(
        [3, shape[0], shape[1], shape[2]],
        (Kind::Float, Device::Cpu),
    );
    assert_export_matches_rebuilt_run_on(dir, ckpt, exported, &input, needs, label);
}

/// [`assert_export_matches_rebuilt_run`] on a given batch `input` (for gpt2: int64 token ids
/// `(B, T)`).
pub fn assert_export_matches_rebuilt_run_on(
    dir: &TempDir,
    ckpt: &Path,
    exported: &Path,
    input: &Tensor,
    needs: &str,
    label: &str,
) {
    let output = rebuilt_output(ckpt, input);
    let case = dir.join("case.safetensors");
    Tensor::write_safetensors(&[("input", input), ("output", &output)], &case)
        .expect("write the case");
    if !python_can_import(needs, &format!("the export of {label}")) {
        return;
    }
    let (code, text) = check_export(exported, &case);
    assert_eq!(code, Some(0), "check_export.py, {label}:\n{text}");
    eprintln!("{label}: {}", text.trim());
}

/// [`assert_export_matches_rebuilt_run`] for a language model: 3 random sequences of `seq_len`
/// token ids below `vocab`, compared as logits; the twin is Hugging Face's `GPT2LMHeadModel`
/// when transformers imports (required with `TESSERA_REQUIRE_TRANSFORMERS=1`), else the plain
/// PyTorch GPT-2 of scripts/pytorch_models.py.
pub fn assert_token_export_matches_rebuilt_run(
    dir: &TempDir,
    ckpt: &Path,
    exported: &Path,
    vocab: i64,
    seq_len: i64,
    label: &str,
) {
    tch::manual_seed(99);
    let input = Tensor::randint(vocab, [3, seq_len], (Kind::Int64, Device::Cpu));
    let output = rebuilt_output(ckpt, &input);
    let case = dir.join("case.safetensors");
    Tensor::write_safetensors(&[("input", &input), ("output", &output)], &case)
        .expect("write the case");
    if !python_can_import("torch", &format!("the export of {label}")) {
        return;
    }
    let hugging_face = transformers_imports();
    let (code, text) = check_export(exported, &case);
    assert_eq!(code, Some(0), "check_export.py, {label}:\n{text}");
    if hugging_face {
        assert!(text.contains("GPT2LMHeadModel"), "{text}");
    }
    eprintln!("{label}: {}", text.trim());
}

/// `tessera export CKPT --format hf --to OUT` in `dir`, which must succeed.
pub fn export_hf(dir: &TempDir, ckpt: &Path, out: &Path) {
    crate::tessera(
        &[
            "export",
            &ckpt.display().to_string(),
            "--format",
            "hf",
            "--to",
            &out.display().to_string(),
        ],
        dir.path(),
        &[],
    )
    .assert_success();
}

/// Writes `case` (the inputs, `input` and for BERT `attention_mask` and `token_type_ids`, and
/// Tessera's logits for them as `output`) into `dir` and requires scripts/check_hf_export.py to
/// load the Hugging Face folder `folder` with the Auto class of its architecture, nothing missing
/// or unexpected, and give those logits. Returns the script's report, or `None` when
/// transformers does not import (see [`transformers_imports`]). `label` names the case.
pub fn check_hf_export(
    dir: &TempDir,
    folder: &Path,
    case: &[(&str, &Tensor)],
    label: &str,
) -> Option<String> {
    let file = dir.join(&format!("{label}-case.safetensors"));
    Tensor::write_safetensors(case, &file).expect("write the case");
    if !transformers_imports() {
        return None;
    }
    let (status, text) = run_check("scripts/check_hf_export.py", folder, &file);
    assert!(status.success(), "{label}: {text}");
    println!("{label} hf export: {}", text.trim());
    Some(text)
}
