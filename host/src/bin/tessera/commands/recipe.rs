//! `tessera recipe search`: short runs of a few recipes, then the fastest to the target.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::Subcommand;
use tessera::{config, trainer};

use crate::install_stop_handlers;
use crate::Exit;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: RecipeCommand,
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

pub fn run(args: Args) -> anyhow::Result<Exit> {
    let RecipeCommand::Search {
        config: path,
        budget,
        target,
        recipes,
        seeds,
        out,
        overrides,
    } = args.command;
    let base = config::load(&path, &overrides)?;
    let out = out.unwrap_or_else(|| {
        base.output_dir
            .join(format!("{}-recipe-search", base.run_name))
    });
    let out = std::path::absolute(&out).with_context(|| format!("resolving {}", out.display()))?;
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
        program: std::env::current_exe().context("finding the tessera binary the runs use")?,
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
        return Ok(Exit::from(128u8.saturating_add(signal as u8)));
    }
    Ok(Exit::SUCCESS)
}
