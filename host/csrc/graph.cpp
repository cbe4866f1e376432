// CUDA graphs for `train.cuda_graphs` (host/src/trainer/graph.rs): a training step's kernels
// captured once with `at::cuda::CUDAGraph` and replayed per batch, as `torch.cuda.graph` does.
//
// Capture runs on a side stream from libtorch's pool (a capture cannot run on the legacy default
// stream), which first waits for the work already queued on the current stream; the graph's
// memory comes from a private pool of the caching allocator, so the tensors made during capture
// (activations, gradients, the loss) keep their addresses on every replay. Replay enqueues the
// whole step on the current stream with one launch.
//
// Compiled with `TESSERA_CUDA_GRAPHS` when libtorch has CUDA and its headers were found (see
// build.rs); otherwise every call fails with a message saying so. Every function catches
// libtorch's exceptions and returns 0, or -1 with a message for `tessera_graph_last_error`.
#include <ATen/ATen.h>

#include "guarded.h"

#include <memory>
#include <optional>
#include <string>

#ifdef TESSERA_CUDA_GRAPHS
// Only declarations of CUDA's runtime are used here: the graph is libtorch_cuda's, streams and
// events go through c10 (libc10_cuda), so nothing links the CUDA runtime directly.
#include <ATen/cuda/CUDAGraph.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace {

thread_local std::string last_error;

template <typename F>
int guarded(F f) {
  return tessera::guarded(last_error, f);
}

#ifdef TESSERA_CUDA_GRAPHS
struct Graph {
  at::cuda::CUDAGraph graph;
  c10::DeviceIndex device = 0;
  std::optional<c10::cuda::CUDAStream> capture_stream;
  std::optional<c10::cuda::CUDAStream> previous;
  bool captured = false;
};
#else
struct Graph {};
[[noreturn]] void unavailable() {
  throw std::runtime_error(
      "this build of Tessera has no CUDA graphs: it was built against a libtorch without CUDA, "
      "or without the CUDA headers (scripts/ensure-libtorch.sh installs them from PyPI)");
}
#endif

}  // namespace

extern "C" {

const char* tessera_graph_last_error() { return last_error.c_str(); }

// 1 when this build can capture CUDA graphs.
int tessera_graph_available() {
#ifdef TESSERA_CUDA_GRAPHS
  return 1;
#else
  return 0;
#endif
}

// A new, empty graph for CUDA device `device` (owned by the caller: `tessera_graph_free`), or
// null (see `tessera_graph_last_error`).
void* tessera_graph_new(int device) {
  Graph* out = nullptr;
  int rc = guarded([&] {
#ifdef TESSERA_CUDA_GRAPHS
    auto graph = std::make_unique<Graph>();
    graph->device = static_cast<c10::DeviceIndex>(device);
    out = graph.release();
#else
    (void)device;
    unavailable();
#endif
  });
  return rc == 0 ? out : nullptr;
}

void tessera_graph_free(void* graph) { delete static_cast<Graph*>(graph); }

// Starts capturing: the kernels this thread enqueues on its device until
// `tessera_graph_capture_end` are recorded, not run. Waits (on the device) for the work already
// queued on the current stream, then makes a side stream current for the capture.
int tessera_graph_capture_begin(void* graph) {
  return guarded([&] {
#ifdef TESSERA_CUDA_GRAPHS
    auto* g = static_cast<Graph*>(graph);
    if (g->captured) {
      throw std::runtime_error("this graph was captured already (make a new one)");
    }
    c10::DeviceGuard guard(c10::Device(c10::kCUDA, g->device));
    auto previous = c10::cuda::getCurrentCUDAStream(g->device);
    auto side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, g->device);
    // The side stream starts after everything queued so far (an event, not a host wait).
    c10::Event ready(c10::kCUDA);
    ready.record(previous.unwrap());
    ready.block(side.unwrap());
    c10::cuda::setCurrentCUDAStream(side);
    g->previous = previous;
    g->capture_stream = side;
    g->graph.capture_begin();
#else
    (void)graph;
    unavailable();
#endif
  });
}

// Ends the capture started by `tessera_graph_capture_begin` and restores the stream that was
// current; that stream waits (on the device) for the side stream. The graph's kernels have not
// run: `tessera_graph_replay` runs them.
int tessera_graph_capture_end(void* graph) {
  return guarded([&] {
#ifdef TESSERA_CUDA_GRAPHS
    auto* g = static_cast<Graph*>(graph);
    if (!g->previous.has_value() || !g->capture_stream.has_value()) {
      throw std::runtime_error("capture_end without capture_begin");
    }
    c10::DeviceGuard guard(c10::Device(c10::kCUDA, g->device));
    // The stream is restored even when the capture failed (an operation that cannot be
    // captured: a host read, a blocking copy).
    struct Restore {
      Graph* g;
      ~Restore() { c10::cuda::setCurrentCUDAStream(*g->previous); }
    } restore{g};
    g->graph.capture_end();
    g->captured = true;
    c10::Event done(c10::kCUDA);
    done.record(g->capture_stream->unwrap());
    done.block(g->previous->unwrap());
#else
    (void)graph;
    unavailable();
#endif
  });
}

// Runs the captured kernels once, on the current stream's device, in capture order.
int tessera_graph_replay(void* graph) {
  return guarded([&] {
#ifdef TESSERA_CUDA_GRAPHS
    auto* g = static_cast<Graph*>(graph);
    if (!g->captured) {
      throw std::runtime_error("replay of a graph that was not captured");
    }
    c10::DeviceGuard guard(c10::Device(c10::kCUDA, g->device));
    g->graph.replay();
#else
    (void)graph;
    unavailable();
#endif
  });
}

}
