#include "isolation_wire.h"

#include <fmt/format.h>

#include "kiln/runtime/workload.h"

namespace kiln::runtime {
namespace {

// Built-in descriptions travel as the workload entry problem_to_json writes (for the op they describe; the op
// name may be a registered alias such as a private copy of gemm); custom ones as their sizes and attributes.
enum class DescKind : uint8_t { kGemm = 0, kNorm = 1, kSoftmax = 2, kCustom = 3 };

}  // namespace

void field(codec::Writer& w, const Problem& p, std::string_view) {
  w.bytes(p.op, "problem op");
  if (const auto* c = std::get_if<CustomProblem>(&p.desc)) {
    w.u8(static_cast<uint8_t>(DescKind::kCustom));
    w.count(c->sizes.size(), "problem sizes");
    for (int64_t s : c->sizes) w.i64(s);
    w.string_pairs(c->attributes, "problem attributes");
    return;
  }
  Problem canonical = p;
  DescKind kind = DescKind::kGemm;
  if (const auto* n = std::get_if<NormProblem>(&p.desc)) {
    kind = DescKind::kNorm;
    canonical.op = n->layernorm ? "layernorm" : "rmsnorm";
  } else if (std::holds_alternative<SoftmaxProblem>(p.desc)) {
    kind = DescKind::kSoftmax;
    canonical.op = "softmax";
  } else {
    canonical.op = "gemm";
  }
  w.u8(static_cast<uint8_t>(kind));
  w.bytes(problem_to_json(canonical), "problem description");
}

// A problem that does not parse is not a corrupt frame but a description this build cannot read: refused.
void field(codec::Reader& r, Problem& p, std::string_view) {
  p.op = r.bytes("problem op");
  const uint8_t kind = r.u8("problem kind");
  if (!r.ok()) return;
  if (kind == static_cast<uint8_t>(DescKind::kCustom)) {
    CustomProblem c;
    const uint32_t n = r.count("problem sizes", 8);
    for (uint32_t i = 0; i < n && r.ok(); ++i) c.sizes.push_back(r.i64("problem size"));
    for (auto& [k, v] : r.string_pairs("problem attributes")) c.attributes[k] = std::move(v);
    p.desc = std::move(c);
    return;
  }
  if (kind > static_cast<uint8_t>(DescKind::kSoftmax)) {
    r.reject("problem kind", fmt::format("is {} (0 to 3 expected)", kind));
    return;
  }
  std::string json = r.bytes("problem description");
  if (!r.ok()) return;
  auto parsed = problem_from_json(json);
  if (!parsed.ok()) {
    r.refuse(std::move(parsed).status().with_context("decoding the problem of a bench request"));
    return;
  }
  p.desc = parsed->desc;
}

}  // namespace kiln::runtime

namespace kiln::runtime::detail::bench_wire {

Result<Problem> round_trip(const Problem& problem) {
  codec::Writer w;
  field(w, problem, "problem");
  KILN_ASSIGN_OR_RETURN(Problem back, codec::read_record<Problem>(w.buffer(), "problem"));
  if (!(back == problem)) {
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("{} does not survive the trip to the bench worker unchanged (the workload "
                                  "format cannot describe it)",
                                  problem.describe()));
  }
  return back;
}

}  // namespace kiln::runtime::detail::bench_wire
