//! The bounded buffer between the trainer and the thread that talks to the server, and the
//! count of what became of every event.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::convert::{KeyValue, Metric};

/// Events the buffer holds at most; past that the oldest metrics are dropped.
pub const CAPACITY: usize = 100_000;

/// MLflow's limits per `log-batch` call.
const MAX_METRICS: usize = 1000;
const MAX_PARAMS: usize = 100;
const MAX_TAGS: usize = 100;

/// How a run ended, as MLflow's `RunStatus`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunStatus {
    /// Completed (or stopped early by a method).
    Finished,
    /// Failed with an error.
    Failed,
    /// Interrupted by a signal (a checkpoint was written).
    Killed,
}

impl RunStatus {
    /// MLflow's name of the status.
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Finished => "FINISHED",
            RunStatus::Failed => "FAILED",
            RunStatus::Killed => "KILLED",
        }
    }
}

/// One thing to deliver.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A parameter.
    Param(KeyValue),
    /// A tag.
    Tag(KeyValue),
    /// A metric value.
    Metric(Metric),
    /// A file uploaded as artifact `name`.
    Artifact {
        /// Its name in the run's artifacts.
        name: String,
        /// The file, read when it is sent.
        file: PathBuf,
    },
    /// The run's final status.
    End {
        /// The status.
        status: RunStatus,
        /// When it ended, ms since the Unix epoch.
        end_ms: i64,
    },
}

/// What became of the events so far.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Counts {
    /// Events handed over.
    pub queued: u64,
    /// Events the server accepted.
    pub delivered: u64,
    /// Metrics dropped because the buffer was full.
    pub dropped: u64,
    /// Events the server refused, or that could not be sent at all.
    pub refused: u64,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Event>,
    counts: Counts,
    /// Why the last attempt failed.
    last_error: Option<String>,
    /// When the request now waiting for an answer was sent.
    in_flight: Option<Instant>,
    /// No more events will come.
    closed: bool,
    /// The sender thread has stopped.
    stopped: bool,
    /// The trainer stopped waiting: the sender should stop too.
    abandoned: bool,
    /// Why nothing more can be delivered, when the sender gave up for good.
    fatal: Option<String>,
}

/// The buffer and its counts, shared by the trainer and the sender thread.
#[derive(Default)]
pub struct Outbox {
    state: Mutex<State>,
    changed: Condvar,
}

/// The outcome at the end of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// The counts.
    pub counts: Counts,
    /// Events still waiting.
    pub pending: u64,
    /// Why events were not delivered: a fatal error, the last failure, or a request still
    /// waiting for its answer.
    pub reason: Option<String>,
}

impl Outbox {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic of the other side leaves the counts usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds events; never blocks on the network. When the buffer is full the oldest metric is
    /// dropped (and counted) for each new event; after a fatal error events are counted as
    /// refused.
    pub fn push(&self, events: impl IntoIterator<Item = Event>) {
        let mut s = self.lock();
        for event in events {
            s.counts.queued += 1;
            if s.fatal.is_some() || s.closed {
                s.counts.refused += 1;
                continue;
            }
            if s.queue.len() >= CAPACITY {
                if let Some(i) = s.queue.iter().position(|e| matches!(e, Event::Metric(_))) {
                    s.queue.remove(i);
                    s.counts.dropped += 1;
                }
            }
            s.queue.push_back(event);
        }
        drop(s);
        self.changed.notify_all();
    }

    /// No more events will be pushed.
    pub fn close(&self) {
        self.lock().closed = true;
        self.changed.notify_all();
    }

    /// The trainer stopped waiting; the sender stops after its current request.
    pub fn abandon(&self) {
        self.lock().abandoned = true;
        self.changed.notify_all();
    }

    /// Whether the trainer stopped waiting.
    pub fn abandoned(&self) -> bool {
        self.lock().abandoned
    }

    /// The next batch to send, waiting for one: consecutive parameters, tags and metrics within
    /// MLflow's per-call limits, or one artifact, or the end; `None` once the buffer is closed
    /// and empty, or abandoned.
    pub fn next_batch(&self) -> Option<Vec<Event>> {
        let mut s = self.lock();
        while s.queue.is_empty() && !s.closed && !s.abandoned {
            s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        if s.abandoned || s.queue.is_empty() {
            return None;
        }
        Some(take_batch(&mut s.queue))
    }

    /// Puts a batch that could not be sent back at the front, and records why.
    pub fn retry_later(&self, batch: Vec<Event>, error: String) {
        let mut s = self.lock();
        for event in batch.into_iter().rev() {
            s.queue.push_front(event);
        }
        s.last_error = Some(error);
    }

    /// Records a failure before any batch (opening the run).
    pub fn failed_attempt(&self, error: String) {
        self.lock().last_error = Some(error);
    }

    /// Counts `n` events delivered.
    pub fn delivered(&self, n: usize) {
        let mut s = self.lock();
        s.counts.delivered += n as u64;
        self.changed.notify_all();
    }

    /// Counts `n` events the server refused.
    pub fn refused(&self, n: usize, error: String) {
        let mut s = self.lock();
        s.counts.refused += n as u64;
        s.last_error = Some(error);
    }

    /// Nothing more can be delivered: every waiting and later event is refused.
    pub fn give_up(&self, error: String) {
        let mut s = self.lock();
        let waiting = s.queue.len() as u64;
        s.queue.clear();
        s.counts.refused += waiting;
        s.fatal = Some(error);
        self.changed.notify_all();
    }

    /// Marks a request as sent (`true`) or answered (`false`).
    pub fn in_flight(&self, sent: bool) {
        self.lock().in_flight = sent.then(Instant::now);
    }

    /// The sender thread has stopped.
    pub fn stopped(&self) {
        self.lock().stopped = true;
        self.changed.notify_all();
    }

    /// Waits until the sender has stopped or `deadline` passes.
    pub fn wait_until_stopped(&self, deadline: Instant) {
        self.wait_until(deadline, |s| s.stopped);
    }

    /// Sleeps `pause`, or less when the trainer stops waiting.
    pub fn pause(&self, pause: Duration) {
        self.wait_until(Instant::now() + pause, |s| s.abandoned);
    }

    /// Waits on the state's changes until `done` holds or `deadline` passes.
    fn wait_until(&self, deadline: Instant, done: impl Fn(&State) -> bool) {
        let mut s = self.lock();
        while !done(&s) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            s = self
                .changed
                .wait_timeout(s, left)
                .map(|(s, _)| s)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }

    /// The counts and why events are missing.
    pub fn snapshot(&self) -> Snapshot {
        let s = self.lock();
        let waiting = s
            .in_flight
            .map(|since| format!("no answer after {:.0} s", since.elapsed().as_secs_f64()));
        Snapshot {
            counts: s.counts.clone(),
            pending: s.queue.len() as u64,
            reason: s.fatal.clone().or(waiting).or_else(|| s.last_error.clone()),
        }
    }
}

/// Takes the next batch off the front of `queue` (not empty).
fn take_batch(queue: &mut VecDeque<Event>) -> Vec<Event> {
    if matches!(
        queue.front(),
        Some(Event::Artifact { .. } | Event::End { .. })
    ) {
        return queue.pop_front().into_iter().collect();
    }
    let (mut metrics, mut params, mut tags) = (0, 0, 0);
    let mut batch = Vec::new();
    while let Some(event) = queue.front() {
        let room = match event {
            Event::Metric(_) => metrics < MAX_METRICS,
            Event::Param(_) => params < MAX_PARAMS,
            Event::Tag(_) => tags < MAX_TAGS,
            Event::Artifact { .. } | Event::End { .. } => false,
        };
        if !room {
            break;
        }
        match event {
            Event::Metric(_) => metrics += 1,
            Event::Param(_) => params += 1,
            _ => tags += 1,
        }
        batch.extend(queue.pop_front());
    }
    batch
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metric(step: i64) -> Event {
        Event::Metric(Metric {
            key: "loss".into(),
            value: 1.0,
            timestamp: 0,
            step,
        })
    }

    #[test]
    fn batches_keep_mlflow_limits_and_stop_at_artifacts() {
        let mut q: VecDeque<Event> = (0..150)
            .map(|i| Event::Param(KeyValue::new(format!("p{i}"), "v")))
            .chain((0..1500).map(metric))
            .chain([Event::End {
                status: RunStatus::Finished,
                end_ms: 0,
            }])
            .collect();
        assert_eq!(take_batch(&mut q).len(), 100);
        let second = take_batch(&mut q);
        assert_eq!(second.len(), 50 + 1000);
        assert_eq!(take_batch(&mut q).len(), 500);
        assert!(matches!(take_batch(&mut q)[..], [Event::End { .. }]));
        assert!(q.is_empty());
    }

    #[test]
    fn a_full_buffer_drops_the_oldest_metrics() {
        let outbox = Outbox::default();
        outbox.push([Event::Tag(KeyValue::new("t", "v"))]);
        outbox.push((0..CAPACITY as i64 + 5).map(metric));
        let s = outbox.snapshot();
        assert_eq!(s.counts.queued, CAPACITY as u64 + 6);
        assert_eq!(s.counts.dropped, 6);
        assert_eq!(s.pending, CAPACITY as u64);
        // The tag stays; the first metric kept is number 6.
        let batch = outbox.next_batch().unwrap();
        assert!(matches!(batch[0], Event::Tag(_)));
        assert_eq!(batch[1], metric(6));
    }
}
