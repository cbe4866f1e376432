//! The seq_length_warmup plugin through the binary, on a tiny GPT-2 over `synthetic-text`:
//! the logged length follows Composer's schedule (the crate's `seq_len_at`, checked against
//! Composer's table in `plugins/seq_length_warmup/tests/golden.rs`), truncation keeps the rows
//! and re-chunking multiplies them, a run in tokens is refused and one in samples accepted as
//! the card says, bad settings are refused naming them, a killed run resumes bit for bit, and
//! the method works together with ALiBi.
//!
//! Its kill -9 resume and the settings its plugin refuses are rows of the method table
//! (tests/methods/table.rs).

use serde_json::Value;
use tessera_tests::*;

use seq_length_warmup::{seq_len_at, Schedule, METRIC_BATCH_SIZE, METRIC_SEQ_LEN};

/// Warmup over half the run from 8 to 32 tokens in steps of 8.
const SETTINGS: &str = "duration = 0.5\nmin_seq_length = 8\nmax_seq_length = 32\nstep_size = 8";
const SCHEDULE: Schedule = Schedule {
    duration: 0.5,
    min_seq_length: 8,
    max_seq_length: 32,
    step_size: 8,
};

fn warmup(run: &str, settings: &str, batches: u64) -> TrainerToml {
    let mut toml = TrainerToml::tiny_gpt(run).algorithm("seq_length_warmup", settings);
    toml.max_duration = format!("{batches}ba");
    toml
}

/// Trains `toml` in a fresh folder; returns (run.json, metrics lines).
fn run(label: &str, toml: &TrainerToml) -> (Value, Vec<Value>) {
    let dir = TempDir::new(label);
    toml.write_to(&dir);
    train(&dir, &[], &[]).assert_success();
    let folder = run_dir(&dir, &toml.run_name);
    (
        read_json(&folder.join("run.json")),
        read_jsonl(&folder.join("metrics.jsonl")),
    )
}

fn values(lines: &[Value], name: &str) -> Vec<f64> {
    method_metric(lines, name)
        .into_iter()
        .map(|(_, v)| v)
        .collect()
}

fn expected_lengths(batches: u64) -> Vec<f64> {
    (0..batches)
        .map(|b| seq_len_at(b, batches, &SCHEDULE).expect("the schedule") as f64)
        .collect()
}

fn assert_finite_perplexity(record: &Value) {
    let p = record["final_perplexity"].as_f64().expect("perplexity");
    assert!(p.is_finite() && p < 64.0, "perplexity {p}");
}

#[test]
fn truncation_follows_composers_schedule_and_the_run_completes() {
    let (record, lines) = run("slw-truncate", &warmup("truncate", SETTINGS, 20));
    let lengths = values(&lines, METRIC_SEQ_LEN);
    assert_eq!(lengths, expected_lengths(20));
    // The schedule grows through every step and ends at the full length.
    let mut steps = lengths.clone();
    steps.dedup();
    assert_eq!(steps, [8.0, 16.0, 24.0, 32.0], "{lengths:?}");
    // Truncation keeps the 8 rows.
    assert_eq!(values(&lines, METRIC_BATCH_SIZE), vec![8.0; 20]);
    assert_eq!(record["trained_samples"], 20 * 8);
    // The clock counts the dataloader's tokens (Composer too): 20 batches of 8 × 32.
    assert_eq!(record["tokens"], 20 * 8 * 32);
    assert_finite_perplexity(&record);
    // The method changes training.
    let mut plain = TrainerToml::tiny_gpt("plain");
    plain.max_duration = "20ba".to_owned();
    let (_, plain_lines) = run("slw-plain", &plain);
    assert_ne!(train_losses(&plain_lines), train_losses(&lines));
}

#[test]
fn re_chunking_gives_more_shorter_rows() {
    let settings = format!("{SETTINGS}\ntruncate = false");
    let (record, lines) = run("slw-rechunk", &warmup("rechunk", &settings, 20));
    let lengths = values(&lines, METRIC_SEQ_LEN);
    assert_eq!(lengths, expected_lengths(20));
    // 8 × 32 tokens re-chunked into rows of L, the remainder dropped (256 // 24 = 10 rows).
    let rows: Vec<f64> = lengths.iter().map(|l| (256.0 / l).floor()).collect();
    assert_eq!(values(&lines, METRIC_BATCH_SIZE), rows);
    assert_eq!(
        record["trained_samples"].as_f64(),
        Some(rows.iter().sum::<f64>())
    );
    assert_finite_perplexity(&record);
}

#[test]
fn a_run_in_tokens_is_refused_and_one_in_samples_accepted() {
    let dir = TempDir::new("slw-tokens");
    let mut toml = warmup("tokens", SETTINGS, 20);
    toml.max_duration = "5120tok".to_owned();
    toml.write_to(&dir);
    train(&dir, &[], &[]).assert_failure(&["seq_length_warmup", "max_duration", "`ep`, `ba`"]);

    // 160 samples of 8 per batch: the host knows the run has 20 batches.
    let mut toml = warmup("samples", SETTINGS, 20);
    toml.max_duration = "160sp".to_owned();
    let (record, lines) = run("slw-samples", &toml);
    assert_eq!(record["batches"], 20);
    assert_eq!(values(&lines, METRIC_SEQ_LEN), expected_lengths(20));
}

#[test]
fn a_warmup_too_short_for_its_steps_is_refused_naming_the_settings() {
    // A warmup of 2 batches for 3 length steps: Composer divides by zero; here the error says
    // which settings to change.
    let dir = TempDir::new("slw-short");
    warmup("short", &SETTINGS.replace("0.5", "0.1"), 20).write_to(&dir);
    train(&dir, &[], &[]).assert_failure(&["duration", "step_size", "2 batches"]);
}

/// `after_dataloader` is an `after_*` event: methods of equal priority run in reverse
/// `trainer.toml` order there (Composer's FILO rule, docs of host/src/engine). Listed after
/// ALiBi, the warmup runs first and cuts the dataloader's rows (8 of L), then ALiBi makes 32
/// rows of L / 4. Listed before ALiBi, it sees ALiBi's rows of 8 tokens and has nothing to
/// cut: training is ALiBi's alone.
#[test]
fn with_alibi_the_order_in_the_file_decides_which_batch_is_warmed_up() {
    let with = |run: &str, warmup_listed_first: bool| {
        let mut toml = TrainerToml::tiny_gpt(run);
        toml.max_duration = "20ba".to_owned();
        let methods = [
            ("alibi", "max_sequence_length = 64"),
            ("seq_length_warmup", SETTINGS),
        ];
        let order: Vec<_> = if warmup_listed_first {
            methods.iter().rev().collect()
        } else {
            methods.iter().collect()
        };
        for (plugin, settings) in order {
            toml = toml.algorithm(plugin, settings);
        }
        toml
    };
    let mut alone =
        TrainerToml::tiny_gpt("alibi-alone").algorithm("alibi", "max_sequence_length = 64");
    alone.max_duration = "20ba".to_owned();
    let (_, alibi_only) = run("slw-alibi-alone", &alone);

    let (record, lines) = run("slw-alibi", &with("warmup-then-alibi", false));
    assert_eq!(values(&lines, METRIC_SEQ_LEN), expected_lengths(20));
    assert_eq!(values(&lines, METRIC_BATCH_SIZE), vec![8.0; 20]);
    assert_eq!(record["trained_samples"], 20 * 32);
    assert_finite_perplexity(&record);
    assert_ne!(train_losses(&alibi_only), train_losses(&lines));

    let (record, lines) = run("slw-alibi-first", &with("alibi-then-warmup", true));
    assert_eq!(values(&lines, METRIC_BATCH_SIZE), vec![32.0; 20]);
    assert_eq!(record["trained_samples"], 20 * 32);
    assert_eq!(train_losses(&alibi_only), train_losses(&lines));
}
