// The input pipeline's CUDA calls that tch does not reach: pinned host memory, a side stream for
// copying the next batch while the current step runs, an event the compute stream waits on, and
// `record_stream` so the caching allocator does not hand a copied tensor's memory to the side
// stream while the compute stream still reads it (PyTorch's `pin_memory`, `torch.cuda.Stream`,
// `torch.cuda.Event`, `Tensor.record_stream`).
//
// Everything goes through c10's device-generic interface (`c10::Stream`, `c10::Event`, the
// registered `DeviceGuardImplInterface`), as torch's own `torch.Stream`/`torch.Event` do: the
// shim compiles with or without the CUDA headers and needs no CUDA library at link time; at run
// time libtorch_cuda (linked `--no-as-needed`, see build.rs) provides the CUDA implementation,
// and a libtorch without it gives an error. A stream crosses to Rust as its id (`pack3`).
#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <cstring>
#include <string>
#include <vector>

// Everything below is in a namespace of this file's own: the shims are compiled as one
// translation unit (csrc/shims.cpp), where the file's helpers must not meet another's.
namespace tessera_stream {

namespace {
thread_local std::string last_error;

int fail(const std::exception& e) {
  last_error = e.what();
  return -1;
}

c10::Device cuda(int device) {
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(device));
}

c10::Stream stream_of(int device, long long id) {
  return c10::Stream::unpack3(static_cast<c10::StreamId>(id),
                              static_cast<c10::DeviceIndex>(device), c10::kCUDA);
}
}  // namespace

extern "C" {

// The message of the last failed call on this thread.
const char* tessera_stream_last_error() { return last_error.c_str(); }

// A stream of CUDA device `device` from libtorch's pool (`torch.cuda.Stream()` takes one too),
// as its id in `out`. Returns 0, or -1 (see `tessera_stream_last_error`).
int tessera_stream_from_pool(int device, long long* out) {
  try {
    c10::impl::VirtualGuardImpl impl(c10::kCUDA);
    *out = impl.getStreamFromGlobalPool(cuda(device), /*isHighPriority=*/false).id();
    return 0;
  } catch (const std::exception& e) {
    return fail(e);
  }
}

// The current stream of CUDA device `device` on this thread, as its id in `out`.
int tessera_stream_current(int device, long long* out) {
  try {
    c10::impl::VirtualGuardImpl impl(c10::kCUDA);
    *out = impl.getStream(cuda(device)).id();
    return 0;
  } catch (const std::exception& e) {
    return fail(e);
  }
}

// Makes stream `id` the current stream of `device` on this thread (where libtorch enqueues
// kernels, copies and allocations); writes the stream it replaces in `previous`.
int tessera_stream_exchange(int device, long long id, long long* previous) {
  try {
    c10::impl::VirtualGuardImpl impl(c10::kCUDA);
    *previous = impl.exchangeStream(stream_of(device, id)).id();
    return 0;
  } catch (const std::exception& e) {
    return fail(e);
  }
}

// A new event (created on the device at its first record). Null on failure.
void* tessera_event_new() {
  try {
    return new c10::Event(c10::kCUDA);
  } catch (const std::exception& e) {
    fail(e);
    return nullptr;
  }
}

void tessera_event_free(void* event) { delete static_cast<c10::Event*>(event); }

// Records `event` on stream `id` of `device`: it completes when the work enqueued there so far
// does.
int tessera_event_record(void* event, int device, long long id) {
  try {
    static_cast<c10::Event*>(event)->record(stream_of(device, id));
    return 0;
  } catch (const std::exception& e) {
    return fail(e);
  }
}

// Makes stream `id` of `device` wait (on the device, without blocking the host) until `event`
// completes.
int tessera_event_block(void* event, int device, long long id) {
  try {
    static_cast<c10::Event*>(event)->block(stream_of(device, id));
    return 0;
  } catch (const std::exception& e) {
    return fail(e);
  }
}

// Marks `tensor`'s memory as used by stream `id` of `device`: the caching allocator keeps it
// until that stream's work enqueued so far is done, even once the tensor is freed.
int tessera_record_stream(void* tensor, int device, long long id) {
  try {
    static_cast<at::Tensor*>(tensor)->record_stream(stream_of(device, id));
    return 0;
  } catch (const std::exception& e) {
    return fail(e);
  }
}

// A new contiguous CPU tensor of `sizes` (`ndim` of them) and scalar type `dtype` (c10's
// numbering, as tch's `Kind`) in pinned (page-locked) memory, filled with the `nbytes` at
// `data`. Returns a new `at::Tensor*`, or null. The memory comes from libtorch's caching host
// allocator, which keeps it until the copies that read it are done.
void* tessera_pinned_copy(const void* data, long long nbytes, int dtype, const long long* sizes,
                          int ndim) {
  try {
    std::vector<int64_t> shape(sizes, sizes + ndim);
    auto options = at::TensorOptions()
                       .dtype(static_cast<c10::ScalarType>(dtype))
                       .device(c10::kCPU)
                       .pinned_memory(true);
    at::Tensor tensor = at::empty(shape, options);
    if (static_cast<long long>(tensor.nbytes()) != nbytes) {
      last_error = "pinned copy: " + std::to_string(nbytes) + " bytes for a tensor of " +
                   std::to_string(tensor.nbytes());
      return nullptr;
    }
    if (nbytes > 0) {
      std::memcpy(tensor.data_ptr(), data, static_cast<size_t>(nbytes));
    }
    return new at::Tensor(std::move(tensor));
  } catch (const std::exception& e) {
    fail(e);
    return nullptr;
  }
}

}

}  // namespace tessera_stream
