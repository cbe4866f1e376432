//! The rotary plugin on the host's GPT-2.
//!
//! - In-process: the real `librotary.so` changes every attention block into a
//!   `gpt2_attention_ext` with rotary positions over the same tensors and zeroes the position
//!   table; each attention module (several batch shapes, lengths beyond `n_positions`) and the
//!   whole model's logits equal a float64 PyTorch reference that rotates with Hugging Face's
//!   GPT-NeoX `apply_rotary_pos_emb` (`tests/support/gpt_reference.py`), full and partial
//!   rotation.
//! - Through the binary: training learns, the checkpoint rebuilds with the plugin's modules,
//!   bad settings and ALiBi (either order) are refused naming them, a model trained at 32
//!   positions evaluates at 64 with `max_sequence_length`, and the export keeps
//!   `gpt2_attention_ext` and matches the PyTorch twins.
//!
//! The settings its plugin refuses are a row of the method table (tests/methods/table.rs).
//! Its export (the file's modules, the PyTorch twins) is the row `rotary_export` of the export
//! table, with this file's `exported` as the method's own assertions.

use serde_json::json;
use tessera::model::Role;
use tessera_plugin_api::tch::Kind;
use tessera_tests::*;

use crate::gpt_models;
use crate::lm_export;
use gpt_models::*;
use lm_export::Export;

/// float32 against float64: the attention's and the model's outputs within this, relative to
/// their scale (measured: about 2e-7).
const TOL: f64 = 1e-5;

/// The tree after the surgery and the reference checks for one configuration.
fn check(model_lines: &str, settings: &str, dims: i64, base: f64, rows: i64, long: i64) {
    let dir = TempDir::new("rotary-model");
    let toml = with_model(gpt("rotary-model", &[("rotary", settings)]), model_lines);
    let trainer = trainer(&dir, &toml);
    let model = trainer.model();
    let root = node(model, "").1;
    let (n_head, n_embd) = (root["n_head"], root["n_embd"]);
    for i in 0..root["n_layer"] as usize {
        let path = format!("transformer.h.{i}.attn");
        let (kind, attrs) = node(model, &path);
        assert_eq!(kind, "gpt2_attention_ext", "{path}");
        assert_eq!(attrs["rotary"], 1.0);
        assert_eq!(attrs["rotary_dims"], dims as f64);
        assert_eq!(attrs["rotary_base"], base);
        assert_eq!(attrs["qk_norm"], 0.0);
        assert_eq!((attrs["n_head"], attrs["n_embd"]), (n_head, n_embd));
        // The same four tensors, trainable, under the same names.
        for leaf in [
            "c_attn.weight",
            "c_attn.bias",
            "c_proj.weight",
            "c_proj.bias",
        ] {
            let e = model
                .params
                .get(&format!("{path}.{leaf}"))
                .unwrap_or_else(|| panic!("no {path}.{leaf}"));
            assert_eq!(e.role, Role::Parameter);
        }
    }
    assert_eq!(node(model, "transformer.wpe").0, "rotary_zero_positions");
    let wpe = model.params.get("transformer.wpe.weight").expect("wpe");
    assert_eq!(wpe.role, Role::Buffer, "the zero position table is trained");
    assert_eq!(wpe.tensor.size(), [rows, n_embd as i64]);
    assert_eq!(wpe.tensor.abs().sum(Kind::Double).double_value(&[]), 0.0);

    randomize(model, 0.3, 21);
    let spec = json!({
        "n_head": n_head, "n_layer": root["n_layer"],
        "rotary": {"base": base, "dims": dims}, "qk_norm": false,
    });
    let shapes = [(1, 1), (2, 7), (3, long)];
    let last = format!("transformer.h.{}.attn", root["n_layer"] - 1.0);
    let Some(m) = check_module(model, &last, "attention", &spec, &shapes, Vec::new(), TOL) else {
        return;
    };
    let l = check_model(model, &spec, 2, long, TOL).expect("torch imports");
    println!("rotary ({settings:?}) vs PyTorch: attention {m:e}, logits {l:e}");
}

#[test]
fn the_plugin_on_the_host_gpt2_equals_the_pytorch_reference() {
    // Every feature rotated (head width 16), the default base; 40 tokens.
    check(
        "n_layer = 2\nn_head = 2\nn_embd = 32\nn_positions = 64",
        "",
        16,
        10000.0,
        64,
        40,
    );
    // A quarter of a head width of 12 (3 features, rounded down to an even 2), another base,
    // sequences beyond n_positions through max_sequence_length.
    check(
        "n_layer = 2\nn_head = 4\nn_embd = 48\nn_positions = 16",
        "fraction = 0.25\nbase = 500.0\nmax_sequence_length = 48",
        2,
        500.0,
        48,
        40,
    );
    // Half of a head width of 8.
    check(
        "n_layer = 1\nn_head = 3\nn_embd = 24\nn_positions = 32",
        "fraction = 0.5",
        4,
        10000.0,
        32,
        31,
    );
}

#[test]
fn training_with_rotary_learns_and_the_checkpoint_rebuilds_it() {
    let dir = TempDir::new("rotary-binary");
    let (record, lines, stderr) = run(&dir, &gpt("rotary", &[("rotary", "")]), &[]);
    assert!(
        stderr.contains("rotary: 2 attention blocks rotate q and k (base 10000, 16 of 16 features")
            && stderr.contains("transformer.wpe zeroed and frozen (64 positions)"),
        "{stderr}"
    );
    assert_trains(&record, &lines);
    // The plain GPT-2 trains differently.
    let dir2 = TempDir::new("rotary-plain");
    let (_, plain, _) = run(&dir2, &gpt("plain", &[]), &[]);
    assert_ne!(losses(&plain), losses(&lines));
    // The checkpoint rebuilds with the plugin's modules, its position table still zero.
    let trainer = rebuilt(&dir, "rotary");
    let k = kinds(trainer.model());
    assert_eq!(k["transformer.h.0.attn"], "gpt2_attention_ext");
    assert_eq!(k["transformer.h.1.attn"], "gpt2_attention_ext");
    assert_eq!(k["transformer.wpe"], "rotary_zero_positions");
    let wpe = &trainer
        .model()
        .params
        .get("transformer.wpe.weight")
        .unwrap()
        .tensor;
    assert_eq!(wpe.abs().sum(Kind::Double).double_value(&[]), 0.0);
    let out = tessera(
        &[
            "eval",
            &tessera::checkpoint::list(&run_dir(&dir, "rotary").join("checkpoints"))
                .last()
                .unwrap()
                .display()
                .to_string(),
        ],
        dir.path(),
        &[],
    );
    out.assert_success();
}

#[test]
fn too_small_a_fraction_and_alibi_are_refused_naming_them() {
    // 0.1 of 16 features is 1: no pair to rotate (found at init; the settings `create` refuses
    // are in tests/methods/table.rs).
    let dir = TempDir::new("rotary-settings");
    gpt("bad", &[("rotary", "fraction = 0.1")]).write_to(&dir);
    train(&dir, &[], &[]).assert_failure(&["fraction", "at least 2"]);
    // Both replace the position handling: refused whichever comes first in the file (rotary
    // runs after ALiBi at init and sees its modules).
    for order in [["alibi", "rotary"], ["rotary", "alibi"]] {
        let dir = TempDir::new("rotary-alibi");
        let plugins: Vec<(&str, &str)> = order
            .iter()
            .map(|p| {
                (
                    *p,
                    if *p == "alibi" {
                        "max_sequence_length = 64\ntrain_sequence_length_scaling = 1.0"
                    } else {
                        ""
                    },
                )
            })
            .collect();
        gpt("both", &plugins).write_to(&dir);
        train(&dir, &[], &[])
            .assert_failure(&["rotary cannot be combined with alibi", "ALiBi's alibi_"]);
    }
}

#[test]
fn trained_at_32_positions_the_model_evaluates_at_64_with_max_sequence_length() {
    let long = |run: &str, settings: &str| {
        let mut toml = gpt(run, &[("rotary", settings)]);
        toml.model = toml.model.replace("n_positions = 64", "n_positions = 32");
        toml.data = text_data(32, Some(64));
        toml
    };
    let dir = TempDir::new("rotary-long");
    let (record, _, _) = run(&dir, &long("long", "max_sequence_length = 64"), &[]);
    let p = record["final_perplexity"].as_f64().expect("perplexity");
    assert!(p.is_finite() && p < 64.0, "{p}");
    // Without it the zero table has the model's 32 rows: 64 is refused, naming the setting.
    let dir = TempDir::new("rotary-short");
    long("short", "").write_to(&dir);
    train(&dir, &[], &[]).assert_failure(&["64", "max_sequence_length 32"]);
}

/// The method's own part of its export check (`table::rotary_export`): the attention keeps its
/// rotary dimensions and dropout, and the zero table folds into a plain (max_sequence_length,
/// n_embd) embedding.
pub fn exported(export: &Export) {
    let Export { tensors, modules } = export;
    let attrs = &modules[0]["attrs"];
    assert_eq!(attrs["rotary_dims"].as_f64(), Some(8.0), "{attrs}");
    assert_eq!(attrs["attn_pdrop"].as_f64(), Some(0.1), "{attrs}");
    let wpe = &tensors
        .iter()
        .find(|(n, _)| n == "transformer.wpe.weight")
        .expect("wpe exported")
        .1;
    assert_eq!(wpe.size(), [96, 32]);
    assert_eq!(wpe.abs().sum(Kind::Double).double_value(&[]), 0.0);
}
