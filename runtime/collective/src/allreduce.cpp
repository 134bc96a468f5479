// AllReduce (kiln/runtime/collective.h): creation (the peer buffers, the symmetric heap and window, the gate and
// the rendered choices, agreed over ranks), the symmetric heap's allocate/free, and the run path: the call's kind
// (where its input is), the size dispatcher that maps a message to its bucket's choice in that kind's table, and
// running a named one. Tuning, measuring, the catalogue and the fused step are in the other
// allreduce_*.cpp files (allreduce_impl.h lists them).
#include <algorithm>
#include <limits>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "allreduce_impl.h"
#include "kiln/jit/driver.h"
#include "kiln/pool/executor.h"

namespace kiln::runtime {

using namespace detail;

AllReduce::AllReduce(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
AllReduce::~AllReduce() {
  if (!impl_) return;
  std::lock_guard<std::mutex> lock(impl_->heap_mu);
  (void)impl_->heap_map.drain();  // no range is unmapped under a call still running
  impl_->uses.clear();
}

const char* call_name(AllReduceCall call) {
  switch (call) {
    case AllReduceCall::kStaged: return "staged";
    case AllReduceCall::kSymmetric: return "symmetric";
    case AllReduceCall::kSymmetricInPlace: return "symmetric in-place";
  }
  return "?";
}
const AllReduceOptions& AllReduce::options() const { return impl_->options; }
Communicator& AllReduce::comm() const { return *impl_->comm; }

Status AllReduce::Impl::make_current() const {
  KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
  KILN_CHECK(d->cuCtxSetCurrent(comm->context()));
  return Status();
}

Result<std::unique_ptr<AllReduce>> AllReduce::create(Communicator& comm, AllReduceOptions options) {
  auto impl = std::make_unique<Impl>();
  impl->comm = &comm;
  impl->options = std::move(options);
  impl->elem_bytes = templates::dtype_bytes(impl->options.dtype);
  KILN_RETURN_IF_ERROR(impl->make_current());
  KILN_ASSIGN_OR_RETURN(impl->staging, PeerBuffers::create(comm, impl->options.max_bytes));
  KILN_ASSIGN_OR_RETURN(impl->signals, PeerBuffers::create(comm, KILN_AR_SIGNAL_WORDS * sizeof(unsigned)));
  impl->push_slot_bytes =
      std::min<size_t>(impl->options.max_bytes, impl->options.push_area_bytes / (2 * comm.world())) / 256 * 256;
  if (impl->push_slot_bytes > 0) {
    KILN_ASSIGN_OR_RETURN(impl->push, PeerBuffers::create(comm, 2 * comm.world() * impl->push_slot_bytes));
  }
  if (impl->options.heap_bytes > 0) {
    KILN_ASSIGN_OR_RETURN(impl->heap, PeerBuffers::create(comm, impl->options.heap_bytes));
    impl->heap_map = SymmetricHeap(impl->options.heap_bytes);
  }
  impl->base = impl->base_args();
  impl->measuring = impl->options_call();
  if (const size_t w = std::min(impl->options.symmetric_bytes, impl->options.max_bytes); w > 0) {
    auto window = create_symmetric_window(comm, w);  // every rank gets the same outcome
    if (window.ok()) impl->window = std::move(window).value();
    else spdlog::info("kiln: no nccl_symmetric all-reduce choice: {}", window.status().to_string());
  }
  KILN_ASSIGN_OR_RETURN(DeviceInfo info, device_info(comm.device()));
  KILN_ASSIGN_OR_RETURN(impl->target, Target::parse(info.arch()));
  impl->programmatic = impl->options.programmatic_launch && impl->target.compute_capability() >= 90;
  impl->limits = templates::DeviceLimits::from_device(info, impl->target);
  std::shared_ptr<Executor> executor = impl->options.executor;
  if (!executor) {
    KILN_ASSIGN_OR_RETURN(executor, make_executor());
    impl->options.executor = executor;
  }
  if (impl->options.cache) {
    KILN_ASSIGN_OR_RETURN(impl->gate, make_cached_gate(impl->options.cache, executor));
  } else {
    GateOptions g;
    g.executor = executor;
    KILN_ASSIGN_OR_RETURN(impl->gate, PrecompileGate::create(std::move(g)));
  }
  KILN_ASSIGN_OR_RETURN(impl->choices, render_choices("allreduce", impl->options, comm.world(), impl->limits,
                                                      impl->target, *impl->gate));
  KILN_ASSIGN_OR_RETURN(impl->fused_choices, render_choices("allreduce_rmsnorm", impl->options, comm.world(),
                                                            impl->limits, impl->target, *impl->gate));
  KILN_ASSIGN_OR_RETURN(impl->work, Stream::create());
  KILN_ASSIGN_OR_RETURN(impl->start, Event::create());
  KILN_ASSIGN_OR_RETURN(impl->stop, Event::create());
  KILN_ASSIGN_OR_RETURN(impl->sync_word, DeviceBuffer::allocate(sizeof(float)));
  KILN_RETURN_IF_ERROR(impl->agree(impl->choices));
  return std::unique_ptr<AllReduce>(new AllReduce(std::move(impl)));
}

CUdeviceptr AllReduce::input_buffer() const { return impl_->staging->local(); }

AllReduceCall AllReduce::Impl::options_call() const {
  if (options.in_place) return AllReduceCall::kSymmetricInPlace;
  return options.zero_copy ? AllReduceCall::kSymmetric : AllReduceCall::kStaged;
}

// An untuned kind (or an untuned call kind's missing table) falls back to the staged table's pick when that choice
// serves the kind (the read one-shot cannot run in place), else to NCCL: deterministic, so ranks stay alike.
const Pick& AllReduce::Impl::pick_for(AllReduceCall call, size_t bytes) const {
  static const Pick nccl_pick;
  const Table* t = &tables[static_cast<int>(call)];
  if (t->bounds.empty()) t = &tables[static_cast<int>(AllReduceCall::kStaged)];
  auto it = std::lower_bound(t->bounds.begin(), t->bounds.end(), bytes);
  if (it == t->bounds.end()) return nccl_pick;
  const Pick& p = t->picks[static_cast<size_t>(it - t->bounds.begin())];
  if (call == AllReduceCall::kSymmetricInPlace && p.choice && !p.choice->in_place) return nccl_pick;
  return p;
}

Result<Pick> AllReduce::Impl::resolve(const std::string& name) const {
  Pick p;
  p.name = name;
  if (name == kNccl) return p;
  if (name == kNcclSymmetric) {
    if (!window) return make_error(ErrorCode::kNotFound, "no nccl_symmetric choice (no symmetric window)");
    p.kind = Pick::kNcclSymmetricPick;
    return p;
  }
  const TemplateChoice* c = find(choices, name);
  if (!c) return make_error(ErrorCode::kNotFound, fmt::format("no all-reduce choice '{}'", name));
  p.kind = Pick::kTemplatePick;
  p.choice = c;
  return p;
}

size_t AllReduce::Impl::heap_allocation(CUdeviceptr p, size_t bytes) const {
  if (!heap) return SymmetricHeap::npos;
  const CUdeviceptr lo = heap->local();
  if (p < lo || p >= lo + heap->bytes()) return SymmetricHeap::npos;
  std::lock_guard<std::mutex> lock(heap_mu);
  return heap_map.find(static_cast<size_t>(p - lo), bytes);
}

Operand AllReduce::Impl::locate(CUdeviceptr p, size_t bytes) const {
  Operand o;
  const CUdeviceptr s = staging->local();
  if (p >= s && p + bytes <= s + staging->bytes()) {
    o.region = staging.get();
    o.offset = static_cast<size_t>(p - s);
    return o;
  }
  o.allocation = heap_allocation(p, bytes);
  if (o.allocation != SymmetricHeap::npos) {
    o.region = heap.get();
    o.offset = static_cast<size_t>(p - heap->local());
  }
  return o;
}

AllReduceCall AllReduce::call_kind(CUdeviceptr in, CUdeviceptr out, int64_t count) const {
  const Operand o = impl_->locate(in, static_cast<size_t>(std::max<int64_t>(count, 0)) * impl_->elem_bytes);
  if (!o.region) return AllReduceCall::kStaged;
  return in == out ? AllReduceCall::kSymmetricInPlace : AllReduceCall::kSymmetric;
}

// Per allocation, the streams calls used it on: no event per call (a timing event per call cost ~3 µs of every
// eager call, measured on 2 x H200). free() records one event on each of those streams, which follows every call
// queued there before it, and the range's next allocate() waits for them. Under capture the stream is remembered
// like any other; free() skips a stream still capturing: what a graph uses must stay allocated while the graph
// may run, as for any memory a graph uses.
Status AllReduce::Impl::track(size_t a, size_t b, CUstream stream) const {
  if (a == SymmetricHeap::npos && b == SymmetricHeap::npos) return Status();
  std::lock_guard<std::mutex> lock(heap_mu);
  for (size_t allocation : {a, b}) {
    if (allocation == SymmetricHeap::npos) continue;
    std::vector<CUstream>& streams = uses[allocation];
    if (std::find(streams.begin(), streams.end(), stream) == streams.end()) streams.push_back(stream);
    if (b == a) break;
  }
  return Status();
}

Status AllReduce::run(CUdeviceptr in, CUdeviceptr out, int64_t count, CUstream stream) const {
  return impl_->run_call(in, out, count, stream);
}

Status AllReduce::Impl::run_call(CUdeviceptr in, CUdeviceptr out, int64_t count, CUstream stream) const {
  const Impl& s = *this;
  if (count <= 0 || count > std::numeric_limits<int>::max()) {
    return make_error(ErrorCode::kInvalidArgument, fmt::format("all-reduce of {} elements", count));
  }
  const size_t bytes = static_cast<size_t>(count) * s.elem_bytes;
  const Operand where = s.locate(in, bytes);
  const AllReduceCall call = !where.region ? AllReduceCall::kStaged
                             : in == out   ? AllReduceCall::kSymmetricInPlace
                                           : AllReduceCall::kSymmetric;
  KILN_RETURN_IF_ERROR(s.run_pick(s.pick_for(call, bytes), where, in, out, count, stream));
  return s.track(where.allocation, in == out ? where.allocation : s.heap_allocation(out, bytes), stream);
}

const std::string& AllReduce::choice_for(int64_t count) const { return choice_for(count, impl_->options_call()); }
const std::string& AllReduce::choice_for(int64_t count, AllReduceCall call) const {
  return impl_->pick_for(call, static_cast<size_t>(std::max<int64_t>(count, 0)) * impl_->elem_bytes).name;
}

Result<CUdeviceptr> AllReduce::allocate(size_t bytes) { return impl_->heap_allocate(bytes); }

Result<CUdeviceptr> AllReduce::Impl::heap_allocate(size_t bytes) {
  if (!heap) {
    return make_error(ErrorCode::kFailedPrecondition, "symmetric allocate: this AllReduce has no heap (heap_bytes = 0)");
  }
  KILN_RETURN_IF_ERROR(make_current());
  AllocRecord mine;
  Result<size_t> got = make_error(ErrorCode::kInternal, "unset");
  {
    std::lock_guard<std::mutex> lock(heap_mu);
    mine.asked = bytes;
    mine.used = heap_map.used();
    mine.digest = heap_map.digest();
    got = heap_map.allocate(bytes);
    mine.offset = got.ok() ? *got : SymmetricHeap::npos;
  }
  auto rollback = [&] {
    if (!got.ok()) return;
    std::lock_guard<std::mutex> lock(heap_mu);
    heap_map.rollback(*got);
  };
  auto gathered = comm->all_gather(mine.encode());
  if (!gathered.ok()) {
    rollback();
    return gathered.status();
  }
  std::vector<AllocRecord> records;
  for (const std::string& g : *gathered) {
    auto r = AllocRecord::decode(g);
    if (!r.ok()) {
      rollback();
      return r.status();
    }
    records.push_back(*r);
  }
  if (Status agreed = check_agreement(records); !agreed.ok()) {
    rollback();
    return agreed;
  }
  if (!got.ok()) return got.status();  // every rank ran out alike
  std::lock_guard<std::mutex> lock(heap_mu);
  uses.erase(*got);
  return heap->local() + *got;
}

Status AllReduce::free(CUdeviceptr ptr) {
  Impl& s = *impl_;
  const std::string what = fmt::format("pointer 0x{:x}", static_cast<uint64_t>(ptr));
  if (!s.heap || ptr < s.heap->local() || ptr >= s.heap->local() + s.heap->bytes()) {
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("symmetric free: {} is not inside this AllReduce's heap (not from allocate())", what));
  }
  std::lock_guard<std::mutex> lock(s.heap_mu);
  const size_t offset = static_cast<size_t>(ptr - s.heap->local());
  SymmetricHeap::Wait wait;
  if (auto it = s.uses.find(offset); it != s.uses.end() && s.heap_map.size_of(offset) > 0) {
    std::vector<CUstream> streams = std::move(it->second);
    s.uses.erase(it);
    KILN_RETURN_IF_ERROR(s.make_current());
    KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
    auto events = std::make_shared<std::vector<Event>>();
    bool whole_context = false;  // a stream kiln cannot record on (destroyed since): wait for everything instead
    for (CUstream stream : streams) {
      CUstreamCaptureStatus capturing = CU_STREAM_CAPTURE_STATUS_NONE;
      if (d->cuStreamIsCapturing(stream, &capturing) != CUDA_SUCCESS) {
        whole_context = true;
        continue;
      }
      if (capturing != CU_STREAM_CAPTURE_STATUS_NONE) continue;
      auto e = Event::create();
      if (!e.ok() || !e->record(stream).ok()) {
        whole_context = true;
        continue;
      }
      events->push_back(std::move(*e));
    }
    const CUcontext ctx = s.comm->context();
    wait = [events, whole_context, ctx, d]() -> Status {
      if (whole_context) {
        KILN_CHECK(d->cuCtxPushCurrent(ctx));
        CUresult rc = d->cuCtxSynchronize();
        CUcontext popped = nullptr;
        d->cuCtxPopCurrent(&popped);
        KILN_CHECK(rc);
      }
      for (const Event& e : *events) KILN_RETURN_IF_ERROR(e.synchronize());
      return Status();
    };
  }
  return s.heap_map.free(offset, std::move(wait), what);
}

bool AllReduce::is_symmetric(CUdeviceptr p, size_t bytes) const {
  return impl_->heap_allocation(p, bytes) != SymmetricHeap::npos;
}
size_t AllReduce::heap_bytes() const { return impl_->heap ? impl_->heap_map.capacity() : 0; }
size_t AllReduce::heap_used() const {
  std::lock_guard<std::mutex> lock(impl_->heap_mu);
  return impl_->heap_map.used();
}

std::vector<std::string> AllReduce::choice_names(int64_t count) const {
  return impl_->names_for(count, impl_->options_call());
}

Status AllReduce::run_choice(const std::string& name, CUdeviceptr in, CUdeviceptr out, int64_t count,
                             CUstream stream) const {
  KILN_RETURN_IF_ERROR(impl_->run_named(name, in, out, count, stream));
  const size_t bytes = static_cast<size_t>(count) * impl_->elem_bytes;
  const size_t a = impl_->heap_allocation(in, bytes);
  return impl_->track(a, in == out ? a : impl_->heap_allocation(out, bytes), stream);
}

}  // namespace kiln::runtime
