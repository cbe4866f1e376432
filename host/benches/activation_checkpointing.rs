//! Activation checkpointing (`train.activation_checkpointing`) on GPT-2 small (12 layers, 768
//! wide, 12 heads, vocabulary 50257, dropout 0.1) at sequence SEQ (1024) and batch BATCH (2),
//! fp32 on the CPU: the activation memory and the time of a training forward + backward, with
//! every block checkpointed and without.
//!
//! Each measurement is its own process (this program started again with `--child`):
//! - memory: the C allocator set to hand every block of 64 KiB or more back to the kernel when
//!   it is freed (`M_MMAP_THRESHOLD`, `M_TRIM_THRESHOLD`), so that the resident set follows the
//!   live memory. After one warm-up step (the gradients exist from then on), the kernel's peak
//!   (VmHWM in /proc/self/status) is reset (`5` into /proc/self/clear_refs) and the resident
//!   set (VmRSS) read; the activation memory is VmHWM after STEPS more steps minus that VmRSS:
//!   what the forward keeps for backward and backward's temporaries, without parameters,
//!   gradients and libraries.
//! - time: the allocator tuned as `tessera train` tunes it; one warm-up step, then STEPS timed
//!   forward + backward passes (the optimizer's step, the same with and without, is left out,
//!   so the ratio is that of the passes checkpointing changes). ROUNDS rounds alternate which
//!   configuration runs first; the medians over every timed step are reported.
//!
//! `cargo bench -p tessera --bench activation_checkpointing` (scripts/
//! bench-activation-checkpointing.sh; `SEQ`, `BATCH`, `STEPS` (3), `ROUNDS` (2) change it).

use std::process::Command;
use std::time::Instant;

use tch::{Device, Kind, Tensor};
use tessera::model::{
    ActivationCheckpointing, Gpt2Config, InputShape, Model, ModelConfig, ModelName,
};

mod common;
use common::{env_usize, median};

/// A field of /proc/self/status in bytes (`VmRSS`, `VmHWM`).
fn status_bytes(field: &str) -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status
        .lines()
        .find(|l| l.starts_with(field))
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"));
    let kib: f64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("unreadable {line}"));
    kib * 1024.0
}

fn gpt2_small(checkpointed: bool, seq: usize) -> Model {
    let mut config = ModelConfig::new(ModelName::Gpt2, 50257);
    config.gpt2 = Some(Gpt2Config {
        n_layer: 12,
        n_embd: 768,
        n_head: 12,
        n_positions: seq.max(1024),
        ..Gpt2Config::default()
    });
    config.dropout = 0.1;
    let unused = InputShape {
        channels: 1,
        height: 1,
        width: 1,
    };
    tch::manual_seed(0);
    let mut model = Model::build(&config, unused, 50257, Device::Cpu).expect("GPT-2 small");
    if checkpointed {
        let blocks = ActivationCheckpointing::default().select(&model);
        model
            .checkpoint_activations(&blocks)
            .expect("checkpointing");
    }
    model
}

/// One training forward and backward; the gradients accumulate (zeroed in place before).
fn pass(model: &Model, ids: &Tensor) {
    for e in model.params.trainable() {
        let mut grad = e.tensor.grad();
        if grad.defined() {
            let _ = grad.zero_();
        }
    }
    let logits = model.forward(ids, true).expect("forward");
    let loss = logits
        .reshape([-1, 50257])
        .cross_entropy_for_logits(&ids.roll([-1], [1]).reshape([-1]));
    loss.backward();
}

/// The child: `memory` or `time` for `plain` or `checkpointed`; prints one result line.
fn child(what: &str, config: &str) {
    let (seq, batch, steps) = (
        env_usize("SEQ", 1024),
        env_usize("BATCH", 2),
        env_usize("STEPS", 3),
    );
    if what == "memory" {
        // SAFETY: mallopt only changes the allocator's parameters.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 10);
            libc::mallopt(libc::M_TRIM_THRESHOLD, 0);
        }
    } else {
        tessera::memory::tune_for_training();
    }
    let model = gpt2_small(config == "checkpointed", seq);
    let ids = Tensor::randint(
        50257,
        [batch as i64, seq as i64],
        (Kind::Int64, Device::Cpu),
    );
    pass(&model, &ids);
    std::fs::write("/proc/self/clear_refs", "5").expect("resetting VmHWM");
    let before = status_bytes("VmRSS");
    let mut seconds = Vec::new();
    for _ in 0..steps {
        let started = Instant::now();
        pass(&model, &ids);
        seconds.push(started.elapsed().as_secs_f64());
    }
    let peak = status_bytes("VmHWM");
    let times: Vec<String> = seconds.iter().map(|s| format!("{s:.3}")).collect();
    println!(
        "RESULT {what} {config} {:.1} {}",
        (peak - before) / f64::from(1 << 20),
        times.join(",")
    );
}

/// Runs a child and parses its result: (activation MiB, step seconds).
fn run(what: &str, config: &str) -> (f64, Vec<f64>) {
    let exe = std::env::current_exe().expect("this program");
    let out = Command::new(exe)
        .args(["--child", what, config])
        .output()
        .expect("starting the child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find(|l| l.starts_with("RESULT "))
        .unwrap_or_else(|| {
            panic!(
                "{what} {config} failed: {}{}",
                stdout,
                String::from_utf8_lossy(&out.stderr)
            )
        });
    let fields: Vec<&str> = line.split_whitespace().collect();
    let mib = fields[3].parse().expect("MiB");
    let seconds = fields[4]
        .split(',')
        .map(|s| s.parse().expect("seconds"))
        .collect();
    (mib, seconds)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--child") {
        child(&args[i + 1], &args[i + 2]);
        return;
    }
    let (seq, batch, steps, rounds) = (
        env_usize("SEQ", 1024),
        env_usize("BATCH", 2),
        env_usize("STEPS", 3),
        env_usize("ROUNDS", 2),
    );
    println!(
        "GPT-2 small, sequence {seq}, batch {batch}, fp32, CPU ({} threads); {steps} steps a run",
        tch::get_num_threads()
    );
    let configs = ["plain", "checkpointed"];
    let memory: Vec<f64> = configs.iter().map(|c| run("memory", c).0).collect();
    let mut times = [Vec::new(), Vec::new()];
    for round in 0..rounds {
        for k in 0..2 {
            let i = (k + round) % 2;
            times[i].extend(run("time", configs[i]).1);
        }
    }
    let medians: Vec<f64> = times.iter_mut().map(|t| median(t)).collect();
    for (i, c) in configs.iter().enumerate() {
        println!(
            "{c:>12}: activation memory {:>8.0} MiB, forward + backward {:.2} s (median of {})",
            memory[i],
            medians[i],
            times[i].len()
        );
    }
    println!(
        "checkpointed / plain: memory {:.2}x lower, time {:.2}x",
        memory[0] / memory[1],
        medians[1] / medians[0]
    );
}
