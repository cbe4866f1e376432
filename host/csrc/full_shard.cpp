// Fully sharded parameters (`[distributed] sharding = "full"`, ZeRO-3 / FSDP): a unit of the
// model (a transformer or residual block) keeps its parameters in flat buffers of world × shard
// elements, of which each rank holds only its shard between uses. The buffer's memory exists
// while the unit runs: it is allocated and all-gathered (`_allgather_base`) before the unit's
// forward pass, freed after it, gathered again when backward reaches the unit's output and freed
// once backward has produced the gradient of the unit's input. The parameters stay views into
// the buffer throughout, so autograd's saved tensors (which share its storage) see the gathered
// values again in backward: the storage is emptied and refilled in place, as PyTorch's FSDP
// resizes it.
//
// A flat is in one of three states: released (only the shard: the storage is empty), gathered
// (for one pass; the shard is the truth) or whole (gathered for the methods or a checkpoint,
// which may change the parameters: the buffer is the truth until it is released, when this
// rank's slice is copied back into the shard).
//
// Every state change that gathers is a collective: the ranks make the same ones in the same
// order (the units run in the same order on every rank).
#if __has_include(<torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>)
#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "dist_group.h"
#include "guarded.h"

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace {

thread_local std::string last_error;

template <typename F>
int guarded(F f) {
  return tessera::guarded(last_error, f);
}

// Prefetching: an all-gather started ahead of the unit's use (the next unit's while one
// computes), waited for when the unit is gathered.
enum class State { Released, Prefetching, Gathered, Whole };

// Whether the output hooks prefetch the previous unit when backward reaches a unit
// (`[distributed] prefetch`).
std::atomic<bool> prefetch_backward{false};
// Units prefetched, and prefetched units a pass then used (for the run record).
std::atomic<int64_t> prefetches{0}, prefetches_used{0};

struct FullFlat {
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  at::Tensor buffer;  // world × shard elements; the unit's parameters are views into it
  at::Tensor local;   // this rank's shard
  int64_t rank = 0;
  int64_t shard = 0;
  size_t nbytes = 0;
  State state = State::Whole;
  // `[distributed] gather_dtype = "bf16"`: for the passes the shard goes over the wire in
  // bfloat16 and the buffer holds the rounded values (FSDP's `param_dtype`); gathered whole
  // for the methods or a checkpoint, it is exact.
  bool low = false;

  void allocate() {
    auto* impl = buffer.storage().unsafeGetStorageImpl();
    impl->set_data_ptr_noswap(impl->allocator()->allocate(nbytes));
    impl->set_nbytes(nbytes);
  }

  // Empties the storage in place (every view of it keeps its sizes, not its memory).
  void drop() {
    auto* impl = buffer.storage().unsafeGetStorageImpl();
    impl->set_data_ptr_noswap(at::DataPtr(nullptr, impl->device()));
    impl->set_nbytes(0);
  }

  // A prefetch in flight: its work and, gathering in bfloat16, the tensors on the wire.
  c10::intrusive_ptr<c10d::Work> work;
  at::Tensor wire, gathered;

  // Starts the all-gather for a pass (bfloat16 when `low`) without waiting for it.
  void start() {
    allocate();
    if (low) {
      at::NoGradGuard no_grad;
      wire = local.to(at::kBFloat16);
      gathered = at::empty({buffer.numel()}, wire.options());
      work = pg->_allgather_base(gathered, wire);
    } else {
      work = pg->_allgather_base(buffer, local);
    }
  }

  // Waits for the all-gather `start` began and fills the buffer.
  void finish() {
    if (work) {
      work->wait();
      work.reset();
    }
    if (gathered.defined()) {
      at::NoGradGuard no_grad;
      buffer.copy_(gathered);
      gathered = at::Tensor();
      wire = at::Tensor();
    }
  }

  void gather_into_buffer(bool exact) {
    if (exact) {
      allocate();
      pg->_allgather_base(buffer, local)->wait();
    } else {
      start();
      finish();
    }
  }
};

struct FullUnit {
  std::vector<std::shared_ptr<FullFlat>> flats;
  std::mutex mu;  // hooks run on autograd's threads
  // The units before and after this one in forward order, for prefetching.
  std::weak_ptr<FullUnit> prev, next;

  // Waits for a prefetch in flight, if any.
  static void settle(FullFlat& f) {
    if (f.state == State::Prefetching) {
      f.finish();
      f.state = State::Gathered;
    }
  }

  void gather() {
    std::lock_guard<std::mutex> lock(mu);
    bool used = false;
    for (auto& f : flats) {
      used = used || f->state == State::Prefetching;
      settle(*f);
      if (f->state == State::Released) {
        f->gather_into_buffer(false);
        f->state = State::Gathered;
      }
    }
    if (used) {
      prefetches_used.fetch_add(1);
    }
  }

  // Starts gathering a released unit ahead of its use (a collective, as `gather`).
  void prefetch() {
    std::lock_guard<std::mutex> lock(mu);
    bool started = false;
    for (auto& f : flats) {
      if (f->state == State::Released) {
        f->start();
        f->state = State::Prefetching;
        started = true;
      }
    }
    if (started) {
      prefetches.fetch_add(1);
    }
  }

  void free() {
    std::lock_guard<std::mutex> lock(mu);
    for (auto& f : flats) {
      settle(*f);
      if (f->state == State::Gathered) {
        f->drop();
        f->state = State::Released;
      }
    }
  }

  void summon() {
    std::lock_guard<std::mutex> lock(mu);
    for (auto& f : flats) {
      settle(*f);
      if (f->state == State::Released || (f->state == State::Gathered && f->low)) {
        // A unit gathered for a pass in bfloat16 is gathered again, exactly.
        f->gather_into_buffer(true);
      }
      f->state = State::Whole;
    }
  }

  // Lets the flats made whole (for the methods, a checkpoint, the evaluation) go, keeping this
  // rank's slice of what they hold, and leaves those gathered for a pass as they are (a method
  // reading its slices during a step). Returns whether any was whole.
  bool release_whole() {
    std::lock_guard<std::mutex> lock(mu);
    at::NoGradGuard no_grad;
    bool any = false;
    for (auto& f : flats) {
      settle(*f);
      if (f->state == State::Whole) {
        f->local.copy_(f->buffer.narrow(0, f->rank * f->shard, f->shard));
        f->drop();
        f->state = State::Released;
        any = true;
      }
    }
    return any;
  }

  void release() {
    std::lock_guard<std::mutex> lock(mu);
    at::NoGradGuard no_grad;
    for (auto& f : flats) {
      settle(*f);
      if (f->state == State::Whole) {
        f->local.copy_(f->buffer.narrow(0, f->rank * f->shard, f->shard));
      }
      if (f->state != State::Released) {
        f->drop();
        f->state = State::Released;
      }
    }
  }
};

struct Handle {
  std::shared_ptr<FullUnit> unit;
};

}  // namespace

extern "C" {

const char* tessera_full_last_error() { return last_error.c_str(); }

// A unit with no flat yet, on `group` (a `tessera_dist_init` group).
void* tessera_full_unit_new() { return new Handle{std::make_shared<FullUnit>()}; }

void tessera_full_unit_free(void* unit) { delete static_cast<Handle*>(unit); }

// Adds a flat: `buffer` (world × shard elements, holding the parameters now: the flat starts
// whole) and `local`, this rank's shard (`shard` elements, a tensor of its own).
int tessera_full_unit_add(void* unit, void* group, void* buffer, void* local, int64_t rank,
                          int low) {
  return guarded([&] {
    auto f = std::make_shared<FullFlat>();
    f->pg = tessera::dist_process_group(group);
    f->buffer = *static_cast<at::Tensor*>(buffer);
    f->local = *static_cast<at::Tensor*>(local);
    f->rank = rank;
    f->shard = f->local.numel();
    f->low = low != 0 && f->local.is_floating_point() &&
             f->local.scalar_type() != at::kBFloat16;
    f->nbytes = f->buffer.storage().nbytes();
    auto& u = static_cast<Handle*>(unit)->unit;
    std::lock_guard<std::mutex> lock(u->mu);
    u->flats.push_back(std::move(f));
  });
}

// Gathers the unit for a pass; `ahead` 1 then starts gathering the next unit in forward order
// (a forward pass), -1 the previous one (a backward pass), 0 none.
int tessera_full_unit_gather(void* unit, int ahead) {
  return guarded([&] {
    auto& u = static_cast<Handle*>(unit)->unit;
    u->gather();
    auto other = ahead > 0 ? u->next.lock() : ahead < 0 ? u->prev.lock() : nullptr;
    if (other) {
      other->prefetch();
    }
  });
}

// Makes `next` the unit after `unit` in forward order (for prefetching).
int tessera_full_unit_link(void* unit, void* next) {
  return guarded([&] {
    auto& a = static_cast<Handle*>(unit)->unit;
    auto& b = static_cast<Handle*>(next)->unit;
    a->next = b;
    b->prev = a;
  });
}

// Whether backward prefetches the previous unit (`[distributed] prefetch`).
void tessera_full_prefetch_backward(int on) { prefetch_backward.store(on != 0); }

// Units prefetched so far in this process, and those a pass then used.
void tessera_full_prefetch_counts(int64_t* out) {
  out[0] = prefetches.load();
  out[1] = prefetches_used.load();
}

int tessera_full_unit_drop(void* unit) {
  return guarded([&] { static_cast<Handle*>(unit)->unit->free(); });
}

int tessera_full_unit_summon(void* unit) {
  return guarded([&] { static_cast<Handle*>(unit)->unit->summon(); });
}

int tessera_full_unit_release(void* unit) {
  return guarded([&] { static_cast<Handle*>(unit)->unit->release(); });
}

// `*was_whole` is set to 1 when the unit was whole (else left as it is).
int tessera_full_unit_release_whole(void* unit, int* was_whole) {
  return guarded([&] {
    if (static_cast<Handle*>(unit)->unit->release_whole()) {
      *was_whole = 1;
    }
  });
}

// After the unit's forward pass from `input` to `output`: when backward reaches `output` the
// unit is gathered again; when it has produced the gradient of `input`, every node of the unit
// that reads the parameters has run (autograd runs the later-made nodes first) and the unit is
// freed. An input without a gradient leaves the unit gathered until the trainer frees it after
// the backward pass.
int tessera_full_unit_hook(void* unit, void* input, void* output) {
  return guarded([&] {
    std::weak_ptr<FullUnit> weak = static_cast<Handle*>(unit)->unit;
    auto& out = *static_cast<at::Tensor*>(output);
    auto& in = *static_cast<at::Tensor*>(input);
    if (!out.requires_grad()) {
      return;
    }
    out.register_hook([weak](const at::TensorBase&) {
      if (auto u = weak.lock()) {
        u->gather();
        auto prev = prefetch_backward.load() ? u->prev.lock() : nullptr;
        if (prev) {
          prev->prefetch();
        }
      }
    });
    if (in.defined() && in.requires_grad()) {
      in.register_hook([weak](const at::TensorBase&) {
        if (auto u = weak.lock()) {
          u->free();
        }
      });
    }
  });
}

}  // extern "C"

#else
#include <cstdint>
extern "C" {
const char* tessera_full_last_error() {
  return "this libtorch was built without distributed support (c10d)";
}
void* tessera_full_unit_new() { return nullptr; }
void tessera_full_unit_free(void*) {}
int tessera_full_unit_add(void*, void*, void*, void*, int64_t, int) { return -1; }
int tessera_full_unit_gather(void*, int) { return -1; }
int tessera_full_unit_link(void*, void*) { return -1; }
void tessera_full_prefetch_backward(int) {}
void tessera_full_prefetch_counts(int64_t* out) {
  out[0] = 0;
  out[1] = 0;
}
int tessera_full_unit_drop(void*) { return -1; }
int tessera_full_unit_summon(void*) { return -1; }
int tessera_full_unit_release(void*) { return -1; }
int tessera_full_unit_release_whole(void*, int*) { return -1; }
int tessera_full_unit_hook(void*, void*, void*) { return -1; }
}
#endif
