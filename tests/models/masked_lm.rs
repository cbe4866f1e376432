//! The data side of BERT through the binary: masked-LM batches (`[data.mlm]`) trained end to
//! end, their run record, exact resume and rank independence (the masks are drawn per sample),
//! and labelled text (`dataset = "labelled-text"`) refused for a language model. (The GPT-2 of
//! the zoo stands in for an encoder here: what is tested is the data, the loss over ignored
//! positions and the clock.)

use serde_json::Value;
use tessera_tests::dist::assert_order_is_rank_independent_and_resumes_exactly;
use tessera_tests::resume::assert_killed_and_resumed_is_exact;
use tessera_tests::*;

/// The `[data]` of [`TrainerToml::gpt`] (synthetic text, 64 token ids) with masked-LM.
fn synthetic_mlm() -> String {
    format!("{SYNTHETIC_TEXT_DATA}\n\n[data.mlm]\nprobability = 0.15\n")
}

#[test]
fn masked_lm_batches_train_and_are_recorded() {
    let dir = TempDir::new("mlm-train");
    let mut toml = TrainerToml::gpt("mlm-train");
    toml.data = synthetic_mlm();
    toml.max_duration = "6ba".to_owned();
    toml.write_to(&dir);
    let out = train(
        &dir,
        &["train.eval_interval=3ba", "train.eval_subset_batches=0"],
        &[],
    );
    out.assert_success();
    let record = read_json(&run_dir(&dir, "mlm-train").join("run.json"));
    // 64 ids, then [PAD] [CLS] [SEP] [MASK] reserved: the model predicts one of 68.
    let facts = &record["text_data"];
    assert_eq!(facts["vocab_size"], 68, "{record:#}");
    let specials = &facts["special_tokens"];
    assert_eq!(
        (
            &specials["pad"],
            &specials["cls"],
            &specials["sep"],
            &specials["mask"]
        ),
        (
            &Value::from(64),
            &Value::from(65),
            &Value::from(66),
            &Value::from(67)
        ),
        "{record:#}"
    );
    assert!(facts.get("classes").is_none(), "{record:#}");
    assert_eq!(record["config"]["data"]["mlm"]["mask_fraction"], 0.8);
    assert_eq!(record["tokens"], 6 * 8 * 32);
    let evals = record["evals"].as_array().expect("evals");
    assert_eq!(evals.len(), 2, "{record:#}");
    // Scored over the selected positions only (-100 elsewhere is ignored): a finite loss near
    // ln(68) = 4.2 at first, and the same masks in both evaluations (fixed), so a fall is the
    // model's.
    let ce: Vec<f64> = evals
        .iter()
        .map(|e| e["cross_entropy"].as_f64().expect("cross_entropy"))
        .collect();
    assert!(ce.iter().all(|c| c.is_finite() && *c < 6.0), "{ce:?}");
    assert!(ce[1] < ce[0], "{ce:?}");
}

#[test]
fn killed_and_resumed_masked_lm_run_equals_the_straight_run_bit_for_bit() {
    assert_killed_and_resumed_is_exact("mlm-resume", |run| {
        let mut toml = TrainerToml::gpt(run);
        toml.data = synthetic_mlm();
        toml.max_duration = "8ba".to_owned();
        toml
    });
}

#[test]
fn masked_lm_on_two_ranks_trains_as_one_process_and_resumes_exactly() {
    let dir = TempDir::new("mlm-ranks");
    let mut toml = TrainerToml::gpt("mlm-ranks");
    // Every position selected (synthetic text has no special token), so that each rank scores
    // as many targets: with fewer, each rank's mean over its own selected positions, averaged
    // over the ranks, is not the one process's mean over all of them (as in PyTorch DDP), and
    // the weights would differ for that reason alone. Which positions become [MASK], a random
    // id or stay is still drawn per sample, and must be the same on 1 and 2 ranks.
    toml.data = synthetic_mlm().replace("probability = 0.15", "probability = 1.0");
    dir.write(
        "trainer.toml",
        &format!("{}\n[checkpoint]\ninterval = \"3ba\"\n", toml.render()),
    );
    // Tiny GPT, AdamW: rounding of the 2-rank gradient average vs the one-process mean.
    assert_order_is_rank_independent_and_resumes_exactly(&dir, 4, &[], 1e-5);
}

#[test]
fn labelled_text_is_not_for_a_language_model() {
    let dir = TempDir::new("labelled-gpt");
    let data = repo_root().join("examples/finetune/labelled-text");
    let mut toml = TrainerToml::gpt("labelled-gpt");
    toml.data = format!(
        "dataset = \"labelled-text\"\ndata_dir = '{}'\nbatch_size = 8\nworkers = 0\n\n\
         [data.text]\nseq_len = 32\nvocab_size = 300\neval_path = '{}'\ncache_dir = '{}'\n",
        data.join("train.jsonl").display(),
        data.join("eval.jsonl").display(),
        dir.join("cache").display()
    );
    toml.write_to(&dir);
    train(&dir, &[], &[]).assert_failure(&[
        "model \"gpt2\" is a language model",
        "labelled text of 2 classes",
    ]);
}
