//! Helpers for the workspace-level integration tests: they run the real `tessera` binary, with
//! the real plugins, on the real Fashion-MNIST data.
//!
//! The tests expect the whole workspace to be built first:
//!
//! ```text
//! cargo build --release --workspace && cargo test --release -p tessera-tests
//! ```
//!
//! and Fashion-MNIST to be cached (`tessera data fetch fashion-mnist`; `TESSERA_DATA` is
//! respected). Every training run writes into a fresh temporary folder; the binary is run
//! without `LD_LIBRARY_PATH`, so the tests also prove that its rpath finds libtorch.

use std::any::Any;
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use serde_json::Value;
use sha2::{Digest, Sha256};

pub mod dist;
pub mod export;
pub mod fork_server;
pub mod plugins;
mod python_worker;
pub mod resume;

/// The workspace version, which the host and both plugins share.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// How long one `tessera` command may run before the test kills it and fails: a hang guard,
/// far above the few seconds each run takes.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(300);

const BUILD_HINT: &str = "run `cargo build --release --workspace` first (the test script does)";

/// The cargo profile folder holding the binary and the plugins (`target/release`): the parent
/// of the `deps/` folder this test executable runs from.
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the path of the running test executable");
    exe.parent()
        .and_then(Path::parent)
        .unwrap_or_else(|| panic!("{} has no grandparent folder", exe.display()))
        .to_owned()
}

/// The built `tessera` binary; panics with a hint when it is missing.
pub fn tessera_bin() -> PathBuf {
    let path = target_dir().join("tessera");
    assert!(
        path.is_file(),
        "{} is missing: {BUILD_HINT}",
        path.display()
    );
    path
}

/// The built plugin library `lib<name>.so` in the target folder; panics with a hint when it is
/// missing.
pub fn plugin_path(name: &str) -> PathBuf {
    let path = target_dir().join(format!("lib{name}.so"));
    assert!(
        path.is_file(),
        "plugin {} is missing: {BUILD_HINT}",
        path.display()
    );
    path
}

/// `<target>/<prefix>-<pid>`, removed if it exists, for what one test process makes once and
/// keeps to its end (a `OnceLock`, never dropped, so never removed by the process itself). The
/// folders of earlier processes under `prefix` whose process has ended are removed here.
pub fn process_dir(prefix: &str) -> PathBuf {
    let root = target_dir();
    let own = std::process::id();
    for entry in std::fs::read_dir(&root).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let pid = name
            .strip_prefix(prefix)
            .and_then(|rest| rest.strip_prefix('-'))
            .and_then(|pid| pid.parse::<u32>().ok());
        if let Some(pid) = pid {
            if pid != own && !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    let dir = root.join(format!("{prefix}-{own}"));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// sha256 of a file, as 64 lower-case hex digits.
pub fn sha256_hex(path: &Path) -> String {
    let bytes =
        std::fs::read(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The dataset cache root the binary uses: `$TESSERA_DATA`, else
/// `$XDG_CACHE_HOME/tessera/data` (when absolute), else `~/.cache/tessera/data`.
pub fn data_root() -> PathBuf {
    let set = |key: &str| {
        std::env::var_os(key)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(root) = set("TESSERA_DATA") {
        return root;
    }
    if let Some(xdg) = set("XDG_CACHE_HOME").filter(|p| p.is_absolute()) {
        return xdg.join("tessera").join("data");
    }
    set("HOME")
        .unwrap_or_default()
        .join(".cache")
        .join("tessera")
        .join("data")
}

/// Panics with a hint unless Fashion-MNIST is cached and verified. Training configs written by
/// [`TrainerToml`] set `fetch = false`, so a test never downloads anything.
pub fn require_fashion_mnist() {
    let dir = data_root().join("fashion-mnist");
    assert!(
        dir.join("VERIFIED").is_file(),
        "Fashion-MNIST is not cached in {}: run `target/release/tessera data fetch fashion-mnist` \
         (it honours TESSERA_DATA) first",
        dir.display()
    );
}

/// Chance accuracy on Fashion-MNIST's 10 balanced classes.
pub const CHANCE_ACCURACY: f64 = 0.1;

/// Asserts that a finished run learned: its `final_accuracy` (on the 500 test images of
/// [`TrainerToml`]'s evaluation) is at least `min_accuracy`. Each caller picks the bound from
/// measured runs, far above what a run whose step does nothing reaches (about chance) and far
/// below what its real run reaches.
pub fn assert_learned(record: &Value, min_accuracy: f64) {
    assert!(
        min_accuracy >= 2.0 * CHANCE_ACCURACY,
        "a bound of {min_accuracy} does not tell learning from chance ({CHANCE_ACCURACY})"
    );
    let accuracy = record["final_accuracy"]
        .as_f64()
        .unwrap_or_else(|| panic!("no final_accuracy in {record:#}"));
    assert!(
        accuracy >= min_accuracy,
        "final accuracy {accuracy} after {} batches is below {min_accuracy}: the run did not \
         learn (chance is {CHANCE_ACCURACY})",
        record["batches"]
    );
}

/// Trains `toml` for `batches` batches in a fresh folder; returns its run.json after checking
/// that the run succeeded and trained that many batches.
pub fn train_batches(label: &str, mut toml: TrainerToml, batches: u64) -> Value {
    let dir = TempDir::new(label);
    toml.max_duration = format!("{batches}ba");
    toml.write_to(&dir);
    train(&dir, &[], &[]).assert_success();
    let record = read_json(&run_dir(&dir, &toml.run_name).join("run.json"));
    assert_eq!(record["batches"], batches, "{record:#}");
    record
}

/// A fresh temporary folder, removed when dropped — unless the test is failing, in which case
/// it is kept (and its path printed) for inspection.
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// Creates `<tmp>/tessera-tests-<pid>-<n>-<label>`.
    pub fn new(label: &str) -> TempDir {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("tessera-tests-{}-{n}-{label}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", path.display()));
        TempDir { path }
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `path/name`.
    pub fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// Writes `text` to `path/name` and returns that path.
    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("create the parent folder");
        }
        std::fs::write(&path, text)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        path
    }
}

/// A failed test keeps its folder for inspection; `TESSERA_TEST_KEEP=1` keeps every test's.
impl Drop for TempDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("test failed; kept {}", self.path.display());
        } else if std::env::var_os("TESSERA_TEST_KEEP").is_some() {
            eprintln!("TESSERA_TEST_KEEP: kept {}", self.path.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// A `trainer.toml` for a short Fashion-MNIST run, built as text so that tests know every line.
#[derive(Clone, Debug)]
pub struct TrainerToml {
    /// `run_name`; the run folder is `<toml folder>/runs/<run_name>`.
    pub run_name: String,
    /// `seed`.
    pub seed: u64,
    /// `[model]` body lines.
    pub model: String,
    /// `[optimizer]` body lines.
    pub optimizer: String,
    /// `train.max_duration`.
    pub max_duration: String,
    /// `train.device`, when set.
    pub device: Option<String>,
    /// `train.precision`, when set.
    pub precision: Option<String>,
    /// More `[train]` lines (`key = value`, one per line), when set.
    pub train: String,
    /// `[plugins] dirs`.
    pub plugin_dirs: Vec<PathBuf>,
    /// Each `[[algorithms]]` entry's body lines (`plugin = "..."` first).
    pub algorithms: Vec<String>,
    /// The `[data]` section (and its sub-tables), from `dataset = ...` on.
    pub data: String,
}

/// The `[data]` body of [`TrainerToml::new`]: Fashion-MNIST, batches of 64, one evaluation
/// batch of 500.
const FASHION_MNIST_DATA: &str = r#"dataset = "fashion-mnist"
fetch = false
batch_size = 64
eval_batch_size = 500
workers = 0

[data.transforms]
normalize = { mean = [0.2860], std = [0.3530] }"#;

/// The `[data]` body of [`TrainerToml::gpt`]: synthetic text (a seeded Markov chain over 64
/// tokens), batches of 8 sequences of 32 tokens.
pub const SYNTHETIC_TEXT_DATA: &str = r#"dataset = "synthetic-text"
batch_size = 8
eval_batch_size = 16
workers = 0

[data.text]
seq_len = 32
vocab_size = 64
tokens = 40000
eval_tokens = 4096"#;

/// The `[model]` body of [`TrainerToml::gpt`]: a 2-layer GPT-2 of width 32 and context 64.
pub const TINY_GPT: &str =
    "name = \"gpt2\"\nn_layer = 2\nn_head = 2\nn_embd = 32\nn_positions = 64";

impl TrainerToml {
    /// 3 batches of 8 sequences of 32 synthetic tokens for a tiny GPT-2 ([`TINY_GPT`]) with
    /// AdamW; plugins searched in the target folder; no algorithms.
    pub fn gpt(run_name: &str) -> TrainerToml {
        TrainerToml {
            model: TINY_GPT.to_owned(),
            optimizer: "name = \"adamw\"\nlr = 0.003".to_owned(),
            data: SYNTHETIC_TEXT_DATA.to_owned(),
            ..TrainerToml::new(run_name)
        }
    }

    /// 3 batches of 64 of a small CNN with SGD, evaluated on one batch of 500 at the end;
    /// plugins searched in the target folder; no algorithms.
    pub fn new(run_name: &str) -> TrainerToml {
        TrainerToml {
            run_name: run_name.to_owned(),
            seed: 7,
            model: "name = \"cnn\"\nwidth = 8".to_owned(),
            optimizer: "name = \"sgd\"\nlr = 0.05\nmomentum = 0.9".to_owned(),
            max_duration: "3ba".to_owned(),
            device: None,
            precision: None,
            train: String::new(),
            plugin_dirs: vec![target_dir()],
            algorithms: Vec::new(),
            data: FASHION_MNIST_DATA.to_owned(),
        }
    }

    /// A tiny GPT-2 (2 layers, 2 heads, 32 features, a context of 64) on `synthetic-text`
    /// sequences of 32 tokens from a vocabulary of 64 ([`text_data`]), batches of 8, AdamW at
    /// 3e-3, 3 batches; no algorithms.
    pub fn tiny_gpt(run_name: &str) -> TrainerToml {
        TrainerToml {
            data: text_data(32, None),
            ..TrainerToml::gpt(run_name)
        }
    }

    /// Adds an `[[algorithms]]` entry for `plugin` with extra body lines.
    pub fn algorithm(mut self, plugin: &str, settings: &str) -> TrainerToml {
        let mut body = format!("plugin = \"{plugin}\"");
        if !settings.is_empty() {
            body.push('\n');
            body.push_str(settings);
        }
        self.algorithms.push(body);
        self
    }

    /// Both real plugins, as in the example: label smoothing 0.1, one CutOut hole of 0.25.
    pub fn with_both_plugins(self) -> TrainerToml {
        self.algorithm("label_smoothing", "smoothing = 0.1")
            .algorithm("cutout", "num_holes = 1\nlength = 0.25")
    }

    /// The file's text.
    pub fn render(&self) -> String {
        let dirs: Vec<String> = self
            .plugin_dirs
            .iter()
            .map(|d| toml_string(&d.display().to_string()))
            .collect();
        let mut device = self
            .device
            .as_deref()
            .map(|d| format!("device = {}\n", toml_string(d)))
            .unwrap_or_default();
        if let Some(p) = &self.precision {
            device.push_str(&format!("precision = {}\n", toml_string(p)));
        }
        if !self.train.is_empty() {
            device.push_str(&self.train);
            device.push('\n');
        }
        // `train` may set the evaluation's interval itself.
        let eval_interval = if self
            .train
            .lines()
            .any(|l| l.trim_start().starts_with("eval_interval"))
        {
            ""
        } else {
            "eval_interval = \"1ep\"\n"
        };
        let mut text = format!(
            r#"# written by tessera-tests
run_name = "{run_name}"
seed = {seed}
output_dir = "runs"

[data]
{data}

[model]
{model}

[optimizer]
{optimizer}

[train]
max_duration = "{max_duration}"
{eval_interval}eval_subset_batches = 1
log_interval = "1ba"
progress = false
{device}
[plugins]
dirs = [{dirs}]
"#,
            run_name = self.run_name,
            seed = self.seed,
            model = self.model,
            optimizer = self.optimizer,
            max_duration = self.max_duration,
            dirs = dirs.join(", "),
            data = self.data,
        );
        for a in &self.algorithms {
            text.push_str("\n[[algorithms]]\n");
            text.push_str(a);
            text.push('\n');
        }
        text
    }

    /// Writes the file as `dir/trainer.toml` and returns its path.
    pub fn write_to(&self, dir: &TempDir) -> PathBuf {
        dir.write("trainer.toml", &self.render())
    }
}

/// A `[data]` section for [`TrainerToml::data`]: `synthetic-text` of 20000 training and 4000
/// evaluation tokens over a vocabulary of 64, sequences of `seq_len` tokens (`eval_seq_len` in
/// evaluation when given), batches of 8 (16 in evaluation).
pub fn text_data(seq_len: u32, eval_seq_len: Option<u32>) -> String {
    let eval = eval_seq_len
        .map(|n| format!("eval_seq_len = {n}\n"))
        .unwrap_or_default();
    format!(
        "dataset = \"synthetic-text\"
batch_size = 8
eval_batch_size = 16
workers = 0

[data.text]
seq_len = {seq_len}
{eval}vocab_size = 64
tokens = 20000
eval_tokens = 4000
"
    )
}

/// A `[data]` section for [`TrainerToml::data`] and the tests' own files: `samples` synthetic
/// 3x32x32 images of 10 classes (32 for evaluation), batches of 16 (32 in evaluation).
pub fn synthetic_rgb_data(samples: usize) -> String {
    format!(
        "dataset = \"synthetic\"
batch_size = 16
eval_batch_size = 32
workers = 0

[data.synthetic]
samples = {samples}
eval_samples = 32
channels = 3
height = 32
width = 32
classes = 10
"
    )
}

/// Whether the `trainer.toml` in `dir` trains on Fashion-MNIST (then it must be cached).
pub fn uses_fashion_mnist(dir: &TempDir) -> bool {
    std::fs::read_to_string(dir.join("trainer.toml"))
        .map(|t| t.contains("dataset = \"fashion-mnist\""))
        .unwrap_or(true)
}

/// A TOML basic string holding `s`.
pub fn toml_string(s: &str) -> String {
    serde_json::Value::String(s.to_owned()).to_string()
}

/// The 1-based number of the first line of `text` that contains `needle`.
pub fn line_of(text: &str, needle: &str) -> usize {
    text.lines()
        .position(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("no line contains {needle:?} in:\n{text}"))
        + 1
}

/// What a `tessera` command did.
#[derive(Debug)]
pub struct Output {
    /// The command line, for messages.
    pub command: String,
    /// Exit status.
    pub status: ExitStatus,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl Output {
    /// The whole output, for assertion messages.
    pub fn dump(&self) -> String {
        format!(
            "$ {}\n{}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.command, self.status, self.stdout, self.stderr
        )
    }

    /// Panics unless the command exited with 0.
    pub fn assert_success(&self) -> &Output {
        assert!(self.status.success(), "expected success:\n{}", self.dump());
        self
    }

    /// Panics unless the command failed with exit code 1 and its stderr has every fragment.
    /// Returns the stderr's `error:` line.
    pub fn assert_failure(&self, fragments: &[&str]) -> String {
        assert_eq!(
            self.status.code(),
            Some(1),
            "expected exit code 1:\n{}",
            self.dump()
        );
        let line = self
            .stderr
            .lines()
            .find(|l| l.starts_with("error: "))
            .unwrap_or_else(|| panic!("no `error: ` line in stderr:\n{}", self.dump()))
            .to_owned();
        for f in fragments {
            assert!(
                line.contains(f),
                "the error line lacks {f:?}:\n{line}\n\n{}",
                self.dump()
            );
        }
        assert!(
            !self.stderr.contains("panicked"),
            "tessera panicked:\n{}",
            self.dump()
        );
        line
    }
}

/// The user's plugin folder the tests' `tessera` sees unless a test sets `XDG_DATA_HOME`: a
/// folder that does not exist, so plugins a developer installed never leak into a test.
pub fn no_user_data() -> PathBuf {
    std::env::temp_dir().join("tessera-tests-no-user-data")
}

/// The `tessera args...` command in `cwd` with `env` added and piped output, without
/// `LD_LIBRARY_PATH` (the binary's rpath must find libtorch), `TESSERA_PLUGIN_PATH`, the fake
/// plugin's variables and the checkpoint-write pause unless given, and with the user's plugin
/// folder at [`no_user_data`].
pub fn tessera_command(args: &[&str], cwd: &Path, env: &[(&str, &str)]) -> Command {
    program_command(&tessera_bin(), args, cwd, env)
}

/// [`tessera_command`] for another program (an installed `tessera`, its launcher).
pub fn program_command(program: &Path, args: &[&str], cwd: &Path, env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .current_dir(cwd)
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("TESSERA_PLUGIN_PATH")
        .env("XDG_DATA_HOME", no_user_data())
        .env_remove("TESSERA_FAKE_API_VERSION")
        .env_remove("TESSERA_FAKE_LIBTORCH_VERSION")
        .env_remove("TESSERA_FAKE_SLEEP_MS")
        .env_remove("TESSERA_FAKE_NAN_AT_BATCH")
        .env_remove("TESSERA_LOG")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

/// Runs `tessera args...` in `cwd` with `env` added, without `LD_LIBRARY_PATH` (the binary's
/// rpath must find libtorch), `TESSERA_PLUGIN_PATH` and the fake plugin's variables unless
/// given, and kills it after [`COMMAND_TIMEOUT`]. The process is a fork of a `tessera` started
/// once for the test process, when `env` allows (see `fork_server.rs`); it runs the command
/// from `main` as a fresh one would.
pub fn tessera(args: &[&str], cwd: &Path, env: &[(&str, &str)]) -> Output {
    let command = format!("tessera {}", args.join(" "));
    if let Some(output) = fork_server::run(args, cwd, env, &command, COMMAND_TIMEOUT) {
        return output;
    }
    run_with_timeout(tessera_command(args, cwd, env), &command, COMMAND_TIMEOUT)
}

/// Runs `cmd` (its output piped) to its end and returns its output; a command still running
/// after `timeout` is killed and the test fails, naming `command` and showing its stderr so far.
pub fn run_with_timeout(cmd: Command, command: &str, timeout: Duration) -> Output {
    try_run_with_timeout(cmd, command, timeout)
        .unwrap_or_else(|e| panic!("cannot run `{command}`: {e}"))
}

/// [`run_with_timeout`], except that a program that cannot be started (not installed) is an
/// error for the caller to handle rather than a failure.
pub fn try_run_with_timeout(
    mut cmd: Command,
    command: &str,
    timeout: Duration,
) -> std::io::Result<Output> {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    Ok(wait_with_timeout(child, command, timeout))
}

/// Waits for a started `child` (its stdout and stderr piped, or not captured) and returns its
/// output; a child still running after `timeout` is killed and the test fails, naming
/// `command` and showing its stderr so far. The output is read to its end within the same
/// time: a process the child started that keeps its pipes open fails the test too.
pub fn wait_with_timeout(mut child: Child, command: &str, timeout: Duration) -> Output {
    // Reads a pipe to its end on a thread; sends what it held (nothing, without a pipe).
    fn reader(pipe: Option<impl Read + Send + 'static>) -> mpsc::Receiver<String> {
        let (sender, receiver) = mpsc::channel();
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            let _ = sender.send(String::from_utf8_lossy(&bytes).into_owned());
        });
        receiver
    }
    let stdout = reader(child.stdout.take());
    let stderr = reader(child.stderr.take());
    let started = Instant::now();
    // What a pipe held, waiting at most `wait` for its end.
    let drain = |pipe: &mpsc::Receiver<String>, wait: Duration| pipe.recv_timeout(wait).ok();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the command") {
            break status;
        }
        if started.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            // A process it started may still hold the pipe: show what came within a while.
            let so_far = drain(&stderr, Duration::from_secs(10)).unwrap_or_else(|| {
                "(unavailable: a process it started still holds its stderr)".to_owned()
            });
            panic!("`{command}` ran longer than {timeout:?}; killed. stderr so far:\n{so_far}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // The pipes end when the child and whatever it started have closed them: within what is
    // left of the timeout, and at least 10 s (the timeout itself when shorter).
    let left = timeout
        .saturating_sub(started.elapsed())
        .max(timeout.min(Duration::from_secs(10)));
    let deadline = Instant::now() + left;
    let stderr = drain(&stderr, left);
    let stdout = drain(&stdout, deadline.saturating_duration_since(Instant::now()));
    let (Some(stdout), Some(stderr)) = (stdout, stderr) else {
        panic!(
            "`{command}` exited ({status}) but a process it started still held its output \
             {left:?} later"
        );
    };
    Output {
        command: command.to_owned(),
        status,
        stdout,
        stderr,
    }
}

/// How long a cargo build or test of a crate outside the workspace may take (it shares the
/// workspace's target folder, so libtorch's bindings are not rebuilt).
pub const CARGO_TIMEOUT: Duration = Duration::from_secs(600);

/// How long one Python script (loading PyTorch, transformers or MLflow) may take.
pub const PYTHON_TIMEOUT: Duration = Duration::from_secs(300);

/// How long one headless Chromium command (a screenshot, the DOM) may take.
pub const BROWSER_TIMEOUT: Duration = Duration::from_secs(120);

/// How long a small system tool (`kill`, `mkfifo`, `gzip` of a data file, `ldconfig -p`) may
/// take.
pub const TOOL_TIMEOUT: Duration = Duration::from_secs(120);

/// Runs a small system tool (`kill`, `mkfifo`, `gzip`) with `args` and panics unless it
/// succeeds within [`TOOL_TIMEOUT`].
pub fn tool(program: &str, args: &[&str]) -> Output {
    let mut cmd = Command::new(program);
    cmd.args(args);
    let out = run_with_timeout(cmd, &format!("{program} {}", args.join(" ")), TOOL_TIMEOUT);
    out.assert_success();
    out
}

/// Sends `signal` (`-TERM`, `-KILL`, `-STOP`, ...) to process `pid` with `kill`; panics when
/// that fails.
pub fn kill(signal: &str, pid: u32) {
    tool("kill", &[signal, &pid.to_string()]);
}

/// `tessera train <dir>/trainer.toml --set ...` in `dir`.
pub fn train(dir: &TempDir, overrides: &[&str], env: &[(&str, &str)]) -> Output {
    if uses_fashion_mnist(dir) {
        require_fashion_mnist();
    }
    let config = dir.join("trainer.toml");
    let config = config.to_str().expect("a UTF-8 temp path");
    let mut args = vec!["train", config];
    for o in overrides {
        args.push("--set");
        args.push(o);
    }
    tessera(&args, dir.path(), env)
}

/// Every `.rs` file under `dir`, recursively; panics naming a folder that cannot be listed.
pub fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let entries =
        std::fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("a folder entry").path();
        if path.is_dir() {
            out.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out
}

/// The run folder of run `run_name` whose trainer.toml is in `dir`.
pub fn run_dir(dir: &TempDir, run_name: &str) -> PathBuf {
    dir.join("runs").join(run_name)
}

/// Parses a JSON file.
pub fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

/// Parses a JSON-lines file, one value per non-empty line.
pub fn read_jsonl(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str(l).unwrap_or_else(|e| {
                panic!("{} line {} is not JSON: {e}: {l}", path.display(), i + 1)
            })
        })
        .collect()
}

/// Copies a real system shared library that is certainly not a Tessera plugin (libz, liblzma,
/// ...) to `dest`. Found through `ldconfig -p`, then in the usual library folders.
pub fn copy_foreign_shared_library(dest: &Path) {
    const NAMES: [&str; 5] = [
        "libz.so.1",
        "liblzma.so.5",
        "libbz2.so.1.0",
        "libzstd.so.1",
        "libexpat.so.1",
    ];
    let mut candidates: Vec<PathBuf> = Vec::new();
    for ldconfig in ["ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig"] {
        let mut cmd = Command::new(ldconfig);
        cmd.arg("-p");
        if let Ok(out) = try_run_with_timeout(cmd, &format!("{ldconfig} -p"), TOOL_TIMEOUT) {
            let text = out.stdout;
            for name in NAMES {
                for line in text.lines() {
                    let line = line.trim();
                    if line.starts_with(&format!("{name} "))
                        && (!cfg!(target_arch = "x86_64") || line.contains("x86-64"))
                    {
                        if let Some((_, path)) = line.split_once("=> ") {
                            candidates.push(PathBuf::from(path.trim()));
                        }
                    }
                }
            }
            break;
        }
    }
    for dir in [
        "/lib/x86_64-linux-gnu",
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib64",
        "/lib64",
        "/usr/lib",
    ] {
        candidates.extend(NAMES.iter().map(|n| Path::new(dir).join(n)));
    }
    let source = candidates
        .into_iter()
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("no system shared library among {NAMES:?} to copy"));
    std::fs::copy(&source, dest).unwrap_or_else(|e| {
        panic!(
            "cannot copy {} to {}: {e}",
            source.display(),
            dest.display()
        )
    });
}

/// The `LIBTORCH` the workspace was built with; panics with a hint when it is not set.
pub fn libtorch() -> String {
    std::env::var("LIBTORCH")
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| {
            panic!(
                "LIBTORCH is not set: this test builds a plugin crate against the workspace's \
                 libtorch; run the suite with scripts/test.sh (it exports LIBTORCH)"
            )
        })
}

/// What a successful `cargo` command printed.
pub struct CargoOutput {
    /// Standard output (test results).
    pub stdout: String,
    /// Standard error (cargo's progress lines).
    pub stderr: String,
}

/// `cargo <args>` in `dir` with `env` added, sharing the workspace's target folder, so that a
/// crate built outside the workspace reuses its build of libtorch's bindings (torch-sys, tch),
/// and with the workspace's [`libtorch`]. Panics with the output on failure, or when it runs
/// longer than [`CARGO_TIMEOUT`].
pub fn cargo(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> CargoOutput {
    let out = run_with_timeout(
        cargo_command(dir, args, env),
        &format!("cargo {} (in {})", args.join(" "), dir.display()),
        CARGO_TIMEOUT,
    );
    assert!(out.status.success(), "{}", out.dump());
    CargoOutput {
        stdout: out.stdout,
        stderr: out.stderr,
    }
}

/// The workspace's cargo target folder (the parent of [`target_dir`]): a crate built outside
/// the workspace with `CARGO_TARGET_DIR` set to it reuses the workspace's build of libtorch's
/// bindings.
pub fn workspace_target_dir() -> PathBuf {
    target_dir()
        .parent()
        .expect("target/release has a parent")
        .to_owned()
}

/// Removes what building the outside crate `name` left in [`target_dir`], so that the tests
/// listing the plugins there do not see it.
pub fn remove_built_plugin(name: &str) {
    for ext in ["so", "rlib", "d"] {
        let _ = std::fs::remove_file(target_dir().join(format!("lib{name}.{ext}")));
    }
}

/// The command [`cargo`] runs, for a test that expects it to fail (run it with
/// [`run_with_timeout`] and [`CARGO_TIMEOUT`]).
pub fn cargo_command(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Command {
    let workspace_target = workspace_target_dir();
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.args(args)
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", &workspace_target)
        .env("LIBTORCH", libtorch());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

/// The `kind == "eval"` / `"train"` / `"method"` lines of a metrics file.
pub fn lines_of_kind<'a>(lines: &'a [Value], kind: &str) -> Vec<&'a Value> {
    lines.iter().filter(|l| l["kind"] == kind).collect()
}

/// `(batch, value)` of every method metric `name` in a metrics file's lines, in order.
pub fn method_metric(lines: &[Value], name: &str) -> Vec<(u64, f64)> {
    lines_of_kind(lines, "method")
        .iter()
        .filter(|l| l["name"] == name)
        .map(|l| {
            (
                l["batch"].as_u64().expect("batch"),
                l["value"].as_f64().expect("value"),
            )
        })
        .collect()
}

/// The training loss of every `train` line of a metrics file, in order.
pub fn train_losses(lines: &[Value]) -> Vec<f64> {
    lines_of_kind(lines, "train")
        .iter()
        .map(|l| l["data"]["loss"].as_f64().expect("loss"))
        .collect()
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_owned()
}

/// `PYTHONPATH` for the torch wheel (and torchvision beside it): `$TESSERA_TORCH_PYTHONPATH`
/// (`scripts/test.sh` sets it to both), else the folder holding libtorch (the wheel's `torch/`).
pub fn torch_pythonpath() -> PathBuf {
    if let Some(dir) = std::env::var_os("TESSERA_TORCH_PYTHONPATH").filter(|v| !v.is_empty()) {
        return PathBuf::from(dir);
    }
    let libtorch = std::env::var_os("LIBTORCH")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let cache = std::env::var_os("TESSERA_CACHE")
                .map(PathBuf::from)
                .unwrap_or_else(|| {
                    std::env::var_os("HOME")
                        .map(PathBuf::from)
                        .unwrap_or_default()
                        .join(".cache")
                        .join("tessera")
                });
            cache.join("torch-2.13.0").join("torch")
        });
    libtorch.parent().map(Path::to_owned).unwrap_or(libtorch)
}

/// Runs `$PYTHON` (default `python3`) with `args` in the repository root, with
/// [`torch_pythonpath`] as `PYTHONPATH`; `Err` when Python cannot be started. A script still
/// running after [`PYTHON_TIMEOUT`] is killed and fails the test. A script (or `-c` code) runs
/// in an interpreter that has imported torch already and ran the test process's earlier
/// scripts (`tests/support/python_worker.py`; `TESSERA_PYTHON_WORKER=0` starts a fresh one
/// each time).
pub fn python(args: &[&str]) -> Result<std::process::Output, String> {
    python_with_env(args, &[])
}

/// [`python`] with `env` added.
pub fn python_with_env(
    args: &[&str],
    env: &[(&str, &str)],
) -> Result<std::process::Output, String> {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let command = format!("{python} {}", args.join(" "));
    // With the torch PYTHONPATH, an interpreter that has imported torch already runs it
    // (tests/common/python_worker.rs).
    let torch_path = torch_pythonpath().display().to_string();
    let torch_only = env
        .iter()
        .all(|(k, v)| *k != "PYTHONPATH" || *v == torch_path);
    let rest: Vec<(&str, &str)> = env
        .iter()
        .copied()
        .filter(|(k, _)| *k != "PYTHONPATH")
        .collect();
    if torch_only && python_worker::eligible(args, &rest) {
        if let Some(reply) = python_worker::run(&python, args, &rest, &command, PYTHON_TIMEOUT) {
            return Ok(std::process::Output {
                status: reply.status,
                stdout: reply.stdout.into_bytes(),
                stderr: reply.stderr.into_bytes(),
            });
        }
    }
    python_fresh(&python, args, env, &command)
}

/// `python args` in a fresh interpreter, in the repository root, with the torch `PYTHONPATH`
/// and then `env`; what [`python_with_env`] runs when the worker cannot.
fn python_fresh(
    python: &str,
    args: &[&str],
    env: &[(&str, &str)],
    command: &str,
) -> Result<std::process::Output, String> {
    let mut cmd = Command::new(python);
    cmd.args(args)
        .current_dir(repo_root())
        .env("PYTHONPATH", torch_pythonpath())
        .env("PYTHONWARNINGS", "ignore");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = try_run_with_timeout(cmd, command, PYTHON_TIMEOUT)
        .map_err(|e| format!("cannot run {python}: {e}"))?;
    Ok(std::process::Output {
        status: out.status,
        stdout: out.stdout.into_bytes(),
        stderr: out.stderr.into_bytes(),
    })
}

/// The value `key` names, made by `make` once for every test that asks while one holds it:
/// tests that check different things of one expensive run (a ResNet-50 with every plugin,
/// trained and exported) share it instead of each training it. The value is dropped (its
/// temporary folders removed) when the last test holding it lets go; a test asking after that
/// makes it again. A panic in `make` fails the asking test; the next one tries again.
pub fn shared<T: Send + Sync + 'static>(key: &str, make: impl FnOnce() -> T) -> Arc<T> {
    type Slot = Arc<Mutex<Option<Weak<dyn Any + Send + Sync>>>>;
    static SLOTS: Mutex<BTreeMap<String, Slot>> = Mutex::new(BTreeMap::new());
    let slot = SLOTS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .entry(key.to_owned())
        .or_default()
        .clone();
    let mut held = slot.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(value) = held.as_ref().and_then(Weak::upgrade) {
        return value
            .downcast::<T>()
            .unwrap_or_else(|_| panic!("shared value `{key}` asked for as two types"));
    }
    let value = Arc::new(make());
    let any: Arc<dyn Any + Send + Sync> = value.clone();
    *held = Some(Arc::downgrade(&any));
    value
}

/// Whether `python -c "import <modules>"` works with `pythonpath` (`"streaming, webdataset"`
/// imports both): `Ok`, or why not. Asked once per test process for each folder and modules:
/// importing torch costs about 2 s of CPU, streaming or transformers 3–4 s, and a test binary asks
/// dozens of times; the answer cannot change while the tests run.
pub fn python_imports(pythonpath: &str, modules: &str) -> Result<(), String> {
    static ANSWERS: Mutex<BTreeMap<(String, String), Result<(), String>>> =
        Mutex::new(BTreeMap::new());
    let mut answers = ANSWERS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    answers
        .entry((pythonpath.to_owned(), modules.to_owned()))
        .or_insert_with(|| {
            let import = format!("import {modules}");
            match python_with_env(&["-c", &import], &[("PYTHONPATH", pythonpath)]) {
                Ok(out) if out.status.success() => Ok(()),
                Ok(out) => {
                    let stderr = String::from_utf8_lossy(&out.stderr);
                    let last = stderr.lines().last().unwrap_or("").trim().to_owned();
                    Err(format!("{}: {last}", out.status))
                }
                Err(e) => Err(e),
            }
        })
        .clone()
}

/// [`python_imports`] with [`torch_pythonpath`].
fn torch_imports(modules: &str) -> Result<(), String> {
    python_imports(&torch_pythonpath().display().to_string(), modules)
}

/// Whether `import <module>` works (`torch`, `torchvision`); prints a notice that the
/// comparison `what` is skipped when it does not, or fails with TESSERA_REQUIRE_PYTORCH=1 (as
/// `scripts/test.sh`, what CI runs, sets).
pub fn python_can_import(module: &str, what: &str) -> bool {
    let Err(why) = torch_imports(module) else {
        return true;
    };
    let notice = format!(
        "NOTICE: skipping the PyTorch comparison of {what}: `import {module}` failed with \
         PYTHONPATH={} ({why})",
        torch_pythonpath().display()
    );
    if std::env::var_os("TESSERA_REQUIRE_PYTORCH").is_some_and(|v| v == "1") {
        panic!("{notice} and TESSERA_REQUIRE_PYTORCH=1");
    }
    eprintln!("{notice}");
    false
}

/// Whether `import transformers` works; a notice when not, a failure when
/// `TESSERA_REQUIRE_TRANSFORMERS=1`.
pub fn transformers_imports() -> bool {
    let required = std::env::var_os("TESSERA_REQUIRE_TRANSFORMERS").is_some_and(|v| v == "1");
    let Err(why) = torch_imports("transformers") else {
        return true;
    };
    let notice = format!(
        "NOTICE: skipping the comparison with Hugging Face's GPT2LMHeadModel: `import \
         transformers` failed with PYTHONPATH={} ({why}; scripts/ensure-transformers.sh \
         installs it)",
        torch_pythonpath().display()
    );
    assert!(!required, "{notice} and TESSERA_REQUIRE_TRANSFORMERS=1");
    eprintln!("{notice}");
    false
}

/// `n` documents of pseudo-random sentences over a small vocabulary (a fixed LCG, so every run
/// writes the same text), each about 2 KB.
pub fn word_documents(n: usize) -> Vec<String> {
    const WORDS: [&str; 24] = [
        "the", "river", "runs", "to", "sea", "and", "a", "boat", "sails", "under", "grey", "sky",
        "while", "gulls", "call", "over", "old", "harbour", "wall", "at", "dawn", "light", "falls",
        "softly",
    ];
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    (0..n)
        .map(|i| {
            let mut text = format!("Document {i}.");
            for w in 0..400 {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                let word = WORDS[(state >> 33) as usize % WORDS.len()];
                text.push_str(if w % 12 == 0 { ". " } else { " " });
                text.push_str(word);
            }
            text
        })
        .collect()
}

/// `tessera data pack SRC DST ARGS...` run in `dir`, which must succeed; its output.
pub fn pack(dir: &TempDir, src: &Path, dst: &Path, args: &[&str]) -> Output {
    let (src, dst) = (
        src.to_str().expect("a UTF-8 path"),
        dst.to_str().expect("a UTF-8 path"),
    );
    let mut all = vec!["data", "pack", src, dst];
    all.extend_from_slice(args);
    let out = tessera(&all, dir.path(), &[]);
    out.assert_success();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Command {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", script]);
        cmd
    }

    #[test]
    fn a_command_returns_its_output() {
        let out = run_with_timeout(sh("echo out; echo err >&2"), "sh", TOOL_TIMEOUT);
        out.assert_success();
        assert_eq!(
            (out.stdout.as_str(), out.stderr.as_str()),
            ("out\n", "err\n")
        );
    }

    #[test]
    #[should_panic(expected = "`sleep 20` ran longer than 1s; killed. stderr so far:\nstarted")]
    fn a_command_past_its_timeout_is_killed_and_named() {
        run_with_timeout(
            sh("echo started >&2; exec sleep 20"),
            "sleep 20",
            Duration::from_secs(1),
        );
    }

    #[test]
    #[should_panic(expected = "`sh` exited (exit status: 0) but a process it started still held")]
    fn output_held_open_by_a_process_it_started_fails_too() {
        run_with_timeout(sh("sleep 20 & exit 0"), "sh", Duration::from_secs(1));
    }

    #[test]
    fn a_missing_program_is_an_error_for_the_caller() {
        let missing = Command::new("/nonexistent/tessera-tests-program");
        assert!(try_run_with_timeout(missing, "missing", TOOL_TIMEOUT).is_err());
    }
}
