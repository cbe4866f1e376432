//! Data-parallel runs for the tests: several `tessera train` processes joined through the
//! torchrun-style environment (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`) on the
//! loopback address, and comparisons of their checkpoints with a single process's.

use std::net::TcpListener;
use std::path::{Path, PathBuf};

use tessera::checkpoint::Checkpoint;

use crate::{
    require_fashion_mnist, run_dir, tessera, train, uses_fashion_mnist, Output, TempDir,
    TrainerToml,
};

/// A TCP port free on the loopback address a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// The torchrun-style variables of rank `rank` of `world` meeting at `port`, all on one node.
pub fn rank_env(rank: usize, world: usize, port: u16) -> Vec<(String, String)> {
    node_rank_env(rank, world, world, port)
}

/// The torchrun-style variables of rank `rank` of `world` meeting at `port`, on nodes of
/// `local_world` ranks each (rank `r` is local rank `r % local_world` of node
/// `r / local_world`).
pub fn node_rank_env(
    rank: usize,
    world: usize,
    local_world: usize,
    port: u16,
) -> Vec<(String, String)> {
    vec![
        ("RANK".into(), rank.to_string()),
        ("WORLD_SIZE".into(), world.to_string()),
        ("LOCAL_RANK".into(), (rank % local_world).to_string()),
        ("LOCAL_WORLD_SIZE".into(), local_world.to_string()),
        ("GROUP_RANK".into(), (rank / local_world).to_string()),
        ("MASTER_ADDR".into(), "127.0.0.1".into()),
        ("MASTER_PORT".into(), port.to_string()),
    ]
}

/// Runs `tessera train <dir>/trainer.toml --set ...` as `world` ranks at once (one process
/// each) and returns their outputs in rank order.
pub fn train_ranks(dir: &TempDir, world: usize, overrides: &[&str]) -> Vec<Output> {
    train_ranks_with_env(dir, world, overrides, &[])
}

/// [`train_ranks`] with `env` added to every rank's environment.
pub fn train_ranks_with_env(
    dir: &TempDir,
    world: usize,
    overrides: &[&str],
    env: &[(&str, &str)],
) -> Vec<Output> {
    train_nodes(
        dir,
        &Ranks {
            world,
            local_world: world,
            overrides,
            env,
            per_rank: &|_| Vec::new(),
        },
    )
}

/// How [`train_nodes`] starts the ranks.
pub struct Ranks<'a> {
    /// Ranks in all.
    pub world: usize,
    /// Ranks on each simulated node (`LOCAL_WORLD_SIZE`).
    pub local_world: usize,
    /// `--set` overrides of every rank.
    pub overrides: &'a [&'a str],
    /// Added to every rank's environment.
    pub env: &'a [(&'a str, &'a str)],
    /// More `--set` overrides of rank `r` (a cache folder per node).
    pub per_rank: &'a (dyn Fn(usize) -> Vec<String> + Sync),
}

/// Runs `tessera train <dir>/trainer.toml` as the ranks `ranks` describes, at once (one process
/// each), and returns their outputs in rank order.
pub fn train_nodes(dir: &TempDir, ranks: &Ranks<'_>) -> Vec<Output> {
    if uses_fashion_mnist(dir) {
        require_fashion_mnist();
    }
    // The port is free when chosen, but another test may take it before rank 0 listens on it
    // (seen once in CI): then every rank fails at the rendezvous, and the run is tried again on
    // another port.
    for _ in 0..2 {
        let outputs = train_ranks_at(dir, ranks, free_port());
        let taken = outputs.first().is_some_and(|o| {
            !o.status.success()
                && o.stderr
                    .to_ascii_lowercase()
                    .contains("address already in use")
        });
        if !taken {
            return outputs;
        }
        eprintln!("the rendezvous port was taken meanwhile; running the ranks again on another");
    }
    train_ranks_at(dir, ranks, free_port())
}

/// [`train_nodes`] meeting at `port`.
fn train_ranks_at(dir: &TempDir, ranks: &Ranks<'_>, port: u16) -> Vec<Output> {
    let config = dir.join("trainer.toml");
    let config = config.to_str().expect("a UTF-8 temp path").to_owned();
    let mut args = vec!["train".to_owned(), config];
    for o in ranks.overrides {
        args.push("--set".into());
        args.push((*o).to_owned());
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..ranks.world)
            .map(|rank| {
                let args = &args;
                s.spawn(move || {
                    let vars = node_rank_env(rank, ranks.world, ranks.local_world, port);
                    let mut env: Vec<(&str, &str)> =
                        vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                    env.extend_from_slice(ranks.env);
                    let mut args = args.clone();
                    for o in (ranks.per_rank)(rank) {
                        args.push("--set".into());
                        args.push(o);
                    }
                    let args: Vec<&str> = args.iter().map(String::as_str).collect();
                    tessera(&args, dir.path(), &env)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a rank's thread"))
            .collect()
    })
}

/// Panics unless every rank succeeded, with all their outputs.
pub fn assert_all_succeeded(outputs: &[Output]) {
    if outputs.iter().all(|o| o.status.success()) {
        return;
    }
    let dumps: Vec<String> = outputs
        .iter()
        .enumerate()
        .map(|(r, o)| format!("=== rank {r} ===\n{}", o.dump()))
        .collect();
    panic!("a rank failed:\n{}", dumps.join("\n"));
}

/// The largest difference between same-named tensors of two checkpoints whose names start
/// with one of `prefixes`, relative to the larger magnitude (at least 1); panics when the two
/// hold different tensor names under those prefixes.
pub fn max_difference(a: &Path, b: &Path, prefixes: &[&str]) -> (f64, String) {
    let read = |p: &Path| Checkpoint::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let (ca, cb) = (read(a), read(b));
    let pick = |c: &Checkpoint| -> Vec<(String, tch::Tensor)> {
        c.tensors
            .iter()
            .filter(|(n, _)| prefixes.iter().any(|p| n.starts_with(p)))
            .map(|(n, t)| (n.clone(), t.shallow_clone()))
            .collect()
    };
    let (ta, tb) = (pick(&ca), pick(&cb));
    let names = |v: &[(String, tch::Tensor)]| v.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    assert_eq!(names(&ta), names(&tb), "{} vs {}", a.display(), b.display());
    let mut worst = (0.0, String::new());
    for ((name, x), (_, y)) in ta.iter().zip(&tb) {
        assert_eq!(x.size(), y.size(), "{name}: shapes differ");
        if x.numel() == 0 {
            // `max()` of an empty tensor is an error; two empty tensors of one shape are equal.
            continue;
        }
        let x = x.to_kind(tch::Kind::Double);
        let y = y.to_kind(tch::Kind::Double);
        let scale = x.abs().max().double_value(&[]).max(1.0);
        let diff = (&x - &y).abs().max().double_value(&[]) / scale;
        if diff > worst.0 || worst.1.is_empty() {
            worst = (diff, name.clone());
        }
    }
    worst
}

/// The data order does not depend on the rank count, and a run on 2 ranks resumes exactly, for
/// the source that `dir/trainer.toml` reads (its run name is replaced; its global batch is
/// `2 * per_rank`; it must checkpoint every 3 batches). Trains, all with `overrides` and one
/// thread: 2 ranks of batch `per_rank` for 6 batches (run `ranks`); the same again from that
/// run's batch-3 checkpoint (run `resumed`), which must end on the same batch-6 checkpoint bit
/// for bit; and 1 process of batch `2 * per_rank` (run `one`), whose weights must be within
/// `tolerance` (relative) of the ranks' — the same samples in each global batch, summed in
/// another order (`tolerance` covers that rounding; another sample moves them far more).
pub fn assert_order_is_rank_independent_and_resumes_exactly(
    dir: &TempDir,
    per_rank: u32,
    overrides: &[&str],
    tolerance: f64,
) {
    use crate::resume::{assert_same_checkpoint, ckpt_dir, names};
    let per = format!("data.batch_size={per_rank}");
    let double = format!("data.batch_size={}", 2 * per_rank);
    let with = |more: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = overrides.iter().map(|s| (*s).to_owned()).collect();
        v.extend(["train.max_duration=6ba", "train.threads=1"].map(str::to_owned));
        v.extend(more.iter().map(|s| (*s).to_owned()));
        v
    };
    fn strs(v: &[String]) -> Vec<&str> {
        v.iter().map(String::as_str).collect()
    }
    // The checkpoint of run `run` at batch `batch`, whatever its epoch.
    let at = |run: &str, batch: u32| -> std::path::PathBuf {
        let folder = ckpt_dir(dir, run);
        let name = names(&folder)
            .into_iter()
            .find(|n| n.ends_with(&format!("-ba{batch}.ckpt")))
            .unwrap_or_else(|| panic!("{run}: no checkpoint at batch {batch} in {folder:?}"));
        folder.join(name)
    };
    assert_all_succeeded(&train_ranks(
        dir,
        2,
        &strs(&with(&["run_name=ranks", &per])),
    ));
    let load = format!(
        "checkpoint.load={}",
        crate::toml_string(&at("ranks", 3).display().to_string())
    );
    assert_all_succeeded(&train_ranks(
        dir,
        2,
        &strs(&with(&["run_name=resumed", &per, &load])),
    ));
    assert_same_checkpoint(&at("ranks", 6), &at("resumed", 6));
    crate::train(dir, &strs(&with(&["run_name=one", &double])), &[]).assert_success();
    let (diff, name) = max_difference(&at("ranks", 6), &at("one", 6), &["model/"]);
    assert!(
        diff <= tolerance,
        "2 ranks x {per_rank} and 1 process x {} differ by {diff:e} (relative) at `{name}` after \
         6 batches (limit {tolerance:e}): they did not train on the same samples",
        2 * per_rank
    );
}

/// Makes the `trainer.toml` in `dir`, written from [`crate::TrainerToml::new`], train a small MLP
/// instead of its CNN, whose batch norm normalises each rank's half batch on its own (so 2 ranks
/// would not train what 1 process does, by design).
pub fn use_mlp(dir: &TempDir) {
    let path = dir.join("trainer.toml");
    let text = std::fs::read_to_string(&path).expect("trainer.toml");
    let cnn = "name = \"cnn\"\nwidth = 8";
    assert!(text.contains(cnn), "{text}");
    dir.write(
        "trainer.toml",
        &text.replacen(cnn, "name = \"mlp\"\nhidden = [32]", 1),
    );
}

/// Float rounding only: the ranks' gradients are summed in another order than one process's.
/// An MLP with SGD agrees to 1e-8 here.
pub const TOLERANCE: f64 = 1e-6;
/// The same with normalisations that amplify rounding: batch norm (the CNN agrees to 4e-6) and
/// AdamW's per-coordinate step (the GPT, 3e-6).
pub const NORMALISED_TOLERANCE: f64 = 2e-5;

/// The checkpoint `name` of run `run` in `dir` (its checkpoints folder when `name` is empty).
pub fn run_checkpoint(dir: &TempDir, run: &str, name: &str) -> PathBuf {
    run_dir(dir, run).join("checkpoints").join(name)
}

/// Trains `toml` (3 batches) as 2 ranks of batch `per_rank` (run `ranks`) and as 1 process of
/// batch `2 * per_rank` (run `one`); returns the folder.
pub fn two_ranks_and_one_process(
    label: &str,
    toml: &TrainerToml,
    extra: &str,
    per_rank: u32,
) -> TempDir {
    let dir = TempDir::new(label);
    dir.write("trainer.toml", &format!("{}\n{extra}", toml.render()));
    // One thread everywhere: libtorch's reductions (a convolution's weight gradient) sum in
    // another order with another thread count, which alone moves a CNN's weights by 4e-5 here.
    let per = format!("data.batch_size={per_rank}");
    let outputs = train_ranks(&dir, 2, &["run_name=ranks", &per, "train.threads=1"]);
    assert_all_succeeded(&outputs);
    let double = format!("data.batch_size={}", 2 * per_rank);
    train(&dir, &["run_name=one", &double, "train.threads=1"], &[]).assert_success();
    dir
}

/// The two runs' final models (and the methods' tensors) agree within `tolerance`.
pub fn assert_same_training(dir: &TempDir, what: &str, tolerance: f64) {
    let (a, b) = (
        run_checkpoint(dir, "ranks", "ep0-ba3.ckpt"),
        run_checkpoint(dir, "one", "ep0-ba3.ckpt"),
    );
    let (diff, name) = max_difference(&a, &b, &["model/", "method/"]);
    assert!(
        diff <= tolerance,
        "{what}: 2 ranks and 1 process with twice the batch differ by {diff:e} (relative) at \
         `{name}` (limit {tolerance:e})"
    );
}

/// As [`assert_same_training`], for deeper batch-norm models where rounding alone moves the
/// weights further: the limit is twice what changing one process's thread count (1 to 2, which
/// reorders libtorch's reductions as splitting the batch over ranks does) moves them, and at
/// least [`NORMALISED_TOLERANCE`]. A semantic difference (local batch norm, a pass not
/// averaged) moves them by orders of magnitude more.
pub fn assert_same_training_up_to_rounding(dir: &TempDir, per_rank: u32, what: &str) {
    let double = format!("data.batch_size={}", 2 * per_rank);
    train(dir, &["run_name=one-2t", &double, "train.threads=2"], &[]).assert_success();
    let one = run_checkpoint(dir, "one", "ep0-ba3.ckpt");
    let (noise, _) = max_difference(
        &one,
        &run_checkpoint(dir, "one-2t", "ep0-ba3.ckpt"),
        &["model/", "method/"],
    );
    let limit = (2.0 * noise).max(NORMALISED_TOLERANCE);
    let (diff, name) = max_difference(
        &run_checkpoint(dir, "ranks", "ep0-ba3.ckpt"),
        &one,
        &["model/", "method/"],
    );
    assert!(
        diff <= limit,
        "{what}: 2 ranks x {per_rank} and 1 process x {} differ by {diff:e} (relative) at \
         `{name}`, more than twice the rounding noise {noise:e}",
        2 * per_rank
    );
}
