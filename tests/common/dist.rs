//! Data-parallel runs for the tests: several `tessera train` processes joined through the
//! torchrun-style environment (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`) on the
//! loopback address, and comparisons of their checkpoints with a single process's.

use std::net::TcpListener;
use std::path::Path;

use tessera::checkpoint::Checkpoint;

use crate::{require_fashion_mnist, tessera, uses_fashion_mnist, Output, TempDir};

/// A TCP port free on the loopback address a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// The torchrun-style variables of rank `rank` of `world` meeting at `port`.
pub fn rank_env(rank: usize, world: usize, port: u16) -> Vec<(String, String)> {
    vec![
        ("RANK".into(), rank.to_string()),
        ("WORLD_SIZE".into(), world.to_string()),
        ("LOCAL_RANK".into(), rank.to_string()),
        ("LOCAL_WORLD_SIZE".into(), world.to_string()),
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
    if uses_fashion_mnist(dir) {
        require_fashion_mnist();
    }
    let port = free_port();
    let config = dir.join("trainer.toml");
    let config = config.to_str().expect("a UTF-8 temp path").to_owned();
    let mut args = vec!["train".to_owned(), config];
    for o in overrides {
        args.push("--set".into());
        args.push((*o).to_owned());
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..world)
            .map(|rank| {
                let (args, extra) = (&args, env);
                s.spawn(move || {
                    let vars = rank_env(rank, world, port);
                    let mut env: Vec<(&str, &str)> =
                        vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                    env.extend_from_slice(extra);
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
