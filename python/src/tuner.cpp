#include "tuner.h"

#include "text.h"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>

#include "kiln/cache/problem_key.h"
#include "kiln/jit/device.h"
#include "kiln/jit/driver.h"
#include "kiln/pool/gate.h"
#include "kiln/runtime/builtin.h"
#include "kiln/runtime/plan_ahead.h"
#include "kiln/runtime/workload.h"

namespace kiln::py {
namespace {

Result<bool> capturing(CUstream stream);
bool measured(const runtime::TuneReport& r);

// A thread that loads modules while another thread may be capturing a CUDA graph: in the default (global)
// capture mode, a module load or allocation from any thread during another thread's global capture is
// refused and invalidates that capture; relaxed mode exempts this thread. cuThreadExchangeStreamCaptureMode
// is not in kiln's driver table: taken from the library kiln loaded.
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() {
    if (Fn fn = exchange()) ok_ = fn(&mode_) == CUDA_SUCCESS;
  }
  ~RelaxedCaptureMode() {
    if (ok_) (void)exchange()(&mode_);  // the thread's own mode back
  }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  using Fn = CUresult (*)(CUstreamCaptureMode*);
  static Fn exchange() {
    static Fn fn = []() -> Fn {
      auto d = driver();
      if (!d.ok()) return nullptr;
      void* lib = dlopen((*d)->library.c_str(), RTLD_NOW | RTLD_NOLOAD);
      return lib ? reinterpret_cast<Fn>(dlsym(lib, "cuThreadExchangeStreamCaptureMode")) : nullptr;
    }();
    return fn;
  }
  CUstreamCaptureMode mode_ = CU_STREAM_CAPTURE_MODE_RELAXED;
  bool ok_ = false;
};

// Loading a problem is mostly CPU work (key hashing, reading and decompressing cubins, building sources) that
// spreads over threads; the driver's module loads serialise, so more than a few threads only contend.
int warmup_threads(int asked, size_t problems) {
  int n = asked > 0 ? asked : static_cast<int>(std::min(8u, std::max(1u, std::thread::hardware_concurrency())));
  return std::max(1, std::min(n, static_cast<int>(std::max<size_t>(1, problems))));
}

// Keeps the kMaxSlow slowest problems, slowest first.
void note_slow(std::vector<WarmupReport::Slow>& slowest, WarmupReport::Slow s) {
  constexpr size_t kMaxSlow = 8;
  auto cost = [](const WarmupReport::Slow& x) { return x.fetch_seconds + x.load_seconds; };
  auto at = std::find_if(slowest.begin(), slowest.end(), [&](const auto& x) { return cost(x) < cost(s); });
  if (at == slowest.end() && slowest.size() >= kMaxSlow) return;
  slowest.insert(at, std::move(s));
  if (slowest.size() > kMaxSlow) slowest.pop_back();
}

}  // namespace

struct PyTuner::Background {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  // The problems it loads: pending until a warm-up thread or an op call takes one, done once it is ready (or
  // failed). Only the taker loads a problem.
  enum class State { kPending, kLoading, kTakenByCall, kDone };
  std::unordered_map<OpKey, State, OpKeyHash> keys;
  Result<WarmupReport> report = make_error(ErrorCode::kInternal, "the warm-up has not finished");
  std::thread thread;
};

// One Store per folder in a process: two tuners on the same folder share it (RocksDB allows one writer
// per process and folder).
Result<std::shared_ptr<cache::Store>> shared_store(const std::string& dir) {
  static std::mutex mu;
  static std::map<std::string, std::weak_ptr<cache::Store>> stores;
  std::lock_guard lock(mu);
  std::string resolved = dir.empty() ? cache::default_cache_dir() : dir;
  if (auto s = stores[resolved].lock()) return s;
  cache::StoreOptions o;
  o.dir = resolved;
  KILN_ASSIGN_OR_RETURN(auto store, cache::Store::open(o));
  std::shared_ptr<cache::Store> shared(std::move(store));
  stores[resolved] = shared;
  return shared;
}

namespace {

Result<bool> capturing(CUstream stream) {
  KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  KILN_CHECK(d->cuStreamIsCapturing(stream, &status));
  return status != CU_STREAM_CAPTURE_STATUS_NONE;
}

bool measured(const runtime::TuneReport& r) {
  for (const auto& c : r.choices)
    if (c.reps > 0 && !c.from_cache) return true;
  return false;
}

}  // namespace

bool OpKey::operator==(const OpKey& o) const {
  return size == o.size && n == o.n && k == o.k && device == o.device && epilogue == o.epilogue && op == o.op &&
         dtype == o.dtype && dtype_b == o.dtype_b && dtype_out == o.dtype_out && layout_a == o.layout_a &&
         layout_b == o.layout_b && flags == o.flags;
}

size_t OpKeyHash::operator()(const OpKey& k) const {
  uint64_t h = static_cast<uint64_t>(k.size) * 0x9E3779B97F4A7C15ull;
  h ^= static_cast<uint64_t>(k.n) * 0xC2B2AE3D27D4EB4Full + (h << 6) + (h >> 2);
  h ^= static_cast<uint64_t>(k.k) * 0x165667B19E3779F9ull + (h << 6) + (h >> 2);
  uint64_t small = uint64_t(k.device) | uint64_t(k.epilogue) << 16 | uint64_t(k.op) << 32 | uint64_t(k.dtype) << 36 |
                   uint64_t(k.dtype_b) << 40 | uint64_t(k.dtype_out) << 44 | uint64_t(k.layout_a) << 48 |
                   uint64_t(k.layout_b) << 50 | uint64_t(k.flags) << 52;
  h ^= small * 0x27D4EB2F165667C5ull + (h << 6) + (h >> 2);
  return static_cast<size_t>(h);
}

uint16_t intern_epilogue(const std::string& text) {
  static std::mutex mu;
  static std::map<std::string, uint16_t> ids;
  std::lock_guard lock(mu);
  auto [it, inserted] = ids.emplace(text, static_cast<uint16_t>(ids.size() + 1));
  return it->second;
}

Result<OpKey> key_of(const runtime::Problem& problem, int device) {
  OpKey key;
  key.device = device;
  if (const auto* g = std::get_if<runtime::GemmProblem>(&problem.desc)) {
    key.op = kGemm;
    key.size = g->m, key.n = g->n, key.k = g->k;
    key.dtype = uint8_t(g->a), key.dtype_b = uint8_t(g->b), key.dtype_out = uint8_t(g->epilogue.out);
    key.layout_a = uint8_t(g->a_layout), key.layout_b = uint8_t(g->b_layout);
    key.epilogue = intern_epilogue(g->epilogue.tag());
    key.flags = g->b_constant ? 1 : 0;
    return key;
  }
  if (const auto* n = std::get_if<runtime::NormProblem>(&problem.desc); n && !n->layernorm && !n->bias) {
    key.op = kRmsNorm;
    key.size = n->rows, key.n = n->cols;
    key.dtype = key.dtype_out = uint8_t(n->dtype);
    key.flags = n->residual ? 1 : 0;
    return key;
  }
  if (const auto* s = std::get_if<runtime::SoftmaxProblem>(&problem.desc)) {
    key.op = kSoftmax;
    key.size = s->rows, key.n = s->cols;
    key.dtype = key.dtype_out = uint8_t(s->dtype);
    return key;
  }
  return make_error(ErrorCode::kUnimplemented,
                    strf("{}: the Python package runs gemm, rmsnorm and softmax", problem.describe()));
}

Result<std::shared_ptr<PyTuner>> PyTuner::create(TunerOptions options) {
  cache::TuneMode mode;
  if (options.mode.empty()) {
    KILN_ASSIGN_OR_RETURN(mode, cache::tune_mode_from_env(cache::TuneMode::kTune));
  } else {
    KILN_ASSIGN_OR_RETURN(mode, cache::parse_tune_mode(options.mode));
  }
  if (!options.executor.empty()) KILN_RETURN_IF_ERROR(parse_executor_kind(options.executor));
  if (options.configs < 0) {
    return make_error(ErrorCode::kInvalidArgument, "configs must be 0 (the effort's sample) or more");
  }
  // The remote is checked now (URL, key file), so a mistake is said at construction; it connects lazily.
  std::shared_ptr<cache::RedisTier> remote;
  if (mode != cache::TuneMode::kOff) {
    KILN_ASSIGN_OR_RETURN(auto ro, remote_options(options.remote, options.key_file, options.allow_unsigned));
    if (ro) {
      KILN_ASSIGN_OR_RETURN(remote, shared_remote(*ro));
    }
  }
  auto t = std::make_shared<PyTuner>(std::move(options), mode);
  t->remote_ = std::move(remote);
  return t;
}

Result<std::optional<cache::RemoteOptions>> remote_options(const std::optional<std::string>& remote,
                                                           const std::optional<std::string>& key_file,
                                                           bool allow_unsigned) {
  if (remote && remote->empty()) return std::optional<cache::RemoteOptions>();
  KILN_ASSIGN_OR_RETURN(auto o, cache::RemoteOptions::from_env(remote.value_or("")));
  if (o) {
    if (key_file) o->key_file = *key_file;
    if (allow_unsigned) o->allow_unsigned_binaries = true;
  }
  return o;
}

Result<std::shared_ptr<cache::RedisTier>> shared_remote(const cache::RemoteOptions& options) {
  static std::mutex mu;
  static std::map<std::string, std::weak_ptr<cache::RedisTier>> tiers;
  std::lock_guard lock(mu);
  // The key file's path (not its content) names the key here.
  const std::string id = strf("{}\n{}\n{}\n{}\n{}", options.url, options.key_file, options.allow_unsigned_binaries,
                              options.connect_timeout.count(), options.read_timeout.count());
  if (auto t = tiers[id].lock()) return t;
  KILN_ASSIGN_OR_RETURN(auto tier, cache::RedisTier::open(options));
  tiers[id] = tier;
  return tier;
}

PyTuner::PyTuner(TunerOptions options, cache::TuneMode mode) : options_(std::move(options)), mode_(mode) {}
PyTuner::~PyTuner() {
  // A background warm-up uses this tuner: it finishes first.
  if (background_ && background_->thread.joinable()) background_->thread.join();
}

Result<runtime::Tuner*> PyTuner::tuner(int device) {
  std::lock_guard lock(mu_);
  if (auto it = tuners_.find(device); it != tuners_.end()) return it->second.get();
  if (!cache_) {
    std::shared_ptr<cache::Store> store;
    if (mode_ != cache::TuneMode::kOff) {
      KILN_ASSIGN_OR_RETURN(store, shared_store(options_.cache_dir));
    }
    cache_ = std::make_shared<cache::TuningCache>(mode_, std::move(store), remote_);
  }
  if (!executor_) {
    ExecutorOptions eo;
    if (!options_.executor.empty()) {
      KILN_ASSIGN_OR_RETURN(eo.kind, parse_executor_kind(options_.executor));
    }
    // Made when compiles are coming (the tuner starts it): a warm start whose binaries are all cached compiles
    // nothing, so it never starts the process pool (a worker per core, and the handshake with a worker named
    // by $KILN_COMPILE_WORKER), which would cost start-up time on a serving engine's first request.
    executor_ = std::make_shared<DeferredExecutor>([eo] { return make_executor(eo); }, "lazy", 1);
  }
  runtime::TuneOptions o;
  o.cache = cache_;
  o.executor = executor_;
  o.device = device;
  o.max_template_configs = options_.configs;
  KILN_ASSIGN_OR_RETURN(auto t, runtime::make_tuner(std::move(o)));
  return tuners_.emplace(device, std::move(t)).first->second.get();
}

const runtime::Selection* PyTuner::find(const OpKey& key) const {
  std::lock_guard lock(mu_);
  auto it = selections_.find(key);
  if (it == selections_.end()) return nullptr;
  ++stats_.hits;
  return it->second.get();
}

Status PyTuner::keep(const OpKey& key, std::shared_ptr<runtime::Selection> sel) {
  std::lock_guard lock(mu_);
  // The first selection of a key stays: a caller may hold its pointer (the C++ tuner returns the same one
  // for a problem anyway).
  auto [it, inserted] = selections_.emplace(key, std::move(sel));
  families_[key.family()].emplace(key.size, it->second.get());
  return Status();
}

bool PyTuner::claim_or_wait(const OpKey& key, bool may_claim) {
  std::shared_ptr<Background> bg;
  {
    std::lock_guard lock(mu_);
    bg = background_;
  }
  if (!bg) return false;
  std::unique_lock lock(bg->mu);
  auto it = bg->keys.find(key);
  if (it == bg->keys.end() || bg->done) return false;
  if (it->second == Background::State::kPending && may_claim) {
    it->second = Background::State::kTakenByCall;
    return true;
  }
  bg->cv.wait(lock, [&] { return it->second == Background::State::kDone || bg->done; });
  return false;
}

void PyTuner::background_done(const OpKey& key) {
  std::shared_ptr<Background> bg;
  {
    std::lock_guard lock(mu_);
    bg = background_;
  }
  if (!bg) return;
  std::lock_guard lock(bg->mu);
  if (auto it = bg->keys.find(key); it != bg->keys.end()) it->second = Background::State::kDone;
  bg->cv.notify_all();
}

Result<const runtime::Selection*> PyTuner::resolve(const OpKey& key, const runtime::Problem& problem, CUstream stream) {
  KILN_ASSIGN_OR_RETURN(bool in_capture, capturing(stream));
  // A background warm-up's problem is never loaded twice: one it has not reached yet is loaded now by this call
  // (the warm-up skips it; the first op of a serving process waits for its own problem only), one it is loading
  // is waited for. Inside a capture nothing loads, so such a call only waits.
  if (claim_or_wait(key, !in_capture)) {
    struct Done {
      PyTuner* self;
      const OpKey& key;
      ~Done() { self->background_done(key); }
    } done{this, key};
    // The warm-up holds tune_mu_ for its whole run; the C++ tuner is thread-safe and no other call loads this
    // key while it is taken, so this load needs no lock.
    KILN_ASSIGN_OR_RETURN(runtime::Tuner * t, tuner(key.device));
    KILN_ASSIGN_OR_RETURN(auto sel, t->tune(problem));
    {
      std::lock_guard lock(mu_);
      ++stats_.misses;
      if (measured(sel->report())) ++stats_.tuned;
    }
    const runtime::Selection* raw = sel.get();
    KILN_RETURN_IF_ERROR(keep(key, std::move(sel)));
    return raw;
  }
  if (auto* s = find(key)) return s;
  std::lock_guard tune_lock(tune_mu_);
  if (auto* s = find(key)) return s;
  if (in_capture) {
    std::lock_guard lock(mu_);
    auto fam = families_.find(key.family());
    if (mode_ != cache::TuneMode::kStrict && fam != families_.end() && !fam->second.empty()) {
      auto it = fam->second.lower_bound(key.size);
      if (it == fam->second.end()) --it;
      ++stats_.capture_nearest;
      return it->second;
    }
    ++stats_.capture_errors;
    return make_error(ErrorCode::kFailedPrecondition,
                      strf("{} was not tuned before CUDA-graph capture ({} mode): kiln never tunes, compiles or "
                                  "allocates inside a capture; run the op once before capturing, or kiln.warmup() a "
                                  "workload that has it",
                                  problem.describe(), cache::tune_mode_name(mode_)),
                      "capture-miss");
  }
  KILN_ASSIGN_OR_RETURN(runtime::Tuner * t, tuner(key.device));
  KILN_ASSIGN_OR_RETURN(auto sel, t->tune(problem));
  {
    std::lock_guard lock(mu_);
    ++stats_.misses;
    if (measured(sel->report())) ++stats_.tuned;
  }
  const runtime::Selection* raw = sel.get();
  KILN_RETURN_IF_ERROR(keep(key, std::move(sel)));
  return raw;
}

Result<WarmupReport> PyTuner::warmup(const std::vector<runtime::Problem>& problems, int device, int threads) {
  if (!warmup_done()) {
    return make_error(ErrorCode::kFailedPrecondition, "a background warm-up of this tuner is running: wait for it first");
  }
  std::lock_guard tune_lock(tune_mu_);
  return run_warmup(problems, device, threads, nullptr);
}

Result<WarmupReport> PyTuner::run_warmup(const std::vector<runtime::Problem>& problems, int device, int threads,
                                         Background* bg) {
  using Clock = std::chrono::steady_clock;
  auto since = [](Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); };
  const auto start = Clock::now();
  WarmupReport r;
  KILN_ASSIGN_OR_RETURN(runtime::Tuner * t, tuner(device));
  r.open_seconds = since(start);
  KILN_ASSIGN_OR_RETURN(CUcontext ctx, ensure_context(device));
  KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
  const uint64_t compiles_before = compiles();
  r.threads = warmup_threads(threads, problems.size());

  // Problems without a cached decision are tuned, one at a time: tunes on several threads at once measured the
  // Llama-3-8B workload in 75.7 s against 10.3 s on one thread on an H200 (29 Nov; why is not known yet: the
  // tuner benchmarks one at a time, so parallel tunes only interleave their host work with the measuring). Their
  // planned compiles all start first, so a tune finds the next problems' kernels compiling or done (as `kiln tune`
  // does); decided problems load on every thread meanwhile.
  // (A tuner that never measures, mode use or strict, compiles only the reference of an undecided problem.)
  std::mutex undecided_mu;
  const bool measures = t->cache().mode() == cache::TuneMode::kTune || t->cache().mode() == cache::TuneMode::kOff;
  const runtime::UndecidedProblems undecided =
      measures ? runtime::undecided_problems(*t, problems)
               : runtime::UndecidedProblems{{}, std::vector<std::ptrdiff_t>(problems.size(), -1)};
  const std::vector<std::ptrdiff_t>& ahead_index = undecided.index;
  // Planned on a thread of its own, in order, each again a few tunes before its own (runtime::PlanAhead).
  runtime::PlanAhead ahead(*t, undecided.problems, runtime::PlanAhead::Options{});
  std::mutex report_mu;
  Status fatal;
  std::atomic<size_t> next{0};
  auto work = [&](bool own_thread) {
    RelaxedCaptureMode relaxed;
    // Modules load into the tuner's context, whichever thread loads them.
    if (own_thread) {
      if (CUresult rc = d->cuCtxSetCurrent(ctx); rc != CUDA_SUCCESS) {
        std::lock_guard lock(report_mu);
        fatal = to_status(rc, "cuCtxSetCurrent", __FILE__, __LINE__);
        return;
      }
    }
    for (size_t i = next++; i < problems.size(); i = next++) {
      const runtime::Problem& p = problems[i];
      // However this problem ends (tuned, loaded, taken over by an op call), its compiles ahead are moot.
      struct Withdraw {
        runtime::PlanAhead& ahead;
        std::ptrdiff_t index;
        ~Withdraw() {
          if (index >= 0) ahead.tuned(static_cast<size_t>(index));
        }
      } withdraw{ahead, ahead_index[i]};
      auto key = key_of(p, device);
      if (!key.ok()) {
        std::lock_guard lock(report_mu);
        ++r.skipped;
        if (r.errors.size() < 20) r.errors.push_back(key.status().message());
        continue;
      }
      if (bg) {
        std::lock_guard lock(bg->mu);
        auto& state = bg->keys[*key];
        if (state != Background::State::kPending) {  // an op call took it over
          std::lock_guard report_lock(report_mu);
          ++r.taken_by_calls;
          continue;
        }
        state = Background::State::kLoading;
      }
      std::unique_lock<std::mutex> one_tune(undecided_mu, std::defer_lock);
      if (ahead_index[i] >= 0) one_tune.lock();
      auto sel = t->tune(p);
      if (one_tune.owns_lock()) one_tune.unlock();
      {
        std::lock_guard lock(report_mu);
        if (!sel.ok()) {
          ++r.failed;
          if (r.errors.size() < 20) r.errors.push_back(strf("{}: {}", p.describe(), sel.status().to_string()));
        } else {
          const runtime::TuneReport& tr = (*sel)->report();
          ++r.ready;
          if (tr.decision_from_cache) ++r.from_cached_decision;
          if (measured(tr)) ++r.tuned;
          r.fetch_seconds += tr.decision_from_cache ? tr.compile_wait_seconds : 0;
          r.load_seconds += tr.load_seconds;
          note_slow(r.slowest, {tr.problem, tr.chosen, tr.compile_wait_seconds, tr.load_seconds});
          if (Status st = keep(*key, std::move(*sel)); !st.ok() && fatal.ok()) fatal = st;
        }
      }
      if (bg) {  // kept (or failed) before its waiters wake
        std::lock_guard lock(bg->mu);
        bg->keys[*key] = Background::State::kDone;
        bg->cv.notify_all();
      }
    }
  };
  {
    std::vector<std::thread> pool;
    for (int i = 1; i < r.threads; ++i) pool.emplace_back(work, true);
    work(false);
    for (auto& th : pool) th.join();
  }
  KILN_RETURN_IF_ERROR(fatal);
  r.problems = static_cast<int>(problems.size());
  r.compiled = compiles() - compiles_before;
  r.seconds = since(start);
  return r;
}

Status PyTuner::start_warmup(std::vector<runtime::Problem> problems, int device, int threads) {
  auto bg = std::make_shared<Background>();
  for (const auto& p : problems) {
    if (auto key = key_of(p, device); key.ok()) bg->keys.emplace(*key, Background::State::kPending);
  }
  {
    std::lock_guard lock(mu_);
    if (background_ && !background_->done) {
      return make_error(ErrorCode::kFailedPrecondition, "a background warm-up of this tuner is already running");
    }
    if (background_ && background_->thread.joinable()) background_->thread.join();  // done: joins at once
    background_ = bg;
  }
  bg->thread = std::thread([this, bg, problems = std::move(problems), device, threads] {
    Result<WarmupReport> r = [&] {
      std::lock_guard tune_lock(tune_mu_);
      return run_warmup(problems, device, threads, bg.get());
    }();
    std::lock_guard lock(bg->mu);
    bg->report = std::move(r);
    bg->done = true;
    bg->cv.notify_all();
  });
  return Status();
}

Result<WarmupReport> PyTuner::wait_warmup() {
  std::shared_ptr<Background> bg;
  {
    std::lock_guard lock(mu_);
    bg = background_;
  }
  if (!bg) return make_error(ErrorCode::kNotFound, "no background warm-up was started on this tuner");
  std::unique_lock lock(bg->mu);
  bg->cv.wait(lock, [&] { return bg->done; });
  return bg->report;
}

bool PyTuner::warmup_done() const {
  std::lock_guard lock(mu_);
  if (!background_) return true;
  std::lock_guard bg_lock(background_->mu);
  return background_->done;
}

namespace {

// A cached decision's problem, back from its canonical key (runtime::Problem::key's inverse for the ops the
// package runs): the operands carry the shapes, dtypes and layouts, the epilogue tag its ops.
Result<runtime::Problem> problem_from_key(const cache::ProblemKey& k) {
  auto dim = [&](size_t operand, size_t i) -> int64_t {
    return operand < k.operands.size() && i < k.operands[operand].shape.size() ? k.operands[operand].shape[i] : 0;
  };
  auto dtype = [&](size_t operand) { return operand < k.operands.size() ? k.operands[operand].dtype : std::string(); };
  auto attr = [&](const char* name) {
    for (const auto& [n, v] : k.attributes)
      if (n == name) return v;
    return std::string();
  };
  std::string json;
  if (k.op == "gemm" && k.operands.size() == 3) {
    std::string ops;
    // The tag is "<op>[dtype]_..._<out dtype>"; an operand's dtype is also in the attributes.
    std::string tag = k.epilogue;
    for (size_t pos = 0; !tag.empty() && pos < tag.size();) {
      size_t end = tag.find('_', pos);
      if (end == std::string::npos) break;  // the last part is the output dtype
      std::string part = tag.substr(pos, end - pos);
      for (const char* op : {"scale", "bias", "residual", "relu", "gelu", "silu"}) {
        if (part.rfind(op, 0) == 0) ops += (ops.empty() ? "" : "+") + std::string(op);
      }
      pos = end + 1;
    }
    json = strf(R"({{"op":"gemm","m":{},"k":{},"n":{},"dtype":"{}","layout_a":"{}","layout_b":"{}","out":"{}","epilogue":"{}")",
                       dim(0, 0), dim(0, 1), dim(1, 1), dtype(0), k.operands[0].layout, k.operands[1].layout, dtype(2), ops);
    if (!attr("bias").empty()) json += strf(R"(,"bias_dtype":"{}")", attr("bias"));
    if (!attr("residual").empty()) json += strf(R"(,"residual_dtype":"{}")", attr("residual"));
    json += "}";
  } else if ((k.op == "rmsnorm" || k.op == "softmax") && !k.operands.empty()) {
    json = strf(R"({{"op":"{}","rows":{},"cols":{},"dtype":"{}"{}}})", k.op, dim(0, 0), dim(0, 1), dtype(0),
                       k.op == "rmsnorm" ? strf(R"(,"residual":{})", attr("residual") == "1") : "");
  } else {
    return make_error(ErrorCode::kUnimplemented, strf("op '{}' is not run by the Python package", k.op));
  }
  KILN_ASSIGN_OR_RETURN(auto w, runtime::parse_workload(R"({"name":"cache","problems":[)" + json + "]}"));
  if (w.problems.size() != 1) return make_error(ErrorCode::kInternal, "a decision's key gave no single problem");
  return w.problems[0];
}

}  // namespace

Result<std::vector<runtime::Problem>> PyTuner::cached_problems(int device) {
  KILN_ASSIGN_OR_RETURN(runtime::Tuner * t, tuner(device));
  std::vector<runtime::Problem> out;
  if (!t->cache().store()) return out;  // off mode: nothing on disk
  // The environment (device, driver, CUDA, cuBLAS, kiln) as this tuner writes it, taken from a key it makes.
  KILN_ASSIGN_OR_RETURN(auto probe, cache::ProblemKey::parse(t->key(runtime::Problem::softmax({.rows = 1, .cols = 1}))));
  for (const auto& d : t->cache().store()->decisions(cache::environment_prefix(probe.device, probe.versions))) {
    auto key = cache::ProblemKey::parse(d->problem);
    if (!key.ok()) continue;
    auto p = problem_from_key(*key);
    if (p.ok()) out.push_back(std::move(*p));
  }
  return out;
}

std::string PyTuner::cache_dir() const {
  std::lock_guard lock(mu_);
  if (cache_ && cache_->store()) return cache_->store()->dir();
  return options_.cache_dir.empty() ? cache::default_cache_dir() : options_.cache_dir;
}

TunerStats PyTuner::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

std::vector<runtime::TuneReport> PyTuner::reports() const {
  std::lock_guard lock(mu_);
  std::vector<runtime::TuneReport> out;
  for (const auto& [device, t] : tuners_)
    for (auto& r : t->reports()) out.push_back(std::move(r));
  return out;
}

uint64_t PyTuner::compiles() const {
  std::lock_guard lock(mu_);
  uint64_t n = 0;
  for (const auto& [device, t] : tuners_) n += t->gate().counters().compiles;
  return n;
}

}  // namespace kiln::py
