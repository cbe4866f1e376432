// Multi-tensor optimizer steps for `host/src/optim` (one libtorch call per parameter group and
// operation instead of one per parameter), and a counter of libtorch operator calls for the
// `optim_ops` benchmark.
//
// SGD, Adam and AdamW go to libtorch's fused kernels (`at::_fused_sgd_`, `at::_fused_adam_`,
// `at::_fused_adamw_`: CPU and CUDA), with torch.optim's `_fused_*` semantics; the kernels read
// `found_inf` on the device and leave parameters and state alone when it holds 1, so the host
// never reads it. Lion has no fused kernel: it runs on `_foreach_*` operators (its caller reads
// `found_inf`: non-finite gradients cannot be masked by multiplying).
//
// Every function catches libtorch's exceptions and returns 0, or -1 with a message for
// `tessera_optim_last_error` (per thread). Tensors are tch tensors' `at::Tensor*`.
#include <ATen/ATen.h>

#include "guarded.h"
#include <ATen/record_function.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

// Everything below is in a namespace of this file's own: the shims are compiled as one
// translation unit (csrc/shims.cpp), where the file's helpers must not meet another's.
namespace tessera_optim {

namespace {

thread_local std::string last_error;

template <typename F>
int guarded(F f) {
  return tessera::guarded(last_error, f);
}

std::vector<at::Tensor> tensors_of(void** tensors, int n) {
  std::vector<at::Tensor> out;
  out.reserve(n);
  for (int i = 0; i < n; ++i) {
    out.push_back(*static_cast<at::Tensor*>(tensors[i]));
  }
  return out;
}

std::optional<at::Tensor> optional_of(void* tensor) {
  if (tensor == nullptr) {
    return std::nullopt;
  }
  return *static_cast<at::Tensor*>(tensor);
}

// The operator counter: calls seen by a thread-local `RecordFunction` callback, all of them and
// those made at the top level (not from inside another operator).
thread_local int64_t count_all = 0;
thread_local int64_t count_top = 0;
thread_local int64_t depth = 0;
thread_local std::optional<at::CallbackHandle> counter;

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction&) {
  ++count_all;
  if (depth == 0) {
    ++count_top;
  }
  ++depth;
  return nullptr;
}

void on_end(const at::RecordFunction&, at::ObserverContext*) { --depth; }

}  // namespace

extern "C" {

const char* tessera_optim_last_error() { return last_error.c_str(); }

// torch.optim.SGD(fused=True) on `n` parameters: `bufs` holds `n` momentum buffers, or is null
// when momentum is 0. `is_first_step`: the buffers are new and take the gradient as it is.
// `lr_tensor`: null, or a 0-dim tensor on the parameters' device holding the learning rate (read
// there, so a captured step replays with the rate of the moment; `lr` is then ignored).
int tessera_optim_fused_sgd(void** params, void** grads, void** bufs, int n, double weight_decay,
                            double momentum, double lr, double dampening, int nesterov,
                            int is_first_step, void* found_inf, void* lr_tensor) {
  return guarded([&] {
    std::vector<at::Tensor> buffers;
    if (bufs != nullptr) {
      buffers = tensors_of(bufs, n);
    }
    if (lr_tensor != nullptr) {
      at::_fused_sgd_(tensors_of(params, n), tensors_of(grads, n), buffers, weight_decay,
                      momentum, *static_cast<at::Tensor*>(lr_tensor), dampening, nesterov != 0,
                      /*maximize=*/false, is_first_step != 0, /*grad_scale=*/std::nullopt,
                      optional_of(found_inf));
      return;
    }
    at::_fused_sgd_(tensors_of(params, n), tensors_of(grads, n), buffers, weight_decay, momentum,
                    lr, dampening, nesterov != 0, /*maximize=*/false, is_first_step != 0,
                    /*grad_scale=*/std::nullopt, optional_of(found_inf));
  });
}

// torch.optim.Adam / AdamW(fused=True) on `n` parameters (`decoupled`: AdamW's decay of the
// weights, else Adam's L2 decay through the gradient). `steps` are the parameters' own float32
// step counts (as torch.optim keeps `state["step"]` per parameter), already advanced by the caller
// (torch.optim's `_fused_adam` does the same); the kernel only reads them.
int tessera_optim_fused_adam(void** params, void** grads, void** exp_avgs, void** exp_avg_sqs,
                             void** steps, int n, double lr, double beta1, double beta2,
                             double weight_decay, double eps, int decoupled, void* found_inf,
                             void* lr_tensor) {
  return guarded([&] {
    auto p = tensors_of(params, n);
    auto g = tensors_of(grads, n);
    auto m = tensors_of(exp_avgs, n);
    auto v = tensors_of(exp_avg_sqs, n);
    auto s = tensors_of(steps, n);
    auto flag = optional_of(found_inf);
    // The learning rate read on the device (see `tessera_optim_fused_sgd`).
    if (lr_tensor != nullptr) {
      const at::Tensor& rate = *static_cast<at::Tensor*>(lr_tensor);
      if (decoupled != 0) {
        at::_fused_adamw_(p, g, m, v, at::TensorList(), s, rate, beta1, beta2, weight_decay, eps,
                          /*amsgrad=*/false, /*maximize=*/false, std::nullopt, flag);
      } else {
        at::_fused_adam_(p, g, m, v, at::TensorList(), s, rate, beta1, beta2, weight_decay, eps,
                         /*amsgrad=*/false, /*maximize=*/false, std::nullopt, flag);
      }
      return;
    }
    if (decoupled != 0) {
      at::_fused_adamw_(p, g, m, v, at::TensorList(), s, lr, beta1, beta2, weight_decay, eps,
                        /*amsgrad=*/false, /*maximize=*/false, std::nullopt, flag);
    } else {
      at::_fused_adam_(p, g, m, v, at::TensorList(), s, lr, beta1, beta2, weight_decay, eps,
                       /*amsgrad=*/false, /*maximize=*/false, std::nullopt, flag);
    }
  });
}

// `tensors[i] *= factor` for the `n` tensors.
int tessera_optim_foreach_mul_scalar(void** tensors, int n, double factor) {
  return guarded([&] { at::_foreach_mul_(tensors_of(tensors, n), factor); });
}

// `tensors[i] *= factor` for the `n` tensors, `factor` a 0-dim tensor on their device.
int tessera_optim_foreach_mul(void** tensors, int n, void* factor) {
  return guarded([&] {
    at::_foreach_mul_(tensors_of(tensors, n), *static_cast<at::Tensor*>(factor));
  });
}

// Lion (Chen et al. 2023, as lucidrains' lion-pytorch) on `n` parameters with `_foreach_*`:
// `c = sign(b1·m + (1−b1)·g)`, `p ← p·(1 − lr·wd) − lr·c`, `m ← b2·m + (1−b2)·g`.
//
// With `found_inf` (a 0-dim float32 0 or 1 on the parameters' device) the step is masked on the
// device, without a read on the host: the gradients are replaced by zeros where the flag is set
// (non-finite gradients cannot be masked by multiplying: 0·inf is NaN), and the learning rate,
// the decay factor and `b2` become 0-dim tensors that are 0, 1 and 1 when it is set. When it is
// 0 the arithmetic is the unmasked step's, bit for bit (the same float32 factors).
int tessera_optim_foreach_lion(void** params, void** grads, void** exp_avgs, int n, double lr,
                               double beta1, double beta2, double weight_decay,
                               void* found_inf) {
  return guarded([&] {
    auto p = tensors_of(params, n);
    auto g = tensors_of(grads, n);
    auto m = tensors_of(exp_avgs, n);
    auto flag = optional_of(found_inf);
    if (!flag.has_value()) {
      auto c = at::_foreach_mul(m, beta1);
      at::_foreach_add_(c, g, 1.0 - beta1);
      at::_foreach_sign_(c);
      if (weight_decay != 0.0) {
        at::_foreach_mul_(p, 1.0 - lr * weight_decay);
      }
      at::_foreach_add_(p, c, -lr);
      at::_foreach_mul_(m, beta2);
      at::_foreach_add_(m, g, 1.0 - beta2);
      return;
    }
    auto masked = flag->ne(0);
    std::vector<at::Tensor> kept;
    kept.reserve(g.size());
    for (const auto& grad : g) {
      kept.push_back(at::where(masked, at::Scalar(0.0), grad));
    }
    // 0-dim float32 factors on the device: the unmasked step's value, or the masked one.
    auto factor = [&](double unmasked, double when_masked) {
      return at::where(masked, at::scalar_tensor(when_masked, flag->options()),
                       at::scalar_tensor(unmasked, flag->options()));
    };
    auto c = at::_foreach_mul(m, beta1);
    at::_foreach_add_(c, kept, 1.0 - beta1);
    at::_foreach_sign_(c);
    if (weight_decay != 0.0) {
      at::_foreach_mul_(p, factor(1.0 - lr * weight_decay, 1.0));
    }
    at::_foreach_mul_(c, factor(-lr, 0.0));
    at::_foreach_add_(p, c);
    at::_foreach_mul_(m, factor(beta2, 1.0));
    at::_foreach_add_(m, kept, 1.0 - beta2);
  });
}

// `tensors[i] += value` for the `n` tensors (Adam's per-parameter step counts).
int tessera_optim_foreach_add_scalar(void** tensors, int n, double value) {
  return guarded([&] { at::_foreach_add_(tensors_of(tensors, n), value); });
}

// `tensors[i] += alpha · other` for the `n` tensors, `other` a 0-dim tensor on their device
// (a masked step takes back its step count: `alpha = -1`, `other` the flag).
int tessera_optim_foreach_add_tensor(void** tensors, int n, void* other, double alpha) {
  return guarded([&] {
    at::_foreach_add_(tensors_of(tensors, n), *static_cast<at::Tensor*>(other), alpha);
  });
}

// Starts counting this thread's libtorch operator calls (from zero).
int tessera_optim_count_start() {
  return guarded([&] {
    if (counter.has_value()) {
      at::removeCallback(*counter);
    }
    count_all = 0;
    count_top = 0;
    depth = 0;
    counter = at::addThreadLocalCallback(
        at::RecordFunctionCallback(on_start, on_end).needsInputs(false).scopes(
            {at::RecordScope::FUNCTION}));
  });
}

// Stops counting; `*top` gets the calls made at the top level, `*all` every call (operators
// called by operators included).
int tessera_optim_count_stop(int64_t* top, int64_t* all) {
  return guarded([&] {
    if (counter.has_value()) {
      at::removeCallback(*counter);
      counter.reset();
    }
    *top = count_top;
    *all = count_all;
  });
}

}

}  // namespace tessera_optim
