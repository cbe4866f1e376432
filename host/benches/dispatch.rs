//! The cost of dispatching events to plugins: time per hooked event through the ABI, and the
//! step time of a run with 10 no-op plugins hooked on every event against a run with none
//! (ResNet-20, batch 128, CPU), measured side by side in one process.
//!
//! Needs the workspace built (`cargo build --release --workspace`) for the fixture
//! `libnoop_plugin.so`. Run with `cargo bench -p tessera --bench dispatch`
//! (`CALLS=n ROUNDS=n STEPS=k` change the sample sizes).

use std::path::PathBuf;
use std::time::Instant;

use tch::{Device, Kind, Tensor};
use tessera::engine::{Algorithm, Batch, Event, Hook, MethodError, SetupState, Stage};
use tessera::plugin::LoadedPlugin;
use tessera::trainer::Trainer;

mod common;
use common::{env_usize, median, resnet20_trainer, BATCH};

fn noop_plugin() -> LoadedPlugin {
    let exe = std::env::current_exe().expect("bench path");
    // target/release/deps/dispatch-… → target/release
    let dir: PathBuf = exe
        .parent()
        .and_then(|d| d.parent())
        .map(PathBuf::from)
        .expect("target dir");
    let dir = tessera::plugin::SearchDir {
        path: dir,
        origin: tessera::plugin::Origin::Configured,
    };
    LoadedPlugin::load_named("noop_plugin", &[dir], None)
        .expect("libnoop_plugin.so: run `cargo build --release --workspace` first")
}

/// A no-op method in the same binary, for reference.
struct NativeNoop;

impl Algorithm for NativeNoop {
    fn name(&self) -> &str {
        "native"
    }
    fn hooks(&self) -> Vec<Hook> {
        Event::ALL.iter().map(|&e| Hook::at(e)).collect()
    }
    fn on_event(&mut self, _event: Event, _stage: &mut Stage<'_>) -> Result<(), MethodError> {
        Ok(())
    }
}

fn main() {
    tessera::memory::tune_for_training();
    let calls = env_usize("CALLS", 2_000_000);
    let plugin = noop_plugin();
    let dir = std::env::temp_dir().join(format!("tessera-dispatch-{}", std::process::id()));

    // 1. One hooked event through the ABI vs a native call.
    let mut setup = {
        let cfg = tessera::model::ModelConfig {
            name: tessera::model::ModelName::Mlp,
            torchscript: None,
            hidden: vec![4],
            widths: Vec::new(),
            width: None,
            num_classes: 2,
            dropout: 0.0,
            norm: None,
            gpt2: None,
            bert: None,
            llama: None,
            vit: None,
            init: None,
        };
        let shape = tessera::model::InputShape {
            channels: 1,
            height: 2,
            width: 2,
        };
        let model = tessera::model::Model::build(&cfg, shape, 2, Device::Cpu).expect("model");
        let one_epoch = tessera::time::Time::new(1, tessera::time::TimeUnit::Epoch);
        let run = tessera::time::RunLength::new(one_epoch, 1, 1).expect("run length");
        SetupState::new(model, tessera::precision::Precision::Fp32, run, 0.1, 0)
    };
    let mut state = Stage::Setup(&mut setup);
    let mut method = plugin.create("{}").expect("noop method");
    // Behind `black_box` the optimizer can neither devirtualize nor drop the call.
    let mut native: Box<dyn Algorithm> = std::hint::black_box(Box::new(NativeNoop));
    let time_calls = |f: &mut dyn FnMut()| {
        let t = Instant::now();
        for _ in 0..calls {
            f();
        }
        t.elapsed().as_secs_f64() / calls as f64
    };
    let mut per_plugin = Vec::new();
    let mut per_native = Vec::new();
    for _ in 0..3 {
        per_plugin.push(time_calls(&mut || {
            method
                .on_event(Event::BATCH_START, &mut state)
                .expect("noop");
        }));
        per_native.push(time_calls(&mut || {
            std::hint::black_box(&mut native)
                .on_event(
                    std::hint::black_box(Event::BATCH_START),
                    std::hint::black_box(&mut state),
                )
                .expect("noop");
        }));
    }
    let (plugin_ns, native_ns) = (median(&mut per_plugin) * 1e9, median(&mut per_native) * 1e9);
    println!("one hooked event: through the plugin ABI {plugin_ns:.1} ns/call, native dyn call {native_ns:.1} ns/call ({calls} calls x 3)");

    // 2. Step time with 10 no-op plugins on every event vs none.
    let rounds = env_usize("ROUNDS", 6);
    let steps = env_usize("STEPS", 5);
    let plugins: Vec<Box<dyn Algorithm>> = (0..10)
        .map(|_| Box::new(plugin.create("{}").expect("noop")) as Box<dyn Algorithm>)
        .collect();
    let mut with = resnet20_trainer(&dir, plugins);
    let mut without = resnet20_trainer(&dir, Vec::new());
    tch::manual_seed(0);
    let input = Tensor::randn([BATCH, 3, 32, 32], (Kind::Float, Device::Cpu));
    let target = Tensor::randint(10, [BATCH], (Kind::Int64, Device::Cpu));
    let step = |t: &mut Trainer| {
        let start = Instant::now();
        t.step(
            Batch::new(input.shallow_clone(), target.shallow_clone()),
            start,
        )
        .expect("step");
        start.elapsed().as_secs_f64()
    };
    for _ in 0..2 {
        step(&mut with);
        step(&mut without);
    }
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        for k in 0..2 {
            let first = (round + k) % 2 == 0;
            for _ in 0..steps {
                if first {
                    a.push(step(&mut with));
                } else {
                    b.push(step(&mut without));
                }
            }
        }
    }
    let events_per_step: u64 = Event::ALL
        .iter()
        .map(|&e| with.engine().count(e))
        .sum::<u64>()
        / with.timestamp().batch.max(1);
    let (ma, mb) = (median(&mut a), median(&mut b));
    println!(
        "ResNet-20 batch 128 step: 10 no-op plugins on every event (~{events_per_step} events/step, {} calls/step) median {:.1} ms, no plugins {:.1} ms: ratio {:.4} ({} steps each)",
        events_per_step * 10,
        ma * 1e3,
        mb * 1e3,
        ma / mb,
        a.len()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
