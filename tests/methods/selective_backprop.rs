//! The selective_backprop plugin through the real binary on Fashion-MNIST: the batch really
//! shrinks (the plugin's `selective_backprop/kept` metric, the host's sample count in run.json),
//! the schedule interrupts it, the downsampled scoring pass works on a model that accepts
//! smaller images, and it runs before CutOut at `after_dataloader` whatever the order of the
//! two in `trainer.toml`.

use serde_json::Value;
use tessera_tests::*;

/// Settings that prune every batch from the first: half of each batch is kept.
const ALWAYS: &str = "start = 0.0\nend = 1.0\nkeep = 0.5\ninterrupt = 0";

/// `(batch, value)` of every `selective_backprop/kept` metric line.
fn kept(run: &std::path::Path) -> Vec<(u64, f64)> {
    let lines = read_jsonl(&run.join("metrics.jsonl"));
    method_metric(&lines, "selective_backprop/kept")
}

/// The per-batch training losses of a run.
fn run_losses(run: &std::path::Path) -> Vec<f64> {
    train_losses(&read_jsonl(&run.join("metrics.jsonl")))
}

fn run_record(dir: &TempDir, name: &str) -> Value {
    read_json(&run_dir(dir, name).join("run.json"))
}

#[test]
fn active_from_the_start_halves_every_batch() {
    let dir = TempDir::new("sb-always");
    TrainerToml::new("sb")
        .algorithm("selective_backprop", ALWAYS)
        .write_to(&dir);
    let out = train(&dir, &[], &[]);
    out.assert_success();
    assert!(
        out.stderr.contains("loaded plugin selective_backprop"),
        "{}",
        out.dump()
    );
    let run = run_dir(&dir, "sb");
    // One metric per batch, each keeping int(0.5 · 64) = 32 samples.
    assert_eq!(
        kept(&run),
        vec![(0, 32.0), (1, 32.0), (2, 32.0)],
        "{}",
        out.dump()
    );
    let record = run_record(&dir, "sb");
    assert_eq!(record["batches"], 3, "{record:#}");
    // The clock counts the loaded batch, as Composer does (3 of 64); the model trained on
    // 3 batches of 32.
    assert_eq!(record["samples"], 3 * 64, "{record:#}");
    assert_eq!(record["trained_samples"], 3 * 32, "{record:#}");
    assert_eq!(record["plugins"][0]["name"], "selective_backprop");
    assert_eq!(record["plugins"][0]["settings"]["keep"], 0.5);
    for loss in run_losses(&run) {
        assert!(loss.is_finite() && loss > 0.0, "loss {loss}");
    }
}

#[test]
fn interrupt_and_downsampled_scoring() {
    // interrupt = 2: batches 0 and 2 of the epoch are pruned, batch 1 is a full one
    // ((batch_idx + 1) % 2 == 0). scale_factor = 0.5 scores 14×14 images, which ResNet-20
    // (global average pooling) accepts; the kept samples stay 28×28.
    let dir = TempDir::new("sb-interrupt");
    let mut toml = TrainerToml::new("sbi").algorithm(
        "selective_backprop",
        "start = 0.0\nend = 1.0\nkeep = 0.25\nscale_factor = 0.5\ninterrupt = 2",
    );
    toml.model = "name = \"resnet20\"\nwidth = 4".to_owned();
    toml.write_to(&dir);
    let out = train(&dir, &[], &[]);
    out.assert_success();
    let run = run_dir(&dir, "sbi");
    assert_eq!(kept(&run), vec![(0, 16.0), (2, 16.0)], "{}", out.dump());
    let record = run_record(&dir, "sbi");
    assert_eq!(record["samples"], 3 * 64, "{record:#}");
    assert_eq!(record["trained_samples"], 16 + 64 + 16, "{record:#}");
}

#[test]
fn outside_its_window_it_changes_nothing() {
    // Default start = 0.5 over a 3-batch run: batches at t = 0, 1/3 are before the window and
    // t = 2/3 is batch_in_epoch 2, pruned ((2 + 1) % 2 != 0).
    let dir = TempDir::new("sb-window");
    TrainerToml::new("sbw")
        .algorithm("selective_backprop", "")
        .write_to(&dir);
    train(&dir, &[], &[]).assert_success();
    assert_eq!(kept(&run_dir(&dir, "sbw")), vec![(2, 32.0)]);
    let record = run_record(&dir, "sbw");
    assert_eq!(record["samples"], 3 * 64, "{record:#}");
    assert_eq!(record["trained_samples"], 64 + 64 + 32, "{record:#}");
}

/// A CPU run with CutOut and SelectiveBackprop listed in `order`; returns the per-batch losses,
/// the kept counts and the final evaluation.
fn with_cutout(order: [&str; 2]) -> (Vec<f64>, Vec<(u64, f64)>, Value) {
    let dir = TempDir::new("sb-cutout");
    let mut toml = TrainerToml::new("sbc");
    toml.device = Some("cpu".to_owned());
    for plugin in order {
        toml = match plugin {
            "cutout" => toml.algorithm("cutout", "num_holes = 1\nlength = 0.5"),
            _ => toml.algorithm("selective_backprop", ALWAYS),
        };
    }
    let text = toml.render();
    assert!(
        line_of(&text, &format!("plugin = \"{}\"", order[0]))
            < line_of(&text, &format!("plugin = \"{}\"", order[1]))
    );
    toml.write_to(&dir);
    let out = train(&dir, &[], &[]);
    out.assert_success();
    let run = run_dir(&dir, "sbc");
    let record = run_record(&dir, "sbc");
    assert_eq!(record["trained_samples"], 3 * 32, "{record:#}");
    let last = record["evals"]
        .as_array()
        .and_then(|e| e.last())
        .cloned()
        .unwrap_or_else(|| panic!("no eval in {record:#}"));
    (run_losses(&run), kept(&run), last)
}

#[test]
fn runs_before_cutout_whatever_the_toml_order() {
    // Both methods hook `after_dataloader` and both draw from the host's one random stream;
    // SelectiveBackprop also scores the batch it is given. If the toml order decided which ran
    // first (ties: toml order reversed at after_* events), the two runs below would see
    // different random numbers and different inputs, and differ. With SelectiveBackprop's high
    // priority it runs first in both — on uncut images, its draws first — so the runs are the
    // same, bit for bit (CPU runs are deterministic).
    let (loss_a, kept_a, eval_a) = with_cutout(["cutout", "selective_backprop"]);
    let (loss_b, kept_b, eval_b) = with_cutout(["selective_backprop", "cutout"]);
    assert_eq!(kept_a, vec![(0, 32.0), (1, 32.0), (2, 32.0)]);
    assert_eq!(kept_a, kept_b);
    assert_eq!(loss_a.len(), 3, "{loss_a:?}");
    assert_eq!(loss_a, loss_b, "the toml order changed the training losses");
    assert_eq!(
        eval_a, eval_b,
        "the toml order changed the final evaluation"
    );
}

#[test]
fn plugins_inspect_shows_the_priority() {
    let dir = TempDir::new("sb-list");
    TrainerToml::new("unused").write_to(&dir);
    let so = plugin_path("selective_backprop");
    let out = tessera(
        &["plugins", "inspect", so.to_str().expect("a UTF-8 path")],
        dir.path(),
        &[],
    );
    out.assert_success();
    assert!(out.stdout.contains("after_dataloader(+"), "{}", out.dump());
}
