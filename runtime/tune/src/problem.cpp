#include "kiln/runtime/problem.h"

#include <fmt/format.h>

#include "kiln/templates/gemm.h"

namespace kiln::runtime {
namespace {

constexpr int64_t kMaxIndex = (int64_t{1} << 31) - 1;

Status positive(int64_t v, const char* what, const std::string& op) {
  if (v > 0 && v <= kMaxIndex) return Status();
  return make_error(ErrorCode::kInvalidArgument,
                    fmt::format("{} problem: {} = {} must be in [1, 2^31)", op, what, v));
}

std::string dt(DType t) { return std::string(templates::dtype_name(t)); }

}  // namespace

std::string Problem::describe() const {
  return std::visit(
      [&](const auto& d) -> std::string {
        using T = std::decay_t<decltype(d)>;
        if constexpr (std::is_same_v<T, GemmProblem>) {
          return fmt::format("gemm {}x{}x{} {}·{}→{} {}·{}{}{}", d.m, d.n, d.k, dt(d.a), dt(d.b), dt(d.epilogue.out),
                             templates::layout_name(d.a_layout), templates::layout_name(d.b_layout),
                             d.epilogue.ops.empty() ? "" : " +" + d.epilogue.tag(), d.b_constant ? " B constant" : "");
        } else if constexpr (std::is_same_v<T, NormProblem>) {
          return fmt::format("{} {}x{} {}{}{}", op, d.rows, d.cols, dt(d.dtype), d.residual ? " +residual" : "",
                             d.bias ? " +bias" : "");
        } else if constexpr (std::is_same_v<T, SoftmaxProblem>) {
          return fmt::format("softmax {}x{} {} scale {}", d.rows, d.cols, dt(d.dtype), d.scale);
        } else {
          std::string s = op;
          for (auto v : d.sizes) s += " " + std::to_string(v);
          for (const auto& [k, v] : d.attributes) s += " " + k + "=" + v;
          return s;
        }
      },
      desc);
}

namespace {
// The dynamic size, named alike in a problem's description and in its op's arguments: GEMM's m, a custom op's
// first size, a row op's rows.
template <class D>
int64_t dynamic_size_in(const D& d) {
  if constexpr (requires { d.m; }) return d.m;
  else if constexpr (requires { d.sizes; }) return d.sizes.empty() ? 0 : d.sizes[0];
  else return d.rows;
}
}  // namespace

int64_t Problem::dynamic_size() const {
  return std::visit([](const auto& d) { return dynamic_size_in(d); }, desc);
}
int64_t dynamic_size_of(const OpArgs& args) {
  return std::visit([](const auto& a) { return dynamic_size_in(a); }, args);
}

Problem Problem::with_dynamic_size(int64_t size) const {
  Problem p = *this;
  std::visit(
      [&](auto& d) {
        using T = std::decay_t<decltype(d)>;
        if constexpr (std::is_same_v<T, GemmProblem>) d.m = size;
        else if constexpr (std::is_same_v<T, CustomProblem>) {
          if (!d.sizes.empty()) d.sizes[0] = size;
        } else {
          d.rows = size;
        }
      },
      p.desc);
  return p;
}

Status Problem::validate() const {
  if (op.empty()) return make_error(ErrorCode::kInvalidArgument, "problem without an op name");
  return std::visit(
      [&](const auto& d) -> Status {
        using T = std::decay_t<decltype(d)>;
        if constexpr (std::is_same_v<T, GemmProblem>) {
          KILN_RETURN_IF_ERROR(positive(d.m, "m", op));
          KILN_RETURN_IF_ERROR(positive(d.n, "n", op));
          KILN_RETURN_IF_ERROR(positive(d.k, "k", op));
          if (d.a == DType::kF32 || d.b == DType::kF32) {
            return make_error(ErrorCode::kInvalidArgument, "gemm problem: A and B must be bf16 or f16");
          }
          return Status();
        } else if constexpr (std::is_same_v<T, NormProblem>) {
          if (d.bias && !d.layernorm) return make_error(ErrorCode::kInvalidArgument, "rmsnorm has no bias");
          KILN_RETURN_IF_ERROR(positive(d.rows, "rows", op));
          return positive(d.cols, "cols", op);
        } else if constexpr (std::is_same_v<T, SoftmaxProblem>) {
          KILN_RETURN_IF_ERROR(positive(d.rows, "rows", op));
          return positive(d.cols, "cols", op);
        } else {
          for (auto v : d.sizes) {
            if (v <= 0) return make_error(ErrorCode::kInvalidArgument, fmt::format("{} problem: size {} is not positive", op, v));
          }
          return Status();
        }
      },
      desc);
}

templates::Shape Problem::shape() const {
  return std::visit(
      [](const auto& d) -> templates::Shape {
        using T = std::decay_t<decltype(d)>;
        templates::Shape s;
        if constexpr (std::is_same_v<T, GemmProblem>) {
          s.m = d.m, s.n = d.n, s.k = d.k;
        } else if constexpr (std::is_same_v<T, CustomProblem>) {
          if (d.sizes.size() > 0) s.m = d.sizes[0];
          if (d.sizes.size() > 1) s.n = d.sizes[1];
          if (d.sizes.size() > 2) s.k = d.sizes[2];
        } else {
          s.m = d.rows, s.n = d.cols;
        }
        return s;
      },
      desc);
}

cache::ProblemKey Problem::key(const cache::DeviceFingerprint& device, const cache::VersionStamp& versions) const {
  cache::ProblemKey k;
  k.op = op;
  k.device = device;
  k.versions = versions;
  std::visit(
      [&](const auto& d) {
        using T = std::decay_t<decltype(d)>;
        if constexpr (std::is_same_v<T, GemmProblem>) {
          k.operands = {{dt(d.a), std::string(templates::layout_name(d.a_layout)), {d.m, d.k}},
                        {dt(d.b), std::string(templates::layout_name(d.b_layout)), {d.k, d.n}},
                        {dt(d.epilogue.out), "row", {d.m, d.n}}};
          k.epilogue = d.epilogue.ops.empty() ? "" : d.epilogue.tag();
          if (d.epilogue.has(templates::EpilogueOp::kBias)) k.attributes.push_back({"bias", dt(d.epilogue.bias_dtype)});
          if (d.epilogue.has(templates::EpilogueOp::kResidual)) {
            k.attributes.push_back({"residual", dt(d.epilogue.residual_dtype)});
          }
          // Only when promised: every decision stored before the promise existed keeps its key.
          if (d.b_constant) k.attributes.push_back({"b_constant", "1"});
        } else if constexpr (std::is_same_v<T, NormProblem>) {
          k.operands = {{dt(d.dtype), "row", {d.rows, d.cols}}, {dt(d.dtype), "row", {d.rows, d.cols}}};
          k.attributes = {{"residual", d.residual ? "1" : "0"}, {"bias", d.bias ? "1" : "0"}};
        } else if constexpr (std::is_same_v<T, SoftmaxProblem>) {
          k.operands = {{dt(d.dtype), "row", {d.rows, d.cols}}, {dt(d.dtype), "row", {d.rows, d.cols}}};
        } else {
          k.operands = {{"", "", d.sizes}};
          for (const auto& [name, value] : d.attributes) k.attributes.push_back({name, value});
        }
      },
      desc);
  return k;
}

}  // namespace kiln::runtime
