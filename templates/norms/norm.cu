// kiln template: ${if layernorm}LayerNorm${else}RMSNorm${endif} over rows, ${dtype.name}, fp32 statistics.
//   h = x${if residual} + residual (h is also written to residual_out, in ${dtype.name})${endif}
${if layernorm}
//   y = (h - mean(h)) / sqrt(var(h) + eps) * weight${if has_bias} + bias${endif}
${else}
//   y = h / sqrt(mean(h^2) + eps) * weight
${endif}
// Each block handles ${rows_per_block} row(s) with ${row_threads} threads per row; each thread moves ${vec}
// element(s) per access. Rows of up to ${row_threads} * ${vec} * ${items} columns stay in registers (one read of
// x, one write of y); longer rows take a slower path that re-reads the row. Rows and cols are run-time
// arguments: one compiled configuration serves every shape whose cols and leading dimensions are multiples
// of ${vec}.
#include "common/kiln_device.cuh"
#include "kiln/templates/kernel_args.h"

typedef ${dtype} T;
// The row family's tunables (row_params in templates/src/families.h).
constexpr int kThreads = ${threads}, kRowsPerBlock = ${rows_per_block}, kRowThreads = ${row_threads};
constexpr int kVec = ${vec}, kItems = ${items};
constexpr int kWarpsPerRow = kRowThreads / 32;
constexpr bool kResidual = ${residual};
constexpr bool kLayerNorm = ${layernorm};
constexpr bool kBias = ${has_bias};
typedef KilnVec<T, kVec> V;

extern "C" __global__ void __launch_bounds__(kThreads)
${if layernorm}kiln_layernorm${else}kiln_rmsnorm${endif}(const KilnNormArgs args) {
  __shared__ float scratch[kThreads / 32];
  const auto [t, warp0, row] = kiln_row_place<kRowThreads, kRowsPerBlock>();
  // Every thread takes part in the group reductions (they synchronise the block); threads past the last row
  // compute on nothing and store nothing.
  const bool active = row < args.rows;
  const int cols = args.cols;
  const T* x = static_cast<const T*>(args.x) + row * args.ld_x;
  const T* res = static_cast<const T*>(args.residual) + row * args.ld_residual;
  T* res_out = static_cast<T*>(args.residual_out) + row * args.ld_residual_out;
  T* y = static_cast<T*>(args.y) + row * args.ld_y;
  const T* w = static_cast<const T*>(args.weight);
  const T* b = static_cast<const T*>(args.bias);
  const float inv_cols = 1.f / (float)cols;

  if (cols <= kRowThreads * kVec * kItems) {
    // Register path. Every load is issued before any store or reduction: a store to residual_out or y may alias
    // the next item's x, residual or weight as far as the compiler knows, so loads interleaved with stores wait
    // one memory latency per item (on an H200, a 1 x 4096 residual RMSNorm ran 5.1 us at one item per thread
    // and 7.8-11.8 us at four to eight). The weight (and bias) row does not depend on the statistics: loaded
    // here, its latency overlaps the reduction instead of following it.
    V xv[kItems], rv[kItems], wv[kItems], bv[kItems];
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int col = (i * kRowThreads + t) * kVec;
      if (active && col < cols) {
        xv[i] = kiln_load_vec<T, kVec>(x + col);
        if constexpr (kResidual) rv[i] = kiln_load_vec<T, kVec>(res + col);
      }
    }
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int col = (i * kRowThreads + t) * kVec;
      if (active && col < cols) {
        wv[i] = kiln_load_vec<T, kVec>(w + col);
        if constexpr (kBias) bv[i] = kiln_load_vec<T, kVec>(b + col);
      }
    }
    float h[kItems][kVec];
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int col = (i * kRowThreads + t) * kVec;
      if (active && col < cols) {
        if constexpr (kResidual) {
          V hv;
#pragma unroll
          for (int j = 0; j < kVec; ++j) {
            hv.v[j] = kiln_from_f32<T>(kiln_to_f32(xv[i].v[j]) + kiln_to_f32(rv[i].v[j]));
          }
          kiln_store_vec<T, kVec>(res_out + col, hv);
          xv[i] = hv;
        }
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          h[i][j] = kiln_to_f32(xv[i].v[j]);
          sum += kLayerNorm ? h[i][j] : h[i][j] * h[i][j];
        }
      } else {
#pragma unroll
        for (int j = 0; j < kVec; ++j) h[i][j] = 0.f;
      }
    }
    sum = kiln_group_sum<kWarpsPerRow>(sum, scratch, warp0);
    float mean = 0.f, inv;
    if constexpr (kLayerNorm) {
      mean = sum * inv_cols;
      float var = 0.f;
#pragma unroll
      for (int i = 0; i < kItems; ++i) {
        const int col = (i * kRowThreads + t) * kVec;
        if (active && col < cols) {
#pragma unroll
          for (int j = 0; j < kVec; ++j) var += (h[i][j] - mean) * (h[i][j] - mean);
        }
      }
      var = kiln_group_sum<kWarpsPerRow>(var, scratch, warp0);
      inv = rsqrtf(var * inv_cols + args.eps);
    } else {
      inv = rsqrtf(sum * inv_cols + args.eps);
    }
    if (!active) return;
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int col = (i * kRowThreads + t) * kVec;
      if (col < cols) {
        V out;
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          float v = (h[i][j] - mean) * inv * kiln_to_f32(wv[i].v[j]);
          if constexpr (kBias) v += kiln_to_f32(bv[i].v[j]);
          out.v[j] = kiln_from_f32<T>(v);
        }
        kiln_store_vec<T, kVec>(y + col, out);
      }
    }
    return;
  }

  // Long rows: pass 1 forms h (writing residual_out) and its sum or sum of squares; layernorm re-reads h for
  // the variance; the last pass re-reads h and writes y. Each thread re-reads only elements it wrote itself.
  const T* hsrc = kResidual ? static_cast<const T*>(res_out) : x;
  float sum = 0.f;
  if (active) {
    for (int col = t * kVec; col < cols; col += kRowThreads * kVec) {
      V xv = kiln_load_vec<T, kVec>(x + col);
      if constexpr (kResidual) {
        V rv = kiln_load_vec<T, kVec>(res + col);
#pragma unroll
        for (int j = 0; j < kVec; ++j) xv.v[j] = kiln_from_f32<T>(kiln_to_f32(xv.v[j]) + kiln_to_f32(rv.v[j]));
        kiln_store_vec<T, kVec>(res_out + col, xv);
      }
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        float v = kiln_to_f32(xv.v[j]);
        sum += kLayerNorm ? v : v * v;
      }
    }
  }
  sum = kiln_group_sum<kWarpsPerRow>(sum, scratch, warp0);
  float mean = 0.f, inv;
  if constexpr (kLayerNorm) {
    mean = sum * inv_cols;
    float var = 0.f;
    if (active) {
      for (int col = t * kVec; col < cols; col += kRowThreads * kVec) {
        V hv = kiln_load_vec<T, kVec>(hsrc + col);
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          float d = kiln_to_f32(hv.v[j]) - mean;
          var += d * d;
        }
      }
    }
    var = kiln_group_sum<kWarpsPerRow>(var, scratch, warp0);
    inv = rsqrtf(var * inv_cols + args.eps);
  } else {
    inv = rsqrtf(sum * inv_cols + args.eps);
  }
  if (!active) return;
  for (int col = t * kVec; col < cols; col += kRowThreads * kVec) {
    V hv = kiln_load_vec<T, kVec>(hsrc + col);
    V wv = kiln_load_vec<T, kVec>(w + col);
    V out;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      float v = (kiln_to_f32(hv.v[j]) - mean) * inv * kiln_to_f32(wv.v[j]);
      if constexpr (kBias) v += kiln_to_f32(b[col + j]);
      out.v[j] = kiln_from_f32<T>(v);
    }
    kiln_store_vec<T, kVec>(y + col, out);
  }
}
