//! Device→host reads the trainer makes, counted.
//!
//! A read of a tensor's value on the host (`loss.item()` in PyTorch) waits for every kernel queued
//! before it: on a GPU it drains the queue, and the next step starts with an idle device. The
//! training step is written to make none in the default configuration — the loss and the
//! non-finite guard stay on the device and are read at `train.log_interval`, at checkpoints and
//! at the end of the run — and every value the trainer does read goes through [`read`], which
//! counts it. The counts (in run.json: `host_reads`) prove it: `in_steps` is 0 for a default run
//! on any device.
//!
//! That counter sees only what the trainer remembers to count. The [`observer`] sees what
//! libtorch does: a `RecordFunction` callback in the C++ shim (`csrc/observe.cpp`) that counts
//! every operator call that makes the host wait for the device, whoever makes it — the trainer,
//! a model layer, a method's hook, a plugin's module — and charges it to the source running at
//! the time. run.json's `host_reads` comes from it; the counter above is kept beside it as a
//! cross-check (`counted`).

use std::cell::Cell;
use std::collections::BTreeMap;
use std::ffi::{c_char, c_void, CStr, CString};

use serde::{Deserialize, Serialize};
use tch::{Device, Kind, TchError, Tensor};

thread_local! {
    /// Per thread: the training loop runs on one thread, and tests run trainers side by side.
    static READS: Cell<u64> = const { Cell::new(0) };
}

/// The device→host reads made through [`read`] on this thread so far.
pub fn reads() -> u64 {
    READS.with(|r| r.get())
}

/// Reads `tensor` (any shape, any numeric kind, any device) on the host as float64 values, in
/// row-major order: one device→host transfer, counted.
pub fn read(tensor: &Tensor) -> Result<Vec<f64>, TchError> {
    READS.with(|r| r.set(r.get() + 1));
    let host = tensor
        .f_detach()?
        .f_to_device(Device::Cpu)?
        .f_to_kind(Kind::Double)?
        .f_contiguous()?
        .f_flatten(0, -1)?;
    Vec::<f64>::try_from(&host)
}

/// Reads a one-element tensor on the host (counted, as [`read`]).
pub fn read_one(tensor: &Tensor) -> Result<f64, TchError> {
    read(tensor)?
        .first()
        .copied()
        .ok_or_else(|| TchError::Shape("expected a one-element tensor, got an empty one".into()))
}

/// The device→host reads of a run, as run.json records them (`host_reads`): what the
/// [`observer`] saw, with the trainer's own count beside it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HostReads {
    /// Reads made inside training steps (from `after_dataloader` to `batch_end`): 0 in the
    /// default configuration.
    pub in_steps: u64,
    /// Every read of the run's training loop: log lines, checkpoints, evaluation, the end.
    pub total: u64,
    /// Training steps taken by this process.
    pub steps: u64,
    /// Steps that made at least one read.
    #[serde(default)]
    pub steps_with_reads: u64,
    /// The most reads one step made.
    #[serde(default)]
    pub max_in_a_step: u64,
    /// The reads inside steps by source (`trainer`, a method's name, `module KIND` for a
    /// plugin's module, `backward` for the autograd threads of a CUDA backward pass) and
    /// operator (`aten::_local_scalar_dense`, `aten::to`, ...).
    #[serde(default)]
    pub in_steps_by_source: ReadsBySource,
    /// What the trainer's own counter ([`read`]) counted: its reads are among the observer's.
    #[serde(default)]
    pub counted: CountedReads,
    /// libtorch operator calls inside the steps, made at the top level (by the host or a
    /// plugin; each launches one or more kernels on a GPU).
    #[serde(default)]
    pub operators_in_steps: u64,
    /// Every operator call inside the steps (those made by operators included).
    #[serde(default)]
    pub all_operators_in_steps: u64,
    /// Whether the observer was armed (false when it could not be: the counts are then the
    /// trainer's own).
    #[serde(default)]
    pub observed: bool,
    /// The observer's table when it last changed (the reads it had then, and the table), so a
    /// step's reads can be told by source without copying the table at every step.
    #[serde(skip)]
    snapshot: Option<(u64, ReadsBySource)>,
}

/// Reads by source, then by operator (run.json's `in_steps_by_source`).
pub type ReadsBySource = BTreeMap<String, BTreeMap<String, u64>>;

/// The reads when a step started ([`HostReads::step_started`]).
#[derive(Debug, Clone, Copy)]
pub struct StepStart {
    observed: u64,
    counted: u64,
    operators: (u64, u64),
}

impl HostReads {
    /// The reads now, at the start of a step.
    pub fn step_started(&mut self) -> StepStart {
        let observed = observer::reads();
        if self.observed && self.snapshot.as_ref().is_none_or(|(at, _)| *at != observed) {
            self.snapshot = Some((observed, observer::table()));
        }
        StepStart {
            observed,
            counted: reads(),
            operators: observer::operators(),
        }
    }

    /// Counts the step that started at `start`, its reads and their sources.
    pub fn step_done(&mut self, start: StepStart) {
        self.steps += 1;
        let (top, all) = observer::operators();
        self.operators_in_steps += top - start.operators.0.min(top);
        self.all_operators_in_steps += all - start.operators.1.min(all);
        let counted = reads() - start.counted;
        self.counted.in_steps += counted;
        let made = if self.observed {
            observer::reads() - start.observed
        } else {
            counted
        };
        self.in_steps += made;
        if made == 0 {
            return;
        }
        self.steps_with_reads += 1;
        self.max_in_a_step = self.max_in_a_step.max(made);
        if self.observed {
            let now = observer::table();
            let before = self.snapshot.take().map(|(_, t)| t).unwrap_or_default();
            observer::accumulate(
                &mut self.in_steps_by_source,
                observer::difference(&now, &before),
            );
            self.snapshot = Some((observer::reads(), now));
        }
    }

    /// The record of a run whose counts at its start were `at_start` (the observer's, the
    /// trainer's own).
    pub fn record(&self, at_start: (u64, u64)) -> HostReads {
        let counted_total = reads() - at_start.1;
        HostReads {
            total: if self.observed {
                observer::reads() - at_start.0
            } else {
                counted_total
            },
            counted: CountedReads {
                in_steps: self.counted.in_steps,
                total: counted_total,
            },
            snapshot: None,
            ..self.clone()
        }
    }
}

/// The trainer's own count of its reads ([`read`]), a cross-check of the observer's.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CountedReads {
    /// Inside training steps.
    pub in_steps: u64,
    /// In the whole run.
    pub total: u64,
}

/// The observer of libtorch's operator calls that read on the host (`csrc/observe.cpp` says
/// exactly which calls count: item and the `*_value` reads, data-dependent shapes such as
/// `nonzero` and `masked_select`, blocking copies between host and device, and on a CPU run
/// every blocking `to(cpu)`, which would be a read on a GPU).
pub mod observer {
    use super::*;

    extern "C" {
        fn tessera_observe_last_error() -> *const c_char;
        fn tessera_observe_start() -> i32;
        fn tessera_observe_stop() -> i32;
        fn tessera_observe_armed() -> i32;
        fn tessera_observe_reads() -> i64;
        fn tessera_observe_operators(top: *mut i64, all: *mut i64);
        fn tessera_observe_source(name: *const c_char) -> *const c_char;
        fn tessera_observe_table(
            context: *mut c_void,
            visit: extern "C" fn(*mut c_void, *const c_char, *const c_char, i64),
        );
    }

    fn last_error() -> String {
        // SAFETY: a NUL-terminated thread-local string, copied at once.
        unsafe { CStr::from_ptr(tessera_observe_last_error()) }
            .to_string_lossy()
            .into_owned()
    }

    /// Arms the observer on this thread (and the autograd threads its backward passes use);
    /// arming twice does nothing.
    pub fn arm() -> Result<(), TchError> {
        // SAFETY: no arguments.
        match unsafe { tessera_observe_start() } {
            0 => Ok(()),
            _ => Err(TchError::Torch(format!(
                "arming the host-read observer: {}",
                last_error()
            ))),
        }
    }

    /// Disarms the observer on this thread.
    pub fn disarm() {
        // SAFETY: no arguments; a failure leaves the callback armed, which only counts.
        let _ = unsafe { tessera_observe_stop() };
    }

    /// Whether the observer is armed on this thread.
    pub fn armed() -> bool {
        // SAFETY: no arguments.
        unsafe { tessera_observe_armed() != 0 }
    }

    /// The reads seen on this thread since it was first armed (plus those of the autograd
    /// engine's device threads).
    pub fn reads() -> u64 {
        // SAFETY: no arguments.
        unsafe { tessera_observe_reads() }.max(0) as u64
    }

    /// The libtorch operator calls seen on this thread since it was first armed: those made
    /// at the top level (by the host or a plugin), and all (operators called by operators
    /// included).
    pub fn operators() -> (u64, u64) {
        let (mut top, mut all) = (0i64, 0i64);
        // SAFETY: two valid out-pointers for the call.
        unsafe { tessera_observe_operators(&mut top, &mut all) };
        (top.max(0) as u64, all.max(0) as u64)
    }

    /// Reads by source and operator, as [`reads`] counts them.
    pub fn table() -> BTreeMap<String, BTreeMap<String, u64>> {
        extern "C" fn visit(ctx: *mut c_void, source: *const c_char, op: *const c_char, n: i64) {
            // SAFETY: `ctx` is the map passed below, alive for the call; the strings are
            // NUL-terminated and live for the visit.
            let (map, source, op) = unsafe {
                (
                    &mut *(ctx as *mut BTreeMap<String, BTreeMap<String, u64>>),
                    CStr::from_ptr(source).to_string_lossy().into_owned(),
                    CStr::from_ptr(op).to_string_lossy().into_owned(),
                )
            };
            map.entry(source).or_default().insert(op, n.max(0) as u64);
        }
        let mut map = BTreeMap::new();
        // SAFETY: `visit` matches the callback type and `map` outlives the call.
        unsafe { tessera_observe_table((&mut map as *mut BTreeMap<_, _>).cast(), visit) };
        map
    }

    /// `after` less `before`, entry by entry (entries that did not grow left out).
    pub fn difference(
        after: &BTreeMap<String, BTreeMap<String, u64>>,
        before: &BTreeMap<String, BTreeMap<String, u64>>,
    ) -> BTreeMap<String, BTreeMap<String, u64>> {
        let mut out: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
        for (source, ops) in after {
            for (op, n) in ops {
                let was = before.get(source).and_then(|o| o.get(op)).copied();
                let grown = n - was.unwrap_or(0).min(*n);
                if grown > 0 {
                    out.entry(source.clone())
                        .or_default()
                        .insert(op.clone(), grown);
                }
            }
        }
        out
    }

    /// Adds `more` into `into`, entry by entry.
    pub fn accumulate(
        into: &mut BTreeMap<String, BTreeMap<String, u64>>,
        more: BTreeMap<String, BTreeMap<String, u64>>,
    ) {
        for (source, ops) in more {
            let entry = into.entry(source).or_default();
            for (op, n) in ops {
                *entry.entry(op).or_default() += n;
            }
        }
    }

    /// A source reads are charged to: a method's name, `module KIND` for a plugin's module.
    #[derive(Debug)]
    pub struct Source(CString);

    impl Source {
        /// The source `name` (a NUL inside it is replaced).
        pub fn new(name: &str) -> Source {
            Source(CString::new(name.replace('\0', " ")).unwrap_or_default())
        }

        /// Runs `f` with this thread's reads charged to this source, then restores the one
        /// before (the trainer's, outside any).
        pub fn charge<R>(&self, f: impl FnOnce() -> R) -> R {
            struct Restore(*const c_char);
            impl Drop for Restore {
                fn drop(&mut self) {
                    // SAFETY: the previous source's string is alive: it is an enclosing
                    // `charge`'s, which outlives this one, or null.
                    unsafe { tessera_observe_source(self.0) };
                }
            }
            // SAFETY: `self.0` outlives the call of `f`, after which `Restore` replaces it.
            let _restore = Restore(unsafe { tessera_observe_source(self.0.as_ptr()) });
            f()
        }

        /// Runs `f` with this thread's reads charged to the trainer (the host's own code called
        /// back from a plugin).
        pub fn trainer<R>(f: impl FnOnce() -> R) -> R {
            struct Restore(*const c_char);
            impl Drop for Restore {
                fn drop(&mut self) {
                    // SAFETY: as in `charge`.
                    unsafe { tessera_observe_source(self.0) };
                }
            }
            // SAFETY: null is the trainer.
            let _restore = Restore(unsafe { tessera_observe_source(std::ptr::null()) });
            f()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_are_counted_and_return_row_major_values() {
        let before = reads();
        let t = Tensor::from_slice(&[1.5f32, -2.0, 3.25, 4.0]).view([2, 2]);
        assert_eq!(read(&t).unwrap(), [1.5, -2.0, 3.25, 4.0]);
        assert_eq!(read_one(&Tensor::from(7i64)).unwrap(), 7.0);
        assert!(read_one(&Tensor::zeros([0], (Kind::Float, Device::Cpu))).is_err());
        assert_eq!(reads() - before, 3);
    }

    /// The observer counts the calls that read on the host once each, at the outermost call,
    /// charged to the source running, and leaves the others alone.
    #[test]
    fn the_observer_counts_what_libtorch_reads() {
        observer::arm().unwrap();
        assert!(observer::armed());
        let x = Tensor::from_slice(&[1.0f32, -2.0, 3.0, 0.0]);
        let count = |f: &dyn Fn()| {
            let before = observer::reads();
            f();
            observer::reads() - before
        };
        // Device-side work reads nothing.
        assert_eq!(
            count(&|| {
                let y = (&x * 2.0).relu().sum(Kind::Float);
                let _ = y
                    .f_to_device_(Device::Cpu, Kind::Float, true, false)
                    .unwrap();
            }),
            0
        );
        // A value on the host: once (item inside double_value, not twice).
        assert_eq!(
            count(&|| {
                let _ = x.sum(Kind::Float).double_value(&[]);
            }),
            1
        );
        // A copy to the host (a blocking `to(cpu)`); a dtype conversion is not one. (tch's
        // `Vec::try_from` of a CPU tensor copies memory without an operator: on a GPU it makes a
        // `to(cpu)`, counted.)
        assert_eq!(count(&|| drop(x.to_device(Device::Cpu))), 1);
        assert_eq!(count(&|| drop(x.to_kind(Kind::Double))), 0);
        // Data-dependent shapes.
        assert_eq!(count(&|| drop(x.nonzero())), 1);
        assert_eq!(count(&|| drop(x.masked_select(&x.gt(0.0)))), 1);
        assert_eq!(
            count(&|| drop(x.f_unique_dim(0, true, false, false).unwrap())),
            1
        );
        // Boolean-mask indexing goes through nonzero.
        assert_eq!(count(&|| drop(x.index(&[Some(x.gt(0.0))]))), 1);
        // A blocking upload counts (it synchronises a CUDA stream), a non-blocking one not.
        assert_eq!(
            count(&|| drop(Tensor::from(1.5f64).to_device(Device::Cpu))),
            1
        );
        let source = observer::Source::new("a method");
        let before = observer::table();
        source.charge(|| {
            let _ = x.max().double_value(&[]);
        });
        let grown = observer::difference(&observer::table(), &before);
        assert_eq!(
            grown.get("a method").and_then(|o| o.get("aten::item")),
            Some(&1),
            "{grown:?}"
        );
        // Outside `charge`: the trainer again.
        let before = observer::table();
        let _ = x.min().double_value(&[]);
        let grown = observer::difference(&observer::table(), &before);
        assert_eq!(grown.keys().collect::<Vec<_>>(), ["trainer"], "{grown:?}");
        observer::disarm();
        assert!(!observer::armed());
        assert_eq!(
            count(&|| {
                let _ = x.sum(Kind::Float).double_value(&[]);
            }),
            0
        );
    }
}
