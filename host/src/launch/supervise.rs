//! The supervision loop: reaps the ranks, reports the first failure and stops the others,
//! passes the launcher's signals on.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use super::rank::{wait_for_output, RankProcess};
use super::{LaunchError, Topology};
use crate::trainer::{known_signal_name, signal_name};

/// How often the launcher looks at its ranks and at the signals it received.
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// How a launch ended.
#[derive(Debug)]
pub enum Outcome {
    /// Every rank exited with status 0.
    Succeeded,
    /// A rank failed first; the others were stopped.
    Failed(RankFailure),
    /// The launcher was asked to stop by `signal` and passed it on to the ranks.
    Interrupted {
        /// SIGINT or SIGTERM.
        signal: i32,
    },
}

impl Outcome {
    /// The launcher's exit status: 0; the failed rank's exit code (1 when a signal killed it);
    /// or, interrupted, 128 + the signal, as `tessera train` exits when interrupted.
    pub fn exit_code(&self) -> u8 {
        match self {
            Outcome::Succeeded => 0,
            Outcome::Failed(failure) => failure
                .status
                .code()
                .and_then(|code| u8::try_from(code).ok())
                .filter(|&code| code != 0)
                .unwrap_or(1),
            Outcome::Interrupted { signal } => u8::try_from(128 + signal).unwrap_or(u8::MAX),
        }
    }
}

/// A rank that exited unsuccessfully.
#[derive(Debug, Clone)]
pub struct RankFailure {
    /// The global rank.
    pub rank: u32,
    /// Its process id.
    pub pid: u32,
    /// How it exited.
    pub status: ExitStatus,
    /// Its last stderr lines (at most [`super::STDERR_TAIL_LINES`]); empty for the node's local rank
    /// 0, whose stderr is the launcher's.
    pub stderr_tail: Vec<String>,
}

/// `rank R (pid P) failed with exit status C` or `... was killed by signal 9 (SIGKILL)`, then
/// the rank's last stderr lines, prefixed as they were printed.
impl fmt::Display for RankFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rank {} (pid {}) ", self.rank, self.pid)?;
        match (self.status.code(), self.status.signal()) {
            (Some(code), _) => write!(f, "failed with exit status {code}")?,
            (None, Some(signal)) => {
                write!(f, "was killed by signal {signal}")?;
                if let Some(name) = known_signal_name(signal) {
                    write!(f, " ({name})")?;
                }
            }
            (None, None) => write!(f, "failed ({})", self.status)?,
        }
        if !self.stderr_tail.is_empty() {
            write!(f, "; its last stderr lines:")?;
            for line in &self.stderr_tail {
                write!(f, "\n[rank {}] {line}", self.rank)?;
            }
        }
        Ok(())
    }
}

/// Starts `program args` once per local rank of `topology`, with that rank's variables, and
/// supervises the ranks until every one has exited. `pending_signals` returns the signals the
/// launcher received since it was last called (SIGINT, SIGTERM): each is passed on to the
/// ranks as SIGTERM. After the first failure or a second signal, ranks still running after
/// `grace` are killed.
///
/// Must be called on a thread that outlives the ranks: on Linux a rank gets SIGTERM when the
/// thread that started it ends, so that no rank outlives a killed launcher.
pub fn supervise(
    program: &OsStr,
    args: &[OsString],
    topology: &Topology,
    grace: Duration,
    mut pending_signals: impl FnMut() -> Vec<i32>,
) -> Result<Outcome, LaunchError> {
    let mut supervisor = Supervisor {
        ranks: Vec::new(),
        outcome: None,
        kill_at: None,
        grace,
    };
    for local_rank in 0..topology.nproc {
        match RankProcess::start(program, args, topology, local_rank) {
            Ok(rank) => supervisor.ranks.push(rank),
            Err(error) => {
                supervisor.kill_all();
                return Err(error);
            }
        }
    }
    loop {
        for signal in pending_signals() {
            supervisor.on_signal(signal);
        }
        if let Err(error) = supervisor.reap() {
            supervisor.kill_all();
            return Err(error);
        }
        if !supervisor.ranks.iter().any(RankProcess::is_running) {
            break;
        }
        if supervisor.kill_at.is_some_and(|at| Instant::now() >= at) {
            supervisor.kill_stragglers();
        }
        std::thread::sleep(POLL_INTERVAL);
    }
    wait_for_output(&supervisor.ranks);
    Ok(match supervisor.outcome {
        // Ranks that finished before the signal reached them make no interrupted run.
        Some(Outcome::Interrupted { .. })
            if supervisor.ranks.iter().all(RankProcess::succeeded) =>
        {
            Outcome::Succeeded
        }
        Some(outcome) => outcome,
        None => Outcome::Succeeded,
    })
}

/// The supervision loop's state.
struct Supervisor {
    ranks: Vec<RankProcess>,
    /// Set by the first failure or signal; later ones do not change it.
    outcome: Option<Outcome>,
    /// When ranks still running are killed.
    kill_at: Option<Instant>,
    grace: Duration,
}

impl Supervisor {
    /// Reaps the ranks that exited, then acts on their status (so that a failure report does
    /// not count ranks that exited at the same time as still running).
    fn reap(&mut self) -> Result<(), LaunchError> {
        let mut exited = Vec::new();
        for (index, rank) in self.ranks.iter_mut().enumerate() {
            if let Some(status) = rank.reap()? {
                exited.push((index, status));
            }
        }
        for (index, status) in exited {
            self.on_exit(index, status);
        }
        Ok(())
    }

    fn on_exit(&mut self, index: usize, status: ExitStatus) {
        if status.success() {
            return;
        }
        match self.outcome {
            None => {
                let failure = self.failure(index, status);
                eprintln!("tessera launch: {failure}");
                self.outcome = Some(Outcome::Failed(failure));
                let running = self.ranks.iter().filter(|rank| rank.is_running()).count();
                if running > 0 {
                    let ranks = if running == 1 { "rank" } else { "ranks" };
                    eprintln!(
                        "tessera launch: stopping the {running} other {ranks} (SIGTERM, then \
                         SIGKILL after {} s)",
                        self.grace.as_secs_f64()
                    );
                    self.terminate_all();
                    self.kill_at = Some(Instant::now() + self.grace);
                }
            }
            // Stopping on a signal: a rank that exits as `tessera train` does when
            // interrupted is expected, anything else is worth a line.
            Some(Outcome::Interrupted { .. })
                if !self.ranks[index].killed && !stopped_by_request(status) =>
            {
                eprintln!("tessera launch: {}", self.failure(index, status));
            }
            Some(_) => {}
        }
    }

    fn on_signal(&mut self, signal: i32) {
        let name = signal_name(signal);
        if self.outcome.is_none() {
            eprintln!(
                "tessera launch: {name}: asking every rank to stop (SIGTERM; `tessera train` \
                 writes a checkpoint first); send it again to stop them at once"
            );
            self.outcome = Some(Outcome::Interrupted { signal });
        } else {
            eprintln!(
                "tessera launch: {name} again: stopping every rank at once (SIGKILL after {} s)",
                self.grace.as_secs_f64()
            );
            self.kill_at.get_or_insert(Instant::now() + self.grace);
        }
        self.terminate_all();
    }

    fn terminate_all(&self) {
        self.ranks.iter().for_each(RankProcess::terminate);
    }

    fn kill_stragglers(&mut self) {
        let grace = self.grace.as_secs_f64();
        for rank in self.ranks.iter_mut().filter(|rank| rank.is_running()) {
            eprintln!(
                "tessera launch: rank {} (pid {}) still runs {grace} s after SIGTERM; killing it \
                 (SIGKILL)",
                rank.rank, rank.pid
            );
            rank.kill();
        }
        self.kill_at = None;
    }

    /// Kills and reaps every rank still running (when the launcher cannot go on).
    fn kill_all(&mut self) {
        for rank in self.ranks.iter_mut().filter(|rank| rank.is_running()) {
            rank.kill_and_wait();
        }
    }

    /// The report on `index`'s failure, once its last output lines are in.
    fn failure(&self, index: usize, status: ExitStatus) -> RankFailure {
        let rank = &self.ranks[index];
        RankFailure {
            rank: rank.rank,
            pid: rank.pid,
            status,
            stderr_tail: rank.last_stderr_lines(),
        }
    }
}

/// How `tessera train` exits when a signal asks it to stop: 128 + SIGINT or SIGTERM, or killed
/// by one of them.
fn stopped_by_request(status: ExitStatus) -> bool {
    let requests = [libc::SIGINT, libc::SIGTERM];
    match (status.code(), status.signal()) {
        (Some(code), _) => requests.iter().any(|signal| code == 128 + signal),
        (None, Some(signal)) => requests.contains(&signal),
        (None, None) => false,
    }
}
