//! PatchWhitening through the plugin boundary on a `TestHost`: the weight the method writes
//! whitens the sample's patches, is frozen, and the bias follows `bias_epochs`; errors for
//! models and settings that do not fit.

use patch_whitening::{patch_covariance, whitening_filters, PatchWhitening};
use tessera_plugin_api::tch::{Device, Kind, Tensor};
use tessera_plugin_api::testing::{settings, RandomSource, TestHost};
use tessera_plugin_api::{boxed_method, Event, Plugin};

const F: (Kind, Device) = (Kind::Float, Device::Cpu);

/// Correlated images: a smooth random field per image plus noise, `channels` channels.
fn images(n: i64, channels: i64, size: i64) -> Tensor {
    let coarse = Tensor::randn([n, channels, size / 2, size / 2], F);
    let up = coarse.upsample_bilinear2d([size, size], false, None, None);
    up + Tensor::randn([n, channels, size, size], F) * 0.3 + 0.5
}

fn host(channels: i64, sample: &Tensor) -> TestHost {
    let mut h = TestHost::new(RandomSource::Seeded(3));
    let out = 2 * channels * 4;
    h.params.insert(
        "whiten.weight".into(),
        Tensor::randn([out, channels, 2, 2], F).set_requires_grad(true),
    );
    h.params.insert(
        "whiten.bias".into(),
        Tensor::randn([out], F).set_requires_grad(true),
    );
    // A later conv (the TestHost lists parameters by name, the host in the model's order).
    h.params.insert(
        "x_conv.weight".into(),
        Tensor::randn([16, out, 3, 3], F).set_requires_grad(true),
    );
    h.sample = vec![
        ("input".into(), sample.shallow_clone()),
        (
            "target".into(),
            Tensor::zeros([sample.size()[0]], (Kind::Int64, Device::Cpu)),
        ),
    ];
    h
}

#[test]
fn the_filters_whiten_the_patches_and_are_mirrored() {
    for channels in [1, 3] {
        let x = images(64, channels, 12);
        let w = whitening_filters(&x, 2, 2, 5e-4).unwrap();
        let d = channels * 4;
        assert_eq!(w.size(), [2 * d, channels, 2, 2]);
        assert!(w.narrow(0, d, d).equal(&-w.narrow(0, 0, d)));
        // W Σ Wᵀ = diag(λ / (λ + eps)): identity up to eps.
        let cov = patch_covariance(&x, 2, 2).unwrap();
        let half = w.narrow(0, 0, d).reshape([d, d]);
        let white = half.mm(&cov).mm(&half.tr());
        let (lambda, _) = cov.linalg_eigh("U");
        let expected = (&lambda / (&lambda + 5e-4)).diag(0);
        let err = (&white - &expected).abs().max().double_value(&[]);
        assert!(err < 1e-9, "{channels} channel(s): {err}");
        // The covariance is that of the conv's own input windows: conv2d with the patches'
        // filters reproduces Σ from its outputs.
        let out = x.to_kind(Kind::Double).conv2d::<Tensor>(
            &half.reshape([d, channels, 2, 2]),
            None,
            [1, 1],
            [0, 0],
            [1, 1],
            1,
        );
        let flat = out.permute([0, 2, 3, 1]).reshape([-1, d]);
        let white2 = flat.tr().mm(&flat) / flat.size()[0] as f64;
        let err2 = (&white2 - &expected).abs().max().double_value(&[]);
        assert!(err2 < 1e-9, "through conv2d: {err2}");
    }
}

#[test]
fn init_sets_and_freezes_the_weight_and_the_bias_follows_bias_epochs() {
    let x = images(40, 1, 10);
    let mut h = host(1, &x);
    let conv_before = h.params["x_conv.weight"].copy();
    let bias_before = h.params["whiten.bias"].copy();
    let s = settings(r#"{"samples": 32, "bias_epochs": 2}"#);
    let mut m = boxed_method::<PatchWhitening>(&s).unwrap();
    h.fire(&mut m, Event::INIT).unwrap();
    // Computed from the first 32 samples only.
    let expected = whitening_filters(&x.narrow(0, 0, 32), 2, 2, 5e-4)
        .unwrap()
        .to_kind(Kind::Float);
    assert!(h.params["whiten.weight"].equal(&expected));
    assert!(!h.params["whiten.weight"].requires_grad());
    assert!(h.params["whiten.bias"].requires_grad());
    assert!(
        h.params["whiten.bias"].equal(&bias_before),
        "the bias keeps its init"
    );
    assert!(h.params["x_conv.weight"].equal(&conv_before));
    for (epoch, event, trains) in [
        (0, Event::FIT_START, true),
        (1, Event::EPOCH_START, true),
        (2, Event::EPOCH_START, false),
        (3, Event::EPOCH_START, false),
        // A run resumed at epoch 1 (fit_start) trains it again; at epoch 5 it stays frozen.
        (1, Event::FIT_START, true),
        (5, Event::FIT_START, false),
    ] {
        h.time.epoch = epoch;
        h.fire(&mut m, event).unwrap();
        assert_eq!(
            h.params["whiten.bias"].requires_grad(),
            trains,
            "epoch {epoch}"
        );
        assert!(!h.params["whiten.weight"].requires_grad());
    }
    // bias_epochs = 0: frozen from init on.
    let mut h = host(1, &x);
    let mut m = boxed_method::<PatchWhitening>(&settings(r#"{"bias_epochs": 0}"#)).unwrap();
    h.fire(&mut m, Event::INIT).unwrap();
    assert!(!h.params["whiten.bias"].requires_grad());
}

#[test]
fn models_and_samples_that_do_not_fit_are_clear_errors() {
    let x = images(8, 3, 8);
    // A conv with 16 instead of 24 outputs for RGB.
    let mut h = host(3, &x);
    h.params.insert(
        "whiten.weight".into(),
        Tensor::randn([16, 3, 2, 2], F).set_requires_grad(true),
    );
    let mut m = boxed_method::<PatchWhitening>(&settings("{}")).unwrap();
    let err = h.fire(&mut m, Event::INIT).unwrap_err();
    assert!(
        err.contains("`whiten.weight`") && err.contains("2·C·kh·kw = 24"),
        "{err}"
    );
    // Images with 1 channel for a conv that takes 3.
    let mut h = host(3, &images(8, 1, 8));
    let err = h.fire(&mut m, Event::INIT).unwrap_err();
    assert!(
        err.contains("takes 3 channel(s), the training images have 1"),
        "{err}"
    );
    // No convolution at all.
    let mut h = TestHost::new(RandomSource::Seeded(1));
    h.params
        .insert("fc.weight".into(), Tensor::zeros([3, 4], F));
    let err = h.fire(&mut m, Event::INIT).unwrap_err();
    assert!(err.contains("no convolution"), "{err}");
    for (json, fragment) in [
        (r#"{"samples": 0}"#, "samples"),
        (r#"{"eps": -1.0}"#, "eps"),
        (r#"{"bias_epochs": -1}"#, "bias_epochs"),
        (r#"{"epsilon": 1.0}"#, "epsilon"),
    ] {
        let err = match boxed_method::<PatchWhitening>(&settings(json)) {
            Ok(_) => panic!("{json} was accepted"),
            Err(e) => e,
        };
        assert!(
            err.message().contains(fragment),
            "{json}: {}",
            err.message()
        );
    }
    assert_eq!(PatchWhitening::NAME, "patch_whitening");
}
