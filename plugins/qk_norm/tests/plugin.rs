//! qk_norm's surgery over the stand-in GPT-2, alone and with rotary's attention surgery in
//! either order (rotary's own crate cannot be linked here: every plugin crate exports the same
//! root symbol, so its attention step is written out with `rebuild_attention`, as it does it;
//! the real plugins compose in the workspace's tests/methods/qk_norm.rs).

/// rotary's attention surgery (`fraction` 0.5, base 10000).
fn rotary(model: &mut StandIn) {
    rebuild_attention(model, |spec| {
        if spec.rotary.is_some() {
            return Ok(false);
        }
        let dims = Rotary::dims_for(spec.head_dim(), 0.5)?;
        spec.rotary = Some(Rotary {
            base: 10000.0,
            dims,
        });
        Ok(true)
    })
    .unwrap();
}

use gpt_surgery::kinds::{ALIBI_ATTENTION, EXT_ATTENTION};
use gpt_surgery::{gpt2, rebuild_attention, AttentionSpec, Rotary, Sizes};
use qk_norm::{apply_qk_norm, QkNorm};
use tessera_plugin_api::abi_stable::std_types::RString;
use tessera_plugin_api::kit::StandIn;
use tessera_plugin_api::tch::{self, Device, Kind, Tensor};
use tessera_plugin_api::testing::settings;
use tessera_plugin_api::{boxed_method, Plugin};

#[test]
fn every_attention_normalises_q_and_k_once() {
    let mut model = gpt2(Sizes::default(), 1);
    let done = apply_qk_norm(&mut model).unwrap();
    assert_eq!(done, ["transformer.h.0.attn", "transformer.h.1.attn"]);
    let info = model.info("transformer.h.1.attn").unwrap();
    assert_eq!(info.kind.as_str(), EXT_ATTENTION);
    let spec = AttentionSpec::from_module(info).unwrap().unwrap();
    assert!(spec.qk_norm && spec.rotary.is_none());
    // The learned positions stay; a second application changes nothing.
    assert_eq!(model.kind("transformer.wpe"), Some("embedding"));
    assert!(apply_qk_norm(&mut model).unwrap().is_empty());
}

#[test]
fn with_rotary_either_order_builds_the_same_module() {
    let sizes = Sizes {
        n_head: 2,
        n_embd: 24,
        ..Sizes::default()
    };
    let mut a = gpt2(sizes, 3);
    rotary(&mut a);
    assert_eq!(apply_qk_norm(&mut a).unwrap().len(), 2);
    let mut b = gpt2(sizes, 3);
    apply_qk_norm(&mut b).unwrap();
    rotary(&mut b);
    for path in ["transformer.h.0.attn", "transformer.h.1.attn"] {
        let (ia, ib) = (a.info(path).unwrap(), b.info(path).unwrap());
        assert_eq!(ia.kind, ib.kind);
        assert_eq!(
            ia.attrs
                .iter()
                .map(|x| (x.key.to_string(), x.value))
                .collect::<Vec<_>>(),
            ib.attrs
                .iter()
                .map(|x| (x.key.to_string(), x.value))
                .collect::<Vec<_>>()
        );
        let spec = AttentionSpec::from_module(ia).unwrap().unwrap();
        assert!(spec.qk_norm && spec.rotary.is_some_and(|r| r.dims == 6));
    }
    tch::manual_seed(5);
    let x = Tensor::randn([3, 10, 24], (Kind::Float, Device::Cpu));
    let path = "transformer.h.0.attn";
    let ya = a.replaced(path).unwrap().forward(&x, false).unwrap();
    let yb = b.replaced(path).unwrap().forward(&x, false).unwrap();
    assert!(ya.equal(&yb));
}

#[test]
fn alibi_attention_and_settings_are_refused() {
    let mut model = gpt2(Sizes::default(), 2);
    let attn = model.info_mut("transformer.h.0.attn").unwrap();
    attn.kind = RString::from(ALIBI_ATTENTION);
    let e = apply_qk_norm(&mut model).unwrap_err().to_string();
    assert!(e.contains("qk_norm cannot change ALiBi's attention"), "{e}");
    assert!(QkNorm::create(&settings("{}")).is_ok());
    let e = boxed_method::<QkNorm>(&settings(r#"{"eps": 1e-6}"#))
        .err()
        .expect("an unknown key is refused")
        .to_string();
    assert!(e.contains("eps"), "{e}");
}
