//! `tessera launch` with the real binary: the ranks run `tessera --version` or fail at once,
//! so nothing trains (the supervision itself is tested in host/src/launch/tests.rs).

use tessera_tests::*;

#[test]
fn every_rank_runs_the_command_and_only_rank_0_is_unprefixed() {
    let dir = TempDir::new("launch-version");
    let out = tessera(
        &["launch", "--nproc", "2", "--", "--version"],
        dir.path(),
        &[],
    );
    out.assert_success();
    let version = format!("tessera {VERSION}");
    assert_eq!(
        out.stdout.lines().next(),
        Some(version.as_str()),
        "{}",
        out.dump()
    );
    assert_eq!(out.stdout.matches(&version).count(), 1, "{}", out.dump());
    let stderr: Vec<&str> = out.stderr.lines().collect();
    assert!(
        stderr.iter().any(|l| l.starts_with(
            "tessera launch: 2 ranks on this node (world size 2, node 0 of 1), master 127.0.0.1:"
        )),
        "{}",
        out.dump()
    );
    assert!(
        stderr.contains(&format!("[rank 1] {version}").as_str()),
        "{}",
        out.dump()
    );
}

#[test]
fn a_failing_rank_fails_the_launch_with_its_status() {
    // Both ranks fail on the missing file; whichever is seen first is reported.
    let dir = TempDir::new("launch-failure");
    let out = tessera(
        &["launch", "--nproc", "2", "train", "missing.toml"],
        dir.path(),
        &[],
    );
    assert_eq!(out.status.code(), Some(1), "{}", out.dump());
    assert!(
        out.stderr.contains("failed with exit status 1"),
        "{}",
        out.dump()
    );
}

#[test]
fn launch_refuses_to_run_inside_a_distributed_run() {
    let dir = TempDir::new("launch-nested");
    tessera(
        &["launch", "--nproc", "2", "train", "trainer.toml"],
        dir.path(),
        &[("RANK", "0"), ("WORLD_SIZE", "2")],
    )
    .assert_failure(&["RANK=0 is already set", "run `tessera train ...` directly"]);
}
