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

/// The most memory a run's tensors held at once: on CUDA the caching allocator's peak of
/// allocated bytes, on the CPU the allocator's running total of the allocations made on the
/// watched threads (`host/csrc/oom.cpp`; [`watch_cpu`] must run before the tensors are made).
pub mod peak {
    extern "C" {
        fn tessera_oom_watch() -> i32;
        fn tessera_memory_peak_cpu() -> i64;
        fn tessera_memory_now_cpu() -> i64;
        fn tessera_memory_reset_peak(cuda_device: i32);
        fn tessera_memory_peak_cuda(cuda_device: i32, current: i32) -> i64;
    }

    /// The environment variable that turns the CPU count on (it costs a lock and a table
    /// insert per allocation, so runs do without it unless a benchmark asks).
    pub const CPU_VARIABLE: &str = "TESSERA_MEMORY_PEAK";

    /// Starts counting this thread's CPU allocations (idempotent; shared with the
    /// out-of-memory watch). False when a profiler holds the slot.
    pub fn watch_cpu() -> bool {
        // SAFETY: plain C call; installs a thread-local reporter in libtorch.
        unsafe { tessera_oom_watch() == 0 }
    }

    /// Bytes allocated now (counted as for [`bytes`]); `None` when nothing is counted.
    pub fn now(device: tch::Device) -> Option<u64> {
        // SAFETY: plain C calls reading counters.
        let v = match device {
            tch::Device::Cuda(i) => unsafe { tessera_memory_peak_cuda(i as i32, 1) },
            _ => unsafe { tessera_memory_now_cpu() },
        };
        (v > 0).then_some(v as u64)
    }

    /// Starts the peak again from what is allocated now.
    pub fn reset(device: tch::Device) {
        let index = match device {
            tch::Device::Cuda(i) => i as i32,
            _ => -1,
        };
        // SAFETY: plain C call.
        unsafe { tessera_memory_reset_peak(index) }
    }

    /// The peak since the last [`reset`], in bytes; `None` when nothing was counted.
    pub fn bytes(device: tch::Device) -> Option<u64> {
        // SAFETY: plain C calls reading counters.
        let v = match device {
            tch::Device::Cuda(i) => unsafe { tessera_memory_peak_cuda(i as i32, 0) },
            _ => unsafe { tessera_memory_peak_cpu() },
        };
        (v > 0).then_some(v as u64)
    }
}
