// Setting or resetting a tensor's gradient (PyTorch's `param.grad = g` / `param.grad = None`),
// which tch cannot do. `Optimizer::zero_grad` resets with it, so that a parameter that gets no
// gradient in a step (a block stochastic depth dropped, a frozen layer) is skipped by the
// optimizer, as in PyTorch (`zero_grad(set_to_none=True)`, its default), instead of being
// stepped with zeros.
#include <ATen/ATen.h>

// Everything below is in a namespace of this file's own: the shims are compiled as one
// translation unit (csrc/shims.cpp), where the file's helpers must not meet another's.
namespace tessera_grad {

extern "C" {

// Sets `tensor`'s gradient to `grad` (an `at::Tensor*`, shared, not copied), or resets it when
// `grad` is null: a shard of a sharded parameter (ZeRO) takes its slice of the reduced gradient
// as its own without a copy. Returns 0, or -1 when libtorch threw.
int tessera_set_grad(void* tensor, void* grad) {
  try {
    auto& slot = static_cast<at::Tensor*>(tensor)->mutable_grad();
    if (grad == nullptr) {
      slot.reset();
    } else {
      slot = *static_cast<at::Tensor*>(grad);
    }
    return 0;
  } catch (...) {
    return -1;
  }
}

}

}  // namespace tessera_grad
