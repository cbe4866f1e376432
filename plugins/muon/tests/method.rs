//! The method through the test host: selection, claiming, skipped steps, state.

use muon::{select_parameters, Muon, MuonConfig, STATE_FORMAT_VERSION};
use tessera_plugin_api::abi::{MethodState, ModuleInfo, ParamInfo};
use tessera_plugin_api::tch::{Kind, Tensor};
use tessera_plugin_api::testing::{settings, settings_for, RandomSource, TestHost};
use tessera_plugin_api::{boxed_method, keys, Event, State};

fn param(name: &str, shape: &[i64]) -> ParamInfo {
    ParamInfo {
        name: name.into(),
        shape: shape.to_vec().into(),
        buffer: false,
        trainable: true,
    }
}

fn module(path: &str, kind: &str, params: &[&str]) -> ModuleInfo {
    ModuleInfo {
        path: path.into(),
        kind: kind.into(),
        attrs: Vec::new().into(),
        params: params.iter().map(|p| (*p).into()).collect(),
    }
}

/// A GPT-like tree with an untied head.
fn gpt() -> (Vec<ParamInfo>, Vec<ModuleInfo>) {
    let params = vec![
        param("wte.weight", &[64, 8]),
        param("h.0.attn.c_attn.weight", &[8, 24]),
        param("h.0.attn.c_attn.bias", &[24]),
        param("h.0.mlp.c_fc.weight", &[8, 32]),
        param("h.0.ln_1.weight", &[8]),
        param("lm_head.weight", &[64, 8]),
    ];
    let modules = vec![
        module("", "gpt2_lm_head_model", &[]),
        module("wte", "embedding", &["wte.weight"]),
        module(
            "h.0.attn",
            "gpt2_attention",
            &["h.0.attn.c_attn.weight", "h.0.attn.c_attn.bias"],
        ),
        module("h.0.mlp", "gpt2_mlp", &["h.0.mlp.c_fc.weight"]),
        module("h.0.ln_1", "layer_norm", &["h.0.ln_1.weight"]),
        module("lm_head", "linear", &["lm_head.weight"]),
    ];
    (params, modules)
}

fn config(json: &str) -> MuonConfig {
    MuonConfig::from_settings(&settings_for::<Muon>(json)).unwrap()
}

#[test]
fn the_default_selection_leaves_embeddings_head_and_vectors_out() {
    let (params, modules) = gpt();
    let selected = select_parameters(&params, &modules, &config("{}")).unwrap();
    assert_eq!(selected, ["h.0.attn.c_attn.weight", "h.0.mlp.c_fc.weight"]);
    let only_mlp = config(r#"{"exclude": ["*.attn.*"]}"#);
    assert_eq!(
        select_parameters(&params, &modules, &only_mlp).unwrap(),
        ["h.0.mlp.c_fc.weight"]
    );
    let with_head = config(r#"{"include": ["h.*", "lm_head.*"]}"#);
    assert_eq!(
        select_parameters(&params, &modules, &with_head).unwrap(),
        [
            "h.0.attn.c_attn.weight",
            "h.0.mlp.c_fc.weight",
            "lm_head.weight"
        ]
    );
    let none = select_parameters(&params, &modules, &config(r#"{"exclude": ["h.*"]}"#));
    assert!(none
        .unwrap_err()
        .message()
        .contains("no parameter selected"));
    let unmatched = select_parameters(&params, &modules, &config(r#"{"include": ["x.*"]}"#));
    assert!(unmatched.unwrap_err().message().contains("`include`"));
}

#[test]
fn settings_are_checked_naming_the_key() {
    for (json, key) in [
        (r#"{"variant": "sgd"}"#, "variant"),
        (r#"{"momentum": 1.0}"#, "momentum"),
        (r#"{"ns_steps": 0}"#, "ns_steps"),
        (r#"{"adjust_lr": "x"}"#, "adjust_lr"),
        (
            r#"{"variant": "keller", "adjust_lr": "original"}"#,
            "adjust_lr",
        ),
        (r#"{"ns_coefficients": [1, 2]}"#, "ns_coefficients"),
        (r#"{"include": ["[" ]}"#, "include"),
        (r#"{"lr": -1}"#, "lr"),
    ] {
        let err = MuonConfig::from_settings(&settings_for::<Muon>(json)).unwrap_err();
        assert!(err.message().contains(key), "{json}: {err}");
    }
    let keller = config(r#"{"variant": "keller"}"#);
    assert_eq!((keller.lr, keller.weight_decay), (0.02, 0.0));
    let torch = config("{}");
    assert_eq!(
        (torch.lr, torch.weight_decay, torch.momentum),
        (1e-3, 0.1, 0.95)
    );
}

/// A host with a matrix `w` (4×6) and a vector `b`, both with gradients.
fn host() -> TestHost {
    let mut host = TestHost::new(RandomSource::Seeded(0));
    for (name, shape) in [("w", &[4i64, 6][..]), ("b", &[4][..])] {
        let p = Tensor::randn(shape, (Kind::Float, tessera_plugin_api::tch::Device::Cpu))
            .set_requires_grad(true);
        (&p * Tensor::randn(shape, (Kind::Float, tessera_plugin_api::tch::Device::Cpu)))
            .sum(Kind::Float)
            .backward();
        host.params.insert(name.to_owned(), p);
    }
    host
}

fn state(m: &tessera_plugin_api::abi::MethodBox) -> State {
    State::from(m.state().into_result().expect("state"))
}

#[test]
fn it_claims_the_matrix_steps_it_and_skips_a_flagged_step() {
    let mut host = host();
    let mut m = boxed_method::<Muon>(&settings(r#"{"lr": 0.1}"#)).unwrap();
    host.fire(&mut m, Event::INIT).unwrap();
    assert_eq!(host.claimed, ["w"]);
    let before = host.params["w"].copy();
    // A skipped step: nothing moves, the momentum stays zero.
    host.tensors
        .insert(keys::FOUND_INF.to_owned(), Tensor::from(1.0f32));
    host.fire(&mut m, Event::OPTIMIZER_STEP).unwrap();
    assert!(host.params["w"].equal(&before));
    let s = state(&m);
    assert_eq!(s.format_version, STATE_FORMAT_VERSION);
    assert_eq!(s.tensors.len(), 1);
    assert_eq!(s.tensors[0].0, "w");
    assert_eq!(
        s.tensors[0].1.abs().sum(Kind::Double).double_value(&[]),
        0.0
    );
    // A taken step moves the matrix by about lr (an orthogonalized update), never the vector.
    host.tensors
        .insert(keys::FOUND_INF.to_owned(), Tensor::from(0.0f32));
    let bias = host.params["b"].copy();
    host.fire(&mut m, Event::OPTIMIZER_STEP).unwrap();
    let moved = (&host.params["w"] - &before).abs().max().double_value(&[]);
    assert!(moved > 0.01 && moved < 0.2, "{moved}");
    assert!(host.params["b"].equal(&bias));
    // The state round-trips into a fresh method, which then steps as the first one does.
    let saved = state(&m);
    let mut other = boxed_method::<Muon>(&settings(r#"{"lr": 0.1}"#)).unwrap();
    let mut host2 = TestHost::new(RandomSource::Seeded(0));
    host2.params = host
        .params
        .iter()
        .map(|(k, v)| (k.clone(), v.shallow_clone()))
        .collect();
    host2.fire(&mut other, Event::INIT).unwrap();
    other
        .load_state(MethodState::from(saved))
        .into_result()
        .unwrap();
    let restored = state(&other);
    assert!(restored.tensors[0].1.equal(&state(&m).tensors[0].1));
}
