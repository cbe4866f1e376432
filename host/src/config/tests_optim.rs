//! Tests of `[optimizer]`: the four rules, `implementation` and `[[optimizer.groups]]`.

use super::error::ErrorKind;
use super::{Config, ConfigError};
use crate::optim::{Adam, GroupSpec, Implementation, Lion, ParamKind, Rule};

use super::tests::MINIMAL;

fn parse(extra: &str) -> Result<Config, ConfigError> {
    super::tests::parse(&format!("{MINIMAL}{extra}"))
}

fn ok(extra: &str) -> Config {
    parse(extra).unwrap_or_else(|e| panic!("expected a valid config, got: {e}"))
}

fn err(extra: &str) -> ConfigError {
    match parse(extra) {
        Ok(c) => panic!("expected an error, got {:?}", c.optimizer),
        Err(e) => e,
    }
}

/// The documented GPT rule: no weight decay for norms, biases and embeddings.
const GPT_RULE: &str = r#"
[optimizer]
name = "adamw"
weight_decay = 0.1

[[optimizer.groups]]
kinds = ["bias", "norm", "embedding"]
weight_decay = 0.0
"#;

#[test]
fn adam_and_lion_read_their_keys_with_defaults() {
    let c = ok("[optimizer]\nname = \"adam\"\nweight_decay = 0.01\nbetas = [0.8, 0.9]\n");
    assert_eq!(
        c.optimizer.rule,
        Rule::Adam(Adam {
            weight_decay: 0.01,
            betas: (0.8, 0.9),
            ..Adam::default()
        })
    );
    let c = ok("[optimizer]\nname = \"lion\"\n");
    assert_eq!(c.optimizer.rule, Rule::Lion(Lion::default()));
    assert_eq!(Lion::default().betas, (0.9, 0.99));
    let c = ok("[optimizer]\nname = \"lion\"\nlr = 3e-5\nweight_decay = 1.0\n");
    assert_eq!(
        c.optimizer.rule,
        Rule::Lion(Lion {
            lr: 3e-5,
            weight_decay: 1.0,
            betas: (0.9, 0.99)
        })
    );
    assert_eq!(c.optimizer.implementation, Implementation::Fused);
    assert!(c.optimizer.groups.is_empty());
}

#[test]
fn implementation_is_fused_or_per_param() {
    let c = ok("[optimizer]\nimplementation = \"per_param\"\n");
    assert_eq!(c.optimizer.implementation, Implementation::PerParam);
    let e = err("[optimizer]\nimplementation = \"foreach\"\n");
    assert_eq!(e.key, "optimizer.implementation");
    assert_eq!(e.kind, ErrorKind::InvalidValue);
    assert!(
        e.message.contains("\"fused\" or \"per_param\""),
        "{}",
        e.message
    );
}

#[test]
fn unknown_names_and_keys_of_another_optimizer_are_errors() {
    let e = err("[optimizer]\nname = \"lamb\"\n");
    assert_eq!(e.key, "optimizer.name");
    assert!(
        e.message
            .contains("\"sgd\", \"adamw\", \"adam\" or \"lion\""),
        "{}",
        e.message
    );
    let e = err("[optimizer]\nname = \"lion\"\neps = 1e-8\n");
    assert_eq!(e.key, "optimizer.eps");
    assert!(
        e.message.contains("not \"lion\"")
            && e.message
                .contains("name, lr, weight_decay, betas, implementation, groups"),
        "{}",
        e.message
    );
    let e = err("[optimizer]\nname = \"adam\"\nmomentum = 0.9\n");
    assert_eq!(e.key, "optimizer.momentum");
}

#[test]
fn the_gpt_rule_is_one_group() {
    let c = ok(GPT_RULE);
    assert_eq!(
        c.optimizer.groups,
        vec![GroupSpec {
            kinds: vec![ParamKind::Bias, ParamKind::Norm, ParamKind::Embedding],
            weight_decay: Some(0.0),
            ..GroupSpec::named("groups[0]")
        }]
    );
    // In run.json (the config serialized) and in TOML.
    let j = serde_json::to_value(&c).expect("config serializes to JSON");
    assert_eq!(j["optimizer"]["name"], "adamw");
    assert_eq!(j["optimizer"]["implementation"], "fused");
    assert_eq!(
        j["optimizer"]["groups"][0]["kinds"],
        serde_json::json!(["bias", "norm", "embedding"])
    );
    assert_eq!(j["optimizer"]["groups"][0]["weight_decay"], 0.0);
    let text = toml::to_string(&c).expect("config serializes to TOML");
    assert!(text.contains("[[optimizer.groups]]"), "{text}");
}

#[test]
fn groups_take_patterns_ndim_names_and_multipliers() {
    let c = ok(r#"
[optimizer]
[[optimizer.groups]]
name = "head"
params = ["fc.*", "classifier.?.weight"]
lr_multiplier = 10.0
[[optimizer.groups]]
ndim = 1
"#);
    let g = &c.optimizer.groups;
    assert_eq!(g.len(), 2);
    assert_eq!(g[0].name, "head");
    assert_eq!(g[0].params, ["fc.*", "classifier.?.weight"]);
    assert_eq!(g[0].lr_multiplier, 10.0);
    assert_eq!(g[0].weight_decay, None);
    assert_eq!(g[1].name, "groups[1]");
    assert_eq!(g[1].ndim, Some(1));
}

#[test]
fn bad_groups_are_errors_naming_the_group() {
    let cases: [(&str, &str, &str); 7] = [
        (
            "[[optimizer.groups]]\nweight_decay = 0.0\n",
            "optimizer.groups.0.params",
            "a selector",
        ),
        (
            "[[optimizer.groups]]\nkinds = [\"layernorm\"]\n",
            "optimizer.groups.0.kinds.0",
            "unknown parameter kind \"layernorm\"",
        ),
        (
            "[[optimizer.groups]]\nparams = [\"a[\"]\n",
            "optimizer.groups.0.params.0",
            "not a valid pattern",
        ),
        (
            "[[optimizer.groups]]\nname = \"x\"\nndim = 1\n[[optimizer.groups]]\nname = \"x\"\nndim = 2\n",
            "optimizer.groups.1.name",
            "another group is named \"x\"",
        ),
        (
            "[[optimizer.groups]]\nname = \"default\"\nndim = 1\n",
            "optimizer.groups.0.name",
            "the parameters no group selects",
        ),
        (
            "[[optimizer.groups]]\nndim = 1\nlr = 0.1\n",
            "optimizer.groups.0.lr",
            "unknown key",
        ),
        (
            "[[optimizer.groups]]\nndim = 1\nlr_multiplier = -1\n",
            "optimizer.groups.0.lr_multiplier",
            ">= 0",
        ),
    ];
    for (text, key, needle) in cases {
        let e = err(&format!("[optimizer]\n{text}"));
        assert_eq!(e.key, key, "{text}: {e}");
        assert!(e.message.contains(needle), "{text}: {e}");
    }
    let e = err("[optimizer]\ngroups = 3\n");
    assert_eq!(e.key, "optimizer.groups");
    assert_eq!(e.kind, ErrorKind::WrongType);
}

/// Every key of `[optimizer]` and `[[optimizer.groups]]` is in `docs/trainer-reference.toml`'s
/// optimizer part, and so is the GPT rule.
#[test]
fn the_reference_documents_the_optimizer_keys_and_the_gpt_rule() {
    use super::section::Section;
    use crate::optim::{AdamW, Sgd};
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/trainer-reference.toml"
    ))
    .unwrap();
    let start = text.find("\n[optimizer]\n").expect("an [optimizer] table");
    let end = start
        + text[start..]
            .find("\n[scheduler]")
            .expect("[scheduler] after it");
    let part = &text[start..end];
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mentions = |key: &str| {
        part.match_indices(key)
            .any(|(i, _)| !part[..i].ends_with(word) && !part[i + key.len()..].starts_with(word))
    };
    let keys = [
        Sgd::KEYS,
        AdamW::KEYS,
        Adam::KEYS,
        Lion::KEYS,
        GroupSpec::KEYS,
        &["name", "implementation", "groups"],
    ];
    for key in keys.iter().flat_map(|k| k.iter()) {
        assert!(
            mentions(key),
            "`{key}` is not in the reference's [optimizer]"
        );
    }
    for name in ["sgd", "adamw", "adam", "lion", "fused", "per_param"] {
        assert!(part.contains(&format!("\"{name}\"")), "{name}");
    }
    // The documented GPT rule, uncommented, reads as one group.
    let rule: String = part
        .lines()
        .skip_while(|l| !l.contains("[[optimizer.groups]]"))
        .take(3)
        .map(|l| format!("{}\n", l.trim_start_matches("# ")))
        .collect();
    let c = ok(&format!("[optimizer]\nname = \"adamw\"\n{rule}"));
    assert_eq!(c.optimizer.groups, ok(GPT_RULE).optimizer.groups);
}
