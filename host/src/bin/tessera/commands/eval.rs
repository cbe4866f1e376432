//! `tessera eval`: a model's test-set result, without training.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use tessera::trainer::{self, Trainer};

use crate::Exit;

#[derive(clap::Args)]
pub struct Args {
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
}

pub fn run(args: Args) -> anyhow::Result<Exit> {
    let Args {
        path,
        json,
        to,
        overrides,
    } = args;
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
    for (name, value) in r.extra.iter() {
        result[name] = serde_json::json!(value);
    }
    let extra: String = r
        .extra
        .iter()
        .map(|(name, value)| format!(", {name} {value:.4}"))
        .collect();
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
                 {:.4}{extra} on {} test sequences ({} tokens)",
                r.cross_entropy,
                r.accuracy,
                r.samples,
                r.tokens.unwrap_or(0)
            ),
            None => println!(
                "{what}: accuracy {:.4}, cross-entropy {:.4}{extra} on {} test samples",
                r.accuracy, r.cross_entropy, r.samples
            ),
        }
    }
    Ok(Exit::SUCCESS)
}
