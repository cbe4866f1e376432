//! Data-parallel training on c10d's Gloo backend, on this machine's loopback address: ranks are
//! `tessera train` processes joined through torchrun-style variables (as `tessera launch`,
//! torchrun or a Slurm script start them).
//!
//! The central check: 2 ranks with batch 64 train the model 1 process trains with batch 128
//! (the same samples in every step, gradients averaged over the ranks), within float rounding.
//! With `sync_batchnorm` that holds for batch-norm models too. Each vision method's own check
//! on 2 ranks (the same training as one process, or, for a method that draws per rank, training
//! with the ranks' models kept identical) is a row of the method table
//! (tests/methods/table.rs); the language methods are checked together here.

use std::path::PathBuf;

use tessera_tests::dist::{
    assert_all_succeeded, assert_same_training, max_difference, run_checkpoint as ckpt,
    train_ranks, train_ranks_with_env, two_ranks_and_one_process, NORMALISED_TOLERANCE, TOLERANCE,
};
use tessera_tests::plugins::{COMPOSER_LANGUAGE_PLUGINS, MODDED_NANOGPT_PLUGINS};
use tessera_tests::resume::assert_same_checkpoint;
use tessera_tests::*;

#[test]
fn two_ranks_of_64_train_what_one_process_of_128_trains() {
    let mut toml = TrainerToml::new("dp");
    toml.model = "name = \"mlp\"\nhidden = [64]".to_owned();
    let dir = two_ranks_and_one_process("dp-mlp", &toml, "", 64);
    assert_same_training(&dir, "mlp", TOLERANCE);
    // Rank 0 wrote the run: one run record, one metrics file, counting the global batch.
    let record = read_json(&run_dir(&dir, "ranks").join("run.json"));
    let single = read_json(&run_dir(&dir, "one").join("run.json"));
    assert_eq!(record["samples"], 3 * 128, "{record:#}");
    assert_eq!(record["trained_samples"], 3 * 128, "{record:#}");
    // The logged loss is the mean over the ranks: the single process's mean over 128.
    let losses = |run: &str| train_losses(&read_jsonl(&run_dir(&dir, run).join("metrics.jsonl")));
    let (a, b) = (losses("ranks"), losses("one"));
    assert_eq!(a.len(), 3, "{a:?}");
    for (x, y) in a.iter().zip(&b) {
        assert!((x - y).abs() < 1e-5, "losses {a:?} vs {b:?}");
    }
    // Evaluation: the same fixed subset (`eval_subset_batches = 1` of 500) on any number of
    // ranks, each rank scoring its share of it.
    let (ea, eb) = (&record["evals"][0], &single["evals"][0]);
    assert_eq!(ea["samples"], 500, "{record:#}");
    assert_eq!(eb["samples"], 500, "{single:#}");
    assert_eq!(record["eval_subset"], single["eval_subset"]);
    assert_eq!(
        record["eval_subset"]["indices"].as_array().map(Vec::len),
        Some(500)
    );
    assert_eq!(record["eval_subset"]["stratified"], true, "{record:#}");
    let config = &record["config"]["distributed"];
    assert_eq!(config["bucket_mb"], 25.0, "{record:#}");
}

#[test]
fn batch_norm_is_local_unless_synchronised() {
    // The CNN has batch norm: with local statistics (PyTorch DDP's default) each rank normalises
    // by its 64 samples, so the runs differ; synchronised, they agree, running statistics too.
    let toml = TrainerToml::new("dp-bn");
    let local = two_ranks_and_one_process("dp-bn-local", &toml, "", 64);
    let (a, b) = (
        ckpt(&local, "ranks", "ep0-ba3.ckpt"),
        ckpt(&local, "one", "ep0-ba3.ckpt"),
    );
    let (diff, name) = max_difference(&a, &b, &["model/"]);
    assert!(
        diff > 1e-4,
        "local batch norm should differ, max {diff:e} at {name}"
    );
    let synced = two_ranks_and_one_process(
        "dp-bn-sync",
        &toml,
        "[distributed]\nsync_batchnorm = true\n",
        64,
    );
    assert_same_training(&synced, "cnn with sync_batchnorm", NORMALISED_TOLERANCE);
}

#[test]
fn language_methods_train_what_one_process_trains() {
    // ALiBi, gated linear units and sequence-length warmup on the tiny GPT (no dropout).
    let mut toml = TrainerToml::tiny_gpt("dp-gpt");
    for p in COMPOSER_LANGUAGE_PLUGINS {
        let settings = match p {
            "seq_length_warmup" => {
                "duration = 0.67\nmin_seq_length = 8\nmax_seq_length = 32\nstep_size = 24"
            }
            "alibi" => "max_sequence_length = 64",
            _ => "",
        };
        toml = toml.algorithm(p, settings);
    }
    let dir = two_ranks_and_one_process("dp-gpt", &toml, "", 4);
    assert_same_training(
        &dir,
        "gpt with alibi, gated_linear_units, seq_length_warmup",
        NORMALISED_TOLERANCE,
    );
    let record = read_json(&run_dir(&dir, "ranks").join("run.json"));
    let single = read_json(&run_dir(&dir, "one").join("run.json"));
    assert_eq!(record["tokens"], single["tokens"], "{record:#}");
}

#[test]
fn modded_nanogpt_methods_train_what_one_process_trains() {
    // Rotary positions, QK-norm, squared ReLU, soft-capped logits and zero-initialised output
    // projections on the tiny GPT (no dropout): the surgery is the same on every rank, and the
    // zeroed projections start equal everywhere.
    let mut toml = TrainerToml::tiny_gpt("dp-modded");
    for p in MODDED_NANOGPT_PLUGINS {
        toml = toml.algorithm(
            p,
            if p == "logit_softcap" {
                "cap = 15.0"
            } else {
                ""
            },
        );
    }
    let dir = two_ranks_and_one_process("dp-modded", &toml, "", 4);
    assert_same_training(
        &dir,
        "gpt with rotary, qk_norm, relu_squared, logit_softcap, zero_init_projections",
        NORMALISED_TOLERANCE,
    );
    let record = read_json(&run_dir(&dir, "ranks").join("run.json"));
    let single = read_json(&run_dir(&dir, "one").join("run.json"));
    assert_eq!(record["tokens"], single["tokens"], "{record:#}");
    // Not vacuous: the projections trained away from their zero start.
    let saved = tessera::checkpoint::Checkpoint::read(&ckpt(&dir, "ranks", "ep0-ba3.ckpt"))
        .expect("the checkpoint reads");
    let (_, proj) = saved
        .tensors
        .iter()
        .find(|(n, _)| n == "model/transformer.h.0.attn.c_proj.weight")
        .expect("the projection is saved");
    assert!(proj.abs().max().double_value(&[]) > 0.0);
}

/// `toml` with checkpoints every `every` batches.
fn with_checkpoints(toml: &TrainerToml, every: &str) -> String {
    format!("{}\n[checkpoint]\ninterval = \"{every}\"\n", toml.render())
}

#[test]
fn a_two_rank_run_resumed_continues_exactly() {
    // Dropout and CutMix draw per rank: rank 1's own streams must be in the checkpoint.
    let mut toml = TrainerToml::new("straight").algorithm("cutmix", "");
    toml.model = "name = \"mlp\"\nhidden = [32]\ndropout = 0.2".to_owned();
    toml.max_duration = "6ba".to_owned();
    let dir = TempDir::new("dp-resume");
    dir.write("trainer.toml", &with_checkpoints(&toml, "3ba"));
    assert_all_succeeded(&train_ranks(&dir, 2, &[]));
    let straight3 = ckpt(&dir, "straight", "ep0-ba3.ckpt");
    let meta = tessera::checkpoint::Checkpoint::read(&straight3)
        .expect("the checkpoint reads")
        .meta;
    assert_eq!((meta.world_size, meta.ranks.len()), (2, 1));
    // Continue from the batch-3 checkpoint in another run folder: the same batch-6 checkpoint,
    // bit for bit.
    let load = format!(
        "checkpoint.load={}",
        toml_string(&straight3.display().to_string())
    );
    assert_all_succeeded(&train_ranks(&dir, 2, &["run_name=resumed", &load]));
    assert_same_checkpoint(
        &ckpt(&dir, "straight", "ep0-ba6.ckpt"),
        &ckpt(&dir, "resumed", "ep0-ba6.ckpt"),
    );
}

#[test]
fn a_checkpoint_changes_rank_count_only_at_an_epoch_end() {
    // 256 synthetic images, batch 32 per rank: 4 batches per epoch on 2 ranks.
    let mut toml = TrainerToml::new("two");
    toml.data = "dataset = \"synthetic\"\nbatch_size = 32\neval_batch_size = 64\n\n\
                 [data.synthetic]\nsamples = 256\neval_samples = 64\nchannels = 1\n\
                 height = 8\nwidth = 8\nclasses = 4"
        .to_owned();
    toml.model = "name = \"mlp\"\nhidden = [16]".to_owned();
    // Checkpoints at the end of epoch 0 (batch 4) and at the end of the run, batch 6, in the
    // middle of epoch 1.
    toml.max_duration = "6ba".to_owned();
    let dir = TempDir::new("dp-world-change");
    dir.write("trainer.toml", &with_checkpoints(&toml, "1ep"));
    assert_all_succeeded(&train_ranks(&dir, 2, &[]));
    let end = ckpt(&dir, "two", "ep1-ba4.ckpt");
    let mid = ckpt(&dir, "two", "ep1-ba6.ckpt");
    // Mid-epoch on 1 process: refused, saying why and what to do.
    let load = |p: &PathBuf| format!("checkpoint.load={}", toml_string(&p.display().to_string()));
    let out = train(&dir, &["run_name=one-mid", &load(&mid)], &[]);
    out.assert_failure(&["2 rank(s)", "middle of epoch 1", "--nproc 2", "1ep"]);
    // From the end of epoch 0: continues, stating what changes.
    let out = train(&dir, &["run_name=one-end", &load(&end)], &[]);
    out.assert_success();
    assert!(
        out.stderr.contains("written by 2 rank(s), this run has 1")
            && out
                .stderr
                .contains("global batch is 32 (32 x 1) instead of 64"),
        "{}",
        out.dump()
    );
    // One process with batch 32 has 8 batches per epoch: batches 5 and 6 of the run.
    let record = read_json(&run_dir(&dir, "one-end").join("run.json"));
    assert_eq!(record["batches"], 6, "{record:#}");
    assert_eq!(record["samples"], 4 * 64 + 2 * 32, "{record:#}");
}

#[test]
fn a_rank_that_never_comes_times_out_with_a_clear_message() {
    let dir = TempDir::new("dp-timeout");
    let mut toml = TrainerToml::new("alone");
    toml.model = "name = \"mlp\"\nhidden = [8]".to_owned();
    dir.write(
        "trainer.toml",
        &format!("{}\n[distributed]\nrendezvous_timeout = 2\n", toml.render()),
    );
    let port = tessera_tests::dist::free_port().to_string();
    let config = dir.join("trainer.toml");
    // A rank that never hears from its peer gives up (the process ends, with the error below)
    // instead of waiting for ever: `tessera()` fails the test if it runs past its timeout.
    let out = tessera(
        &["train", config.to_str().expect("utf-8")],
        dir.path(),
        &[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_PORT", &port)],
    );
    let line = out.assert_failure(&["rank 0 of 2", "rendezvous_timeout", "1/2"]);
    assert!(!line.contains("frame #"), "{line}");
    // Nothing was written: no checkpoint folder, no run record.
    assert!(!run_dir(&dir, "alone").join("run.json").exists());
}

#[test]
fn plugins_see_their_rank_and_the_world_size() {
    // plugin-api 1.5's `Context::ranks`: the fake plugin writes rank, world size, local rank
    // and the batch it trained on at every batch end.
    let dir = TempDir::new("dp-ranks");
    let mut toml = TrainerToml::new("ranks").algorithm("fake_plugin", "");
    toml.model = "name = \"mlp\"\nhidden = [8]".to_owned();
    toml.write_to(&dir);
    let seen = dir.join("seen");
    std::fs::create_dir_all(&seen).expect("a folder");
    let seen_env = seen.display().to_string();
    let outputs = train_ranks_with_env(&dir, 2, &[], &[("TESSERA_FAKE_RANKS_DIR", &seen_env)]);
    assert_all_succeeded(&outputs);
    let mut files: Vec<(String, String)> = std::fs::read_dir(&seen)
        .expect("the plugin's files")
        .map(|e| {
            let p = e.expect("an entry").path();
            let name = p
                .file_name()
                .expect("a name")
                .to_string_lossy()
                .into_owned();
            (name, std::fs::read_to_string(&p).expect("readable"))
        })
        .collect();
    files.sort();
    assert_eq!(
        files,
        [
            ("rank0-of-2-local0".to_owned(), "64".to_owned()),
            ("rank1-of-2-local1".to_owned(), "64".to_owned())
        ]
    );
    // A single process is rank 0 of 1.
    std::fs::remove_dir_all(&seen)
        .and_then(|()| std::fs::create_dir_all(&seen))
        .expect("reset");
    let seen_env = seen.display().to_string();
    train(
        &dir,
        &["run_name=single"],
        &[("TESSERA_FAKE_RANKS_DIR", &seen_env)],
    )
    .assert_success();
    assert!(seen.join("rank0-of-1-local0").exists());
}

/// `tessera launch ... train <dir>/trainer.toml --set ...` started in `dir`, not waited for.
fn spawn_launch(
    dir: &TempDir,
    launch: &[&str],
    overrides: &[&str],
    env: &[(&str, &str)],
) -> std::process::Child {
    require_fashion_mnist();
    let config = dir.join("trainer.toml");
    let mut args: Vec<&str> = vec!["launch"];
    args.extend_from_slice(launch);
    args.push("train");
    args.push(config.to_str().expect("utf-8"));
    for o in overrides {
        args.push("--set");
        args.push(o);
    }
    tessera_command(&args, dir.path(), env)
        .spawn()
        .expect("start tessera launch")
}

/// The pid of the child of `parent` whose environment says `RANK=<rank>`.
fn rank_pid(parent: u32, rank: usize) -> Option<u32> {
    let children =
        std::fs::read_to_string(format!("/proc/{parent}/task/{parent}/children")).ok()?;
    children
        .split_whitespace()
        .filter_map(|p| p.parse::<u32>().ok())
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .map(|env| {
                    env.split(|b| *b == 0)
                        .any(|var| var == format!("RANK={rank}").as_bytes())
                })
                .unwrap_or(false)
        })
}

#[test]
fn a_killed_rank_stops_every_rank_and_leaves_the_checkpoints_intact() {
    use tessera_tests::resume::{finish, wait_for};
    let dir = TempDir::new("dp-kill");
    let mut toml = TrainerToml::new("killed").algorithm("fake_plugin", "");
    toml.model = "name = \"mlp\"\nhidden = [16]".to_owned();
    toml.max_duration = "200ba".to_owned();
    dir.write("trainer.toml", &with_checkpoints(&toml, "2ba"));
    // The fake plugin sleeps at every batch end, so the run is still going when rank 1 dies.
    let child = spawn_launch(
        &dir,
        &["--nproc", "2", "--grace-seconds", "20"],
        &[],
        &[("TESSERA_FAKE_SLEEP_MS", "150")],
    );
    let folder = ckpt(&dir, "killed", "");
    wait_for(
        "the batch-4 checkpoint",
        std::time::Duration::from_secs(120),
        || folder.join("ep0-ba4.ckpt").exists(),
    );
    let victim = rank_pid(child.id(), 1).expect("rank 1's process");
    let survivor = rank_pid(child.id(), 0).expect("rank 0's process");
    tessera_tests::kill("-9", victim);
    // The launcher notices the dead rank and stops the survivor; `finish` fails the test if
    // the launch is still running after its timeout (it would hang on a rank left waiting).
    let (status, stderr) = finish(child);
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains("rank 1") && stderr.contains("killed by signal 9"),
        "{stderr}"
    );
    // Rank 0 is gone too, and every checkpoint written reads back and verifies.
    let alive = std::fs::read_to_string(format!("/proc/{survivor}/status"))
        .is_ok_and(|s| !s.contains("State:\tZ"));
    assert!(!alive, "rank 0 (pid {survivor}) still runs");
    let written = tessera::checkpoint::list(&folder);
    assert!(written.len() >= 2, "{written:?}");
    for p in &written {
        tessera::checkpoint::Checkpoint::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    }
    let latest = tessera::checkpoint::latest_good(&folder).expect("a good latest checkpoint");
    assert!(latest.1.meta.timestamp.batch >= 4);
    // The run continues from it on 2 ranks.
    let outputs = train_ranks(
        &dir,
        2,
        &["checkpoint.autoresume=true", "train.max_duration=20ba"],
    );
    assert_all_succeeded(&outputs);
    assert!(
        outputs[0].stderr.contains("resumed from"),
        "{}",
        outputs[0].dump()
    );
}

#[test]
fn two_nodes_on_the_loopback_address() {
    // Two `tessera launch --nnodes 2` processes, one rank each, meeting at node 0's port.
    let dir = TempDir::new("dp-nodes");
    let mut toml = TrainerToml::new("nodes");
    toml.model = "name = \"mlp\"\nhidden = [16]".to_owned();
    toml.write_to(&dir);
    let port = tessera_tests::dist::free_port().to_string();
    let node = |rank: &str| {
        spawn_launch(
            &dir,
            &[
                "--nproc",
                "1",
                "--nnodes",
                "2",
                "--node-rank",
                rank,
                "--master-port",
                &port,
            ],
            &[],
            &[],
        )
    };
    let (first, second) = (node("0"), node("1"));
    let (a, b) = (
        wait_with_timeout(first, "tessera launch (node 0)", COMMAND_TIMEOUT),
        wait_with_timeout(second, "tessera launch (node 1)", COMMAND_TIMEOUT),
    );
    let text = |o: &Output| o.stderr.clone();
    assert!(
        a.status.success() && b.status.success(),
        "{}\n---\n{}",
        text(&a),
        text(&b)
    );
    assert!(
        text(&a).contains("1 rank on this node (world size 2, node 0 of 2)"),
        "{}",
        text(&a)
    );
    let record = read_json(&run_dir(&dir, "nodes").join("run.json"));
    assert_eq!(record["data_parallel"]["world_size"], 2, "{record:#}");
    assert_eq!(
        record["data_parallel"]["global_batch_size"], 128,
        "{record:#}"
    );
    assert_eq!(record["samples"], 3 * 128, "{record:#}");
}

#[test]
fn tessera_launch_trains_the_example() {
    // The Fashion-MNIST example as shipped, on 2 ranks, for a few batches.
    let dir = TempDir::new("dp-example");
    let example = repo_root().join("examples/fashion-mnist/trainer.toml");
    let text = std::fs::read_to_string(&example).expect("the example");
    dir.write("trainer.toml", &text);
    let child = spawn_launch(
        &dir,
        &["--nproc", "2"],
        &[
            "train.max_duration=6ba",
            "train.eval_interval=6ba",
            "train.eval_subset_batches=1",
            "output_dir=runs",
            "train.progress=false",
            &format!(
                "plugins.dirs=[{}]",
                toml_string(&target_dir().display().to_string())
            ),
        ],
        &[],
    );
    let out = wait_with_timeout(child, "tessera launch train", COMMAND_TIMEOUT);
    let stderr = &out.stderr;
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("global batch 256 = 128 per rank x 2 ranks"),
        "{stderr}"
    );
    let run = std::fs::read_dir(dir.join("runs"))
        .expect("runs")
        .next()
        .expect("a run folder")
        .expect("an entry")
        .path();
    let record = read_json(&run.join("run.json"));
    assert_eq!(record["data_parallel"]["world_size"], 2, "{record:#}");
    assert!(
        record["plugins"].as_array().is_some_and(|p| !p.is_empty()),
        "{record:#}"
    );
}

#[test]
fn a_signal_stops_every_rank_after_the_same_step_with_one_checkpoint() {
    use tessera_tests::resume::{finish, signal, wait_for};
    let dir = TempDir::new("dp-signal");
    let mut toml = TrainerToml::new("stopped").algorithm("fake_plugin", "");
    toml.model = "name = \"mlp\"\nhidden = [16]".to_owned();
    toml.max_duration = "200ba".to_owned();
    dir.write("trainer.toml", &with_checkpoints(&toml, "50ba"));
    let child = spawn_launch(
        &dir,
        &["--nproc", "2"],
        &[],
        &[("TESSERA_FAKE_SLEEP_MS", "100")],
    );
    let metrics = run_dir(&dir, "stopped").join("metrics.jsonl");
    wait_for("a few batches", std::time::Duration::from_secs(120), || {
        std::fs::read_to_string(&metrics).is_ok_and(|m| m.lines().count() >= 3)
    });
    signal(&child, "-TERM");
    let (status, stderr) = finish(child);
    assert_eq!(status.code(), Some(143), "{stderr}");
    // Both ranks stopped after the same batch: rank 0 wrote that batch's checkpoint with
    // rank 1's streams, and the run record says so.
    let record = read_json(&run_dir(&dir, "stopped").join("run.json"));
    assert_eq!(record["status"], "interrupted by SIGTERM", "{record:#}");
    let batch = record["batches"].as_u64().expect("batches");
    let saved = ckpt(&dir, "stopped", &format!("ep0-ba{batch}.ckpt"));
    let meta = tessera::checkpoint::Checkpoint::read(&saved)
        .unwrap_or_else(|e| panic!("{}: {e}\n{stderr}", saved.display()))
        .meta;
    assert_eq!((meta.world_size, meta.ranks.len()), (2, 1));
    assert!(
        !stderr.contains("rank 1 (pid"),
        "rank 1 was reported as failed:\n{stderr}"
    );
}

#[test]
fn two_checkpoints_of_one_batch_gather_each_ranks_streams() {
    // The run's last batch ends epoch 0: a checkpoint at the end of training and one at the
    // epoch's end, both at batch 4, each with rank 1's streams (their store keys must differ).
    let mut toml = TrainerToml::new("twice");
    toml.data = "dataset = \"synthetic\"\nbatch_size = 32\neval_batch_size = 64\n\n\
                 [data.synthetic]\nsamples = 256\neval_samples = 64\nchannels = 1\n\
                 height = 8\nwidth = 8\nclasses = 4"
        .to_owned();
    toml.model = "name = \"mlp\"\nhidden = [16]".to_owned();
    toml.max_duration = "4ba".to_owned();
    let dir = TempDir::new("dp-twice");
    dir.write("trainer.toml", &with_checkpoints(&toml, "1ep"));
    assert_all_succeeded(&train_ranks(&dir, 2, &[]));
    let written: Vec<String> = tessera::checkpoint::list(&ckpt(&dir, "twice", ""))
        .iter()
        .map(|p| {
            p.file_name()
                .expect("a name")
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    assert_eq!(written.len(), 2, "{written:?}");
    for name in &written {
        let meta = tessera::checkpoint::Checkpoint::read(&ckpt(&dir, "twice", name))
            .expect("the checkpoint reads")
            .meta;
        assert_eq!((meta.timestamp.batch, meta.ranks.len()), (4, 1), "{name}");
    }
}

/// A rank that stops answering (SIGSTOP) without dying: the others' next collective waits
/// `[distributed] timeout`, then fails naming the rank that is behind, at which step and
/// collective sequence number, and `tessera launch` stops every rank with that message.
#[test]
fn a_stopped_rank_is_named_when_a_collective_times_out() {
    use tessera_tests::resume::{finish, wait_for};
    let dir = TempDir::new("dp-hang");
    let mut toml = TrainerToml::new("hung").algorithm("fake_plugin", "");
    toml.model = "name = \"mlp\"\nhidden = [16]".to_owned();
    toml.max_duration = "400ba".to_owned();
    dir.write("trainer.toml", &with_checkpoints(&toml, "2ba"));
    let child = spawn_launch(
        &dir,
        &["--nproc", "2", "--grace-seconds", "2"],
        &["distributed.timeout=4"],
        &[("TESSERA_FAKE_SLEEP_MS", "100")],
    );
    let folder = ckpt(&dir, "hung", "");
    wait_for(
        "the batch-4 checkpoint",
        std::time::Duration::from_secs(120),
        || folder.join("ep0-ba4.ckpt").exists(),
    );
    let stopped = rank_pid(child.id(), 1).expect("rank 1's process");
    tessera_tests::kill("-STOP", stopped);
    let (status, stderr) = finish(child);
    // Rank 1 does not outlive the test, stopped or not (the launcher has killed it already).
    let _ = std::process::Command::new("kill")
        .args(["-9", &stopped.to_string()])
        .status();
    assert!(!status.success(), "{stderr}");
    if let Some(line) = stderr.lines().find(|l| l.contains("is behind")) {
        eprintln!("{line}");
    }
    assert!(
        stderr.contains("waited past [distributed] timeout (4 s)")
            && stderr.contains("rank 1 is behind")
            && stderr.contains("collective #"),
        "{stderr}"
    );
}
