// kiln template: ${if fused}all-reduce + residual add + RMSNorm${else}all-reduce${endif} (sum) across ${world} ranks, ${dtype.name}.
${if fused}
//   h = sum over ranks of x_r[row, :] + residual[row, :]  (written to residual_out)
//   y[row, :] = h / sqrt(mean(h^2) + eps) * weight        (fp32 statistics)
// One row per block at a time (rows strided by the grid); rows of up to ${threads} * ${vec} * ${items} columns.
${else}
${if twoshot}
// Two-shot: rank r sums chunk r of every rank's input (data: staging buffers or symmetric tensors; reduce-scatter,
// remote reads), writes the sum to its own output and into chunk r of every peer's gather buffer (the all-gather
// as remote writes, which travel the other direction of each link); after one barrier every rank copies the
// peers' chunks out of its own gather buffer, or nothing when that is its output (in place). gather is data
// itself, except for a symmetric input reduced out of place, which must not be overwritten: then it is the
// staging buffers. Each rank reads and writes (world - 1) / world of the data remotely.
${endif}
${if push2}
// Two-shot push (writes only; in-place calls on peer-mapped tensors): rank r writes chunk c of its input into its
// slot of rank c's push area, meets the others, sums chunk r (its own input and the peers' slots) and writes the
// sum into chunk r of every rank's tensor, then meets them again. Each rank writes 2 (world - 1) / world of the
// data remotely and reads nothing remotely: posted writes move more bytes per second over NVLink than the
// read-based two-shot's mix of remote reads and writes. The slots alternate by launch parity as in the push.
${endif}
${if push}
// One-shot push: every rank writes its input (read where the caller has it) into its slot of every rank's push
// area (remote writes, posted), meets the others once, then sums the world slots in its own memory. The slots
// alternate between two sets by launch parity, so a rank may start writing the next launch's data while a slow
// peer still reads this one's: no second barrier.
${endif}
${if !twoshot}
${if !push}
${if !push2}
// One-shot: every rank reads all ranks' staging buffers and sums them. Each rank moves (world - 1) x the data;
// the fewest steps, so the lowest latency for small messages.
${endif}
${endif}
${endif}
${endif}
// Synchronisation is per block index: block b of every rank signals block b of every other rank and waits for
// theirs (acquire/release at system scope), so no grid-wide barrier is needed. The same partition of elements
// to blocks is used in every phase, so block b only ever reads what the peers' blocks b produced. Every rank
// must launch the same configuration in the same order (the epochs count launches per block index).
// Sums are taken over ranks in rank order on every rank, so all ranks get bit-identical results.
#include "common/kiln_device.cuh"
#include "kiln/templates/kernel_args.h"

typedef ${dtype} T;
constexpr int kWorld = ${world};
constexpr int kVec = ${vec};
constexpr int kThreads = ${threads};
constexpr bool kTwoShot = ${twoshot};
constexpr bool kPush = ${push};
constexpr bool kPush2 = ${push2};
constexpr bool kFused = ${fused};
constexpr int kItems = ${items};
typedef KilnVec<T, kVec> V;

__device__ __forceinline__ void kiln_st_release_sys(unsigned* p, unsigned v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned kiln_ld_acquire_sys(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Block `blockIdx.x` of every rank meets here at `phase` of launch `epoch`. The data a rank wrote before the
// barrier (its staging, or its reduced chunk) is visible to the peers after it.
__device__ __forceinline__ void kiln_ar_barrier(const KilnAllReduceArgs& a, int phase, unsigned epoch) {
  __syncthreads();
  if (threadIdx.x < kWorld) {
    const int slot = KILN_AR_MAX_BLOCKS + (phase * KILN_AR_MAX_BLOCKS + blockIdx.x) * KILN_AR_MAX_RANKS;
    __threadfence_system();
    kiln_st_release_sys(a.signals[threadIdx.x] + slot + a.rank, epoch);
    const unsigned* mine = a.signals[a.rank] + slot + threadIdx.x;
    // A peer is never a whole launch ahead at the same phase: wait until it reached `epoch`.
    while ((int)(kiln_ld_acquire_sys(mine) - epoch) < 0) {
    }
  }
  __syncthreads();
}

// Loads from peer-mapped memory go to L2 only (.cg): L1 is not coherent with the peers' writes, and in the
// two-shot all-gather a peer's chunk was written during this same launch.
__device__ __forceinline__ V kiln_ar_load(const T* p) {
  V out;
  if constexpr (sizeof(V) == 16) {
    uint4 r = __ldcg(reinterpret_cast<const uint4*>(p));
    out = *reinterpret_cast<V*>(&r);
  } else if constexpr (sizeof(V) == 8) {
    uint2 r = __ldcg(reinterpret_cast<const uint2*>(p));
    out = *reinterpret_cast<V*>(&r);
  } else if constexpr (sizeof(V) == 4) {
    unsigned r = __ldcg(reinterpret_cast<const unsigned*>(p));
    out = *reinterpret_cast<V*>(&r);
  } else {
    out = *reinterpret_cast<const V*>(p);
  }
  return out;
}

// Sum of vector `i` over every rank's buffer, in rank order.
__device__ __forceinline__ void kiln_ar_sum(const KilnAllReduceArgs& a, long long i, float (&acc)[kVec]) {
#pragma unroll
  for (int j = 0; j < kVec; ++j) acc[j] = 0.f;
#pragma unroll
  for (int r = 0; r < kWorld; ++r) {
    V v = kiln_ar_load(static_cast<const T*>(a.data[r]) + i * kVec);
#pragma unroll
    for (int j = 0; j < kVec; ++j) acc[j] += kiln_to_f32(v.v[j]);
  }
}

// algo=push: sum of vector `i` over the world slots of this launch's set in this rank's own push area.
__device__ __forceinline__ void kiln_ar_sum_pushed(const KilnAllReduceArgs& a, long long set, long long i,
                                                   float (&acc)[kVec]) {
  const T* area = static_cast<const T*>(a.push[a.rank]);
#pragma unroll
  for (int j = 0; j < kVec; ++j) acc[j] = 0.f;
#pragma unroll
  for (int r = 0; r < kWorld; ++r) {
    V v = kiln_ar_load(area + (set + r) * a.slot + i * kVec);
#pragma unroll
    for (int j = 0; j < kVec; ++j) acc[j] += kiln_to_f32(v.v[j]);
  }
}

// algo=push: vector `i` of this rank's input, written into its slot of every rank's push area.
__device__ __forceinline__ void kiln_ar_push(const KilnAllReduceArgs& a, long long set, long long i) {
  V v = kiln_load_vec<T, kVec>(static_cast<const T*>(a.in) + i * kVec);
#pragma unroll
  for (int r = 0; r < kWorld; ++r) kiln_store_vec(static_cast<T*>(a.push[r]) + (set + a.rank) * a.slot + i * kVec, v);
}

// Staged calls (a.in set, not algo=push): this block copies into this rank's staging exactly the elements that the
// same block index of every rank reads after the first barrier, so that per-block barrier also publishes the copy
// and the call needs no separate copy launch. The partitions below are the ones the phases use.
__device__ __forceinline__ void kiln_ar_copy_in(const KilnAllReduceArgs& a) {
  const T* in = static_cast<const T*>(a.in);
  T* mine = static_cast<T*>(a.data[a.rank]);
  if constexpr (kFused) {
    for (int row = blockIdx.x; row < a.rows; row += gridDim.x) {
      for (int col = threadIdx.x * kVec; col < a.cols; col += kThreads * kVec) {
        const long long e = (long long)row * a.cols + col;
        kiln_store_vec(mine + e, kiln_load_vec<T, kVec>(in + e));
      }
    }
  } else {
    const long long nvec = a.count / kVec;
    const long long stride = (long long)gridDim.x * kThreads;
    const long long t0 = (long long)blockIdx.x * kThreads + threadIdx.x;
    if constexpr (kTwoShot) {
      // Chunk c is reduced by rank c with offsets relative to the chunk's start: copy every chunk's share.
      const long long chunk = (nvec + kWorld - 1) / kWorld;
#pragma unroll
      for (int c = 0; c < kWorld; ++c) {
        const long long begin = c * chunk, end = begin + chunk < nvec ? begin + chunk : nvec;
        for (long long i = begin + t0; i < end; i += stride) {
          kiln_store_vec(mine + i * kVec, kiln_load_vec<T, kVec>(in + i * kVec));
        }
      }
    } else {
      for (long long i = t0; i < nvec; i += stride) kiln_store_vec(mine + i * kVec, kiln_load_vec<T, kVec>(in + i * kVec));
    }
  }
}

__device__ __forceinline__ V kiln_ar_pack(const float (&acc)[kVec]) {
  V o;
#pragma unroll
  for (int j = 0; j < kVec; ++j) o.v[j] = kiln_from_f32<T>(acc[j]);
  return o;
}

// Programmatic dependent launch (the runtime launches these kernels with it on sm_90+, see kiln_device.cuh): back-to-back
// eager calls do not pay the launch latency between them; the wait makes the input, the last launch's epochs and
// signals visible.
extern "C" __global__ void __launch_bounds__(kThreads) kiln_allreduce(const KilnAllReduceArgs a) {
  kiln_wait_prior_grid();
  kiln_allow_next_grid();
  __shared__ unsigned epoch_s;
  unsigned* my_epoch = a.signals[a.rank] + blockIdx.x;
  if (threadIdx.x == 0) epoch_s = *my_epoch + 1;
  __syncthreads();
  const unsigned epoch = epoch_s;

  if constexpr (!kPush && !kPush2) {
    if (a.in) kiln_ar_copy_in(a);  // a staged call: its input into this rank's staging, no copy launch
    kiln_ar_barrier(a, 0, epoch);  // every rank's staging (or symmetric input) holds its input
  }

  const long long set = (long long)(epoch & 1u) * kWorld;  // algo=push's slot set for this launch

  if constexpr (kFused) {
    __shared__ float scratch[kThreads / 32];
    const int cols = a.cols;
    if constexpr (kPush) {
      // This block's rows go to every rank; the same block index reads them back after the barrier.
      for (int row = blockIdx.x; row < a.rows; row += gridDim.x) {
        for (int col = threadIdx.x * kVec; col < cols; col += kThreads * kVec) {
          kiln_ar_push(a, set, ((long long)row * cols + col) / kVec);
        }
      }
      kiln_ar_barrier(a, 0, epoch);
    }
    const T* res = static_cast<const T*>(a.residual);
    T* res_out = static_cast<T*>(a.residual_out);
    T* y = static_cast<T*>(a.out);
    const T* w = static_cast<const T*>(a.weight);
    for (int row = blockIdx.x; row < a.rows; row += gridDim.x) {
      float h[kItems][kVec];
      float sq = 0.f;
#pragma unroll
      for (int it = 0; it < kItems; ++it) {
        const int col = (it * kThreads + threadIdx.x) * kVec;
        if (col < cols) {
          const long long e = (long long)row * cols + col;
          if constexpr (kPush) kiln_ar_sum_pushed(a, set, e / kVec, h[it]);
          else kiln_ar_sum(a, e / kVec, h[it]);
          V rv = kiln_load_vec<T, kVec>(res + e);
#pragma unroll
          for (int j = 0; j < kVec; ++j) {
            // h is rounded to the dtype, as the unfused pair (all-reduce output, then the norm's residual add)
            // and the residual stream it becomes would round it.
            h[it][j] = kiln_to_f32(kiln_from_f32<T>(kiln_to_f32(kiln_from_f32<T>(h[it][j])) + kiln_to_f32(rv.v[j])));
            sq += h[it][j] * h[it][j];
          }
          kiln_store_vec(res_out + e, kiln_ar_pack(h[it]));
        }
      }
      sq = kiln_group_sum<kThreads / 32>(sq, scratch, 0);
      const float inv = rsqrtf(sq / (float)cols + a.eps);
#pragma unroll
      for (int it = 0; it < kItems; ++it) {
        const int col = (it * kThreads + threadIdx.x) * kVec;
        if (col < cols) {
          V wv = kiln_load_vec<T, kVec>(w + col);
          float o[kVec];
#pragma unroll
          for (int j = 0; j < kVec; ++j) o[j] = h[it][j] * inv * kiln_to_f32(wv.v[j]);
          kiln_store_vec(y + (long long)row * cols + col, kiln_ar_pack(o));
        }
      }
    }
    if constexpr (!kPush) kiln_ar_barrier(a, 1, epoch);  // no rank reuses its staging before every peer read it
  } else if constexpr (!kTwoShot && !kPush && !kPush2) {
    const long long nvec = a.count / kVec;
    T* out = static_cast<T*>(a.out);
    for (long long i = (long long)blockIdx.x * kThreads + threadIdx.x; i < nvec; i += (long long)gridDim.x * kThreads) {
      float acc[kVec];
      kiln_ar_sum(a, i, acc);
      kiln_store_vec(out + i * kVec, kiln_ar_pack(acc));
    }
    kiln_ar_barrier(a, 1, epoch);
  } else if constexpr (kPush2) {
    const long long nvec = a.count / kVec;
    const long long chunk = (nvec + kWorld - 1) / kWorld;
    const long long stride = (long long)gridDim.x * kThreads;
    const long long t0 = (long long)blockIdx.x * kThreads + threadIdx.x;
    const T* in = static_cast<const T*>(a.in);
    // Chunk c of this rank's input goes to slot (set, rank) of rank c's push area, at offsets relative to the
    // chunk's start: the partition of a chunk's offsets over blocks is the same in both phases.
#pragma unroll
    for (int k = 1; k < kWorld; ++k) {
      const int c = (a.rank + k) % kWorld;
      const long long begin = c * chunk, end = begin + chunk < nvec ? begin + chunk : nvec;
      T* slot = static_cast<T*>(a.push[c]) + (set + a.rank) * a.slot;
      for (long long i = begin + t0; i < end; i += stride) {
        kiln_store_vec(slot + (i - begin) * kVec, kiln_load_vec<T, kVec>(in + i * kVec));
      }
    }
    kiln_ar_barrier(a, 0, epoch);  // every peer's share of chunk `rank` is in this rank's push area
    {
      const T* area = static_cast<const T*>(a.push[a.rank]);
      const long long begin = a.rank * chunk, end = begin + chunk < nvec ? begin + chunk : nvec;
      for (long long i = begin + t0; i < end; i += stride) {
        float acc[kVec];
#pragma unroll
        for (int j = 0; j < kVec; ++j) acc[j] = 0.f;
#pragma unroll
        for (int r = 0; r < kWorld; ++r) {
          const V v = r == a.rank ? kiln_load_vec<T, kVec>(in + i * kVec)
                                  : kiln_ar_load(area + (set + r) * a.slot + (i - begin) * kVec);
#pragma unroll
          for (int j = 0; j < kVec; ++j) acc[j] += kiln_to_f32(v.v[j]);
        }
        const V packed = kiln_ar_pack(acc);
#pragma unroll
        for (int k = 0; k < kWorld; ++k) {
          const int r = (a.rank + k) % kWorld;  // this rank's own tensor first, then the peers', rotated
          kiln_store_vec(static_cast<T*>(a.gather[r]) + i * kVec, packed);
        }
      }
    }
    kiln_ar_barrier(a, 1, epoch);  // the peers' sums are in this rank's tensor
  } else if constexpr (kPush) {
    const long long nvec = a.count / kVec;
    const long long stride = (long long)gridDim.x * kThreads;
    for (long long i = (long long)blockIdx.x * kThreads + threadIdx.x; i < nvec; i += stride) kiln_ar_push(a, set, i);
    kiln_ar_barrier(a, 0, epoch);  // every rank's slot in this rank's push area is written
    T* out = static_cast<T*>(a.out);
    for (long long i = (long long)blockIdx.x * kThreads + threadIdx.x; i < nvec; i += stride) {
      float acc[kVec];
      kiln_ar_sum_pushed(a, set, i, acc);
      kiln_store_vec(out + i * kVec, kiln_ar_pack(acc));
    }
  } else {
    const long long nvec = a.count / kVec;
    const long long chunk = (nvec + kWorld - 1) / kWorld;
    const long long stride = (long long)gridDim.x * kThreads;
    const long long t0 = (long long)blockIdx.x * kThreads + threadIdx.x;
    T* out = static_cast<T*>(a.out);
    const T* mine = static_cast<const T*>(a.gather[a.rank]);
    // Reduce-scatter, and the all-gather pushed: the sum of chunk `rank` goes to this rank's output and to that
    // chunk of every peer's gather buffer. Only this rank reads or writes chunk `rank` anywhere during this phase, and
    // each element is read before the same thread overwrites it, so `out` may be this rank's staging.
    {
      const long long begin = a.rank * chunk, end = begin + chunk < nvec ? begin + chunk : nvec;
      for (long long i = begin + t0; i < end; i += stride) {
        float acc[kVec];
        kiln_ar_sum(a, i, acc);
        const V packed = kiln_ar_pack(acc);
        kiln_store_vec(out + i * kVec, packed);
#pragma unroll
        for (int r = 1; r < kWorld; ++r) {
          const int peer = (a.rank + r) % kWorld;  // rotated so the ranks' first writes go to different peers
          kiln_store_vec(static_cast<T*>(a.gather[peer]) + i * kVec, packed);
        }
      }
    }
    // Every peer's reduced chunk is in this rank's gather buffer, and no peer reads this rank's memory any more,
    // so the next launch may overwrite it (a peer's next pushes wait for this rank at the next launch's first barrier).
    kiln_ar_barrier(a, 1, epoch);
    if (static_cast<const void*>(out) != static_cast<const void*>(mine)) {  // in place: the peers' chunks are there
#pragma unroll
      for (int k = 1; k < kWorld; ++k) {
        const int peer = (a.rank + k) % kWorld;
        const long long begin = peer * chunk, end = begin + chunk < nvec ? begin + chunk : nvec;
        for (long long i = begin + t0; i < end; i += stride) {
          kiln_store_vec(out + i * kVec, kiln_ar_load(mine + i * kVec));
        }
      }
    }
  }
  if (threadIdx.x == 0) *my_epoch = epoch;
}
