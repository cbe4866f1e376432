//! `tessera train` refuses a bad trainer.toml or `--set` with one located message
//! (`FILE:LINE:COL: KEY: MESSAGE`), exit code 1, and no run folder.

use tessera_tests::*;

/// Writes `toml`, runs `tessera train` with `overrides` and checks it fails with `fragments`
/// in its error line and leaves no run folder. Returns the error line.
fn refused(toml: &TrainerToml, overrides: &[&str], fragments: &[&str]) -> String {
    let dir = TempDir::new("config-error");
    toml.write_to(&dir);
    let out = train(&dir, overrides, &[]);
    let line = out.assert_failure(fragments);
    assert!(
        !dir.join("runs").exists(),
        "a refused config created a run folder:\n{}",
        out.dump()
    );
    line
}

fn with_optimizer(body: &str) -> (TrainerToml, usize, String) {
    let mut toml = TrainerToml::new("bad");
    toml.optimizer = format!("name = \"sgd\"\n{body}");
    let text = toml.render();
    let line = line_of(&text, body);
    (toml, line, text)
}

#[test]
fn unknown_key_names_the_key_and_its_line() {
    let (toml, n, _) = with_optimizer("lrr = 0.05");
    let line = refused(
        &toml,
        &[],
        &[
            &format!("trainer.toml:{n}:1: optimizer.lrr: unknown key"),
            "did you mean `lr`?",
        ],
    );
    assert!(line.contains("valid keys in `optimizer`"), "{line}");
}

#[test]
fn wrong_type_names_the_key_and_its_line() {
    let (toml, n, _) = with_optimizer("lr = \"fast\"");
    refused(
        &toml,
        &[],
        &[&format!(
            "trainer.toml:{n}:6: optimizer.lr: expected a number, got a string (\"fast\")"
        )],
    );
}

#[test]
fn bad_value_names_the_key_and_its_line() {
    let (toml, n, _) = with_optimizer("lr = -0.1");
    refused(
        &toml,
        &[],
        &[&format!(
            "trainer.toml:{n}:6: optimizer.lr: must be > 0, got -0.1"
        )],
    );
    let mut toml = TrainerToml::new("bad");
    toml.max_duration = "3dur".to_owned();
    let n = line_of(&toml.render(), "max_duration");
    refused(
        &toml,
        &[],
        &[&format!(
            "trainer.toml:{n}:16: train.max_duration: unit \"dur\" is not allowed here"
        )],
    );
}

#[test]
fn malformed_toml_is_located() {
    let (toml, n, _) = with_optimizer("lr = ");
    refused(
        &toml,
        &[],
        &[&format!("trainer.toml:{n}:"), "optimizer.lr: invalid TOML"],
    );
    // An unterminated table header.
    let mut toml = TrainerToml::new("bad");
    toml.model = "name = \"cnn\"\n[optimizer".to_owned();
    toml.optimizer = "lr = 0.1".to_owned();
    let text = toml.render();
    let n = 1 + text
        .lines()
        .position(|l| l == "[optimizer")
        .expect("the broken header");
    refused(&toml, &[], &[&format!("trainer.toml:{n}:"), "invalid TOML"]);
}

#[test]
fn bad_set_arguments_are_named() {
    let toml = TrainerToml::new("bad");
    refused(
        &toml,
        &["optimizer.lr"],
        &["trainer.toml: --set optimizer.lr: expected KEY=VALUE"],
    );
    refused(
        &toml,
        &["optimizer.lr=-1"],
        &["trainer.toml: --set optimizer.lr=-1: optimizer.lr: must be > 0, got -1"],
    );
    refused(
        &toml,
        &["optimizer.lrr=0.1"],
        &["trainer.toml: --set optimizer.lrr=0.1: optimizer.lrr: unknown key"],
    );
    refused(
        &toml,
        &["train.max_duration=3dur"],
        &["--set train.max_duration=3dur: train.max_duration: unit \"dur\" is not allowed here"],
    );
}

#[test]
fn a_plugin_name_cannot_be_a_path() {
    let toml = TrainerToml::new("bad").algorithm("../../etc/evil", "");
    let n = line_of(&toml.render(), "../../etc/evil");
    refused(
        &toml,
        &[],
        &[&format!(
            "trainer.toml:{n}:10: algorithms.0.plugin: \"../../etc/evil\" is not a plugin name"
        )],
    );
}

#[test]
fn a_missing_file_is_named() {
    let dir = TempDir::new("no-file");
    let missing = dir.join("nope.toml");
    let out = tessera(
        &["train", missing.to_str().expect("UTF-8")],
        dir.path(),
        &[],
    );
    out.assert_failure(&["nope.toml: cannot read the configuration file"]);
}

#[test]
fn checkpoint_and_nonfinite_settings_are_checked() {
    let toml = TrainerToml::new("bad");
    refused(
        &toml,
        &["checkpoint.interval=\"2xx\""],
        &["checkpoint.interval", "--set checkpoint.interval"],
    );
    refused(&toml, &["checkpoint.keep=-1"], &["checkpoint.keep", "-1"]);
    refused(
        &toml,
        &["checkpoint.autosave=true"],
        &["checkpoint.autosave: unknown key", "autoresume"],
    );
    refused(
        &toml,
        &["train.nonfinite_loss=\"ignore\""],
        &["train.nonfinite_loss", "expected \"stop\" or \"skip\""],
    );
}

#[test]
fn model_norm_and_dropout_are_checked_against_the_model() {
    let mut toml = TrainerToml::new("bad");
    toml.model = "name = \"mlp\"\nnorm = \"group\"".to_owned();
    refused(
        &toml,
        &[],
        &[
            "model.norm",
            "model \"mlp\" can be built with \"none\" or \"layer\", not \"group\"",
        ],
    );
    toml.model = "name = \"cnn\"\ndropout = 0.5".to_owned();
    refused(
        &toml,
        &[],
        &["model.dropout", "only applies to model \"mlp\""],
    );
    toml.model = "name = \"mlp\"\ndropout = 1.0".to_owned();
    refused(&toml, &[], &["model.dropout", "got 1"]);
    toml.model = "name = \"cnn\"\nnorm = \"batchh\"".to_owned();
    refused(&toml, &[], &["model.norm", "did you mean \"batch\"?"]);
}
