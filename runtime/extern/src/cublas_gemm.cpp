#include "cublas_gemm.h"

#include <cublas_v2.h>

#include <cstdio>
#include <atomic>
#include <map>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "kiln/jit/device.h"
#include "kiln/jit/driver.h"

namespace kiln {

Status to_status(cublasStatus_t result, const char* expr, const char* file, int line) {
  if (result == CUBLAS_STATUS_SUCCESS) return Status();
  std::string_view f(file);
  if (auto s = f.rfind('/'); s != std::string_view::npos) f.remove_prefix(s + 1);
  return make_error(ErrorCode::kLibraryError,
                    fmt::format("{} failed: cuBLAS status {} [{}:{}]", expr, static_cast<int>(result), f, line));
}

}  // namespace kiln

namespace kiln::runtime::detail {
namespace {

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::kF16: return CUDA_R_16F;
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kF32: return CUDA_R_32F;
  }
  return CUDA_R_32F;
}

constexpr size_t kWorkspaceBytes = 32ull << 20;  // what PyTorch gives cuBLASLt on Hopper

// Owners of cuBLASLt descriptors.
struct MatmulDesc {
  cublasLtMatmulDesc_t d = nullptr;
  ~MatmulDesc() { if (d) cublasLtMatmulDescDestroy(d); }
};
struct LayoutDesc {
  cublasLtMatrixLayout_t l = nullptr;
  ~LayoutDesc() { if (l) cublasLtMatrixLayoutDestroy(l); }
};
struct Preference {
  cublasLtMatmulPreference_t p = nullptr;
  ~Preference() { if (p) cublasLtMatmulPreferenceDestroy(p); }
};

// Everything a cuBLASLt call needs for one problem and one set of leading dimensions.
struct Call {
  MatmulDesc desc;
  LayoutDesc a, b, c, d;  // cuBLAS's operands: a = our B, b = our A (see make_call)
  LtEpilogue ep;
  bool fuse = false;
};

// Our row-major D[M,N] = A[M,K]·B[K,N] is cuBLAS's column-major D'[N,M] = B'[N,K]·A'[K,M], where a row-major
// matrix read column-major is its transpose. So cuBLAS's first operand is our B, its second our A, its m is
// our N, and a bias per cuBLAS row is our bias per column.
Status make_call(const GemmProblem& p, bool fuse, DType plain_out, const KilnGemmArgs& args, Call& call) {
  const LtEpilogue ep = lt_epilogue(p);
  call.fuse = fuse && ep.fusable;
  call.ep = call.fuse ? ep : LtEpilogue{};
  DType out = call.fuse ? p.epilogue.out : plain_out;
  KILN_CHECK(cublasLtMatmulDescCreate(&call.desc.d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t op_a = p.b_layout == Layout::kRowMajor ? CUBLAS_OP_N : CUBLAS_OP_T;
  cublasOperation_t op_b = p.a_layout == Layout::kRowMajor ? CUBLAS_OP_N : CUBLAS_OP_T;
  KILN_CHECK(cublasLtMatmulDescSetAttribute(call.desc.d, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
  KILN_CHECK(cublasLtMatmulDescSetAttribute(call.desc.d, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
  if (call.fuse) {
    KILN_CHECK(cublasLtMatmulDescSetAttribute(call.desc.d, CUBLASLT_MATMUL_DESC_EPILOGUE, &call.ep.epilogue,
                                              sizeof call.ep.epilogue));
    if (p.epilogue.has(templates::EpilogueOp::kBias)) {
      cudaDataType_t bias_type = cuda_type(p.epilogue.bias_dtype);
      KILN_CHECK(cublasLtMatmulDescSetAttribute(call.desc.d, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                sizeof bias_type));
      const void* bias = args.ep.bias;
      KILN_CHECK(cublasLtMatmulDescSetAttribute(call.desc.d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    }
  }
  const uint64_t m = static_cast<uint64_t>(args.m), n = static_cast<uint64_t>(args.n), k = static_cast<uint64_t>(args.k);
  if (op_a == CUBLAS_OP_N) {
    KILN_CHECK(cublasLtMatrixLayoutCreate(&call.a.l, cuda_type(p.b), n, k, args.ldb));
  } else {
    KILN_CHECK(cublasLtMatrixLayoutCreate(&call.a.l, cuda_type(p.b), k, n, args.ldb));
  }
  if (op_b == CUBLAS_OP_N) {
    KILN_CHECK(cublasLtMatrixLayoutCreate(&call.b.l, cuda_type(p.a), k, m, args.lda));
  } else {
    KILN_CHECK(cublasLtMatrixLayoutCreate(&call.b.l, cuda_type(p.a), m, k, args.lda));
  }
  KILN_CHECK(cublasLtMatrixLayoutCreate(&call.d.l, cuda_type(out), n, m, args.ldd));
  int64_t ldc = call.ep.residual ? args.ep.ld_residual : args.ldd;
  KILN_CHECK(cublasLtMatrixLayoutCreate(&call.c.l, cuda_type(out), n, m, ldc));
  return Status();
}

Result<std::vector<cublasLtMatmulHeuristicResult_t>> heuristics(const LtContext& lt, const Call& call, int max_algos) {
  Preference pref;
  KILN_CHECK(cublasLtMatmulPreferenceCreate(&pref.p));
  size_t ws = lt.workspace_bytes;
  KILN_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(max_algos));
  int found = 0;
  KILN_CHECK(cublasLtMatmulAlgoGetHeuristic(lt.handle, call.desc.d, call.a.l, call.b.l, call.c.l, call.d.l, pref.p,
                                            max_algos, results.data(), &found));
  results.resize(static_cast<size_t>(found));
  return results;
}

template <class T>
T config(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  T v{};
  size_t written = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof v, &written);
  return v;
}

std::string algo_name(const cublasLtMatmulAlgo_t& a) {
  return fmt::format("cublaslt_a{}_t{}_s{}_k{}_r{}_w{}_c{}_i{}_cl{}", config<int32_t>(a, CUBLASLT_ALGO_CONFIG_ID),
                     config<uint32_t>(a, CUBLASLT_ALGO_CONFIG_TILE_ID), config<uint32_t>(a, CUBLASLT_ALGO_CONFIG_STAGES_ID),
                     config<int32_t>(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
                     config<uint32_t>(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME),
                     config<uint32_t>(a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
                     config<uint32_t>(a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION),
                     config<uint16_t>(a, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID),
                     config<uint16_t>(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID));
}

KilnGemmArgs packed_args(const GemmProblem& p) {
  KilnGemmArgs a{};
  a.m = static_cast<int>(p.m);
  a.n = static_cast<int>(p.n);
  a.k = static_cast<int>(p.k);
  a.lda = p.a_layout == Layout::kRowMajor ? p.k : p.m;
  a.ldb = p.b_layout == Layout::kRowMajor ? p.n : p.k;
  a.ldd = p.n;
  a.ep.ld_residual = p.n;
  a.ep.alpha = 1;
  a.ep.beta = 1;
  return a;
}

}  // namespace

std::string cublas_version() { return std::to_string(cublasLtGetVersion()); }

namespace {

struct LtContexts {
  std::mutex mu;  // held while a handle is made
  std::map<CUcontext, LtContext> per_context;  // process lifetime: handles are reused
};
LtContexts& lt_contexts() {
  static auto* all = new LtContexts();  // never destroyed: handles outlive static destruction
  return *all;
}

Result<CUcontext> lt_current_context() {
  KILN_ASSIGN_OR_RETURN(CUcontext ctx, current_context());
  if (ctx == nullptr) {
    return make_error(ErrorCode::kFailedPrecondition, "cuBLASLt needs a current CUDA context (kiln::ensure_context)");
  }
  return ctx;
}

// The thread start_lt_context() and run_in_lt_start() use: tasks in order, each in the context it was
// given for, the thread exiting when none is left. A static whose destructor joins it, so that a process
// exiting while cuBLASLt starts up waits for it (kiln's statics are destroyed before the cuBLASLt library
// it loaded).
struct LtStarter {
  std::mutex mu;
  std::thread thread;
  std::deque<std::pair<CUcontext, std::function<void()>>> tasks;
  bool running = false;  // the thread is taking tasks: a new one is queued for it, no thread is started
  std::map<CUcontext, int> started;  // per context, the handles start_lt_context() queued: 1 cuBLASLt, 2 cuBLAS
  ~LtStarter() {
    std::unique_lock lock(mu);
    std::thread t = std::move(thread);
    lock.unlock();
    if (t.joinable()) t.join();
  }
};

LtStarter& lt_starter() {
  static LtStarter starter;
  return starter;
}

void run_tasks() {
  LtStarter& starter = lt_starter();
  auto d = driver();
  // Relaxed: a graph capture on another thread neither sees nor forbids what the tasks allocate.
  if (d.ok()) {
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    (*d)->cuThreadExchangeStreamCaptureMode(&mode);
  }
  for (;;) {
    std::pair<CUcontext, std::function<void()>> task;
    {
      std::lock_guard lock(starter.mu);
      if (starter.tasks.empty()) {
        starter.running = false;
        return;
      }
      task = std::move(starter.tasks.front());
      starter.tasks.pop_front();
    }
    if (d.ok() && (*d)->cuCtxSetCurrent(task.first) == CUDA_SUCCESS) task.second();
  }
}

}  // namespace

Result<const LtContext*> lt_context() {
  KILN_ASSIGN_OR_RETURN(CUcontext ctx, lt_current_context());
  LtContexts& all = lt_contexts();
  std::lock_guard lock(all.mu);
  auto it = all.per_context.find(ctx);
  if (it != all.per_context.end()) return &it->second;
  LtContext lt;
  KILN_CHECK(cublasLtCreate(&lt.handle));
  KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
  if (d->cuMemAlloc(&lt.workspace, kWorkspaceBytes) == CUDA_SUCCESS) lt.workspace_bytes = kWorkspaceBytes;
  return &all.per_context.emplace(ctx, lt).first->second;
}

bool lt_context_ready() {
  auto ctx = lt_current_context();
  if (!ctx.ok()) return false;
  LtContexts& all = lt_contexts();
  std::unique_lock lock(all.mu, std::try_to_lock);
  return lock.owns_lock() && all.per_context.count(*ctx) != 0;
}

void run_in_lt_start(std::function<void()> task) {
  auto ctx = lt_current_context();
  if (!ctx.ok()) return;
  LtStarter& starter = lt_starter();
  std::lock_guard lock(starter.mu);
  starter.tasks.emplace_back(*ctx, std::move(task));
  if (starter.running) return;
  if (starter.thread.joinable()) starter.thread.join();  // an earlier thread that has run out of tasks
  starter.running = true;
  starter.thread = std::thread(run_tasks);
}

void start_lt_context(bool with_cublas) {
  if (lt_context_ready() && (!with_cublas || cublas_handle_ready())) return;
  auto ctx = lt_current_context();
  if (!ctx.ok()) return;
  {
    LtStarter& starter = lt_starter();
    std::lock_guard lock(starter.mu);
    const int want = with_cublas ? 3 : 1;
    int& queued = starter.started[*ctx];
    if ((queued & want) == want) return;  // being made, or made (a failed one is retried by the run needing it)
    queued |= want;
  }
  // A failure is not kept: lt_context() and cublas_ready() try again (and report it) at the first run that
  // needs them.
  run_in_lt_start([with_cublas] {
    (void)lt_context();
    if (with_cublas) (void)cublas_ready();
  });
}

LtEpilogue lt_epilogue(const GemmProblem& p) {
  using templates::EpilogueOp;
  LtEpilogue out;
  const auto& ops = p.epilogue.ops;
  size_t i = 0;
  if (i < ops.size() && ops[i] == EpilogueOp::kScale) out.scale = true, ++i;
  bool bias = false;
  for (; i < ops.size() && (ops[i] == EpilogueOp::kBias || ops[i] == EpilogueOp::kResidual); ++i) {
    bool& flag = ops[i] == EpilogueOp::kBias ? bias : out.residual;
    if (flag) return LtEpilogue{.why_not = "an op repeats"};
    flag = true;
  }
  enum { kNone, kRelu, kGelu } act = kNone;
  if (i < ops.size() && (ops[i] == EpilogueOp::kRelu || ops[i] == EpilogueOp::kGelu)) {
    act = ops[i] == EpilogueOp::kRelu ? kRelu : kGelu;
    ++i;
  }
  if (i != ops.size()) {
    return LtEpilogue{.why_not = fmt::format("cuBLASLt computes act(alpha*AB + beta*C + bias); '{}' is not of that form",
                                             p.epilogue.tag())};
  }
  if (out.residual && p.epilogue.residual_dtype != p.epilogue.out) {
    return LtEpilogue{.why_not = "cuBLASLt's C (the residual) must have D's dtype"};
  }
  out.fusable = true;
  if (act == kRelu) out.epilogue = bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
  else if (act == kGelu) out.epilogue = bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
  else out.epilogue = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  return out;
}

struct LtGemm::State {
  GemmProblem problem;
  bool fuse = false;
  DType plain_out = DType::kF32;
  const LtContext* lt = nullptr;
  mutable std::mutex mu;
  mutable Call call;            // built for `built` sizes; rebuilt when a call's differ
  mutable KilnGemmArgs built{};
  // Whether the last algorithm run is valid for `built` (an algorithm picked for one shape may not be for
  // another: cuBLASLt is asked again, and its heuristic runs the shapes it refuses).
  mutable std::string checked_algo;
  mutable bool algo_valid = true;
};

namespace {
bool same_shape(const KilnGemmArgs& x, const KilnGemmArgs& y) {
  return x.m == y.m && x.n == y.n && x.k == y.k && x.lda == y.lda && x.ldb == y.ldb && x.ldd == y.ldd &&
         x.ep.ld_residual == y.ep.ld_residual;
}
}  // namespace

Result<std::unique_ptr<LtGemm>> LtGemm::create(const GemmProblem& p, bool fuse, DType plain_out) {
  auto s = std::make_unique<State>();
  KILN_ASSIGN_OR_RETURN(s->lt, lt_context());
  s->problem = p;
  s->fuse = fuse;
  s->plain_out = plain_out;
  s->built = packed_args(p);
  KILN_RETURN_IF_ERROR(make_call(p, fuse, plain_out, s->built, s->call));
  bool fused = s->call.fuse;
  return std::unique_ptr<LtGemm>(new LtGemm(std::move(s), fused));
}

LtGemm::LtGemm(std::unique_ptr<State> s, bool fused) : state_(std::move(s)), fused_(fused) {}
LtGemm::~LtGemm() = default;

Result<std::vector<LtAlgo>> LtGemm::algorithms(int max_algos) const {
  std::lock_guard lock(state_->mu);
  Call fresh;  // the problem's own packed sizes, whatever the last run used
  KILN_RETURN_IF_ERROR(make_call(state_->problem, state_->fuse, state_->plain_out, packed_args(state_->problem), fresh));
  KILN_ASSIGN_OR_RETURN(auto results, heuristics(*state_->lt, fresh, max_algos));
  std::vector<LtAlgo> algos;
  for (const auto& r : results) {
    if (r.state != CUBLAS_STATUS_SUCCESS) continue;
    LtAlgo a{algo_name(r.algo), r.algo, r.workspaceSize};
    bool seen = false;
    for (const auto& b : algos) seen |= b.name == a.name;
    if (!seen) algos.push_back(std::move(a));
  }
  if (algos.empty()) {
    return make_error(ErrorCode::kUnimplemented,
                      fmt::format("cuBLASLt proposes no algorithm for this GEMM{}", fused_ ? " with its fused epilogue" : ""));
  }
  return algos;
}

Result<LtAlgo> LtGemm::algorithm(const std::string& name) const {
  int32_t id = 0, splitk = 0;
  uint32_t tile = 0, stages = 0, reduction = 0, swizzle = 0, custom = 0, inner = 0, cluster = 0;
  if (std::sscanf(name.c_str(), "cublaslt_a%d_t%u_s%u_k%d_r%u_w%u_c%u_i%u_cl%u", &id, &tile, &stages, &splitk,
                  &reduction, &swizzle, &custom, &inner, &cluster) != 9) {
    return make_error(ErrorCode::kInvalidArgument, fmt::format("'{}' is not a cuBLASLt algorithm name", name));
  }
  const GemmProblem& p = state_->problem;
  DType out = fused_ ? p.epilogue.out : state_->plain_out;
  LtAlgo a;
  a.name = name;
  KILN_CHECK(cublasLtMatmulAlgoInit(state_->lt->handle, CUBLAS_COMPUTE_32F, CUDA_R_32F, cuda_type(p.b),
                                    cuda_type(p.a), cuda_type(out), cuda_type(out), id, &a.algo));
  uint16_t inner16 = static_cast<uint16_t>(inner), cluster16 = static_cast<uint16_t>(cluster);
  auto set = [&](cublasLtMatmulAlgoConfigAttributes_t attr, const void* v, size_t n) {
    return to_status(cublasLtMatmulAlgoConfigSetAttribute(&a.algo, attr, v, n), "cublasLtMatmulAlgoConfigSetAttribute",
                     __FILE__, __LINE__);
  };
  KILN_RETURN_IF_ERROR(set(CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile));
  KILN_RETURN_IF_ERROR(set(CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages));
  KILN_RETURN_IF_ERROR(set(CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk));
  KILN_RETURN_IF_ERROR(set(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &reduction, sizeof reduction));
  KILN_RETURN_IF_ERROR(set(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swizzle, sizeof swizzle));
  KILN_RETURN_IF_ERROR(set(CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &custom, sizeof custom));
  KILN_RETURN_IF_ERROR(set(CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, &inner16, sizeof inner16));
  KILN_RETURN_IF_ERROR(set(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster16, sizeof cluster16));
  std::lock_guard lock(state_->mu);
  Call fresh;
  KILN_RETURN_IF_ERROR(make_call(p, state_->fuse, state_->plain_out, packed_args(p), fresh));
  cublasLtMatmulHeuristicResult_t check{};
  cublasStatus_t rc = cublasLtMatmulAlgoCheck(state_->lt->handle, fresh.desc.d, fresh.a.l, fresh.b.l, fresh.c.l,
                                              fresh.d.l, &a.algo, &check);
  if (rc != CUBLAS_STATUS_SUCCESS || check.workspaceSize > state_->lt->workspace_bytes) {
    return make_error(ErrorCode::kNotFound, fmt::format("cuBLASLt refuses algorithm '{}' for this GEMM", name));
  }
  a.workspace_bytes = check.workspaceSize;
  return a;
}

Status LtGemm::run(const LtAlgo* algo, const KilnGemmArgs& args, CUstream stream) const {
  State& s = *state_;
  std::lock_guard lock(s.mu);
  if (!same_shape(args, s.built)) {
    Call rebuilt;
    KILN_RETURN_IF_ERROR(make_call(s.problem, s.fuse, s.plain_out, args, rebuilt));
    std::swap(s.call.desc.d, rebuilt.desc.d);
    std::swap(s.call.a.l, rebuilt.a.l);
    std::swap(s.call.b.l, rebuilt.b.l);
    std::swap(s.call.c.l, rebuilt.c.l);
    std::swap(s.call.d.l, rebuilt.d.l);
    s.built = args;
    s.checked_algo.clear();
  }
  if (algo != nullptr && s.checked_algo != algo->name) {
    cublasLtMatmulHeuristicResult_t check{};
    cublasStatus_t rc = cublasLtMatmulAlgoCheck(s.lt->handle, s.call.desc.d, s.call.a.l, s.call.b.l, s.call.c.l,
                                                s.call.d.l, &algo->algo, &check);
    s.algo_valid = rc == CUBLAS_STATUS_SUCCESS && check.workspaceSize <= s.lt->workspace_bytes;
    s.checked_algo = algo->name;
  }
  if (!s.algo_valid) algo = nullptr;
  if (s.call.fuse && s.problem.epilogue.has(templates::EpilogueOp::kBias)) {
    const void* bias = args.ep.bias;
    KILN_CHECK(cublasLtMatmulDescSetAttribute(s.call.desc.d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
  }
  const float alpha = s.call.ep.scale ? args.ep.alpha : 1.0f;
  const float beta = s.call.ep.residual ? args.ep.beta : 0.0f;
  const void* c = s.call.ep.residual ? args.ep.residual : args.d;
  KILN_CHECK(cublasLtMatmul(s.lt->handle, s.call.desc.d, &alpha, args.b, s.call.a.l, args.a, s.call.b.l, &beta, c,
                            s.call.c.l, args.d, s.call.d.l, algo ? &algo->algo : nullptr,
                            reinterpret_cast<void*>(s.lt->workspace), s.lt->workspace_bytes,
                            reinterpret_cast<cudaStream_t>(stream)));
  return Status();
}

namespace {
// cuBLAS handles per context, created once and kept for the life of the process, as cuBLAS advises.
struct CublasHandles {
  std::mutex mu;  // held while a handle is made and while one is used
  std::map<CUcontext, cublasHandle_t> per_context;
};
CublasHandles& cublas_handles() {
  static auto* all = new CublasHandles();  // never destroyed, like the handles
  return *all;
}

Result<cublasHandle_t> cublas_handle(std::unique_lock<std::mutex>& lock) {
  KILN_ASSIGN_OR_RETURN(CUcontext ctx, current_context());
  if (ctx == nullptr) {
    return make_error(ErrorCode::kFailedPrecondition, "cuBLAS needs a current CUDA context (kiln::ensure_context)");
  }
  CublasHandles& all = cublas_handles();
  lock = std::unique_lock<std::mutex>(all.mu);
  cublasHandle_t& h = all.per_context[ctx];
  if (h == nullptr) {
    KILN_CHECK(cublasCreate(&h));
    KILN_ASSIGN_OR_RETURN(const LtContext* lt, lt_context());
    if (lt->workspace_bytes) {
      KILN_CHECK(cublasSetWorkspace(h, reinterpret_cast<void*>(lt->workspace), lt->workspace_bytes));
    }
  }
  return h;
}
}  // namespace

Status cublas_ready() {
  std::unique_lock<std::mutex> lock;
  return cublas_handle(lock).status();
}

bool cublas_handle_ready() {
  auto ctx = lt_current_context();
  if (!ctx.ok()) return false;
  CublasHandles& all = cublas_handles();
  std::unique_lock lock(all.mu, std::try_to_lock);
  if (!lock.owns_lock()) return false;
  auto it = all.per_context.find(*ctx);
  return it != all.per_context.end() && it->second != nullptr;
}

Status cublas_default_gemm(const GemmProblem& p, DType out, const KilnGemmArgs& args, CUstream stream) {
  std::unique_lock<std::mutex> lock;  // cuBLAS handles are not safe to share between threads unlocked
  KILN_ASSIGN_OR_RETURN(cublasHandle_t h, cublas_handle(lock));
  KILN_CHECK(cublasSetStream(h, reinterpret_cast<cudaStream_t>(stream)));
  const float alpha = 1.0f, beta = 0.0f;
  cublasOperation_t op_a = p.b_layout == Layout::kRowMajor ? CUBLAS_OP_N : CUBLAS_OP_T;
  cublasOperation_t op_b = p.a_layout == Layout::kRowMajor ? CUBLAS_OP_N : CUBLAS_OP_T;
  KILN_CHECK(cublasGemmEx(h, op_a, op_b, args.n, args.m, args.k, &alpha, args.b, cuda_type(p.b),
                          static_cast<int>(args.ldb), args.a, cuda_type(p.a), static_cast<int>(args.lda), &beta, args.d,
                          cuda_type(out), static_cast<int>(args.ldd), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return Status();
}

}  // namespace kiln::runtime::detail
