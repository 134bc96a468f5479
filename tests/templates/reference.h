// Host-side references for template tests: bf16/fp16 conversion, seeded random data, a float64 GEMM with
// kiln's epilogue ops, relative norm error, and output poisoning. Header-only; no GPU needed except for
// the DeviceBuffer helpers.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kiln/jit/device.h"
#include "kiln/status.h"
#include "kiln/templates/epilogue.h"
#include "kiln/templates/template.h"

namespace kiln::testing {

using templates::DType;
using templates::EpilogueOp;
using templates::EpilogueSpec;
using templates::Layout;

// ------------------------------------------------------------------------------------------------ dtypes

/// Host storage of a tensor in `dtype` (2 or 4 bytes per element), with its values as doubles after rounding.
struct HostTensor {
  DType dtype = DType::kBF16;
  std::vector<uint8_t> bytes;
  std::vector<double> values;  // what the device sees, exactly
  size_t size() const { return values.size(); }
};

inline int dtype_size(DType t) { return templates::dtype_bytes(t); }

/// Stores `v` rounded to `dtype`; returns the rounded value.
inline double store_as(DType dtype, void* dst, float v) {
  templates::store_element(dtype, v, dst);
  return templates::load_element(dtype, dst);
}
inline double load_as(DType dtype, const void* src) { return templates::load_element(dtype, src); }

/// `n` values uniform in [lo, hi), rounded to `dtype`; the same seed gives the same tensor everywhere.
inline HostTensor random_tensor(DType dtype, size_t n, uint64_t seed, float lo = -1.f, float hi = 1.f) {
  HostTensor t;
  t.dtype = dtype;
  t.bytes.resize(n * dtype_size(dtype));
  t.values.resize(n);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  for (size_t i = 0; i < n; ++i) t.values[i] = store_as(dtype, t.bytes.data() + i * dtype_size(dtype), dist(rng));
  return t;
}

/// Converts device output bytes of `n` elements of `dtype` to doubles.
inline std::vector<double> to_doubles(DType dtype, const std::vector<uint8_t>& bytes, size_t n) {
  std::vector<double> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = load_as(dtype, bytes.data() + i * dtype_size(dtype));
  return out;
}

// ------------------------------------------------------------------------------------------------ GEMM

/// The arguments of an epilogue, host side (values already rounded to their dtypes).
struct HostEpilogue {
  EpilogueSpec spec;
  std::vector<double> bias;      // [n]
  std::vector<double> residual;  // [m * ld_residual]
  int64_t ld_residual = 0;
  double alpha = 1, beta = 1;
};

/// Applies the epilogue ops of `ep` to one accumulator, in float64.
inline double apply_epilogue(const HostEpilogue& ep, double v, int64_t row, int64_t col) {
  for (EpilogueOp op : ep.spec.ops) {
    switch (op) {
      case EpilogueOp::kScale: v *= ep.alpha; break;
      case EpilogueOp::kBias: v += ep.bias[col]; break;
      case EpilogueOp::kResidual: v += ep.beta * ep.residual[row * ep.ld_residual + col]; break;
      case EpilogueOp::kRelu: v = v > 0 ? v : 0; break;
      case EpilogueOp::kGelu: v = 0.5 * v * (1 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))); break;
      case EpilogueOp::kSilu: v = v / (1 + std::exp(-v)); break;
    }
  }
  return v;
}

/// A[m,k] . B[k,n] in float64 with A and B in the given layouts and leading dimensions; row-major [m][n] out.
inline std::vector<double> reference_gemm(const std::vector<double>& a, Layout la, int64_t lda,
                                          const std::vector<double>& b, Layout lb, int64_t ldb, int64_t m, int64_t n,
                                          int64_t k) {
  std::vector<double> c(static_cast<size_t>(m * n), 0.0);
  // Gather B as [n][k] so the inner loop is contiguous for every layout.
  std::vector<double> bt(static_cast<size_t>(n * k));
  for (int64_t kk = 0; kk < k; ++kk)
    for (int64_t j = 0; j < n; ++j) bt[j * k + kk] = lb == Layout::kRowMajor ? b[kk * ldb + j] : b[j * ldb + kk];
  std::vector<double> arow(static_cast<size_t>(k));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t kk = 0; kk < k; ++kk) arow[kk] = la == Layout::kRowMajor ? a[i * lda + kk] : a[kk * lda + i];
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      const double* bj = &bt[j * k];
      for (int64_t kk = 0; kk < k; ++kk) s += arow[kk] * bj[kk];
      c[i * n + j] = s;
    }
  }
  return c;
}

/// ||out - ref|| / ||ref|| over a row-major [rows][cols] block of `out` (leading dimension ld_out) against a
/// dense `ref`. NaN (e.g. a poisoned element nothing wrote) makes the result NaN, which fails every bound.
inline double rel_norm_error(const std::vector<double>& out, int64_t ld_out, const std::vector<double>& ref,
                             int64_t rows, int64_t cols) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      const double d = out[i * ld_out + j] - ref[i * cols + j];
      num += d * d;
      den += ref[i * cols + j] * ref[i * cols + j];
    }
  }
  if (std::isnan(num)) return NAN;
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

/// How many elements of a row-major [rows][cols] block are NaN (poison left behind).
inline int64_t count_nan(const std::vector<double>& out, int64_t ld_out, int64_t rows, int64_t cols) {
  int64_t n = 0;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) n += std::isnan(out[i * ld_out + j]) ? 1 : 0;
  return n;
}

// ------------------------------------------------------------------------------------------------ device

/// A device copy of `t` (at least `min_bytes`, so a test can hand out padded views).
inline Result<DeviceBuffer> upload(const HostTensor& t, size_t min_bytes = 0) {
  KILN_ASSIGN_OR_RETURN(DeviceBuffer buf, DeviceBuffer::allocate(std::max(t.bytes.size(), min_bytes)));
  KILN_RETURN_IF_ERROR(buf.fill_bytes(0xFF));
  KILN_RETURN_IF_ERROR(buf.copy_from_host(t.bytes.data(), t.bytes.size()));
  return buf;
}

/// Sets every byte of `buf` to 0xFF: NaN in bf16, fp16 and fp32, so unwritten outputs fail any comparison.
inline Status poison(const DeviceBuffer& buf) { return buf.fill_bytes(0xFF); }

}  // namespace kiln::testing
