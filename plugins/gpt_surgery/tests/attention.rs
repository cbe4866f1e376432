//! The shared attention: the plain spec is the host's GPT-2 attention, the rotation and the
//! normalisation have the properties the method cards state, the surgery composes in either
//! order over the stand-in GPT-2 and reads back what it wrote.

use gpt_surgery::kinds::{EXT_ATTENTION, GPT2_ATTENTION};
use gpt_surgery::{
    apply_rotary, conv1d, gpt2, qk_rms_norm, rebuild_attention, AttentionSpec, AttentionWeights,
    ExtAttention, Normal, Rotary, Sizes,
};
use tessera_plugin_api::kit::{StandIn, SurgeryModel};
use tessera_plugin_api::tch::{self, Device, Kind, Tensor};
use tessera_plugin_api::Module;

const F64: (Kind, Device) = (Kind::Double, Device::Cpu);
const F32: (Kind, Device) = (Kind::Float, Device::Cpu);

fn max_abs(a: &Tensor, b: &Tensor) -> f64 {
    (a.to_kind(Kind::Double) - b.to_kind(Kind::Double))
        .abs()
        .max()
        .double_value(&[])
}

/// Weights from a seeded stream of their own (tests run in parallel threads: libtorch's global
/// generator is shared).
fn weights(c: i64, seed: u64) -> AttentionWeights {
    let mut n = Normal::new(seed);
    AttentionWeights {
        c_attn_weight: n.tensor(&[c, 3 * c], 0.3),
        c_attn_bias: n.tensor(&[3 * c], 0.3),
        c_proj_weight: n.tensor(&[c, c], 0.3),
        c_proj_bias: n.tensor(&[c], 0.3),
    }
}

fn spec(n_head: i64, n_embd: i64, rotary: Option<Rotary>, qk_norm: bool) -> AttentionSpec {
    AttentionSpec {
        n_head,
        n_embd,
        n_positions: 64,
        attn_pdrop: 0.0,
        resid_pdrop: 0.0,
        rotary,
        qk_norm,
    }
}

/// The attention written out: explicit scores, causal mask, softmax; q and k through `qk`.
fn explicit(
    x: &Tensor,
    w: &AttentionWeights,
    h: i64,
    qk: impl Fn(Tensor, Tensor) -> (Tensor, Tensor),
) -> Tensor {
    let (b, t, c) = (x.size()[0], x.size()[1], x.size()[2]);
    let d = c / h;
    let qkv = conv1d(x, &w.c_attn_weight, &w.c_attn_bias).unwrap();
    let parts = qkv.split(c, 2);
    let heads = |p: &Tensor| p.reshape([b, t, h, d]).transpose(1, 2);
    let (q, k) = qk(heads(&parts[0]), heads(&parts[1]));
    let v = heads(&parts[2]);
    let scores = q.matmul(&k.transpose(-1, -2)) / (d as f64).sqrt();
    let causal = Tensor::ones([t, t], (Kind::Bool, Device::Cpu)).tril(0);
    let scores = scores.masked_fill(&causal.logical_not(), f64::NEG_INFINITY);
    let y = scores.softmax(-1, scores.kind()).matmul(&v);
    let y = y.transpose(1, 2).reshape([b, t, c]);
    conv1d(&y, &w.c_proj_weight, &w.c_proj_bias).unwrap()
}

#[test]
fn the_plain_spec_is_the_hosts_attention() {
    tch::manual_seed(0);
    let x = Tensor::randn([3, 11, 24], F32);
    let m = ExtAttention::new(spec(4, 24, None, false), weights(24, 1)).unwrap();
    let got = m.forward(&x, false).unwrap();
    let want = explicit(&x, &weights(24, 1), 4, |q, k| (q, k));
    assert!(max_abs(&got, &want) < 2e-6, "{}", max_abs(&got, &want));
    // The host's formula exactly (one addmm, the fused kernel with is_causal): bit for bit.
    let w = weights(24, 1);
    let qkv = conv1d(&x, &w.c_attn_weight, &w.c_attn_bias).unwrap();
    let parts = qkv.split(24, 2);
    let heads = |p: &Tensor| p.reshape([3, 11, 4, 6]).transpose(1, 2);
    let y = Tensor::scaled_dot_product_attention(
        &heads(&parts[0]),
        &heads(&parts[1]),
        &heads(&parts[2]),
        None::<Tensor>,
        0.0,
        true,
        None,
        false,
    );
    let y = y.transpose(1, 2).contiguous().reshape([3, 11, 24]);
    let host = conv1d(&y, &w.c_proj_weight, &w.c_proj_bias).unwrap();
    assert!(got.equal(&host));
}

#[test]
fn the_rotation_is_orthogonal_relative_and_partial() {
    let r = Rotary {
        base: 10000.0,
        dims: 6,
    };
    let (cos, sin) = r.cos_sin(17, Kind::Double, Device::Cpu).unwrap();
    assert_eq!(cos.size(), [17, 3]);
    tch::manual_seed(2);
    let x = Tensor::randn([2, 3, 17, 10], F64);
    let y = apply_rotary(&x, &cos, &sin).unwrap();
    // Orthogonal: each head vector keeps its norm.
    let n = |t: &Tensor| {
        t.square()
            .sum_dim_intlist([-1i64].as_slice(), false, Kind::Double)
    };
    assert!(max_abs(&n(&x), &n(&y)) < 1e-12);
    // Position 0 is the identity; features beyond `dims` pass through.
    assert!(max_abs(&x.narrow(2, 0, 1), &y.narrow(2, 0, 1)) < 1e-15);
    assert!(x.narrow(3, 6, 4).equal(&y.narrow(3, 6, 4)));
    // Relative: the same q and k at every position give scores that depend on m − n only.
    let q = Tensor::randn([1, 1, 1, 10], F64).expand([1, 1, 17, 10], false);
    let k = Tensor::randn([1, 1, 1, 10], F64).expand([1, 1, 17, 10], false);
    let s = apply_rotary(&q, &cos, &sin)
        .unwrap()
        .matmul(&apply_rotary(&k, &cos, &sin).unwrap().transpose(-1, -2))
        .squeeze();
    for m in 1..17 {
        for j in 1..=m {
            let a = s.double_value(&[m, m - j]);
            let b = s.double_value(&[j, 0]);
            assert!(
                (a - b).abs() < 1e-10,
                "scores at ({m}, {}) and ({j}, 0)",
                m - j
            );
        }
    }
    // The half-split pairing: feature j turns with feature j + dims/2 by m · base^(−2j/dims).
    let e0 = Tensor::zeros([1, 1, 17, 6], F64);
    let _ = e0.narrow(3, 1, 1).fill_(1.0);
    let y = apply_rotary(&e0, &cos, &sin).unwrap();
    let theta = 5.0 * 10000f64.powf(-2.0 / 6.0);
    assert!((y.double_value(&[0, 0, 5, 1]) - theta.cos()).abs() < 1e-12);
    assert!((y.double_value(&[0, 0, 5, 4]) - theta.sin()).abs() < 1e-12);
    // Float16/bfloat16 heads rotate in float32 and keep their dtype.
    let (c32, s32) = r.cos_sin(17, Kind::Float, Device::Cpu).unwrap();
    let hb = x.to_kind(Kind::BFloat16);
    let yb = apply_rotary(&hb, &c32, &s32).unwrap();
    assert_eq!(yb.kind(), Kind::BFloat16);
}

#[test]
fn rotary_dims_follow_gpt_neox_rounded_down_to_pairs() {
    assert_eq!(Rotary::dims_for(64, 1.0).unwrap(), 64);
    assert_eq!(Rotary::dims_for(64, 0.25).unwrap(), 16);
    assert_eq!(Rotary::dims_for(12, 0.25).unwrap(), 2);
    assert_eq!(Rotary::dims_for(10, 0.5).unwrap(), 4);
    let e = Rotary::dims_for(16, 0.1).unwrap_err().to_string();
    assert!(e.contains("fraction") && e.contains("at least 2"), "{e}");
}

#[test]
fn qk_norm_gives_unit_rms_and_commutes_with_the_rotation() {
    tch::manual_seed(3);
    let x = Tensor::randn([2, 3, 9, 8], F64) * 5.0;
    let y = qk_rms_norm(&x).unwrap();
    let rms = y
        .square()
        .mean_dim([-1i64].as_slice(), false, Kind::Double)
        .sqrt();
    assert!(max_abs(&rms, &Tensor::ones_like(&rms)) < 1e-9);
    let r = Rotary {
        base: 100.0,
        dims: 4,
    };
    let (cos, sin) = r.cos_sin(9, Kind::Double, Device::Cpu).unwrap();
    let a = apply_rotary(&qk_rms_norm(&x).unwrap(), &cos, &sin).unwrap();
    let b = qk_rms_norm(&apply_rotary(&x, &cos, &sin).unwrap()).unwrap();
    assert!(max_abs(&a, &b) < 1e-12);
}

#[test]
fn the_module_with_both_features_is_the_explicit_formula() {
    tch::manual_seed(4);
    let x = Tensor::randn([2, 13, 32], F32);
    let r = Rotary {
        base: 500.0,
        dims: 8,
    };
    let m = ExtAttention::new(spec(2, 32, Some(r), true), weights(32, 5)).unwrap();
    let got = m.forward(&x, false).unwrap();
    let (cos, sin) = r.cos_sin(13, Kind::Float, Device::Cpu).unwrap();
    let want = explicit(&x, &weights(32, 5), 2, |q, k| {
        let rot = |t: Tensor| apply_rotary(&t, &cos, &sin).unwrap();
        // Rotate first, then normalise (modded-nanogpt's 2024-10-14 order).
        (qk_rms_norm(&rot(q)).unwrap(), qk_rms_norm(&rot(k)).unwrap())
    });
    assert!(max_abs(&got, &want) < 2e-6, "{}", max_abs(&got, &want));
    // A second call with another length refreshes the cached cosines.
    let short = x.narrow(1, 0, 5);
    let got = m.forward(&short, false).unwrap();
    assert!(max_abs(&got, &want.narrow(1, 0, 5)) < 2e-6);
}

#[test]
fn attributes_describe_the_module_completely() {
    let s = spec(
        4,
        32,
        Some(Rotary {
            base: 777.0,
            dims: 6,
        }),
        true,
    );
    let m = ExtAttention::new(s.clone(), weights(32, 6)).unwrap();
    let mut model = gpt2(Sizes::default(), 0);
    model.replace("transformer.h.0.attn", m).unwrap();
    let info = model.info("transformer.h.0.attn").unwrap();
    assert_eq!(info.kind.as_str(), EXT_ATTENTION);
    assert_eq!(AttentionSpec::from_module(info).unwrap(), Some(s));
    // Other kinds are no attention to rebuild.
    assert_eq!(
        AttentionSpec::from_module(model.info("transformer.h.0.mlp").unwrap()).unwrap(),
        None
    );
}

fn add_rotary(spec: &mut AttentionSpec) -> Result<bool, tessera_plugin_api::Error> {
    if spec.rotary.is_some() {
        return Ok(false);
    }
    spec.rotary = Some(Rotary {
        base: 10000.0,
        dims: Rotary::dims_for(spec.head_dim(), 0.5)?,
    });
    Ok(true)
}

fn add_norm(spec: &mut AttentionSpec) -> Result<bool, tessera_plugin_api::Error> {
    let had = spec.qk_norm;
    spec.qk_norm = true;
    Ok(!had)
}

#[test]
fn the_surgery_composes_in_either_order_over_the_same_tensors() {
    let sizes = Sizes {
        n_head: 4,
        n_embd: 32,
        ..Sizes::default()
    };
    let mut a = gpt2(sizes, 7);
    let mut b = gpt2(sizes, 7);
    let before = a
        .tensor("transformer.h.1.attn.c_attn.weight")
        .unwrap()
        .shallow_clone();
    assert_eq!(a.kind("transformer.h.1.attn"), Some(GPT2_ATTENTION));
    assert_eq!(rebuild_attention(&mut a, add_rotary).unwrap().len(), 2);
    assert_eq!(rebuild_attention(&mut a, add_norm).unwrap().len(), 2);
    rebuild_attention(&mut b, add_norm).unwrap();
    rebuild_attention(&mut b, add_rotary).unwrap();
    let names = |m: &StandIn| m.tensors().keys().cloned().collect::<Vec<_>>();
    assert_eq!(names(&a), names(&b));
    for i in 0..2 {
        let path = format!("transformer.h.{i}.attn");
        let (ia, ib) = (a.info(&path).unwrap(), b.info(&path).unwrap());
        let (sa, sb) = (
            AttentionSpec::from_module(ia).unwrap().unwrap(),
            AttentionSpec::from_module(ib).unwrap().unwrap(),
        );
        assert_eq!(sa, sb);
        assert!(sa.qk_norm && sa.rotary.is_some_and(|r| r.dims == 4));
    }
    // The same storage as the model's tensor before the surgery.
    let after = a.tensor("transformer.h.1.attn.c_attn.weight").unwrap();
    assert_eq!(after.data_ptr(), before.data_ptr());
    tch::manual_seed(8);
    let x = Tensor::randn([2, 6, 32], F32);
    let ya = a
        .replaced("transformer.h.1.attn")
        .unwrap()
        .forward(&x, false)
        .unwrap();
    let yb = b
        .replaced("transformer.h.1.attn")
        .unwrap()
        .forward(&x, false)
        .unwrap();
    assert!(ya.equal(&yb));
    // Idempotent: nothing left to add.
    assert!(rebuild_attention(&mut a, add_rotary).unwrap().is_empty());
    assert!(rebuild_attention(&mut a, add_norm).unwrap().is_empty());
}

#[test]
fn training_mode_applies_both_dropouts() {
    let mut s = spec(2, 16, None, true);
    s.attn_pdrop = 0.5;
    s.resid_pdrop = 0.5;
    let m = ExtAttention::new(s, weights(16, 9)).unwrap();
    tch::manual_seed(10);
    let x = Tensor::randn([2, 8, 16], F32);
    let eval = m.forward(&x, false).unwrap();
    assert!(eval.equal(&m.forward(&x, false).unwrap()));
    let train = m.forward(&x, true).unwrap();
    assert!(!train.equal(&eval));
    assert!(m.forward(&Tensor::randn([2, 8, 12], F32), false).is_err());
}

#[test]
fn the_stand_in_is_the_same_for_the_same_seed_and_a_kind_changed_before_is_left_alone() {
    let kit = gpt2(Sizes::default(), 3);
    let mut model = gpt2(Sizes::default(), 3);
    assert_eq!(model.modules().unwrap(), kit.modules().unwrap());
    assert_eq!(model.tensors().len(), kit.tensors().len());
    for (name, t) in kit.tensors() {
        assert!(model.tensor(name).unwrap().equal(t), "{name}");
    }
    // A kind changed before the surgery (as another method's would) is what the surgery sees.
    let attn = model.info_mut("transformer.h.0.attn").unwrap();
    attn.kind = "sequential".into();
    assert_eq!(
        rebuild_attention(&mut model, add_norm).unwrap(),
        ["transformer.h.1.attn"]
    );
    assert_eq!(model.kind("transformer.h.0.attn"), Some("sequential"));
    assert_eq!(model.kind("transformer.h.1.attn"), Some(EXT_ATTENTION));
    assert!(model.replaced("transformer.h.1.attn").is_some());
    assert!(model
        .tensors()
        .contains_key("transformer.h.1.attn.c_attn.weight"));
    assert!(rebuild_attention(&mut model, add_norm).unwrap().is_empty());
}
