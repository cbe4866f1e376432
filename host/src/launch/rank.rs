//! One rank's process: started with its variables, its output forwarded with a `[rank R] `
//! prefix and the last lines of its stderr kept for a failure report.

use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{LaunchError, Topology};

/// How many of a piped rank's last stderr lines a failure report shows.
pub const STDERR_TAIL_LINES: usize = 20;
/// How long an exited rank's last output lines get to pass through before the launcher reports
/// on it.
const OUTPUT_DRAIN: Duration = Duration::from_secs(1);

/// One rank's process, while supervised.
pub(super) struct RankProcess {
    /// The global rank.
    pub(super) rank: u32,
    pub(super) pid: u32,
    child: Child,
    /// Set once the process is reaped; until then its pid cannot be reused, so signals sent
    /// to it reach this rank.
    exited: Option<ExitStatus>,
    /// The launcher killed it (SIGKILL).
    pub(super) killed: bool,
    /// The last stderr lines of a piped rank; `None` for local rank 0, which writes to the
    /// launcher's own stderr.
    stderr_tail: Option<Arc<Mutex<VecDeque<String>>>>,
    /// The threads forwarding its stdout and stderr.
    readers: Vec<JoinHandle<()>>,
}

impl RankProcess {
    /// Starts `program args` as this node's `local_rank`, with its variables. Local rank 0
    /// shares the launcher's stdout and stderr; the others' are forwarded with a prefix.
    pub(super) fn start(
        program: &OsStr,
        args: &[OsString],
        topology: &Topology,
        local_rank: u32,
    ) -> Result<RankProcess, LaunchError> {
        let rank = topology.global_rank(local_rank);
        let mut command = Command::new(program);
        command
            .args(args)
            .envs(topology.rank_env(local_rank))
            .stdin(Stdio::null())
            // Its own process group: a Ctrl-C at the terminal reaches only the launcher, which
            // passes one SIGTERM on. A rank that got both would take the second signal as
            // "stop at once" and skip its checkpoint.
            .process_group(0);
        if local_rank != 0 {
            command.stdout(Stdio::piped()).stderr(Stdio::piped());
        }
        super::stop_with_parent(&mut command);
        let mut child = command.spawn().map_err(|cause| LaunchError::Spawn {
            rank,
            program: program.to_string_lossy().into_owned(),
            cause,
        })?;
        let mut readers = Vec::new();
        let mut stderr_tail = None;
        if let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) {
            let tail = Arc::new(Mutex::new(VecDeque::with_capacity(STDERR_TAIL_LINES)));
            readers.push(std::thread::spawn(move || {
                forward_lines(stdout, rank, &mut io::stderr(), None)
            }));
            let kept = Arc::clone(&tail);
            readers.push(std::thread::spawn(move || {
                forward_lines(stderr, rank, &mut io::stderr(), Some(&kept))
            }));
            stderr_tail = Some(tail);
        }
        Ok(RankProcess {
            rank,
            pid: child.id(),
            child,
            exited: None,
            killed: false,
            stderr_tail,
            readers,
        })
    }

    /// Not yet reaped.
    pub(super) fn is_running(&self) -> bool {
        self.exited.is_none()
    }

    /// Exited with status 0.
    pub(super) fn succeeded(&self) -> bool {
        self.exited.is_some_and(|status| status.success())
    }

    /// The exit status, the first time it is seen after the process exited.
    pub(super) fn reap(&mut self) -> Result<Option<ExitStatus>, LaunchError> {
        if !self.is_running() {
            return Ok(None);
        }
        let status = self.child.try_wait().map_err(|cause| LaunchError::Wait {
            rank: self.rank,
            pid: self.pid,
            cause,
        })?;
        self.exited = status;
        Ok(status)
    }

    /// Sends SIGTERM, unless the process was reaped.
    pub(super) fn terminate(&self) {
        if let (true, Ok(pid)) = (self.is_running(), libc::pid_t::try_from(self.pid)) {
            // SAFETY: kill takes plain integers; the pid is this launcher's unreaped child, so
            // it names this rank.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
    }

    /// Sends SIGKILL, unless the process was reaped.
    pub(super) fn kill(&mut self) {
        if self.is_running() {
            // Only fails when the process is already gone.
            let _ = self.child.kill();
            self.killed = true;
        }
    }

    /// Kills the process and waits for it (when the launcher cannot go on).
    pub(super) fn kill_and_wait(&mut self) {
        self.kill();
        if let Ok(status) = self.child.wait() {
            self.exited = Some(status);
        }
    }

    /// Everything it wrote has been forwarded.
    pub(super) fn output_forwarded(&self) -> bool {
        self.readers.iter().all(JoinHandle::is_finished)
    }

    /// Its last stderr lines, once they are in (after [`OUTPUT_DRAIN`] at the most); empty for
    /// local rank 0.
    pub(super) fn last_stderr_lines(&self) -> Vec<String> {
        wait_for_output(std::slice::from_ref(self));
        let Some(tail) = &self.stderr_tail else {
            return Vec::new();
        };
        let tail = tail.lock().unwrap_or_else(PoisonError::into_inner);
        tail.iter().cloned().collect()
    }
}

/// Waits until every rank's output has been forwarded, or [`OUTPUT_DRAIN`] has passed (a
/// grandchild may hold a pipe open for longer).
pub(super) fn wait_for_output(ranks: &[RankProcess]) {
    let until = Instant::now() + OUTPUT_DRAIN;
    while Instant::now() < until && !ranks.iter().all(RankProcess::output_forwarded) {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Copies `input` to `out` line by line, each line prefixed `[rank R] ` and written at once (so
/// that ranks' lines do not interleave), and keeps the last [`STDERR_TAIL_LINES`] in `tail`.
pub(super) fn forward_lines(
    input: impl Read,
    rank: u32,
    out: &mut impl Write,
    tail: Option<&Mutex<VecDeque<String>>>,
) {
    let mut input = BufReader::new(input);
    let mut bytes = Vec::new();
    loop {
        bytes.clear();
        match input.read_until(b'\n', &mut bytes) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let text = String::from_utf8_lossy(&bytes);
        let line = text.trim_end_matches(['\n', '\r']);
        // The launcher's stderr may be gone (a closed terminal); the rank goes on regardless.
        let _ = out.write_all(format!("[rank {rank}] {line}\n").as_bytes());
        if let Some(tail) = tail {
            let mut tail = tail.lock().unwrap_or_else(PoisonError::into_inner);
            if tail.len() == STDERR_TAIL_LINES {
                tail.pop_front();
            }
            tail.push_back(line.to_owned());
        }
    }
}
