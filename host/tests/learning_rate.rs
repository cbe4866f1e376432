//! The optimizer owns the learning rate: the schedule sets it, and a method's `scale_lr` lasts
//! until the step it was meant for, even when the schedule is stepped in between (at
//! `fit_start`, or at the end of the previous step before `epoch_start`). Checked on the rate
//! the SGD update really used: `Δw = −lr · grad` for a plain SGD step.

use std::path::Path;
use std::sync::{Arc, Mutex};

use tessera::config;
use tessera::engine::{Algorithm, Event, Hook, MethodError, Stage};
use tessera::trainer::Trainer;

/// Scales the rate by 0.5 at `fit_start` and at the second `epoch_start`; records, per step,
/// the rate the host reports before the update and the rate the update applied.
struct Scaler {
    scale: bool,
    epochs_started: u32,
    before: Option<(f64, Vec<f32>, Vec<f32>)>,
    steps: Arc<Mutex<Vec<(f64, f64)>>>,
}

fn weight_and_grad(stage: &Stage<'_>) -> (Vec<f32>, Vec<f32>) {
    let e = &stage.model().params.entries()[0];
    let w = e.tensor.flatten(0, -1);
    let g = e.tensor.grad().flatten(0, -1);
    (
        Vec::<f32>::try_from(&w).expect("weights"),
        Vec::<f32>::try_from(&g).expect("gradient"),
    )
}

impl Algorithm for Scaler {
    fn name(&self) -> &str {
        "scaler"
    }
    fn hooks(&self) -> Vec<Hook> {
        [
            Event::FIT_START,
            Event::EPOCH_START,
            Event::AFTER_TRAIN_BATCH,
            Event::BATCH_END,
        ]
        .into_iter()
        .map(Hook::at)
        .collect()
    }
    fn on_event(&mut self, event: Event, stage: &mut Stage<'_>) -> Result<(), MethodError> {
        match event {
            Event::FIT_START if self.scale => stage.scale_lr(0.5),
            Event::EPOCH_START => {
                self.epochs_started += 1;
                if self.scale && self.epochs_started == 2 {
                    stage.scale_lr(0.5);
                }
            }
            Event::AFTER_TRAIN_BATCH => {
                let (w, g) = weight_and_grad(stage);
                self.before = Some((stage.lr(), w, g));
            }
            Event::BATCH_END => {
                let (lr, w0, g) = self.before.take().expect("after_train_batch came first");
                let (w1, _) = weight_and_grad(stage);
                // Plain SGD: w1 = w0 − lr·g; recover lr from the largest gradient entry.
                let i = (0..g.len())
                    .max_by(|&a, &b| g[a].abs().total_cmp(&g[b].abs()))
                    .expect("weights");
                let applied = f64::from(w0[i] - w1[i]) / f64::from(g[i]);
                self.steps.lock().unwrap().push((lr, applied));
            }
            _ => {}
        }
        Ok(())
    }
}

fn config(dir: &Path, name: &str) -> config::Config {
    let text = format!(
        r#"
run_name = "{name}"
output_dir = "{out}"
seed = 3
[data]
dataset = "synthetic"
batch_size = 16
workers = 0
[data.synthetic]
samples = 64
eval_samples = 16
channels = 1
height = 4
width = 4
classes = 3
[model]
name = "mlp"
hidden = [8]
[optimizer]
name = "sgd"
lr = 0.2
momentum = 0.0
[scheduler]
name = "linear"
alpha_i = 1.0
alpha_f = 0.1
t_max = "1dur"
[train]
max_duration = "2ep"
eval_interval = "2ep"
progress = false
[checkpoint]
save = false
"#,
        out = dir.display()
    );
    config::from_str(&text, dir, "lr.toml").expect("valid config")
}

fn run(dir: &Path, scale: bool) -> Vec<(f64, f64)> {
    let steps = Arc::new(Mutex::new(Vec::new()));
    let scaler = Scaler {
        scale,
        epochs_started: 0,
        before: None,
        steps: steps.clone(),
    };
    let name = if scale { "scaled" } else { "plain" };
    let mut trainer = Trainer::new(config(dir, name), vec![Box::new(scaler)]).expect("trainer");
    trainer.fit().expect("fit");
    let steps = steps.lock().unwrap().clone();
    steps
}

#[test]
fn scale_lr_lasts_until_its_step_and_no_longer() {
    let dir = std::env::temp_dir().join(format!("tessera-lr-{}", std::process::id()));
    let plain = run(&dir, false);
    let scaled = run(&dir, true);
    assert_eq!(plain.len(), 8, "2 epochs of 4 batches");
    assert_eq!(scaled.len(), plain.len());
    for (i, ((lr, applied), (plain_lr, _))) in scaled.iter().zip(&plain).enumerate() {
        // The update used the rate the host reported before it.
        assert!(
            (applied - lr).abs() <= 1e-3 * lr.abs().max(1e-6),
            "step {i}: the update applied rate {applied}, the host reported {lr}"
        );
        // Scaled at fit_start (step 0) and at the second epoch's start (step 4), only there.
        let expected = if i == 0 || i == 4 { 0.5 } else { 1.0 };
        if *plain_lr == 0.0 {
            assert_eq!(*lr, 0.0, "step {i}");
            continue;
        }
        let ratio = lr / plain_lr;
        assert!(
            (ratio - expected).abs() < 1e-12,
            "step {i}: rate {lr} vs {plain_lr} unscaled, ratio {ratio}, expected {expected}"
        );
    }
    // The schedule really moves, so the scaling survived a schedule step.
    assert!(plain.windows(2).any(|w| w[0].0 != w[1].0));
    let _ = std::fs::remove_dir_all(&dir);
}
