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

namespace {

std::atomic<long long> ooms{0};

struct OomReporter : public c10::MemoryReportingInfoBase {
  void reportMemoryUsage(void* /*ptr*/, int64_t /*alloc_size*/, size_t /*total_allocated*/,
                         size_t /*total_reserved*/, c10::Device /*device*/) override {}
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
