// The runtime GPU tests' check of a selection: run it, run its op's reference choice on buffers made the same
// way, and compare every output (relative L2 error; an unwritten element fails at once).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kiln/jit/driver.h"
#include "kiln/pool/gate.h"
#include "kiln/runtime.h"
#include "kiln_test.h"

namespace kiln::runtime::reference_check {

/// An element of a downloaded output as a double (f32, bf16 or f16 bits; f16 infinity/NaN read as NaN).
inline double element(const std::vector<uint8_t>& v, size_t j, DType dtype) {
  if (dtype == DType::kF32) return reinterpret_cast<const float*>(v.data())[j];
  uint16_t h = reinterpret_cast<const uint16_t*>(v.data())[j];
  if (dtype == DType::kBF16) {
    uint32_t bits = uint32_t{h} << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  int sign = h >> 15, exp = (h >> 10) & 31, man = h & 1023;
  double m = exp == 0 ? man / 1024.0 * std::pow(2.0, -14) : (1 + man / 1024.0) * std::pow(2.0, exp - 15);
  return exp == 31 ? std::nan("") : (sign ? -m : m);
}

/// Runs `sel` on fresh buffers of its problem (or on `given`: buffers the op made with seed 77 for the
/// selection's problem, checked in place) and checks the outputs against the op's reference choice, run in
/// this process's context.
inline void expect_correct(const Selection& sel, OpBuffers* given = nullptr) {
  auto def = default_ops().find(sel.problem().op);
  ASSERT_TRUE(def.ok());
  OpBuffers own;
  if (!given) {
    KILN_ASSERT_OK_AND_ASSIGN(own, (*def)->buffers(sel.problem(), 77));
  }
  OpBuffers& mine = given ? *given : own;
  KILN_ASSERT_OK_AND_ASSIGN(OpBuffers ref, (*def)->buffers(sel.problem(), 77));
  KILN_ASSERT_OK(sel.run(mine.args, nullptr));
  KILN_ASSERT_OK_AND_ASSIGN(auto ctx, choice_context(0));
  KILN_ASSERT_OK_AND_ASSIGN(auto choices, default_ops().choices(sel.problem(), ctx));
  ChoicePtr reference;
  for (const auto& c : choices) {
    if (c->name() == (*def)->reference(sel.problem())) reference = c;
  }
  ASSERT_NE(reference, nullptr);
  KILN_ASSERT_OK_AND_ASSIGN(DeviceBuffer ws, DeviceBuffer::allocate(reference->workspace_bytes()));
  KILN_ASSERT_OK_AND_ASSIGN(auto gate, PrecompileGate::create({.executor = make_inline_executor()}));
  auto binaries = reference->precompile(*gate, Priority::kNormal);
  KILN_ASSERT_OK(binaries.get());
  KILN_ASSERT_OK(reference->prepare(*binaries.get()));
  KILN_ASSERT_OK(reference->run(ref.args, ws.ptr(), nullptr));
  KILN_ASSERT_OK_AND_ASSIGN(const DriverApi* d, driver());
  ASSERT_EQ(d->cuCtxSynchronize(), CUDA_SUCCESS) << "the host's context is not usable";
  for (size_t i = 0; i < mine.outputs.size(); ++i) {
    const auto& o = mine.outputs[i];
    const size_t n = static_cast<size_t>(o.rows * o.ld);
    const size_t bytes = n * templates::dtype_bytes(o.dtype);
    std::vector<uint8_t> a(bytes), b(bytes);
    ASSERT_EQ(d->cuMemcpyDtoH(a.data(), o.ptr, bytes), CUDA_SUCCESS);
    ASSERT_EQ(d->cuMemcpyDtoH(b.data(), ref.outputs[i].ptr, bytes), CUDA_SUCCESS);
    double diff = 0, norm = 0;
    for (size_t j = 0; j < n; ++j) {
      double x = element(a, j, o.dtype), y = element(b, j, o.dtype);
      ASSERT_TRUE(std::isfinite(x)) << sel.choice_name() << ": " << o.name << "[" << j << "] not written";
      diff += (x - y) * (x - y);
      norm += y * y;
    }
    EXPECT_LE(std::sqrt(diff / norm), o.dtype == DType::kF32 ? 1e-3 : 1e-2) << sel.choice_name() << " " << o.name;
  }
}

}  // namespace kiln::runtime::reference_check
