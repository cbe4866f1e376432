// libtorch's process-wide CUDA settings, which tch does not reach: deterministic algorithms and
// cuDNN's choices (`torch.use_deterministic_algorithms`, `torch.backends.cudnn.deterministic` /
// `.benchmark`), the float32 matmul precision (`torch.set_float32_matmul_precision`), the number
// of CUDA devices and the calling thread's current device (`torch.cuda.set_device`).
//
// Everything goes through ATen's device-generic interfaces (the global context, the CUDA hooks,
// the device guard registry), so this file compiles without CUDA headers and works on a
// libtorch without CUDA (no device). Every function catches libtorch's exceptions and returns -1,
// leaving the message for `tessera_context_last_error` (per thread).
#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <string>

// Everything below is in a namespace of this file's own: the shims are compiled as one
// translation unit (csrc/shims.cpp), where the file's helpers must not meet another's.
namespace tessera_context {

namespace {

thread_local std::string last_error;

template <typename F>
int guarded(F f) {
  try {
    return f();
  } catch (const c10::Error& e) {
    last_error = e.what_without_backtrace();
  } catch (const std::exception& e) {
    last_error = e.what();
  } catch (...) {
    last_error = "unknown C++ exception";
  }
  return -1;
}

}  // namespace

extern "C" {

const char* tessera_context_last_error() { return last_error.c_str(); }

// CUDA devices this process can use: 0 without CUDA (no device, no driver, or a libtorch built
// without it).
int tessera_cuda_device_count() {
  return guarded([] {
    if (!at::detail::getCUDAHooks().hasCUDA()) {
      return 0;
    }
    return static_cast<int>(at::detail::getCUDAHooks().deviceCount());
  });
}

// Makes CUDA device `index` the calling thread's current device (where CUDA work that names no
// device goes, and where this process's CUDA context is created).
int tessera_cuda_set_device(int index) {
  return guarded([&] {
    c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)
        ->setDevice(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(index)));
    return 0;
  });
}

// deterministic: deterministic algorithms everywhere (errors, not warnings, for an operation
// that has none) and deterministic cuDNN. benchmark: cuDNN tries its algorithms for each new
// shape and keeps the fastest.
int tessera_set_determinism(int deterministic, int benchmark) {
  return guarded([&] {
    auto& ctx = at::globalContext();
    ctx.setDeterministicAlgorithms(deterministic != 0, /*warn_only=*/false);
    ctx.setDeterministicCuDNN(deterministic != 0);
    ctx.setBenchmarkCuDNN(benchmark != 0);
    return 0;
  });
}

// Bits: 1 deterministic algorithms, 2 their warn-only mode, 4 deterministic cuDNN, 8 cuDNN
// benchmark.
int tessera_determinism() {
  return guarded([] {
    auto& ctx = at::globalContext();
    return (ctx.deterministicAlgorithms() ? 1 : 0) |
           (ctx.deterministicAlgorithmsWarnOnly() ? 2 : 0) |
           (ctx.deterministicCuDNN() ? 4 : 0) | (ctx.benchmarkCuDNN() ? 8 : 0);
  });
}

// "highest", "high" or "medium", as torch.set_float32_matmul_precision.
int tessera_set_matmul_precision(const char* precision) {
  return guarded([&] {
    at::globalContext().setFloat32MatmulPrecision(std::string(precision));
    return 0;
  });
}

// 0 highest, 1 high, 2 medium.
int tessera_matmul_precision() {
  return guarded([] {
    switch (at::globalContext().float32MatmulPrecision()) {
      case at::Float32MatmulPrecision::HIGH:
        return 1;
      case at::Float32MatmulPrecision::MEDIUM:
        return 2;
      default:
        return 0;
    }
  });
}

}

}  // namespace tessera_context
