// The shims' error convention: a C function runs its body through `tessera::guarded`, which
// catches libtorch's exceptions and returns 0, or -1 with the message in the shim's own
// thread-local `last_error` (read back by its `tessera_*_last_error`). c10 errors keep their
// message without the C++ backtrace.
#pragma once

#include <c10/util/Exception.h>

#include <exception>
#include <string>

namespace tessera {

template <typename F>
int guarded(std::string& last_error, F f) {
  try {
    f();
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

}  // namespace tessera
