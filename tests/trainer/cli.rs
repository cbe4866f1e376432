//! The non-training commands of the `tessera` binary.

use serde_json::Value;
use tessera_tests::*;

#[test]
fn version_names_tessera_libtorch_and_cuda() {
    let dir = TempDir::new("version");
    let out = tessera(&["--version"], dir.path(), &[]);
    out.assert_success();
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(
        lines.first().copied(),
        Some(format!("tessera {VERSION}").as_str()),
        "{}",
        out.dump()
    );
    assert!(
        lines.iter().any(|l| l.starts_with(&format!(
            "libtorch {}",
            tessera_plugin_api::LIBTORCH_VERSION
        ))),
        "{}",
        out.dump()
    );
    let api = format!("plugin-api {}", tessera_plugin_api::API_VERSION);
    assert!(lines.contains(&api.as_str()), "{}", out.dump());
    let cuda = lines
        .iter()
        .find(|l| l.starts_with("cuda "))
        .unwrap_or_else(|| panic!("no cuda line:\n{}", out.dump()));
    assert!(
        cuda.starts_with("cuda available (") || cuda.starts_with("cuda not available ("),
        "{cuda}"
    );
    // -V is the same.
    let short = tessera(&["-V"], dir.path(), &[]);
    short.assert_success();
    assert_eq!(short.stdout, out.stdout);
}

#[test]
fn no_command_is_an_error() {
    let dir = TempDir::new("no-command");
    tessera(&[], dir.path(), &[]).assert_failure(&["no command given", "tessera --help"]);
}

#[test]
fn plugins_list_shows_both_plugins() {
    let dir = TempDir::new("list");
    let target = target_dir();
    let out = tessera(
        &[
            "plugins",
            "list",
            "--dir",
            target.to_str().expect("UTF-8 path"),
        ],
        dir.path(),
        &[],
    );
    out.assert_success();
    let text = &out.stdout;
    for (name, events) in [
        ("label_smoothing", "before_loss, after_loss"),
        ("cutout", "after_dataloader"),
    ] {
        let so = plugin_path(name);
        let header = format!("{name} {VERSION}\n");
        let start = text
            .find(&header)
            .unwrap_or_else(|| panic!("no {header:?} in:\n{}", out.dump()));
        let block: String = text[start..].lines().take(6).collect::<Vec<_>>().join("\n");
        assert!(
            block.contains(&format!("  events:     {events}")),
            "{block}"
        );
        assert!(
            block.contains(&format!("  sha256:     {}", sha256_hex(&so))),
            "{block}"
        );
        assert!(
            block.contains(&format!(
                "  plugin-api: {}, libtorch {}",
                tessera_plugin_api::API_VERSION,
                tessera_plugin_api::LIBTORCH_VERSION
            )),
            "{block}"
        );
        assert!(
            block.contains(&format!("  path:       {}", so.display())),
            "{block}"
        );
    }
    // The only file there that is not a plugin is the layout-mismatch fixture.
    assert!(
        !text
            .lines()
            .any(|l| l.contains("skipped") && !l.contains("libalien_plugin.so")),
        "{}",
        out.dump()
    );
}

#[test]
fn plugins_list_shows_every_folder_searched_in_order() {
    let dir = TempDir::new("list-empty");
    let out = tessera(
        &[
            "plugins",
            "list",
            "--dir",
            dir.path().to_str().expect("UTF-8 path"),
        ],
        dir.path(),
        &[],
    );
    out.assert_success();
    let build = std::fs::canonicalize(target_dir()).expect("the build folder");
    let searched = format!(
        "searched, in order:\n  {} (configured)\n  {} (user folder) — no such folder\n  {} (build folder)\n",
        dir.path().display(),
        no_user_data().join("tessera/plugins").display(),
        build.display()
    );
    assert!(out.stdout.starts_with(&searched), "{}", out.dump());
    // The empty folder adds nothing; the build folder's plugins are listed with their folder.
    assert!(
        out.stdout.contains(&format!(
            "  path:       {}\n",
            build.join("liblabel_smoothing.so").display()
        )),
        "{}",
        out.dump()
    );
    assert!(
        out.stdout.contains(&format!(
            "  folder:     {} (build folder)\n",
            build.display()
        )),
        "{}",
        out.dump()
    );
}

#[test]
fn plugins_inspect_shows_default_settings() {
    let dir = TempDir::new("inspect");
    for (name, defaults) in [
        ("label_smoothing", &["    smoothing = 0.1"][..]),
        (
            "cutout",
            &[
                "    num_holes = 1",
                "    length = 0.5",
                "    uniform_sampling = false",
            ][..],
        ),
    ] {
        let so = plugin_path(name);
        let out = tessera(
            &["plugins", "inspect", so.to_str().expect("UTF-8 path")],
            dir.path(),
            &[],
        );
        out.assert_success();
        assert!(
            out.stdout.starts_with(&format!("{name} {VERSION}\n")),
            "{}",
            out.dump()
        );
        let (_, settings) = out
            .stdout
            .split_once("  default settings:\n")
            .unwrap_or_else(|| panic!("no default settings:\n{}", out.dump()));
        let settings: Vec<&str> = settings.lines().collect();
        assert_eq!(settings, defaults, "{}", out.dump());
    }
}

#[test]
fn data_fetch_of_cached_fashion_mnist_succeeds() {
    require_fashion_mnist();
    let dir = TempDir::new("fetch");
    let out = tessera(&["data", "fetch", "fashion-mnist"], dir.path(), &[]);
    out.assert_success();
    let expected = format!(
        "fashion-mnist: verified in {}",
        data_root().join("fashion-mnist").display()
    );
    assert!(out.stderr.contains(&expected), "{}", out.dump());
    assert!(out.stderr.contains("already cached"), "{}", out.dump());
}

#[test]
fn data_fetch_of_an_unknown_dataset_fails() {
    let dir = TempDir::new("fetch-unknown");
    let out = tessera(
        &[
            "data",
            "fetch",
            "cifar-1000",
            "--dir",
            dir.path().to_str().expect("UTF-8"),
        ],
        dir.path(),
        &[],
    );
    out.assert_failure(&["unknown dataset `cifar-1000`", "fashion-mnist", "mnist"]);
    assert!(
        std::fs::read_dir(dir.path())
            .expect("read")
            .next()
            .is_none(),
        "an unknown dataset left files behind"
    );
}

/// [`tessera`] runs its commands in forks of a `tessera` started once for the test process
/// (`tests/common/fork_server.rs`): a forked command must do what a freshly started one does.
/// The same training run (with a plugin) both ways gives the same losses, accuracy and log
/// lines; a bad trainer.toml the same error and exit code; the variables a test sets reach the
/// command; and a command's whole stdout comes back (the process ends without libtorch's static
/// destructors, after writing its output).
#[test]
fn a_forked_command_does_what_a_fresh_tessera_does() {
    if std::env::var_os("TESSERA_FORK_SERVER").is_some_and(|v| v == "0") {
        eprintln!("TESSERA_FORK_SERVER=0: every command starts fresh; nothing to compare");
        return;
    }
    let fresh = |args: &[&str], dir: &TempDir, env: &[(&str, &str)]| {
        let command = format!("tessera {}", args.join(" "));
        run_with_timeout(
            tessera_command(args, dir.path(), env),
            &command,
            COMMAND_TIMEOUT,
        )
    };
    let forked = |args: &[&str], dir: &TempDir, env: &[(&str, &str)]| {
        let command = format!("tessera {}", args.join(" "));
        fork_server::run(args, dir.path(), env, &command, COMMAND_TIMEOUT)
            .unwrap_or_else(|| panic!("the fork server did not run `{command}`"))
    };
    // Log lines without their times and speeds.
    let log = |out: &Output| -> Vec<String> {
        out.stderr
            .lines()
            .map(|l| {
                let l = l.split_once("Z ").map_or(l, |(_, rest)| rest);
                let l = l.split(" in ").next().unwrap_or(l);
                let l = l.split(" took ").next().unwrap_or(l);
                match l
                    .find('{')
                    .map(|at| (at, serde_json::from_str::<Value>(&l[at..])))
                {
                    Some((at, Ok(mut line))) => {
                        if let Some(fields) = line.as_object_mut() {
                            fields.remove("samples_per_second");
                        }
                        format!("{}{line}", &l[..at])
                    }
                    _ => l.to_owned(),
                }
            })
            .collect()
    };
    let toml = TrainerToml::new("same").with_both_plugins();
    let runs: Vec<(Output, Value, Vec<f64>)> = [false, true]
        .into_iter()
        .map(|fork| {
            let dir = TempDir::new(if fork { "forked" } else { "fresh" });
            toml.write_to(&dir);
            require_fashion_mnist();
            let args = ["train", "trainer.toml"];
            let env = [("TESSERA_LOG", "debug")];
            let out = if fork {
                forked(&args, &dir, &env)
            } else {
                fresh(&args, &dir, &env)
            };
            out.assert_success();
            let run = run_dir(&dir, "same");
            let record = read_json(&run.join("run.json"));
            let losses = train_losses(&read_jsonl(&run.join("metrics.jsonl")));
            (out, record, losses)
        })
        .collect();
    let [(fresh_out, fresh_record, fresh_losses), (fork_out, fork_record, fork_losses)] = &runs[..]
    else {
        unreachable!("two runs")
    };
    assert_eq!(fresh_losses.len(), 3, "{}", fresh_out.dump());
    assert_eq!(fresh_losses, fork_losses, "train losses");
    assert_eq!(
        fresh_record["final_accuracy"], fork_record["final_accuracy"],
        "final accuracy"
    );
    assert_eq!(log(fresh_out), log(fork_out), "log lines");
    assert!(
        fork_out.stderr.contains("DEBUG"),
        "TESSERA_LOG=debug did not reach the forked command:\n{}",
        fork_out.dump()
    );
    // A bad trainer.toml: the same error line and exit code.
    let dir = TempDir::new("bad");
    dir.write("trainer.toml", "[model]\nname = 3\n");
    let bad = ["train", "trainer.toml"];
    let (fresh_bad, fork_bad) = (fresh(&bad, &dir, &[]), forked(&bad, &dir, &[]));
    assert_eq!(
        fresh_bad.assert_failure(&[]),
        fork_bad.assert_failure(&[]),
        "the error line"
    );
    // The whole stdout of a command that prints many lines.
    let dir = TempDir::new("list");
    let list = ["plugins", "list"];
    let (fresh_list, fork_list) = (fresh(&list, &dir, &[]), forked(&list, &dir, &[]));
    fresh_list.assert_success();
    fork_list.assert_success();
    assert!(
        fresh_list.stdout.lines().count() > 20,
        "{}",
        fresh_list.dump()
    );
    assert_eq!(fresh_list.stdout, fork_list.stdout, "plugins list");
}
