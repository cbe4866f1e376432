// The process group and store behind a `tessera_dist_init` handle, for the other c10d shims
// (`full_shard.cpp`, `dist_watch.cpp`).
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace tessera {

c10::intrusive_ptr<c10d::ProcessGroup> dist_process_group(void* group);

c10::intrusive_ptr<c10d::Store> dist_store(void* group);

}  // namespace tessera
