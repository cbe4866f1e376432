//! Per-event call counts for N epochs, S steps and M microbatches, exactly as Composer's
//! `tests/test_events.py` expects them (composer.md §1.2), seen by a method hooked on every
//! event.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use tessera::config;
use tessera::engine::{Algorithm, Event, Hook, MethodError, Stage};
use tessera::trainer::Trainer;

struct Counter {
    seen: Arc<Mutex<BTreeMap<Event, u64>>>,
    order: Arc<Mutex<Vec<Event>>>,
}

impl Algorithm for Counter {
    fn name(&self) -> &str {
        "counter"
    }
    fn hooks(&self) -> Vec<Hook> {
        Event::ALL.iter().map(|&e| Hook::at(e)).collect()
    }
    fn on_event(&mut self, event: Event, _stage: &mut Stage<'_>) -> Result<(), MethodError> {
        *self.seen.lock().unwrap().entry(event).or_default() += 1;
        self.order.lock().unwrap().push(event);
        Ok(())
    }
}

type Seen = Arc<Mutex<BTreeMap<Event, u64>>>;
type Order = Arc<Mutex<Vec<Event>>>;

/// A counter hooked on every event, with what it saw.
fn counter() -> (Box<dyn Algorithm>, Seen, Order) {
    let seen = Arc::new(Mutex::new(BTreeMap::new()));
    let order = Arc::new(Mutex::new(Vec::new()));
    let counter = Counter {
        seen: seen.clone(),
        order: order.clone(),
    };
    (Box::new(counter), seen, order)
}

fn synthetic_config(
    dir: &Path,
    epochs: u64,
    samples: usize,
    batch: usize,
    microbatch: usize,
    eval_samples: usize,
    more: &str,
) -> config::Config {
    let text = format!(
        r#"
run_name = "events"
output_dir = "{out}"
[data]
dataset = "synthetic"
batch_size = {batch}
eval_batch_size = 16
workers = 0
[data.synthetic]
samples = {samples}
eval_samples = {eval_samples}
channels = 1
height = 8
width = 8
classes = 4
[model]
name = "mlp"
hidden = [16]
[optimizer]
name = "sgd"
lr = 0.1
[train]
max_duration = "{epochs}ep"
microbatch_size = {microbatch}
eval_interval = "1ep"
progress = false
{more}
"#,
        out = dir.display()
    );
    config::from_str(&text, dir, "events.toml").expect("valid config")
}

#[test]
fn event_counts_match_composer() {
    let dir = std::env::temp_dir().join(format!("tessera-events-{}", std::process::id()));
    let (epochs, samples, batch, microbatch, eval_samples) =
        (2u64, 64usize, 16usize, 4usize, 40usize);
    let cfg = synthetic_config(&dir, epochs, samples, batch, microbatch, eval_samples, "");
    let (counter, seen, order) = counter();
    let mut trainer = Trainer::new(cfg, vec![counter]).expect("trainer");
    trainer.fit().expect("fit");

    let n = epochs;
    let s = n * (samples / batch) as u64;
    let m = s * (batch / microbatch) as u64;
    let evals = n; // once per epoch; none extra at fit end (the last epoch's eval is current)
    let eval_batches = evals * eval_samples.div_ceil(16) as u64;
    let expected: Vec<(Event, u64)> = vec![
        (Event::INIT, 1),
        (Event::BEFORE_LOAD, 1),
        (Event::AFTER_LOAD, 1),
        (Event::FIT_START, 1),
        (Event::ITERATION_START, 1),
        (Event::EPOCH_START, n),
        (Event::BEFORE_DATALOADER, s + n),
        (Event::AFTER_DATALOADER, s),
        (Event::BATCH_START, s),
        (Event::BEFORE_TRAIN_BATCH, s),
        (Event::BEFORE_FORWARD, m),
        (Event::AFTER_FORWARD, m),
        (Event::BEFORE_LOSS, m),
        (Event::AFTER_LOSS, m),
        (Event::BEFORE_BACKWARD, m),
        (Event::AFTER_BACKWARD, m),
        (Event::AFTER_TRAIN_BATCH, s),
        (Event::BATCH_END, s),
        (Event::BATCH_CHECKPOINT, s),
        (Event::EPOCH_END, n),
        (Event::EPOCH_CHECKPOINT, n),
        (Event::ITERATION_END, 0),
        (Event::ITERATION_CHECKPOINT, 0),
        (Event::FIT_END, 1),
        (Event::EVAL_BEFORE_ALL, evals),
        (Event::EVAL_START, evals),
        (Event::EVAL_BATCH_START, eval_batches),
        (Event::EVAL_BEFORE_FORWARD, eval_batches),
        (Event::EVAL_AFTER_FORWARD, eval_batches),
        (Event::EVAL_BATCH_END, eval_batches),
        (Event::EVAL_END, evals),
        (Event::EVAL_AFTER_ALL, evals),
    ];
    let seen = seen.lock().unwrap();
    for (event, count) in expected {
        assert_eq!(
            seen.get(&event).copied().unwrap_or(0),
            count,
            "method saw {event} wrong number of times"
        );
        assert_eq!(
            trainer.engine().count(event),
            count,
            "engine fired {event} wrong number of times"
        );
    }
    for e in [
        Event::EVAL_STANDALONE_START,
        Event::PREDICT_START,
        Event::PREDICT_END,
    ] {
        assert_eq!(seen.get(&e).copied().unwrap_or(0), 0);
    }

    // The order inside one step and around an epoch boundary, as composer.md §1.2 lists it.
    let order = order.lock().unwrap();
    let start = order
        .iter()
        .position(|e| *e == Event::AFTER_DATALOADER)
        .unwrap();
    assert_eq!(
        &order[start..start + 4],
        &[
            Event::AFTER_DATALOADER,
            Event::BATCH_START,
            Event::BEFORE_TRAIN_BATCH,
            Event::BEFORE_FORWARD
        ]
    );
    let epoch_end = order.iter().position(|e| *e == Event::EPOCH_END).unwrap();
    assert_eq!(
        order[epoch_end - 1],
        Event::BEFORE_DATALOADER,
        "the exhausted loader's extra before_dataloader"
    );
    assert_eq!(
        &order[epoch_end..epoch_end + 3],
        &[Event::EPOCH_END, Event::EVAL_BEFORE_ALL, Event::EVAL_START]
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// With `train.iteration_length`, iterations end after that many epochs (composer.md §1.2:
/// after `epoch_checkpoint`, `to_next_iteration`, `iteration_end`, `iteration_checkpoint`), a
/// new one starts with `iteration_start`, and `iter` intervals checkpoint at their end.
#[test]
fn iterations_end_after_their_epochs() {
    let dir = std::env::temp_dir().join(format!("tessera-iterations-{}", std::process::id()));
    let (epochs, per_iteration) = (4u64, 2u64);
    let more =
        format!("iteration_length = \"{per_iteration}ep\"\n[checkpoint]\ninterval = \"1iter\"");
    let cfg = synthetic_config(&dir, epochs, 64, 16, 16, 16, &more);
    let folder = cfg.checkpoint.folder.clone();
    let (counter, seen, order) = counter();
    let mut trainer = Trainer::new(cfg, vec![counter]).expect("trainer");
    trainer.fit().expect("fit");
    let iterations = epochs / per_iteration;
    let seen = seen.lock().unwrap();
    for (event, count) in [
        (Event::ITERATION_START, iterations),
        (Event::ITERATION_END, iterations),
        (Event::ITERATION_CHECKPOINT, iterations),
        (Event::EPOCH_END, epochs),
    ] {
        assert_eq!(seen.get(&event).copied().unwrap_or(0), count, "{event}");
        assert_eq!(trainer.engine().count(event), count, "{event}");
    }
    let t = trainer.timestamp();
    assert_eq!(
        (t.iteration, t.epoch, t.epoch_in_iteration),
        (iterations, epochs, 0)
    );

    let order = order.lock().unwrap();
    let end = order
        .iter()
        .position(|e| *e == Event::ITERATION_END)
        .unwrap();
    assert_eq!(
        &order[end - 1..end + 4],
        &[
            Event::EPOCH_CHECKPOINT,
            Event::ITERATION_END,
            Event::ITERATION_CHECKPOINT,
            Event::ITERATION_START,
            Event::EPOCH_START
        ]
    );
    // "1iter": a checkpoint at the end of each iteration, none at the other epochs.
    let mut written: Vec<String> = tessera::checkpoint::list(&folder)
        .iter()
        .filter_map(|p| p.file_name()?.to_str().map(str::to_owned))
        .collect();
    written.sort();
    assert_eq!(written, ["ep2-ba8.ckpt", "ep4-ba16.ckpt"]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A checkpoint written at the `epoch_checkpoint` that ends an iteration precedes
/// `iteration_end`: the run resumed from it ends that iteration first, and ends where the run
/// that never stopped ends.
#[test]
fn a_resumed_run_ends_the_iteration_its_checkpoint_preceded() {
    let base = std::env::temp_dir().join(format!("tessera-iter-resume-{}", std::process::id()));
    let more = "iteration_length = \"2ep\"\n[checkpoint]\ninterval = \"1ep\"";
    let straight_cfg = synthetic_config(&base.join("a"), 4, 64, 16, 16, 16, more);
    let boundary = straight_cfg.checkpoint.folder.join("ep2-ba8.ckpt");
    let mut straight = Trainer::new(straight_cfg, Vec::new()).expect("trainer");
    straight.fit().expect("fit");

    let mut cfg = synthetic_config(&base.join("b"), 4, 64, 16, 16, 16, more);
    cfg.checkpoint.load = Some(boundary);
    let (counter, seen, order) = counter();
    let mut resumed = Trainer::new(cfg, vec![counter]).expect("trainer");
    resumed.fit().expect("fit");
    let seen = seen.lock().unwrap();
    for (event, count) in [
        (Event::ITERATION_END, 2),
        (Event::ITERATION_START, 1),
        (Event::EPOCH_START, 2),
    ] {
        assert_eq!(seen.get(&event).copied().unwrap_or(0), count, "{event}");
    }
    let order = order.lock().unwrap();
    let fit_start = order.iter().position(|e| *e == Event::FIT_START).unwrap();
    assert_eq!(
        &order[fit_start..fit_start + 5],
        &[
            Event::FIT_START,
            Event::ITERATION_END,
            Event::ITERATION_CHECKPOINT,
            Event::ITERATION_START,
            Event::EPOCH_START
        ]
    );
    let counters = |t: &tessera::time::Timestamp| {
        let c = (
            t.iteration,
            t.epoch,
            t.epoch_in_iteration,
            t.batch,
            t.sample,
        );
        (c, t.batch_in_epoch)
    };
    assert_eq!(
        counters(resumed.timestamp()),
        counters(straight.timestamp())
    );
    let _ = std::fs::remove_dir_all(&base);
}

/// `tessera eval` and `tessera predict` on a trained run's checkpoint: the set-up events, then
/// the evaluation loop inside `eval_standalone_*`, and the predict loop, and nothing of
/// training; the evaluation gives the run's final accuracy again.
#[test]
fn standalone_eval_and_predict_events() {
    let dir = std::env::temp_dir().join(format!("tessera-standalone-{}", std::process::id()));
    let (samples, batch, eval_samples, eval_batch) = (64usize, 16usize, 40usize, 16usize);
    let cfg = synthetic_config(&dir, 1, samples, batch, batch, eval_samples, "");
    let mut trainer = Trainer::new(cfg.clone(), Vec::new()).expect("trainer");
    let summary = trainer.fit().expect("fit");
    let last = summary
        .record
        .last_checkpoint
        .clone()
        .expect("a checkpoint");
    let final_eval = summary.record.evals.last().cloned().expect("an evaluation");
    let bytes = std::fs::read(&last).unwrap();

    let mut cfg = cfg;
    cfg.checkpoint.load = Some(last.clone());
    let (counter, seen, order) = counter();
    let mut standalone = Trainer::standalone(cfg, vec![counter]).expect("standalone trainer");
    let record = standalone.eval_standalone().expect("eval");
    assert_eq!(
        record, final_eval,
        "the checkpoint evaluates as the run's final evaluation"
    );
    let predictions = dir.join("predictions.jsonl");
    let predicted = standalone.predict(&predictions).expect("predict");
    assert_eq!(predicted.samples, eval_samples as u64);
    assert_eq!(predicted.accuracy, final_eval.accuracy);
    let text = std::fs::read_to_string(&predictions).unwrap();
    assert_eq!(text.lines().count(), eval_samples);

    let batches = eval_samples.div_ceil(eval_batch) as u64;
    let seen = seen.lock().unwrap();
    for &event in Event::ALL.iter() {
        let expected = match event {
            Event::INIT | Event::BEFORE_LOAD | Event::AFTER_LOAD => 1,
            Event::EVAL_STANDALONE_START | Event::EVAL_STANDALONE_END => 1,
            Event::EVAL_START | Event::EVAL_END => 1,
            Event::PREDICT_START | Event::PREDICT_END => 1,
            Event::EVAL_BATCH_START
            | Event::EVAL_BEFORE_FORWARD
            | Event::EVAL_AFTER_FORWARD
            | Event::EVAL_BATCH_END
            | Event::PREDICT_BATCH_START
            | Event::PREDICT_BEFORE_FORWARD
            | Event::PREDICT_AFTER_FORWARD
            | Event::PREDICT_BATCH_END => batches,
            _ => 0,
        };
        assert_eq!(seen.get(&event).copied().unwrap_or(0), expected, "{event}");
        assert_eq!(standalone.engine().count(event), expected, "{event}");
    }
    let order = order.lock().unwrap();
    let eval_part = &order[3..3 + 4 + 4 * batches as usize];
    assert_eq!(
        (eval_part[0], eval_part[1]),
        (Event::EVAL_STANDALONE_START, Event::EVAL_START)
    );
    assert_eq!(
        &eval_part[eval_part.len() - 2..],
        &[Event::EVAL_END, Event::EVAL_STANDALONE_END]
    );
    let predict_part = &order[3 + eval_part.len()..];
    assert_eq!(
        &predict_part[..5],
        &[
            Event::PREDICT_START,
            Event::PREDICT_BATCH_START,
            Event::PREDICT_BEFORE_FORWARD,
            Event::PREDICT_AFTER_FORWARD,
            Event::PREDICT_BATCH_END
        ]
    );
    assert_eq!(predict_part.last(), Some(&Event::PREDICT_END));
    assert_eq!(predict_part.len(), 2 + 4 * batches as usize);

    assert!(
        standalone.fit().is_err(),
        "a standalone trainer does not train"
    );
    assert_eq!(
        std::fs::read(&last).unwrap(),
        bytes,
        "the checkpoint is untouched"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
