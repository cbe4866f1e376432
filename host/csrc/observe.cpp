// The step observer: every libtorch operator call that makes the host wait for the device,
// seen by a thread-local `RecordFunction` callback on the training thread (libtorch carries it
// to the autograd threads that run the backward pass), not by what the trainer remembers to
// count. `host/src/sync.rs` arms it and reads the counts; run.json reports them (`host_reads`).
//
// What counts as a read (once, at the outermost such call: `item` calls `_local_scalar_dense`,
// `masked_select` may call `nonzero`):
// - a value read on the host: `aten::_local_scalar_dense` and the calls made of it (`item`,
//   tch's `*_value`), `is_nonzero` (a tensor used as a bool), `equal` and `allclose` (they
//   answer a bool);
// - an operator whose output shape depends on the values (`nonzero`, `argwhere`,
//   `masked_select`, the `unique` family): the host needs the count before it allocates;
// - a blocking copy between host and device: `to` / `_to_copy` with a target device and
//   `non_blocking = false` whose source is on another device or whose target is the CPU, and
//   `copy_` between devices without `non_blocking`. On CUDA a blocking copy synchronises the
//   stream either way (a read back, or an upload from pageable memory), so an upload counts
//   too. On a CPU run source and target are both the CPU: every blocking `to(cpu)` without a
//   dtype counts, as it would be a read on a GPU (a `to(device)` of a host-made tensor is a
//   blocking upload there), while the trainer's own batch copies are `non_blocking` and do
//   not, and neither does a dtype conversion (it names the tensor's own device, the GPU on a
//   GPU run). Not seen on a CPU run: tch's `Vec::try_from` and `copy_data` of a CPU tensor,
//   which copy the memory without an operator (on a GPU they make a `to(cpu)`, counted); the
//   trainer's own reads go through `sync::read`, counted beside (run.json's `counted`).
//
// Each read is charged to the source the host set on the thread (`tessera_observe_source`: the
// method whose hook runs, the plugin module whose forward runs, or the trainer) and to its
// operator's name. The counts are the armed thread's (trainers on two threads keep theirs apart)
// plus those of the autograd engine's device threads, where a CUDA backward pass runs.
// libtorch is built with NDEBUG: `RecordFunction::inputs()` asserts in a build without it (its
// `inputs_valid_` flag is only ever set in debug builds of libtorch), so the callback would see
// no inputs and print a warning per call.
#ifndef NDEBUG
#define NDEBUG
#endif
#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include "guarded.h"

#include <c10/util/Backtrace.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

// Everything below is in a namespace of this file's own: the shims are compiled as one
// translation unit (csrc/shims.cpp), where the file's helpers must not meet another's.
namespace tessera_observe {

namespace {

// Reads counted on one thread: (source, operator) -> reads.
struct Counts {
  int64_t total = 0;
  // Operator calls: at the top level (not made by another operator), and all of them.
  int64_t top_operators = 0;
  int64_t all_operators = 0;
  std::map<std::pair<std::string, std::string>, int64_t> table;
  void add(const char* source, const char* op) {
    ++total;
    table[{std::string(source), std::string(op)}] += 1;
  }
};

// The armed thread's own counts (no lock: only that thread writes and reads them), so that
// trainers on two threads of one process (the library's tests) keep theirs apart.
thread_local std::unique_ptr<Counts> mine;
// Reads on threads the observer reached without being armed there: the autograd engine's
// device threads, which run a CUDA backward pass (a CPU backward runs on the calling thread).
std::mutex others_lock;
Counts others;

thread_local std::optional<at::CallbackHandle> handle;
// The source reads are charged to, set by the host on the training thread (it keeps the string
// alive while it is set); other threads charge theirs to "backward".
thread_local const char* source = nullptr;
// The depth of nested counted calls on this thread: only the outermost one counts.
thread_local int counted_depth = 0;
// The depth of nested operator calls on this thread.
thread_local int depth = 0;

bool starts_with(const char* name, const char* prefix) {
  return std::strncmp(name, prefix, std::strlen(prefix)) == 0;
}

// The depth of libtorch CPU kernels that read scalars of host memory on this thread (see
// `reads_host_memory`): reads inside them are not counted.
thread_local int host_kernel_depth = 0;

// A non-null context marks a counted call or such a kernel, so that its end lowers the depth.
struct Counted : public at::ObserverContext {
  bool host_kernel = false;
};

// The fused optimizer kernels on CPU tensors: libtorch's CPU implementations read the step
// count, the learning rate tensor and `found_inf` with `item`, from host memory (no wait); on
// CUDA the same kernels read them on the device. Reads nested in them are not counted.
bool reads_host_memory(const at::RecordFunction& fn, const char* op) {
  if (!starts_with(op, "aten::_fused_")) {
    return false;
  }
  auto inputs = fn.inputs();
  if (inputs.empty() || !inputs[0].isTensorList()) {
    return false;
  }
  auto list = inputs[0].toTensorList();
  return list.size() > 0 && static_cast<at::Tensor>(list.get(0)).device().is_cpu();
}

// A value read on the host, or an output shaped by the values.
bool reads_values(const char* op) {
  static const char* const names[] = {
      "aten::_local_scalar_dense", "aten::item", "aten::is_nonzero", "aten::equal",
      "aten::allclose", "aten::nonzero", "aten::nonzero_numpy", "aten::argwhere",
      "aten::masked_select",
  };
  for (const char* n : names) {
    if (std::strcmp(op, n) == 0) {
      return true;
    }
  }
  return starts_with(op, "aten::unique") || starts_with(op, "aten::_unique");
}

std::optional<c10::Device> device_of(const c10::IValue& v) {
  if (v.isDevice()) {
    return v.toDevice();
  }
  if (v.isTensor() && v.toTensor().defined()) {
    return v.toTensor().device();
  }
  return std::nullopt;
}

bool is_true(const c10::IValue& v) { return v.isBool() && v.toBool(); }

// `to` and `_to_copy`: the target device and `non_blocking`, by overload.
bool blocking_transfer(const at::RecordFunction& fn, const char* op) {
  bool to = std::strcmp(op, "aten::to") == 0;
  bool to_copy = std::strcmp(op, "aten::_to_copy") == 0;
  bool copy = std::strcmp(op, "aten::copy_") == 0;
  if (!to && !to_copy && !copy) {
    return false;
  }
  auto inputs = fn.inputs();
  if (inputs.empty() || !inputs[0].isTensor() || !inputs[0].toTensor().defined()) {
    return false;
  }
  c10::Device from = inputs[0].toTensor().device();
  if (copy) {
    // copy_(self, src, non_blocking): self is the target.
    if (inputs.size() < 2) {
      return false;
    }
    auto src = device_of(inputs[1]);
    bool non_blocking = inputs.size() > 2 && is_true(inputs[2]);
    return src.has_value() && src->type() != from.type() && !non_blocking;
  }
  // Positions of (device, non_blocking) in each overload's schema.
  size_t device_at = 0;
  size_t non_blocking_at = 0;
  std::string overload;
  if (auto name = fn.operator_name()) {
    overload = name->overload_name;
  }
  if (to_copy || overload == "dtype_layout") {
    // (self, dtype, layout, device, pin_memory, non_blocking, ...)
    device_at = 3;
    non_blocking_at = 5;
  } else if (overload == "device") {
    // (self, device, dtype, non_blocking, copy, memory_format)
    device_at = 1;
    non_blocking_at = 3;
  } else if (overload == "other") {
    // (self, other, non_blocking, copy, memory_format)
    device_at = 1;
    non_blocking_at = 2;
  } else {
    return false;  // `to.dtype`: no device
  }
  if (inputs.size() <= std::max(device_at, non_blocking_at)) {
    return false;
  }
  auto target = device_of(inputs[device_at]);
  if (!target.has_value() || is_true(inputs[non_blocking_at])) {
    return false;
  }
  if (target->type() != from.type()) {
    return true;
  }
  // Both on the CPU: a transfer on a GPU run when no dtype is given (`to(cpu)`). A dtype
  // conversion names the tensor's own device too (`toType`, tch's `to_kind`, also to the same
  // dtype), and on a GPU that device is the GPU: no transfer.
  bool converts = (to_copy || overload == "dtype_layout") && !inputs[1].isNone();
  return target->is_cpu() && !converts;
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  if (mine) {
    ++mine->all_operators;
    if (depth == 0) {
      ++mine->top_operators;
    }
  }
  ++depth;
  const char* op = fn.name();
  if (op == nullptr || !starts_with(op, "aten::")) {
    return nullptr;
  }
  if (reads_host_memory(fn, op)) {
    ++host_kernel_depth;
    auto ctx = std::make_unique<Counted>();
    ctx->host_kernel = true;
    return ctx;
  }
  bool counted = host_kernel_depth == 0 && (reads_values(op) || blocking_transfer(fn, op));
  if (!counted) {
    return nullptr;
  }
  if (counted_depth++ == 0) {
    // `TESSERA_TRACE_HOST_READS=1`: each read is printed with the stack that made it, to find
    // the line behind a count in run.json.
    static const bool trace = std::getenv("TESSERA_TRACE_HOST_READS") != nullptr;
    if (trace) {
      std::cerr << "host read: " << op << " (" << (source != nullptr ? source : "trainer")
                << ")\n"
                << c10::get_backtrace(/*frames_to_skip=*/1, /*maximum_number_of_frames=*/40)
                << std::endl;
    }
    if (mine) {
      mine->add(source != nullptr ? source : "trainer", op);
    } else {
      std::lock_guard<std::mutex> lock(others_lock);
      others.add("backward", op);
    }
  }
  return std::make_unique<Counted>();
}

void on_end(const at::RecordFunction&, at::ObserverContext* ctx) {
  --depth;
  if (ctx == nullptr) {
    return;
  }
  if (static_cast<Counted*>(ctx)->host_kernel) {
    --host_kernel_depth;
  } else {
    --counted_depth;
  }
}

thread_local std::string last_error;

template <typename F>
int guarded(F f) {
  return tessera::guarded(last_error, f);
}

}  // namespace

extern "C" {

const char* tessera_observe_last_error() { return last_error.c_str(); }

// Arms the observer on this thread (once; later calls do nothing). Returns 0, or -1.
int tessera_observe_start() {
  return guarded([] {
    if (handle.has_value()) {
      return;
    }
    if (!mine) {
      mine = std::make_unique<Counts>();
    }
    handle = at::addThreadLocalCallback(
        at::RecordFunctionCallback(on_start, on_end).needsInputs(true).scopes(
            {at::RecordScope::FUNCTION}));
  });
}

// Disarms the observer on this thread.
int tessera_observe_stop() {
  return guarded([] {
    if (handle.has_value()) {
      at::removeCallback(*handle);
      handle.reset();
    }
  });
}

// Whether the observer is armed on this thread.
int tessera_observe_armed() { return handle.has_value() ? 1 : 0; }

// The reads counted on this thread since it was first armed, plus those of unarmed threads
// (a CUDA backward pass).
long long tessera_observe_reads() {
  int64_t n = mine ? mine->total : 0;
  std::lock_guard<std::mutex> lock(others_lock);
  return static_cast<long long>(n + others.total);
}

// The operator calls seen on this thread since it was first armed: `*top` those made at the top
// level (by the host or a plugin, not by another operator), `*all` every one.
void tessera_observe_operators(long long* top, long long* all) {
  *top = mine ? static_cast<long long>(mine->top_operators) : 0;
  *all = mine ? static_cast<long long>(mine->all_operators) : 0;
}

// Charges this thread's reads that follow to `name` (a NUL-terminated string the caller keeps
// alive until the next call; null: the trainer); returns the previous source.
const char* tessera_observe_source(const char* name) {
  const char* previous = source;
  source = name;
  return previous;
}

// Calls `visit(context, source, operator, count)` for every (source, operator) counted so far,
// as `tessera_observe_reads` counts them.
void tessera_observe_table(void* context,
                           void (*visit)(void*, const char*, const char*, long long)) {
  std::map<std::pair<std::string, std::string>, int64_t> copy;
  if (mine) {
    copy = mine->table;
  }
  {
    std::lock_guard<std::mutex> lock(others_lock);
    for (const auto& [key, count] : others.table) {
      copy[key] += count;
    }
  }
  for (const auto& [key, count] : copy) {
    visit(context, key.first.c_str(), key.second.c_str(), static_cast<long long>(count));
  }
}

}

}  // namespace tessera_observe
