//! Running a sweep's runs as `tessera train` processes, at most N at a time.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::io::AsRawFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::error::{io, SweepError};
use crate::with_causes;
use serde_json::Value;

use super::outcome::{log_tail, RunOutcome};
use super::plan::{FolderState, Plan, PlannedRun};
use super::progress::Progress;
use super::{write_summary, RunEntry};

/// How often the sweep looks at its runs.
const POLL: Duration = Duration::from_millis(200);
/// How many of a failed run's last log lines its report shows.
const LOG_TAIL_LINES: usize = 8;

/// How a sweep runs.
pub struct SweepOptions {
    /// Runs at a time.
    pub parallel: usize,
    /// The `tessera` binary the runs use.
    pub program: PathBuf,
    /// Show progress bars (when stderr is a terminal); otherwise log lines.
    pub progress: bool,
    /// Set to the signal number by SIGINT/SIGTERM handlers: the sweep passes SIGTERM on to its
    /// runs (each writes a checkpoint and stops) and starts no more.
    pub stop: Arc<AtomicUsize>,
}

/// What a sweep did.
pub struct SweepOutcome {
    /// Each run with its outcome, in plan order.
    pub runs: Vec<(PlannedRun, RunOutcome)>,
    /// The signal that stopped the sweep, if one did.
    pub stopped_by: Option<i32>,
}

struct Running {
    index: usize,
    child: Child,
    started: Instant,
}

/// Runs the plan's runs that are not done yet; `sweep_file` is named in `sweep.json`.
pub fn run_sweep(
    plan: Plan,
    sweep_file: &Path,
    options: &SweepOptions,
) -> Result<SweepOutcome, SweepError> {
    let Plan { dir, runs } = plan;
    let dir = dir.as_path();
    std::fs::create_dir_all(dir).map_err(io("creating", dir))?;
    let _lock = lock(dir)?;
    let mut outcomes: Vec<Option<RunOutcome>> = Vec::with_capacity(runs.len());
    let mut queue = VecDeque::new();
    for (i, run) in runs.iter().enumerate() {
        match run.state()? {
            FolderState::Done(record) => outcomes.push(Some(RunOutcome::Done(record))),
            FolderState::Resume | FolderState::New => {
                outcomes.push(None);
                queue.push_back(i);
            }
        }
    }
    let already = runs.len() - queue.len();
    let mut progress = Progress::new(options.progress, runs.len(), already, options.parallel);
    if already > 0 {
        progress.note(&format!(
            "{already} of {} runs already done in {}; running the other {}",
            runs.len(),
            dir.display(),
            queue.len()
        ));
    }
    let mut running: Vec<Running> = Vec::new();
    let mut stopped_by = None;
    let mut changed = true;
    loop {
        if stopped_by.is_none() {
            let signal = options.stop.load(Ordering::SeqCst);
            if signal != 0 {
                stopped_by = Some(signal as i32);
                progress.note(&format!(
                    "stopping: each running run writes a checkpoint and stops ({} running)",
                    running.len()
                ));
                for r in &running {
                    terminate(&r.child);
                }
            }
        }
        let mut i = 0;
        while i < running.len() {
            match running[i].child.try_wait() {
                Ok(Some(status)) => {
                    let r = running.swap_remove(i);
                    let run = &runs[r.index];
                    let outcome = finished(run, status, stopped_by.is_some());
                    progress.finished(run, &outcome, r.started.elapsed());
                    outcomes[r.index] = Some(outcome);
                    changed = true;
                }
                Ok(None) => i += 1,
                Err(source) => {
                    return Err(SweepError::Process {
                        action: "waiting for".to_owned(),
                        id: runs[running[i].index].id.clone(),
                        source,
                    })
                }
            }
        }
        while stopped_by.is_none() && running.len() < options.parallel {
            let Some(index) = queue.pop_front() else {
                break;
            };
            let run = &runs[index];
            match start(run, &options.program) {
                Ok(child) => {
                    progress.started(run);
                    running.push(Running {
                        index,
                        child,
                        started: Instant::now(),
                    });
                }
                Err(e) => {
                    let outcome = RunOutcome::Failed(with_causes(&e));
                    progress.finished(run, &outcome, Duration::ZERO);
                    outcomes[index] = Some(outcome);
                }
            }
            changed = true;
        }
        if changed {
            let entries = entries(&runs, &outcomes, &running);
            if let Err(e) = write_summary(dir, sweep_file, &entries) {
                tracing::warn!("cannot write {}: {e}", dir.join("sweep.json").display());
            }
            changed = false;
        }
        if running.is_empty() && (queue.is_empty() || stopped_by.is_some()) {
            break;
        }
        progress.tick(
            running
                .iter()
                .map(|r| (&runs[r.index], r.started.elapsed())),
            queue.len(),
        );
        std::thread::sleep(POLL);
    }
    progress.finish();
    let runs = runs
        .into_iter()
        .zip(outcomes)
        .map(|(run, outcome)| (run, outcome.unwrap_or(RunOutcome::NotStarted)))
        .collect();
    Ok(SweepOutcome { runs, stopped_by })
}

/// Holds an exclusive lock on the sweep folder while the sweep runs: two sweeps writing the
/// same run folders would corrupt each other's runs.
fn lock(dir: &Path) -> Result<File, SweepError> {
    let path = dir.join(".sweep.lock");
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(io("opening", &path))?;
    // SAFETY: flock on a file descriptor this function owns.
    let held = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if held != 0 {
        return Err(SweepError::Locked {
            dir: dir.to_owned(),
            lock: path,
        });
    }
    Ok(file)
}

/// Starts `tessera train` on the run's own `trainer.toml`, its output appended to `train.log`.
fn start(run: &PlannedRun, program: &Path) -> Result<Child, SweepError> {
    let dir = run.dir();
    std::fs::create_dir_all(&dir).map_err(io("creating", &dir))?;
    let config = run.config_path();
    if std::fs::read_to_string(&config).ok().as_deref() != Some(run.toml.as_str()) {
        crate::files::write_atomic(&config, run.toml.as_bytes()).map_err(io("writing", &config))?;
    }
    let log_path = run.log_path();
    let mut log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(io("opening", &log_path))?;
    writeln!(
        log,
        "== tessera sweep: {} train {}",
        program.display(),
        config.display()
    )
    .map_err(io("writing", &log_path))?;
    let err = log.try_clone().map_err(io("opening", &log_path))?;
    let mut command = Command::new(program);
    command
        .arg("train")
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err)
        // Its own process group: a Ctrl-C at the terminal reaches only the sweep, which passes
        // one SIGTERM on (a run that got two signals would stop without its checkpoint).
        .process_group(0);
    crate::launch::stop_with_parent(&mut command);
    command.spawn().map_err(|source| SweepError::Process {
        action: format!("starting {} for", program.display()),
        id: run.id.clone(),
        source,
    })
}

fn terminate(child: &Child) {
    if let Ok(pid) = i32::try_from(child.id()) {
        // SAFETY: kill with a pid of a child not yet reaped (it cannot have been reused).
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
    }
}

/// The outcome of a run whose process ended with `status`.
fn finished(run: &PlannedRun, status: ExitStatus, stopping: bool) -> RunOutcome {
    if status.success() {
        return match run.state() {
            Ok(FolderState::Done(record)) => RunOutcome::Done(record),
            // Exit 0 without a finished record: it was stopped by a signal (its record says
            // `interrupted by ...`), by us or by someone else.
            Ok(_) => RunOutcome::Interrupted,
            Err(e) => RunOutcome::Failed(format!("{e:#}")),
        };
    }
    let by_signal = status.signal().is_some() || matches!(status.code(), Some(130 | 143));
    if stopping && by_signal {
        return RunOutcome::Interrupted;
    }
    let how = match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        _ => "ended".to_owned(),
    };
    // libtorch's errors end in a C++ backtrace: the lines before it say what went wrong.
    let tail: Vec<String> = log_tail(&run.log_path(), 200)
        .into_iter()
        .filter(|l| !l.starts_with("frame #"))
        .collect();
    let tail = &tail[tail.len().saturating_sub(LOG_TAIL_LINES)..];
    RunOutcome::Failed(format!(
        "{how}; {} ends:\n{}",
        run.log_path().display(),
        tail.join("\n")
    ))
}

/// The summary entries of every run.
fn entries(
    runs: &[PlannedRun],
    outcomes: &[Option<RunOutcome>],
    running: &[Running],
) -> Vec<RunEntry> {
    runs.iter()
        .zip(outcomes)
        .enumerate()
        .map(|(i, (run, outcome))| {
            let is_running = running.iter().any(|r| r.index == i);
            let (status, error, record) = match (outcome, is_running) {
                (_, true) => ("running", None, None),
                (Some(RunOutcome::Done(record)), _) => ("done", None, Some(record)),
                (Some(RunOutcome::Failed(why)), _) => ("failed", Some(why.clone()), None),
                (Some(RunOutcome::Interrupted), _) => ("interrupted", None, None),
                (Some(RunOutcome::NotStarted) | None, _) => ("pending", None, None),
            };

            RunEntry {
                id: run.id.clone(),
                axes: run
                    .axes
                    .iter()
                    .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                    .collect(),
                folder: run.dir(),
                status: status.to_owned(),
                error,
                wall_seconds: record.map(|r| r.wall_seconds),
                final_accuracy: record.and_then(|r| r.final_accuracy),
                final_perplexity: record.and_then(|r| r.final_perplexity),
            }
        })
        .collect()
}
