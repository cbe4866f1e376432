// Dynamic loss scaling on the device (PyTorch's GradScaler): checking the gradients for
// infinities and NaNs and unscaling them in one multi-tensor call, with no read on the host.
// tch does not bind `_amp_foreach_non_finite_check_and_unscale_` (it returns nothing and takes a
// tensor list).
#include <ATen/ATen.h>

#include <string>
#include <vector>

// Everything below is in a namespace of this file's own: the shims are compiled as one
// translation unit (csrc/shims.cpp), where the file's helpers must not meet another's.
namespace tessera_amp {

namespace {
thread_local std::string last_error;
}

extern "C" {

const char* tessera_amp_last_error() { return last_error.c_str(); }

// `grads` are `n` tch tensors (`at::Tensor*`) on the device of `found_inf` (a one-element
// float32 tensor, set to 1 when any holds an infinity or a NaN) and `inv_scale` (a one-element
// float32 tensor each gradient is multiplied by). Returns 0, or -1 with a message for
// tessera_amp_last_error.
int tessera_amp_unscale(void** grads, int n, void* found_inf, void* inv_scale) {
  try {
    std::vector<at::Tensor> list;
    list.reserve(n);
    for (int i = 0; i < n; ++i) {
      list.push_back(*static_cast<at::Tensor*>(grads[i]));
    }
    at::_amp_foreach_non_finite_check_and_unscale_(list, *static_cast<at::Tensor*>(found_inf),
                                                   *static_cast<at::Tensor*>(inv_scale));
    return 0;
  } catch (const c10::Error& e) {
    last_error = e.what_without_backtrace();
  } catch (const std::exception& e) {
    last_error = e.what();
  } catch (...) {
    last_error = "unknown C++ exception";
  }
  return -1;
}

}

}  // namespace tessera_amp
