//! The five GPT-2 architecture plugins of modded-nanogpt together: rotary, qk_norm,
//! relu_squared, logit_softcap and zero_init_projections (each alone: tests/methods/rotary.rs, ...;
//! on two ranks: tests/distributed/distributed.rs).
//!
//! - In-process: the model with all five equals the float64 PyTorch reference
//!   (`tests/support/gpt_reference.py`).
//! - Through the binary: a run killed with `kill -9` and resumed writes the straight run's
//!   checkpoints bit for bit (with dropout, so libtorch's generator is in them); the run trains
//!   under `amp_bf16` and `amp_fp16` autocast (q and k normalised and rotated in float32 and
//!   cast back, the capped logits in float32).
//!
//! Its kill -9 resume is a row of the method table, and its export (the three kinds of module
//! kept, the PyTorch twins matched: Hugging Face's GPT2LMHeadModel and the plain one) a row of
//! the export table (tests/methods/table.rs, `modded_nanogpt_export`).

use serde_json::json;
use tessera_tests::*;

use crate::gpt_models;
use gpt_models::*;

/// The five, in an order that is not the one they run in at `init`.
const FIVE: [(&str, &str); 5] = [
    ("zero_init_projections", ""),
    ("logit_softcap", "cap = 15.0"),
    ("qk_norm", ""),
    ("relu_squared", ""),
    ("rotary", ""),
];

#[test]
fn the_five_together_equal_the_pytorch_reference() {
    let dir = TempDir::new("modded-model");
    let built = trainer(&dir, &gpt("modded", &FIVE));
    let model = built.model();
    let k = kinds(model);
    assert_eq!(k["transformer.h.0.attn"], "gpt2_attention_ext");
    assert_eq!(k["transformer.h.0.mlp"], "relu_squared_gpt2_mlp");
    assert_eq!(k["transformer.wpe"], "rotary_zero_positions");
    assert_eq!(k["lm_head"], "logit_softcap_lm_head");
    let attrs = node(model, "transformer.h.1.attn").1;
    assert_eq!((attrs["rotary"], attrs["qk_norm"]), (1.0, 1.0));
    randomize(model, 0.3, 12);
    let spec = json!({
        "n_head": 2, "n_layer": 2, "rotary": {"base": 10000.0, "dims": 16},
        "qk_norm": true, "relu_squared": true, "cap": 15.0, "tied": true,
    });
    if let Some(l) = check_model(model, &spec, 3, 32, 1e-5) {
        println!("the five together vs PyTorch: logits {l:e}");
    }
}

#[test]
fn the_five_train_under_autocast() {
    for precision in ["amp_bf16", "amp_fp16"] {
        let dir = TempDir::new("modded-amp");
        let mut toml = gpt(precision, &FIVE);
        toml.precision = Some(precision.to_owned());
        let (record, lines, _) = run(&dir, &toml, &[]);
        assert_trains(&record, &lines);
    }
}
