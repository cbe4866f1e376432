//! Python interpreters kept running for the whole test process (`tests/support/python_worker.py`),
//! each running the reference scripts sent to it one after another. A fresh `python3` imports
//! torch (about 2 s of CPU) and transformers' models (4–5 s) again for every script, which was
//! most of what the scripts cost: the models binary started 55 of them for 180 s of CPU.
//!
//! [`crate::python`] sends a command here when it would run with the torch `PYTHONPATH` and at
//! most `TESSERA_*` variables besides, which the scripts read when they run (variables that
//! Python, torch or OpenMP read at start-up would come too late in a running interpreter). A
//! worker is taken from the idle ones (or started), used by one test at a time and put back;
//! tests on two threads use two. `TESSERA_PYTHON_WORKER=0` runs every command in a fresh
//! interpreter instead. A script that kills its interpreter (a crash, an `os._exit`) is run
//! again in a fresh one, whose output then tells what happened.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::Mutex;
use std::time::Duration;

use serde_json::{json, Value};

/// Scripts that run in a fresh interpreter: `torch.jit.script` names the classes it compiles
/// by their Python name, and a second model class of the same name in one process would be
/// saved under a mangled one.
const FRESH_ONLY: &[&str] = &["scripts/make_torchscript_model.py"];

/// One running worker: its stdin, and its reply lines read on a thread (`None` at its end).
struct Worker {
    child: Child,
    stdin: ChildStdin,
    replies: mpsc::Receiver<Option<String>>,
}

static IDLE: Mutex<Vec<Worker>> = Mutex::new(Vec::new());

/// What a script printed and how it ended, as a fresh `python3` would have.
pub struct Reply {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// Whether `args` (a `python3` command line, without the interpreter) may run in a worker with
/// `env` set (besides the torch `PYTHONPATH`, which the caller checked).
pub fn eligible(args: &[&str], env: &[(&str, &str)]) -> bool {
    std::env::var_os("TESSERA_PYTHON_WORKER").is_none_or(|v| v != "0")
        && env.iter().all(|(k, _)| k.starts_with("TESSERA_"))
        && match args.first() {
            Some(&"-c") => args.len() >= 2,
            Some(first) => first.ends_with(".py") && !FRESH_ONLY.contains(first),
            None => false,
        }
}

fn start(python: &str) -> Option<Worker> {
    let mut child = Command::new(python)
        .arg("tests/support/python_worker.py")
        .current_dir(crate::repo_root())
        .env("PYTHONPATH", crate::torch_pythonpath())
        .env("PYTHONWARNINGS", "ignore")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let stdin = child.stdin.take()?;
    let stdout = child.stdout.take()?;
    let (sender, replies) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        loop {
            let line = lines.next().and_then(Result::ok);
            let end = line.is_none();
            if sender.send(line).is_err() || end {
                break;
            }
        }
    });
    Some(Worker {
        child,
        stdin,
        replies,
    })
}

/// Runs `args` with `env` in an idle worker (started when none is idle). `None` when no worker
/// could run it to its end (Python missing, the interpreter died): the caller runs a fresh one.
/// A script still running after `timeout` fails the test, as [`crate::wait_with_timeout`] does.
pub fn run(
    python: &str,
    args: &[&str],
    env: &[(&str, &str)],
    command: &str,
    timeout: Duration,
) -> Option<Reply> {
    let idle = IDLE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .pop();
    let mut worker = match idle {
        Some(w) => w,
        None => start(python)?,
    };
    let env: serde_json::Map<String, Value> = env
        .iter()
        .map(|(k, v)| ((*k).to_owned(), Value::from(*v)))
        .collect();
    let request = json!({ "argv": args, "env": env }).to_string();
    if writeln!(worker.stdin, "{request}")
        .and_then(|()| worker.stdin.flush())
        .is_err()
    {
        let _ = worker.child.kill();
        let _ = worker.child.wait();
        return None;
    }
    let line = match worker.replies.recv_timeout(timeout) {
        Ok(Some(line)) => line,
        Ok(None) | Err(mpsc::RecvTimeoutError::Disconnected) => {
            let _ = worker.child.wait();
            return None;
        }
        Err(mpsc::RecvTimeoutError::Timeout) => {
            let _ = worker.child.kill();
            let _ = worker.child.wait();
            panic!("`{command}` ran longer than {timeout:?} in the Python worker; killed");
        }
    };
    let reply: Value = serde_json::from_str(&line)
        .unwrap_or_else(|e| panic!("the Python worker's reply to `{command}`: {e}: {line}"));
    let text = |key: &str| reply[key].as_str().unwrap_or_default().to_owned();
    let code = reply["code"].as_i64().unwrap_or(1) as i32;
    let out = Reply {
        status: ExitStatus::from_raw((code & 0xff) << 8),
        stdout: text("stdout"),
        stderr: text("stderr"),
    };
    IDLE.lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .push(worker);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `python3 ARGS` in a fresh interpreter, as `python_with_env` runs what the worker cannot.
    fn fresh(args: &[&str], env: &[(&str, &str)]) -> Reply {
        let out = crate::python_fresh("python3", args, env, "python3").expect("python3 starts");
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        Reply {
            status: out.status,
            stdout: text(&out.stdout),
            stderr: text(&out.stderr),
        }
    }

    fn in_worker(args: &[&str], env: &[(&str, &str)]) -> Reply {
        run(
            "python3",
            args,
            env,
            "python3 (worker)",
            crate::PYTHON_TIMEOUT,
        )
        .expect("the worker runs it")
    }

    const SCRIPT: &str = "import os, sys\n\
        print(sys.argv[1:], os.environ.get('TESSERA_WORKER_TEST'), repr(sys.stdin.read()))\n\
        os.environ['TESSERA_LEFT_BEHIND'] = '1'\n\
        sys.path.insert(0, '/nonexistent')\n\
        os.chdir('/')\n\
        sys.stderr.write('to stderr\\n')\n\
        if sys.argv[1] == 'raise':\n    raise ValueError('a script error')\n\
        sys.exit(int(sys.argv[1]))";

    #[test]
    fn a_command_in_the_worker_ends_as_in_a_fresh_interpreter() {
        for arg in ["0", "3", "raise"] {
            let env = [("TESSERA_WORKER_TEST", arg)];
            let (w, f) = (
                in_worker(&["-c", SCRIPT, arg], &env),
                fresh(&["-c", SCRIPT, arg], &env),
            );
            assert_eq!(w.status.code(), f.status.code(), "{arg}: {}", w.stderr);
            assert_eq!(w.stdout, f.stdout, "{arg}");
            let last = |s: &str| s.trim_end().lines().last().unwrap_or("").to_owned();
            assert_eq!(last(&w.stderr), last(&f.stderr), "{arg}: {}", w.stderr);
            // What the command changed is put back for the next one.
            let after = in_worker(
                &[
                    "-c",
                    "import os, sys; print(os.environ.get('TESSERA_LEFT_BEHIND'), \
                     os.environ.get('TESSERA_WORKER_TEST'), '/nonexistent' in sys.path, \
                     os.getcwd() == os.environ['TESSERA_ROOT'])",
                ],
                &[("TESSERA_ROOT", &crate::repo_root().display().to_string())],
            );
            assert_eq!(after.stdout, "None None False True\n", "{}", after.stderr);
        }
    }

    #[test]
    fn a_script_runs_as_its_file_with_its_folder_first_on_the_path() {
        let dir = crate::TempDir::new("worker-script");
        dir.write("helper.py", "VALUE = 'from the folder'\n");
        let script = dir.join("main.py");
        std::fs::write(
            &script,
            "import os, sys, helper\n\
             print(__name__, os.path.isabs(__file__), sys.argv[1:], helper.VALUE)\n",
        )
        .expect("write main.py");
        let path = script.display().to_string();
        let (w, f) = (in_worker(&[&path, "x"], &[]), fresh(&[&path, "x"], &[]));
        assert_eq!(
            w.stdout, "__main__ True ['x'] from the folder\n",
            "{}",
            w.stderr
        );
        assert_eq!(w.stdout, f.stdout);
        assert!(eligible(&[&path], &[]) && !eligible(&[&path], &[("PATH", "/bin")]));
        assert!(!eligible(&["scripts/make_torchscript_model.py"], &[]));
    }
}
