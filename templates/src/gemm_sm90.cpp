// gemm_wgmma_sm90 (templates/gemm/wgmma_sm90.cu): wgmma + TMA warp-specialised GEMM for sm_90a, and its
// launch (tensor maps are encoded on the host from each call's pointers and sizes).
#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <tuple>
#include <mutex>
#include <utility>

#include <fmt/format.h>

#include "gemm_family.h"
#include "kiln/jit/device.h"
#include "kiln/jit/driver.h"
#include "kiln/templates/gemm.h"

namespace kiln::templates {

std::string render_wgmma(int n, DType in, bool a_mn_major, bool b_mn_major) {
  const int regs = n / 2;
  std::string list, outs;
  for (int i = 0; i < regs; ++i) {
    list += fmt::format("{}%{}", i ? ", " : "", i);
    outs += fmt::format("{}\"+f\"(d[{}])", i ? ", " : "", i);
  }
  const std::string_view t = in == DType::kBF16 ? "bf16" : "f16";
  // scale-d is a predicate operand; it is always 1 (accumulate), the kernel zeroes accumulators itself.
  return fmt::format(
      "__device__ __forceinline__ void kiln_wgmma(float (&d)[{regs}], unsigned long long desc_a,\n"
      "                                           unsigned long long desc_b) {{\n"
      "  asm volatile(\n"
      "      \"{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{pi}, 0;\\n\"\n"
      "      \"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{t}.{t} {{{list}}}, %{ai}, %{bi}, p, 1, 1, {ta}, {tb};\\n}}\\n\"\n"
      "      : {outs}\n"
      "      : \"l\"(desc_a), \"l\"(desc_b), \"r\"(1));\n"
      "}}\n",
      fmt::arg("regs", regs), fmt::arg("pi", regs + 2), fmt::arg("n", n), fmt::arg("t", t), fmt::arg("list", list),
      fmt::arg("ai", regs), fmt::arg("bi", regs + 1), fmt::arg("ta", a_mn_major ? 1 : 0),
      fmt::arg("tb", b_mn_major ? 1 : 0), fmt::arg("outs", outs));
}

namespace detail {
namespace {

struct Sm90Config {
  int64_t bm, bn, consumers, stages, cluster_k, blocks_per_sm;
  bool swap_ab, epi_smem;
  int64_t mcast;
  bool stream_k, pingpong, sk_even;
  int64_t early;
  int64_t trigger;
  // Rows of a consumer's accumulators: a share of the tile, or (ping-pong) whole tiles in turn.
  int64_t wg_m() const { return pingpong ? bm : bm / consumers; }
  int64_t threads() const { return 128 * (consumers + 1); }
  int64_t stage_bytes() const { return (bm + bn) * 64 * 2; }
  // epi=smem: a buffer of 128-byte rows per consumer row (wgmma_sm90.cu's EPI_BYTES), after the barriers.
  int64_t epi_bytes() const { return epi_smem ? consumers * wg_m() * 128 : 0; }
  // The stages, 1 KiB of slack to align them to 1024 bytes (128-byte swizzle), and two mbarriers per stage
  // (rounded up to 128 bytes when a staging buffer follows them).
  int64_t smem_bytes() const {
    return stages * stage_bytes() + 1024 + (epi_smem ? (stages * 16 + 127) / 128 * 128 + epi_bytes() : stages * 16);
  }
  int64_t acc_regs() const { return (wg_m() / 64) * bn / 2; }
};

Sm90Config config_of(const Params& p) {
  return {get_int(p, "bm"), get_int(p, "bn"), get_int(p, "consumers"), get_int(p, "stages"), get_int(p, "cluster_k"),
          get_int(p, "blocks_per_sm"), get_bool(p, "swap_ab"), get_enum(p, "epi") == "smem",
          get_int(p, "mcast"), get_bool(p, "stream_k"), get_bool(p, "pingpong"),
          get_bool(p, "sk_even"), get_int(p, "early"), get_int(p, "trigger")};
}

// A configuration's NVRTC compile time, log-linear in what grows its code: the accumulator tile each consumer
// unrolls (bm x bn / consumers; x1.21 per doubling), stream-K's fix-up (x1.29) and the staged epilogue (x1.19);
// an fp32-partials store has no epilogue (x0.75), two blocks per SM cap registers (x0.89). Fitted to 96 sampled
// configurations compiled on the development machine (83-845 ms, two at a time): rank correlation 0.94-0.98
// with the measured times on held-out quarters, RMS error ~20%. Only the order it gives matters (the pool's
// longest-first queue), not the seconds.
double compile_seconds(const Params& p) {
  const Sm90Config c = config_of(p);
  const double acc = static_cast<double>(c.bm * c.bn) / static_cast<double>(std::max<int64_t>(1, c.consumers));
  double ln_ms = 2.031 + 0.272 * std::log2(std::max(1.0, acc));
  if (c.stream_k) ln_ms += 0.258;
  if (c.epi_smem) ln_ms += 0.178;
  if (get_bool(p, "partials")) ln_ms -= 0.292;
  if (c.blocks_per_sm == 2) ln_ms -= 0.121;
  return std::exp(ln_ms) / 1000.0;  // ln_ms: the natural log of milliseconds
}

// Stream-K's workspace (wgmma_sm90.cu): a flag per block in the first 4096 bytes, then a bm x bn fp32 slot per block.
constexpr int64_t kStreamKFlagBytes = kGemmFlagBytes;
constexpr int64_t kStreamKMaxBlocks = kStreamKFlagBytes / 4;

// The kernel's own operands. Without swap_ab they are A and B; with it the kernel computes D^T = B^T . A^T, so
// its "A" (the wgmma M side, bm rows) is B^T and its "B" (the wgmma N side, bn columns) is A^T.
//   a_mn: the kernel's A is M-contiguous (an MN-major wgmma operand, loaded as 64x64 boxes)
//   b_k:  the kernel's B is K-contiguous (a K-major wgmma operand, loaded as one box of bn rows)
struct KernelOperands {
  bool a_mn, b_k;
};
KernelOperands kernel_operands(const Params& p) {
  const bool a_row = get_layout(p, "layout_a") == Layout::kRowMajor;
  const bool b_row = get_layout(p, "layout_b") == Layout::kRowMajor;
  if (get_bool(p, "swap_ab")) return {b_row, a_row};
  return {!a_row, !b_row};
}

// derive() runs for every configuration a grid walk checks (thousands per sample), and rendering the
// instruction's operand lists dominated a cold choice generation: the snippet depends on four small values
// only, so each is rendered once per process and shared (Value keeps code text behind a shared pointer).
Value wgmma_snippet(int n, DType in, bool a_mn_major, bool b_mn_major) {
  static std::mutex mu;
  static std::map<std::tuple<int, DType, bool, bool>, Value> rendered;  // at most 32 n x dtypes x 4
  const auto key = std::make_tuple(n, in, a_mn_major, b_mn_major);
  std::lock_guard lock(mu);
  auto it = rendered.find(key);
  if (it == rendered.end()) {
    it = rendered.emplace(key, Value::code(render_wgmma(n, in, a_mn_major, b_mn_major), fmt::format("m64n{}k16", n)))
             .first;
  }
  return it->second;
}

Result<Params> derive(const Params& p) {
  Params d;
  const int64_t bn = get_int(p, "bn");
  if (bn < 8 || bn > 256 || bn % 8) {
    return make_error(ErrorCode::kInvalidArgument, fmt::format("bn {} is not a multiple of 8 in [8, 256]", bn));
  }
  const KernelOperands ops = kernel_operands(p);
  d.emplace("wgmma", wgmma_snippet(static_cast<int>(bn), get_dtype(p, "dtype"), ops.a_mn, !ops.b_k));
  return d;
}

Status constraints(const Params& p, const DeviceLimits& l) {
  const Sm90Config c = config_of(p);
  auto fail = [](ErrorCode code, std::string msg) { return make_error(code, std::move(msg)); };
  if (c.consumers != 1 && c.consumers != 2) return fail(ErrorCode::kOutOfRange, "consumers must be 1 or 2");
  if (c.pingpong && (c.consumers != 2 || !get_bool(p, "persistent") || c.stream_k || c.cluster_k > 1 || c.mcast > 1 ||
                     c.swap_ab)) {
    return fail(ErrorCode::kInvalidArgument, "pingpong needs two consumers and persistent, and excludes stream_k, "
                                             "cluster_k > 1, mcast 2 and swap_ab");
  }
  if (c.bm % (c.pingpong ? 64 : 64 * c.consumers) || c.wg_m() > 256) {
    return fail(ErrorCode::kInvalidArgument,
                fmt::format("bm {} must be a multiple of 64 x consumers {}", c.bm, c.consumers));
  }
  // An MN-major B is loaded as 64-wide boxes; a K-major one as one box of bn rows (any multiple of 8: the
  // small bn of swap_ab, where bn covers M).
  const int64_t bn_step = kernel_operands(p).b_k ? 8 : 64;
  if (c.bm > 256 || c.bn % bn_step || c.bn < bn_step || c.bn > 256) {
    return fail(ErrorCode::kInvalidArgument,
                fmt::format("bm {} <= 256 and bn {} a multiple of {} <= 256 (TMA boxes, wgmma n)", c.bm, c.bn, bn_step));
  }
  if (c.stages < 2) return fail(ErrorCode::kOutOfRange, "stages must be >= 2");
  if (c.acc_regs() > 128) {
    return fail(ErrorCode::kOutOfRange, fmt::format("{} fp32 accumulators per consumer thread > 128 (tile {}x{} over "
                                                    "{} warpgroups)", c.acc_regs(), c.bm, c.bn, c.consumers));
  }
  if (c.smem_bytes() > l.smem_per_block_optin) {
    return fail(ErrorCode::kOutOfRange, fmt::format("{} bytes of shared memory > the device's {} per block",
                                                    c.smem_bytes(), l.smem_per_block_optin));
  }
  if (c.blocks_per_sm != 1 && c.blocks_per_sm != 2) return fail(ErrorCode::kOutOfRange, "blocks_per_sm must be 1 or 2");
  if (c.blocks_per_sm == 2) {
    // Two blocks share the SM's registers (128 per thread, no setmaxnreg) and shared memory; two blocks of
    // three warpgroups would leave 85 registers per thread, too few for ptxas.
    if (c.consumers != 1) return fail(ErrorCode::kOutOfRange, "blocks_per_sm 2 needs consumers 1");
    if (c.acc_regs() > 64) {
      return fail(ErrorCode::kOutOfRange, fmt::format("blocks_per_sm 2 allows 64 accumulators per thread, the tile "
                                                      "needs {}", c.acc_regs()));
    }
    // Measured (H200, NVRTC 13.0): swab 128x64 c1 b2 (two m64 rows of accumulators per consumer) left 8-16 bytes in
    // local memory at the 128-register cap, with partials and with cluster_k 2; one m64 row stays clear.
    if (c.swap_ab && c.wg_m() > 64) {
      return fail(ErrorCode::kOutOfRange, fmt::format("blocks_per_sm 2 with swap_ab allows one m64 row per consumer "
                                                      "(bm / consumers = 64), the tile has {}", c.wg_m()));
    }
    if (2 * (c.smem_bytes() + 1024) > l.smem_per_sm) {
      return fail(ErrorCode::kOutOfRange, fmt::format("two blocks of {} bytes of shared memory exceed the SM's {}",
                                                      c.smem_bytes(), l.smem_per_sm));
    }
  }
  if (c.epi_smem && c.swap_ab) {
    // swap_ab tiles are decode-sized (few outputs): their transposed stores stay direct.
    return fail(ErrorCode::kInvalidArgument, "epi smem stages the kernel's own orientation: not with swap_ab");
  }
  if (c.mcast != 1 && c.mcast != 2) return fail(ErrorCode::kOutOfRange, "mcast must be 1 or 2");
  if (c.mcast == 2) {
    if (c.swap_ab || c.cluster_k > 1 || c.blocks_per_sm > 1) {
      return fail(ErrorCode::kInvalidArgument, "mcast 2 (a cluster of two sharing A) excludes swap_ab, cluster_k > 1 "
                                               "and blocks_per_sm 2");
    }
    // Each block loads half of A: half a K-major box (a multiple of 8 rows keeps the 128-byte swizzle's 1024-byte
    // atoms whole), or whole 64-row boxes of an MN-major A.
    const bool a_mn = kernel_operands(p).a_mn;
    if (a_mn ? c.bm % 128 : c.bm % 16) {
      return fail(ErrorCode::kInvalidArgument, fmt::format("mcast 2 splits A's {} rows in two: bm must be a multiple of "
                                                           "{}", c.bm, a_mn ? 128 : 16));
    }
  }
  if (c.stream_k && (!get_bool(p, "persistent") || c.cluster_k > 1 || c.mcast > 1 || get_bool(p, "partials"))) {
    return fail(ErrorCode::kInvalidArgument, "stream_k needs persistent and excludes cluster_k > 1, mcast 2 and "
                                             "partials (it splits K itself)");
  }
  if (c.sk_even && !c.stream_k) return fail(ErrorCode::kInvalidArgument, "sk_even is a form of stream_k: it needs stream_k");
  if (c.early < 0 || c.early > c.stages) {
    return fail(ErrorCode::kOutOfRange, fmt::format("early {} must be in [0, stages {}]", c.early, c.stages));
  }
  if (c.trigger < 0 || c.trigger > 2) {
    return fail(ErrorCode::kOutOfRange, fmt::format("trigger {} must be 0 (exit), 1 (start) or 2 (tail)", c.trigger));
  }
  if (c.early > 0 && !c.swap_ab) {
    return fail(ErrorCode::kInvalidArgument, "early loads the weights, the kernel's A: it needs swap_ab");
  }
  // Measured (H200, NVRTC 13.0): 256x128 with the direct epilogue left 8 bytes in local memory once the partial sums
  // were added (two m64 rows of 64 accumulator pairs per consumer); the staged epilogue stays clear.
  if (c.stream_k && c.acc_regs() == 128 && c.wg_m() > 64 && !c.epi_smem) {
    return fail(ErrorCode::kOutOfRange, "stream_k with two m64 rows of 128 accumulators per consumer needs epi smem");
  }
  if (c.cluster_k < 1 || c.cluster_k > 8) return fail(ErrorCode::kOutOfRange, "cluster_k must be in [1, 8] (portable clusters)");
  if (c.cluster_k > 1) {
    if (get_bool(p, "persistent") || get_bool(p, "partials")) {
      return fail(ErrorCode::kInvalidArgument, "cluster_k > 1 excludes persistent and partials");
    }
    // Measured: with 128 accumulators per thread the cluster reduction spills a register (ptxas); decode tiles
    // are small anyway.
    if (c.acc_regs() > 64) {
      return fail(ErrorCode::kOutOfRange, fmt::format("cluster_k > 1 allows 64 accumulators per thread, the tile "
                                                      "needs {}", c.acc_regs()));
    }
    if (c.bm * c.bn * 4 > c.stages * c.stage_bytes()) {
      return fail(ErrorCode::kOutOfRange, "cluster_k > 1 parks a bm x bn fp32 tile in the pipeline's shared memory: "
                                          "not enough stages");
    }
  }
  return Status();
}

Status problem_constraints(const Params& p, const Shape& s) {
  KILN_RETURN_IF_ERROR(gemm_problem_common(p, s));
  const int64_t lda = dense_lda(get_layout(p, "layout_a"), s), ldb = dense_ldb(get_layout(p, "layout_b"), s);
  if (lda % 8 || ldb % 8) {
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("TMA needs lda {} and ldb {} to be multiples of 8 elements", lda, ldb));
  }
  return Status();
}

Result<Launch> geometry(const Params& p, const Shape& s) {
  const Sm90Config c = config_of(p);
  Launch l;
  // With swap_ab the kernel's rows are N and its columns M.
  const int64_t rows = c.swap_ab ? s.n : s.m, cols = c.swap_ab ? s.m : s.n;
  // mcast 2: tile columns in pairs (an odd count gets a pair whose second block has no columns).
  const int64_t tiles_n = (cols + c.bn - 1) / c.bn;
  const int64_t work = ((rows + c.bm - 1) / c.bm) * (c.mcast == 2 ? (tiles_n + 1) / 2 * 2 : tiles_n) *
                       (get_bool(p, "partials") ? s.splits : 1) * c.cluster_k;
  if (work > INT32_MAX) return make_error(ErrorCode::kInvalidArgument, "gemm: too many tiles");
  // A persistent grid is capped at one block per SM by launch_gemm(), which knows the device.
  l.grid.x = static_cast<unsigned>(work);
  if (s.m == 0 || s.n == 0) l.grid.x = 0;
  l.block.x = static_cast<unsigned>(c.threads());
  l.shared_bytes = static_cast<unsigned>(c.smem_bytes());
  l.cluster.x = static_cast<unsigned>(c.cluster_k * c.mcast);
  l.programmatic = programmatic_launch_enabled();  // the kernel waits for the previous grid (kiln_wait_prior_grid)
  return l;
}

std::string config_name(const Params& p) {
  const Sm90Config c = config_of(p);
  return fmt::format("gemm_wgmma_{}{}x{}x64_c{}_s{}_g{}{}{}{}{}{}{}{}{}_{}", c.swap_ab ? "swab_" : "", c.bm, c.bn,
                     c.consumers, c.stages, get_int(p, "group_m"), get_bool(p, "persistent") ? "_p" : "",
                     c.sk_even ? "_ske" : c.stream_k ? "_sk" : c.pingpong ? "_pp" : "",
                     c.cluster_k > 1 ? fmt::format("_ck{}", c.cluster_k) : "",
                     c.blocks_per_sm > 1 ? fmt::format("_b{}", c.blocks_per_sm) : "", c.epi_smem ? "_es" : "",
                     c.mcast > 1 ? fmt::format("_mc{}", c.mcast) : "", c.early > 0 ? fmt::format("_e{}", c.early) : "",
                     c.trigger == 1 ? "_ts" : c.trigger == 2 ? "_tt" : "", gemm_problem_suffix(p));
}

// The SM count of each device, read once (persistent grids are sized by it).
Result<int> sm_count_of_current_device() {
  static std::mutex mu;
  static std::array<int, 64> counts{};
  KILN_ASSIGN_OR_RETURN(int dev, current_device());
  if (dev < 0 || dev >= static_cast<int>(counts.size())) return make_error(ErrorCode::kOutOfRange, "device ordinal");
  std::lock_guard<std::mutex> lock(mu);
  if (counts[dev] == 0) {
    KILN_ASSIGN_OR_RETURN(DeviceInfo info, device_info(dev));
    counts[dev] = info.sm_count;
  }
  return counts[dev];
}

// A 2-D tiled tensor map over a row-major [rows][cols] view (cols contiguous, `ld` elements apart) with a
// box of box_cols x box_rows and 128-byte swizzle; reads outside the tensor are zero-filled. L2 promotion is 128
// bytes, a box row: with 256 (what it was) the suite ran 0.5% slower in the median and 0.8% in the geometric mean,
// decode shapes with a long K up to 6% (H200, same call, two runs each;
// bench/results/gemm-suite-pdl-l2-nvidia-h200-2026-11-29.md).
Status encode_map(CUtensorMap* map, const DriverApi* api, DType dtype, const void* base, int64_t rows, int64_t cols,
                  int64_t ld, unsigned box_cols, unsigned box_rows) {
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld) * 2};
  const cuuint32_t box[2] = {box_cols, box_rows};
  const cuuint32_t elem_strides[2] = {1, 1};
  KILN_CHECK(api->cuTensorMapEncodeTiled(
      map, dtype == DType::kBF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2,
      const_cast<void*>(base), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  return Status();
}

}  // namespace

Status launch_gemm_tma(const Kernel& kernel, const Params& params, const Launch& geometry, const GemmArgs& a,
                       CUstream stream, CUdeviceptr lowered_flags) {
  auto bad = [](std::string msg) { return make_error(ErrorCode::kInvalidArgument, std::move(msg)); };
  if (a.m < 0 || a.n < 0 || a.k < 0) return bad("gemm: negative size");
  if (a.split_k < 1) return bad("gemm: split_k must be >= 1");
  if (geometry.grid.x == 0 || a.m == 0 || a.n == 0) return Status();
  if (a.k == 0) return bad("gemm_wgmma_sm90: K must be >= 1");
  if (!a.a || !a.b) return bad("gemm: null A or B");
  if (a.split_k > 1 && !a.workspace) return bad("gemm: split-K partials need a workspace");
  if (a.lda % 8 || a.ldb % 8) return bad(fmt::format("gemm_wgmma_sm90: TMA needs lda {} and ldb {} multiples of 8", a.lda, a.ldb));
  if ((reinterpret_cast<uintptr_t>(a.a) | reinterpret_cast<uintptr_t>(a.b)) % 16) {
    return bad("gemm_wgmma_sm90: A and B must be 16-byte aligned");
  }
  const Sm90Config c = config_of(params);
  const DType dtype = get_dtype(params, "dtype");
  KILN_ASSIGN_OR_RETURN(const DriverApi* api, driver());

  // The kernel's operands and sizes: with swap_ab it computes D^T = B^T . A^T (its m is N, its n is M) and
  // stores transposed; d, ldd, the epilogue and the workspace keep their meaning.
  GemmArgs k = a;
  if (c.swap_ab) {
    std::swap(k.a, k.b);
    std::swap(k.m, k.n);
    std::swap(k.lda, k.ldb);
  }
  const KernelOperands ops = kernel_operands(params);
  CUtensorMap map_a, map_b;  // the type carries its alignment (64 or 128 by toolkit; clang refuses a smaller alignas)
  if (!ops.a_mn) {  // [M][K]: one box of BM rows per stage (BM / 2 from each block of an mcast pair)
    KILN_RETURN_IF_ERROR(
        encode_map(&map_a, api, dtype, k.a, k.m, k.k, k.lda, 64, static_cast<unsigned>(c.bm / c.mcast)));
  } else {  // [K][M]: BM / 64 boxes of 64 M x 64 K per stage
    KILN_RETURN_IF_ERROR(encode_map(&map_a, api, dtype, k.a, k.k, k.m, k.lda, 64, 64));
  }
  if (ops.b_k) {  // [N][K]: one box of BN rows per stage
    KILN_RETURN_IF_ERROR(encode_map(&map_b, api, dtype, k.b, k.n, k.k, k.ldb, 64, static_cast<unsigned>(c.bn)));
  } else {  // [K][N]
    KILN_RETURN_IF_ERROR(encode_map(&map_b, api, dtype, k.b, k.k, k.n, k.ldb, 64, 64));
  }

  LaunchConfig cfg = geometry.config(stream);
  if (get_bool(params, "persistent")) {
    KILN_ASSIGN_OR_RETURN(int sms, sm_count_of_current_device());
    cfg.grid.x = std::min<unsigned>(cfg.grid.x, static_cast<unsigned>(sms));
    if (c.mcast == 2) cfg.grid.x &= ~1u;  // whole pairs: a block and its peer walk the same tile rows
    // Stream-K spreads few tiles' K loops over every SM.
    if (c.stream_k) cfg.grid.x = static_cast<unsigned>(std::min<int64_t>(sms, kStreamKMaxBlocks));
    if (c.sk_even) {
      // Every block gets at least one of the T iterations (the kernel's finishers wait on every block after theirs
      // up to the tile's end), and T and the blocks' starts fit the kernel's ints.
      const int64_t tiles = ((k.m + c.bm - 1) / c.bm) * ((k.n + c.bn - 1) / c.bn), total = tiles * ((k.k + 63) / 64);
      if (total >= INT32_MAX) return bad("gemm_wgmma_sm90: sk_even needs fewer than 2^31 tile iterations");
      cfg.grid.x = static_cast<unsigned>(std::min<int64_t>(cfg.grid.x, total));
    }
  }
  if (c.stream_k) {
    if (!k.workspace) return bad("gemm_wgmma_sm90: stream_k needs a workspace (Template::workspace_bytes)");
    if (reinterpret_cast<uintptr_t>(k.workspace) % 16) return bad("gemm_wgmma_sm90: the workspace must be 16-byte aligned");
  }
  // The flags start lowered on every launch: the caller's lowered ones, or else the workspace's first bytes (it may
  // hold anything: another choice's partials), lowered here.
  CUdeviceptr flags = 0;
  if (c.stream_k) {
    flags = lowered_flags;
    if (flags % 16) return bad("gemm_wgmma_sm90: lowered_flags must be 16-byte aligned");
    if (!flags) {
      flags = reinterpret_cast<CUdeviceptr>(k.workspace);
      KILN_CHECK(api->cuMemsetD32Async(flags, 0, cfg.grid.x, stream));
    }
  }
  void* ptrs[] = {&k, &map_a, &map_b, &flags, nullptr};
  return kernel.launch(cfg, ptrs);
}

TemplateDef gemm_wgmma_sm90_def() {
  TemplateDef d = builtin_def("gemm_wgmma_sm90", "gemm",
                              "Hopper GEMM: wgmma + TMA, warp-specialised producer/consumer with mbarriers (sm_90a)",
                              "gemm/wgmma_sm90.cu", "kiln_gemm_wgmma_sm90", {"gemm/gemm_common.cuh"});
  d.min_cc = 90;
  d.needs_arch_specific = true;
  d.params = gemm_problem_specs();
  d.params.push_back(int_param("bm", ParamRole::kTunable, {64, 128, 256}, "", "block tile rows (M)"));
  d.params.push_back(int_param("bn", ParamRole::kTunable, {8, 16, 32, 64, 128, 192, 256}, "",
                               "block tile columns (N, or M with swap_ab): wgmma n"));
  d.params.push_back(int_param("consumers", ParamRole::kTunable, {1, 2}, "c", "consumer warpgroups, bm/consumers rows each"));
  d.params.push_back(int_param("stages", ParamRole::kTunable, {3, 4, 5, 6, 8}, "s", "TMA pipeline depth (64-wide K steps)"));
  d.params.push_back(int_param("group_m", ParamRole::kTunable, {1, 8, 16}, "g",
                               "tile rasterisation: tile rows walked before the next tile column (L2 reuse)"));
  d.params.push_back(bool_param("persistent", ParamRole::kTunable, "p",
                                "one block per SM looping over tiles (the next tile's loads overlap the stores)"));
  d.params.push_back(int_param("cluster_k", ParamRole::kTunable, {1, 2, 4}, "ck",
                               "split K over a cluster of this many blocks, reduced in distributed shared memory "
                               "(one kernel; for few tiles, e.g. decode)"));
  d.params.push_back(int_param("blocks_per_sm", ParamRole::kTunable, {1, 2}, "b",
                               "1: registers move to the consumers (setmaxnreg); 2: two small-tile blocks per SM"));
  d.params.push_back(bool_param("swap_ab", ParamRole::kTunable, "swab",
                                "compute D^T = B^T . A^T: N fills wgmma's 64-row side and a small M is the tile's bn "
                                "(decode); D is stored transposed back"));
  // Added after configurations were stored: a set without it means the direct epilogue it always had.
  ParamSpec epi = enum_param("epi", ParamRole::kTunable, {"direct", "smem"}, "epi",
                             "direct: fragment-layout stores from registers; smem: the epilogue's output staged in "
                             "shared memory (bm x 128 bytes more), written out as coalesced 16-byte stores");
  epi.default_value = Value::enumeration("direct");
  d.params.push_back(std::move(epi));
  // 2 is accepted but left out of the sampled grid: measured on an H200 it is on par with the same tile without it
  // (4096^3: 175.9 vs 175.1 us, bench/results/gemm-suite-mcast-nvidia-h200-2026-11-26-20eb7bf.md), not yet a win; the GEMM
  // suite measures it on every large shape. (A first version whose remote arrivals had cluster-scope release ran
  // 1.4-2x slower: that fence waited for the epilogue's global stores on every K step.)
  ParamSpec mcast = int_param("mcast", ParamRole::kTunable, {1}, "mc",
                              "2: clusters of two blocks on adjacent tile columns, each loading half of the shared A "
                              "tile and multicasting it to both (TMA .multicast::cluster); not sampled (on par so far)");
  mcast.default_value = Value::integer(1);
  d.params.push_back(std::move(mcast));
  ParamSpec stream_k = bool_param("stream_k", ParamRole::kTunable, "sk",
                                  "persistent only: the tiles of the last, partial wave split along K to fill the "
                                  "grid, partials summed in a workspace (for tile counts that leave SMs idle)");
  stream_k.default_value = Value::boolean(false);
  d.params.push_back(std::move(stream_k));
  ParamSpec sk_even = bool_param("sk_even", ParamRole::kTunable, "ske",
                                 "with stream_k: every block an equal share of all the tiles' K iterations (free-running "
                                 "stream-K), for memory-bound shapes whose tiles share no operand panel (swap-AB decode)");
  sk_even.default_value = Value::boolean(false);
  // Accepted, not sampled: on an H200 (28 Nov, bench/results/gemm-issue15-nvidia-h200-2026-11-28.md) swap-AB decode
  // tiles with it ran 2-4 us slower than the same tiles split over a cluster (the flags' memset node is 2-3 us of
  // that) and tied at best on the widest N; a flag protocol without the per-launch memset would change that.
  sk_even.values = {Value::boolean(false)};
  d.params.push_back(std::move(sk_even));
  ParamSpec pingpong = bool_param("pingpong", ParamRole::kTunable, "pp",
                                  "persistent, two consumers: each takes whole bm x bn tiles in turn, one's epilogue "
                                  "under the other's MMAs (instead of splitting each tile's rows)");
  pingpong.default_value = Value::boolean(false);
  // Accepted but not sampled: on an H200 it ran within 3% of the same tile split between the consumers at K >= 3584
  // and 3-6% faster at K <= 1024 (bench/results/gemm-suite-nvidia-h200-2026-11-27-*), and the model has no term for
  // the epilogue it hides yet, so sampling it would only double the ties; the GEMM suite measures it.
  pingpong.values = {Value::boolean(false)};
  d.params.push_back(std::move(pingpong));
  ParamSpec early = int_param("early", ParamRole::kTunable, {0}, "e",
                              "swap_ab: stages whose weights (the kernel's A) are requested before waiting for the "
                              "previous kernel, when the call promises B constant (KILN_GEMM_B_CONSTANT); with a "
                              "trigger before the exit, the next kernel's do so during this one's tail");
  early.default_value = Value::integer(0);
  d.params.push_back(std::move(early));
  // Accepted, not sampled (the model has no term for the overlap yet); the tuner's decode seeds and the GEMM suite
  // try 2 on the two-blocks-per-SM swap-AB tiles.
  ParamSpec trigger = int_param("trigger", ParamRole::kTunable, {0}, "t",
                                "where a block lets the next kernel launch (programmatic launch): 0 as it exits, 1 at "
                                "its start, 2 after its producer's last load");
  trigger.default_value = Value::integer(0);
  d.params.push_back(std::move(trigger));
  d.params.push_back(derived_param("wgmma", ParamKind::kCode, "the m64n<bn>k16 wgmma wrapper for the layouts"));
  d.specialization_note =
      "M, N, K, leading dimensions and split-K slices are run-time arguments; TMA tensor maps are encoded per "
      "launch by launch_gemm()";
  d.derive = derive;
  d.constraints = constraints;
  d.problem_constraints = problem_constraints;
  d.geometry = geometry;
  d.config_name = config_name;
  d.gemm_launch = launch_gemm_tma;
  d.compile_cost = compile_seconds;
  d.workspace_bytes = [](const Params& p) -> size_t {
    const Sm90Config c = config_of(p);
    if (!c.stream_k) return 0;
    auto sms = sm_count_of_current_device();
    if (!sms.ok()) return 0;  // no device: nothing runs (the launch refuses a missing workspace)
    return static_cast<size_t>(kStreamKFlagBytes + std::min<int64_t>(*sms, kStreamKMaxBlocks) * c.bm * c.bn * 4);
  };
  return d;
}

}  // namespace detail
}  // namespace kiln::templates
