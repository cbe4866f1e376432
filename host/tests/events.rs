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

fn synthetic_config(
    dir: &Path,
    epochs: u64,
    samples: usize,
    batch: usize,
    microbatch: usize,
    eval_samples: usize,
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
    let cfg = synthetic_config(&dir, epochs, samples, batch, microbatch, eval_samples);
    let seen = Arc::new(Mutex::new(BTreeMap::new()));
    let order = Arc::new(Mutex::new(Vec::new()));
    let counter = Counter {
        seen: seen.clone(),
        order: order.clone(),
    };
    let mut trainer = Trainer::new(cfg, vec![Box::new(counter)]).expect("trainer");
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
