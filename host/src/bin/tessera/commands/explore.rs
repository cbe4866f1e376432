//! `tessera explore`: the Pareto frontier of time and cost against quality, and the report.

use std::path::PathBuf;

use tessera::{cost, explore};

use crate::Exit;

#[derive(clap::Args)]
pub struct Args {
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
    /// The quality measure: accuracy (higher is better), perplexity (lower is better), or a
    /// top-k accuracy (top5) or f1 the runs computed (higher is better);
    /// default: perplexity for language models, else accuracy.
    #[arg(long, value_name = "METRIC")]
    metric: Option<explore::QualityMetric>,
    /// What makes runs comparable: `model` (the same dataset and `[model]` table; the
    /// default) or `dataset` (runs of any model on one dataset share a group, so a recipe that
    /// brings its own network is measured against the baseline of another).
    #[arg(long, value_name = "BY", default_value = "model")]
    group_by: explore::GroupBy,
    /// Print the instance presets (with TESSERA_INSTANCES applied), their prices and when
    /// they were read, and exit.
    #[arg(long)]
    list_instances: bool,
}

pub fn run(args: Args) -> anyhow::Result<Exit> {
    let Args {
        runs_dirs,
        mlflow_uri,
        mlflow_experiment,
        out,
        usd_per_hour,
        instance,
        metric,
        group_by,
        list_instances,
    } = args;
    if list_instances {
        print_instances(&cost::Instances::load()?);
        return Ok(Exit::SUCCESS);
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
        group_by,
    };
    run_explore(&options)?;
    Ok(Exit::SUCCESS)
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
