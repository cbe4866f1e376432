//! The C allocator's settings for a training loop.
//!
//! libtorch takes every CPU tensor from the C allocator (`posix_memalign`). A training step
//! allocates and frees the same few-megabyte activation and gradient buffers again and again;
//! with glibc's defaults a freed block of that size either goes back to the kernel at once (it
//! was `mmap`ed) or is trimmed off the top of the heap, and the next step faults every page of
//! it back in, zeroed by the kernel. On the small CNN of the example that was over a third of
//! the run's time (a `perf` profile showed `exc_page_fault`, `__do_sys_brk` and friends at 37%
//! of the samples, against 18% in plain PyTorch) and the reason Tessera was 1.4x slower than a
//! plain PyTorch loop; docs/benchmarks.md has the figures.
//!
//! [`tune_for_training`] keeps freed memory in the process for reuse: blocks up to the largest
//! threshold glibc accepts (32 MiB on 64-bit) come from the heap, and the heap is never trimmed
//! while the process runs. The cost is that memory freed mid-run stays reserved to the process
//! (its peak, not its sum: freed blocks are reused). A user who sets their own malloc tunables
//! (`GLIBC_TUNABLES=glibc.malloc....`) keeps them: the function then changes nothing.

/// What [`tune_for_training`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocatorTuning {
    /// The thresholds were set.
    Applied,
    /// `GLIBC_TUNABLES` sets malloc tunables of its own; they were left alone.
    UserTunables,
    /// Not glibc, or glibc refused a setting: the defaults stay.
    Unsupported,
}

/// The largest `M_MMAP_THRESHOLD` glibc accepts on 64-bit targets (`4 MiB * sizeof(long)`):
/// smaller blocks are served from the heap instead of fresh pages.
pub const MMAP_THRESHOLD: usize = 32 << 20;

/// Sets the C allocator up for a training loop (see the module documentation). Call it once,
/// early in `main`, before the loop starts; it affects the whole process.
pub fn tune_for_training() -> AllocatorTuning {
    let user_set = std::env::var("GLIBC_TUNABLES")
        .map(|v| v.contains("glibc.malloc."))
        .unwrap_or(false);
    if user_set {
        return AllocatorTuning::UserTunables;
    }
    apply()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn apply() -> AllocatorTuning {
    let threshold = MMAP_THRESHOLD as libc::c_int;
    // SAFETY: mallopt only changes allocator parameters; it is safe to call at any time.
    let ok = unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, threshold) == 1
            && libc::mallopt(libc::M_TRIM_THRESHOLD, libc::c_int::MAX) == 1
    };
    if ok {
        AllocatorTuning::Applied
    } else {
        AllocatorTuning::Unsupported
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn apply() -> AllocatorTuning {
    AllocatorTuning::Unsupported
}
