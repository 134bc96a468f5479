// bench_worker_main: the bench worker's side of the isolation protocol (isolation_wire.h).
//
// The worker opens its own primary context on --device, says hello, and then serves one problem at a time:
// Begin regenerates the op's choices through this process's OpRegistry, matches the host's names and kernel
// keys, allocates the buffers, and runs and captures the reference (prepared with the host's binaries); each
// Run checks and measures one choice with the same BenchRunner the in-process tuner uses. A failure that
// leaves the context unusable is answered with `poisoned`, and the host replaces this process.
//
// The process around it is the worker skeleton (kiln/pool/worker_loop.h): its hang-up watcher ends the process
// as soon as the host closes the socket or dies, even in the middle of a measurement.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "kiln/runtime/measure.h"
#include "isolation_wire.h"
#include "kiln/jit/device.h"
#include "kiln/jit/driver.h"
#include "kiln/jit/key.h"
#include "kiln/pool/worker_loop.h"
#include "kiln/runtime/bench_worker.h"
#include "kiln/runtime/ops.h"

namespace kiln::runtime {
namespace {

using Clock = std::chrono::steady_clock;
namespace bw = detail::bench_wire;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::vector<KernelKey> keys_of(const Choice& c) {
  std::vector<KernelKey> out;
  for (const auto& k : c.kernels()) out.push_back(make_key(k.source, k.target));
  return out;
}

// The problem being measured: its choices, buffers and the reference's outputs (held by the runner).
struct Session {
  Problem problem;
  std::shared_ptr<const OpDef> def;
  std::map<std::string, ChoicePtr> choices;  // the ones the host asked for that this process can rebuild
  std::set<std::string> prepared;
  OperandSets operands;  // choices are checked on the first set and timed over all
  const OpBuffers& buffers() const { return operands.sets.front(); }
  DeviceBuffer workspace;
  double tolerance = 0;
};

class BenchWorker {
 public:
  BenchWorker(int device, std::string tag, const OpRegistry& ops) : device_(device), tag_(std::move(tag)), ops_(ops) {}

  // Whether the context can still run anything after `s` failed: a timeout leaves a kernel running, and a
  // fault (illegal address, ...) is sticky, which any synchronisation reports again.
  bool poisoned_by(const Status& s) {
    if (s.ok() || s.code() == ErrorCode::kWrongResult) return false;
    if (s.code() == ErrorCode::kTimeout) return true;
    auto d = driver();
    return !d.ok() || (*d)->cuCtxSynchronize() != CUDA_SUCCESS;
  }

  bw::Begun begin(const bw::Begin& req) {
    const Clock::time_point start = Clock::now();
    bw::Begun out;
    out.seq = req.seq;
    session_.reset();  // the previous problem's buffers go first
    out.status = start_session(req, out.unknown);
    if (!out.status.ok()) {
      out.poisoned = poisoned_ = poisoned_by(out.status);
      session_.reset();
    }
    out.worker_seconds = seconds_since(start);
    return out;
  }

  bw::RunResult run(const bw::Run& req) {
    const Clock::time_point start = Clock::now();
    bw::RunResult out;
    out.seq = req.seq;
    std::fprintf(stderr, "%s: %s '%s'\n", tag_.c_str(),
                 req.mode == bw::RunMode::kCheckAndMeasure ? "checking and measuring" : "re-measuring",
                 req.name.c_str());
    std::fflush(stderr);
    Result<Samples> samples = run_choice(req, out.error);
    if (samples.ok()) {
      out.us = std::move(samples->us);
      out.placement = std::move(samples->placement);
      out.graph = samples->graph;
      out.partial = samples->partial;
    } else {
      out.status = std::move(samples).status();
      out.poisoned = poisoned_ = poisoned_ || poisoned_by(out.status);
    }
    out.worker_seconds = seconds_since(start);
    return out;
  }

  void end() { session_.reset(); }

 private:
  Status start_session(const bw::Begin& req, std::map<std::string, std::string>& unknown) {
    if (poisoned_) return make_error(ErrorCode::kFailedPrecondition, "this worker's context is unusable");
    KILN_ASSIGN_OR_RETURN(auto def, ops_.find(req.session.problem.op));
    if (!ctx_) {
      KILN_ASSIGN_OR_RETURN(ctx_, choice_context(device_));
    }
    ChoiceContext ctx = *ctx_;
    ctx.max_template_configs = req.session.max_template_configs;
    ctx.max_cublas_algos = req.session.max_cublas_algos;
    ctx.split_k = req.session.split_k;
    // The host names the choices to measure; superseded families are generated too so that any it asked for
    // (TuneOptions::families) is found, and the others are never run.
    ctx.families = {"all"};
    KILN_ASSIGN_OR_RETURN(std::vector<ChoicePtr> all, ops_.choices(req.session.problem, ctx));
    std::map<std::string, ChoicePtr> by_name;
    for (auto& c : all) by_name[c->name()] = c;

    auto s = std::make_unique<Session>();
    s->problem = req.session.problem;
    s->def = def;
    // Same name is not enough: the kernels must be the ones the host compiled (same generator, same knobs).
    auto match = [&](const bw::ChoiceSpec& spec) -> std::string {
      auto it = by_name.find(spec.name);
      if (it == by_name.end()) return fmt::format("the worker's op '{}' has no choice of that name", req.session.problem.op);
      if (keys_of(*it->second) != spec.keys) return "the worker's choice of that name has other kernels";
      return {};
    };
    if (std::string why = match(req.session.reference); !why.empty()) {
      return make_error(ErrorCode::kNotFound, fmt::format("reference choice '{}': {}", req.session.reference.name, why));
    }
    ChoicePtr reference = by_name[req.session.reference.name];
    s->choices[reference->name()] = reference;
    for (const auto& spec : req.session.choices) {
      if (std::string why = match(spec); !why.empty()) {
        unknown[spec.name] = why;
      } else {
        s->choices[spec.name] = by_name[spec.name];
      }
    }

    if (!runner_ || !same(bench_, req.session.bench)) {
      runner_.reset();
      KILN_ASSIGN_OR_RETURN(runner_, BenchRunner::create(req.session.bench, ctx.device));
      bench_ = req.session.bench;
    }
    // Checked on the first set, timed over all of them, as the tuner does (BenchmarkOptions::placements).
    KILN_ASSIGN_OR_RETURN(OperandSets operands,
                          make_operand_sets(*def, req.session.problem, req.session.seed, req.session.bench.placements,
                                            req.session.bench.placement_bytes));
    s->operands = std::move(operands);
    // The op fills its buffers on the legacy default stream, which the runner's stream does not wait for:
    // without this the reference could read inputs still being written (the freed buffers of the previous
    // problem, poisoned with NaN, showed through on the H200).
    {
      KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
      KILN_CHECK(d->cuCtxSynchronize());
    }
    size_t workspace_bytes = 0;
    for (const auto& [name, c] : s->choices) workspace_bytes = std::max(workspace_bytes, c->workspace_bytes());
    KILN_ASSIGN_OR_RETURN(s->workspace, DeviceBuffer::allocate(workspace_bytes));
    Status ready = reference->prepare(req.session.reference_binaries);
    if (ready.ok()) ready = reference->run(s->buffers().args, s->workspace.ptr(), runner_->stream());
    if (ready.ok()) ready = runner_->capture_reference(s->buffers().outputs);
    if (!ready.ok()) {
      return ready.with_context(fmt::format("running the reference {} of {} in the bench worker", reference->name(),
                                            req.session.problem.describe()));
    }
    s->prepared.insert(reference->name());
    const auto* gemm = std::get_if<GemmProblem>(&req.session.problem.desc);
    s->tolerance = def->tolerance(gemm ? gemm->epilogue.out : s->buffers().outputs.front().dtype);
    session_ = std::move(s);
    return Status();
  }

  Result<Samples> run_choice(const bw::Run& req, double& error) {
    if (poisoned_) return make_error(ErrorCode::kFailedPrecondition, "this worker's context is unusable");
    if (!session_) return make_error(ErrorCode::kFailedPrecondition, "no problem was begun in this worker");
    auto it = session_->choices.find(req.name);
    if (it == session_->choices.end()) {
      return make_error(ErrorCode::kNotFound, fmt::format("choice '{}' is not one this worker can run", req.name));
    }
    Choice& c = *it->second;
    if (!session_->prepared.count(req.name)) {
      if (!req.binaries) return make_error(ErrorCode::kInternal, fmt::format("no binaries sent for '{}'", req.name));
      KILN_RETURN_IF_ERROR(c.prepare(*req.binaries));
      session_->prepared.insert(req.name);
    }
    const OpBuffers& checked = session_->buffers();
    const std::vector<const OpArgs*> sets = session_->operands.args();
    const CUdeviceptr ws = session_->workspace.ptr();
    if (req.mode == bw::RunMode::kTimeRuns) return runner_->time_runs(c, sets, ws, req.n, req.graph);
    KILN_ASSIGN_OR_RETURN(error, runner_->check(c, checked.args, ws, checked.outputs, session_->tolerance));
    return runner_->measure(c, sets, ws, req.best_us);
  }

  static bool same(const BenchmarkOptions& a, const BenchmarkOptions& b) {
    return a.budget_ms == b.budget_ms && a.min_reps == b.min_reps && a.max_reps == b.max_reps &&
           a.fixed_reps == b.fixed_reps && a.drop_factor == b.drop_factor && a.tie_fraction == b.tie_fraction &&
           a.tie_rounds == b.tie_rounds && a.tie_rounds_max == b.tie_rounds_max && a.flush_l2 == b.flush_l2 &&
           a.flush_l2_by_writing == b.flush_l2_by_writing && a.graph_below_us == b.graph_below_us &&
           a.adaptive == b.adaptive && a.precision == b.precision && a.abandon_factor == b.abandon_factor &&
           a.placements == b.placements && a.placement_bytes == b.placement_bytes;
  }

  int device_;
  std::string tag_;
  const OpRegistry& ops_;
  std::optional<ChoiceContext> ctx_;
  std::unique_ptr<BenchRunner> runner_;
  BenchmarkOptions bench_;
  std::unique_ptr<Session> session_;
  bool poisoned_ = false;
};

}  // namespace

int bench_worker_main(int argc, char** argv, const OpRegistry& ops) {
  const WorkerArgs args = parse_worker_args(argc, argv);
  if (!attach_to_host(args)) return 0;
  const int device = static_cast<int>(args.get("--device", 0));
  const std::string tag = fmt::format("kiln-bench-worker[{}]", ::getpid());

  const Clock::time_point start = Clock::now();
  bw::Hello hello;
  hello.pid = static_cast<int32_t>(::getpid());
  hello.device = device;
  auto context = ensure_context(device);
  hello.context_seconds = seconds_since(start);
  if (!context.ok()) {
    hello.status = context.status();
  } else if (auto info = device_info(device); info.ok()) {
    hello.device_name = info->name;
  }
  auto hello_frame = bw::encode(hello);
  if (!hello_frame.ok() || !codec::write_all(args.fd, *hello_frame).ok() || !hello.status.ok()) {
    return hello.status.ok() ? 0 : 1;
  }

  BenchWorker worker(device, tag, ops);
  WorkerLoop loop;
  loop.protocol = &bw::kProtocol;
  loop.fd = args.fd;
  loop.name = tag;
  loop.handle = [&worker](const codec::Frame& f) -> Result<std::optional<std::string>> {
    switch (static_cast<bw::Type>(f.type)) {
      case bw::Type::kBegin: {
        KILN_ASSIGN_OR_RETURN(bw::Begin req, bw::decode<bw::Begin>(f.payload));
        KILN_ASSIGN_OR_RETURN(std::string reply, bw::encode(worker.begin(req)));
        return std::optional<std::string>(std::move(reply));
      }
      case bw::Type::kRun: {
        KILN_ASSIGN_OR_RETURN(bw::Run req, bw::decode<bw::Run>(f.payload));
        KILN_ASSIGN_OR_RETURN(std::string reply, bw::encode(worker.run(req)));
        return std::optional<std::string>(std::move(reply));
      }
      case bw::Type::kEnd:
        worker.end();
        return std::optional<std::string>();
      default:
        return make_error(ErrorCode::kCorrupt, fmt::format("unexpected message type {} from the host", f.type));
    }
  };
  return run_worker_loop(loop);
}

}  // namespace kiln::runtime
