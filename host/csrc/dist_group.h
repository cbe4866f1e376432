// The process group behind a `tessera_dist_init` handle, for the other c10d shims
// (`full_shard.cpp`).
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

namespace tessera {

c10::intrusive_ptr<c10d::ProcessGroup> dist_process_group(void* group);

}  // namespace tessera
