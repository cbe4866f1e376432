//! One started `tessera __fork-server` per test process (`host/src/bin/tessera/fork_server.rs`),
//! which runs the commands of [`crate::tessera`] in forks of itself. A fresh `tessera` spends
//! about 0.4 s of CPU loading libtorch and running its static constructors before `main`; the
//! suite runs over a thousand commands (docs/testing.md, "A started tessera runs the commands").
//!
//! Each command still is a process of its own, started from `main` with its arguments, folder,
//! environment and output as [`crate::tessera_command`] would give a fresh one; only the
//! loading was done once. A command whose `env` holds a variable that is read while a process
//! loads (OpenMP's, glibc's, libtorch's) rather than while `tessera` runs starts fresh, and
//! `TESSERA_FORK_SERVER=0` starts every command fresh. Tests that signal the process, time its
//! start or run another binary use [`crate::tessera_command`], which always starts a fresh one.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::Output;

/// Variables a command may set and still run in a fork: read by `tessera` (or what it starts)
/// while it runs, never while a process loads.
fn read_at_run_time(key: &str) -> bool {
    const KEYS: &[&str] = &[
        "PATH",
        "HOME",
        "LIBTORCH",
        "NO_COLOR",
        "NO_PROXY",
        "PYTHONPATH",
        "PYTHONWARNINGS",
        "CARGO_TARGET_DIR",
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
    ];
    ["TESSERA_", "AWS_", "XDG_"]
        .iter()
        .any(|prefix| key.starts_with(prefix))
        || KEYS.contains(&key)
}

/// A reply of the server about one command.
enum Reply {
    /// Its process runs with this pid.
    Pid(u32),
    /// It ended with this wait status.
    Exit(i32),
    /// It could not be started (or the server ended).
    Error(String),
}

struct Server {
    requests: Mutex<ChildStdin>,
    waiting: Arc<Mutex<HashMap<u64, mpsc::Sender<Reply>>>>,
    next: AtomicU64,
    /// Where the commands' stdout and stderr files are written (removed once read).
    dir: PathBuf,
    _child: Child,
}

/// The test process's server, started on first use; `None` when it is turned off or could not
/// be started (then every command starts fresh).
fn server() -> Option<&'static Server> {
    static SERVER: OnceLock<Option<Server>> = OnceLock::new();
    SERVER.get_or_init(start).as_ref()
}

fn start() -> Option<Server> {
    if std::env::var_os("TESSERA_FORK_SERVER").is_some_and(|v| v == "0") {
        return None;
    }
    let dir = crate::process_dir("fork-server");
    std::fs::create_dir_all(&dir).ok()?;
    let mut child = crate::tessera_command(&[FORK_SERVER_ARG], &crate::target_dir(), &[])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let requests = child.stdin.take()?;
    let replies = child.stdout.take()?;
    let waiting: Arc<Mutex<HashMap<u64, mpsc::Sender<Reply>>>> = Arc::default();
    let senders = Arc::clone(&waiting);
    std::thread::spawn(move || {
        for line in BufReader::new(replies).lines() {
            let Ok(line) = line else { break };
            let mut words = line.splitn(3, ' ');
            let (kind, id, rest) = (words.next(), words.next(), words.next().unwrap_or(""));
            let Some(id) = id.and_then(|id| id.parse::<u64>().ok()) else {
                continue;
            };
            let reply = match kind {
                Some("pid") => rest.parse().map(Reply::Pid).ok(),
                Some("exit") => rest.parse().map(Reply::Exit).ok(),
                Some("error") => Some(Reply::Error(rest.to_owned())),
                _ => None,
            };
            let senders = senders.lock().unwrap_or_else(|p| p.into_inner());
            if let (Some(reply), Some(sender)) = (reply, senders.get(&id)) {
                let _ = sender.send(reply);
            }
        }
        // The server ended: whoever waits is told.
        let mut senders = senders.lock().unwrap_or_else(|p| p.into_inner());
        for (_, sender) in senders.drain() {
            let _ = sender.send(Reply::Error("the fork server ended".to_owned()));
        }
    });
    Some(Server {
        requests: Mutex::new(requests),
        waiting,
        next: AtomicU64::new(1),
        dir,
        _child: child,
    })
}

/// The server's hidden argument (`tessera __fork-server`).
const FORK_SERVER_ARG: &str = "__fork-server";

/// Runs `tessera args...` as [`crate::tessera`] does, in a fork of the test process's server;
/// `None` when it must start fresh instead (a variable read at load time, the server off, or
/// the command refused before it started).
pub fn run(
    args: &[&str],
    cwd: &Path,
    env: &[(&str, &str)],
    command: &str,
    timeout: Duration,
) -> Option<Output> {
    if !env.iter().all(|(k, _)| read_at_run_time(k)) {
        return None;
    }
    let server = server()?;
    let id = server.next.fetch_add(1, Ordering::Relaxed);
    let stdout = server.dir.join(format!("{id}.stdout"));
    let stderr = server.dir.join(format!("{id}.stderr"));
    let (sender, replies) = mpsc::channel();
    let waiting = || server.waiting.lock().unwrap_or_else(|p| p.into_inner());
    waiting().insert(id, sender);
    // The replies about `id` are not waited for any more.
    let forget = || {
        waiting().remove(&id);
    };
    let request = json!({
        "id": id,
        "args": args,
        "cwd": cwd,
        "set": env,
        "stdout": stdout,
        "stderr": stderr,
    });
    let sent = {
        let mut requests = server.requests.lock().unwrap_or_else(|p| p.into_inner());
        writeln!(requests, "{request}").and_then(|()| requests.flush())
    };
    if sent.is_err() {
        forget();
        return None;
    }
    let started = Instant::now();
    let pid = match replies.recv_timeout(timeout) {
        Ok(Reply::Pid(pid)) => pid,
        Ok(Reply::Error(_)) => {
            forget();
            return None;
        }
        Ok(Reply::Exit(_)) => panic!("the fork server replied an end before a start: `{command}`"),
        Err(_) => panic!("the fork server did not start `{command}` within {timeout:?}"),
    };
    let left = timeout.saturating_sub(started.elapsed());
    let status = match replies.recv_timeout(left) {
        Ok(Reply::Exit(raw)) => ExitStatus::from_raw(raw),
        Ok(Reply::Error(e)) => panic!("`{command}` (pid {pid}): {e}"),
        Ok(Reply::Pid(_)) => panic!("the fork server replied two starts: `{command}`"),
        Err(_) => {
            // It may end by itself meanwhile: a failing `kill` is no error here.
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            let _ = replies.recv_timeout(Duration::from_secs(10));
            forget();
            let so_far = std::fs::read_to_string(&stderr).unwrap_or_default();
            panic!("`{command}` ran longer than {timeout:?}; killed. stderr so far:\n{so_far}");
        }
    };
    forget();
    let read = |path: &Path| {
        let bytes = std::fs::read(path).unwrap_or_default();
        let _ = std::fs::remove_file(path);
        String::from_utf8_lossy(&bytes).into_owned()
    };
    Some(Output {
        command: command.to_owned(),
        status,
        stdout: read(&stdout),
        stderr: read(&stderr),
    })
}
