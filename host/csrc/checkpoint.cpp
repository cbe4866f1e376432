// Activation checkpointing (`train.activation_checkpointing`): a custom autograd function, as
// PyTorch's reentrant `torch.utils.checkpoint` (CheckpointFunction). Its forward runs a unit of
// the model (a Rust callback) without recording a graph, keeping only the unit's input, the CPU
// and CUDA generator states and the autocast state; its backward runs the unit again on a
// detached copy of the input with those states restored (so dropout draws the same masks), then
// back-propagates through the recomputed graph (a reentrant backward: the unit's parameters
// accumulate their gradients as usual) and returns the input's gradient.
//
// The callback never unwinds: it returns nonzero with a message, which becomes a C++ exception
// here and reaches the caller of `backward` (or of the forward) as an error.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>

#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>

#include "guarded.h"

// Everything below is in a namespace of this file's own: the shims are compiled as one
// translation unit (csrc/shims.cpp), where the file's helpers must not meet another's.
namespace tessera_checkpoint {

extern "C" {
// The callback's phases: the forward; the recompute in backward; the end of the backward
// through the recomputed graph (no input, no output: the unit puts back what the recompute
// changed, which that backward may still have needed as it was).
enum { TESSERA_UNIT_FORWARD = 0, TESSERA_UNIT_RECOMPUTE = 1, TESSERA_UNIT_RECOMPUTED = 2 };
// Runs the unit on `input` (an owned `at::Tensor*` the callee frees) in `phase`. Returns 0 with
// an owned `at::Tensor*` in `*output`, or nonzero with a NUL-terminated message written into
// `message` (at most `capacity` bytes).
typedef int (*tessera_unit_fn)(void* context, int phase, void* input, void** output,
                               char* message, size_t capacity);
// Frees the callback's context (when the autograd graph that holds it goes away).
typedef void (*tessera_unit_drop)(void* context);
}

namespace {

thread_local std::string last_error;

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor generator_state(at::Generator gen) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_generator_state(at::Generator gen, const at::Tensor& state) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// One device type's autocast settings.
struct Autocast {
  at::DeviceType device;
  bool enabled;
  at::ScalarType dtype;

  static Autocast of(at::DeviceType device) {
    return {device, at::autocast::is_autocast_enabled(device),
            at::autocast::get_autocast_dtype(device)};
  }
};

// The callback, its context (freed with the last reference) and what the forward saw.
struct Unit : torch::CustomClassHolder {
  tessera_unit_fn run;
  tessera_unit_drop drop;
  void* context;
  at::Tensor cpu_rng;
  std::optional<c10::Device> cuda;
  at::Tensor cuda_rng;
  Autocast cpu_autocast{at::kCPU, false, at::kBFloat16};
  Autocast cuda_autocast{at::kCUDA, false, at::kHalf};
  bool autocast_cache = true;

  Unit(tessera_unit_fn run, tessera_unit_drop drop, void* context)
      : run(run), drop(drop), context(context) {}
  Unit(const Unit&) = delete;
  Unit& operator=(const Unit&) = delete;
  ~Unit() override { drop(context); }

  at::Tensor call(int phase, const at::Tensor* input) {
    char message[4096] = {0};
    void* output = nullptr;
    int rc = run(context, phase, input != nullptr ? new at::Tensor(*input) : nullptr, &output,
                 message, sizeof(message));
    if (rc != 0 || (input != nullptr && output == nullptr)) {
      message[sizeof(message) - 1] = 0;
      throw std::runtime_error(message[0] != 0 ? message : "the checkpointed unit failed");
    }
    if (output == nullptr) {
      return at::Tensor();
    }
    auto* owned = static_cast<at::Tensor*>(output);
    at::Tensor out = std::move(*owned);
    delete owned;
    return out;
  }
};

// Sets the generators to the forward's states for its lifetime, then back to what they were.
class ReplayRng {
 public:
  explicit ReplayRng(const Unit& unit) : unit_(unit) {
    auto cpu = at::detail::getDefaultCPUGenerator();
    cpu_now_ = generator_state(cpu);
    if (unit.cuda) {
      auto gen = at::globalContext().defaultGenerator(*unit.cuda);
      cuda_now_ = generator_state(gen);
      set_generator_state(gen, unit.cuda_rng);
    }
    set_generator_state(cpu, unit.cpu_rng);
  }
  ~ReplayRng() {
    try {
      set_generator_state(at::detail::getDefaultCPUGenerator(), cpu_now_);
      if (unit_.cuda) {
        set_generator_state(at::globalContext().defaultGenerator(*unit_.cuda), cuda_now_);
      }
    } catch (...) {
      // A destructor must not throw; the state was read from these generators, so setting it
      // back does not fail in practice.
    }
  }

 private:
  const Unit& unit_;
  at::Tensor cpu_now_;
  at::Tensor cuda_now_;
};

// Enters the forward's autocast settings for its lifetime (as `torch.autocast(...)` in
// PyTorch's recompute), then restores the thread's own.
class ReplayAutocast {
 public:
  explicit ReplayAutocast(const Unit& unit)
      : saved_{Autocast::of(at::kCPU), Autocast::of(at::kCUDA)},
        cache_(at::autocast::is_autocast_cache_enabled()) {
    wanted_[0] = unit.cpu_autocast;
    wanted_[1] = unit.cuda_autocast;
    at::autocast::set_autocast_cache_enabled(unit.autocast_cache);
    for (const auto& a : wanted_) {
      at::autocast::set_autocast_dtype(a.device, a.dtype);
      at::autocast::set_autocast_enabled(a.device, a.enabled);
      if (a.enabled) {
        at::autocast::increment_nesting();
      }
    }
  }
  ~ReplayAutocast() {
    for (const auto& a : wanted_) {
      if (a.enabled && at::autocast::decrement_nesting() == 0) {
        at::autocast::clear_cache();
      }
    }
    for (const auto& a : saved_) {
      at::autocast::set_autocast_dtype(a.device, a.dtype);
      at::autocast::set_autocast_enabled(a.device, a.enabled);
    }
    at::autocast::set_autocast_cache_enabled(cache_);
  }

 private:
  Autocast saved_[2];
  Autocast wanted_[2] = {{at::kCPU, false, at::kBFloat16}, {at::kCUDA, false, at::kHalf}};
  bool cache_;
};

struct Checkpoint : public torch::autograd::Function<Checkpoint> {
  static at::Tensor forward(AutogradContext* ctx, at::Tensor input,
                            c10::intrusive_ptr<Unit> unit) {
    unit->cpu_rng = generator_state(at::detail::getDefaultCPUGenerator());
    if (input.is_cuda()) {
      unit->cuda = input.device();
      unit->cuda_rng = generator_state(at::globalContext().defaultGenerator(input.device()));
    }
    unit->cpu_autocast = Autocast::of(at::kCPU);
    unit->cuda_autocast = Autocast::of(at::kCUDA);
    unit->autocast_cache = at::autocast::is_autocast_cache_enabled();
    ctx->save_for_backward({input});
    at::Tensor output;
    {
      at::NoGradGuard no_grad;
      output = unit->call(TESSERA_UNIT_FORWARD, &input);
    }
    ctx->saved_data["unit"] = c10::IValue::make_capsule(unit);
    return output;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!torch::autograd::Engine::get_default_engine().is_checkpoint_valid()) {
      throw std::runtime_error(
          "activation checkpointing works with a whole backward pass (`loss.backward()`), "
          "not with gradients of chosen inputs (`torch.autograd.grad`)");
    }
    auto unit = c10::static_intrusive_pointer_cast<Unit>(ctx->saved_data["unit"].toCapsule());
    at::Tensor input = ctx->get_saved_variables()[0];
    at::Tensor detached = input.detach();
    detached.requires_grad_(true);
    at::Tensor output;
    {
      ReplayRng rng(*unit);
      ReplayAutocast autocast(*unit);
      at::AutoGradMode grad(true);
      output = unit->call(TESSERA_UNIT_RECOMPUTE, &detached);
    }
    try {
      if (grads[0].defined() && output.requires_grad()) {
        torch::autograd::backward({output}, {grads[0]});
      }
    } catch (...) {
      try {
        unit->call(TESSERA_UNIT_RECOMPUTED, nullptr);
      } catch (...) {
        // The backward's own error is the one to report.
      }
      throw;
    }
    unit->call(TESSERA_UNIT_RECOMPUTED, nullptr);
    return {detached.grad(), at::Tensor()};
  }
};

}  // namespace

extern "C" {

const char* tessera_checkpoint_last_error() { return last_error.c_str(); }

// Runs the unit on `input` (a tch tensor's `at::Tensor*`) as a checkpointed autograd function
// when grad mode is on and the input requires a gradient, else plainly (nothing to recompute).
// Either way `drop(context)` is called exactly once: when the graph that holds it goes, or
// before returning. Returns 0 with an owned `at::Tensor*` in `*output`, or -1 (the message in
// `tessera_checkpoint_last_error`).
int tessera_checkpoint(void* input, tessera_unit_fn run, tessera_unit_drop drop, void* context,
                       void** output) {
  *output = nullptr;
  // Owned from here, so the context is freed on every path.
  auto unit = c10::make_intrusive<Unit>(run, drop, context);
  return tessera::guarded(last_error, [&] {
    const auto& x = *static_cast<at::Tensor*>(input);
    at::Tensor out;
    if (at::GradMode::is_enabled() && x.requires_grad()) {
      out = Checkpoint::apply(x, std::move(unit));
    } else {
      out = unit->call(TESSERA_UNIT_FORWARD, &x);
    }
    *output = new at::Tensor(std::move(out));
  });
}

}

}  // namespace tessera_checkpoint
