// kiln template gemm_mma_sm80: D[M,N] = epilogue(A[M,K] . B[K,N]) on tensor cores with mma.sync (sm_80+).
//
// A block computes a ${bm}x${bn} tile of D with ${warps_m}x${warps_n} warps, walking K in steps of ${bk}
// through a ${stages}-stage cp.async pipeline in shared memory. Shared tiles keep the global layout (the
// contiguous dimension stays contiguous) and are XOR-swizzled in 16-byte units so that both the cp.async
// writes and the ldmatrix reads are free of bank conflicts; ldmatrix (.trans for M- or N-contiguous tiles)
// feeds m16n8k16 MMAs with fp32 accumulators. Edges are masked: loads outside A or B are zero-filled (K not a
// multiple of ${bk} included) and stores outside D are skipped, so M, N and K are run-time arguments.
// Global loads move `align` elements at a time (8: 16-byte cp.async; 4, 2: 8- and 4-byte cp.async; 1:
// element loads for leading dimensions of any parity).
#include "common/kiln_device.cuh"
#include "kiln/templates/kernel_args.h"
${epilogue}
#include "gemm/gemm_common.cuh"

namespace {

typedef ${dtype} In;
constexpr int BM = ${bm}, BN = ${bn}, BK = ${bk};
constexpr int WARPS_M = ${warps_m}, WARPS_N = ${warps_n};
constexpr int THREADS = 32 * WARPS_M * WARPS_N;
constexpr int STAGES = ${stages};
constexpr int GROUP_M = ${group_m};
constexpr int ALIGN = ${align};
constexpr bool A_COL = ${layout_a.col};  // A stored M-contiguous (column-major) instead of K-contiguous
constexpr bool B_COL = ${layout_b.col};  // B stored K-contiguous (column-major) instead of N-contiguous
constexpr bool PARTIALS = ${partials};

constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N;  // warp tile
constexpr int MI = WM / 16, NI = WN / 8;             // m16n8k16 MMAs per warp per k16 step
static_assert(WM % 16 == 0 && WN % 16 == 0 && BK % 16 == 0, "tile shape");

// A shared tile: ROWS rows of COLS contiguous elements, as stored globally.
template <int ROWS, int COLS>
struct Tile {
  static constexpr int kRowBytes = COLS * 2;
  static constexpr int kBytes = ROWS * kRowBytes;
  static_assert(kRowBytes % 16 == 0, "rows are whole 16-byte units");
  // Byte offset of element (r, c): the 16-byte unit is XORed with its 128-byte line index (mod 8), so eight
  // consecutive rows read at the same column land in eight different bank groups.
  static __device__ __forceinline__ unsigned offset(int r, int c) {
    const unsigned byte = r * kRowBytes + c * 2;
    const unsigned unit = byte >> 4, line = unit >> 3;
    return (((line << 3) | ((unit & 7) ^ (line & 7))) << 4) | (byte & 15);
  }
};
// A: [BM][BK] (K-contiguous) or [BK][BM]; B: [BK][BN] (N-contiguous) or [BN][BK].
typedef Tile<A_COL ? BK : BM, A_COL ? BM : BK> TileA;
typedef Tile<B_COL ? BN : BK, B_COL ? BK : BN> TileB;
constexpr int STAGE_BYTES = TileA::kBytes + TileB::kBytes;

// Copies one tile from global memory into shared memory at `dst`. The tile's rows start at global row `row0`
// (valid below `row_end`), its columns at `col0` (valid below `col_end`); `ld` is the leading dimension.
template <class TILE, int ROWS, int COLS>
__device__ __forceinline__ void load_tile(unsigned dst, const In* __restrict__ src, long long ld, int row0,
                                          int row_end, int col0, int col_end) {
  constexpr int CHUNKS_PER_ROW = COLS / ALIGN;
  constexpr int CHUNKS = ROWS * CHUNKS_PER_ROW;
  constexpr int ITERS = (CHUNKS + THREADS - 1) / THREADS;
  // Narrow loads are the slow path for odd leading dimensions: keep their code small.
  constexpr int UNROLL = ALIGN >= 4 ? ITERS : 2;
#pragma unroll UNROLL
  for (int it = 0; it < ITERS; ++it) {
    const int idx = it * THREADS + threadIdx.x;
    if (CHUNKS % THREADS != 0 && idx >= CHUNKS) break;
    const int r = idx / CHUNKS_PER_ROW, c = (idx % CHUNKS_PER_ROW) * ALIGN;
    const int gr = row0 + r, gc = col0 + c;
    const unsigned s = dst + TILE::offset(r, c);
    int n = gr < row_end ? min(col_end - gc, ALIGN) : 0;
    n = max(n, 0);
    const In* g = n > 0 ? src + gr * ld + gc : src;
    if constexpr (ALIGN == 8) {
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(g), "r"(n * 2));
    } else if constexpr (ALIGN == 4) {
      asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(s), "l"(g), "r"(n * 2));
    } else if constexpr (ALIGN == 2) {
      asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(g), "r"(n * 2));
    } else {
      unsigned short v = 0;
      if (n > 0) v = *reinterpret_cast<const unsigned short*>(g);
      asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(s), "h"(v));
    }
  }
}

__device__ __forceinline__ void ldmatrix_x4(unsigned addr, unsigned (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned addr, unsigned (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void mma16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  if constexpr (KilnIsBf16<In>::value) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// The A fragments (MI of 16x16) and B fragments (NI of 16x8) of k16 step `kk` of the stage at a_base/b_base.
__device__ __forceinline__ void load_fragments(unsigned a_base, unsigned b_base, int kk, int wm0, int wn0,
                                               int lane, unsigned (&af)[MI][4], unsigned (&bf)[NI][2]) {
#pragma unroll
  for (int mi = 0; mi < MI; ++mi) {
    if constexpr (!A_COL) {
      ldmatrix_x4(a_base + TileA::offset(wm0 + mi * 16 + (lane & 15), kk * 16 + (lane >> 4) * 8), af[mi]);
    } else {
      ldmatrix_x4_trans(
          a_base + TileA::offset(kk * 16 + (lane & 7) + (lane >> 4) * 8, wm0 + mi * 16 + ((lane >> 3) & 1) * 8),
          af[mi]);
    }
  }
#pragma unroll
  for (int nj = 0; nj < NI / 2; ++nj) {
    unsigned r[4];
    if constexpr (B_COL) {
      ldmatrix_x4(b_base + TileB::offset(wn0 + nj * 16 + (lane & 7) + (lane >> 4) * 8, kk * 16 + ((lane >> 3) & 1) * 8),
                  r);
    } else {
      ldmatrix_x4_trans(
          b_base + TileB::offset(kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, wn0 + nj * 16 + (lane >> 4) * 8), r);
    }
    bf[2 * nj][0] = r[0];
    bf[2 * nj][1] = r[1];
    bf[2 * nj + 1][0] = r[2];
    bf[2 * nj + 1][1] = r[3];
  }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(THREADS) kiln_gemm_mma_sm80(const KilnGemmArgs args) {
  extern __shared__ __align__(128) unsigned char smem[];
  const unsigned smem_base = kiln_smem_addr(smem);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int wm0 = (warp / WARPS_N) * WM, wn0 = (warp % WARPS_N) * WN;

  const int tiles_m = (args.m + BM - 1) / BM, tiles_n = (args.n + BN - 1) / BN;
  int tm, tn;
  kiln_tile_of(blockIdx.x, tiles_m, tiles_n, GROUP_M, tm, tn);
  const int m0 = tm * BM, n0 = tn * BN;
  const int z = blockIdx.z;
  int k_begin, k_end;
  kiln_k_range(args, z, k_begin, k_end);
  const int k_tiles = (k_end - k_begin + BK - 1) / BK;

  const In* __restrict__ A = static_cast<const In*>(args.a);
  const In* __restrict__ B = static_cast<const In*>(args.b);

  auto load_stage = [&](int stage, int kt) {
    const unsigned sa = smem_base + stage * STAGE_BYTES, sb = sa + TileA::kBytes;
    const int k0 = k_begin + kt * BK;
    if constexpr (!A_COL) {
      load_tile<TileA, BM, BK>(sa, A, args.lda, m0, args.m, k0, k_end);
    } else {
      load_tile<TileA, BK, BM>(sa, A, args.lda, k0, k_end, m0, args.m);
    }
    if constexpr (B_COL) {
      load_tile<TileB, BN, BK>(sb, B, args.ldb, n0, args.n, k0, k_end);
    } else {
      load_tile<TileB, BK, BN>(sb, B, args.ldb, k0, k_end, n0, args.n);
    }
  };

  float acc[MI][NI][4];
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int ni = 0; ni < NI; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.f;

  // Prologue: STAGES - 1 tiles in flight. Every thread commits one group per tile, even an empty one, so
  // that wait_group counts line up at the end of K.
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < k_tiles) load_stage(s, s);
    asm volatile("cp.async.commit_group;\n" ::);
  }

  unsigned af[2][MI][4];
  unsigned bf[2][NI][2];
  for (int kt = 0; kt < k_tiles; ++kt) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 2));
    __syncthreads();  // tile kt is in shared memory for everyone; stage (kt - 1) % STAGES is free again
    {
      const int next = kt + STAGES - 1;
      if (next < k_tiles) load_stage(next % STAGES, next);
      asm volatile("cp.async.commit_group;\n" ::);
    }
    const unsigned sa = smem_base + (kt % STAGES) * STAGE_BYTES, sb = sa + TileA::kBytes;
    load_fragments(sa, sb, 0, wm0, wn0, lane, af[0], bf[0]);
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      if (kk + 1 < BK / 16) load_fragments(sa, sb, kk + 1, wm0, wn0, lane, af[(kk + 1) & 1], bf[(kk + 1) & 1]);
#pragma unroll
      for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) mma16816(acc[mi][ni], af[kk & 1][mi], bf[kk & 1][ni][0], bf[kk & 1][ni][1]);
    }
  }
  asm volatile("cp.async.wait_group 0;\n" ::);

  // Epilogue: each thread holds rows g and g + 8 and columns 2t, 2t + 1 of every 16x8 MMA tile.
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
    for (int ni = 0; ni < NI; ++ni) {
      const int row = m0 + wm0 + mi * 16 + g, col = n0 + wn0 + ni * 8 + 2 * t;
      kiln_gemm_store2<PARTIALS>(args, z, row, col, acc[mi][ni][0], acc[mi][ni][1]);
      kiln_gemm_store2<PARTIALS>(args, z, row + 8, col, acc[mi][ni][2], acc[mi][ni][3]);
    }
  }
}
