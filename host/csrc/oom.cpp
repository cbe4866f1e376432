// Recognising out-of-memory errors by what the allocator reports, not by message text: tch turns
// every libtorch exception into a message, so the C++ type (`c10::OutOfMemoryError`) is lost by
// the time Rust sees the error. Both of libtorch's allocators report an allocation they cannot
// serve to the thread's memory reporter (`c10::reportOutOfMemoryToProfiler`) right before they
// throw: the CUDA caching allocator before its `OutOfMemoryError`, the default CPU allocator
// before rethrowing `alloc_cpu`'s error. This installs such a reporter on the training thread
// (autograd carries thread-local debug info to its device threads) and counts the reports: the
// trainer compares the count before and after a failed pass (`train.microbatch_size = "auto"`).
//
// The reporter takes libtorch's PROFILER_STATE slot; the trainer installs it only for auto
// microbatching. `memoryProfilingEnabled` must be true for the CPU allocator to report at all,
// which makes it keep a size table of live allocations (a lock and a hash insert per allocation).
#include <c10/core/Allocator.h>
#if __has_include(<c10/core/CachingDeviceAllocator.h>)
#include <c10/core/CachingDeviceAllocator.h>
#define TESSERA_DEVICE_ALLOCATOR 1
#endif
#include <c10/util/ThreadLocalDebugInfo.h>

#include <atomic>
#include <memory>

// Everything below is in a namespace of this file's own: the shims are compiled as one
// translation unit (csrc/shims.cpp), where the file's helpers must not meet another's.
namespace tessera_oom {

namespace {

std::atomic<long long> ooms{0};
// CPU bytes allocated on watched threads (and not freed yet), and their peak since the last
// reset: the CPU allocator passes its running total with every report.
std::atomic<long long> cpu_now{0};
std::atomic<long long> cpu_peak{0};

struct OomReporter : public c10::MemoryReportingInfoBase {
  void reportMemoryUsage(void* /*ptr*/, int64_t /*alloc_size*/, size_t total_allocated,
                         size_t /*total_reserved*/, c10::Device device) override {
    if (device.is_cpu()) {
      auto now = static_cast<long long>(total_allocated);
      cpu_now.store(now);
      auto peak = cpu_peak.load();
      while (now > peak && !cpu_peak.compare_exchange_weak(peak, now)) {
      }
    }
  }
  void reportOutOfMemory(int64_t /*alloc_size*/, size_t /*total_allocated*/,
                         size_t /*total_reserved*/, c10::Device /*device*/) override {
    ooms.fetch_add(1);
  }
  bool memoryProfilingEnabled() const override { return true; }
};

thread_local bool installed = false;

}  // namespace

extern "C" {

// Installs the reporter on this thread (once). Returns 0, 1 when another reporter (the profiler)
// holds the slot (OOMs are then not recognised), or -1 when libtorch threw.
int tessera_oom_watch() {
  try {
    if (installed) {
      return 0;
    }
    if (c10::ThreadLocalDebugInfo::get(c10::DebugInfoKind::PROFILER_STATE) != nullptr) {
      return 1;
    }
    c10::ThreadLocalDebugInfo::_push(c10::DebugInfoKind::PROFILER_STATE,
                                     std::make_shared<OomReporter>());
    installed = true;
    return 0;
  } catch (...) {
    return -1;
  }
}

// Allocations the allocators could not serve since the process started (on threads watched).
long long tessera_oom_count() { return ooms.load(); }

// The most CPU memory allocated at once on watched threads since the last reset (bytes; what
// was allocated before the watch started is not counted).
long long tessera_memory_peak_cpu() { return cpu_peak.load(); }
long long tessera_memory_now_cpu() { return cpu_now.load(); }

// The peak starts again from what is allocated now (CPU), or from the device's current use.
void tessera_memory_reset_peak(int cuda_device) {
  cpu_peak.store(cpu_now.load());
#ifdef TESSERA_DEVICE_ALLOCATOR
  if (cuda_device >= 0) {
    try {
      c10::getDeviceAllocator(c10::DeviceType::CUDA)
          ->resetPeakStats(static_cast<c10::DeviceIndex>(cuda_device));
    } catch (...) {
    }
  }
#else
  (void)cuda_device;
#endif
}

// The CUDA caching allocator's peak of allocated bytes on `cuda_device` since the last reset,
// or -1 when there is no such allocator.
// With `current`, the bytes allocated now instead.
long long tessera_memory_peak_cuda(int cuda_device, int current) {
#ifdef TESSERA_DEVICE_ALLOCATOR
  try {
    auto stats = c10::getDeviceAllocator(c10::DeviceType::CUDA)
                     ->getDeviceStats(static_cast<c10::DeviceIndex>(cuda_device));
    return static_cast<long long>(current != 0 ? stats.allocated_bytes[0].current
                                               : stats.allocated_bytes[0].peak);
  } catch (...) {
    return -1;
  }
#else
  (void)cuda_device;
  (void)current;
  return -1;
#endif
}

// Releases the CUDA caching allocator's unused blocks (`torch.cuda.empty_cache()`), after an
// out-of-memory error, before the retry with a smaller microbatch. Returns 0, or -1 when
// libtorch threw or has no device allocator interface.
int tessera_empty_cuda_cache() {
#ifdef TESSERA_DEVICE_ALLOCATOR
  try {
    c10::getDeviceAllocator(c10::DeviceType::CUDA)->emptyCache();
    return 0;
  } catch (...) {
    return -1;
  }
#else
  return -1;
#endif
}

}

}  // namespace tessera_oom
