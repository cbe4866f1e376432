//! Experiment tracking in a real MLflow server (`[logging] mlflow`): a server from PyPI
//! (`scripts/ensure-mlflow.sh`, on `TESSERA_MLFLOW_PYTHONPATH`) started on the loopback address,
//! a short Fashion-MNIST run with a plugin logged to it and read back through its REST API and
//! `tracking::mlflow::fetch_runs`, a resumed run continuing its MLflow run, a run that trains to
//! its end while the server is paused and delivers everything once it answers again; and,
//! without MLflow, a server that is down or never answers: the run completes, stops waiting for
//! the server after `flush_timeout`, and says what was not delivered.
//!
//! Without MLflow the server tests are skipped with a notice, unless `TESSERA_REQUIRE_MLFLOW=1`
//! (`scripts/test.sh` sets it) makes that a failure.

use std::collections::BTreeMap;
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tessera::tracking::mlflow::fetch_runs;
use tessera_tests::resume::wait_for;
use tessera_tests::{
    plugin_path, python_imports, read_json, read_jsonl, run_dir, run_with_timeout, sha256_hex,
    tessera, tessera_command, train, try_run_with_timeout, TempDir, TrainerToml, COMMAND_TIMEOUT,
    TOOL_TIMEOUT,
};

/// How long the MLflow server may take to answer `/health` (it imports a lot; generous for a
/// loaded 2-core machine).
const SERVER_START_TIMEOUT: Duration = Duration::from_secs(240);

/// An MLflow server on a free loopback port with its database and artifacts in a temporary
/// folder; its process group is stopped when dropped, even when the test panics.
struct MlflowServer {
    child: Child,
    uri: String,
    dir: TempDir,
}

impl MlflowServer {
    /// Starts a server, or `None` (with a notice) when MLflow is not installed.
    fn start() -> Option<MlflowServer> {
        let pythonpath = mlflow_pythonpath()?;
        let dir = TempDir::new("mlflow-server");
        let port = free_port();
        let log = std::fs::File::create(dir.join("server.log")).expect("create the server log");
        let mut command = Command::new(std::env::var("PYTHON").unwrap_or("python3".into()));
        command
            .args([
                "-m",
                "mlflow",
                "server",
                "--host",
                "127.0.0.1",
                "--workers",
                "1",
            ])
            .args(["--port", &port.to_string()])
            .arg("--backend-store-uri")
            .arg(format!("sqlite:///{}", dir.join("mlflow.db").display()))
            .arg("--artifacts-destination")
            .arg(dir.join("artifacts"))
            .env("PYTHONPATH", pythonpath)
            .env("PYTHONWARNINGS", "ignore")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("the server log"))
            .stderr(log);
        // Its own process group: the server's workers are stopped with it.
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let child = command.spawn().expect("start `python3 -m mlflow server`");
        let mut server = MlflowServer {
            child,
            uri: format!("http://127.0.0.1:{port}"),
            dir,
        };
        server.wait_until_healthy();
        Some(server)
    }

    /// Waits (at most [`SERVER_START_TIMEOUT`]) until the server answers `/health`; fails with
    /// its log when it does not, or when it exits first.
    fn wait_until_healthy(&mut self) {
        let started = Instant::now();
        let url = format!("{}/health", self.uri);
        let log =
            |dir: &TempDir| std::fs::read_to_string(dir.join("server.log")).unwrap_or_default();
        while started.elapsed() < SERVER_START_TIMEOUT {
            if ureq::get(&url).call().is_ok() {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "`python3 -m mlflow server` exited ({status}) before answering {url}; its log:\n{}",
                    log(&self.dir)
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        panic!(
            "`python3 -m mlflow server` did not answer {url} within {SERVER_START_TIMEOUT:?}; \
             its log:\n{}",
            log(&self.dir)
        );
    }

    /// Sends `signal` to the server's process group (the server and its workers); whether
    /// `kill` succeeded. Never panics on its own (it also runs while a failed test unwinds).
    fn signal(&self, signal: &str) -> bool {
        let mut kill = Command::new("kill");
        kill.args([signal, "--", &format!("-{}", self.child.id())]);
        let label = format!("kill {signal} -- -{} (the MLflow server)", self.child.id());
        try_run_with_timeout(kill, &label, TOOL_TIMEOUT).is_ok_and(|out| out.status.success())
    }

    /// `GET /api/2.0/mlflow/<endpoint>?query`.
    fn get(&self, endpoint: &str, query: &[(&str, &str)]) -> Value {
        let mut request = ureq::get(format!("{}/api/2.0/mlflow/{endpoint}", self.uri));
        for (k, v) in query {
            request = request.query(*k, *v);
        }
        let mut response = request
            .call()
            .unwrap_or_else(|e| panic!("GET {endpoint}: {e}"));
        response.body_mut().read_json().expect("a JSON answer")
    }

    /// The runs of experiment `name`.
    fn runs(&self, experiment: &str) -> Vec<Value> {
        let id = self.get(
            "experiments/get-by-name",
            &[("experiment_name", experiment)],
        )["experiment"]["experiment_id"]
            .as_str()
            .expect("an experiment id")
            .to_owned();
        let mut response = ureq::post(format!("{}/api/2.0/mlflow/runs/search", self.uri))
            .send_json(json!({"experiment_ids": [id]}))
            .expect("runs/search");
        let answer: Value = response.body_mut().read_json().expect("JSON");
        answer["runs"].as_array().cloned().unwrap_or_default()
    }

    /// Artifact `name` of `run`.
    fn artifact(&self, run: &Value, name: &str) -> Vec<u8> {
        let root = run["info"]["artifact_uri"].as_str().expect("artifact_uri");
        let path = root
            .strip_prefix("mlflow-artifacts:/")
            .unwrap_or_else(|| panic!("artifacts not proxied: {root}"));
        let url = format!(
            "{}/api/2.0/mlflow-artifacts/artifacts/{path}/{name}",
            self.uri
        );
        let mut response = ureq::get(&url)
            .call()
            .unwrap_or_else(|e| panic!("GET {url}: {e}"));
        response
            .body_mut()
            .with_config()
            .limit(1 << 30)
            .read_to_vec()
            .expect("the artifact")
    }

    /// Asserts that `run` holds every value of the `metrics.jsonl` lines `lines`, at its batch,
    /// and no other metric.
    fn assert_holds_metrics(&self, run: &Value, lines: &[Value]) {
        let run_id = run["info"]["run_id"].as_str().expect("run_id");
        let expected = expected_metrics(lines);
        assert!(expected.contains_key("loss") && expected.contains_key("eval/accuracy"));
        for (key, points) in &expected {
            assert_eq!(&self.history(run_id, key), points, "metric {key}");
        }
        let logged: Vec<&str> = run["data"]["metrics"]
            .as_array()
            .expect("metrics")
            .iter()
            .map(|m| m["key"].as_str().unwrap())
            .collect();
        assert_eq!(logged.len(), expected.len(), "{logged:?}");
    }

    /// `(step, value)` of every value of metric `key` of run `run_id`, sorted.
    fn history(&self, run_id: &str, key: &str) -> Vec<(i64, f64)> {
        let answer = self.get(
            "metrics/get-history",
            &[
                ("run_id", run_id),
                ("metric_key", key),
                ("max_results", "25000"),
            ],
        );
        let mut points: Vec<(i64, f64)> = answer["metrics"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|m| {
                let step = m["step"].as_i64().unwrap_or(0);
                (step, m["value"].as_f64().expect("a value"))
            })
            .collect();
        points.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
        points
    }
}

/// Stops the server (continued first, should a test have paused it): SIGTERM, then SIGKILL
/// after 10 s.
impl Drop for MlflowServer {
    fn drop(&mut self) {
        self.signal("-TERM");
        self.signal("-CONT");
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.signal("-KILL");
        let _ = self.child.wait();
    }
}

/// The folder holding MLflow, when `python3 -m mlflow` works from it; a notice (a failure with
/// `TESSERA_REQUIRE_MLFLOW=1`) otherwise.
fn mlflow_pythonpath() -> Option<String> {
    let required = std::env::var_os("TESSERA_REQUIRE_MLFLOW").is_some_and(|v| v == "1");
    let why = match std::env::var("TESSERA_MLFLOW_PYTHONPATH") {
        Err(_) => {
            "TESSERA_MLFLOW_PYTHONPATH is not set (scripts/ensure-mlflow.sh prints it)".to_owned()
        }
        Ok(path) => match python_imports(&path, "mlflow.server") {
            Ok(()) => return Some(path),
            Err(why) => format!("`import mlflow.server` fails with PYTHONPATH={path}: {why}"),
        },
    };
    let notice = format!("NOTICE: skipping the MLflow server test: {why}");
    assert!(!required, "{notice} and TESSERA_REQUIRE_MLFLOW=1");
    eprintln!("{notice}");
    None
}

/// A loopback port nothing listens on (just released).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// A short label-smoothing run that logs to `uri` in `experiment`; `extra` is added to the
/// `mlflow = { ... }` table.
fn tracked_run(run_name: &str, uri: &str, experiment: &str, extra: &str) -> String {
    let toml = TrainerToml::new(run_name).algorithm("label_smoothing", "smoothing = 0.1");
    format!(
        "{}\n[logging]\nmlflow = {{ uri = \"{uri}\", experiment = \"{experiment}\"{extra} }}\n",
        toml.render()
    )
}

/// What MLflow should hold for `metrics.jsonl`: `(key, step) -> values`, written here from the
/// file's format (not with the code under test).
fn expected_metrics(lines: &[Value]) -> BTreeMap<String, Vec<(i64, f64)>> {
    let mut out: BTreeMap<String, Vec<(i64, f64)>> = BTreeMap::new();
    let mut add = |key: String, step: i64, value: &Value| {
        if let Some(v) = value.as_f64() {
            out.entry(key).or_default().push((step, v));
        }
    };
    for line in lines {
        let data = &line["data"];
        match line["kind"].as_str() {
            Some("train") => {
                let step = data["batch"].as_i64().expect("batch");
                for (k, v) in data.as_object().expect("data").iter() {
                    if k != "batch" {
                        add(k.clone(), step, v);
                    }
                }
            }
            Some("eval") => {
                let step = data["batch"].as_i64().expect("batch");
                for (k, v) in data.as_object().expect("data").iter() {
                    if k != "batch" {
                        add(format!("eval/{k}"), step, v);
                    }
                }
                add("eval/train_seconds".into(), step, &line["train_seconds"]);
                add("eval/wall_seconds".into(), step, &line["wall_seconds"]);
            }
            Some("method") => {
                let name = line["name"].as_str().expect("name").to_owned();
                add(name, line["batch"].as_i64().expect("batch"), &line["value"]);
            }
            other => panic!("unexpected line kind {other:?}"),
        }
    }
    for points in out.values_mut() {
        points.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
    }
    out
}

/// Whether the safetensors files `a` and `b` hold the same tensors under the same names.
fn same_tensors(a: &Path, b: &Path) -> bool {
    let read = |path: &Path| -> BTreeMap<String, tch::Tensor> {
        tch::Tensor::read_safetensors(path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .into_iter()
            .collect()
    };
    let (a, b) = (read(a), read(b));
    a.len() == b.len()
        && a.iter().all(|(name, t)| {
            b.get(name)
                .is_some_and(|u| t.kind() == u.kind() && t.size() == u.size() && t.equal(u))
        })
}

#[test]
fn a_run_is_logged_read_back_continued_after_a_resume_and_never_held_up_by_a_paused_server() {
    let Some(server) = MlflowServer::start() else {
        return;
    };
    let started = Instant::now();
    // (a) A run with a plugin.
    let dir = TempDir::new("mlflow-run");
    dir.write(
        "trainer.toml",
        &tracked_run("logged", &server.uri, "fmnist", ""),
    );
    let out = train(&dir, &[], &[]);
    out.assert_success();
    assert!(
        !out.stderr.contains("not delivered"),
        "everything is delivered:\n{}",
        out.dump()
    );
    let folder = run_dir(&dir, "logged");
    let saved = read_json(&folder.join("mlflow.json"));
    let runs = server.runs("fmnist");
    assert_eq!(runs.len(), 1, "{runs:#?}");
    let run = &runs[0];
    let run_id = run["info"]["run_id"].as_str().expect("run_id");
    assert_eq!(saved["run_id"], run_id);
    assert_eq!(run["info"]["status"], "FINISHED");
    assert_eq!(run["info"]["run_name"], "logged");
    let params: BTreeMap<&str, &str> = run["data"]["params"]
        .as_array()
        .expect("params")
        .iter()
        .map(|p| (p["key"].as_str().unwrap(), p["value"].as_str().unwrap()))
        .collect();
    assert_eq!(params.get("optimizer.lr"), Some(&"0.05"), "{params:#?}");
    assert_eq!(params.get("algorithms.0.plugin"), Some(&"label_smoothing"));
    let sha = sha256_hex(&plugin_path("label_smoothing"));
    assert_eq!(
        params.get("plugin.label_smoothing.sha256"),
        Some(&sha.as_str())
    );
    assert_eq!(
        params.get("plugin.label_smoothing.version"),
        Some(&tessera_tests::VERSION)
    );
    let tags: BTreeMap<&str, &str> = run["data"]["tags"]
        .as_array()
        .expect("tags")
        .iter()
        .map(|t| (t["key"].as_str().unwrap(), t["value"].as_str().unwrap()))
        .collect();
    assert_eq!(tags.get("recipe"), Some(&"label_smoothing"));
    assert_eq!(tags.get("tessera.version"), Some(&tessera_tests::VERSION));

    // Every metrics.jsonl value, at its batch, and nothing else.
    let lines = read_jsonl(&folder.join("metrics.jsonl"));
    server.assert_holds_metrics(run, &lines);

    // The artifacts are the run folder's files; the weights are what `tessera export` writes.
    for name in ["run.json", "metrics.jsonl"] {
        assert_eq!(
            server.artifact(run, name),
            std::fs::read(folder.join(name)).unwrap(),
            "{name}"
        );
    }
    let uploaded = dir.join("uploaded.safetensors");
    std::fs::write(&uploaded, server.artifact(run, "model.safetensors")).unwrap();
    let exported = dir.join("exported.safetensors");
    let latest = folder.join("checkpoints").join("latest.ckpt");
    tessera(
        &[
            "export",
            latest.to_str().unwrap(),
            "--to",
            exported.to_str().unwrap(),
        ],
        dir.path(),
        &[],
    )
    .assert_success();
    assert!(
        same_tensors(&uploaded, &exported),
        "the uploaded weights are the exported ones"
    );

    // The Explorer's view.
    let fetched = fetch_runs(&server.uri, "fmnist").expect("fetch_runs");
    assert_eq!(fetched.len(), 1);
    assert_eq!(fetched[0].run_id, run_id);
    assert_eq!(
        fetched[0].source,
        format!(
            "mlflow:{}/#/experiments/{}/runs/{run_id}",
            server.uri,
            saved["experiment_id"].as_str().unwrap()
        )
    );
    assert_eq!(fetched[0].record, read_json(&folder.join("run.json")));
    assert_eq!(fetched[0].metrics, lines);
    // `tessera explore` reads the experiment from the server as it reads a folder.
    let explored = TempDir::new("mlflow-explore");
    let out = tessera(
        &[
            "explore",
            "--mlflow-uri",
            &server.uri,
            "--mlflow-experiment",
            "fmnist",
            "--out",
            explored.path().to_str().expect("a UTF-8 path"),
        ],
        explored.path(),
        &[],
    );
    out.assert_success();
    let recipe = fetched[0].record["recipe"]
        .as_str()
        .expect("a recipe label");
    assert!(
        out.stdout.lines().any(|l| l.starts_with(recipe)),
        "{}",
        out.dump()
    );
    let report = std::fs::read_to_string(explored.join("report.html")).expect("report.html");
    assert!(
        report.contains(&format!("data-recipe=\"{recipe}\"")),
        "{report}"
    );

    // (d) A run stopped after a checkpoint and resumed continues its MLflow run.
    let dir = TempDir::new("mlflow-resume");
    dir.write(
        "trainer.toml",
        &format!(
            "{}\n[checkpoint]\ninterval = \"2ba\"\n",
            tracked_run("resumed", &server.uri, "resume", "")
        ),
    );
    train(&dir, &["train.max_duration=2ba"], &[]).assert_success();
    let folder = run_dir(&dir, "resumed");
    let first = read_json(&folder.join("mlflow.json"));
    let out = train(
        &dir,
        &["train.max_duration=4ba", "checkpoint.autoresume=true"],
        &[],
    );
    out.assert_success();
    assert!(out.stderr.contains("resumed from"), "{}", out.dump());
    assert_eq!(read_json(&folder.join("mlflow.json")), first);
    let runs = server.runs("resume");
    assert_eq!(runs.len(), 1, "one MLflow run: {runs:#?}");
    let run = &runs[0];
    assert_eq!(run["info"]["run_id"], first["run_id"]);
    assert_eq!(run["info"]["status"], "FINISHED");
    let steps: Vec<i64> = server
        .history(first["run_id"].as_str().unwrap(), "loss")
        .into_iter()
        .map(|(step, _)| step)
        .collect();
    assert_eq!(steps, [1, 2, 3, 4]);
    assert_eq!(
        server.artifact(run, "run.json"),
        std::fs::read(folder.join("run.json")).unwrap()
    );

    // (e) A server that answers nothing while the run trains (its processes stopped) never
    // holds the training up: the run trains to its end and writes its record before the server
    // has answered anything (it has not even opened the MLflow run); once the server answers
    // again, the end delivers every event.
    let dir = TempDir::new("mlflow-paused");
    dir.write(
        "trainer.toml",
        &tracked_run(
            "paused",
            &server.uri,
            "paused",
            // Far longer than delivering takes: the end waits for everything.
            ", flush_timeout = \"240s\"",
        ),
    );
    let folder = run_dir(&dir, "paused");
    assert!(server.signal("-STOP"), "cannot stop the MLflow server");
    let config = dir.join("trainer.toml");
    let command = tessera_command(
        &["train", config.to_str().expect("a UTF-8 temp path")],
        dir.path(),
        &[],
    );
    let run = std::thread::spawn(move || {
        run_with_timeout(command, "tessera train (MLflow paused)", COMMAND_TIMEOUT)
    });
    let record = folder.join("run.json");
    wait_for(
        "the run record while MLflow is paused",
        COMMAND_TIMEOUT,
        || record.is_file() || run.is_finished(),
    );
    let trained = record.is_file().then(|| read_json(&record));
    let opened = folder.join("mlflow.json").exists();
    assert!(server.signal("-CONT"), "cannot continue the MLflow server");
    let out = run.join().expect("the training thread");
    let trained = trained.unwrap_or_else(|| panic!("no run.json:\n{}", out.dump()));
    assert_eq!(trained["status"], "completed", "{}", out.dump());
    assert_eq!(trained["batches"], 3);
    assert!(
        !opened,
        "the MLflow run was opened while the server was paused"
    );
    out.assert_success();
    assert!(
        !out.stderr.contains("not delivered"),
        "everything is delivered once the server answers:\n{}",
        out.dump()
    );
    let runs = server.runs("paused");
    assert_eq!(runs.len(), 1, "one MLflow run: {runs:#?}");
    let run = &runs[0];
    assert_eq!(
        run["info"]["run_id"],
        read_json(&folder.join("mlflow.json"))["run_id"]
    );
    assert_eq!(run["info"]["status"], "FINISHED");
    server.assert_holds_metrics(run, &read_jsonl(&folder.join("metrics.jsonl")));
    for name in ["run.json", "metrics.jsonl"] {
        assert_eq!(
            server.artifact(run, name),
            std::fs::read(folder.join(name)).unwrap(),
            "{name}"
        );
    }
    eprintln!("MLflow server checks took {:?}", started.elapsed());
}

/// Checks a run whose server never got its events: it succeeded, its files are complete, and
/// its last words say that none of its events reached `uri` and why (`reason`). Returns that
/// warning.
fn assert_completed_without_server(label: &str, uri: &str, reason: &str) -> String {
    let dir = TempDir::new(label);
    dir.write(
        "trainer.toml",
        &tracked_run(label, uri, "offline", ", flush_timeout = \"2s\""),
    );
    let out = train(&dir, &[], &[]);
    out.assert_success();
    let folder = run_dir(&dir, label);
    let record = read_json(&folder.join("run.json"));
    assert_eq!(record["status"], "completed");
    assert_eq!(record["batches"], 3);
    let lines = read_jsonl(&folder.join("metrics.jsonl"));
    assert!(!lines.is_empty());
    let warning = out
        .stderr
        .lines()
        .find(|l| l.contains("events not delivered to"))
        .unwrap_or_else(|| panic!("no delivery warning:\n{}", out.dump()))
        .to_owned();
    assert!(
        warning.contains(&format!("not delivered to {uri} ("))
            && warning.contains(reason)
            && warning.contains("the run's files are complete"),
        "{warning}"
    );
    // "mlflow: <missing> of <queued> events": none of them arrived, and they include every
    // metric value of metrics.jsonl.
    let counts: Vec<u64> = warning
        .split_once("mlflow: ")
        .and_then(|(_, rest)| rest.split_once(" events"))
        .map(|(counts, _)| {
            counts
                .split(" of ")
                .filter_map(|n| n.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    let metric_values: usize = expected_metrics(&lines).values().map(Vec::len).sum();
    assert!(
        counts.len() == 2 && counts[0] == counts[1] && counts[1] >= metric_values as u64,
        "{warning} (metrics.jsonl has {metric_values} values)"
    );
    assert!(
        !folder.join("mlflow.json").exists(),
        "no MLflow run was opened"
    );
    warning
}

#[test]
fn a_server_that_is_down_never_fails_the_run() {
    let uri = format!("http://127.0.0.1:{}", free_port());
    assert_completed_without_server("mlflow-down", &uri, "connection refused");
}

#[test]
fn a_server_that_never_answers_is_given_up_after_flush_timeout() {
    // Accepts connections, holds them open and never answers: a request to it waits for an
    // answer until the client's own timeout (a minute), and is then retried, for ever.
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let uri = format!("http://{}", listener.local_addr().unwrap());
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&accepted);
    std::thread::spawn(move || {
        let mut held: Vec<TcpStream> = Vec::new();
        for stream in listener.incoming().flatten() {
            counter.fetch_add(1, Ordering::SeqCst);
            held.push(stream);
        }
    });
    // The run ends (within the test's command timeout) although its request is still
    // unanswered: the end stopped waiting for it after `flush_timeout`, and says so.
    let warning = assert_completed_without_server("mlflow-slow", &uri, "no answer after");
    assert!(
        accepted.load(Ordering::SeqCst) >= 1,
        "the run never connected to the server: {warning}"
    );
}
