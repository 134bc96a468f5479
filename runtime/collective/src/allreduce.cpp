// AllReduce (kiln/runtime/collective.h): creation (the peer buffers, the symmetric window, the gate and the
// rendered choices, agreed over ranks) and the run path: the size dispatcher that maps a message to its bucket's
// choice, and running a named one. Tuning, measuring, the catalogue and the fused step are in the other
// allreduce_*.cpp files (allreduce_impl.h lists them).
#include <algorithm>

#include <spdlog/spdlog.h>

#include "allreduce_impl.h"
#include "kiln/jit/driver.h"
#include "kiln/pool/executor.h"

namespace kiln::runtime {

using namespace detail;

AllReduce::AllReduce(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
AllReduce::~AllReduce() = default;
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
  impl->push_slot_bytes = std::min<size_t>(impl->options.max_bytes, size_t{4} << 20) / 256 * 256;
  KILN_ASSIGN_OR_RETURN(impl->push, PeerBuffers::create(comm, 2 * comm.world() * impl->push_slot_bytes));
  if (const size_t w = std::min(impl->options.symmetric_bytes, impl->options.max_bytes); w > 0) {
    auto window = create_symmetric_window(comm, w);  // every rank gets the same outcome
    if (window.ok()) impl->window = std::move(window).value();
    else spdlog::info("kiln: no nccl_symmetric all-reduce choice: {}", window.status().to_string());
  }
  KILN_ASSIGN_OR_RETURN(DeviceInfo info, device_info(comm.device()));
  KILN_ASSIGN_OR_RETURN(impl->target, Target::parse(info.arch()));
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

const std::string& AllReduce::Impl::pick_for(int64_t count) const {
  const size_t bytes = static_cast<size_t>(count) * elem_bytes;
  auto it = std::lower_bound(bounds.begin(), bounds.end(), bytes);
  if (it == bounds.end()) return nccl_name;
  return picks[static_cast<size_t>(it - bounds.begin())];
}

const std::string& AllReduce::choice_for(int64_t count) const { return impl_->pick_for(count); }

Status AllReduce::run(CUdeviceptr in, CUdeviceptr out, int64_t count, CUstream stream) const {
  return impl_->run_named(impl_->pick_for(count), in, out, count, stream);
}

std::vector<std::string> AllReduce::choice_names(int64_t count) const { return impl_->names_for(count); }

Status AllReduce::run_choice(const std::string& name, CUdeviceptr in, CUdeviceptr out, int64_t count,
                             CUstream stream) const {
  return impl_->run_named(name, in, out, count, stream);
}

}  // namespace kiln::runtime
