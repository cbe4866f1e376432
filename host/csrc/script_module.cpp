// A TorchScript module (`torch.jit.script(model).save(path)`) for `[model] torchscript`. tch's
// `CModule` lists parameters but not buffers (BatchNorm's running statistics), which the host
// must train, checkpoint and restore like a zoo model's, so the few calls needed are here.
#include <torch/script.h>

#include <cstring>
#include <string>
#include <unordered_set>

// Everything below is in a namespace of this file's own: the shims are compiled as one
// translation unit (csrc/shims.cpp), where the file's helpers must not meet another's.
namespace tessera_script_module {

namespace {
thread_local std::string last_error;

int fail(const std::exception& e) {
  last_error = e.what();
  return -1;
}
}  // namespace

extern "C" {

// The message of the last failed call on this thread.
const char* tessera_script_last_error() { return last_error.c_str(); }

// Loads the module at `path` onto `device` (-1 = CPU, else the CUDA index). Returns it, or null
// (see `tessera_script_last_error`).
void* tessera_script_load(const char* path, int device) {
  try {
    c10::Device dev = device < 0 ? c10::Device(c10::kCPU)
                                 : c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(device));
    return new torch::jit::Module(torch::jit::load(path, dev));
  } catch (const std::exception& e) {
    fail(e);
    return nullptr;
  }
}

void tessera_script_free(void* module) { delete static_cast<torch::jit::Module*>(module); }

// Calls `visit(data, name, tensor, is_parameter)` for every parameter and buffer in PyTorch's
// `state_dict` order (each module's parameters, then its buffers, then its children's) under its
// `state_dict` name. A tensor shared by two modules is listed once, under its first name.
// `tensor` is a new `at::Tensor*` sharing the module's storage, owned by the callee.
int tessera_script_named_tensors(void* module, void* data,
                                 void (*visit)(void*, const char*, void*, int)) {
  try {
    auto& root = *static_cast<torch::jit::Module*>(module);
    std::unordered_set<const void*> seen;
    for (const auto& m : root.named_modules()) {
      std::string prefix = m.name.empty() ? "" : m.name + ".";
      auto emit = [&](const std::string& name, const at::Tensor& t, int is_parameter) {
        if (!t.defined() || !seen.insert(t.unsafeGetTensorImpl()).second) {
          return;
        }
        visit(data, (prefix + name).c_str(), new at::Tensor(t), is_parameter);
      };
      for (const auto& p : m.value.named_parameters(/*recurse=*/false)) emit(p.name, p.value, 1);
      for (const auto& b : m.value.named_buffers(/*recurse=*/false)) emit(b.name, b.value, 0);
    }
    return 0;
  } catch (const std::exception& e) {
    return fail(e);
  }
}

// Runs `forward(input)` in training (`train` = 1) or evaluation mode, as PyTorch's
// `module.train(train)` sets it on every submodule. Returns a new `at::Tensor*`, or null.
void* tessera_script_forward(void* module, void* input, int train) {
  try {
    auto& m = *static_cast<torch::jit::Module*>(module);
    m.train(train != 0);
    auto output = m.forward({*static_cast<at::Tensor*>(input)});
    if (!output.isTensor()) {
      last_error = "forward returned " + output.tagKind() + ", not a tensor";
      return nullptr;
    }
    return new at::Tensor(output.toTensor());
  } catch (const std::exception& e) {
    fail(e);
    return nullptr;
  }
}

}

}  // namespace tessera_script_module
