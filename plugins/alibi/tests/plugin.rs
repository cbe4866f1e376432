//! The ALiBi plugin through plugin-api's test host: settings and the `after_dataloader`
//! reshape. (The `init` surgery needs a module tree, which the test host does not have: it is
//! tested over a stand-in tree in `golden.rs`.)

use alibi::{alibi_batch_shape, Alibi};
use tessera_plugin_api::tch::{Device, Kind, Tensor};
use tessera_plugin_api::testing::{
    default_settings_json, settings, settings_for, RandomSource, TestHost,
};
use tessera_plugin_api::{boxed_method, keys, Event, Plugin};

fn create(json: &str) -> Result<Alibi, String> {
    Alibi::create(&settings_for::<Alibi>(json)).map_err(|e| e.to_string())
}

#[test]
fn max_sequence_length_is_required() {
    let defaults = default_settings_json(Alibi::DEFAULT_SETTINGS);
    let e = create(&defaults).expect_err("no max_sequence_length");
    assert!(e.contains("`max_sequence_length` is required"), "{e}");
    let a = create(r#"{"max_sequence_length": 64}"#).expect("valid");
    assert_eq!(a.max_sequence_length(), 64);
    assert_eq!(a.train_sequence_length_scaling(), 0.25);
}

#[test]
fn bad_settings_name_the_key() {
    for (json, key) in [
        (r#"{"max_sequence_length": 0}"#, "max_sequence_length"),
        (r#"{"max_sequence_length": -4}"#, "max_sequence_length"),
        (r#"{"max_sequence_length": 1.5}"#, "max_sequence_length"),
        (r#"{"max_sequence_length": "long"}"#, "max_sequence_length"),
        (
            r#"{"max_sequence_length": 8, "train_sequence_length_scaling": 0}"#,
            "train_sequence_length_scaling",
        ),
        (
            r#"{"max_sequence_length": 8, "train_sequence_length_scaling": -0.5}"#,
            "train_sequence_length_scaling",
        ),
        (
            r#"{"max_sequence_length": 8, "train_sequence_length_scaling": "x"}"#,
            "train_sequence_length_scaling",
        ),
    ] {
        let e = create(json).expect_err(json);
        assert!(e.contains(key), "{json}: {e}");
    }
    let e = boxed_method::<Alibi>(&settings(r#"{"max_sequence_length": 8, "scaling": 0.5}"#))
        .err()
        .expect("unknown key")
        .to_string();
    assert!(e.contains("scaling"), "{e}");
}

fn run(json: &str, input: &Tensor, target: &Tensor) -> Result<TestHost, String> {
    let mut method = boxed_method::<Alibi>(&settings(json)).map_err(|e| e.to_string())?;
    let mut host = TestHost::new(RandomSource::Seeded(0))
        .with(keys::INPUT, input)
        .with(keys::TARGET, target);
    host.fire(&mut method, Event::AFTER_DATALOADER)?;
    Ok(host)
}

#[test]
fn training_batches_become_more_shorter_sequences() {
    let opts = (Kind::Int64, Device::Cpu);
    // A packed stream: input = tokens, target = the next token of each position.
    let stream = Tensor::arange(2 * 8 + 1, opts);
    let input = stream.narrow(0, 0, 16).view([2, 8]);
    let target = stream.narrow(0, 1, 16).view([2, 8]);
    let host = run(r#"{"max_sequence_length": 8}"#, &input, &target).expect("reshape");
    let (i, t) = (host.get(keys::INPUT), host.get(keys::TARGET));
    assert_eq!(i.size(), [8, 2]);
    assert_eq!(t.size(), [8, 2]);
    // Each sequence is cut into 4 consecutive pieces; every target is still the next token.
    assert!(i.view(-1).equal(&input.view(-1)));
    assert!(t.equal(&(i + 1)));

    // Scaling 2 joins pairs of sequences; 1 changes nothing.
    let host = run(
        r#"{"max_sequence_length": 32, "train_sequence_length_scaling": 2}"#,
        &input,
        &target,
    )
    .expect("join");
    assert_eq!(host.get(keys::INPUT).size(), [1, 16]);
    let host = run(
        r#"{"max_sequence_length": 32, "train_sequence_length_scaling": 1}"#,
        &input,
        &target,
    )
    .expect("no-op");
    assert!(host.get(keys::INPUT).equal(&input));
}

#[test]
fn sizes_that_do_not_divide_are_errors_as_in_composer() {
    // (2, 10) at 0.25: int(8) × int(2.5) = 16 ≠ 20 elements; Composer's reshape raises.
    assert_eq!(alibi_batch_shape(&[2, 10], 0.25), None);
    assert_eq!(alibi_batch_shape(&[2, 12], 0.25), Some(vec![8, 3]));
    assert_eq!(alibi_batch_shape(&[3, 8], 2.0), None);
    let input = Tensor::zeros([2, 10], (Kind::Int64, Device::Cpu));
    let e = run(r#"{"max_sequence_length": 8}"#, &input, &input)
        .err()
        .expect("does not divide");
    assert!(
        e.contains("[2, 10]") && e.contains("train_sequence_length_scaling"),
        "{e}"
    );
    let images = Tensor::zeros([4], (Kind::Int64, Device::Cpu));
    let e = run(r#"{"max_sequence_length": 8}"#, &images, &images)
        .err()
        .expect("no sequence dimension");
    assert!(e.contains("sequence dimension"), "{e}");
}
