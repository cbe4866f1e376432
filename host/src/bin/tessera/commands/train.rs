//! `tessera train`: one training run as a trainer.toml describes it.

use std::path::PathBuf;

use tessera::config;
use tessera::trainer::{self, Trainer};

use crate::Exit;
use crate::{install_stop_handlers, is_other_rank};

#[derive(clap::Args)]
pub struct Args {
    /// The trainer.toml file.
    config: PathBuf,
    /// Override a setting: `--set optimizer.lr=0.05` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    overrides: Vec<String>,
    /// Train with this recipe file's methods (`recipe` and `[[algorithms]]`) instead of
    /// the trainer.toml's own `[[algorithms]]`.
    #[arg(long, value_name = "FILE")]
    recipe: Option<PathBuf>,
}

pub fn run(args: Args) -> anyhow::Result<Exit> {
    let Args {
        config,
        overrides,
        recipe,
    } = args;
    let recipe = recipe.as_deref().map(config::load_recipe).transpose()?;
    let cfg = config::load_with_recipe(&config, &overrides, recipe.as_ref())?;
    let stop = install_stop_handlers()?;
    let mut trainer = Trainer::new(cfg, Vec::new())?;
    trainer.set_stop_flag(stop);
    let summary = trainer.fit()?;
    if let Some(signal) = summary.interrupted_by.filter(|_| is_other_rank()) {
        return Ok(Exit::from(128u8.saturating_add(signal as u8)));
    }
    if is_other_rank() {
        return Ok(Exit::SUCCESS);
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
        return Ok(Exit::from(128u8.saturating_add(signal as u8)));
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
    Ok(Exit::SUCCESS)
}
