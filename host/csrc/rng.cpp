// The state of libtorch's default CPU generator (dropout, randn, ... on the CPU), which tch
// cannot read or set: checkpoints save it so that a resumed run draws the same random numbers
// as the uninterrupted one (PyTorch's torch.get_rng_state / torch.set_rng_state). The same for
// each CUDA device's default generator (torch.cuda.get_rng_state_all / set_rng_state_all),
// through ATen's device-generic generator API, so this file needs no CUDA headers.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/detail/CUDAHooksInterface.h>

#include <cstring>
#include <mutex>

// Everything below is in a namespace of this file's own: the shims are compiled as one
// translation unit (csrc/shims.cpp), where the file's helpers must not meet another's.
namespace tessera_rng {

extern "C" {

// Copies the state into `out` when `capacity` is large enough; returns the state's size in
// bytes, or -1 when libtorch threw.
long long tessera_cpu_rng_state(unsigned char* out, long long capacity) {
  try {
    auto gen = at::detail::getDefaultCPUGenerator();
    at::Tensor state;
    {
      std::lock_guard<std::mutex> lock(gen.mutex());
      state = gen.get_state();
    }
    long long n = state.numel();
    if (out != nullptr && capacity >= n) {
      std::memcpy(out, state.data_ptr<uint8_t>(), static_cast<size_t>(n));
    }
    return n;
  } catch (...) {
    return -1;
  }
}

// Sets the state from `len` bytes written by tessera_cpu_rng_state. Returns 0, or -1 when
// libtorch refused them (wrong size or contents).
int tessera_set_cpu_rng_state(const unsigned char* data, long long len) {
  try {
    at::Tensor state = at::empty({len}, at::kByte);
    std::memcpy(state.data_ptr<uint8_t>(), data, static_cast<size_t>(len));
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(state);
    return 0;
  } catch (...) {
    return -1;
  }
}

// The state of CUDA device `device`'s default generator, as tessera_cpu_rng_state: its size in
// bytes (copied into `out` when `capacity` allows), or -1 when libtorch threw (no such device).
long long tessera_cuda_rng_state(int device, unsigned char* out, long long capacity) {
  try {
    auto gen = at::globalContext().defaultGenerator(
        c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device)));
    at::Tensor state;
    {
      std::lock_guard<std::mutex> lock(gen.mutex());
      state = gen.get_state();
    }
    state = state.to(at::kCPU).contiguous();
    long long n = state.numel();
    if (out != nullptr && capacity >= n) {
      std::memcpy(out, state.data_ptr<uint8_t>(), static_cast<size_t>(n));
    }
    return n;
  } catch (...) {
    return -1;
  }
}

// Sets CUDA device `device`'s default generator from `len` bytes written by
// tessera_cuda_rng_state. Returns 0, or -1 when libtorch refused them.
int tessera_set_cuda_rng_state(int device, const unsigned char* data, long long len) {
  try {
    at::Tensor state = at::empty({len}, at::kByte);
    std::memcpy(state.data_ptr<uint8_t>(), data, static_cast<size_t>(len));
    auto gen = at::globalContext().defaultGenerator(
        c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device)));
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(state);
    return 0;
  } catch (...) {
    return -1;
  }
}

}

}  // namespace tessera_rng
