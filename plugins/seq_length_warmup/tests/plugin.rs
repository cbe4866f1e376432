//! SeqLengthWarmup's settings, schedule edge cases and batch handling on Tessera's packed
//! batches (no mask), and the plugin through plugin-api's test host.

use seq_length_warmup::{
    seq_len_at, set_batch_sequence_length, Schedule, SeqBatch, SeqLengthWarmup,
};
use tessera_plugin_api::tch::{Device, Kind, Tensor};
use tessera_plugin_api::testing::{
    default_settings_json, settings, settings_for, RandomSource, TestHost,
};
use tessera_plugin_api::{boxed_method, keys, Event, Plugin};

fn create(json: &str) -> Result<SeqLengthWarmup, String> {
    SeqLengthWarmup::create(&settings_for::<SeqLengthWarmup>(json)).map_err(|e| e.to_string())
}

#[test]
fn defaults_are_composers() {
    let m = create(&default_settings_json(SeqLengthWarmup::DEFAULT_SETTINGS)).expect("defaults");
    assert_eq!(m.schedule(), Schedule::default());
    assert!(m.truncate());
    assert!(!m.preserve_end_of_sequence());
    let d = Schedule::default();
    assert_eq!(
        (d.duration, d.min_seq_length, d.max_seq_length, d.step_size),
        (0.3, 8, 1024, 8)
    );
}

#[test]
fn bad_settings_name_the_key() {
    for (json, key) in [
        (r#"{"duration": 1.5}"#, "duration"),
        (r#"{"duration": -0.1}"#, "duration"),
        (r#"{"duration": "long"}"#, "duration"),
        (r#"{"min_seq_length": 0}"#, "min_seq_length"),
        (
            r#"{"min_seq_length": 64, "max_seq_length": 32}"#,
            "max_seq_length",
        ),
        (r#"{"step_size": 0}"#, "step_size"),
        (r#"{"step_size": -8}"#, "step_size"),
        (r#"{"truncate": "yes"}"#, "truncate"),
        (
            r#"{"preserve_end_of_sequence": 1}"#,
            "preserve_end_of_sequence",
        ),
    ] {
        let e = create(json).expect_err(json);
        assert!(e.contains(key), "{json}: {e}");
    }
    let e = boxed_method::<SeqLengthWarmup>(&settings(r#"{"warmup": 0.3}"#))
        .err()
        .expect("unknown key")
        .to_string();
    assert!(e.contains("warmup"), "{e}");
}

#[test]
fn short_runs_are_a_clear_error_instead_of_a_division_by_zero() {
    // Golden quirk 5: 100 batches × 0.3 = 30 warmup batches for 127 length steps.
    let e = seq_len_at(0, 100, &Schedule::default()).expect_err("too short");
    let m = e.message();
    assert!(
        m.contains("30 batches") && m.contains("127 length steps"),
        "{m}"
    );
    // Nothing to grow (max − min < step): always min.
    let flat = Schedule {
        min_seq_length: 64,
        max_seq_length: 64,
        ..Schedule::default()
    };
    assert_eq!(seq_len_at(5, 100, &flat).expect("flat"), 64);
    // The end of the warmup reaches max and stays there.
    let s = Schedule::default();
    assert_eq!(seq_len_at(0, 10_000, &s).expect("start"), 8);
    assert_eq!(seq_len_at(9_999, 10_000, &s).expect("end"), 1024);
}

fn packed(b: i64, s: i64) -> (Tensor, Tensor) {
    let stream = Tensor::arange(b * s + 1, (Kind::Int64, Device::Cpu));
    (
        stream.narrow(0, 0, b * s).view([b, s]),
        stream.narrow(0, 1, b * s).view([b, s]),
    )
}

#[test]
fn packed_batches_keep_next_token_targets_aligned() {
    let (input, target) = packed(3, 10);
    for truncate in [true, false] {
        let out = set_batch_sequence_length(
            SeqBatch {
                input: input.copy(),
                target: Some(target.copy()),
                mask: None,
            },
            4,
            truncate,
            false,
        )
        .expect("cut");
        let t = out.target.expect("target");
        assert_eq!(out.input.size()[1], 4);
        // truncate: (3, 4); re-chunk: 30 // 4 = 7 rows, 2 tokens dropped.
        assert_eq!(out.input.size()[0], if truncate { 3 } else { 7 });
        assert!(t.equal(&(&out.input + 1)), "truncate = {truncate}");
    }
    // preserve_end_of_sequence without a mask: every row is full, so its last input token and
    // its last target move to position L − 1 (Composer with an all-ones attention_mask): the
    // pair stays aligned.
    let out = set_batch_sequence_length(
        SeqBatch {
            input: input.copy(),
            target: Some(target.copy()),
            mask: None,
        },
        4,
        true,
        true,
    )
    .expect("eos");
    assert!(out.input.select(1, 3).equal(&input.select(1, 9)));
    assert!(out.input.narrow(1, 0, 3).equal(&input.narrow(1, 0, 3)));
    assert!(out.target.expect("target").equal(&(&out.input + 1)));
}

#[test]
fn the_plugin_refuses_a_run_without_a_length_in_batches() {
    // The test host reports no run length (max_batches 0), as a run in tokens or wall-clock time.
    let mut method = boxed_method::<SeqLengthWarmup>(&settings("{}")).expect("defaults");
    let (input, target) = packed(2, 16);
    let mut host = TestHost::new(RandomSource::Seeded(0))
        .with(keys::INPUT, &input)
        .with(keys::TARGET, &target);
    let e = host
        .fire(&mut method, Event::AFTER_DATALOADER)
        .expect_err("no length");
    assert!(e.contains("`max_duration` in epochs or batches"), "{e}");
    assert!(host.get(keys::INPUT).equal(&input));
}
