//! ChannelsLast against Composer's golden case (`tests/golden/channels_last.*`): a small conv
//! net (conv 3×3, BatchNorm, ReLU, conv 1×1, flatten, linear; indices as in the file's
//! `param/<index>.<name>` keys) whose parameters and buffers are converted with the plugin's
//! functional form. Every tensor's strides must be exactly those Composer recorded in
//! `results.strides_after`, the values unchanged, and the net's output the recorded one.

use std::collections::BTreeMap;

use channels_last::{
    channels_last_strides, convert_in_place, is_channels_last, to_channels_last, ChannelsLast,
    PRIORITY,
};
use serde_json::Value;
use tessera_plugin_api::tch::{self, Device, Kind, Tensor};
use tessera_plugin_api::testing::golden::{assert_close, Golden};
use tessera_plugin_api::testing::settings;
use tessera_plugin_api::{boxed_method, ErrorKind, Event, Plugin};

const CASE: &str = "channels_last";
const RTOL: f64 = 1e-6;
const ATOL: f64 = 1e-6;

/// The golden parameters and buffers by module name (`0.weight`), as fresh tensors.
fn params(g: &Golden) -> BTreeMap<String, Tensor> {
    g.names_with_role("param")
        .into_iter()
        .map(|name| {
            let t = g.tensor(&name).copy();
            (name["param/".len()..].to_owned(), t)
        })
        .collect()
}

/// The recorded `{shape, stride, ...}` entry of `name` in `results.<which>`.
fn recorded<'a>(g: &'a Golden, which: &str, name: &str) -> &'a Value {
    let v = &g.json["results"][which][name];
    assert!(v.is_object(), "no results.{which}.{name}");
    v
}

fn ints(v: &Value) -> Vec<i64> {
    serde_json::from_value(v.clone()).expect("a list of integers")
}

/// A conv with "same" padding (odd square kernels), as the golden net's.
fn conv(x: &Tensor, p: &BTreeMap<String, Tensor>, index: &str) -> Tensor {
    let w = &p[&format!("{index}.weight")];
    let pad = w.size()[2] / 2;
    x.conv2d(
        w,
        Some(&p[&format!("{index}.bias")]),
        [1, 1],
        [pad, pad],
        [1, 1],
        1,
    )
}

/// The golden net in evaluation mode (BatchNorm with its running statistics).
fn net(x: &Tensor, p: &BTreeMap<String, Tensor>) -> Tensor {
    let y = conv(x, p, "0");
    let y = y.batch_norm(
        Some(&p["1.weight"]),
        Some(&p["1.bias"]),
        Some(&p["1.running_mean"]),
        Some(&p["1.running_var"]),
        false,
        0.1,
        1e-5,
        false,
    );
    let y = conv(&y.relu(), p, "3").flatten(1, -1);
    y.linear(&p["5.weight"], Some(&p["5.bias"]))
}

#[test]
fn the_golden_net_is_reproduced_before_conversion() {
    let g = Golden::load(CASE);
    let p = params(&g);
    for (name, t) in &p {
        let before = recorded(&g, "strides_before", name);
        assert_eq!(t.size(), ints(&before["shape"]), "{name}");
        assert_eq!(t.stride(), ints(&before["stride"]), "{name}");
    }
    let out = tch::no_grad(|| net(g.tensor("input"), &p));
    assert_close("out_before", &out, g.tensor("out_before"), RTOL, ATOL);
}

#[test]
fn strides_values_and_outputs_match_composer() {
    let g = Golden::load(CASE);
    let mut p = params(&g);
    let originals: BTreeMap<String, Tensor> =
        p.iter().map(|(n, t)| (n.clone(), t.copy())).collect();
    let mut converted = 0;
    for (name, t) in p.iter_mut() {
        let after = recorded(&g, "strides_after", name);
        let changed = convert_in_place(t).unwrap();
        converted += usize::from(changed);
        assert_eq!(changed, t.dim() == 4, "{name}: converted only when 4-d");
        assert_eq!(t.size(), ints(&after["shape"]), "{name}");
        assert_eq!(t.stride(), ints(&after["stride"]), "{name}: strides");
        assert_eq!(
            Value::Bool(is_channels_last(t)),
            after["channels_last_contiguous"],
            "{name}"
        );
        assert_eq!(
            Value::Bool(t.is_contiguous()),
            after["contiguous"],
            "{name}"
        );
        assert_close(name, t, &originals[name], 0.0, 0.0);
    }
    assert_eq!(converted, 2, "the golden net has two convs");
    let out = tch::no_grad(|| net(g.tensor("input"), &p));
    assert_close("out_after", &out, g.tensor("out_after"), RTOL, ATOL);
    assert_close(
        "out_after vs out_before",
        &out,
        g.tensor("out_before"),
        RTOL,
        ATOL,
    );
    // Converting again changes nothing (the method is idempotent).
    for (name, t) in p.iter_mut() {
        let strides = t.stride();
        assert!(!convert_in_place(t).unwrap(), "{name} converted twice");
        assert_eq!(t.stride(), strides, "{name}");
    }
}

#[test]
fn strides_follow_pytorch_for_any_4d_shape() {
    // The rule (C·H·W, 1, W·C, C), also for size-1 dimensions (the 1×1 conv's (8, 1, 8, 8)).
    for (size, want) in [
        ([8, 3, 3, 3], [27, 1, 9, 3]),
        ([4, 8, 1, 1], [8, 1, 8, 8]),
        ([2, 5, 7, 3], [105, 1, 15, 5]),
        ([1, 1, 4, 4], [16, 1, 4, 1]),
    ] {
        assert_eq!(
            channels_last_strides(&size),
            Some(want.to_vec()),
            "{size:?}"
        );
    }
    assert_eq!(channels_last_strides(&[3, 4, 5]), None);
    assert!(to_channels_last(&Tensor::zeros([3, 4], (Kind::Float, Device::Cpu))).is_err());
}

#[test]
fn a_converted_parameter_trains_in_channels_last_layout() {
    // What the host's optimizer relies on: the parameter keeps requiring a gradient after its
    // data is replaced, its gradient comes in the parameter's own layout (PyTorch's gradient
    // layout contract), and an in-place SGD update keeps the layout and gives the same values
    // as on the contiguous twin.
    tch::manual_seed(11);
    let w0 = Tensor::randn([6, 4, 3, 3], (Kind::Float, Device::Cpu));
    let x = Tensor::randn([2, 4, 5, 5], (Kind::Float, Device::Cpu));
    let plain = w0.copy().set_requires_grad(true);
    let mut cl = w0.copy().set_requires_grad(true);
    assert!(convert_in_place(&mut cl).unwrap());
    assert!(cl.requires_grad() && is_channels_last(&cl));
    for w in [&plain, &cl] {
        w.conv2d::<&Tensor>(&x, None, [1, 1], [1, 1], [1, 1], 1)
            .square()
            .sum(Kind::Float)
            .backward();
    }
    let grad = cl.grad();
    assert_eq!(grad.stride(), cl.stride(), "the gradient's layout");
    assert_close("gradient", &grad, &plain.grad(), 1e-5, 1e-5);
    tch::no_grad(|| {
        for w in [&plain, &cl] {
            let _ = w.shallow_clone().f_sub_(&(w.grad() * 0.1)).unwrap();
        }
    });
    assert!(is_channels_last(&cl), "the update kept the layout");
    assert_close("updated weight", &cl, &plain, 1e-5, 1e-5);
}

#[test]
fn the_method_runs_last_at_init_and_takes_no_settings() {
    let hooks = ChannelsLast::hooks();
    assert_eq!(hooks.len(), 1);
    assert_eq!(hooks[0].event, Event::INIT);
    assert!(hooks[0].priority == PRIORITY && PRIORITY < 0);
    assert!(boxed_method::<ChannelsLast>(&settings("{}")).is_ok());
    let err = boxed_method::<ChannelsLast>(&settings(r#"{"memory_format": "nhwc"}"#))
        .err()
        .expect("an unknown setting is refused");
    assert_eq!(err.kind(), ErrorKind::CONFIG);
    assert!(err.message().contains("memory_format"), "{}", err.message());
}
