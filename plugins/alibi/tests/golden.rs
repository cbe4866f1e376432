//! ALiBi against Composer's golden cases (`tests/golden/alibi.*`, `alibi_surgery.*`).
//!
//! - `alibi`: the head slopes (the `f64` tensors and the JSON table) and the causal
//!   `(H, 1, L)` and bidirectional `(1, H, L, L)` bias for every head count in the file.
//! - `alibi_surgery`: the `alibi` buffers of every GPT-2 layer and BERT layer; the GPT-2 of the
//!   file (`gpt2/param/*`) rebuilt as a stand-in module tree on which the plugin's own
//!   [`apply_alibi`] runs; a small functional GPT-2 (test code: embeddings, pre-LN blocks,
//!   `gelu_new` MLP, tied LM head) then runs through the modules the surgery put in and must
//!   give Composer's logits after the surgery (padded batch), layer 0's attention
//!   probabilities, the logits at `T = 24 > n_positions`, and — with the original attention —
//!   the logits before and with zeroed positions only.

use std::collections::BTreeMap;

use alibi::{
    alibi_attention, alibi_attention_with, alibi_head_slopes, apply_alibi,
    bidirectional_alibi_bias, causal_alibi_bias, AlibiModule, AttentionOptions,
    Gpt2AttentionWeights, ALIBI_ATTENTION, EMBEDDING, GPT2_ATTENTION, WPE_PATH, ZERO_POSITIONS,
};
use tessera_plugin_api::kit::{StandIn, SurgeryModel};
use tessera_plugin_api::tch::{Device, Kind, Tensor};
use tessera_plugin_api::testing::golden::{assert_close, Golden};
use tessera_plugin_api::Module;

/// Float results: about 1e-6 relative (golden README), reductions ordered differently.
const RTOL: f64 = 1e-5;
const ATOL: f64 = 1e-5;

fn check(what: &str, got: &Tensor, want: &Tensor, rtol: f64, atol: f64) {
    let err = (got.to_kind(Kind::Double) - want.to_kind(Kind::Double))
        .abs()
        .max()
        .double_value(&[]);
    eprintln!("{what}: max abs error {err:e}");
    assert_close(what, got, want, rtol, atol);
}

fn suffix_number(name: &str, key: &str) -> usize {
    name.rsplit_once(&format!("{key}="))
        .and_then(|(_, n)| n.parse().ok())
        .unwrap_or_else(|| panic!("`{name}` has no `{key}=<n>`"))
}

#[test]
fn slopes_and_bias_match_composer_for_every_head_count() {
    let g = Golden::load("alibi");
    let mut seen = 0;
    for name in g.names_with_role("output") {
        let want = g.tensor(&name);
        let heads = suffix_number(&name, "heads");
        let slopes = alibi_head_slopes(heads).expect("slopes");
        assert_eq!(slopes.len(), heads);
        let opts = (Kind::Float, Device::Cpu);
        if name.starts_with("slopes_f64/") {
            let got = Tensor::from_slice(&slopes);
            check(&name, &got, want, 0.0, 0.0);
            let table: Vec<f64> =
                serde_json::from_value(g.json["results"]["slopes"][heads.to_string()].clone())
                    .expect("results.slopes table");
            // serde_json's default float parser may be one ulp off: the tensor above is exact.
            for (s, t) in slopes.iter().zip(&table) {
                assert!(
                    (s - t).abs() <= 4.0 * f64::EPSILON * t.abs(),
                    "{name}: {s} vs {t}"
                );
            }
            assert_eq!(slopes.len(), table.len(), "{name}: the JSON table");
        } else if name.starts_with("causal/") {
            let got = causal_alibi_bias(&slopes, want.size()[2], opts).expect("causal bias");
            check(&name, &got, want, 0.0, 0.0);
        } else if name.starts_with("noncausal/") {
            let got =
                bidirectional_alibi_bias(&slopes, want.size()[2], opts).expect("bidirectional");
            check(&name, &got, want, 0.0, 0.0);
        } else {
            panic!("unexpected output `{name}`");
        }
        seen += 1;
    }
    assert!(seen >= 3, "no cases read");
}

#[test]
fn zero_heads_is_an_error() {
    assert!(alibi_head_slopes(0).is_err());
}

// ---------------------------------------------------------------------------------------------
// alibi_surgery

/// The golden GPT-2's tensors (`gpt2/param/*`), by name, trainable.
fn golden_params(g: &Golden) -> BTreeMap<String, Tensor> {
    g.names_with_role("param")
        .into_iter()
        .filter_map(|name| {
            let rest = name.strip_prefix("gpt2/param/")?.to_owned();
            Some((rest, g.tensor(&name).copy().set_requires_grad(true)))
        })
        .collect()
}

/// The golden GPT-2 as the host's module contract shows it: `transformer.wpe` (`embedding`) and
/// `transformer.h.{i}.attn` (`gpt2_attention`), holding those modules' tensors of `params`
/// (shared, not copied).
fn standin(params: &BTreeMap<String, Tensor>, n_head: i64) -> StandIn {
    let wpe_name = format!("{WPE_PATH}.weight");
    let wpe = params[&wpe_name].size();
    let mut model = StandIn::new(0).module(
        WPE_PATH,
        EMBEDDING,
        &[],
        vec![("weight", params[&wpe_name].shallow_clone())],
    );
    for i in 0..n_layers(params) {
        let path = format!("transformer.h.{i}.attn");
        let tensors = [
            "c_attn.weight",
            "c_attn.bias",
            "c_proj.weight",
            "c_proj.bias",
        ]
        .into_iter()
        .map(|n| (n, params[&format!("{path}.{n}")].shallow_clone()))
        .collect();
        model.add_module(
            &path,
            GPT2_ATTENTION,
            &[
                ("n_head", n_head as f64),
                ("n_embd", wpe[1] as f64),
                ("n_positions", wpe[0] as f64),
                ("attn_pdrop", 0.0),
                ("resid_pdrop", 0.0),
            ],
            tensors,
        );
    }
    model
}

fn n_layers(params: &BTreeMap<String, Tensor>) -> usize {
    (0..)
        .take_while(|i| params.contains_key(&format!("transformer.h.{i}.ln_1.weight")))
        .count()
}

/// The stand-in's tensor `name`.
fn tensor<'a>(model: &'a StandIn, name: &str) -> &'a Tensor {
    model
        .tensor(name)
        .unwrap_or_else(|| panic!("the stand-in has no tensor `{name}`"))
}

/// The module the surgery put in at `path`.
fn replaced<'a>(model: &'a StandIn, path: &str) -> &'a AlibiModule {
    model
        .replaced_as::<AlibiModule>(path)
        .unwrap_or_else(|| panic!("nothing replaced `{path}`"))
}

fn layer_norm(x: &Tensor, p: &BTreeMap<String, Tensor>, name: &str) -> Tensor {
    let n = *x.size().last().expect("features");
    x.layer_norm(
        [n],
        Some(&p[&format!("{name}.weight")]),
        Some(&p[&format!("{name}.bias")]),
        1e-5,
        false,
    )
}

/// How the test GPT-2 runs attention and positions.
enum Variant<'a> {
    /// Hugging Face's eager attention (no bias) with learned positions (`zero_positions`: with
    /// `wpe` zeroed).
    Original { zero_positions: bool },
    /// The modules the surgery put in.
    Alibi(&'a StandIn),
}

/// GPT2LMHeadModel's forward (eval) on `ids` `(B, T)` with an optional padding mask; returns the
/// logits and layer 0's attention probabilities.
fn gpt2(
    p: &BTreeMap<String, Tensor>,
    heads: i64,
    ids: &Tensor,
    mask: Option<&Tensor>,
    variant: &Variant<'_>,
) -> (Tensor, Tensor) {
    let t = ids.size()[1];
    let positions = Tensor::arange(t, (Kind::Int64, Device::Cpu));
    let tokens = p["transformer.wte.weight"].index_select(0, &ids.flatten(0, -1));
    let tokens = tokens.view([ids.size()[0], t, -1]);
    let pos = match variant {
        Variant::Original {
            zero_positions: false,
        } => p["transformer.wpe.weight"].index_select(0, &positions),
        Variant::Original {
            zero_positions: true,
        } => p["transformer.wpe.weight"]
            .index_select(0, &positions)
            .zeros_like(),
        Variant::Alibi(fake) => match replaced(fake, WPE_PATH) {
            AlibiModule::Positions(m) => m.forward(&positions, false).expect("positions"),
            other => panic!("wpe became {}", other.kind()),
        },
    };
    let mut x = tokens + pos;
    let mut probs0 = None;
    for i in 0..n_layers(p) {
        let path = format!("transformer.h.{i}.attn");
        let h = layer_norm(&x, p, &format!("transformer.h.{i}.ln_1"));
        let (a, probs) = match variant {
            Variant::Original { .. } => {
                let w = Gpt2AttentionWeights {
                    c_attn_weight: p[&format!("{path}.c_attn.weight")].shallow_clone(),
                    c_attn_bias: p[&format!("{path}.c_attn.bias")].shallow_clone(),
                    c_proj_weight: p[&format!("{path}.c_proj.weight")].shallow_clone(),
                    c_proj_bias: p[&format!("{path}.c_proj.bias")].shallow_clone(),
                };
                let zero_bias = Tensor::zeros([heads, 1, t], (Kind::Float, Device::Cpu));
                alibi_attention_with(
                    &h,
                    &w,
                    heads,
                    &zero_bias,
                    AttentionOptions {
                        padding_mask: mask,
                        ..AttentionOptions::default()
                    },
                )
                .expect("attention")
            }
            Variant::Alibi(fake) => match replaced(fake, &path) {
                AlibiModule::Attention(m) => {
                    // The module's fused SDPA path (what the model runs) and Composer's
                    // explicit matmul/softmax (which also gives the probabilities).
                    let fused = m.forward_with(&h, mask, false).expect("attention");
                    let (explicit, probs) =
                        m.forward_with_probs(&h, mask, false).expect("attention");
                    check(
                        &format!("{path}: SDPA == explicit"),
                        &fused,
                        &explicit,
                        0.0,
                        1e-6,
                    );
                    (fused, probs)
                }
                other => panic!("attention became {}", other.kind()),
            },
        };
        if i == 0 {
            probs0 = Some(probs);
        }
        x += a;
        let h = layer_norm(&x, p, &format!("transformer.h.{i}.ln_2"));
        let mlp = format!("transformer.h.{i}.mlp");
        let inner = (h.matmul(&p[&format!("{mlp}.c_fc.weight")]) + &p[&format!("{mlp}.c_fc.bias")])
            .gelu("tanh");
        x += inner.matmul(&p[&format!("{mlp}.c_proj.weight")]) + &p[&format!("{mlp}.c_proj.bias")];
    }
    let x = layer_norm(&x, p, "transformer.ln_f");
    let logits = x.matmul(&p["lm_head.weight"].tr());
    (logits, probs0.expect("at least one layer"))
}

#[test]
fn the_alibi_buffers_of_the_surgery_match_composer() {
    let g = Golden::load("alibi_surgery");
    let max_len = g.json["hyperparameters"]["max_sequence_length"]
        .as_i64()
        .expect("hyperparameters.max_sequence_length");
    let mut seen = 0;
    for name in g.names_with_role("output") {
        let want = g.tensor(&name);
        let opts = (Kind::Float, Device::Cpu);
        if name.starts_with("gpt2/after/") && name.ends_with(".attn.alibi") {
            let s = want.size();
            assert_eq!(s[2], max_len, "{name}");
            let slopes = alibi_head_slopes(s[0] as usize).expect("slopes");
            check(
                &name,
                &causal_alibi_bias(&slopes, max_len, opts).expect("bias"),
                want,
                0.0,
                0.0,
            );
            seen += 1;
        } else if name.starts_with("bert/after/") && name.ends_with(".alibi") {
            let s = want.size();
            assert_eq!(s[2], max_len, "{name}");
            let slopes = alibi_head_slopes(s[1] as usize).expect("slopes");
            let got = bidirectional_alibi_bias(&slopes, max_len, opts).expect("bias");
            check(&name, &got, want, 0.0, 0.0);
            seen += 1;
        }
    }
    assert!(seen >= 2, "no alibi buffers in the file");
}

#[test]
fn surgery_on_the_golden_gpt2_reproduces_composer() {
    let g = Golden::load("alibi_surgery");
    let max_len = g.json["hyperparameters"]["max_sequence_length"]
        .as_i64()
        .expect("hyperparameters.max_sequence_length");
    let n_head = g.tensor("gpt2/after/h.0.attn.alibi").size()[0];
    let ids = g.tensor("gpt2/input_ids");
    let mask = g.tensor("gpt2/attention_mask");
    let ids_long = g.tensor("gpt2/input_ids_long");

    let original = golden_params(&g);
    let mut fake = standin(&original, n_head);

    // The test GPT-2 itself, before any surgery.
    let (before, _) = gpt2(
        &original,
        n_head,
        ids,
        Some(mask),
        &Variant::Original {
            zero_positions: false,
        },
    );
    check(
        "gpt2/before/logits",
        &before,
        g.tensor("gpt2/before/logits"),
        RTOL,
        ATOL,
    );
    let (zero_pos, _) = gpt2(
        &original,
        n_head,
        ids,
        Some(mask),
        &Variant::Original {
            zero_positions: true,
        },
    );
    for name in ["gpt2/zero_positions_only/logits", "gpt2/sdpa_after/logits"] {
        check(name, &zero_pos, g.tensor(name), RTOL, ATOL);
    }

    let layers = n_layers(&original);
    let outcome = apply_alibi(&mut fake, max_len).expect("surgery");
    assert_eq!(outcome.attention.len(), layers);
    assert!(outcome.positions);

    // Tensors: the attention blocks keep the very same tensors (shared storage, still trained)
    // plus an `alibi` buffer; wpe is a zero, frozen (max_sequence_length, n_embd) table.
    for i in 0..layers {
        let path = format!("transformer.h.{i}.attn");
        for n in [
            "c_attn.weight",
            "c_attn.bias",
            "c_proj.weight",
            "c_proj.bias",
        ] {
            let full = format!("{path}.{n}");
            assert_eq!(
                tensor(&fake, &full).data_ptr(),
                original[&full].data_ptr(),
                "{full}"
            );
            assert!(
                tensor(&fake, &full).requires_grad(),
                "{full} must stay trainable"
            );
        }
        let alibi = tensor(&fake, &format!("{path}.alibi"));
        assert!(!alibi.requires_grad());
        check(
            &format!("{path}.alibi"),
            alibi,
            g.tensor(&format!("gpt2/after/h.{i}.attn.alibi")),
            0.0,
            0.0,
        );
        assert_eq!(fake.kind(&path), Some(ALIBI_ATTENTION), "{path}");
    }
    let wpe = tensor(&fake, &format!("{WPE_PATH}.weight"));
    let want_wpe = g.tensor("gpt2/after/wpe");
    check("gpt2/after/wpe", wpe, want_wpe, 0.0, 0.0);
    let frozen = !g.json["results"]["gpt2_wpe"]["requires_grad"]
        .as_bool()
        .expect("results.gpt2_wpe.requires_grad");
    assert_eq!(!wpe.requires_grad(), frozen);

    // Outputs through the surgery's modules.
    let (after, probs) = gpt2(&original, n_head, ids, Some(mask), &Variant::Alibi(&fake));
    check(
        "gpt2/after/logits",
        &after,
        g.tensor("gpt2/after/logits"),
        RTOL,
        ATOL,
    );
    check(
        "gpt2/after/attn_probs_layer0",
        &probs,
        g.tensor("gpt2/after/attn_probs_layer0"),
        RTOL,
        ATOL,
    );
    check(
        "gpt2/sdpa_after/logits_output_attentions",
        &after,
        g.tensor("gpt2/sdpa_after/logits_output_attentions"),
        RTOL,
        ATOL,
    );
    assert!(
        ids_long.size()[1] > original["transformer.wpe.weight"].size()[0],
        "the long input must exceed n_positions"
    );
    let (long, _) = gpt2(&original, n_head, ids_long, None, &Variant::Alibi(&fake));
    check(
        "gpt2/after/logits_long",
        &long,
        g.tensor("gpt2/after/logits_long"),
        RTOL,
        ATOL,
    );

    // The public functional form on layer 0 (no padding: compare the unpadded sample).
    let h0 = {
        let tokens = original["transformer.wte.weight"].index_select(0, &ids_long.flatten(0, -1));
        layer_norm(&tokens.unsqueeze(0), &original, "transformer.h.0.ln_1")
    };
    let slopes = alibi_head_slopes(n_head as usize).expect("slopes");
    let p = |n: &str| &original[&format!("transformer.h.0.attn.{n}")];
    let functional = alibi_attention(
        &h0,
        p("c_attn.weight"),
        p("c_attn.bias"),
        p("c_proj.weight"),
        p("c_proj.bias"),
        n_head,
        &slopes,
    )
    .expect("alibi_attention");
    let module = match replaced(&fake, "transformer.h.0.attn") {
        AlibiModule::Attention(m) => m.forward(&h0, false).expect("module"),
        other => panic!("attention became {}", other.kind()),
    };
    check(
        "alibi_attention == module (T = 24)",
        &functional,
        &module,
        0.0,
        1e-6,
    );

    // Idempotence: a second application finds nothing to change.
    let nodes = fake.modules().expect("modules");
    let again = apply_alibi(&mut fake, max_len).expect("second surgery");
    assert!(again.attention.is_empty() && !again.positions);
    let after = fake.modules().expect("modules");
    assert_eq!(after, nodes);
    let kinds: Vec<&str> = after.iter().map(|n| n.kind.as_str()).collect();
    assert!(kinds.contains(&ZERO_POSITIONS));

    // Export: the attention blocks are kept; wpe folds into a plain zero embedding.
    let all_replaced: Vec<(&str, &AlibiModule)> = after
        .iter()
        .filter_map(|n| Some((n.path.as_str(), fake.replaced_as::<AlibiModule>(&n.path)?)))
        .collect();
    assert_eq!(
        all_replaced.len(),
        layers + 1,
        "every attention block and wpe"
    );
    for (path, m) in all_replaced {
        let answer = m.export().expect("export");
        match m {
            AlibiModule::Attention(_) | AlibiModule::BertAttention(_) => {
                assert!(answer.is_none(), "{path} must be kept")
            }
            AlibiModule::Positions(_) => {
                let tensors = answer.expect("wpe folds");
                assert_eq!(tensors.len(), 1);
                assert_eq!(tensors[0].0, "weight");
                check("exported wpe", &tensors[0].1, want_wpe, 0.0, 0.0);
            }
        }
    }
}

#[test]
fn sequences_beyond_max_sequence_length_are_errors() {
    let g = Golden::load("alibi_surgery");
    let n_head = g.tensor("gpt2/after/h.0.attn.alibi").size()[0];
    let mut fake = standin(&golden_params(&g), n_head);
    let ids_long = g.tensor("gpt2/input_ids_long");
    let short = ids_long.size()[1] - 1;
    apply_alibi(&mut fake, short).expect("surgery");
    let c = tensor(&fake, &format!("{WPE_PATH}.weight")).size()[1];
    let x = Tensor::zeros([1, short + 1, c], (Kind::Float, Device::Cpu));
    let e = replaced(&fake, "transformer.h.0.attn")
        .forward(&x, false)
        .expect_err("too long");
    assert!(e.message().contains("max_sequence_length"), "{e}");
    let positions = Tensor::arange(short + 1, (Kind::Int64, Device::Cpu));
    let e = replaced(&fake, WPE_PATH)
        .forward(&positions, false)
        .expect_err("too long");
    assert!(e.message().contains("max_sequence_length"), "{e}");
}
