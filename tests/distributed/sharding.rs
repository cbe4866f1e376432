//! `[distributed] sharding` (ZeRO) on c10d's Gloo backend: each mode trains what DDP
//! (`sharding = "none"`) trains on the same ranks, its checkpoints hold the whole optimizer
//! state, and a run continues from them on another number of ranks and in another mode.

use std::path::PathBuf;

use tessera_tests::dist::{assert_all_succeeded, max_difference, train_ranks};
use tessera_tests::*;

fn ckpt(dir: &TempDir, run: &str, name: &str) -> PathBuf {
    run_dir(dir, run).join("checkpoints").join(name)
}

/// Trains `toml` on `world` ranks once per mode (run named after the mode), one thread each.
fn train_modes(dir: &TempDir, toml: &TrainerToml, world: usize, modes: &[&str]) {
    let checkpoints = "[checkpoint]\ninterval = \"5ba\"\n";
    dir.write("trainer.toml", &format!("{}\n{checkpoints}", toml.render()));
    for mode in modes {
        let run = format!("run_name={mode}");
        let sharding = format!("distributed.sharding={}", toml_string(mode));
        let outputs = train_ranks(dir, world, &[&run, &sharding, "train.threads=1"]);
        assert_all_succeeded(&outputs);
    }
}

/// The largest relative difference between the runs' final model, optimizer state and
/// methods' state (EMA's averages), and between their logged losses.
fn differences(dir: &TempDir, a: &str, b: &str, last: &str) -> (f64, String, f64) {
    let (diff, name) = max_difference(
        &ckpt(dir, a, last),
        &ckpt(dir, b, last),
        &["model/", "optim/", "method/"],
    );
    let losses = |run: &str| train_losses(&read_jsonl(&run_dir(dir, run).join("metrics.jsonl")));
    let (la, lb) = (losses(a), losses(b));
    assert_eq!(la.len(), lb.len(), "{la:?} vs {lb:?}");
    let loss = la
        .iter()
        .zip(&lb)
        .map(|(x, y)| (x - y).abs() / x.abs().max(1.0))
        .fold(0.0, f64::max);
    (diff, name, loss)
}

/// How each sharded mode may differ from DDP on the same ranks.
enum Limit {
    /// At most this (relative): model, optimizer state and losses.
    Fixed(f64),
    /// At most 1e-6 after 5 steps, and at the end at most twice what DDP itself moves when
    /// libtorch reorders its sums (2 threads instead of 1): for models whose batch norm
    /// amplifies a last-bit difference step after step. The fused kernels round the elements
    /// at a tensor's edge (the vector loop's tail) their own way, so a piece and its part of
    /// the whole tensor can differ in the last bit.
    Rounding,
}

/// Every mode, DDP first.
const MODES: [&str; 4] = ["none", "optimizer", "gradients", "full"];

/// Each sharded mode of `modes` (DDP first) against DDP on the same ranks, within `limit`.
fn assert_modes_match_ddp(
    label: &str,
    toml: &TrainerToml,
    world: usize,
    limit: Limit,
    modes: &[&str],
) {
    let dir = TempDir::new(label);
    train_modes(&dir, toml, world, modes);
    let last = "latest.ckpt";
    let tolerance = match limit {
        Limit::Fixed(t) => t,
        Limit::Rounding => {
            for mode in &modes[1..] {
                let (diff, name, _) = differences(&dir, "none", mode, "ep0-ba5.ckpt");
                eprintln!("{label}: {mode} after 5 steps: {diff:e} at `{name}`");
                assert!(
                    diff <= 1e-6,
                    "{label}: sharding = {mode} differs from DDP after 5 steps by {diff:e} at \
                     `{name}`"
                );
            }
            let run = ["run_name=threads", "train.threads=2"];
            assert_all_succeeded(&train_ranks(&dir, world, &run));
            let (noise, _, loss_noise) = differences(&dir, "none", "threads", last);
            eprintln!("{label}: DDP with 2 threads moves {noise:e} (losses {loss_noise:e})");
            2.0 * noise.max(loss_noise)
        }
    };
    // `full` gives every unit buffers of its own, so the ranks' pieces start and end at other
    // elements than in one 25 MiB buffer, and the fused kernels round the elements at a
    // piece's edge their own way (see `Limit::Rounding`): the limit is what `gradients` moves
    // when its buffers are cut elsewhere (0.01 MiB), which AdamW amplifies over the steps.
    let full_tolerance = match limit {
        Limit::Fixed(t) if modes.contains(&"full") && world > 2 => {
            let run = [
                "run_name=cut",
                "train.threads=1",
                "distributed.sharding=\"gradients\"",
                "distributed.bucket_mb=0.01",
            ];
            assert_all_succeeded(&train_ranks(&dir, world, &run));
            let (noise, _, loss_noise) = differences(&dir, "none", "cut", last);
            eprintln!("{label}: gradients cut elsewhere moves {noise:e} (losses {loss_noise:e})");
            t.max(2.0 * noise.max(loss_noise))
        }
        _ => tolerance,
    };
    for mode in &modes[1..] {
        let tolerance = if *mode == "full" {
            full_tolerance
        } else {
            tolerance
        };
        let (diff, name, loss) = differences(&dir, "none", mode, last);
        eprintln!("{label}: {mode} on {world} ranks: {diff:e} at `{name}`, losses {loss:e}");
        assert!(
            diff <= tolerance && loss <= tolerance,
            "{label}: sharding = {mode} on {world} ranks differs from DDP by {diff:e} at `{name}` \
             and {loss:e} in the losses (limit {tolerance:e})"
        );
        let record = read_json(&run_dir(&dir, mode).join("run.json"));
        let dp = &record["data_parallel"];
        assert_eq!(dp["sharding"], *mode, "{record:#}");
        let (mine, all) = (
            dp["sharded_elements_rank0"].as_f64().unwrap_or(0.0),
            dp["sharded_elements"].as_f64().unwrap_or(0.0),
        );
        // Rank 0 steps its 1/world share (the buffers are padded to a multiple of the ranks).
        assert!(
            all > 0.0 && (mine - all / world as f64).abs() <= all * 0.02 + 64.0,
            "{label}: rank 0 holds {mine} of {all} elements: {record:#}"
        );
    }
}

#[test]
fn cnn_with_sgd_on_two_ranks_trains_as_ddp_in_every_mode() {
    let mut toml = TrainerToml::new("shard-cnn");
    toml.max_duration = "20ba".to_owned();
    toml.data = toml.data.replace("batch_size = 64", "batch_size = 16");
    // A CNN has no blocks for `full` to gather one at a time (refused: see below).
    assert_modes_match_ddp("shard-cnn", &toml, 2, Limit::Rounding, &MODES[..3]);
}

#[test]
fn resnet20_with_adamw_on_two_ranks_trains_as_ddp_in_every_mode() {
    let mut toml = TrainerToml::new("shard-resnet");
    toml.model = "name = \"resnet20\"\nwidth = 4".to_owned();
    toml.optimizer = "name = \"adamw\"\nlr = 0.003\nweight_decay = 0.01".to_owned();
    toml.max_duration = "20ba".to_owned();
    toml.data = toml.data.replace("batch_size = 64", "batch_size = 16");
    // EMA averages this rank's slices at every step and swaps them in for the evaluation:
    // with batch norm's buffers (whole on every rank) beside the sharded parameters.
    let toml = toml
        .algorithm("channels_last", "")
        .algorithm("ema", "half_life = \"5ba\"");
    assert_modes_match_ddp("shard-resnet", &toml, 2, Limit::Rounding, &MODES);
}

/// Summing two ranks' gradients is exact in any order (a + b = b + a), and without batch
/// norm the last-bit differences of the fused kernels at a piece's edges do not show here: two
/// ranks agree bit for bit. Muon orthogonalises whole matrices (it claims them: they stay whole, all-reduced as under
/// DDP); AdamW steps the rest, sharded.
#[test]
fn gpt2_with_muon_and_adamw_on_two_ranks_trains_as_ddp_in_every_mode() {
    let mut toml = TrainerToml::tiny_gpt("shard-gpt");
    toml.model = toml.model.replace("n_layer = 2", "n_layer = 4");
    toml.max_duration = "20ba".to_owned();
    let toml = toml.algorithm("muon", "lr = 0.02");
    assert_modes_match_ddp("shard-gpt", &toml, 2, Limit::Fixed(0.0), &MODES);
}

/// EMA, SWA and Lookahead keep a copy of the weights: under sharding each rank keeps and
/// updates its slice only (plugin-api 1.10), writes (EMA's swap for the evaluation and the
/// checkpoints, Lookahead's syncs, SWA's replacement) reach the whole parameters, and their
/// checkpointed state is gathered whole: the same state and losses as DDP.
#[test]
fn weight_averaging_methods_keep_their_slices_and_train_as_ddp() {
    let mut toml = TrainerToml::tiny_gpt("shard-avg");
    toml.model = toml.model.replace("n_layer = 2", "n_layer = 4");
    toml.max_duration = "20ba".to_owned();
    let toml = toml
        .algorithm("ema", "half_life = \"3ba\"")
        .algorithm("lookahead", "k = 3\nalpha = 0.5")
        .algorithm(
            "swa",
            "swa_start = \"0.25dur\"\nswa_end = \"0.8dur\"\nupdate_interval = \"2ba\"",
        );
    assert_modes_match_ddp("shard-avg", &toml, 2, Limit::Fixed(1e-6), &MODES);
    // Each rank kept its slices, not the whole weights.
    let dir = TempDir::new("shard-avg-log");
    dir.write("trainer.toml", &toml.render());
    let outputs = train_ranks(
        &dir,
        2,
        &["distributed.sharding=\"full\"", "train.threads=1"],
    );
    assert_all_succeeded(&outputs);
    let log = format!("{}{}", outputs[0].stdout, outputs[0].stderr);
    assert!(
        log.contains("ema: the weights are sharded: this rank averages its slices"),
        "{log}"
    );
}

/// Four ranks: a reduce-scatter may sum in another order than DDP's all-reduce; equal within
/// float rounding (bit for bit here).
#[test]
fn gpt2_with_adamw_on_four_ranks_trains_as_ddp_in_every_mode() {
    let mut toml = TrainerToml::tiny_gpt("shard-gpt4");
    toml.model = toml.model.replace("n_layer = 2", "n_layer = 4");
    toml.max_duration = "20ba".to_owned();
    assert_modes_match_ddp("shard-gpt4", &toml, 4, Limit::Fixed(1e-6), &MODES);
}

/// The "loss continuity" check: a checkpoint of 4 ranks with everything sharded (each rank's
/// slices in its own file) continues on 2 ranks with a sharded optimizer state and on 1 process, with the same global batch, where the
/// straight run went (the same samples in the same steps; sums in another order).
#[test]
fn a_sharded_checkpoint_continues_on_other_ranks_and_modes() {
    let mut toml = TrainerToml::tiny_gpt("straight");
    toml.max_duration = "8ba".to_owned();
    // EMA's average and Lookahead's slow weights: slices on 4 ranks, saved whole, cut again
    // to the 2 ranks' slices (Lookahead writes them back into the model: the losses show it).
    let toml = toml
        .algorithm("ema", "half_life = \"3ba\"")
        .algorithm("lookahead", "k = 3\nalpha = 0.5");
    let dir = TempDir::new("shard-resume");
    dir.write(
        "trainer.toml",
        &format!("{}\n[checkpoint]\ninterval = \"4ba\"\n", toml.render()),
    );
    // Global batch 16 in every run: 4 x 4, 2 x 8, 1 x 16.
    let sharding = |m: &str| format!("distributed.sharding={}", toml_string(m));
    let straight = ["run_name=straight", "data.batch_size=4", &sharding("full")];
    assert_all_succeeded(&train_ranks(&dir, 4, &straight));
    let at4 = ckpt(&dir, "straight", "ep0-ba4.ckpt");
    let meta = tessera::checkpoint::Checkpoint::read(&at4)
        .expect("the checkpoint reads")
        .meta;
    assert_eq!(meta.world_size, 4);
    let load = format!(
        "checkpoint.load={}",
        toml_string(&at4.display().to_string())
    );
    let two = [
        "run_name=two",
        "data.batch_size=8",
        &sharding("optimizer"),
        &load,
    ];
    assert_all_succeeded(&train_ranks(&dir, 2, &two));
    train(&dir, &["run_name=one", "data.batch_size=16", &load], &[]).assert_success();
    let losses = |run: &str| train_losses(&read_jsonl(&run_dir(&dir, run).join("metrics.jsonl")));
    let reference = losses("straight");
    assert_eq!(reference.len(), 8, "{reference:?}");
    for run in ["two", "one"] {
        let continued = losses(run);
        assert_eq!(continued.len(), 4, "{run}: {continued:?}");
        for (a, b) in continued.iter().zip(&reference[4..]) {
            assert!(
                (a - b).abs() <= 1e-5 * b.abs(),
                "{run}: losses {continued:?}, the straight run's {:?}",
                &reference[4..]
            );
        }
        let (diff, name) = max_difference(
            &ckpt(&dir, "straight", "ep0-ba8.ckpt"),
            &ckpt(&dir, run, "ep0-ba8.ckpt"),
            &["model/", "optim/", "method/"],
        );
        assert!(diff <= 1e-5, "{run}: {diff:e} at `{name}`");
    }
}

/// amp_fp16's loss scaler unscales and checks the gradients after the backward passes: with
/// them sharded it sees them whole, gathered for it (the same on every rank, so the ranks agree
/// on a skipped step).
#[test]
fn amp_fp16_trains_as_ddp_under_sharding() {
    let mut toml = TrainerToml::new("shard-fp16");
    toml.model = "name = \"resnet20\"\nwidth = 4".to_owned();
    toml.max_duration = "10ba".to_owned();
    toml.data = toml.data.replace("batch_size = 64", "batch_size = 16");
    toml.device = Some("cpu".to_owned());
    toml.precision = Some("amp_fp16".to_owned());
    // Ten steps: the fused kernels' rounding at a piece's edge (see `Limit::Rounding`), not
    // amplified by batch norm this early (DDP itself does not move with 2 threads here).
    assert_modes_match_ddp("shard-fp16", &toml, 2, Limit::Fixed(1e-6), &MODES);
}

/// Gradient clipping (by global norm) and SAM run at `after_train_batch`, between the backward
/// pass and the optimizer step: with the gradients sharded they see whole gradients, gathered
/// for them, and the slices keep what they left (clipped; SAM's second pass).
#[test]
fn gradient_clipping_and_sam_see_whole_gradients_under_sharding() {
    let mut toml = TrainerToml::tiny_gpt("shard-clip");
    toml.model = toml.model.replace("n_layer = 2", "n_layer = 4");
    toml.max_duration = "12ba".to_owned();
    let toml = toml
        .algorithm(
            "gradient_clipping",
            "clipping_type = \"norm\"\nclipping_threshold = 0.5",
        )
        .algorithm("sam", "rho = 0.05\ninterval = 2");
    assert_modes_match_ddp("shard-clip", &toml, 2, Limit::Fixed(1e-6), &MODES);
}

#[test]
fn what_a_mode_cannot_run_is_refused_at_start() {
    let dir = TempDir::new("shard-refusals");
    let toml = TrainerToml::new("refused");
    toml.write_to(&dir);
    // `full` gathers blocks one at a time: the CNN has none.
    let full = train_ranks(&dir, 2, &["distributed.sharding=\"full\""]);
    let text = &full[0].stderr;
    assert!(
        text.contains("\"full\"") && text.contains("\"cnn\" has no block"),
        "{text}"
    );
    // A bad value names the key and the choices.
    let bad = train(&dir, &["distributed.sharding=\"zero3\""], &[]);
    bad.assert_failure(&["sharding", "\"optimizer\""]);
}

/// Microbatches and small buckets: under `gradients` each microbatch's backward pass
/// reduce-scatters its buffers (many here, launched in order while backward goes on) and the
/// slices add up, where DDP adds the microbatches' gradients first and all-reduces once: the
/// same sums in another order.
#[test]
fn microbatches_and_many_buffers_train_as_ddp() {
    let mut toml = TrainerToml::tiny_gpt("shard-micro");
    toml.max_duration = "10ba".to_owned();
    let dir = TempDir::new("shard-micro");
    dir.write(
        "trainer.toml",
        &format!(
            "{}\n[distributed]\nbucket_mb = 0.01\n",
            toml.render().replace(
                "max_duration = \"10ba\"",
                "max_duration = \"10ba\"\nmicrobatch_size = 2"
            )
        ),
    );
    for mode in ["none", "gradients", "full"] {
        let run = format!("run_name={mode}");
        let sharding = format!("distributed.sharding={}", toml_string(mode));
        assert_all_succeeded(&train_ranks(&dir, 2, &[&run, &sharding, "train.threads=1"]));
    }
    // `full` with activation checkpointing: the recomputed blocks are gathered again for it.
    let checkpointed = [
        "run_name=full_recomputed",
        "distributed.sharding=\"full\"",
        "train.activation_checkpointing={ unit = \"block\" }",
        "distributed.find_unused_parameters=false",
        "train.threads=1",
    ];
    assert_all_succeeded(&train_ranks(&dir, 2, &checkpointed));
    for mode in ["gradients", "full", "full_recomputed"] {
        let (diff, name, loss) = differences(&dir, "none", mode, "latest.ckpt");
        eprintln!("microbatches, {mode}: {diff:e} at `{name}`, losses {loss:e}");
        // 5.4e-6 and 6e-8 measured (AdamW divides by the root of tiny second moments, so a
        // reordered sum moves some coordinates more); a 4x margin.
        assert!(
            diff <= 2e-5 && loss <= 2.5e-7,
            "{mode}: {diff:e} at `{name}`, losses {loss:e}"
        );
    }
    let record = read_json(&run_dir(&dir, "gradients").join("run.json"));
    assert_eq!(record["microbatch_size"], 2, "{record:#}");
}

/// The committed checkpoint of an earlier version (one process, tests/fixtures) continues on 2
/// ranks with sharded gradients and the same global batch, where that version went.
#[test]
fn a_one_process_checkpoint_of_an_earlier_version_continues_sharded() {
    let (fixture, dir, load) =
        tessera_tests::resume::from_fixture("checkpoint-format-1", "shard-fixture");
    let run = [
        "run_name=sharded",
        "data.batch_size=8",
        "distributed.sharding=\"gradients\"",
        &load,
    ];
    assert_all_succeeded(&train_ranks(&dir, 2, &run));
    let (diff, name) = max_difference(
        &fixture.join("ep1-ba6.ckpt"),
        &ckpt(&dir, "sharded", "ep1-ba6.ckpt"),
        &["model/", "optim/"],
    );
    assert!(diff <= 1e-5, "{diff:e} at `{name}`");
}

/// A sharded checkpoint folder of an earlier version (tests/fixtures/checkpoint-sharded-1: the
/// MLP with AdamW on 2 ranks under `sharding = "gradients"`, written at batch 3 of 6) resumes
/// on 2 ranks in this one and writes the batch-6 folder that version wrote, bit for bit (within
/// float rounding on a CPU that rounds differently from the one that wrote it), and
/// continues in one process with the same global batch within rounding. Replace the fixture
/// only with a format change that keeps reading it.
#[test]
fn a_sharded_checkpoint_of_an_earlier_version_resumes_exactly() {
    let (fixture, dir, load) =
        tessera_tests::resume::from_fixture("checkpoint-sharded-1", "shard-fixture-folder");
    assert_all_succeeded(&train_ranks(&dir, 2, &["run_name=resumed", &load]));
    let resumed = ckpt(&dir, "resumed", "ep1-ba6.ckpt");
    assert!(
        resumed.join("rank-1.pieces").is_file(),
        "not a sharded folder"
    );
    tessera_tests::resume::assert_same_checkpoint_as_fixture(
        &fixture.join("ep1-ba6.ckpt"),
        &resumed,
    );
    let one = [
        "run_name=one",
        "data.batch_size=16",
        "distributed.sharding=\"none\"",
        &load,
    ];
    train(&dir, &one, &[]).assert_success();
    let (diff, name) = max_difference(
        &fixture.join("ep1-ba6.ckpt"),
        &ckpt(&dir, "one", "ep1-ba6.ckpt"),
        &["model/", "optim/"],
    );
    assert!(diff <= 1e-5, "{diff:e} at `{name}`");
}

/// Under sharding each rank writes its own slices: a checkpoint is a folder (rank 0's
/// `index.ckpt` and one `rank-<r>.pieces` per rank) that reads back whole, as the single file
/// `checkpoint.sharded = false` writes, verifies every file, and exports.
#[test]
fn sharded_checkpoints_are_folders_of_slices_that_read_back_whole() {
    use tessera::checkpoint::Checkpoint;
    let mut toml = TrainerToml::tiny_gpt("sliced");
    toml.max_duration = "4ba".to_owned();
    let dir = TempDir::new("shard-files");
    dir.write(
        "trainer.toml",
        &format!("{}\n[checkpoint]\ninterval = \"2ba\"\n", toml.render()),
    );
    for (run, sharded) in [("sliced", "true"), ("single", "false")] {
        let (name, files) = (
            format!("run_name={run}"),
            format!("checkpoint.sharded={sharded}"),
        );
        let overrides = [
            name.as_str(),
            "distributed.sharding=\"full\"",
            files.as_str(),
            "train.threads=1",
        ];
        assert_all_succeeded(&train_ranks(&dir, 2, &overrides));
    }
    let folder = ckpt(&dir, "sliced", "ep0-ba4.ckpt");
    assert!(folder.is_dir(), "{}", folder.display());
    let mut files: Vec<String> = std::fs::read_dir(&folder)
        .expect("the checkpoint folder")
        .map(|e| {
            e.expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    files.sort();
    assert_eq!(files, ["index.ckpt", "rank-0.pieces", "rank-1.pieces"]);
    assert!(ckpt(&dir, "single", "ep0-ba4.ckpt").is_file());
    // `latest` points at the newest folder; no temporary folder is left.
    let latest = ckpt(&dir, "sliced", "latest.ckpt");
    assert_eq!(
        std::fs::read_link(&latest).expect("latest is a link"),
        PathBuf::from("ep0-ba4.ckpt")
    );
    let left: Vec<String> = std::fs::read_dir(ckpt(&dir, "sliced", ""))
        .expect("the checkpoints")
        .map(|e| {
            e.expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    // Whole again: the same tensors as the single file, bit for bit.
    let read = Checkpoint::read(&folder).expect("the folder reads");
    let index = read.meta.shards.as_ref().expect("an index");
    assert_eq!((index.world, index.files.len()), (2, 2));
    assert!(index.tensors.iter().any(|t| t.name.starts_with("optim/")));
    let (diff, name) = max_difference(
        &folder,
        &ckpt(&dir, "single", "ep0-ba4.ckpt"),
        &["model/", "optim/", "method/"],
    );
    assert_eq!(diff, 0.0, "at `{name}`");
    // A missing or damaged slice file is refused, naming it.
    let damaged = dir.join("damaged.ckpt");
    std::fs::create_dir_all(&damaged).expect("a copy");
    for f in &files {
        std::fs::copy(folder.join(f), damaged.join(f)).expect("copy a file");
    }
    let piece = damaged.join("rank-1.pieces");
    let mut bytes = std::fs::read(&piece).expect("the slices");
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&piece, &bytes).expect("damage it");
    let e = Checkpoint::read(&damaged)
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("rank-1.pieces") && e.contains("SHA-256"), "{e}");
    std::fs::remove_file(&piece).expect("remove it");
    let e = Checkpoint::read(&damaged)
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("rank-1.pieces"), "{e}");
    // A plain export of the folder.
    let exported = dir.join("model.safetensors");
    let to = exported.display().to_string();
    let from = folder.display().to_string();
    tessera(&["export", "--to", &to, &from], dir.path(), &[]).assert_success();
    assert!(exported.is_file());
}

/// bfloat16 on the wire (`[distributed] reduce_dtype = "bf16"` under `gradients`, and `full`'s
/// gathers under `amp_bf16`, where `gather_dtype = "auto"` chooses bf16): the run is the
/// float32 one up to bf16 rounding. The bound is fixed beforehand from bf16's unit roundoff
/// (2^-9 relative per value): over 10 AdamW steps every logged loss stays within 4 × 2^-9
/// (relative) of the float32 wire's, while the weights do differ (the wire really was bf16).
/// Where a mode has no such collective the setting is refused naming the key.
#[test]
fn bfloat16_on_the_wire_trains_as_float32_up_to_its_rounding() {
    let mut toml = TrainerToml::tiny_gpt("wire");
    toml.model = toml.model.replace("n_layer = 2", "n_layer = 4");
    toml.max_duration = "10ba".to_owned();
    let dir = TempDir::new("shard-wire");
    dir.write(
        "trainer.toml",
        &format!("{}\n[checkpoint]\ninterval = \"10ba\"\n", toml.render()),
    );
    let bound = 4.0 * 2f64.powi(-9);
    let cases: [(&str, &[&str], &[&str], &str); 2] = [
        (
            "reduce",
            &["distributed.sharding=\"gradients\""],
            &["distributed.reduce_dtype=\"bf16\""],
            "reduced in bf16",
        ),
        (
            "gather",
            &[
                "distributed.sharding=\"full\"",
                "train.precision=\"amp_bf16\"",
            ],
            &[],
            "in bf16; gradients reduced in fp32",
        ),
    ];
    for (tag, common, bf16, said) in cases {
        let exact = format!("run_name={tag}-fp32");
        let low = format!("run_name={tag}-bf16");
        let mut a: Vec<&str> = vec![&exact, "train.threads=1"];
        a.extend_from_slice(common);
        if tag == "gather" {
            a.push("distributed.gather_dtype=\"fp32\"");
        }
        assert_all_succeeded(&train_ranks(&dir, 2, &a));
        let mut b: Vec<&str> = vec![&low, "train.threads=1"];
        b.extend_from_slice(common);
        b.extend_from_slice(bf16);
        let outputs = train_ranks(&dir, 2, &b);
        assert_all_succeeded(&outputs);
        assert!(outputs[0].stderr.contains(said), "{}", outputs[0].dump());
        let (diff, name, losses) = differences(
            &dir,
            &format!("{tag}-fp32"),
            &format!("{tag}-bf16"),
            "ep0-ba10.ckpt",
        );
        eprintln!("{tag}: weights {diff:e} at `{name}`, losses {losses:e} (bound {bound:e})");
        assert!(diff > 0.0, "{tag}: bf16 on the wire changed nothing");
        assert!(
            losses <= bound,
            "{tag}: losses differ by {losses:e} > {bound:e}"
        );
    }
    for (mode, key) in [("none", "reduce_dtype"), ("gradients", "gather_dtype")] {
        let set = format!("distributed.{key}=\"bf16\"");
        let sharding = format!("distributed.sharding={}", toml_string(mode));
        let outputs = train_ranks(&dir, 2, &["run_name=refused", &sharding, &set]);
        assert!(outputs.iter().all(|o| !o.status.success()));
        let message = &outputs[0].stderr;
        assert!(
            message.contains(&format!("[distributed] {key} = \"bf16\"")),
            "{}",
            outputs[0].dump()
        );
    }
}

/// `full` gathers the next unit while one computes (`[distributed] prefetch`, on by default):
/// each step's forward pass prefetches every block (the first while the embeddings are
/// gathered) and its backward pass every block but the last, 2 × 4 − 1 per step for 4 blocks,
/// and every prefetched unit is used. The weights are bit for bit those of waiting for each
/// gather (`prefetch = false`, which prefetches nothing).
#[test]
fn full_sharding_prefetches_the_next_unit_and_trains_as_without() {
    let mut toml = TrainerToml::tiny_gpt("prefetch");
    toml.model = toml.model.replace("n_layer = 2", "n_layer = 4");
    toml.max_duration = "6ba".to_owned();
    let dir = TempDir::new("shard-prefetch");
    dir.write(
        "trainer.toml",
        &format!("{}\n[checkpoint]\ninterval = \"6ba\"\n", toml.render()),
    );
    let full = "distributed.sharding=\"full\"";
    let outputs = train_ranks(&dir, 2, &["run_name=on", full]);
    assert_all_succeeded(&outputs);
    assert!(
        outputs[0].stderr.contains("the next one prefetched"),
        "{}",
        outputs[0].dump()
    );
    let outputs = train_ranks(
        &dir,
        2,
        &["run_name=off", full, "distributed.prefetch=false"],
    );
    assert_all_succeeded(&outputs);
    let record = |run: &str| read_json(&run_dir(&dir, run).join("run.json"));
    let (on, off) = (record("on"), record("off"));
    let dp = &on["data_parallel"];
    assert_eq!(dp["prefetched_units"], 6 * (2 * 4 - 1), "{dp:#}");
    assert_eq!(
        dp["prefetched_units_used"], dp["prefetched_units"],
        "{dp:#}"
    );
    assert_eq!(off["data_parallel"]["prefetched_units"], 0, "{off:#}");
    let (diff, name) = max_difference(
        &ckpt(&dir, "on", "ep0-ba6.ckpt"),
        &ckpt(&dir, "off", "ep0-ba6.ckpt"),
        &["model/", "optim/"],
    );
    assert_eq!(diff, 0.0, "prefetching changed `{name}`");
}

/// Under `full` every rank gathers the units in the same order; stochastic depth skips blocks
/// on each rank's own draws, so a method's module in a block's place is refused at start,
/// naming the block and the module (it ran into a collective mismatch before).
#[test]
fn full_sharding_refuses_blocks_a_method_may_skip_on_some_ranks() {
    let mut toml = TrainerToml::new("skips").algorithm("stochastic_depth", "drop_rate = 0.5");
    toml.model = "name = \"resnet50\"\nwidth = 8".to_owned();
    toml.data = "dataset = \"synthetic\"\nbatch_size = 8\nworkers = 0\n\n[data.synthetic]\n\
                 samples = 64\neval_samples = 16\nchannels = 3\nheight = 32\nwidth = 32\n\
                 classes = 4"
        .to_owned();
    toml.max_duration = "2ba".to_owned();
    let dir = TempDir::new("shard-skips");
    toml.write_to(&dir);
    for unit in ["block", "stage"] {
        let set = format!("distributed.shard_unit={}", toml_string(unit));
        let outputs = train_ranks(&dir, 2, &["distributed.sharding=\"full\"", &set]);
        assert!(outputs.iter().all(|o| !o.status.success()));
        let message = &outputs[0].stderr;
        for part in [
            "block `layer1.0`",
            "`stochastic_bottleneck`",
            "sharding = \"gradients\"",
        ] {
            assert!(message.contains(part), "{part}: {}", outputs[0].dump());
        }
    }
    let outputs = train_ranks(&dir, 2, &["distributed.sharding=\"gradients\""]);
    assert_all_succeeded(&outputs);
}
