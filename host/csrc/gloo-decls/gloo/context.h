#pragma once
// Declarations only: see ../README.md. `ProcessGroupGloo::setTimeout`, an inline member the shim
// never calls, names `Context::setTimeout`.
#include <chrono>
namespace gloo {
class Context {
 public:
  void setTimeout(std::chrono::milliseconds timeout);
};
}  // namespace gloo
