//! The launcher's checks and supervision, run on `sh -c` scripts instead of `tessera`.

use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::rank::forward_lines;
use super::*;

fn options(nproc: u32, nnodes: u32, node_rank: u32, master_port: Option<u16>) -> LaunchOptions {
    LaunchOptions {
        nproc,
        nnodes,
        node_rank,
        master_addr: DEFAULT_MASTER_ADDR.to_owned(),
        master_port,
    }
}

fn no_env(_: &str) -> Option<String> {
    None
}

/// A fresh folder for one test's ranks to write into.
fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tessera-launch-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create the test folder");
    dir
}

/// `sh -c script` with `dir` as `$1`, for every rank.
fn run_script(
    script: &str,
    dir: &Path,
    topology: &Topology,
    grace: Duration,
    pending_signals: impl FnMut() -> Vec<i32>,
) -> Outcome {
    let args: Vec<OsString> = vec!["-c".into(), script.into(), "rank".into(), dir.into()];
    supervise(OsStr::new("sh"), &args, topology, grace, pending_signals).expect("supervise")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn every_rank_sees_its_variables_and_success_is_exit_0() {
    let dir = temp_dir("variables");
    let topology = options(2, 2, 1, Some(29555))
        .resolve(no_env)
        .expect("valid options");
    let script = r#"echo "$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $GROUP_RANK $MASTER_ADDR $MASTER_PORT" > "$1/rank-$RANK""#;
    let outcome = run_script(script, &dir, &topology, Duration::from_secs(5), Vec::new);
    assert!(matches!(outcome, Outcome::Succeeded), "{outcome:?}");
    assert_eq!(outcome.exit_code(), 0);
    assert_eq!(
        read(&dir.join("rank-2")).trim(),
        "2 4 0 2 1 127.0.0.1 29555"
    );
    assert_eq!(
        read(&dir.join("rank-3")).trim(),
        "3 4 1 2 1 127.0.0.1 29555"
    );
    assert!(!dir.join("rank-0").exists() && !dir.join("rank-1").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_master_port_is_free_on_one_node_and_29500_on_several() {
    let one_node = options(2, 1, 0, None).resolve(no_env).expect("valid");
    assert_ne!(one_node.master_port, 0);
    let two_nodes = options(2, 2, 0, None).resolve(no_env).expect("valid");
    assert_eq!(two_nodes.master_port, DEFAULT_MULTI_NODE_MASTER_PORT);
    let given = options(2, 1, 0, Some(1234)).resolve(no_env).expect("valid");
    assert_eq!(given.master_port, 1234);
}

#[test]
fn the_banner_names_ranks_world_node_and_master() {
    let mut topology = options(2, 2, 1, Some(29500))
        .resolve(no_env)
        .expect("valid");
    topology.master_addr = "10.0.0.1".to_owned();
    assert_eq!(
        topology.to_string(),
        "2 ranks on this node (world size 4, node 1 of 2), master 10.0.0.1:29500"
    );
    let single = options(1, 1, 0, Some(5000)).resolve(no_env).expect("valid");
    assert_eq!(
        single.to_string(),
        "1 rank on this node (world size 1, node 0 of 1), master 127.0.0.1:5000"
    );
}

/// Two ranks on one node (the scripts ignore the master port).
fn two_ranks() -> Topology {
    options(2, 1, 0, Some(29500))
        .resolve(no_env)
        .expect("valid options")
}

fn failure_of(outcome: &Outcome) -> &RankFailure {
    match outcome {
        Outcome::Failed(failure) => failure,
        other => panic!("expected a failure, got {other:?}"),
    }
}

/// Runs two ranks: rank 0 runs `rank_0` (`trap '' TERM`, say), records its pid in `pid-0` and
/// sleeps; rank 1 waits for that record (so that rank 0 is asleep, not starting, when it is
/// stopped), then runs `rank_1`, which fails. Returns the outcome, how long the launch took,
/// and rank 0's pid.
fn fail_beside_a_sleeper(
    tag: &str,
    rank_0: &str,
    rank_1: &str,
    grace: Duration,
) -> (Outcome, Duration, libc::pid_t) {
    let dir = temp_dir(tag);
    let script = format!(
        r#"
        if [ "$LOCAL_RANK" = 0 ]; then
            {rank_0}
            echo $$ > "$1/pid.tmp" && mv "$1/pid.tmp" "$1/pid-0"
            exec sleep 60
        fi
        i=0
        while [ ! -s "$1/pid-0" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
        {rank_1}
        "#
    );
    let started = Instant::now();
    let outcome = run_script(&script, &dir, &two_ranks(), grace, Vec::new);
    let elapsed = started.elapsed();
    let sleeper = read(&dir.join("pid-0")).trim().parse().expect("a pid");
    let _ = std::fs::remove_dir_all(&dir);
    (outcome, elapsed, sleeper)
}

fn assert_gone(pid: libc::pid_t) {
    // SAFETY: signal 0 only checks that the process exists.
    let alive = unsafe { libc::kill(pid, 0) } == 0;
    assert!(!alive, "pid {pid} still runs");
}

#[test]
fn a_failing_rank_is_reported_and_the_others_are_stopped() {
    let fail = r#"
        echo "loading the data"
        echo "first complaint" >&2
        echo "error: out of cheese" >&2
        exit 3"#;
    // A grace period far above the time allowed: the sleeping rank must stop on SIGTERM.
    let (outcome, elapsed, sleeper) =
        fail_beside_a_sleeper("failure", "", fail, Duration::from_secs(30));
    assert!(elapsed < Duration::from_secs(10), "took {elapsed:?}");
    assert_gone(sleeper);
    assert_eq!(outcome.exit_code(), 3);
    let failure = failure_of(&outcome);
    assert_eq!((failure.rank, failure.status.code()), (1, Some(3)));
    assert_eq!(
        failure.stderr_tail,
        ["first complaint", "error: out of cheese"]
    );
    let report = failure.to_string();
    let first_line = format!("rank 1 (pid {}) failed with exit status 3", failure.pid);
    assert!(report.starts_with(&first_line), "{report}");
    assert!(
        report.ends_with("\n[rank 1] error: out of cheese"),
        "{report}"
    );
}

#[test]
fn a_rank_that_ignores_sigterm_is_killed_after_the_grace_period() {
    // `sleep` inherits the ignored SIGTERM.
    let (outcome, elapsed, sleeper) = fail_beside_a_sleeper(
        "straggler",
        "trap '' TERM",
        "exit 5",
        Duration::from_millis(300),
    );
    assert!(elapsed < Duration::from_secs(10), "took {elapsed:?}");
    assert_gone(sleeper);
    assert_eq!(outcome.exit_code(), 5);
    let failure = failure_of(&outcome);
    assert_eq!((failure.rank, failure.status.code()), (1, Some(5)));
}

#[test]
fn a_rank_killed_by_a_signal_is_reported_with_its_name() {
    let dir = temp_dir("killed");
    let script = r#"if [ "$LOCAL_RANK" = 1 ]; then kill -9 $$; fi"#;
    let outcome = run_script(script, &dir, &two_ranks(), Duration::from_secs(5), Vec::new);
    let failure = failure_of(&outcome);
    assert_eq!((failure.rank, failure.status.signal()), (1, Some(9)));
    assert!(
        failure
            .to_string()
            .ends_with("was killed by signal 9 (SIGKILL)"),
        "{failure}"
    );
    assert_eq!(outcome.exit_code(), 1);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_signal_to_the_launcher_reaches_every_rank_as_sigterm() {
    let dir = temp_dir("signal");
    // Each rank exits as `tessera train` does on SIGTERM, 143, once it has recorded the signal.
    let script = r#"
        trap 'echo TERM > "$1/stopped-$RANK"; exit 143' TERM
        touch "$1/ready-$RANK"
        while :; do sleep 0.05; done
    "#;
    let mut sent = false;
    let ready = |rank: u32| dir.join(format!("ready-{rank}")).exists();
    let pending_signals = || {
        if !sent && ready(0) && ready(1) {
            sent = true;
            vec![libc::SIGINT]
        } else {
            Vec::new()
        }
    };
    let outcome = run_script(
        script,
        &dir,
        &two_ranks(),
        Duration::from_secs(30),
        pending_signals,
    );
    assert!(
        matches!(outcome, Outcome::Interrupted { signal } if signal == libc::SIGINT),
        "{outcome:?}"
    );
    assert_eq!(outcome.exit_code(), 130);
    for rank in 0..2 {
        assert_eq!(read(&dir.join(format!("stopped-{rank}"))).trim(), "TERM");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn forwarded_lines_are_prefixed_and_the_stderr_tail_is_kept() {
    let input: String = (1..=25)
        .map(|n| format!("line {n}\r\n"))
        .collect::<String>()
        + "last";
    let mut out = Vec::new();
    let tail = Mutex::new(VecDeque::new());
    forward_lines(input.as_bytes(), 7, &mut out, Some(&tail));
    let out = String::from_utf8(out).expect("UTF-8");
    assert!(
        out.starts_with("[rank 7] line 1\n[rank 7] line 2\n"),
        "{out}"
    );
    assert!(out.ends_with("[rank 7] line 25\n[rank 7] last\n"), "{out}");
    let tail = tail.into_inner().expect("not poisoned");
    assert_eq!(tail.len(), STDERR_TAIL_LINES);
    assert_eq!(tail.front().map(String::as_str), Some("line 7"));
    assert_eq!(tail.back().map(String::as_str), Some("last"));
}

#[test]
fn bad_options_and_a_distributed_environment_are_refused() {
    let error = |options: LaunchOptions| {
        options
            .resolve(no_env)
            .expect_err("invalid options")
            .to_string()
    };
    assert_eq!(
        error(options(0, 1, 0, None)),
        "--nproc is 0: start at least 1 rank on this node"
    );
    assert_eq!(
        error(options(1, 0, 0, None)),
        "--nnodes is 0: a run has at least 1 node"
    );
    let out_of_range = error(options(2, 2, 2, None));
    assert!(
        out_of_range.starts_with("--node-rank 2 is out of range for --nnodes 2"),
        "{out_of_range}"
    );
    assert!(out_of_range.ends_with("must be below 2"), "{out_of_range}");
    assert!(error(options(u32::MAX, 2, 0, None)).contains("more ranks than can be numbered"));

    for variable in ["RANK", "WORLD_SIZE"] {
        let env = |name: &str| (name == variable).then(|| "3".to_owned());
        let refused = options(2, 1, 0, None)
            .resolve(env)
            .expect_err("already distributed")
            .to_string();
        assert!(
            refused.starts_with(&format!("{variable}=3 is already set")),
            "{refused}"
        );
        assert!(
            refused.contains("run `tessera train ...` directly"),
            "{refused}"
        );
    }
    // An empty variable is no distributed run.
    let empty = |name: &str| (name == "RANK").then(String::new);
    assert!(options(2, 1, 0, Some(1)).resolve(empty).is_ok());
}

#[test]
fn a_program_that_cannot_start_is_an_error_naming_the_rank() {
    let missing = OsStr::new("/nonexistent/tessera");
    let error = supervise(missing, &[], &two_ranks(), Duration::from_secs(1), Vec::new)
        .expect_err("no such program");
    assert!(
        error
            .to_string()
            .starts_with("cannot start rank 0 (/nonexistent/tessera)"),
        "{error}"
    );
}
