// kiln template: row softmax, y = softmax(scale * x) per row, ${dtype.name} in and out, fp32 arithmetic.
// Each block handles ${rows_per_block} row(s) with ${row_threads} threads per row; each thread moves ${vec}
// element(s) per access. Rows of up to ${row_threads} * ${vec} * ${items} columns stay in registers (one read,
// one write); longer rows use an online max/sum pass and a second pass that re-reads x. Rows and cols are
// run-time arguments.
#include "common/kiln_device.cuh"
#include "kiln/templates/kernel_args.h"

typedef ${dtype} T;
// The row family's tunables (row_params in templates/src/families.h).
constexpr int kThreads = ${threads}, kRowsPerBlock = ${rows_per_block}, kRowThreads = ${row_threads};
constexpr int kVec = ${vec}, kItems = ${items};
constexpr int kWarpsPerRow = kRowThreads / 32;
typedef KilnVec<T, kVec> V;

extern "C" __global__ void __launch_bounds__(kThreads) kiln_softmax(const KilnSoftmaxArgs args) {
  __shared__ float scratch[kThreads / 32];
  const auto [t, warp0, row] = kiln_row_place<kRowThreads, kRowsPerBlock>();
  const bool active = row < args.rows;
  const int cols = args.cols;
  const float scale = args.scale;
  const T* x = static_cast<const T*>(args.x) + row * args.ld_x;
  T* y = static_cast<T*>(args.y) + row * args.ld_y;
  const float kNegInf = __int_as_float(0xff800000);

  if (cols <= kRowThreads * kVec * kItems) {
    float h[kItems][kVec];
    float m = kNegInf;
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int col = (i * kRowThreads + t) * kVec;
      if (active && col < cols) {
        V xv = kiln_load_vec<T, kVec>(x + col);
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          h[i][j] = kiln_to_f32(xv.v[j]) * scale;
          m = fmaxf(m, h[i][j]);
        }
      } else {
#pragma unroll
        for (int j = 0; j < kVec; ++j) h[i][j] = kNegInf;
      }
    }
    m = kiln_group_max<kWarpsPerRow>(m, scratch, warp0);
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        // exp(-inf - m) is 0 for the masked slots; a row that is all -inf gives NaN, as in PyTorch.
        h[i][j] = __expf(h[i][j] - m);
        s += h[i][j];
      }
    }
    s = kiln_group_sum<kWarpsPerRow>(s, scratch, warp0);
    const float inv = 1.f / s;
    if (!active) return;
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int col = (i * kRowThreads + t) * kVec;
      if (col < cols) {
        V out;
#pragma unroll
        for (int j = 0; j < kVec; ++j) out.v[j] = kiln_from_f32<T>(h[i][j] * inv);
        kiln_store_vec<T, kVec>(y + col, out);
      }
    }
    return;
  }

  // Long rows: an online (max, sum) per thread, combined across the row, then a second pass.
  float m = kNegInf, s = 0.f;
  if (active) {
    for (int col = t * kVec; col < cols; col += kRowThreads * kVec) {
      V xv = kiln_load_vec<T, kVec>(x + col);
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        float v = kiln_to_f32(xv.v[j]) * scale;
        if (v == kNegInf) continue;
        if (v > m) {
          s = s * __expf(m - v) + 1.f;
          m = v;
        } else {
          s += __expf(v - m);
        }
      }
    }
  }
  const float gm = kiln_group_max<kWarpsPerRow>(m, scratch, warp0);
  s = kiln_group_sum<kWarpsPerRow>(m == kNegInf ? 0.f : s * __expf(m - gm), scratch, warp0);
  const float inv = 1.f / s;
  if (!active) return;
  for (int col = t * kVec; col < cols; col += kRowThreads * kVec) {
    V xv = kiln_load_vec<T, kVec>(x + col);
    V out;
#pragma unroll
    for (int j = 0; j < kVec; ++j) out.v[j] = kiln_from_f32<T>(__expf(kiln_to_f32(xv.v[j]) * scale - gm) * inv);
    kiln_store_vec<T, kVec>(y + col, out);
  }
}
