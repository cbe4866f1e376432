//! `tessera sweep`: plans every run (checking every configuration first), then runs those not
//! done and prints a table of the results.

use std::path::PathBuf;

use anyhow::Context as _;
use tessera::sweep::{self, FolderState, RunOutcome};
use tessera::{config, trainer};

use crate::install_stop_handlers;
use crate::Exit;

#[derive(clap::Args)]
pub struct Args {
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
}

pub fn run(args: Args) -> anyhow::Result<Exit> {
    let Args {
        sweep: file,
        parallel,
        overrides,
        dry_run,
    } = args;
    let (file, overrides) = (file.as_path(), overrides.as_slice());
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
                FolderState::Done(_) => "done (skipped)",
                FolderState::Resume => "continues from its checkpoint",
                FolderState::New => "starts",
            };
            println!("{:<32} {what}", run.id);
        }
        return Ok(Exit::SUCCESS);
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
                let quality = match (r.final_perplexity, r.final_accuracy) {
                    (Some(p), _) => format!("ppl {p:.3}"),
                    (None, Some(a)) => format!("acc {a:.4}"),
                    _ => "-".to_owned(),
                };
                ("done", quality, format!("{:.1}s", r.wall_seconds))
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
    print_seed_spread(&outcome.runs);
    if let Some(signal) = outcome.stopped_by {
        eprintln!(
            "sweep stopped by {}; run the same command again to continue",
            trainer::signal_name(signal)
        );
        return Ok(Exit::from(128u8.saturating_add(signal as u8)));
    }
    if failed > 0 {
        eprintln!("{failed} run(s) failed (see above and their train.log); run the sweep again to retry them");
        return Ok(Exit::FAILURE);
    }
    Ok(Exit::SUCCESS)
}

/// With a `seed` axis: each point over its seeds, the mean ± half the range (smallest to
/// largest) of its final result and wall time.
fn print_seed_spread(runs: &[(sweep::PlannedRun, RunOutcome)]) {
    let groups = sweep::seed_groups(runs.iter().map(|(run, o)| (run.axes.as_slice(), o)));
    if groups.is_empty() {
        return;
    }
    println!();
    println!(
        "{:<32} {:>5} {:>22} {:>16}",
        "over seeds (mean ± half range)", "seeds", "result", "wall"
    );
    for g in groups {
        let quality = match g.quality {
            Some(("ppl", s)) => format!("ppl {:.3} ± {:.3}", s.mean, s.half_range()),
            Some((kind, s)) => format!("{kind} {:.4} ± {:.4}", s.mean, s.half_range()),
            None => "-".to_owned(),
        };
        let wall = format!("{:.1}s ± {:.1}s", g.wall.mean, g.wall.half_range());
        println!("{:<32} {:>5} {quality:>22} {wall:>16}", g.label, g.seeds);
    }
}
