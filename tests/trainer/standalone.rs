//! `tessera eval` and `tessera predict` through the real binary, on a short Fashion-MNIST run
//! with EMA (whose shadow weights are what a checkpoint holds as the model), label smoothing and
//! CutOut: the checkpoint evaluates to the run's final evaluation, the predictions reproduce
//! it, the run folder is left as it was, and bad paths are errors naming the file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;
use tessera_tests::{read_json, read_jsonl, run_dir, tessera, train, TempDir, TrainerToml};

/// Trains the run `name` in `dir` (3 batches, checkpoint at the end); returns its run.json.
fn trained(dir: &TempDir, name: &str) -> Value {
    TrainerToml::new(name)
        .algorithm("ema", "half_life = \"1ba\"")
        .with_both_plugins()
        .write_to(dir);
    train(dir, &[], &[]).assert_success();
    read_json(&run_dir(dir, name).join("run.json"))
}

/// Every file under `folder` with its bytes.
fn contents(folder: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut stack = vec![folder.to_owned()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let bytes = std::fs::read(&path).unwrap();
                files.insert(path, bytes);
            }
        }
    }
    files
}

fn eval_json(dir: &TempDir, args: &[&str]) -> Value {
    let mut all = vec!["eval"];
    all.extend_from_slice(args);
    all.push("--json");
    let out = tessera(&all, dir.path(), &[]);
    out.assert_success();
    serde_json::from_str(out.stdout.trim())
        .unwrap_or_else(|e| panic!("stdout is not JSON: {e}\n{}", out.dump()))
}

/// The share of lines whose `predicted` equals their `target`.
fn accuracy_of(lines: &[Value]) -> f64 {
    let hits = lines
        .iter()
        .filter(|l| l["predicted"] == l["target"])
        .count();
    hits as f64 / lines.len() as f64
}

#[test]
fn eval_and_predict_reproduce_the_run() {
    let dir = TempDir::new("standalone");
    let record = trained(&dir, "standalone");
    let last = record["evals"]
        .as_array()
        .and_then(|e| e.last())
        .cloned()
        .expect("an evaluation in run.json");
    let run = run_dir(&dir, "standalone");
    let ckpt = run.join("checkpoints/latest.ckpt");
    let ckpt_arg = ckpt.to_str().unwrap();
    let before = contents(&run);

    // The checkpoint evaluates exactly as the run's final evaluation (500 test images).
    let result = eval_json(&dir, &[ckpt_arg]);
    for key in ["accuracy", "cross_entropy", "samples", "epoch", "batch"] {
        assert_eq!(
            result[key], last[key],
            "{key}: {result:#} vs run.json {last:#}"
        );
    }
    assert_eq!(result["checkpoint"], Value::from(ckpt_arg));

    // The trainer.toml with checkpoint.autoresume loads the same checkpoint; without it, the
    // fresh model is evaluated.
    let toml = dir.join("trainer.toml");
    let toml_arg = toml.to_str().unwrap();
    let resumed = eval_json(&dir, &[toml_arg, "--set", "checkpoint.autoresume=true"]);
    assert_eq!(resumed["accuracy"], last["accuracy"], "{resumed:#}");
    assert!(resumed["checkpoint"].as_str().is_some(), "{resumed:#}");
    let fresh = eval_json(&dir, &[toml_arg]);
    assert_eq!(fresh["checkpoint"], Value::Null, "{fresh:#}");
    assert_eq!(fresh["batch"], 0, "{fresh:#}");

    // The whole test set, written with --to, and the predictions of the same model agree.
    let full = dir.join("eval.json");
    let out = tessera(
        &[
            "eval",
            ckpt_arg,
            "--set",
            "train.eval_subset_batches=0",
            "--to",
            full.to_str().unwrap(),
        ],
        dir.path(),
        &[],
    );
    out.assert_success();
    assert!(out.stdout.contains("accuracy "), "{}", out.dump());
    let full = read_json(&full);
    let predictions = dir.join("out/predictions.jsonl");
    let out = tessera(
        &["predict", ckpt_arg, "--to", predictions.to_str().unwrap()],
        dir.path(),
        &[],
    );
    out.assert_success();
    let lines = read_jsonl(&predictions);
    assert_eq!(
        Value::from(lines.len()),
        full["samples"],
        "one line per test sample"
    );
    assert_eq!(Value::from(accuracy_of(&lines)), full["accuracy"]);
    // The evaluation's 500 images are those the run record lists.
    let subset: Vec<Value> = record["eval_subset"]["indices"]
        .as_array()
        .expect("the evaluated indices")
        .iter()
        .map(|i| lines[i.as_u64().expect("an index") as usize].clone())
        .collect();
    assert_eq!(Value::from(subset.len()), last["samples"]);
    assert_eq!(Value::from(accuracy_of(&subset)), last["accuracy"]);
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(line["index"], i, "{line}");
        let p: Vec<f64> = line["probabilities"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        assert_eq!(p.len(), 10, "{line}");
        assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-4, "{line}");
        let argmax = (0..p.len()).max_by(|&a, &b| p[a].total_cmp(&p[b])).unwrap();
        assert_eq!(line["predicted"], argmax, "{line}");
    }

    // No training, no checkpoint, no metrics line: the run folder is as it was.
    assert_eq!(
        contents(&run),
        before,
        "eval and predict changed the run folder"
    );
}

#[test]
fn bad_paths_are_errors_naming_the_file() {
    let dir = TempDir::new("standalone-errors");
    let missing = dir.join("nothing.ckpt");
    let missing = missing.to_str().unwrap();
    for command in ["eval", "predict"] {
        let out = tessera(&[command, missing, "--to", "p.jsonl"], dir.path(), &[]);
        out.assert_failure(&[missing, "no such file", "trainer.toml"]);
    }
    let notes = dir.write("notes.txt", "hello");
    let notes = notes.to_str().unwrap();
    tessera(&["eval", notes], dir.path(), &[])
        .assert_failure(&[notes, "neither a checkpoint (.ckpt) nor a trainer.toml"]);
    let folder = dir.path().to_str().unwrap();
    tessera(&["eval", folder], dir.path(), &[]).assert_failure(&[folder, "is a folder"]);
    let corrupt = dir.write("corrupt.ckpt", "not a checkpoint");
    let corrupt = corrupt.to_str().unwrap();
    tessera(&["eval", corrupt], dir.path(), &[]).assert_failure(&[corrupt, "corrupt"]);
    let bad_toml = dir.write("bad.toml", "[train]\nmax_duration = 3\n");
    let bad_toml = bad_toml.to_str().unwrap();
    tessera(&["predict", bad_toml, "--to", "p.jsonl"], dir.path(), &[]).assert_failure(&[bad_toml]);

    // A good checkpoint, but predictions aimed at a folder or at the checkpoint itself.
    trained(&dir, "errors");
    let ckpt = run_dir(&dir, "errors").join("checkpoints/latest.ckpt");
    let ckpt = ckpt.to_str().unwrap();
    let bytes = std::fs::read(ckpt).unwrap();
    tessera(&["predict", ckpt, "--to", folder], dir.path(), &[])
        .assert_failure(&[folder, "is a folder"]);
    tessera(&["predict", ckpt, "--to", ckpt], dir.path(), &[]).assert_failure(&["refusing", ckpt]);
    assert_eq!(
        std::fs::read(ckpt).unwrap(),
        bytes,
        "the checkpoint is untouched"
    );
}
