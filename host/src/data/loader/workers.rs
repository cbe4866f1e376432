//! The worker threads that make an epoch's batches ahead of the consumer, through a bounded queue
//! (`EpochIter`); a worker's panic becomes an error.

use super::batch::HostBatch;
use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::data::DataError;

pub(super) type Producer = Arc<dyn Fn(u64) -> Result<HostBatch, DataError> + Send + Sync>;

/// Runs the producer for one batch, turning a panic into an error.
fn produce(producer: &Producer, worker: usize, batch: u64) -> Result<HostBatch, DataError> {
    catch_unwind(AssertUnwindSafe(|| producer(batch))).unwrap_or_else(|payload| {
        Err(DataError::Worker {
            worker,
            batch,
            message: panic_message(payload.as_ref()),
        })
    })
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        format!("panicked: {s}")
    } else if let Some(s) = payload.downcast_ref::<String>() {
        format!("panicked: {s}")
    } else {
        "panicked".into()
    }
}

/// The batches of one epoch, in order; see [`Loader::epoch`].
///
/// After an error it yields nothing more.
pub struct EpochIter {
    producer: Producer,
    next: u64,
    start: u64,
    end: u64,
    failed: bool,
    pending_error: Option<DataError>,
    workers: Vec<WorkerHandle>,
    stop: Arc<AtomicBool>,
}

pub(super) struct WorkerHandle {
    receiver: Option<Receiver<Result<HostBatch, DataError>>>,
    thread: Option<JoinHandle<()>>,
}

impl EpochIter {
    pub(super) fn new(
        producer: Producer,
        start: u64,
        end: u64,
        workers: usize,
        prefetch: usize,
    ) -> EpochIter {
        let mut iter = EpochIter {
            producer,
            next: start,
            start,
            end,
            failed: false,
            pending_error: None,
            workers: Vec::new(),
            stop: Arc::new(AtomicBool::new(false)),
        };
        // No more threads than batches left.
        let threads = (workers as u64).min(end - start) as usize;
        for worker in 0..threads {
            let (sender, receiver) = sync_channel(prefetch);
            let producer = Arc::clone(&iter.producer);
            let stop = Arc::clone(&iter.stop);
            let first = start + worker as u64;
            let stride = threads as u64;
            let spawned = std::thread::Builder::new()
                .name(format!("tessera-loader-{worker}"))
                .spawn(move || {
                    let mut batch = first;
                    while batch < end && !stop.load(Ordering::Relaxed) {
                        let result = produce(&producer, worker + 1, batch);
                        let failed = result.is_err();
                        // A closed channel means the iterator is gone: stop quietly.
                        if sender.send(result).is_err() || failed {
                            return;
                        }
                        batch += stride;
                    }
                });
            match spawned {
                Ok(thread) => iter.workers.push(WorkerHandle {
                    receiver: Some(receiver),
                    thread: Some(thread),
                }),
                Err(e) => {
                    iter.pending_error = Some(DataError::Worker {
                        worker: worker + 1,
                        batch: first,
                        message: format!("could not start the thread: {e}"),
                    });
                    break;
                }
            }
        }
        iter
    }

    fn next_from_worker(&mut self, batch: u64) -> Result<HostBatch, DataError> {
        let slot = ((batch - self.start) % self.workers.len() as u64) as usize;
        let handle = &mut self.workers[slot];
        let received = handle.receiver.as_ref().map(|r| r.recv());
        match received {
            Some(Ok(result)) => result,
            _ => {
                // The worker ended without sending this batch: report why.
                let message = match handle.thread.take().map(JoinHandle::join) {
                    Some(Err(payload)) => panic_message(payload.as_ref()),
                    _ => "stopped without producing the batch".into(),
                };
                Err(DataError::Worker {
                    worker: slot + 1,
                    batch,
                    message,
                })
            }
        }
    }
}

impl Iterator for EpochIter {
    type Item = Result<HostBatch, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(error) = self.pending_error.take() {
            self.failed = true;
            return Some(Err(error));
        }
        if self.failed || self.next >= self.end {
            return None;
        }
        let batch = self.next;
        self.next += 1;
        let result = if self.workers.is_empty() {
            produce(&self.producer, 0, batch)
        } else {
            self.next_from_worker(batch)
        };
        if result.is_err() {
            self.failed = true;
        }
        Some(result)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        if self.failed {
            return (0, Some(0));
        }
        let left = usize::try_from(self.end - self.next).unwrap_or(usize::MAX);
        (
            0,
            Some(left.saturating_add(usize::from(self.pending_error.is_some()))),
        )
    }
}

impl Drop for EpochIter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Closing the queues wakes workers blocked on a full one; each finishes at most the batch
        // in hand, so joining is quick.
        for handle in &mut self.workers {
            handle.receiver.take();
        }
        for handle in &mut self.workers {
            if let Some(thread) = handle.thread.take() {
                let _ = thread.join();
            }
        }
    }
}
