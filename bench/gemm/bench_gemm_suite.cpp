// bench_gemm_suite: the public GEMM suite (issue 15). Every shape of suite_shapes.h (linear layers of Llama-3,
// Qwen2.5, Mixtral and DeepSeek-V3, tensor-parallel slices, M from 1 to 8192, bf16 and fp16, both B layouts)
// measured in one run for:
//   cuBLAS     cublasGemmEx, default algorithm;
//   cuBLASLt   every algorithm its heuristic returns (up to --lt-algos), the fastest correct one;
//   kiln       every GEMM template family the device can run and no other supersedes (gemm_wgmma_sm90 on an
//              H100/H200; --family gemm_mma_sm80 or all adds the others), up to --max-configs configurations per
//              family chosen by suite_candidates.cpp's heuristic, compiled in parallel through kiln's executor.
// D = A . B with A row-major [M,K], fp32 accumulation, D in the input dtype, no epilogue.
//
// Method: inputs are a hash of the element index (never zeros; the CPU recomputes any element), rotated over
// enough copies to exceed L2 three times. cuBLAS's output is the reference, itself spot-checked against a
// float64 dot product on the CPU; every other candidate's output (poisoned first) must be within the dtype's
// relative-norm tolerance of it before it is timed, and a wrong one never counts. Times are GPU times of CUDA
// graphs of many launches (host launch overhead excluded for every side alike), median of --samples graphs.
// The figures in the table come from a final round in which cuBLAS, the best cuBLASLt algorithm and the best
// kiln configuration are timed interleaved, --rounds times (the GPU's clock drifts over a run).
//
// Robustness: the shapes run in a child process; a candidate that faults the context or hangs (--hang-seconds
// without progress) kills only that child, and the next child resumes at the same shape with that configuration
// left out (it is named in the shape's record). --max-seconds bounds the whole run; whatever was measured by
// then is written. Results are appended to <out>.jsonl as each shape finishes, then <out>.json (a list, one
// object per shape), <out>.md (table and summary) and <out>.svg (speed-up per shape) are written.
//
// Usage: bench_gemm_suite --out DIR/gemm-suite [--shapes FILTER] [--max-seconds S] [--max-configs N]
//                         [--family NAME]... [--samples N] [--rounds N] [--list]
#include <cublasLt.h>
#include <cublas_v2.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "bench_util.h"
#include "kiln/jit.h"
#include "kiln/jit/driver.h"
#include "kiln/pool/executor.h"
#include "kiln/templates/gemm.h"
#include "kiln/templates/templates.h"
#include "suite_candidates.h"
#include "suite_report.h"
#include "suite_shapes.h"

using namespace kiln;
using namespace kiln::templates;
using kiln::bench::suite::SuiteShape;
using nlohmann::json;

namespace {

struct Options {
  std::string out = "gemm-suite";
  std::string shapes;
  double max_seconds = 480;
  double hang_seconds = 60;
  size_t max_configs = 40;
  int lt_algos = 32;
  int samples = 5;
  int rounds = 5;
  double batch_us = 300;
  std::vector<std::string> families;
  bool list = false;
};

// ------------------------------------------------------------------------------------------------ inputs

// Uniform [-1, 1) from a hash of the element index; the device fill and the CPU check share it bit for bit.
float hash_value(unsigned long long i, unsigned seed) {
  unsigned x = static_cast<unsigned>(i) * 2654435761u ^ seed * 0x9e3779b9u;
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return static_cast<float>(x >> 8) * (2.0f / 16777216.0f) - 1.0f;
}

const char* kHelpers = R"(
#include <cuda_bf16.h>
#include <cuda_fp16.h>
__device__ __forceinline__ float hash_value(unsigned long long i, unsigned seed) {
  unsigned x = (unsigned)i * 2654435761u ^ seed * 0x9e3779b9u;
  x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16;
  return (float)(x >> 8) * (2.0f / 16777216.0f) - 1.0f;
}
extern "C" __global__ void fill_bf16(__nv_bfloat16* p, long long n, unsigned seed) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    p[i] = __float2bfloat16(hash_value(i, seed));
}
extern "C" __global__ void fill_f16(__half* p, long long n, unsigned seed) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    p[i] = __float2half(hash_value(i, seed));
}
// sums[0] += sum (out - ref)^2, sums[1] += sum ref^2, sums[2] += count of non-finite outputs.
template <class T, class F>
__device__ void compare(const T* out, const T* ref, long long n, double* sums, F to_float) {
  double d = 0, r = 0, bad = 0;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const float o = to_float(out[i]), e = to_float(ref[i]);
    if (!isfinite(o)) { bad += 1; continue; }
    d += (double)(o - e) * (o - e);
    r += (double)e * e;
  }
  for (int off = 16; off > 0; off /= 2) {
    d += __shfl_down_sync(0xffffffffu, d, off);
    r += __shfl_down_sync(0xffffffffu, r, off);
    bad += __shfl_down_sync(0xffffffffu, bad, off);
  }
  if (threadIdx.x % 32 == 0) {
    atomicAdd(&sums[0], d);
    atomicAdd(&sums[1], r);
    atomicAdd(&sums[2], bad);
  }
}
extern "C" __global__ void compare_bf16(const __nv_bfloat16* out, const __nv_bfloat16* ref, long long n, double* sums) {
  compare(out, ref, n, sums, [](__nv_bfloat16 v) { return __bfloat162float(v); });
}
extern "C" __global__ void compare_f16(const __half* out, const __half* ref, long long n, double* sums) {
  compare(out, ref, n, sums, [](__half v) { return __half2float(v); });
}
)";

// ------------------------------------------------------------------------------------------------ progress

// The state file: "<shape index>\t<what is running>", rewritten before every step that could fault or hang,
// so the parent knows what to blame when the child dies or stalls.
class Progress {
 public:
  explicit Progress(std::string path) : path_(std::move(path)) {}
  void mark(size_t shape, const std::string& what) const {
    std::FILE* f = std::fopen(path_.c_str(), "w");
    if (!f) return;
    std::fprintf(f, "%zu\t%s\n", shape, what.c_str());
    std::fclose(f);
  }

 private:
  std::string path_;
};

struct State {
  long long shape = -1;
  std::string what;
};
State read_state(const std::string& path) {
  State s;
  std::ifstream in(path);
  std::string line;
  if (!std::getline(in, line)) return s;
  const auto tab = line.find('\t');
  if (tab == std::string::npos) return s;
  try {
    s.shape = std::stoll(line.substr(0, tab));
  } catch (...) {
    return s;
  }
  s.what = line.substr(tab + 1);
  return s;
}

// ------------------------------------------------------------------------------------------------ the child

#define BLAS_OK(expr) (static_cast<int>(expr) == 0)

struct Device {
  CUstream stream = nullptr;
  cublasHandle_t blas = nullptr;
  cublasLtHandle_t lt = nullptr;
  DeviceBuffer lt_workspace, blas_workspace, sums;
  DeviceBuffer kiln_workspace;  // stream-K configurations' partial slots (others ignore it)
  DeviceBuffer kiln_flags;      // stream-K's flags, lowered once: every launch leaves them lowered (launch_gemm)
  std::unique_ptr<Kernel> fill_bf16, fill_f16, compare_bf16, compare_f16;
  DeviceInfo info;
  const DriverApi* api = nullptr;
  std::shared_ptr<Executor> executor;
  DeviceLimits limits;
  Target arch_target;
  // Compiled configurations by "<config>@<arch>" (names do not depend on the sizes), or why they failed.
  std::map<std::string, std::shared_ptr<Kernel>> kernels;
  std::map<std::string, Status> compile_errors;
};

Status sync(Device& d) {
  CUresult r = d.api->cuStreamSynchronize(d.stream);
  if (r != CUDA_SUCCESS) {
    const char* name = nullptr;
    d.api->cuGetErrorName(r, &name);
    return make_error(ErrorCode::kCudaError, fmt::format("stream synchronize: {}", name ? name : "?"));
  }
  return Status();
}

// The context survives errors other than these (a faulting kernel poisons it for good).
bool sticky(const Status& s) {
  for (const char* e : {"ILLEGAL_ADDRESS", "LAUNCH_FAILED", "ILLEGAL_INSTRUCTION", "MISALIGNED_ADDRESS", "INVALID_PC",
                        "HARDWARE_STACK_ERROR", "ASSERT", "LAUNCH_TIMEOUT", "CONTEXT_IS_DESTROYED"}) {
    if (s.message().find(e) != std::string::npos) return true;
  }
  return false;
}

Status setup(Device& d) {
  KILN_RETURN_IF_ERROR(ensure_context(0).status());
  KILN_ASSIGN_OR_RETURN(d.info, device_info(0));
  KILN_ASSIGN_OR_RETURN(d.api, driver());
  KILN_CHECK(d.api->cuStreamCreate(&d.stream, CU_STREAM_NON_BLOCKING));
  if (!BLAS_OK(cublasCreate(&d.blas)) || !BLAS_OK(cublasSetStream(d.blas, d.stream)) || !BLAS_OK(cublasLtCreate(&d.lt))) {
    return make_error(ErrorCode::kLibraryError, "cuBLAS / cuBLASLt handle creation failed");
  }
  KILN_ASSIGN_OR_RETURN(d.lt_workspace, DeviceBuffer::allocate(64 << 20));
  KILN_ASSIGN_OR_RETURN(d.blas_workspace, DeviceBuffer::allocate(32 << 20));
  // A workspace of its own keeps cuBLAS from allocating inside graph captures.
  if (!BLAS_OK(cublasSetWorkspace(d.blas, d.blas_workspace.as<void>(), d.blas_workspace.size()))) {
    return make_error(ErrorCode::kLibraryError, "cublasSetWorkspace failed");
  }
  KILN_ASSIGN_OR_RETURN(d.sums, DeviceBuffer::allocate(64));
  // The largest stream-K workspace: a flag area and a 256 x 256 fp32 slot per SM; poisoned, as a shared workspace
  // may be. The flags are kiln_flags instead, as a kiln Choice keeps them: no memset node per launch.
  KILN_ASSIGN_OR_RETURN(d.kiln_workspace,
                        DeviceBuffer::allocate(kGemmFlagBytes + static_cast<size_t>(d.info.sm_count) * 256 * 256 * 4));
  KILN_RETURN_IF_ERROR(d.kiln_workspace.fill_bytes(0xFF, d.stream));
  KILN_ASSIGN_OR_RETURN(d.kiln_flags, DeviceBuffer::allocate(kGemmFlagBytes));
  KILN_RETURN_IF_ERROR(d.kiln_flags.fill_bytes(0, d.stream));
  KILN_ASSIGN_OR_RETURN(Target plain, Target::from_device(0));
  KernelSource src{"gemm_suite_helpers", "fill_bf16", kHelpers, {}, {}, {}, {}};
  KILN_ASSIGN_OR_RETURN(Binary b, compile(src, plain));
  KILN_ASSIGN_OR_RETURN(Module m, Module::load(b));
  KILN_ASSIGN_OR_RETURN(Kernel k1, m.kernel("fill_bf16"));
  KILN_ASSIGN_OR_RETURN(Kernel k2, m.kernel("fill_f16"));
  KILN_ASSIGN_OR_RETURN(Kernel k3, m.kernel("compare_bf16"));
  KILN_ASSIGN_OR_RETURN(Kernel k4, m.kernel("compare_f16"));
  d.fill_bf16 = std::make_unique<Kernel>(std::move(k1));
  d.fill_f16 = std::make_unique<Kernel>(std::move(k2));
  d.compare_bf16 = std::make_unique<Kernel>(std::move(k3));
  d.compare_f16 = std::make_unique<Kernel>(std::move(k4));
  // Hopper's wgmma family compiles for the arch-specific target.
  d.arch_target = Target{d.info.cc_major == 9 && d.info.cc_minor == 0 ? "sm_90a" : plain.arch};
  d.limits = DeviceLimits::from_device(d.info, d.arch_target);
  auto ex = make_executor();
  if (!ex.ok()) {
    fmt::print(stderr, "bench_gemm_suite: executor: {}; compiling in a thread arena\n", ex.status().to_string());
    d.executor = make_arena_executor();
  } else {
    d.executor = *ex;
  }
  return Status();
}

struct Operands {
  std::vector<DeviceBuffer> a, b;
  DeviceBuffer d, ref;
  int sets = 1;
};

unsigned seed_a(int set) { return 2 * set + 1; }
unsigned seed_b(int set) { return 2 * set + 2; }

Result<Operands> make_operands(Device& d, const SuiteShape& s) {
  Operands o;
  const double bytes = 2.0 * double(s.m * s.k + s.k * s.n);
  o.sets = std::clamp(static_cast<int>(std::ceil(3.0 * d.info.l2_bytes / bytes)), 1, 16);
  Kernel& fill = s.dtype == DType::kBF16 ? *d.fill_bf16 : *d.fill_f16;
  LaunchConfig cfg{{1024, 1, 1}, {256, 1, 1}, 0, d.stream, {1, 1, 1}};
  for (int i = 0; i < o.sets; ++i) {
    KILN_ASSIGN_OR_RETURN(DeviceBuffer a, DeviceBuffer::allocate(static_cast<size_t>(s.m * s.k) * 2));
    KILN_ASSIGN_OR_RETURN(DeviceBuffer b, DeviceBuffer::allocate(static_cast<size_t>(s.k * s.n) * 2));
    KILN_RETURN_IF_ERROR(fill(cfg, a.as<void>(), static_cast<long long>(s.m * s.k), seed_a(i)));
    KILN_RETURN_IF_ERROR(fill(cfg, b.as<void>(), static_cast<long long>(s.k * s.n), seed_b(i)));
    o.a.push_back(std::move(a));
    o.b.push_back(std::move(b));
  }
  KILN_ASSIGN_OR_RETURN(o.d, DeviceBuffer::allocate(static_cast<size_t>(s.m * s.n) * 2));
  KILN_ASSIGN_OR_RETURN(o.ref, DeviceBuffer::allocate(static_cast<size_t>(s.m * s.n) * 2));
  KILN_RETURN_IF_ERROR(sync(d));
  return o;
}

GemmArgs args_for(const SuiteShape& s, const Operands& o, int set, const DeviceBuffer& out) {
  GemmArgs a = dense_gemm_args({s.m, s.n, s.k}, Layout::kRowMajor, s.layout_b);
  a.a = o.a[set].as<void>();
  a.b = o.b[set].as<void>();
  a.d = out.as<void>();
  a.flags = KILN_GEMM_B_CONSTANT;  // no launch of the suite writes B (cuBLAS ignores it)
  return a;
}

GemmArgs kiln_args(const SuiteShape& s, const Operands& o, int set, const Device& d) {
  GemmArgs a = args_for(s, o, set, o.d);
  a.workspace = d.kiln_workspace.as<float>();
  return a;
}

// Relative-norm error of `out` against `ref` (both m x n of the shape's dtype); NaN when an output is not finite.
Result<double> rel_error(Device& d, const SuiteShape& s, const DeviceBuffer& out, const DeviceBuffer& ref) {
  KILN_RETURN_IF_ERROR(d.sums.fill_bytes(0, d.stream));
  LaunchConfig cfg{{static_cast<unsigned>(d.info.sm_count * 4), 1, 1}, {256, 1, 1}, 0, d.stream, {1, 1, 1}};
  Kernel& k = s.dtype == DType::kBF16 ? *d.compare_bf16 : *d.compare_f16;
  KILN_RETURN_IF_ERROR(k(cfg, out.as<void>(), ref.as<void>(), static_cast<long long>(s.m * s.n), d.sums.as<double>()));
  KILN_RETURN_IF_ERROR(sync(d));
  double sums[3];
  KILN_RETURN_IF_ERROR(d.sums.copy_to_host(sums, sizeof sums));
  if (sums[2] > 0) return std::nan("");
  return std::sqrt(sums[0] / std::max(sums[1], 1e-30));
}

double tolerance(DType t) { return t == DType::kBF16 ? 1e-2 : 5e-3; }

// The CPU's float64 value of D[i][j] for operand set 0.
double cpu_element(const SuiteShape& s, int64_t i, int64_t j) {
  double acc = 0;
  auto rounded = [&](float v) {
    uint16_t bits;
    store_element(s.dtype, v, &bits);
    return static_cast<double>(load_element(s.dtype, &bits));
  };
  for (int64_t kk = 0; kk < s.k; ++kk) {
    const double a = rounded(hash_value(static_cast<unsigned long long>(i * s.k + kk), seed_a(0)));
    const int64_t bi = s.layout_b == Layout::kColMajor ? j * s.k + kk : kk * s.n + j;
    const double b = rounded(hash_value(static_cast<unsigned long long>(bi), seed_b(0)));
    acc += a * b;
  }
  return acc;
}

// cuBLAS's output against the CPU on 24 elements (corners included): the reference must itself be right.
Status spot_check(Device& d, const SuiteShape& s, const DeviceBuffer& ref) {
  std::mt19937_64 rng(s.m * 31 + s.n * 7 + s.k);
  std::vector<std::pair<int64_t, int64_t>> at = {{0, 0}, {s.m - 1, s.n - 1}, {s.m - 1, 0}, {0, s.n - 1}};
  while (at.size() < 24) at.emplace_back(rng() % s.m, rng() % s.n);
  for (auto [i, j] : at) {
    uint16_t bits = 0;
    KILN_CHECK(d.api->cuMemcpyDtoH(&bits, ref.ptr() + static_cast<CUdeviceptr>((i * s.n + j) * 2), 2));
    const double got = load_element(s.dtype, &bits), want = cpu_element(s, i, j);
    const double tol = 0.01 * std::abs(want) + 2e-3 * std::sqrt(double(s.k));
    if (!(std::abs(got - want) <= tol)) {
      return make_error(ErrorCode::kInternal,
                        fmt::format("cuBLAS D[{}][{}] = {} but the CPU's float64 dot product is {}", i, j, got, want));
    }
  }
  return Status();
}

// ---- timing

using Op = std::function<Status(int set)>;

// GPU microseconds per launch: a CUDA graph of `reps` launches (operand sets rotating), median of `samples`
// replays. Falls back to timing launches on the stream when the op cannot be captured (*graphed = false).
Result<bench::Stats> time_op(Device& d, const Op& op, int sets, int reps, int samples, bool* graphed) {
  KILN_ASSIGN_OR_RETURN(Event start, Event::create());
  KILN_ASSIGN_OR_RETURN(Event stop, Event::create());
  CUgraph graph = nullptr;
  CUgraphExec exec = nullptr;
  Status captured = make_error(ErrorCode::kCudaError, "capture");
  if (d.api->cuStreamBeginCapture(d.stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) == CUDA_SUCCESS) {
    Status ran;
    for (int r = 0; r < reps && ran.ok(); ++r) ran = op(r % sets);
    const CUresult end = d.api->cuStreamEndCapture(d.stream, &graph);
    if (ran.ok() && end == CUDA_SUCCESS && d.api->cuGraphInstantiateWithFlags(&exec, graph, 0) == CUDA_SUCCESS) {
      captured = Status();
    }
  }
  *graphed = captured.ok();
  auto launch_batch = [&]() -> Status {
    if (exec) {
      KILN_CHECK(d.api->cuGraphLaunch(exec, d.stream));
      return Status();
    }
    for (int r = 0; r < reps; ++r) KILN_RETURN_IF_ERROR(op(r % sets));
    return Status();
  };
  std::vector<double> us;
  Status st = launch_batch();  // warm-up
  if (st.ok()) st = sync(d);
  for (int i = 0; i < samples && st.ok(); ++i) {
    st = start.record(d.stream);
    if (st.ok()) st = launch_batch();
    if (st.ok()) st = stop.record(d.stream);
    if (st.ok()) st = stop.synchronize();
    if (st.ok()) {
      auto ms = stop.elapsed_ms_since(start);
      if (!ms.ok()) st = ms.status();
      else us.push_back(*ms * 1e3 / reps);
    }
  }
  if (exec) d.api->cuGraphExecDestroy(exec);
  if (graph) d.api->cuGraphDestroy(graph);
  KILN_RETURN_IF_ERROR(st);
  return bench::stats(us);
}

// ---- cuBLAS and cuBLASLt

cudaDataType_t blas_type(DType t) { return t == DType::kBF16 ? CUDA_R_16BF : CUDA_R_16F; }

// D[M,N] row-major = A . B is, column-major, D^T[N,M] = B^T . A^T: cuBLAS's "A" is our B, its "B" our A.
Status cublas_gemm(Device& d, const SuiteShape& s, const GemmArgs& a) {
  const float alpha = 1.f, beta = 0.f;
  const cublasOperation_t ta = s.layout_b == Layout::kColMajor ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasStatus_t st = cublasGemmEx(d.blas, ta, CUBLAS_OP_N, a.n, a.m, a.k, &alpha, a.b, blas_type(s.dtype),
                                         static_cast<int>(a.ldb), a.a, blas_type(s.dtype), static_cast<int>(a.lda),
                                         &beta, a.d, blas_type(s.dtype), static_cast<int>(a.ldd), CUBLAS_COMPUTE_32F,
                                         CUBLAS_GEMM_DEFAULT);
  if (st != CUBLAS_STATUS_SUCCESS) {
    return make_error(ErrorCode::kLibraryError, fmt::format("cublasGemmEx: status {}", static_cast<int>(st)));
  }
  return Status();
}

struct LtPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  std::vector<cublasLtMatmulHeuristicResult_t> algos;
  ~LtPlan() {
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

Status lt_plan(Device& d, const SuiteShape& s, const GemmArgs& a, int max_algos, LtPlan& plan) {
  auto bad = [](const char* what) { return make_error(ErrorCode::kLibraryError, what); };
  if (!BLAS_OK(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F))) return bad("cublasLtMatmulDescCreate");
  const cublasOperation_t ta = s.layout_b == Layout::kColMajor ? CUBLAS_OP_T : CUBLAS_OP_N, tb = CUBLAS_OP_N;
  if (!BLAS_OK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta)) ||
      !BLAS_OK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb))) {
    return bad("cublasLtMatmulDescSetAttribute");
  }
  const cudaDataType_t t = blas_type(s.dtype);
  const bool ok = s.layout_b == Layout::kColMajor ? BLAS_OK(cublasLtMatrixLayoutCreate(&plan.la, t, a.k, a.n, a.ldb))
                                                  : BLAS_OK(cublasLtMatrixLayoutCreate(&plan.la, t, a.n, a.k, a.ldb));
  if (!ok || !BLAS_OK(cublasLtMatrixLayoutCreate(&plan.lb, t, a.k, a.m, a.lda)) ||
      !BLAS_OK(cublasLtMatrixLayoutCreate(&plan.lc, t, a.n, a.m, a.ldd))) {
    return bad("cublasLtMatrixLayoutCreate");
  }
  cublasLtMatmulPreference_t pref;
  if (!BLAS_OK(cublasLtMatmulPreferenceCreate(&pref))) return bad("cublasLtMatmulPreferenceCreate");
  size_t ws = d.lt_workspace.size();
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  plan.algos.resize(static_cast<size_t>(max_algos));
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(d.lt, plan.desc, plan.la, plan.lb, plan.lc, plan.lc, pref,
                                                           max_algos, plan.algos.data(), &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS) return bad("cublasLtMatmulAlgoGetHeuristic");
  plan.algos.resize(static_cast<size_t>(std::max(found, 0)));
  return Status();
}

Status lt_gemm(Device& d, const LtPlan& plan, size_t i, const GemmArgs& a) {
  const float alpha = 1.f, beta = 0.f;
  const cublasStatus_t st =
      cublasLtMatmul(d.lt, plan.desc, &alpha, a.b, plan.la, a.a, plan.lb, &beta, a.d, plan.lc, a.d, plan.lc,
                     &plan.algos[i].algo, d.lt_workspace.as<void>(), d.lt_workspace.size(), d.stream);
  if (st != CUBLAS_STATUS_SUCCESS) {
    return make_error(ErrorCode::kLibraryError, fmt::format("cublasLtMatmul: status {}", static_cast<int>(st)));
  }
  return Status();
}

// "algo 23 tile 12 stages 8 splitk 1 ...": what the heuristic picked, for the record.
std::string lt_algo_name(const cublasLtMatmulAlgo_t& algo) {
  int id = 0, tile = 0, stages = 0, splitk = 0, swizzle = 0;
  size_t n = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &n);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &n);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &n);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk, &n);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swizzle, sizeof swizzle, &n);
  return fmt::format("algo{}_tile{}_stages{}_splitk{}_swizzle{}", id, tile, stages, splitk, swizzle);
}

// ---- kiln candidates

struct KilnCandidate {
  std::string family, variant, name, key;
  Params params;
  Launch geometry;
  std::shared_ptr<Kernel> kernel;
  Status status;
};

// Renders and compiles (in parallel, through kiln's executor) what is not compiled yet.
void compile_candidates(Device& d, std::vector<KilnCandidate>& cs, std::vector<TemplatePtr>& tmpls,
                        std::vector<std::string>& arches) {
  struct Job {
    size_t i;
    Future<Binary> future;
    std::string key;
  };
  std::vector<Job> jobs;
  std::set<std::string> submitted;
  for (size_t i = 0; i < cs.size(); ++i) {
    KilnCandidate& c = cs[i];
    if (d.kernels.contains(c.key) || d.compile_errors.contains(c.key) || submitted.contains(c.key)) continue;
    auto r = tmpls[i]->render(c.params);
    if (!r.ok()) {
      d.compile_errors[c.key] = r.status();
      continue;
    }
    submitted.insert(c.key);
    jobs.push_back({i, d.executor->submit(CompileJob{r->source, Target{arches[i]}, {}, Priority::kNormal}).future, c.key});
  }
  for (Job& j : jobs) {
    const Result<Binary>& b = j.future.get();
    if (!b.ok()) {
      d.compile_errors[j.key] = b.status();
      continue;
    }
    auto k = load_kernel(*b);
    if (!k.ok()) {
      d.compile_errors[j.key] = k.status();
      continue;
    }
    d.kernels[j.key] = std::make_shared<Kernel>(std::move(*k));
  }
  for (KilnCandidate& c : cs) {
    if (auto it = d.kernels.find(c.key); it != d.kernels.end()) c.kernel = it->second;
    else if (auto e = d.compile_errors.find(c.key); e != d.compile_errors.end()) c.status = e->second;
  }
}

json stats_json(const bench::Stats& s) { return bench::to_json(s); }

// One shape: reference, cuBLAS, every cuBLASLt algorithm, every kiln candidate, then the interleaved round.
// Returns the shape's record; exits the process (code 3) when the context is lost, after marking the culprit.
json run_shape(Device& d, const Options& opt, const SuiteShape& s, size_t index, const std::set<std::string>& blocked,
               const Progress& progress) {
  json rec = bench::suite::shape_json(s);
  rec["index"] = index;
  rec["timing"] = "cuda_graph";
  json errors = json::array();
  auto lost = [&](const Status& st, const std::string& what) {
    if (!sticky(st)) return;
    fmt::print(stderr, "  the context is lost ({}: {}): this child stops here\n", what, st.to_string());
    std::fflush(stderr);
    std::_Exit(3);
  };

  progress.mark(index, "operands");
  auto ops = make_operands(d, s);
  if (!ops.ok()) {
    rec["error"] = "operands: " + ops.status().to_string();
    return rec;
  }
  Operands& o = *ops;
  const int sets = o.sets;

  // Reference: cuBLAS, spot-checked on the CPU.
  progress.mark(index, "reference");
  Status st = o.ref.fill_bytes(0xFF, d.stream);
  if (st.ok()) st = cublas_gemm(d, s, args_for(s, o, 0, o.ref));
  if (st.ok()) st = sync(d);
  if (st.ok()) st = spot_check(d, s, o.ref);
  if (!st.ok()) {
    lost(st, "reference");
    rec["error"] = "reference (cuBLAS): " + st.to_string();
    return rec;
  }
  Op cublas_op = [&](int set) { return cublas_gemm(d, s, args_for(s, o, set, o.d)); };

  // Launches per graph: about --batch-us of GPU time, from an eager estimate.
  int reps = 1;
  {
    bool g = false;
    auto est = time_op(d, cublas_op, sets, 3, 1, &g);
    if (!est.ok()) {
      lost(est.status(), "cuBLAS");
      rec["error"] = "timing cuBLAS: " + est.status().to_string();
      return rec;
    }
    reps = std::clamp(static_cast<int>(std::ceil(opt.batch_us / std::max(est->median, 0.5))), 1, 200);
  }
  rec["launches_per_graph"] = reps;
  rec["operand_sets"] = sets;
  const int samples = opt.samples;

  bool graphed = false;
  auto s_cublas = time_op(d, cublas_op, sets, reps, samples, &graphed);
  if (!s_cublas.ok()) {
    lost(s_cublas.status(), "cuBLAS");
    rec["error"] = "timing cuBLAS: " + s_cublas.status().to_string();
    return rec;
  }
  if (!graphed) rec["timing"] = "stream (cuBLAS could not be captured)";
  rec["sweep_cublas_us"] = s_cublas->median;

  // cuBLASLt: every algorithm of the heuristic, checked, then timed.
  LtPlan plan;
  std::optional<size_t> best_lt;
  double best_lt_us = 1e30;
  json lt_rows = json::array();
  progress.mark(index, "cublaslt heuristic");
  if (Status p = lt_plan(d, s, args_for(s, o, 0, o.d), opt.lt_algos, plan); !p.ok()) {
    errors.push_back("cuBLASLt: " + p.to_string());
  }
  for (size_t i = 0; i < plan.algos.size(); ++i) {
    const std::string name = lt_algo_name(plan.algos[i].algo);
    progress.mark(index, "cublaslt " + name);
    Op op = [&, i](int set) { return lt_gemm(d, plan, i, args_for(s, o, set, o.d)); };
    Status r = o.d.fill_bytes(0xFF, d.stream);
    if (r.ok()) r = op(0);
    if (r.ok()) r = sync(d);
    if (!r.ok()) {
      lost(r, name);
      lt_rows.push_back({{"algo", name}, {"error", r.to_string()}});
      continue;
    }
    auto err = rel_error(d, s, o.d, o.ref);
    if (!err.ok() || !(*err <= tolerance(s.dtype))) {
      lt_rows.push_back({{"algo", name}, {"error", err.ok() ? fmt::format("wrong: relative error {}", *err) : err.status().to_string()}});
      continue;
    }
    bool g = false;
    auto t = time_op(d, op, sets, reps, std::max(2, samples - 2), &g);
    if (!t.ok()) {
      lost(t.status(), name);
      lt_rows.push_back({{"algo", name}, {"error", t.status().to_string()}});
      continue;
    }
    lt_rows.push_back({{"algo", name}, {"us", t->median}, {"err", *err}, {"graph", g}});
    if (t->median < best_lt_us) {
      best_lt_us = t->median;
      best_lt = i;
    }
  }
  rec["cublaslt_algos"] = lt_rows;
  rec["cublaslt_algos_returned"] = plan.algos.size();

  // kiln: every family's candidates, compiled together.
  std::vector<KilnCandidate> cands;
  std::vector<TemplatePtr> tmpls;
  std::vector<std::string> arches;
  json kiln_rows = json::array();
  for (auto& fc : bench::suite::candidates_for(s, d.limits, d.arch_target, opt.families, opt.max_configs)) {
    for (const Params& p : fc.configs) {
      KilnCandidate c;
      c.family = fc.family;
      c.variant = bench::suite::variant_of(fc.family, p);
      c.name = fc.tmpl->config_name(p).value_or("?");
      c.key = c.name + "@" + fc.arch;
      c.params = p;
      if (blocked.contains(c.name)) {
        kiln_rows.push_back({{"config", c.name}, {"family", c.family},
                             {"error", "left out: it faulted or hung in an earlier attempt of this run"}});
        continue;
      }
      auto g = fc.tmpl->geometry(p, templates::Shape{s.m, s.n, s.k});
      if (!g.ok()) {
        kiln_rows.push_back({{"config", c.name}, {"family", c.family}, {"error", g.status().to_string()}});
        continue;
      }
      c.geometry = *g;
      cands.push_back(std::move(c));
      tmpls.push_back(fc.tmpl);
      arches.push_back(fc.arch);
    }
  }
  progress.mark(index, "compile");
  compile_candidates(d, cands, tmpls, arches);

  struct Best {
    double us = 1e30;
    const KilnCandidate* c = nullptr;
    double err = 0;
  };
  std::map<std::string, Best> best_family, best_variant;
  Best best;
  for (size_t i = 0; i < cands.size(); ++i) {
    const KilnCandidate& c = cands[i];
    json row{{"config", c.name}, {"family", c.family}};
    if (!c.variant.empty()) row["variant"] = c.variant;
    if (!c.kernel) {
      row["error"] = "compile: " + c.status.to_string();
      kiln_rows.push_back(row);
      continue;
    }
    progress.mark(index, "cand:" + c.name);
    Op op = [&, i](int set) {
      const KilnCandidate& k = cands[i];
      return launch_gemm(*k.kernel, k.params, k.geometry, kiln_args(s, o, set, d), d.stream, d.kiln_flags.ptr());
    };
    Status r = o.d.fill_bytes(0xFF, d.stream);
    if (r.ok()) r = op(0);
    if (r.ok()) r = sync(d);
    if (!r.ok()) {
      lost(r, c.name);
      row["error"] = "run: " + r.to_string();
      kiln_rows.push_back(row);
      continue;
    }
    auto err = rel_error(d, s, o.d, o.ref);
    if (!err.ok()) {
      lost(err.status(), c.name);
      row["error"] = "check: " + err.status().to_string();
      kiln_rows.push_back(row);
      continue;
    }
    row["err"] = *err;
    if (!(*err <= tolerance(s.dtype))) {
      row["error"] = fmt::format("wrong: relative error {} > {}", *err, tolerance(s.dtype));
      kiln_rows.push_back(row);
      fmt::print(stderr, "  {} WRONG (relative error {:.2e})\n", c.name, *err);
      continue;
    }
    bool g = false;
    auto t = time_op(d, op, sets, reps, samples, &g);
    if (!t.ok()) {
      lost(t.status(), c.name);
      row["error"] = "timing: " + t.status().to_string();
      kiln_rows.push_back(row);
      continue;
    }
    row["us"] = t->median;
    row["graph"] = g;
    kiln_rows.push_back(row);
    const Best b{t->median, &c, *err};
    if (b.us < best.us) best = b;
    if (b.us < best_family[c.family].us) best_family[c.family] = b;
    if (!c.variant.empty() && b.us < best_variant[c.family + "/" + c.variant].us) best_variant[c.family + "/" + c.variant] = b;
  }
  rec["kiln_candidates"] = kiln_rows;
  json fam = json::object();
  for (const auto& [name, b] : best_family) fam[name] = {{"sweep_us", b.us}, {"config", b.c->name}, {"err", b.err}};
  rec["families"] = fam;
  json var = json::object();
  for (const auto& [name, b] : best_variant) var[name] = {{"sweep_us", b.us}, {"config", b.c->name}};
  rec["variants"] = var;

  // The interleaved round: cuBLAS, the best cuBLASLt algorithm and the best kiln configuration, batch by batch.
  progress.mark(index, best.c ? "cand:" + best.c->name : "interleaved");
  std::vector<double> t_blas, t_lt, t_kiln, t_kiln_plain;
  Op lt_op = [&](int set) { return lt_gemm(d, plan, *best_lt, args_for(s, o, set, o.d)); };
  Op kiln_op, kiln_plain_op;
  bool programmatic = false;
  Launch plain;
  if (best.c) {
    const KilnCandidate* k = best.c;
    kiln_op = [&, k](int set) {
      return launch_gemm(*k->kernel, k->params, k->geometry, kiln_args(s, o, set, d), d.stream, d.kiln_flags.ptr());
    };
    // The same kernel launched without programmatic dependent launch: what the launch attribute alone is worth.
    programmatic = k->geometry.programmatic;
    plain = k->geometry;
    plain.programmatic = false;
    kiln_plain_op = [&, k](int set) {
      return launch_gemm(*k->kernel, k->params, plain, kiln_args(s, o, set, d), d.stream, d.kiln_flags.ptr());
    };
  }
  auto interleaved = [&](const Op& op, std::vector<double>& into, const char* what) {
    bool g = false;
    auto t = time_op(d, op, sets, reps, 1, &g);
    if (t.ok()) {
      into.push_back(t->median);
    } else {
      lost(t.status(), what);
      errors.push_back(fmt::format("interleaved {}: {}", what, t.status().to_string()));
    }
  };
  for (int r = 0; r < opt.rounds; ++r) {
    interleaved(cublas_op, t_blas, "cuBLAS");
    if (best_lt) interleaved(lt_op, t_lt, "cuBLASLt");
    if (best.c) interleaved(kiln_op, t_kiln, "kiln");
    if (best.c && programmatic) interleaved(kiln_plain_op, t_kiln_plain, "kiln without programmatic launch");
  }
  const double cublas_us = t_blas.empty() ? s_cublas->median : bench::stats(t_blas).median;
  rec["cublas_us"] = cublas_us;
  if (best_lt) {
    rec["cublaslt_us"] = t_lt.empty() ? best_lt_us : bench::stats(t_lt).median;
    rec["cublaslt_algo"] = lt_algo_name(plan.algos[*best_lt].algo);
    rec["sweep_cublaslt_us"] = best_lt_us;
  } else {
    rec["cublaslt_us"] = nullptr;
  }
  const double ref_us = best_lt ? std::min(cublas_us, rec["cublaslt_us"].get<double>()) : cublas_us;
  rec["best_reference_us"] = ref_us;
  rec["best_reference"] = best_lt && rec["cublaslt_us"].get<double>() < cublas_us ? "cublaslt" : "cublas";
  if (best.c) {
    const double kus = t_kiln.empty() ? best.us : bench::stats(t_kiln).median;
    rec["kiln_template_us"] = kus;
    rec["kiln_template_config"] = best.c->name;
    rec["kiln_template_family"] = best.c->family;
    rec["kiln_template_err"] = best.err;
    rec["sweep_kiln_template_us"] = best.us;
    rec["kiln_programmatic_launch"] = programmatic;
    if (!t_kiln_plain.empty()) rec["kiln_template_no_pdl_us"] = bench::stats(t_kiln_plain).median;
    rec["speedup_vs_best_reference"] = ref_us / kus;
    rec["speedup_vs_cublas"] = cublas_us / kus;
  } else {
    rec["kiln_template_us"] = nullptr;
    rec["kiln_template_config"] = nullptr;
  }
  rec["errors"] = errors;
  return rec;
}

int run_child(const Options& opt, const std::vector<SuiteShape>& shapes, size_t first, const std::set<std::string>& blocked,
              const std::string& jsonl, const std::string& state, std::chrono::system_clock::time_point deadline) {
  Progress progress(state);
  progress.mark(first, "setup");
  Device d;
  if (Status st = setup(d); !st.ok()) {
    fmt::print(stderr, "bench_gemm_suite: setup: {}\n", st.to_string_with_detail());
    return 2;
  }
  std::FILE* out = std::fopen(jsonl.c_str(), "a");
  if (!out) {
    fmt::print(stderr, "bench_gemm_suite: cannot append to {}\n", jsonl);
    return 2;
  }
  for (size_t i = first; i < shapes.size(); ++i) {
    if (std::chrono::system_clock::now() > deadline) break;
    const SuiteShape& s = shapes[i];
    const auto t0 = bench::Clock::now();
    json rec = run_shape(d, opt, s, i, blocked, progress);
    rec["seconds"] = bench::seconds_since(t0);
    std::string line = rec.dump();
    std::fprintf(out, "%s\n", line.c_str());
    std::fflush(out);
    if (rec.contains("speedup_vs_best_reference")) {
      fmt::print(stderr, "[{}/{}] {:<40} {:<22} cuBLAS {:8.1f} Lt {:8.1f} kiln {:8.1f} ({:.2f}x) {} [{:.1f} s]\n", i + 1,
                 shapes.size(), s.id(), s.model + " " + s.layer, rec["cublas_us"].get<double>(),
                 rec["cublaslt_us"].is_number() ? rec["cublaslt_us"].get<double>() : 0.0,
                 rec["kiln_template_us"].get<double>(), rec["speedup_vs_best_reference"].get<double>(),
                 rec["kiln_template_config"].get<std::string>(), rec["seconds"].get<double>());
    } else {
      fmt::print(stderr, "[{}/{}] {} {}: {}\n", i + 1, shapes.size(), s.id(), s.model + " " + s.layer,
                 rec.contains("error") ? rec["error"].dump() : "no kiln result");
    }
  }
  std::fclose(out);
  progress.mark(shapes.size(), "done");
  return 0;
}

// ------------------------------------------------------------------------------------------------ the parent

// A record's shape index, or none: records are re-read from a file a killed child may have left half-written.
std::optional<size_t> record_index(const json& r) {
  auto it = r.find("index");
  if (it == r.end() || !it->is_number_unsigned()) return std::nullopt;
  return it->get<size_t>();
}

std::vector<json> read_jsonl(const std::string& path) {
  std::vector<json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    try {
      out.push_back(json::parse(line));
    } catch (...) {
      // A line cut short by a killed child: the shape reruns.
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kiln's GEMM templates against cuBLAS and cuBLASLt over the public GEMM suite"};
  Options opt;
  app.add_option("--out", opt.out, "Output prefix: writes PREFIX.json, .jsonl, .md, .svg (default gemm-suite)");
  app.add_option("--shapes", opt.shapes,
                 "Comma-separated filter: id/model/layer substrings, m<=N, max=N (default: every shape)");
  app.add_option("--max-seconds", opt.max_seconds, "Stop starting shapes after this long (default 480)")
      ->check(CLI::Range(0.001, 1e7));
  app.add_option("--hang-seconds", opt.hang_seconds, "A step making no progress this long is killed (default 60)")
      ->check(CLI::Range(0.001, 1e7));
  app.add_option("--max-configs", opt.max_configs, "Configurations per kiln family per shape (default 40)")
      ->check(CLI::Range(1, 1000000));
  app.add_option("--lt-algos", opt.lt_algos, "cuBLASLt heuristic results to try (default 32)")
      ->check(CLI::Range(1, 1000000));
  app.add_option("--samples", opt.samples, "Timed graphs per candidate (median; default 5)")
      ->check(CLI::Range(1, 1000000));
  app.add_option("--rounds", opt.rounds, "Interleaved rounds of the final comparison (default 5)")
      ->check(CLI::Range(1, 1000000));
  app.add_option("--batch-us", opt.batch_us, "GPU time per timed graph, about (default 300)")
      ->check(CLI::Range(0.001, 1e7));
  app.add_option("--family", opt.families,
                 "Also measure this superseded family (gemm_mma_sm80 on sm_90a), or 'all'; repeatable");
  app.add_flag("--list", opt.list, "Print the shapes (after --shapes) and exit");
  CLI11_PARSE(app, argc, argv);
  // CLI::Range lets NaN through (it compares false both ways).
  for (auto [name, v] : {std::pair{"--max-seconds", opt.max_seconds}, std::pair{"--hang-seconds", opt.hang_seconds},
                         std::pair{"--batch-us", opt.batch_us}}) {
    if (!std::isfinite(v)) {
      fmt::print(stderr, "bench_gemm_suite: {} must be a finite number, not {}\n", name, v);
      return 2;
    }
  }

  const std::vector<SuiteShape> shapes = bench::suite::filter_shapes(bench::suite::suite_shapes(), opt.shapes);
  if (opt.list) {
    for (const SuiteShape& s : shapes) fmt::print("{:<40} {} {}\n", s.id(), s.model, s.layer);
    fmt::print("{} shapes\n", shapes.size());
    return 0;
  }
  if (shapes.empty()) {
    fmt::print(stderr, "bench_gemm_suite: no shape matches '{}'\n", opt.shapes);
    return 2;
  }
  const std::string jsonl = opt.out + ".jsonl", state = opt.out + ".state";
  if (std::FILE* f = std::fopen(jsonl.c_str(), "w")) {
    std::fclose(f);
  } else {
    fmt::print(stderr, "bench_gemm_suite: cannot write {}\n", jsonl);
    return 2;
  }
  const auto start = std::chrono::system_clock::now();
  const auto deadline = start + std::chrono::milliseconds(static_cast<long long>(opt.max_seconds * 1000));

  // No CUDA in this process until the children are done: a context does not survive fork().
  std::set<std::string> blocked;
  json incidents = json::array();
  size_t next = 0;
  for (int attempt = 0; attempt < 24 && next < shapes.size(); ++attempt) {
    if (std::chrono::system_clock::now() > deadline) break;
    std::remove(state.c_str());
    std::fflush(nullptr);
    const pid_t pid = fork();
    if (pid < 0) {
      fmt::print(stderr, "bench_gemm_suite: fork failed\n");
      return 2;
    }
    if (pid == 0) std::_Exit(run_child(opt, shapes, next, blocked, jsonl, state, deadline));

    State last;
    auto last_change = std::chrono::steady_clock::now();
    int status = 0;
    std::string killed;
    for (;;) {
      const pid_t w = waitpid(pid, &status, WNOHANG);
      if (w == pid) break;
      State now = read_state(state);
      if (now.shape != last.shape || now.what != last.what) {
        last = now;
        last_change = std::chrono::steady_clock::now();
      }
      const double stalled = std::chrono::duration<double>(std::chrono::steady_clock::now() - last_change).count();
      // The child stops starting shapes at the deadline; one still busy well past it is cut off.
      const bool overtime = std::chrono::system_clock::now() > deadline + std::chrono::seconds(30);
      if (killed.empty() && (stalled > opt.hang_seconds || overtime)) {
        killed = overtime ? "time budget" : fmt::format("no progress for {:.0f} s", stalled);
        kill(pid, SIGKILL);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    std::vector<json> done = read_jsonl(jsonl);
    size_t resume = next;
    for (const json& r : done) {
      if (auto i = record_index(r)) resume = std::max(resume, *i + 1);
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
      next = resume;
      break;
    }
    const State s = read_state(state);
    const std::string why = !killed.empty() ? killed
                            : WIFSIGNALED(status) ? fmt::format("killed by signal {}", WTERMSIG(status))
                                                  : fmt::format("exit code {}", WEXITSTATUS(status));
    json inc{{"shape_index", s.shape}, {"step", s.what}, {"why", why}};
    if (s.shape >= 0 && static_cast<size_t>(s.shape) < shapes.size()) inc["shape"] = shapes[s.shape].id();
    incidents.push_back(inc);
    fmt::print(stderr, "bench_gemm_suite: the child stopped ({}) at shape {} step '{}'\n", why, s.shape, s.what);
    if (killed == "time budget") break;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 2) break;  // setup failed: a new child would too
    if (s.what.rfind("cand:", 0) == 0) {
      blocked.insert(s.what.substr(5));  // the shape reruns without it
      next = std::max(resume, static_cast<size_t>(s.shape));
    } else if (s.shape >= 0) {
      // The reference or the operands themselves: record the shape as failed and go on with the next.
      const size_t i = static_cast<size_t>(s.shape);
      if (i < shapes.size()) {
        json rec = bench::suite::shape_json(shapes[i]);
        rec["index"] = i;
        rec["error"] = fmt::format("the child stopped ({}) during '{}'", why, s.what);
        std::ofstream(jsonl, std::ios::app) << rec.dump() << "\n";
      }
      next = std::max(resume, i + 1);
    } else {
      next = resume;
    }
  }

  // A malformed record must not lose the others: the .jsonl stays for a rerun of the report.
  try {
    // Results: the last record of each shape, in suite order, then the outputs.
    std::map<size_t, json> by_index;
    for (json& r : read_jsonl(jsonl)) {
      if (auto i = record_index(r)) by_index[*i] = std::move(r);
    }
    std::vector<json> records;
    for (size_t i = 0; i < shapes.size(); ++i) {
      if (auto it = by_index.find(i); it != by_index.end()) {
        records.push_back(it->second);
      } else {
        json rec = bench::suite::shape_json(shapes[i]);
        rec["index"] = i;
        rec["error"] = "not run (time budget or an earlier failure)";
        records.push_back(rec);
      }
    }
    json env = bench::environment();
    env["seconds"] = std::chrono::duration<double>(std::chrono::system_clock::now() - start).count();
    env["incidents"] = incidents;
    env["left_out_configs"] = json(std::vector<std::string>(blocked.begin(), blocked.end()));
    env["method"] = "D = A.B, A row-major, fp32 accumulate, output in the input dtype; inputs hashed, rotated over "
                    ">= 3x L2; cuBLAS output is the reference (spot-checked against float64 on the CPU); GPU time of "
                    "CUDA graphs of many launches; final figures interleaved";
    const bool ok = bench::suite::write_outputs(opt.out, records, env);
    const bench::suite::Summary sum = bench::suite::summarize(records);
    fmt::print("{}", bench::suite::summary_text(sum));
    std::remove(state.c_str());
    return ok && sum.measured > 0 ? 0 : 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_gemm_suite: writing the results from {} failed: {}\n", jsonl, e.what());
    return 1;
  }
}
