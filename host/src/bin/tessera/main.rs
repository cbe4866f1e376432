//! The `tessera` command line: one file per command in `commands/` (its arguments and its
//! `run`), dispatched from here.

mod commands;
mod fork_server;

use std::io::Write as _;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::Arc;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use tessera_plugin_api::{API_VERSION, LIBTORCH_VERSION};

#[derive(Parser)]
#[command(
    name = "tessera",
    about = "A fast deep-learning trainer whose speed-up methods are binary plugins",
    disable_version_flag = true,
    after_help = "Examples:\n  tessera data fetch fashion-mnist\n  tessera train examples/fashion-mnist/trainer.toml\n  tessera train trainer.toml --set optimizer.lr=0.05 --set train.max_duration=1ep\n  tessera launch --nproc 4 train trainer.toml\n  tessera plugins list\n  tessera plugins install ./libmy_method.so\n  tessera new-plugin my_method\n  tessera eval runs/demo/checkpoints/latest.ckpt\n  tessera predict runs/demo/checkpoints/latest.ckpt --to predictions.jsonl\n  tessera export runs/demo/checkpoints/latest.ckpt --to model.safetensors\n  tessera generate runs/demo/checkpoints/latest.ckpt --prompt \"Once upon\"\n  tessera explore runs/"
)]
struct Cli {
    /// Print the version, the libtorch version and whether CUDA is usable.
    #[arg(short = 'V', long)]
    version: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Train as described by a trainer.toml.
    Train(commands::train::Args),
    /// Start the ranks of a data-parallel run on this node and supervise them, as torchrun
    /// does: each rank runs `tessera COMMAND...` with RANK, WORLD_SIZE, LOCAL_RANK,
    /// LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR and MASTER_PORT set. Local rank 0 writes to
    /// this terminal; the other ranks' lines are prefixed `[rank R]` on stderr. When a rank
    /// fails, the others get SIGTERM, then SIGKILL after the grace period; SIGINT or SIGTERM
    /// here is passed on as SIGTERM (`tessera train` writes a checkpoint and stops). Under
    /// torchrun or Slurm, run `tessera train` directly instead. See docs/distributed.md.
    #[command(
        after_help = "Examples:\n  tessera launch --nproc 4 train trainer.toml --set optimizer.lr=0.2\n  \
                      # two machines, 8 ranks each; node 0 is 10.0.0.1:\n  \
                      tessera launch --nproc 8 --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 train trainer.toml\n  \
                      tessera launch --nproc 8 --nnodes 2 --node-rank 1 --master-addr 10.0.0.1 train trainer.toml"
    )]
    Launch(commands::launch::Args),
    /// Run a sweep: every combination of a sweep file's axes (recipes, seeds,
    /// scale_schedule_ratio, any trainer.toml key) over a base trainer.toml, each run a
    /// `tessera train` process in its own folder (its output in train.log there). Run it again
    /// after a stop or a crash: finished runs are skipped and stopped ones continue from their
    /// checkpoints. SIGINT/SIGTERM stop the running runs with a checkpoint. Writes sweep.json
    /// (every run's status and result) into the sweep folder. See docs/sweeps.md.
    #[command(
        after_help = "Examples:\n  tessera sweep examples/recipes/sweep.toml\n  \
                      tessera sweep sweep.toml --parallel 2 --set train.max_duration=1ep\n  \
                      tessera sweep sweep.toml --dry-run"
    )]
    Sweep(commands::sweep::Args),
    /// Recipes: find which one reaches your accuracy fastest.
    Recipe(commands::recipe::Args),
    /// Evaluate a model on the test set, without training: a checkpoint's (rebuilt from the
    /// config it records) or a trainer.toml's (the checkpoint it loads, else a fresh model).
    /// Prints accuracy and cross-entropy; writes nothing else unless --to is given.
    Eval(commands::eval::Args),
    /// Predict every test sample with a checkpoint's or a trainer.toml's model and write the
    /// predictions as JSON Lines (index, predicted class, target, class probabilities).
    Predict(commands::predict::Args),
    /// Generate text from a language model: a run's checkpoint (rebuilt with its methods) or
    /// a Hugging Face save_pretrained folder (llama, gpt2). Greedy by default; --temperature,
    /// --top-k, --top-p and --seed sample. Streams one prompt's text as it comes; --json writes
    /// JSON Lines. See docs/generate.md.
    #[command(
        after_help = "Examples:\n  tessera generate runs/demo/checkpoints/latest.ckpt --prompt \"To be\"\n  \
                      tessera generate exported-hf/ --prompt \"Once\" --max-new-tokens 100 --temperature 0.8 --top-p 0.95 --seed 1\n  \
                      tessera generate model/ --prompts prompts.jsonl --json --stop $'\\n\\n'"
    )]
    Generate(commands::generate::Args),
    /// Datasets.
    Data(commands::data::Args),
    /// Plugins.
    Plugins(commands::plugins::Args),
    /// Write a checkpoint's model as a plain safetensors file for PyTorch (`state_dict` names;
    /// see docs/export.md).
    Export(commands::export::Args),
    /// Compare runs: per dataset and model, the Pareto frontier of wall time (and cost) against
    /// quality, and each recipe's speed-up over the baseline at equal quality. Prints a table
    /// per group; writes frontier-<group>.svg/.png and a self-contained report.html. See
    /// docs/explore.md.
    #[command(
        after_help = "Examples:\n  tessera explore runs/\n  tessera explore runs/a runs/b --out explore --instance aws/p4d.24xlarge\n  tessera explore runs/ --usd-per-hour 1.2 --metric accuracy\n  tessera explore --list-instances"
    )]
    Explore(commands::explore::Args),
    /// Create a new plugin crate (its own cargo workspace) with a working example method.
    NewPlugin(commands::new_plugin::Args),
}

fn version_text() -> String {
    let cuda = if tch::Cuda::is_available() {
        format!("available ({} device(s))", tch::Cuda::device_count())
    } else if env!("TESSERA_LIBTORCH_HAS_CUDA") == "1" {
        "not available (libtorch has CUDA support, but no GPU or driver was found)".to_owned()
    } else {
        "not available (CPU-only libtorch)".to_owned()
    };
    format!(
        "tessera {}\nlibtorch {LIBTORCH_VERSION}\nplugin-api {API_VERSION}\ncuda {cuda}",
        env!("CARGO_PKG_VERSION")
    )
}

/// SIGINT and SIGTERM ask a training run to stop after the current step, write a checkpoint and
/// exit; a second signal exits at once (status 130).
fn install_stop_handlers() -> anyhow::Result<Arc<AtomicUsize>> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let which = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(AtomicBool::new(false));
    for signal in [SIGINT, SIGTERM] {
        // The shutdown check is registered first, so it runs before this signal sets `seen`:
        // only a second signal terminates the process.
        signal_hook::flag::register_conditional_shutdown(signal, 130, Arc::clone(&seen))
            .context("installing signal handlers")?;
        signal_hook::flag::register(signal, Arc::clone(&seen))
            .context("installing signal handlers")?;
        signal_hook::flag::register_usize(signal, Arc::clone(&which), signal as usize)
            .context("installing signal handlers")?;
    }
    Ok(which)
}

fn run(cli: Cli) -> anyhow::Result<Exit> {
    if cli.version {
        println!("{}", version_text());
        return Ok(Exit::SUCCESS);
    }
    let Some(command) = cli.command else {
        anyhow::bail!("no command given; see `tessera --help`");
    };
    match command {
        Command::Train(args) => commands::train::run(args),
        Command::Launch(args) => commands::launch::run(args),
        Command::Sweep(args) => commands::sweep::run(args),
        Command::Recipe(args) => commands::recipe::run(args),
        Command::Eval(args) => commands::eval::run(args),
        Command::Predict(args) => commands::predict::run(args),
        Command::Generate(args) => commands::generate::run(args),
        Command::Data(args) => commands::data::run(args),
        Command::Plugins(args) => commands::plugins::run(args),
        Command::Export(args) => commands::export::run(args),
        Command::Explore(args) => commands::explore::run(args),
        Command::NewPlugin(args) => commands::new_plugin::run(args),
    }
}

/// How a command ends: the process's exit status (0 done, 1 an error, 128 + n stopped by
/// signal n).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exit(u8);

impl Exit {
    pub const SUCCESS: Exit = Exit(0);
    pub const FAILURE: Exit = Exit(1);
}

impl From<u8> for Exit {
    fn from(code: u8) -> Exit {
        Exit(code)
    }
}

/// Ends the process with `exit` once its output is written, without the static destructors of
/// the libraries it loaded. libtorch's deregister every operator one by one and free the
/// dispatcher's tables: about 0.15 s of CPU, as much as a short command's work, for memory the
/// end of the process frees anyway. Everything of Tessera's own (files, checkpoints, logs,
/// child processes) was closed, written and waited for when `run` returned.
fn exit_now(exit: Exit) -> ! {
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: fflush(NULL) writes every C stdio stream (what libtorch printed); _exit ends the
    // process, which owns nothing else that needs running code to be released.
    unsafe {
        libc::fflush(std::ptr::null_mut());
        libc::_exit(i32::from(exit.0))
    }
}

/// Whether this process is a data-parallel rank other than 0 (as `tessera train` reads the
/// environment): such a rank logs only warnings and errors by default and prints no summary,
/// rank 0 speaks for the run.
fn is_other_rank() -> bool {
    matches!(tessera::dist::RankEnv::from_env(), Ok(Some(env)) if env.rank > 0)
}

fn main() {
    // `tessera __fork-server` serves there; each command it forks comes back with its own
    // command line and runs from here as a started `tessera` would.
    let args = fork_server::serve_if_asked();
    let default_level = if is_other_rank() { "warn" } else { "info" };
    let filter = tracing_subscriber::EnvFilter::try_from_env("TESSERA_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let tuning = tessera::memory::tune_for_training();
    tracing::debug!("C allocator: {tuning:?}");
    let cli = match args {
        Some(args) => Cli::parse_from(args),
        None => Cli::parse(),
    };
    let exit = match run(cli) {
        Ok(exit) => exit,
        Err(e) => {
            eprintln!("error: {}", tessera::with_causes(e.as_ref()));
            Exit::FAILURE
        }
    };
    exit_now(exit)
}
