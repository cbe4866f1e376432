// Autocast control for any device type. tch's own `autocast` only drives CUDA autocast, so
// `amp_bf16` on CPU needs these few lines of libtorch C++.
#include <ATen/autocast_mode.h>

// Everything below is in a namespace of this file's own: the shims are compiled as one
// translation unit (csrc/shims.cpp), where the file's helpers must not meet another's.
namespace tessera_autocast {

extern "C" {

// device: 0 = CPU, 1 = CUDA. dtype: 0 = bfloat16, 1 = float16.
// Returns the previous enabled state (0/1), or -1 when libtorch threw.
int tessera_autocast_set(int device, int enabled, int dtype) {
  try {
    at::DeviceType dev = device == 1 ? at::kCUDA : at::kCPU;
    bool previous = at::autocast::is_autocast_enabled(dev);
    if (enabled) {
      at::autocast::set_autocast_dtype(dev, dtype == 1 ? at::kHalf : at::kBFloat16);
      at::autocast::increment_nesting();
    } else if (previous) {
      if (at::autocast::decrement_nesting() == 0) {
        at::autocast::clear_cache();
      }
    }
    at::autocast::set_autocast_enabled(dev, enabled != 0);
    return previous ? 1 : 0;
  } catch (...) {
    return -1;
  }
}

}

}  // namespace tessera_autocast
