//! `[distributed] sharding = "full"` (ZeRO-3 / FSDP): the parameters of each unit of the model
//! (a transformer or residual block, `[distributed] shard_unit`) exist whole only while the unit
//! runs. Between uses each rank keeps its shard of the unit's flat buffers; the unit's
//! [`UnitGate`] all-gathers them before its forward pass and frees them after, and does the
//! same around its part of the backward pass (`csrc/full_shard.cpp`).
//!
//! Whatever else reads the parameters — a method through the plugin API, a checkpoint, the
//! evaluation, the check that the ranks agree — first makes them whole ([`summon`]); the
//! training step lets them go again ([`FullUnits::release`]), keeping what a method wrote.
//! Making them whole is a collective: a method that reads parameters must do so on every rank.

use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use tch::{TchError, Tensor};

use super::{DistError, Group};
use crate::model::layers::Gate;

extern "C" {
    fn tessera_full_last_error() -> *const c_char;
    fn tessera_full_unit_new() -> *mut c_void;
    fn tessera_full_unit_free(unit: *mut c_void);
    fn tessera_full_unit_add(
        unit: *mut c_void,
        group: *mut c_void,
        buffer: *mut c_void,
        local: *mut c_void,
        rank: i64,
        low: i32,
    ) -> i32;
    fn tessera_full_unit_gather(unit: *mut c_void, ahead: i32) -> i32;
    fn tessera_full_unit_link(unit: *mut c_void, next: *mut c_void) -> i32;
    fn tessera_full_prefetch_backward(on: i32);
    fn tessera_full_prefetch_counts(out: *mut i64);
    fn tessera_full_unit_drop(unit: *mut c_void) -> i32;
    fn tessera_full_unit_summon(unit: *mut c_void) -> i32;
    fn tessera_full_unit_release(unit: *mut c_void) -> i32;
    fn tessera_full_unit_release_whole(unit: *mut c_void, was_whole: *mut i32) -> i32;
    fn tessera_full_unit_hook(unit: *mut c_void, input: *mut c_void, output: *mut c_void) -> i32;
}

/// The shim's last error on this thread.
fn full_error() -> String {
    // SAFETY: a NUL-terminated thread-local string, copied at once.
    super::sentences(&unsafe { CStr::from_ptr(tessera_full_last_error()) }.to_string_lossy())
}

fn check(rc: i32, what: impl FnOnce() -> String) -> Result<(), DistError> {
    if rc == 0 {
        return Ok(());
    }
    Err(DistError::C10d {
        what: what(),
        message: full_error(),
    })
}

/// One unit's flat buffers under full sharding, and the gate of its [`crate::model::layers::Gated`]
/// wrapper.
#[derive(Debug)]
pub struct UnitGate {
    /// The unit's path in the module tree.
    path: String,
    handle: Handle,
}

struct Handle(*mut c_void);

// SAFETY: the shim's unit guards its state with its own mutex; the autograd hooks that reach it
// from other threads hold their own reference.
unsafe impl Send for Handle {}
unsafe impl Sync for Handle {}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: made by `tessera_full_unit_new`, freed once.
        unsafe { tessera_full_unit_free(self.0) }
    }
}

impl std::fmt::Debug for Handle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Handle")
    }
}

impl UnitGate {
    /// An empty unit at `path`.
    pub fn new(path: &str) -> Result<UnitGate, DistError> {
        // SAFETY: no arguments; null only on allocation failure.
        let handle = unsafe { tessera_full_unit_new() };
        if handle.is_null() {
            return Err(DistError::C10d {
                what: format!("sharding unit `{path}`"),
                message: full_error(),
            });
        }
        Ok(UnitGate {
            path: path.to_owned(),
            handle: Handle(handle),
        })
    }

    /// The unit's path.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Adds a flat buffer (holding the parameters now) and this rank's shard of it (a tensor of
    /// its own, which the optimizer steps). `low`: gathered for the passes in bfloat16
    /// (`[distributed] gather_dtype`), exactly for the methods and checkpoints.
    pub fn add(
        &self,
        group: &Group,
        buffer: &Tensor,
        local: &Tensor,
        rank: usize,
        low: bool,
    ) -> Result<(), DistError> {
        // SAFETY: live handles; the shim keeps its own references to the tensors.
        check(
            unsafe {
                tessera_full_unit_add(
                    self.handle.0,
                    group.handle,
                    buffer.as_ptr() as *mut c_void,
                    local.as_ptr() as *mut c_void,
                    rank as i64,
                    i32::from(low),
                )
            },
            || format!("sharding unit `{}`", self.path),
        )
    }

    fn call(
        &self,
        f: unsafe extern "C" fn(*mut c_void) -> i32,
        what: &str,
    ) -> Result<(), DistError> {
        // SAFETY: a live handle.
        check(unsafe { f(self.handle.0) }, || {
            format!("{what} the parameters of `{}`", self.path)
        })
    }

    /// Makes the parameters whole for the methods or a checkpoint (collective).
    pub fn summon(&self) -> Result<(), DistError> {
        self.call(tessera_full_unit_summon, "gathering")
    }

    /// Keeps this rank's slice of what the whole parameters hold now and frees them.
    pub fn release(&self) -> Result<(), DistError> {
        self.call(tessera_full_unit_release, "releasing")
    }

    /// Lets the parameters go if they were made whole (keeping this rank's slice of what they
    /// hold), leaving them as they are if gathered for a pass. Returns whether they were whole.
    pub fn release_whole(&self) -> Result<bool, DistError> {
        let mut was_whole = 0i32;
        // SAFETY: a live handle and a valid out-pointer.
        check(
            unsafe { tessera_full_unit_release_whole(self.handle.0, &mut was_whole) },
            || format!("releasing the parameters of `{}`", self.path),
        )?;
        Ok(was_whole != 0)
    }

    /// Gathers the parameters for a pass (collective).
    pub fn gather(&self) -> Result<(), DistError> {
        self.gather_then(0)
    }

    /// [`UnitGate::gather`], then starts gathering the next unit in forward order (`ahead` 1)
    /// or the previous one (-1) without waiting for it (collective).
    fn gather_then(&self, ahead: i32) -> Result<(), DistError> {
        // SAFETY: a live handle.
        check(
            unsafe { tessera_full_unit_gather(self.handle.0, ahead) },
            || format!("gathering the parameters of `{}`", self.path),
        )
    }

    /// Makes `next` the unit after this one in forward order, for prefetching.
    fn link(&self, next: &UnitGate) -> Result<(), DistError> {
        // SAFETY: live handles; the shim links them weakly.
        check(
            unsafe { tessera_full_unit_link(self.handle.0, next.handle.0) },
            || format!("linking `{}` to `{}`", self.path, next.path),
        )
    }

    /// Frees parameters gathered for a pass (after a backward pass that did not free them).
    pub fn free_gathered(&self) -> Result<(), DistError> {
        self.call(tessera_full_unit_drop, "freeing")
    }
}

fn torch_error(e: DistError) -> TchError {
    TchError::Torch(e.to_string())
}

/// Whether a forward pass prefetches the next unit (`[distributed] prefetch`), and whether a
/// backward pass runs now (a unit recomputed by activation checkpointing during backward then
/// prefetches nothing: backward prefetches the previous unit instead).
static PREFETCH: AtomicBool = AtomicBool::new(false);
static IN_BACKWARD: AtomicBool = AtomicBool::new(false);

/// Turns prefetching on or off for the units of this process: while a unit runs, the next one
/// (forward) or the previous one (backward) is gathered.
pub fn set_prefetch(on: bool) {
    PREFETCH.store(on, Ordering::Relaxed);
    // SAFETY: sets an atomic flag in the shim.
    unsafe { tessera_full_prefetch_backward(i32::from(on)) }
}

/// Units gathered ahead of their use in this process so far, and how many of them a pass used.
pub fn prefetch_counts() -> (u64, u64) {
    let mut out = [0i64; 2];
    // SAFETY: the shim writes two numbers.
    unsafe { tessera_full_prefetch_counts(out.as_mut_ptr()) };
    (out[0].max(0) as u64, out[1].max(0) as u64)
}

/// Marks the start and end of a backward pass (see [`set_prefetch`]).
pub fn set_in_backward(on: bool) {
    IN_BACKWARD.store(on, Ordering::Relaxed);
}

impl Gate for UnitGate {
    fn open(&self) -> Result<(), TchError> {
        let ahead = PREFETCH.load(Ordering::Relaxed) && !IN_BACKWARD.load(Ordering::Relaxed);
        self.gather_then(i32::from(ahead)).map_err(torch_error)
    }

    fn close(&self, input: &Tensor, output: Option<&Tensor>) -> Result<(), TchError> {
        let hooked = match output {
            // SAFETY: live tensors for the call; the hooks hold the unit weakly.
            Some(out) => check(
                unsafe {
                    tessera_full_unit_hook(
                        self.handle.0,
                        input.as_ptr() as *mut c_void,
                        out.as_ptr() as *mut c_void,
                    )
                },
                || format!("hooking the backward pass of `{}`", self.path),
            ),
            None => Ok(()),
        };
        let freed = self.free_gathered();
        hooked.and(freed).map_err(torch_error)
    }
}

/// Every unit's gate, in forward order, and the gate of the parameters outside the units.
#[derive(Debug, Default)]
pub struct FullUnits {
    /// The units' gates (their wrappers hold them too).
    pub units: Vec<Arc<UnitGate>>,
    /// The parameters outside the units (embeddings, head), gathered for a whole step.
    pub root: Option<Arc<UnitGate>>,
}

impl FullUnits {
    fn all(&self) -> impl Iterator<Item = &Arc<UnitGate>> {
        self.units.iter().chain(&self.root)
    }

    /// Makes every unit whole (collective).
    pub fn summon(&self) -> Result<(), DistError> {
        self.all().try_for_each(|u| u.summon())
    }

    /// Lets every unit go, keeping this rank's slice of what they hold.
    pub fn release(&self) -> Result<(), DistError> {
        self.all().try_for_each(|u| u.release())
    }

    /// Lets the units made whole go, keeping this rank's slices (those gathered for a pass
    /// stay). Returns whether any was whole.
    pub fn release_whole(&self) -> Result<bool, DistError> {
        let mut any = false;
        for u in self.all() {
            any |= u.release_whole()?;
        }
        Ok(any)
    }

    /// Frees what a pass left gathered in the units (not the parameters outside them, which
    /// serve the step's every pass).
    pub fn free_gathered(&self) -> Result<(), DistError> {
        self.units.iter().try_for_each(|u| u.free_gathered())
    }

    /// Gathers the parameters outside the units for the step (collective).
    pub fn gather_root(&self) -> Result<(), DistError> {
        match &self.root {
            Some(root) => root.gather_then(i32::from(PREFETCH.load(Ordering::Relaxed))),
            None => Ok(()),
        }
    }

    /// Links the units in forward order, for prefetching; the parameters outside the units
    /// (gathered at the step's start, before the first unit) start the first unit's gather.
    pub fn link(&self) -> Result<(), DistError> {
        for pair in self.units.windows(2) {
            pair[0].link(&pair[1])?;
        }
        if let (Some(root), Some(first)) = (&self.root, self.units.first()) {
            root.link(first)?;
        }
        Ok(())
    }

    /// Registers the units as what [`summon`] makes whole on this thread (the training thread,
    /// where the methods run).
    pub fn register(&self) {
        let all = self.all().map(Arc::downgrade).collect();
        let root = self.root.as_ref().map(Arc::downgrade);
        REGISTERED.with(|r| *r.borrow_mut() = Registered { all, root });
    }
}

/// The gates [`summon`] and [`gather_outside_units`] reach.
#[derive(Default)]
struct Registered {
    all: Vec<Weak<UnitGate>>,
    root: Option<Weak<UnitGate>>,
}

thread_local! {
    static REGISTERED: RefCell<Registered> = RefCell::new(Registered::default());
}

/// Makes the parameters of every fully sharded unit whole before something outside the
/// training step reads them (a method, through the plugin API); a no-op without full sharding.
/// Collective.
pub fn summon() -> Result<(), DistError> {
    let units: Vec<Arc<UnitGate>> =
        REGISTERED.with(|r| r.borrow().all.iter().filter_map(Weak::upgrade).collect());
    units.iter().try_for_each(|u| u.summon())
}

/// Gathers the parameters outside the units before a method runs the model itself (the
/// units gather their own); a no-op without full sharding. Collective.
pub fn gather_outside_units() -> Result<(), DistError> {
    let root = REGISTERED.with(|r| r.borrow().root.as_ref().and_then(Weak::upgrade));
    match root {
        Some(root) => root.gather(),
        None => Ok(()),
    }
}
