//! The method through the ABI on the test host, whose `forward_eval` runs a small fixed
//! convolutional net: what replaces `output` at each level, which samples the selective mode
//! augments, what the extra forwards see, and the settings and inputs it refuses.
//! (`tests/methods/test_time_augmentation.rs` checks the averages against airbench's Python.)

use std::cell::RefCell;
use std::rc::Rc;

use tessera_plugin_api::abi::MethodBox;
use tessera_plugin_api::tch::{kind::FLOAT_CPU, Kind, Tensor};
use tessera_plugin_api::testing::{settings, RandomSource, TestHost};
use tessera_plugin_api::{boxed_method, keys, Event};
use test_time_augmentation::{TestTimeAugmentation, AUGMENTED_FRACTION};

/// A conv + ReLU + flatten + linear net on (N, 2, 5, 6) images, 3 classes: position- and
/// orientation-sensitive, so flips and shifts change its logits.
fn net(x: &Tensor) -> Tensor {
    let w1 = Tensor::arange(2 * 2 * 3 * 3, FLOAT_CPU)
        .sin()
        .view([2, 2, 3, 3]);
    let b1 = Tensor::from_slice(&[0.1f32, -0.2]);
    let h = x.conv2d(&w1, Some(&b1), [1, 1], [1, 1], [1, 1], 1).relu();
    let w2 = Tensor::arange(3 * 60, FLOAT_CPU).cos().view([3, 60]) * 0.3;
    h.flatten(1, -1).linear(&w2, None::<Tensor>)
}

struct Run {
    host: TestHost,
    /// The batch size of every `forward_eval`.
    forwards: Rc<RefCell<Vec<i64>>>,
}

fn host(input: &Tensor) -> Run {
    let forwards = Rc::new(RefCell::new(Vec::new()));
    let seen = Rc::clone(&forwards);
    let mut host = TestHost::new(RandomSource::Seeded(0))
        .with(keys::INPUT, input)
        .with(keys::OUTPUT, &net(input));
    host.eval_model = Some(Box::new(move |x: &Tensor| {
        seen.borrow_mut().push(x.size()[0]);
        net(x)
    }));
    Run { host, forwards }
}

fn method(json: &str) -> MethodBox {
    boxed_method::<TestTimeAugmentation>(&settings(json))
        .unwrap_or_else(|e| panic!("{json}: {}", e.message()))
}

fn images(n: i64) -> Tensor {
    tessera_plugin_api::tch::manual_seed(4);
    Tensor::randn([n, 2, 5, 6], FLOAT_CPU)
}

fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a - b).abs().max().double_value(&[])
}

#[test]
fn level_0_leaves_the_output_and_runs_no_forward() {
    let x = images(4);
    let mut run = host(&x);
    let mut m = method(r#"{"level": 0}"#);
    run.host.fire(&mut m, Event::EVAL_AFTER_FORWARD).unwrap();
    assert!(run.host.get(keys::OUTPUT).equal(&net(&x)));
    assert!(run.forwards.borrow().is_empty());
}

#[test]
fn level_1_averages_the_image_and_its_mirror() {
    let x = images(4);
    let mut run = host(&x);
    let mut m = method(r#"{"level": 1}"#);
    run.host.fire(&mut m, Event::EVAL_AFTER_FORWARD).unwrap();
    let want = (net(&x) + net(&x.flip([3]))) / 2.0;
    let got = run.host.get(keys::OUTPUT);
    assert!(max_diff(got, &want) < 1e-6, "{}", max_diff(got, &want));
    // It changes the logits, and the host's own forward is reused: one extra forward.
    assert!(max_diff(got, &net(&x)) > 1e-3);
    assert_eq!(*run.forwards.borrow(), vec![4]);
}

#[test]
fn level_2_runs_five_extra_forwards_and_differs_from_level_1() {
    let x = images(3);
    let mut run = host(&x);
    let mut m = method("{}");
    run.host.fire(&mut m, Event::EVAL_AFTER_FORWARD).unwrap();
    let got = run.host.get(keys::OUTPUT).shallow_clone();
    assert_eq!(*run.forwards.borrow(), vec![3; 5]);
    // Level 1's average is the same for an image and its mirror (the two views swap); level
    // 2's shifts (down-right and up-left) are not mirror images of each other, so it differs.
    let mut run1 = host(&x);
    let mut m1 = method(r#"{"level": 1}"#);
    run1.host.fire(&mut m1, Event::EVAL_AFTER_FORWARD).unwrap();
    let xf = x.flip([3]);
    let mut run1f = host(&xf);
    run1f.host.fire(&mut m1, Event::EVAL_AFTER_FORWARD).unwrap();
    let (l1, l1f) = (run1.host.get(keys::OUTPUT), run1f.host.get(keys::OUTPUT));
    assert!(max_diff(l1, l1f) < 1e-6, "{}", max_diff(l1, l1f));
    assert!(max_diff(&got, l1) > 1e-3);
}

#[test]
fn selective_mode_augments_only_the_unsure_samples() {
    let x = images(8);
    let plain = net(&x);
    let top = plain.softmax(1, Kind::Float).amax([1], false);
    // A threshold between the 3rd and 4th lowest confidence: 3 samples are augmented.
    let sorted = top.sort(0, false).0;
    let threshold = (sorted.double_value(&[2]) + sorted.double_value(&[3])) / 2.0;
    let unsure: Vec<bool> = (0..8).map(|i| top.double_value(&[i]) < threshold).collect();

    let mut full = host(&x);
    full.host
        .fire(&mut method("{}"), Event::EVAL_AFTER_FORWARD)
        .unwrap();
    let every = full.host.get(keys::OUTPUT).shallow_clone();

    let mut run = host(&x);
    let mut m = method(&format!(r#"{{"level": 2, "confidence": {threshold}}}"#));
    run.host.fire(&mut m, Event::EVAL_START).unwrap();
    run.host.fire(&mut m, Event::EVAL_AFTER_FORWARD).unwrap();
    let got = run.host.get(keys::OUTPUT).shallow_clone();
    for (i, unsure) in unsure.iter().enumerate() {
        let row = got.get(i as i64);
        if *unsure {
            assert!(max_diff(&row, &every.get(i as i64)) < 1e-6, "sample {i}");
        } else {
            assert!(row.equal(&plain.get(i as i64)), "sample {i} was changed");
        }
    }
    // The extra forwards saw the 3 unsure samples only.
    assert_eq!(*run.forwards.borrow(), vec![3; 5]);
    run.host.fire(&mut m, Event::EVAL_END).unwrap();
    assert_eq!(run.host.metric(AUGMENTED_FRACTION), vec![3.0 / 8.0]);
}

#[test]
fn text_batches_are_refused_at_init() {
    let mut h = TestHost::new(RandomSource::Seeded(0));
    h.sample = vec![(
        "input_ids".to_owned(),
        Tensor::zeros([4, 16], (Kind::Int64, tessera_plugin_api::tch::Device::Cpu)),
    )];
    let err = h.fire(&mut method("{}"), Event::INIT).unwrap_err();
    assert!(err.contains("have no `input`"), "{err}");
    h.sample = vec![(keys::INPUT.to_owned(), Tensor::zeros([4, 16], FLOAT_CPU))];
    let err = h.fire(&mut method("{}"), Event::INIT).unwrap_err();
    assert!(
        err.contains("(N, C, H, W)") && err.contains("[1, 16]"),
        "{err}"
    );
    h.sample = vec![(
        keys::INPUT.to_owned(),
        Tensor::zeros([4, 1, 28, 28], FLOAT_CPU),
    )];
    h.fire(&mut method("{}"), Event::INIT).unwrap();
}

#[test]
fn invalid_settings_name_the_key() {
    for (json, key) in [
        (r#"{"level": 3}"#, "`level`"),
        (r#"{"level": -1}"#, "`level`"),
        (r#"{"confidence": 0}"#, "`confidence`"),
        (r#"{"confidence": 1.5}"#, "`confidence`"),
        (r#"{"level": 0, "confidence": 0.9}"#, "`level = 0`"),
        (r#"{"levle": 2}"#, "`levle`"),
    ] {
        match boxed_method::<TestTimeAugmentation>(&settings(json)) {
            Ok(_) => panic!("{json} was accepted"),
            Err(e) => assert!(e.message().contains(key), "{json}: {}", e.message()),
        }
    }
}
