// Where a rank is, for the report of a collective that hangs (`host/src/dist/watch.rs`): c10d's
// count of the collectives this rank issued (its sequence number, per backend), and a look into
// the store that does not wait for a key.
#if __has_include(<torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>)
#include "dist_group.h"
#include "guarded.h"

#include <cstdint>
#include <string>
#include <vector>

namespace {
thread_local std::string last_error;
}

extern "C" {

const char* tessera_watch_last_error() { return last_error.c_str(); }

// The collectives issued so far on this rank: the CPU backend's (Gloo) plus the CUDA backend's
// when it is another one (NCCL); -1 on failure.
int64_t tessera_dist_sequence(void* group) {
  int64_t out = -1;
  tessera::guarded(last_error, [&] {
    auto pg = tessera::dist_process_group(group);
    auto cpu = pg->getBackend(c10::DeviceType::CPU);
    uint64_t n = cpu->getSequenceNumberForGroup();
    if (pg->hasBackends()) {
      try {
        auto cuda = pg->getBackend(c10::DeviceType::CUDA);
        if (cuda.get() != cpu.get()) {
          n += cuda->getSequenceNumberForGroup();
        }
      } catch (const std::exception&) {
      }
    }
    out = static_cast<int64_t>(n);
  });
  return out;
}

// 1 when the store holds `key`, 0 when not, -1 on failure (without waiting for it).
int tessera_dist_store_has(void* group, const char* key) {
  int out = -1;
  tessera::guarded(last_error, [&] {
    out = tessera::dist_store(group)->check({std::string(key)}) ? 1 : 0;
  });
  return out;
}

}  // extern "C"

#else
#include <cstdint>
extern "C" {
const char* tessera_watch_last_error() { return "no distributed support (c10d)"; }
int64_t tessera_dist_sequence(void*) { return -1; }
int tessera_dist_store_has(void*, const char*) { return -1; }
}
#endif
