// Data-parallel training on libtorch's own collective engine, c10d: a `TCPStore` rendezvous, a
// process group with a Gloo backend for CPU tensors and, for CUDA tensors, either NCCL (GPU to
// GPU) or Gloo (through host copies), and c10d's `Reducer`, the engine of PyTorch's
// DistributedDataParallel: it registers hooks on the parameters' gradient accumulators and
// all-reduces gradients in buckets while the backward pass goes on.
//
// The NCCL backend is compiled only with `-DUSE_C10D_NCCL` (build.rs sets it when it finds the
// NCCL and CUDA runtime headers and a libtorch_cuda to link: its symbols live there).
//
// Every function catches libtorch's exceptions; a failing call returns null or -1 and leaves its
// message for `tessera_dist_last_error` (per thread).
#if __has_include(<torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>)
#define USE_C10D_GLOO 1
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/logger.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "dist_group.h"
#include "guarded.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

thread_local std::string last_error;

struct Group {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  std::chrono::milliseconds timeout;
  bool nccl = false;
};

struct Reducer {
  std::shared_ptr<c10d::Reducer> reducer;
  std::shared_ptr<c10d::Logger> logger;
};

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

c10d::ReduceOp op_of(int op) {
  switch (op) {
    case 1:
      return c10d::ReduceOp(c10d::ReduceOp::MAX);
    case 2:
      return c10d::ReduceOp(c10d::ReduceOp::MIN);
    default:
      return c10d::ReduceOp(c10d::ReduceOp::SUM);
  }
}

// Sum over the ranks whose gradient is the sum over the ranks of the output's gradient: the
// statistics of synchronised batch norm go through it.
struct AllReduceSum : public torch::autograd::Function<AllReduceSum> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, at::Tensor input,
                            int64_t group) {
    ctx->saved_data["group"] = group;
    auto* g = reinterpret_cast<Group*>(group);
    std::vector<at::Tensor> t{input.clone(at::MemoryFormat::Contiguous)};
    g->pg->allreduce(t)->wait();
    return t[0];
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* g = reinterpret_cast<Group*>(ctx->saved_data["group"].toInt());
    std::vector<at::Tensor> t{grads[0].clone(at::MemoryFormat::Contiguous)};
    g->pg->allreduce(t)->wait();
    return {t[0], at::Tensor()};
  }
};

// c10d's reducer warns at the first step when `find_unused_parameters` found every parameter
// used; Tessera turns the option on by default (a method may freeze or skip layers at any step)
// and documents its cost, so that one warning is dropped and every other one passed on.
class QuietUnusedParameters : public c10::WarningHandler {
 public:
  explicit QuietUnusedParameters(c10::WarningHandler* next) : next_(next) {}
  void process(const c10::Warning& warning) override {
    if (warning.msg().find("find_unused_parameters=True was specified") != std::string::npos) {
      return;
    }
    next_->process(warning);
  }

 private:
  c10::WarningHandler* next_;
};

// Sharded gradients (ZeRO-2): each flat buffer's gradients reduce-scattered as soon as the
// backward pass has produced all of them, as c10d's Reducer all-reduces its buckets: a post
// hook on each parameter's gradient accumulator counts the parameters still to come; a buffer
// whose parameters are all there is packed (its gradients copied in, then freed), divided by
// the world size and reduce-scattered into this rank's slice. Buffers are launched in one fixed
// order (the last first, as backward produces them) on every rank, the next only when those
// before it were, so the ranks' collectives always match.
struct ShardMember {
  at::Tensor param;
  int64_t offset;
  std::vector<int64_t> size, strides;
  bool fired = false;
  bool hooked = false;
};

struct ShardFlat {
  std::vector<ShardMember> members;
  int64_t shard = 0;
  int pending = 0;
  bool launched = false;
  at::Tensor out;
  at::Tensor packed;
  c10::intrusive_ptr<c10d::Work> work;
};

struct ShardState {
  Group* group = nullptr;
  int world = 1;
  // `[distributed] reduce_dtype = "bf16"`: floating gradients go over the wire (and are summed)
  // in bfloat16; each rank's slice comes back in the parameter's dtype.
  bool reduce_bf16 = false;
  std::vector<ShardFlat> flats;
  size_t next = 0;  // index into the launch order (flats from the last to the first)
  bool armed = false;
  bool alive = true;
  std::string error;  // the first failure inside a hook, reported by `finish`
  std::mutex mu;
  std::vector<c10::intrusive_ptr<torch::autograd::Node>> accumulators;
  std::deque<ShardFlat*> in_flight;

  size_t order(size_t i) const { return flats.size() - 1 - i; }

  void launch(ShardFlat& f) {
    f.launched = true;
    auto& first = f.members.front().param;
    auto wire = first.options().requires_grad(false);
    if (reduce_bf16 && first.is_floating_point()) {
      wire = wire.dtype(at::kBFloat16);
    }
    auto packed = at::zeros({f.shard * world}, wire);
    for (auto& m : f.members) {
      auto& grad = m.param.mutable_grad();
      if (grad.defined()) {
        packed.as_strided(m.size, m.strides, m.offset).copy_(grad);
        grad.reset();
      }
    }
    packed.div_(static_cast<double>(world));
    f.out = at::empty({f.shard}, packed.options());
    c10d::ReduceScatterOptions options;
    options.reduceOp = c10d::ReduceOp(c10d::ReduceOp::SUM);
    f.work = group->pg->_reduce_scatter_base(f.out, packed, options);
    f.packed = packed;
    // At most two buffers in flight: an older one is waited for and let go, so that its packed
    // copy is freed (the work holds it) and the gradients never sit in memory twice over.
    in_flight.push_back(&f);
    while (in_flight.size() > 2) {
      settle(*in_flight.front());
      in_flight.pop_front();
    }
  }

  // Waits for `f`'s reduce-scatter and frees its packed copy here, on the training thread
  // (the work may be destroyed on a Gloo thread, where the allocator's count would not see it).
  static void settle(ShardFlat& f) {
    if (f.work) {
      f.work->wait();
      f.work.reset();
    }
    if (f.packed.defined()) {
      f.packed.storage().unsafeGetStorageImpl()->reset();
      f.packed = at::Tensor();
    }
  }

  // Launches, in order, every buffer whose parameters are all there (or all, `force`).
  void advance(bool force) {
    while (next < flats.size()) {
      auto& f = flats[order(next)];
      if (!force && f.pending > 0) {
        return;
      }
      launch(f);
      ++next;
    }
  }

  void fired(size_t flat, size_t member) {
    std::lock_guard<std::mutex> lock(mu);
    if (!alive || !armed || !error.empty()) {
      return;
    }
    auto& m = flats[flat].members[member];
    if (m.fired) {
      return;
    }
    m.fired = true;
    flats[flat].pending -= 1;
    try {
      advance(false);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }

  void hook(size_t flat, size_t member, const std::shared_ptr<ShardState>& self) {
    auto& m = flats[flat].members[member];
    if (m.hooked || !m.param.requires_grad()) {
      return;
    }
    auto acc = torch::autograd::impl::grad_accumulator(m.param);
    if (!acc) {
      return;
    }
    std::weak_ptr<ShardState> weak = self;
    acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [weak, flat, member](const torch::autograd::variable_list& outputs,
                             const torch::autograd::variable_list&) {
          if (auto state = weak.lock()) {
            state->fired(flat, member);
          }
          return outputs;
        }));
    accumulators.push_back(std::move(acc));
    m.hooked = true;
  }
};

struct ShardReducer {
  std::shared_ptr<ShardState> state;
};

}  // namespace

namespace tessera {
c10::intrusive_ptr<c10d::ProcessGroup> dist_process_group(void* group) {
  return static_cast<Group*>(group)->pg;
}
c10::intrusive_ptr<c10d::Store> dist_store(void* group) {
  return static_cast<Group*>(group)->store;
}
}  // namespace tessera

extern "C" {

const char* tessera_dist_last_error() { return last_error.c_str(); }

// 1 when this build has c10d's NCCL backend, 0 otherwise.
int tessera_dist_has_nccl() {
#ifdef USE_C10D_NCCL
  return 1;
#else
  return 0;
#endif
}

// Joins the group of `world` ranks whose store rank 0 serves at `addr:port`. Waits up to
// `timeout_ms` for every rank (rendezvous); collectives time out after `op_timeout_ms`. CPU
// tensors always go through Gloo; CUDA tensors through NCCL on device `cuda_device` when
// `backend` is 1 (the communicator is created here, so a failing NCCL shows at the join),
// through Gloo when it is 0.
void* tessera_dist_init(const char* addr, int port, int rank, int world,
                        int64_t timeout_ms, int64_t op_timeout_ms, int backend,
                        int cuda_device) {
  Group* out = nullptr;
  guarded([&] {
#ifndef USE_C10D_NCCL
    if (backend == 1) {
      throw std::runtime_error(
          "this Tessera was built without c10d's NCCL backend (its build found no NCCL and "
          "CUDA runtime headers, or no libtorch_cuda); see docs/distributed.md");
    }
#endif
    c10d::TCPStoreOptions options;
    options.port = static_cast<uint16_t>(port);
    options.isServer = rank == 0;
    options.numWorkers = world;
    options.waitWorkers = true;
    options.timeout = std::chrono::milliseconds(timeout_ms);
    auto store = c10::make_intrusive<c10d::TCPStore>(std::string(addr), options);
    auto base = c10::static_intrusive_pointer_cast<c10d::Store>(store);
    auto gloo_options =
        c10d::ProcessGroupGloo::Options::create(std::chrono::milliseconds(op_timeout_ms));
    // The device binds the address this host resolves to, or the loopback address.
    gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    auto gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(base, rank, world, gloo_options);
    auto pg = c10::make_intrusive<c10d::ProcessGroup>(base, rank, world);
    // Barriers and the trainer's small host values stay on Gloo.
    pg->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
#ifdef USE_C10D_NCCL
    if (backend == 1) {
      at::Device device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(cuda_device));
      pg->setBoundDeviceId(device);
      auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
      nccl_options->timeout = std::chrono::milliseconds(op_timeout_ms);
      // Its own key space in the store, as PyTorch gives each backend.
      auto nccl_store = c10::make_intrusive<c10d::PrefixStore>("nccl/", base);
      auto nccl =
          c10::make_intrusive<c10d::ProcessGroupNCCL>(nccl_store, rank, world, nccl_options);
      pg->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, gloo);
      pg->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::NCCL, nccl);
      nccl->eagerConnectSingleDevice(device);
    } else
#endif
    {
      pg->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, gloo);
      pg->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::GLOO, gloo);
    }
    out = new Group{base, pg, std::chrono::milliseconds(op_timeout_ms), backend == 1};
  });
  return out;
}

// Leaves the group. NCCL's communicators are aborted first: when the group goes, the run's
// collectives have completed (or a rank failed, and a clean NCCL shutdown could wait on it),
// and a ProcessGroupNCCL destroyed without it warns.
void tessera_dist_free(void* group) {
  auto* g = static_cast<Group*>(group);
  if (g != nullptr && g->nccl) {
    guarded([&] { g->pg->abort(); });
  }
  delete g;
}

// In place over the ranks: op 0 sum, 1 max, 2 min. Waits for the result.
int tessera_dist_all_reduce(void* group, void** tensors, int n, int op) {
  return guarded([&] {
    auto t = tensors_of(tensors, n);
    c10d::AllreduceOptions options;
    options.reduceOp = op_of(op);
    static_cast<Group*>(group)->pg->allreduce(t, options)->wait();
  });
}

// In place: every rank's tensors become `root`'s.
int tessera_dist_broadcast(void* group, void** tensors, int n, int root) {
  return guarded([&] {
    auto t = tensors_of(tensors, n);
    c10d::BroadcastOptions options;
    options.rootRank = root;
    static_cast<Group*>(group)->pg->broadcast(t, options)->wait();
  });
}

int tessera_dist_barrier(void* group) {
  return guarded([&] { static_cast<Group*>(group)->pg->barrier()->wait(); });
}

// The store: small values between ranks (per-rank checkpoint parts).
int tessera_dist_store_set(void* group, const char* key, const uint8_t* data, size_t len) {
  return guarded([&] {
    std::vector<uint8_t> value(data, data + len);
    static_cast<Group*>(group)->store->set(std::string(key), value);
  });
}

// Waits for `key` (up to the collective timeout) and hands its value to `put(out, data, len)`.
int tessera_dist_store_get(void* group, const char* key, void* out,
                           void (*put)(void*, const uint8_t*, size_t)) {
  return guarded([&] {
    auto* g = static_cast<Group*>(group);
    g->store->wait({std::string(key)}, g->timeout);
    auto value = g->store->get(std::string(key));
    put(out, value.data(), value.size());
  });
}

int tessera_dist_store_delete(void* group, const char* key) {
  return guarded([&] { static_cast<Group*>(group)->store->deleteKey(std::string(key)); });
}

// A new tensor, the sum of `input` over the ranks, differentiable (see `AllReduceSum`).
void* tessera_dist_all_reduce_autograd(void* group, void* input) {
  at::Tensor* out = nullptr;
  guarded([&] {
    auto result = AllReduceSum::apply(*static_cast<at::Tensor*>(input),
                                      reinterpret_cast<int64_t>(group));
    out = new at::Tensor(std::move(result));
  });
  return out;
}

// c10d's Reducer over `params` (those that need gradients), buckets as PyTorch DDP assigns them
// (a small first bucket, then `bucket_cap_bytes`, last layers first).
void* tessera_dist_reducer_new(void* group, void** params, int n, int64_t bucket_cap_bytes,
                               int find_unused, int bucket_view) {
  Reducer* out = nullptr;
  guarded([&] {
    auto* g = static_cast<Group*>(group);
    auto tensors = tensors_of(params, n);
    std::vector<bool> sparse(tensors.size(), false);
    const size_t first_bucket = 1024 * 1024;
    auto [buckets, limits] = c10d::compute_bucket_assignment_by_size(
        tensors, {first_bucket, static_cast<size_t>(bucket_cap_bytes)}, sparse);
    std::reverse(buckets.begin(), buckets.end());
    std::vector<int64_t> caps(limits.rbegin(), limits.rend());
    auto reducer = std::make_shared<c10d::Reducer>(
        tensors, buckets, g->pg, sparse, bucket_cap_bytes, find_unused != 0,
        /*gradient_as_bucket_view=*/bucket_view != 0, std::unordered_map<size_t, std::string>{},
        static_cast<int64_t>(first_bucket), /*skip_all_reduce_unused_params=*/false,
        /*use_python_reducer=*/false, caps);
    auto logger = std::make_shared<c10d::Logger>(reducer);
    reducer->set_logger(logger);
    // The handler is per thread: this is the training thread, which runs the reducer's steps.
    static thread_local QuietUnusedParameters quiet(c10::WarningUtils::get_warning_handler());
    c10::WarningUtils::set_warning_handler(&quiet);
    out = new Reducer{reducer, logger};
  });
  return out;
}

void tessera_dist_reducer_free(void* reducer) { delete static_cast<Reducer*>(reducer); }

// Before the forward pass of a step whose backward is synchronised (timing statistics).
int tessera_dist_reducer_prepare_forward(void* reducer) {
  return guarded([&] {
    auto* r = static_cast<Reducer*>(reducer);
    r->logger->set_runtime_stats_and_log();
    r->reducer->prepare_for_forward();
  });
}

// Before `loss.backward()`: the next backward pass all-reduces the gradients (averaged).
int tessera_dist_reducer_prepare_backward(void* reducer, void* loss) {
  return guarded([&] {
    static_cast<Reducer*>(reducer)->reducer->prepare_for_backward(
        {*static_cast<at::Tensor*>(loss)});
  });
}

// Sharded training (ZeRO): `out` (world × n elements, contiguous) becomes the concatenation of
// every rank's `in` (n elements), in rank order. Waits for the result. With `release`, `in` is
// a temporary whose memory is freed here once the collective is done (on this thread: the
// work may be destroyed on a Gloo thread, where the allocator's count would not see the free).
int tessera_dist_all_gather_base(void* group, void* out, void* in, int release) {
  return guarded([&] {
    auto& o = *static_cast<at::Tensor*>(out);
    auto& i = *static_cast<at::Tensor*>(in);
    static_cast<Group*>(group)->pg->_allgather_base(o, i)->wait();
    if (release != 0) {
      i.storage().unsafeGetStorageImpl()->reset();
    }
  });
}

// Sharded gradients: a reducer over `n_flats` flat buffers. Member i of all of them (in buffer
// order) is `params[i]`, laid at `offsets[i]` with `dims[i]` dimensions whose sizes and strides
// follow in `sizes`/`strides` (concatenated); `counts[f]` members belong to buffer f, whose
// slice per rank is `shards[f]` elements.
void* tessera_shard_reducer_new(void* group, int world, void** params, const int64_t* offsets,
                                const int64_t* dims, const int64_t* sizes,
                                const int64_t* strides, const int64_t* counts,
                                const int64_t* shards, int n_flats, int reduce_bf16) {
  ShardReducer* out = nullptr;
  guarded([&] {
    auto state = std::make_shared<ShardState>();
    state->group = static_cast<Group*>(group);
    state->world = world;
    state->reduce_bf16 = reduce_bf16 != 0;
    size_t i = 0;
    size_t d = 0;
    for (int f = 0; f < n_flats; ++f) {
      ShardFlat flat;
      flat.shard = shards[f];
      for (int64_t k = 0; k < counts[f]; ++k, ++i) {
        ShardMember m;
        m.param = *static_cast<at::Tensor*>(params[i]);
        m.offset = offsets[i];
        m.size.assign(sizes + d, sizes + d + dims[i]);
        m.strides.assign(strides + d, strides + d + dims[i]);
        d += dims[i];
        flat.members.push_back(std::move(m));
      }
      state->flats.push_back(std::move(flat));
    }
    out = new ShardReducer{state};
  });
  return out;
}

void tessera_shard_reducer_free(void* reducer) {
  auto* r = static_cast<ShardReducer*>(reducer);
  if (r != nullptr) {
    std::lock_guard<std::mutex> lock(r->state->mu);
    r->state->alive = false;
    r->state->accumulators.clear();
  }
  delete r;
}

// Before a backward pass whose gradients are reduce-scattered: hooks the parameters that need
// gradients (again after a method unfroze some) and starts counting.
int tessera_shard_reducer_arm(void* reducer) {
  return guarded([&] {
    auto& state = static_cast<ShardReducer*>(reducer)->state;
    std::lock_guard<std::mutex> lock(state->mu);
    for (size_t f = 0; f < state->flats.size(); ++f) {
      auto& flat = state->flats[f];
      flat.pending = 0;
      flat.launched = false;
      flat.out = at::Tensor();
      flat.work.reset();
      for (size_t m = 0; m < flat.members.size(); ++m) {
        state->hook(f, m, state);
        flat.members[m].fired = false;
        if (flat.members[m].hooked && flat.members[m].param.requires_grad()) {
          flat.pending += 1;
        }
      }
    }
    state->next = 0;
    state->in_flight.clear();
    state->error.clear();
    state->armed = true;
  });
}

// After the backward pass: launches the buffers still waiting (parameters that got no gradient
// count as zeros), waits for every reduce-scatter, and hands over buffer f's slice as `outs[f]`
// (a new `at::Tensor*`) and, per member in order, 1 when it got a gradient here (`fired`).
int tessera_shard_reducer_finish(void* reducer, void** outs, uint8_t* fired) {
  return guarded([&] {
    auto& state = static_cast<ShardReducer*>(reducer)->state;
    std::lock_guard<std::mutex> lock(state->mu);
    state->armed = false;
    if (!state->error.empty()) {
      throw std::runtime_error("reduce-scattering gradients during backward: " + state->error);
    }
    state->advance(true);
    size_t i = 0;
    for (size_t f = 0; f < state->flats.size(); ++f) {
      auto& flat = state->flats[f];
      ShardState::settle(flat);
      auto dtype = flat.members.front().param.scalar_type();
      outs[f] = new at::Tensor(flat.out.scalar_type() == dtype ? flat.out : flat.out.to(dtype));
      flat.out = at::Tensor();
      for (auto& m : flat.members) {
        fired[i++] = m.fired ? 1 : 0;
      }
    }
  });
}

// PyTorch DDP's own timing of the sampled steps, in nanoseconds: forward, backward compute,
// backward communication, and their overlap; 0 until measured.
int tessera_dist_reducer_stats(void* reducer, int64_t* out) {
  return guarded([&] {
    auto data = static_cast<Reducer*>(reducer)->logger->get_ddp_logging_data();
    const char* keys[] = {"avg_forward_compute_time", "avg_backward_compute_time",
                          "avg_backward_comm_time", "avg_backward_compute_comm_overlap_time"};
    for (int i = 0; i < 4; ++i) {
      auto it = data.ints_map.find(keys[i]);
      out[i] = it == data.ints_map.end() ? 0 : it->second;
    }
  });
}

}

#else
// This libtorch was built without c10d (no distributed headers): every call fails with a message.
#include <cstddef>
#include <cstdint>
namespace {
const char* kNone =
    "this libtorch was built without distributed support (c10d); data-parallel training needs "
    "a libtorch with it, as PyPI's Linux wheels are";
}
extern "C" {
const char* tessera_dist_last_error() { return kNone; }
int tessera_dist_has_nccl() { return 0; }
void* tessera_dist_init(const char*, int, int, int, int64_t, int64_t, int, int) {
  return nullptr;
}
void tessera_dist_free(void*) {}
int tessera_dist_all_reduce(void*, void**, int, int) { return -1; }
int tessera_dist_broadcast(void*, void**, int, int) { return -1; }
int tessera_dist_barrier(void*) { return -1; }
int tessera_dist_store_set(void*, const char*, const uint8_t*, size_t) { return -1; }
int tessera_dist_store_get(void*, const char*, void*, void (*)(void*, const uint8_t*, size_t)) {
  return -1;
}
int tessera_dist_store_delete(void*, const char*) { return -1; }
void* tessera_dist_all_reduce_autograd(void*, void*) { return nullptr; }
void* tessera_dist_reducer_new(void*, void**, int, int64_t, int, int) { return nullptr; }
void tessera_dist_reducer_free(void*) {}
int tessera_dist_reducer_prepare_forward(void*) { return -1; }
int tessera_dist_reducer_prepare_backward(void*, void*) { return -1; }
int tessera_dist_reducer_stats(void*, int64_t*) { return -1; }
int tessera_dist_all_gather_base(void*, void*, void*, int) { return -1; }
void* tessera_shard_reducer_new(void*, int, void**, const int64_t*, const int64_t*,
                                const int64_t*, const int64_t*, const int64_t*, const int64_t*,
                                int, int) {
  return nullptr;
}
void tessera_shard_reducer_free(void*) {}
int tessera_shard_reducer_arm(void*) { return -1; }
int tessera_shard_reducer_finish(void*, void**, uint8_t*) { return -1; }
}
#endif
