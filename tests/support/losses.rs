//! The training losses of a 3-batch run with one method or none: the comparison that
//! tests/methods/augmix.rs, tests/methods/randaugment.rs and tests/methods/colout.rs share
//! (`#[path]` module); [`train_checked`] also serves tests/support/mixing.rs.

use tessera_tests::*;

/// The training loss of every batch of the 3-batch run `toml` with `plugin` and `settings`
/// added (none: no plugin), after checking that the run completed and loaded the plugin.
pub fn losses_with(toml: TrainerToml, plugin: &str, settings: Option<&str>) -> Vec<f64> {
    let label = toml.run_name.clone();
    let dir = TempDir::new(&label);
    let toml = match settings {
        Some(settings) => toml.algorithm(plugin, settings),
        None => toml,
    };
    toml.write_to(&dir);
    train_checked(&dir, plugin, settings.is_some());
    let lines = read_jsonl(&run_dir(&dir, &label).join("metrics.jsonl"));
    let losses = train_losses(&lines);
    assert_eq!(losses.len(), 3, "{lines:?}");
    let record = read_json(&run_dir(&dir, &label).join("run.json"));
    assert_eq!(record["status"], "completed", "{record:#}");
    losses
}

/// Trains the `trainer.toml` in `dir` through the binary, which must succeed; when `loaded`, it
/// must say it loaded `plugin`.
pub fn train_checked(dir: &TempDir, plugin: &str, loaded: bool) {
    let out = train(dir, &[], &[]);
    out.assert_success();
    if loaded {
        assert!(
            out.stderr.contains(&format!("loaded plugin {plugin}")),
            "{}",
            out.dump()
        );
    }
}
