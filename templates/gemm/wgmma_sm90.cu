// kiln template gemm_wgmma_sm90: D[M,N] = epilogue(A[M,K] . B[K,N]) with Hopper's wgmma (sm_90a only).
//
// Warp-specialised: warpgroup 0 is the producer, whose one elected thread walks the block's tiles issuing TMA
// loads (cp.async.bulk.tensor, 128-byte swizzle, tensor maps made on the host and passed as __grid_constant__
// parameters) into a ${stages}-stage ring of shared memory, each stage guarded by a "full" and an "empty"
// mbarrier. Warpgroups 1..${consumers} are consumers: each owns ${bm}/${consumers} rows of the ${bm}x${bn}
// tile and issues m64n${bn}k16 wgmmas straight from shared memory (K-major or MN-major operands per layout),
// keeping one wgmma group in flight while it waits for the next stage, then applies the epilogue from its
// fp32 accumulators to global memory. setmaxnreg moves registers from the producer to the consumers.
// blocks_per_sm = ${blocks_per_sm}: 2 lets small tiles (decode) run two blocks per SM instead of one.
// With `persistent`, the grid is at most one block per SM and each block loops over tiles, so the producer
// fetches the next tile while the consumers store the last. With cluster_k = ${cluster_k} > 1 (for few tiles,
// e.g. decode), a tile's K is split over a cluster of cluster_k blocks; each block parks its fp32
// accumulators in its shared memory and the cluster's first block sums them over distributed shared memory
// and applies the epilogue: split-K in one kernel, with no workspace. TMA zero-fills reads outside A and B (edges and
// a K tail included) and the stores are masked, so M, N and K are run-time arguments; TMA needs 16-byte
// aligned rows: lda and ldb multiples of 8 elements. With swap_ab = ${swap_ab} (decode: M small) the kernel
// computes D^T = B^T . A^T so that N fills wgmma's 64-row M side and M is the tile's bn (any multiple of 8),
// and stores the transposed tile back to D.
// Epilogue ${epi}: `direct` stores each accumulator pair (after the epilogue) from the wgmma fragment layout
// straight to global memory (4-byte stores, 8 rows per warp instruction). `smem` stages the tile, after the
// epilogue and in the output type, through a per-consumer buffer of ${bm}/${consumers} rows x 128 bytes (one
// column chunk at a time, 16-byte units XOR-swizzled by row so the fragment writes and the row reads are free of
// bank conflicts), then writes whole 128-byte row segments with 16-byte stores. The buffer is its own region
// (not a pipeline stage), so in persistent mode the producer keeps loading the next tile meanwhile.
// With mcast = ${mcast} = 2, blocks run in clusters of two that take horizontally adjacent tiles (same rows of A):
// each block's producer loads half of the A tile and multicasts it into both blocks' stage (TMA .multicast::cluster),
// halving A's L2-to-SM traffic; a stage is refilled only when the consumers of both blocks have released it (each
// consumer warp arrives on its own and on the peer's "empty" mbarrier). With an odd number of tile columns the
// last pair's second block computes a tile past N (B zero-filled, nothing stored) so that its half of A arrives.
// With stream_k = ${stream_k} (persistent grids only) the tiles of the last, partial wave are split along K so that
// the wave fills the grid (see SkPlan): a piece other than a tile's first parks its fp32 partial in its block's
// workspace slot and raises the block's flag; the block of the first piece adds the others in piece order (a fixed
// sum order) and applies the epilogue. The pieces run in one wave and no contributor waits for anything, so the
// waits end as long as the blocks get SMs. Workspace: 4096 bytes (where G flags may live), then G slots of bm x bn
// floats. The flags are `sk_flags`, which are lowered when the kernel starts: either memory the caller keeps for
// this (launch_gemm's lowered_flags) or the workspace's first bytes, lowered by a memset launch_gemm() queues first.
// Each finisher lowers the flags it consumed, so the kernel leaves them as it found them and the caller's flags need
// no memset on the next launch (a memset node costs 2-4 us of a graph's launch of a 10-20 us kernel on an H200).
// With sk_even = ${sk_even} (stream-K's free-running form) block b of the G blocks takes iterations [b T / G,
// (b + 1) T / G) of all the tiles' T = tiles x K-blocks iterations in order: every SM streams an equal share. For
// memory-bound shapes whose tiles share no operand panel (swap-AB decode: each tile its own rows of B); where tiles
// share panels the staggered K offsets cost L2 reuse (see SkPlan). Only a block's first piece can start inside a
// tile (it contributes) and only its last can end inside one (it finishes: the tile's other pieces are the next
// blocks' first pieces, done first), so one slot per block is enough and the finisher waits on blocks that
// started with its tile. launch_gemm() keeps G <= T, so that every block has a piece.
#include "common/kiln_device.cuh"
#include "kiln/templates/kernel_args.h"
${epilogue}
#include "gemm/gemm_common.cuh"

namespace {

typedef ${dtype} In;
constexpr int BM = ${bm}, BN = ${bn}, BK = 64;
constexpr int CONSUMERS = ${consumers};
constexpr bool PINGPONG = ${pingpong};
constexpr int WG_M = PINGPONG ? BM : BM / CONSUMERS;  // rows per consumer warpgroup
constexpr int C_ROWS = PINGPONG ? 0 : WG_M;           // consumer c's rows start at c * C_ROWS in the tile
constexpr int MW = WG_M / 64;         // m64 wgmmas per consumer per k16 step
constexpr int STAGES = ${stages};
constexpr int GROUP_M = ${group_m};
// swap_ab: the kernel computes D^T = B^T . A^T, its A operand being B^T (rows = N) and its B operand A^T
// (columns = M), and stores D^T transposed back; launch_gemm() swaps the pointers, sizes and leading dimensions
// in the args and encodes the tensor maps of the kernel's operands.
constexpr bool SWAP_AB = ${swap_ab};
// The kernel's A M-contiguous: an MN-major wgmma operand.
constexpr bool A_COL = SWAP_AB ? ${layout_b.row} : ${layout_a.col};
// The kernel's B K-contiguous: a K-major wgmma operand.
constexpr bool B_COL = SWAP_AB ? ${layout_a.row} : ${layout_b.col};
constexpr bool PARTIALS = ${partials};
constexpr int CLUSTER_K = ${cluster_k};
constexpr int BLOCKS_PER_SM = ${blocks_per_sm};
constexpr int MCAST = ${mcast};
constexpr bool STREAM_K = ${stream_k};
constexpr bool SK_EVEN = ${sk_even};
// With early = ${early} > 0 (swap_ab: the kernel's A is the GEMM's B, a weight) and the caller's promise that no
// earlier kernel writes it (KILN_GEMM_B_CONSTANT), the producer requests the weights of its first `early` stages
// before waiting for the previous kernel. With a trigger (below) that lets the next kernel launch before this one
// ends, a next kernel's blocks that fit beside this one's (blocks_per_sm 2) stream their first weights during its tail.
constexpr int EARLY = ${early};
// Where a block lets the next kernel launch (kiln_allow_next_grid), trigger = ${trigger}: 0 never (the next kernel
// launches as the blocks exit), 1 at the start, 2 after the producer's last load (the next kernel's blocks arrive
// while this one drains: with blocks_per_sm 2 they fit beside it and run their prologue, or load early weights).
enum class Trigger { exit = 0, start = 1, tail = 2 };
constexpr Trigger TRIGGER = static_cast<Trigger>(${trigger});
static_assert(${trigger} >= 0 && ${trigger} <= 2, "trigger: 0, 1 or 2");
constexpr int SK_FLAG_BYTES = 4096;  // the workspace's flags (at most 1024 blocks), before the slots
enum class Epi { direct, smem };
constexpr bool EPI_SMEM = Epi::${epi} == Epi::smem;
constexpr int THREADS = 128 * (CONSUMERS + 1);
constexpr int A_STAGE_BYTES = BM * BK * 2, B_STAGE_BYTES = BN * BK * 2;
constexpr int STAGE_BYTES = A_STAGE_BYTES + B_STAGE_BYTES;
constexpr int CHUNK_BYTES = 64 * BK * 2;  // one 64 (M or N) x 64 (K) box of an MN-major operand
static_assert(WG_M % 64 == 0 && BN % 8 == 0 && (B_COL || BN % 64 == 0), "tile shape");
static_assert(!EPI_SMEM || !SWAP_AB, "the staged epilogue stores the kernel's own orientation");
static_assert(MCAST == 1 || (MCAST == 2 && CLUSTER_K == 1 && !SWAP_AB && (A_COL ? BM % 128 == 0 : BM % 16 == 0)),
              "multicast: a cluster of two along N, each loading half of A (whole 64-row boxes when MN-major)");
// The staged epilogue's buffer: per consumer, WG_M rows of 128 bytes, after the stages and their mbarriers.
constexpr int EPI_ROW_BYTES = 128;
constexpr int EPI_BYTES = EPI_SMEM ? CONSUMERS * WG_M * EPI_ROW_BYTES : 0;
constexpr int BARRIER_BYTES = (STAGES * 16 + 127) / 128 * 128;
static_assert(!STREAM_K || (CLUSTER_K == 1 && MCAST == 1 && !PARTIALS), "stream-K: its own K split");
static_assert(!SK_EVEN || STREAM_K, "sk_even is a form of stream-K");
static_assert(EARLY == 0 || (SWAP_AB && MCAST == 1 && EARLY <= STAGES), "early weights: swap_ab, within the ring");
static_assert(!PINGPONG || (CONSUMERS == 2 && !STREAM_K && CLUSTER_K == 1 && MCAST == 1 && !SWAP_AB),
              "ping-pong: two consumers taking whole tiles in turn");
static_assert(CLUSTER_K == 1 || (!PARTIALS && CONSUMERS * MW * BN * 128 * 2 <= STAGES * STAGE_BYTES),
              "cluster split-K parks the accumulators in the pipeline's shared memory");

// CUtensorMap's size and alignment, without the driver header.
struct __align__(64) TensorMap {
  unsigned long long opaque[16];
};

__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
  unsigned done;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}
__device__ __forceinline__ void tma_load(unsigned dst, const TensorMap* map, int c0, int c1, unsigned bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
      "[%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}

// The same box into the same shared-memory offset of every block in cta_mask (complete_tx on each one's mbarrier
// at `bar`'s offset).
__device__ __forceinline__ void tma_load_multicast(unsigned dst, const TensorMap* map, int c0, int c1, unsigned bar,
                                                   unsigned short cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster [%0], "
      "[%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
      "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(bar), "h"(cta_mask)
      : "memory");
}
// An arrival on an mbarrier of another block of the cluster (`remote` from mapa). Default (cta-scope) release
// semantics, as CUTLASS's ClusterBarrier::arrive: the wgmma reads it vouches for are complete (wgmma wait_group),
// and a cluster-scope release would also wait for this thread's outstanding global stores on every k step.
__device__ __forceinline__ void mbar_arrive_remote(unsigned remote) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(remote) : "memory");
}

// A wgmma shared-memory matrix descriptor with 128-byte swizzle. K-major tiles are rows of 64 elements
// (128 bytes), 8-row groups 1024 bytes apart (SBO); MN-major tiles are 64x64 boxes of 64 contiguous M/N
// elements per K row, boxes CHUNK_BYTES apart along M/N (LBO), 8-row K groups 1024 bytes apart (SBO).
__device__ __forceinline__ unsigned long long wgmma_desc(unsigned addr, unsigned lbo, unsigned sbo) {
  return static_cast<unsigned long long>((addr & 0x3FFFF) >> 4) |
         (static_cast<unsigned long long>((lbo >> 4) & 0x3FFF) << 16) |
         (static_cast<unsigned long long>((sbo >> 4) & 0x3FFF) << 32) | (1ull << 62);
}
__device__ __forceinline__ unsigned long long desc_a(unsigned stage_a, int row0, int kk) {
  if constexpr (!A_COL) return wgmma_desc(stage_a + row0 * 128 + kk * 32, 16, 1024);
  return wgmma_desc(stage_a + (row0 / 64) * CHUNK_BYTES + kk * 2048, CHUNK_BYTES, 1024);
}
__device__ __forceinline__ unsigned long long desc_b(unsigned stage_b, int kk) {
  if constexpr (B_COL) return wgmma_desc(stage_b + kk * 32, 16, 1024);
  return wgmma_desc(stage_b + kk * 2048, CHUNK_BYTES, 1024);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// kiln_wgmma(d, desc_a, desc_b): d += A . B for one m64n${bn}k16 step (generated for this configuration).
${wgmma}

__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// The address of `local_addr` in the shared memory of cluster block `rank` (a block's window is contiguous).
__device__ __forceinline__ unsigned cluster_addr(unsigned local_addr, unsigned rank) {
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local_addr), "r"(rank));
  return remote;
}
__device__ __forceinline__ float4 ld_cluster_f4(unsigned remote) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(remote)
               : "memory");
  return v;
}

// ------------------------------------------------------------------------------------------------ staged epilogue
// What the tile stores: the epilogue's output type, or raw fp32 for split-K partials.
template <bool P>
struct StoreType {
  typedef kiln_epilogue_out_t type;
};
template <>
struct StoreType<true> {
  typedef float type;
};
typedef typename StoreType<PARTIALS>::type Out;
constexpr int VEC = 16 / sizeof(Out);               // elements per 16-byte unit
constexpr int CHUNK_COLS = EPI_ROW_BYTES / sizeof(Out);  // columns per staged chunk
constexpr int CHUNKS = (BN + CHUNK_COLS - 1) / CHUNK_COLS;
static_assert(!EPI_SMEM || CHUNK_COLS % 8 == 0, "a chunk holds whole 8-column fragment groups");

__device__ __forceinline__ void consumer_bar(int c) {
  asm volatile("bar.sync %0, 128;\n" ::"r"(2 + c) : "memory");  // ids 2, 3: one per consumer warpgroup (1 is the cluster's)
}
// Byte offset of (row, byte `b` of the row) in a staged chunk: 16-byte unit b / 16 XOR row % 8.
__device__ __forceinline__ unsigned epi_offset(int row, int b) {
  return row * EPI_ROW_BYTES + ((((b >> 4) ^ row) & 7) << 4) + (b & 15);
}
template <class T>
__device__ __forceinline__ void st_shared_pair(unsigned addr, T a, T b) {
  if constexpr (sizeof(T) == 2) {
    __align__(4) T v[2] = {a, b};
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(*reinterpret_cast<const unsigned*>(v)) : "memory");
  } else {
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(a), "f"(b) : "memory");
  }
}
// The element the epilogue stores at (row, col), or zero outside [m, n) (never stored; no bias or residual read).
__device__ __forceinline__ Out epi_value(const KilnGemmArgs& args, int row, int col, float v) {
  if (row >= args.m || col >= args.n) return kiln_from_f32<Out>(0.f);
  if constexpr (PARTIALS) {
    return v;
  } else {
    return kiln_epilogue_cast(kiln_epilogue(v, row, col, args.ep));
  }
}

// Consumer c's WG_M x BN tile at (m0 + c * WG_M, n0): per chunk of CHUNK_COLS columns, the warpgroup writes its
// fragments to its staging rows, then each thread writes 16-byte units of whole rows (8 threads per 128-byte
// row segment: one coalesced transaction per row) to D, or to workspace slice z for partials.
template <int MWT, int NACC>
__device__ __forceinline__ void store_tile_staged(const KilnGemmArgs& args, const float (&acc)[MWT][NACC], int z,
                                                 int m0, int n0, int c, unsigned stage_base) {
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  Out* out;
  long long ld;
  if constexpr (PARTIALS) {
    out = reinterpret_cast<Out*>(args.workspace + static_cast<long long>(z) * args.m * args.n);  // Out is float
    ld = args.n;
  } else {
    out = static_cast<Out*>(args.d);
    ld = args.ldd;
  }
  // 16-byte stores need a 16-byte aligned D and rows that keep it so.
  const bool vec_ok = (reinterpret_cast<unsigned long long>(out) % 16 == 0) && (ld % VEC == 0);
  const int row0 = m0 + c * C_ROWS;
#pragma unroll
  for (int ch = 0; ch < CHUNKS; ++ch) {
    const int col0 = n0 + ch * CHUNK_COLS;
    consumer_bar(c);  // the previous chunk (or tile) has been read out of the buffer
#pragma unroll
    for (int mi = 0; mi < MWT; ++mi) {
      const int r = mi * 64 + warp * 16 + lane / 4;
#pragma unroll
      for (int jj = 0; jj < CHUNK_COLS / 8; ++jj) {
        const int j = ch * (CHUNK_COLS / 8) + jj;
        if (j < BN / 8) {
          const int cc = jj * 8 + 2 * (lane % 4);  // column in the chunk
          const int b = cc * static_cast<int>(sizeof(Out));
          st_shared_pair(stage_base + epi_offset(r, b), epi_value(args, row0 + r, col0 + cc, acc[mi][4 * j]),
                         epi_value(args, row0 + r, col0 + cc + 1, acc[mi][4 * j + 1]));
          st_shared_pair(stage_base + epi_offset(r + 8, b), epi_value(args, row0 + r + 8, col0 + cc, acc[mi][4 * j + 2]),
                         epi_value(args, row0 + r + 8, col0 + cc + 1, acc[mi][4 * j + 3]));
        }
      }
    }
    consumer_bar(c);  // the chunk is complete
    const int width = min(CHUNK_COLS, BN - ch * CHUNK_COLS);  // a multiple of 8 columns
    const int unit = tid % 8, cc = unit * VEC, col = col0 + cc;
#pragma unroll 4
    for (int r = tid / 8; r < WG_M; r += 16) {
      const int row = row0 + r;
      if (row >= args.m || cc >= width || col >= args.n) continue;
      uint4 v;
      asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                   : "r"(stage_base + epi_offset(r, unit * 16))
                   : "memory");
      Out* p = out + static_cast<long long>(row) * ld + col;
      if (vec_ok && col + VEC <= args.n) {
        *reinterpret_cast<uint4*>(p) = v;
      } else {
        const Out* e = reinterpret_cast<const Out*>(&v);
#pragma unroll
        for (int i = 0; i < VEC; ++i)
          if (col + i < args.n) p[i] = e[i];
      }
    }
  }
}

enum class Role { full, contribute, finish };
struct Work {
  int z, m0, n0, k_begin, k_blocks;
  Role role;
  int pieces;  // stream-K: the K pieces of the tile (a finisher adds pieces 1.. from blocks blockIdx.x + j * step)
  int step;
};
// Work unit w: a tile (and, for split-K partials, a K slice z); with CLUSTER_K > 1, cluster block w % CLUSTER_K
// takes its share of the tile's K blocks.
__device__ __forceinline__ Work work_of(const KilnGemmArgs& args, int w, int tiles_m, int tiles_n) {
  Work r;
  r.role = Role::full;
  r.pieces = 1;
  r.step = 0;
  if constexpr (MCAST == 2) {
    // Work unit w: block w % 2 of the pair w / 2, which covers tile columns 2p and 2p + 1 of one tile row.
    const int pairs_n = (tiles_n + 1) / 2, per_slice = tiles_m * pairs_n, pair = w / 2;
    r.z = pair / per_slice;
    int tm, tp;
    kiln_tile_of(pair - r.z * per_slice, tiles_m, pairs_n, GROUP_M, tm, tp);
    r.m0 = tm * BM;
    r.n0 = (2 * tp + (w & 1)) * BN;
    int k_end;
    kiln_k_range(args, r.z, r.k_begin, k_end);
    r.k_blocks = (k_end - r.k_begin + BK - 1) / BK;
    return r;
  }
  int tile = w, part = 0;
  if constexpr (CLUSTER_K > 1) {
    tile = w / CLUSTER_K;
    part = w % CLUSTER_K;
  }
  const int per_slice = tiles_m * tiles_n;
  r.z = tile / per_slice;
  int tm, tn;
  kiln_tile_of(tile - r.z * per_slice, tiles_m, tiles_n, GROUP_M, tm, tn);
  r.m0 = tm * BM;
  r.n0 = tn * BN;
  int k_end;
  kiln_k_range(args, r.z, r.k_begin, k_end);
  r.k_blocks = (k_end - r.k_begin + BK - 1) / BK;
  if constexpr (CLUSTER_K > 1) {
    const int per = (r.k_blocks + CLUSTER_K - 1) / CLUSTER_K;
    const int first = min(part * per, r.k_blocks);
    r.k_begin += first * BK;
    r.k_blocks = min(per, r.k_blocks - first);
  }
  return r;
}

// Stream-K's plan over the grid's G blocks: the whole waves of tiles first (block b takes tiles b, b + G, ...), then
// the R tiles of the partial wave, each split into P = min(G / R, K blocks / 4) pieces along K; block j * R + r takes
// piece j of tail tile r. The pieces all run in that last wave, piece j of every tile over the same K range, so
// tiles that share an A or B panel read it from L2 together (pieces of one tile at staggered K offsets, as in a
// free-running stream-K split, measured up to 1.9x slower on an H200: each tile pulled its panels from DRAM).
struct SkPlan {
  int tiles, kpt, whole, rest, pieces, blocks;
};
__device__ __forceinline__ SkPlan sk_plan(const KilnGemmArgs& args, int tiles) {
  SkPlan p;
  p.tiles = tiles;
  p.kpt = (args.k + BK - 1) / BK;
  p.blocks = gridDim.x;
  p.rest = tiles % p.blocks;
  p.whole = tiles - p.rest;
  p.pieces = p.rest == 0 ? 1 : min(p.blocks / p.rest, max(1, p.kpt / 4));
  return p;
}
__device__ __forceinline__ Work tile_work(int tile, int tiles_m, int tiles_n, int kb0, int kb1, Role role, int pieces,
                                          int step) {
  Work r;
  int tm, tn;
  kiln_tile_of(tile, tiles_m, tiles_n, GROUP_M, tm, tn);
  r.z = 0;
  r.m0 = tm * BM;
  r.n0 = tn * BN;
  r.k_begin = kb0 * BK;
  r.k_blocks = kb1 - kb0;
  r.role = role;
  r.pieces = pieces;
  r.step = step;
  return r;
}
// This block's work units, in the order the producer loads and the consumers compute them.
class Units {
 public:
  __device__ __forceinline__ Units(const KilnGemmArgs& args, int tiles_m, int tiles_n, int total)
      : args_(args), tiles_m_(tiles_m), tiles_n_(tiles_n), total_(total), w_(blockIdx.x) {
    if constexpr (SK_EVEN) w_ = even_start(blockIdx.x);  // the iteration this block starts at
  }
  __device__ __forceinline__ bool next(Work& r) {
    if constexpr (SK_EVEN) {
      const int kpt = (args_.k + BK - 1) / BK;
      const int end = even_start(blockIdx.x + 1);
      if (w_ >= end) return false;
      const int tile = w_ / kpt, kb0 = w_ - tile * kpt, kb1 = min(kpt, end - tile * kpt);
      Role role = Role::full;
      int pieces = 1;
      if (kb0 > 0) {
        role = Role::contribute;
      } else if (kb1 < kpt) {
        // The blocks up to the owner of the tile's last iteration e - 1, the largest b with b T / G <= e - 1.
        role = Role::finish;
        const long long e = static_cast<long long>(tile + 1) * kpt, g = gridDim.x;
        pieces = static_cast<int>((e * g - 1) / even_total()) - static_cast<int>(blockIdx.x) + 1;
      }
      r = tile_work(tile, tiles_m_, tiles_n_, kb0, kb1, role, pieces, 1);
      w_ = tile * kpt + kb1;
      return true;
    } else if constexpr (STREAM_K) {
      // The plan is recomputed per unit rather than kept: fewer registers live across the mainloop.
      if (w_ < 0) return false;  // the tail unit was taken
      const SkPlan p = sk_plan(args_, tiles_m_ * tiles_n_);
      if (w_ < p.whole) {
        r = tile_work(w_, tiles_m_, tiles_n_, 0, p.kpt, Role::full, 1, 0);
        w_ += p.blocks;
        return true;
      }
      // The tail: at most one unit per block, past the whole tiles.
      const int u = static_cast<int>(blockIdx.x);
      w_ = -1;
      if (u >= p.rest * p.pieces) return false;
      const int j = u / p.rest, tile = p.whole + u % p.rest;
      const int kb0 = static_cast<int>(static_cast<long long>(j) * p.kpt / p.pieces);
      const int kb1 = static_cast<int>(static_cast<long long>(j + 1) * p.kpt / p.pieces);
      const Role role = p.pieces == 1 ? Role::full : (j == 0 ? Role::finish : Role::contribute);
      r = tile_work(tile, tiles_m_, tiles_n_, kb0, kb1, role, p.pieces, p.rest);
      return true;
    } else {
      if (w_ >= total_) return false;
      r = work_of(args_, w_, tiles_m_, tiles_n_);
      w_ += gridDim.x;
      return true;
    }
  }

 private:
  // sk_even: all the tiles' K iterations, and where block b's share starts (launch_gemm() keeps both < 2^31).
  __device__ __forceinline__ long long even_total() const {
    return static_cast<long long>(tiles_m_) * tiles_n_ * ((args_.k + BK - 1) / BK);
  }
  __device__ __forceinline__ int even_start(unsigned b) const {
    return static_cast<int>(static_cast<long long>(b) * even_total() / gridDim.x);
  }
  const KilnGemmArgs& args_;
  int tiles_m_, tiles_n_, total_, w_;
};

__device__ __forceinline__ float4* sk_slot(const KilnGemmArgs& args, int block) {
  return reinterpret_cast<float4*>(reinterpret_cast<unsigned char*>(args.workspace) + SK_FLAG_BYTES) +
         static_cast<long long>(block) * (BM * BN / 4);
}
// The float4 of consumer thread (c, tid) for accumulators (mi, 4j..4j+3) in a slot: thread order, so coalesced.
__device__ __forceinline__ int sk_index(int c, int mi, int j, int tid) { return ((c * MW + mi) * (BN / 8) + j) * 128 + tid; }

}  // namespace

extern "C" __global__ void __launch_bounds__(THREADS, BLOCKS_PER_SM)
    kiln_gemm_wgmma_sm90(const KilnGemmArgs args, const __grid_constant__ TensorMap tma_a,
                         const __grid_constant__ TensorMap tma_b, unsigned* const sk_flags) {
  extern __shared__ unsigned char smem_raw[];
  // 128-byte swizzled TMA boxes need 1024-byte aligned destinations.
  const unsigned base = (kiln_smem_addr(smem_raw) + 1023u) & ~1023u;
  const unsigned full_bar = base + STAGES * STAGE_BYTES;  // STAGES mbarriers: the stage holds data
  const unsigned empty_bar = full_bar + STAGES * 8;       // STAGES mbarriers: the consumers are done with it
  const unsigned epi_base = full_bar + BARRIER_BYTES;     // the staged epilogue's buffers (EPI_BYTES)
  const int wg = threadIdx.x / 128;

  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full_bar + 8 * s, 1);
      // One arrival per warp of the consumers that read a stage (of both blocks); ping-pong: one consumer.
      mbar_init(empty_bar + 8 * s, (PINGPONG ? 1 : CONSUMERS) * 4 * MCAST);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  }
  if constexpr (MCAST > 1) {
    cluster_sync();  // the peer's barriers exist before anything is multicast or arrives on them
  } else {
    __syncthreads();
  }
  // Everything above overlaps the previous kernel's tail under programmatic launch; nothing before touches global
  // memory (the tensor maps are kernel parameters). By default (trigger exit) the next kernel launches as this
  // one's blocks exit. Measured on the suite (H200, 111 shapes, same run): for one block per SM triggering at the
  // start gains no more (median 0.985 of the time without the attribute on kernels under 40 us, 0.984 without a
  // trigger) and triggering after the last load made single configurations up to 17% slower (waiting blocks
  // parked on SMs).
  const int tiles_m = (args.m + BM - 1) / BM, tiles_n = (args.n + BN - 1) / BN;
  const int slices = PARTIALS ? args.split_k : 1;
  const int total = (MCAST == 2 ? 2 * tiles_m * ((tiles_n + 1) / 2) : tiles_m * tiles_n) * slices * CLUSTER_K;
  // The kernel's A box(es) of one stage: the weights, with swap_ab.
  auto load_a = [&](unsigned sa, int k, int m0, unsigned full) {
    if constexpr (!A_COL) {
      tma_load(sa, &tma_a, k, m0, full);
    } else {
#pragma unroll
      for (int j = 0; j < BM / 64; ++j) tma_load(sa + j * CHUNK_BYTES, &tma_a, m0 + 64 * j, k, full);
    }
  };
  int early = 0;  // K blocks of the producer's first unit whose A was requested before the wait
  if constexpr (TRIGGER == Trigger::start) kiln_allow_next_grid();
  if constexpr (EARLY > 0) {
    if (threadIdx.x == 0 && (args.flags & KILN_GEMM_B_CONSTANT)) {
      Units units(args, tiles_m, tiles_n, total);
      Work wk;
      if (units.next(wk)) {
        early = min(EARLY, wk.k_blocks);
        for (int s = 0; s < early; ++s) {
          mbar_expect_tx(full_bar + 8 * s, STAGE_BYTES);
          load_a(base + s * STAGE_BYTES, wk.k_begin + s * BK, wk.m0, full_bar + 8 * s);
        }
      }
    }
  }
  kiln_wait_prior_grid();
  // mcast: this block's rank in its pair (the grid is even, so w % 2 == blockIdx.x % 2 for every work unit).
  const unsigned peer = (blockIdx.x & 1) ^ 1;

  if (wg == 0) {
    // One block per SM: registers move from the producer to the consumers. Two per SM: everyone keeps the
    // 128 the launch bound allows (the small tiles this is for need no more).
    if constexpr (BLOCKS_PER_SM == 1) asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    if (threadIdx.x == 0) {
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<unsigned long long>(&tma_a)) : "memory");
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<unsigned long long>(&tma_b)) : "memory");
      int stage = 0;
      unsigned phase = 0;
      Units units(args, tiles_m, tiles_n, total);
      for (Work wk; units.next(wk); early = 0) {
        for (int kb = 0; kb < wk.k_blocks; ++kb) {
          const unsigned full = full_bar + 8 * stage;
          const unsigned sa = base + stage * STAGE_BYTES, sb = sa + A_STAGE_BYTES;
          const int k = wk.k_begin + kb * BK;
          // The first unit's first `early` stages are fresh and expect their bytes already: only B is missing.
          if (kb >= early) {
            mbar_wait(empty_bar + 8 * stage, phase ^ 1);
            mbar_expect_tx(full, STAGE_BYTES);
            if constexpr (MCAST == 2) {
              // This block's half of A, into both blocks (the tensor map's box is BM / 2 rows when K-major).
              const int half = static_cast<int>(peer ^ 1);
              if constexpr (!A_COL) {
                tma_load_multicast(sa + half * (A_STAGE_BYTES / 2), &tma_a, k, wk.m0 + half * (BM / 2), full, 3);
              } else {
#pragma unroll
                for (int j = half * (BM / 128); j < (half + 1) * (BM / 128); ++j)
                  tma_load_multicast(sa + j * CHUNK_BYTES, &tma_a, wk.m0 + 64 * j, k, full, 3);
              }
            } else {
              load_a(sa, k, wk.m0, full);
            }
          }
          if constexpr (B_COL) {
            tma_load(sb, &tma_b, k, wk.n0, full);
          } else {
#pragma unroll
            for (int j = 0; j < BN / 64; ++j) tma_load(sb + j * CHUNK_BYTES, &tma_b, wk.n0 + 64 * j, k, full);
          }
          if (++stage == STAGES) {
            stage = 0;
            phase ^= 1;
          }
        }
      }
      if constexpr (TRIGGER == Trigger::tail) kiln_allow_next_grid();  // (one thread stands for its block)
    }
    if constexpr (CLUSTER_K > 1) {  // the consumers' two cluster barriers need every thread of the cluster
      cluster_sync();
      cluster_sync();
    }
  } else {
    if constexpr (BLOCKS_PER_SM == 1) asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
    const int c = wg - 1;
    const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
    int stage = 0;
    unsigned phase = 0;
    // A stage is free again for this block's producer, and with mcast for the peer's (which writes its half of A
    // into this block's stage).
    auto release = [&](int s) {
      mbar_arrive(empty_bar + 8 * s);
      if constexpr (MCAST > 1) mbar_arrive_remote(cluster_addr(empty_bar + 8 * s, peer));
    };
    float acc[MW][BN / 2];
    Units units(args, tiles_m, tiles_n, total);
    int unit = 0;  // ping-pong: consumer unit % 2 takes the block's unit `unit`
    for (Work wk; units.next(wk); ++unit) {
      if constexpr (PINGPONG) {
        if ((unit & 1) != c) {
          // The other consumer's tile: step over its stages in the ring.
          const int ahead = stage + wk.k_blocks;
          phase ^= static_cast<unsigned>(ahead / STAGES) & 1u;
          stage = ahead % STAGES;
          continue;
        }
        // Mainloops take turns (the other consumer's epilogue runs under this one's MMAs), and this consumer's
        // parity waits never run more than one phase ahead of the ring: the first unit needs no turn.
        if (unit > 0) asm volatile("bar.sync %0, 256;\n" ::"r"(4 + c) : "memory");
      }
#pragma unroll
      for (int mi = 0; mi < MW; ++mi)
#pragma unroll
        for (int j = 0; j < BN / 2; ++j) acc[mi][j] = 0.f;

      int prev = -1;
      for (int kb = 0; kb < wk.k_blocks; ++kb) {
        mbar_wait(full_bar + 8 * stage, phase);
        const unsigned sa = base + stage * STAGE_BYTES, sb = sa + A_STAGE_BYTES;
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {
#pragma unroll
          for (int mi = 0; mi < MW; ++mi) kiln_wgmma(acc[mi], desc_a(sa, c * C_ROWS + mi * 64, kk), desc_b(sb, kk));
        }
        wgmma_commit();
        // Keep this stage's wgmmas in flight; the previous stage's are done, so its buffers can be refilled.
        wgmma_wait<1>();
        if (prev >= 0 && lane == 0) release(prev);
        prev = stage;
        if (++stage == STAGES) {
          stage = 0;
          phase ^= 1;
        }
      }
      wgmma_wait<0>();
      if (prev >= 0 && lane == 0) release(prev);
      if constexpr (PINGPONG) asm volatile("bar.arrive %0, 256;\n" ::"r"(4 + (c ^ 1)) : "memory");  // its turn

      if constexpr (CLUSTER_K > 1) {
        // Every block of the cluster parks its accumulators in its (now idle) pipeline memory, as float4s in
        // thread order; the first block adds the others' over distributed shared memory.
        unsigned rank;
        asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
        asm volatile("bar.sync 1, %0;\n" ::"n"(CONSUMERS * 128) : "memory");  // all wgmma reads of the ring done
        const unsigned park = base + c * (MW * BN * 128 * 2);
        if (rank != 0) {
#pragma unroll
          for (int mi = 0; mi < MW; ++mi)
#pragma unroll
            for (int j = 0; j < BN / 8; ++j) {
              const unsigned a = park + ((mi * (BN / 8) + j) * 128 + tid) * 16;
              asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "f"(acc[mi][4 * j]),
                           "f"(acc[mi][4 * j + 1]), "f"(acc[mi][4 * j + 2]), "f"(acc[mi][4 * j + 3])
                           : "memory");
            }
        }
        cluster_sync();
        if (rank == 0) {
#pragma unroll 1  // (left to its own heuristics ptxas partially unrolls this and spills a register)
          for (unsigned r = 1; r < CLUSTER_K; ++r) {
            // One mapa per block; the loads take constant offsets from it (few live address registers next to
            // the accumulators).
            const unsigned remote = cluster_addr(park + tid * 16, r);
#pragma unroll
            for (int mi = 0; mi < MW; ++mi)
#pragma unroll
              for (int j = 0; j < BN / 8; ++j) {
                const float4 v = ld_cluster_f4(remote + (mi * (BN / 8) + j) * 128 * 16);
                acc[mi][4 * j] += v.x;
                acc[mi][4 * j + 1] += v.y;
                acc[mi][4 * j + 2] += v.z;
                acc[mi][4 * j + 3] += v.w;
              }
          }
        }
        cluster_sync();  // the others' shared memory stays alive until the first block has read it
        if (rank != 0) continue;
      }

      if constexpr (STREAM_K) {
        if (wk.role == Role::contribute) {
          // Park the partial in this block's slot, then raise its flag once every consumer's stores are done.
          float4* mine = sk_slot(args, blockIdx.x) + sk_index(c, 0, 0, tid);
#pragma unroll
          for (int mi = 0; mi < MW; ++mi)
#pragma unroll
            for (int j = 0; j < BN / 8; ++j)
              asm volatile("st.global.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(mine + (mi * (BN / 8) + j) * 128),
                           "f"(acc[mi][4 * j]), "f"(acc[mi][4 * j + 1]), "f"(acc[mi][4 * j + 2]), "f"(acc[mi][4 * j + 3])
                           : "memory");
          asm volatile("bar.sync 1, %0;\n" ::"n"(CONSUMERS * 128) : "memory");
          if (c == 0 && tid == 0) {
            asm volatile("fence.acq_rel.gpu;\nst.relaxed.gpu.global.u32 [%0], 1;\n" ::"l"(sk_flags + blockIdx.x)
                         : "memory");
          }
          continue;
        }
        if (wk.role == Role::finish) {
          // Add the tile's other pieces in piece order (a fixed sum order, run to run). This thread's float4s of a
          // slot sit 128 apart from its first (sk_index); the slots of successive pieces `step` blocks apart.
          const float4* mine = sk_slot(args, blockIdx.x + wk.step) + sk_index(c, 0, 0, tid);
          const long long stride = static_cast<long long>(wk.step) * (BM * BN / 4);
#pragma unroll 1
          for (int piece = 1; piece < wk.pieces; ++piece, mine += stride) {
            if (c == 0 && tid == 0) {
              unsigned* const flag = sk_flags + blockIdx.x + piece * wk.step;
              unsigned ready;
              do {
                asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(ready) : "l"(flag) : "memory");
              } while (ready == 0);
              // This finisher is the flag's only reader and its contributor raises it once per launch: lowered
              // here, it is lowered for the next launch, which the stream orders after this one.
              asm volatile("st.relaxed.gpu.global.u32 [%0], 0;\n" ::"l"(flag) : "memory");
            }
            asm volatile("bar.sync 1, %0;\n" ::"n"(CONSUMERS * 128) : "memory");
#pragma unroll
            for (int mi = 0; mi < MW; ++mi)
#pragma unroll
              for (int j = 0; j < BN / 8; ++j) {
                float4 v;  // through L2 (.cg): L1 is not coherent with the other SMs' stores
                asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                             : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                             : "l"(mine + (mi * (BN / 8) + j) * 128)
                             : "memory");
                acc[mi][4 * j] += v.x;
                acc[mi][4 * j + 1] += v.y;
                acc[mi][4 * j + 2] += v.z;
                acc[mi][4 * j + 3] += v.w;
              }
          }
        }
      }

      if constexpr (EPI_SMEM) {
        store_tile_staged(args, acc, wk.z, wk.m0, wk.n0, c, epi_base + c * (EPI_BYTES / CONSUMERS));
      } else {
        // Accumulator layout of m64nNk16: warp w of the warpgroup holds rows 16w + lane/4 (+ 8), and
        // columns 8j + 2 (lane % 4) (+ 1) in registers 4j (+ 1) and, for the row + 8, 4j + 2 (+ 1).
#pragma unroll
        for (int mi = 0; mi < MW; ++mi) {
          const int row = wk.m0 + c * C_ROWS + mi * 64 + warp * 16 + lane / 4;
#pragma unroll
          for (int j = 0; j < BN / 8; ++j) {
            const int col = wk.n0 + j * 8 + 2 * (lane % 4);
            if constexpr (SWAP_AB) {
              kiln_gemm_store2_transposed<PARTIALS>(args, wk.z, row, col, acc[mi][4 * j], acc[mi][4 * j + 1]);
              kiln_gemm_store2_transposed<PARTIALS>(args, wk.z, row + 8, col, acc[mi][4 * j + 2], acc[mi][4 * j + 3]);
            } else {
              kiln_gemm_store2<PARTIALS>(args, wk.z, row, col, acc[mi][4 * j], acc[mi][4 * j + 1]);
              kiln_gemm_store2<PARTIALS>(args, wk.z, row + 8, col, acc[mi][4 * j + 2], acc[mi][4 * j + 3]);
            }
          }
        }
      }
    }
    // Ping-pong: the last mainloop's arrival has no taker; take it so that no barrier is left half arrived.
    if constexpr (PINGPONG) {
      if (unit > 0 && ((unit - 1) & 1) != c) asm volatile("bar.sync %0, 256;\n" ::"r"(4 + c) : "memory");
    }
  }
  if constexpr (MCAST > 1) cluster_sync();  // no block leaves while its peer may still arrive on or write into it
}
