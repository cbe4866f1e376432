//! `precision = "amp_fp16"`: float16 autocast with dynamic loss scaling (PyTorch's GradScaler
//! semantics) through the real binary on Fashion-MNIST, on the CPU (libtorch 2.13 has CPU
//! float16 autocast): it trains, logs the scale when it changes, keeps the scaler's state in
//! checkpoints, and a killed and resumed run equals the straight run bit for bit. The scaler's
//! growth, back-off and skipping are unit-tested in `host/src/precision.rs`.

use tessera::checkpoint::{self, Checkpoint};
use tessera_tests::resume::assert_killed_and_resumed_is_exact;
use tessera_tests::*;

fn fp16(label: &str) -> TrainerToml {
    let mut toml = TrainerToml::new(label);
    toml.precision = Some("amp_fp16".to_owned());
    toml.device = Some("cpu".to_owned());
    toml
}

#[test]
fn fp16_trains_scales_the_loss_and_checkpoints_the_scaler() {
    let dir = TempDir::new("fp16");
    let mut toml = fp16("fp16");
    toml.max_duration = "20ba".to_owned();
    toml.write_to(&dir);
    train(&dir, &["checkpoint.interval=20ba"], &[]).assert_success();
    let mut plain = TrainerToml::new("fp32");
    plain.max_duration = "20ba".to_owned();
    plain.write_to(&dir);
    train(&dir, &[], &[]).assert_success();

    let lines = read_jsonl(&run_dir(&dir, "fp16").join("metrics.jsonl"));
    let losses = train_losses(&lines);
    assert_eq!(losses.len(), 20);
    assert!(losses.iter().all(|l| l.is_finite()), "{losses:?}");
    let head: f64 = losses[..5].iter().sum::<f64>() / 5.0;
    let tail: f64 = losses[15..].iter().sum::<f64>() / 5.0;
    assert!(
        tail < head,
        "fp16 training did not lower the loss: {losses:?}"
    );
    // Float16 arithmetic: not the fp32 run.
    let plain_losses = train_losses(&read_jsonl(&run_dir(&dir, "fp32").join("metrics.jsonl")));
    assert_ne!(losses, plain_losses);

    // The scale starts at 2^16, is logged at the first step and when it changes, and only ever
    // halves or doubles.
    let scales = method_metric(&lines, "train/loss_scale");
    assert_eq!(scales.first().map(|(b, _)| *b), Some(1), "{scales:?}");
    assert!(
        scales[0].1 == 65536.0 || scales[0].1 == 32768.0,
        "{scales:?}"
    );
    for pair in scales.windows(2) {
        let ratio = pair[1].1 / pair[0].1;
        assert!(ratio == 0.5 || ratio == 2.0, "{scales:?}");
    }
    let skipped = method_metric(&lines, "train/amp_skipped_steps");
    let backoffs =
        scales.windows(2).filter(|p| p[1].1 < p[0].1).count() + usize::from(scales[0].1 < 65536.0);
    assert_eq!(
        skipped.len(),
        backoffs,
        "one skipped step per back-off: {skipped:?}"
    );

    // The checkpoint holds the scaler: the last logged scale and the skipped steps.
    let folder = run_dir(&dir, "fp16").join("checkpoints");
    let ckpt = Checkpoint::read(checkpoint::list(&folder).first().expect("a checkpoint"))
        .expect("the checkpoint reads");
    let scaler = ckpt
        .meta
        .trainer
        .grad_scaler
        .as_ref()
        .expect("the checkpoint holds the loss scaler's state");
    assert_eq!(Some(scaler.scale), scales.last().map(|(_, s)| *s));
    assert_eq!(scaler.skipped_steps as usize, skipped.len());
    assert!(scaler.growth_tracker > 0 && scaler.growth_tracker <= 20);
}

#[test]
fn killed_and_resumed_fp16_run_equals_the_straight_run_bit_for_bit() {
    assert_killed_and_resumed_is_exact("fp16-resume", |run| {
        let mut toml = fp16(run);
        toml.max_duration = "8ba".to_owned();
        toml
    });
}
