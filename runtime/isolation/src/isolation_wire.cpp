#include "isolation_wire.h"

#include <fmt/format.h>

#include "kiln/codec/values.h"
#include "kiln/runtime/workload.h"

namespace kiln::runtime::detail::bench_wire {
namespace {

using codec::Reader;
using codec::Writer;

// Every field of BenchmarkOptions crosses the wire; a new field must be added to put_bench/get_bench (and
// the protocol's version bumped) or the worker would silently measure with its default.
static_assert(sizeof(BenchmarkOptions) == 56, "BenchmarkOptions changed: update the bench worker's encoding");

Result<std::string> seal(Type t, Writer&& w) { return codec::seal_frame(kProtocol, static_cast<uint16_t>(t), std::move(w)); }

void put_spec(Writer& w, const ChoiceSpec& s) {
  w.bytes(s.name, "choice name");
  w.count(s.keys.size(), "choice keys");
  for (const auto& k : s.keys) codec::put_key(w, k);
}

ChoiceSpec get_spec(Reader& r) {
  ChoiceSpec s;
  s.name = r.bytes("choice name");
  const uint32_t n = r.count("choice keys", 16);
  for (uint32_t i = 0; i < n && r.ok(); ++i) s.keys.push_back(codec::get_key(r, "choice key"));
  return s;
}

void put_specs(Writer& w, const std::vector<ChoiceSpec>& v) {
  w.count(v.size(), "choices");
  for (const auto& c : v) put_spec(w, c);
}

std::vector<ChoiceSpec> get_specs(Reader& r) {
  std::vector<ChoiceSpec> v;
  const uint32_t n = r.count("choices", 8);
  for (uint32_t i = 0; i < n && r.ok(); ++i) v.push_back(get_spec(r));
  return v;
}

void put_bench(Writer& w, const BenchmarkOptions& b) {
  w.f64(b.budget_ms);
  w.i32(b.min_reps);
  w.i32(b.max_reps);
  w.i32(b.fixed_reps);
  w.f64(b.drop_factor);
  w.f64(b.tie_fraction);
  w.i32(b.tie_rounds);
  w.boolean(b.flush_l2);
  w.f64(b.graph_below_us);
}

BenchmarkOptions get_bench(Reader& r) {
  BenchmarkOptions b;
  b.budget_ms = r.f64("bench budget");
  b.min_reps = r.i32("bench min reps");
  b.max_reps = r.i32("bench max reps");
  b.fixed_reps = r.i32("bench fixed reps");
  b.drop_factor = r.f64("bench drop factor");
  b.tie_fraction = r.f64("bench tie fraction");
  b.tie_rounds = r.i32("bench tie rounds");
  b.flush_l2 = r.boolean("bench flush l2");
  b.graph_below_us = r.f64("bench graph below");
  return b;
}

// A problem: its op name, then its description. Built-in descriptions travel as the workload entry
// problem_to_json writes (for the op they describe; the op name may be a registered alias such as a private
// copy of gemm); custom ones as their sizes and attributes.
enum class DescKind : uint8_t { kGemm = 0, kNorm = 1, kSoftmax = 2, kCustom = 3 };

void put_problem(Writer& w, const Problem& p) {
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

// A problem that does not parse is not a corrupt frame but a description this build cannot read: `why` says so.
Problem get_problem(Reader& r, Status& why) {
  Problem p;
  p.op = r.bytes("problem op");
  const uint8_t kind = r.u8("problem kind");
  if (!r.ok()) return p;
  if (kind == static_cast<uint8_t>(DescKind::kCustom)) {
    CustomProblem c;
    const uint32_t n = r.count("problem sizes", 8);
    for (uint32_t i = 0; i < n && r.ok(); ++i) c.sizes.push_back(r.i64("problem size"));
    for (auto& [k, v] : r.string_pairs("problem attributes")) c.attributes[k] = std::move(v);
    p.desc = std::move(c);
    return p;
  }
  if (kind > static_cast<uint8_t>(DescKind::kSoftmax)) {
    r.reject("problem kind", fmt::format("is {} (0 to 3 expected)", kind));
    return p;
  }
  std::string json = r.bytes("problem description");
  if (!r.ok()) return p;
  auto parsed = problem_from_json(json);
  if (!parsed.ok()) {
    why = std::move(parsed).status().with_context("decoding the problem of a bench request");
    return p;
  }
  p.desc = parsed->desc;
  return p;
}

}  // namespace

Result<std::string> encode(const Hello& m) {
  Writer w;
  w.i32(m.pid);
  w.i32(m.device);
  codec::put_outcome(w, m.status);
  w.f64(m.context_seconds);
  w.bytes(m.device_name, "device name");
  return seal(Type::kHello, std::move(w));
}

Result<std::string> encode(const Begin& m) {
  Writer w;
  w.u64(m.seq);
  put_problem(w, m.problem);
  w.u32(m.seed);
  put_bench(w, m.bench);
  w.i32(m.max_template_configs);
  w.i32(m.max_cublas_algos);
  w.boolean(m.split_k);
  put_spec(w, m.reference);
  codec::put_binaries(w, m.reference_binaries);
  put_specs(w, m.choices);
  return seal(Type::kBegin, std::move(w));
}

Result<std::string> encode(const Begun& m) {
  Writer w;
  w.u64(m.seq);
  codec::put_outcome(w, m.status);
  w.string_pairs(m.unknown, "unknown choices");
  w.boolean(m.poisoned);
  w.f64(m.worker_seconds);
  return seal(Type::kBegun, std::move(w));
}

Result<std::string> encode(const Run& m) {
  Writer w;
  w.u64(m.seq);
  w.bytes(m.name, "choice name");
  w.u8(static_cast<uint8_t>(m.mode));
  w.boolean(m.has_binaries);
  if (m.has_binaries) codec::put_binaries(w, m.binaries);
  w.f64(m.best_us);
  w.i32(m.n);
  w.boolean(m.graph);
  return seal(Type::kRun, std::move(w));
}

Result<std::string> encode(const RunResult& m) {
  Writer w;
  w.u64(m.seq);
  codec::put_outcome(w, m.status);
  w.f64(m.error);
  w.f64s(m.us, "samples");
  w.boolean(m.graph);
  w.boolean(m.partial);
  w.boolean(m.poisoned);
  w.f64(m.worker_seconds);
  return seal(Type::kRunResult, std::move(w));
}

Result<std::string> encode(const End& m) {
  Writer w;
  w.u64(m.seq);
  return seal(Type::kEnd, std::move(w));
}

Result<Hello> decode_hello(std::string_view payload) {
  Reader r(payload);
  Hello m;
  m.pid = r.i32("pid");
  m.device = r.i32("device");
  m.status = codec::get_outcome(r);
  m.context_seconds = r.f64("context seconds");
  m.device_name = r.bytes("device name");
  KILN_RETURN_IF_ERROR(r.finish("bench hello"));
  return m;
}

Result<Begin> decode_begin(std::string_view payload) {
  Reader r(payload);
  Begin m;
  Status problem_status;
  m.seq = r.u64("seq");
  m.problem = get_problem(r, problem_status);
  m.seed = r.u32("seed");
  m.bench = get_bench(r);
  m.max_template_configs = r.i32("max template configs");
  m.max_cublas_algos = r.i32("max cublas algos");
  m.split_k = r.boolean("split k");
  m.reference = get_spec(r);
  m.reference_binaries = codec::get_binaries(r);
  m.choices = get_specs(r);
  KILN_RETURN_IF_ERROR(r.finish("bench begin"));
  KILN_RETURN_IF_ERROR(problem_status);
  return m;
}

Result<Begun> decode_begun(std::string_view payload) {
  Reader r(payload);
  Begun m;
  m.seq = r.u64("seq");
  m.status = codec::get_outcome(r);
  for (auto& [name, why] : r.string_pairs("unknown choices")) m.unknown[name] = std::move(why);
  m.poisoned = r.boolean("poisoned");
  m.worker_seconds = r.f64("worker seconds");
  KILN_RETURN_IF_ERROR(r.finish("bench begun"));
  return m;
}

Result<Run> decode_run(std::string_view payload) {
  Reader r(payload);
  Run m;
  m.seq = r.u64("seq");
  m.name = r.bytes("choice name");
  const uint8_t mode = r.u8("run mode");
  if (mode != static_cast<uint8_t>(RunMode::kCheckAndMeasure) && mode != static_cast<uint8_t>(RunMode::kTimeRuns)) {
    r.reject("run mode", fmt::format("is {} (1 or 2 expected)", mode));
  }
  m.mode = static_cast<RunMode>(mode);
  m.has_binaries = r.boolean("has binaries");
  if (m.has_binaries) m.binaries = codec::get_binaries(r);
  m.best_us = r.f64("best us");
  m.n = r.i32("n");
  m.graph = r.boolean("graph");
  KILN_RETURN_IF_ERROR(r.finish("bench run"));
  return m;
}

Result<RunResult> decode_run_result(std::string_view payload) {
  Reader r(payload);
  RunResult m;
  m.seq = r.u64("seq");
  m.status = codec::get_outcome(r);
  m.error = r.f64("error");
  m.us = r.f64s("samples");
  m.graph = r.boolean("graph");
  m.partial = r.boolean("partial");
  m.poisoned = r.boolean("poisoned");
  m.worker_seconds = r.f64("worker seconds");
  KILN_RETURN_IF_ERROR(r.finish("bench run result"));
  return m;
}

Result<End> decode_end(std::string_view payload) {
  Reader r(payload);
  End m;
  m.seq = r.u64("seq");
  KILN_RETURN_IF_ERROR(r.finish("bench end"));
  return m;
}

Result<Problem> round_trip(const Problem& problem) {
  Writer w;
  put_problem(w, problem);
  Reader r(w.buffer());
  Status why;
  Problem back = get_problem(r, why);
  KILN_RETURN_IF_ERROR(r.finish("problem"));
  KILN_RETURN_IF_ERROR(why);
  if (!(back == problem)) {
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("{} does not survive the trip to the bench worker unchanged (the workload "
                                  "format cannot describe it)",
                                  problem.describe()));
  }
  return back;
}

}  // namespace kiln::runtime::detail::bench_wire
