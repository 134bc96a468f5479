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

template <class M, class Fields>
Result<std::string> seal(Type t, const M& m, Fields fields) {
  return codec::seal_record(kProtocol, static_cast<uint16_t>(t), m, fields);
}

void field(Writer& w, const ChoiceSpec& s, std::string_view) {
  w.bytes(s.name, "choice name");
  w.count(s.keys.size(), "choice keys");
  for (const auto& k : s.keys) codec::put_key(w, k);
}

void field(Reader& r, ChoiceSpec& s, std::string_view) {
  s.name = r.bytes("choice name");
  const uint32_t n = r.count("choice keys", 16);
  for (uint32_t i = 0; i < n && r.ok(); ++i) s.keys.push_back(codec::get_key(r, "choice key"));
}

void field(Writer& w, const std::vector<ChoiceSpec>& v, std::string_view) {
  w.count(v.size(), "choices");
  for (const auto& c : v) field(w, c, "choice");
}

void field(Reader& r, std::vector<ChoiceSpec>& v, std::string_view) {
  const uint32_t n = r.count("choices", 8);
  v.resize(n);
  for (uint32_t i = 0; i < n && r.ok(); ++i) field(r, v[i], "choice");
}

template <class IO, class M>
void bench_fields(IO& io, M& b) {
  io(b.budget_ms, "bench budget");
  io(b.min_reps, "bench min reps");
  io(b.max_reps, "bench max reps");
  io(b.fixed_reps, "bench fixed reps");
  io(b.drop_factor, "bench drop factor");
  io(b.tie_fraction, "bench tie fraction");
  io(b.tie_rounds, "bench tie rounds");
  io(b.flush_l2, "bench flush l2");
  io(b.graph_below_us, "bench graph below");
}

// A problem: its op name, then its description. Built-in descriptions travel as the workload entry
// problem_to_json writes (for the op they describe; the op name may be a registered alias such as a private
// copy of gemm); custom ones as their sizes and attributes.
enum class DescKind : uint8_t { kGemm = 0, kNorm = 1, kSoftmax = 2, kCustom = 3 };

void problem_field(Writer& w, const Problem& p, Status&) {
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
void problem_field(Reader& r, Problem& p, Status& why) {
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
    why = std::move(parsed).status().with_context("decoding the problem of a bench request");
    return;
  }
  p.desc = parsed->desc;
}

// Each message's fields, in order, for both directions (kiln/codec/codec.h). `why`: a problem this build
// cannot describe (see problem_field).
template <class IO, class M>
void hello_fields(IO& io, M& m) {
  io(m.pid, "pid");
  io(m.device, "device");
  codec::field(io, m.status, "status");
  io(m.context_seconds, "context seconds");
  io(m.device_name, "device name");
}

template <class IO, class M>
void begin_fields(IO& io, M& m, Status& why) {
  io(m.seq, "seq");
  problem_field(io, m.session.problem, why);
  io(m.session.seed, "seed");
  bench_fields(io, m.session.bench);
  io(m.session.max_template_configs, "max template configs");
  io(m.session.max_cublas_algos, "max cublas algos");
  io(m.session.split_k, "split k");
  field(io, m.session.reference, "reference");
  codec::field(io, m.session.reference_binaries, "reference binaries");
  field(io, m.session.choices, "choices");
}

template <class IO, class M>
void begun_fields(IO& io, M& m) {
  io(m.seq, "seq");
  codec::field(io, m.status, "status");
  io(m.unknown, "unknown choices");
  io(m.poisoned, "poisoned");
  io(m.worker_seconds, "worker seconds");
}

template <class IO, class M>
void run_fields(IO& io, M& m) {
  io(m.seq, "seq");
  io(m.name, "choice name");
  io(m.mode, "run mode");
  io.expect(m.mode == RunMode::kCheckAndMeasure || m.mode == RunMode::kTimeRuns, "run mode", "is not 1 or 2");
  io(m.has_binaries, "has binaries");
  if (m.has_binaries) codec::field(io, m.binaries, "binaries");
  io(m.best_us, "best us");
  io(m.n, "n");
  io(m.graph, "graph");
}

template <class IO, class M>
void run_result_fields(IO& io, M& m) {
  io(m.seq, "seq");
  codec::field(io, m.status, "status");
  io(m.error, "error");
  io(m.us, "samples");
  io(m.graph, "graph");
  io(m.partial, "partial");
  io(m.poisoned, "poisoned");
  io(m.worker_seconds, "worker seconds");
}

template <class IO, class M>
void end_fields(IO& io, M& m) {
  io(m.seq, "seq");
}

}  // namespace

Result<std::string> encode(const Hello& m) { return seal(Type::kHello, m, hello_fields<Writer, const Hello>); }
Result<std::string> encode(const Begin& m) {
  Status unused;
  return seal(Type::kBegin, m, [&](Writer& w, const Begin& b) { begin_fields(w, b, unused); });
}
Result<std::string> encode(const Begun& m) { return seal(Type::kBegun, m, begun_fields<Writer, const Begun>); }
Result<std::string> encode(const Run& m) { return seal(Type::kRun, m, run_fields<Writer, const Run>); }
Result<std::string> encode(const RunResult& m) {
  return seal(Type::kRunResult, m, run_result_fields<Writer, const RunResult>);
}
Result<std::string> encode(const End& m) { return seal(Type::kEnd, m, end_fields<Writer, const End>); }

Result<Hello> decode_hello(std::string_view payload) {
  return codec::read_record<Hello>(payload, "bench hello", hello_fields<Reader, Hello>);
}
Result<Begin> decode_begin(std::string_view payload) {
  Status why;
  KILN_ASSIGN_OR_RETURN(Begin m, codec::read_record<Begin>(payload, "bench begin",
                                                           [&](Reader& r, Begin& b) { begin_fields(r, b, why); }));
  KILN_RETURN_IF_ERROR(why);
  return m;
}
Result<Begun> decode_begun(std::string_view payload) {
  return codec::read_record<Begun>(payload, "bench begun", begun_fields<Reader, Begun>);
}
Result<Run> decode_run(std::string_view payload) {
  return codec::read_record<Run>(payload, "bench run", run_fields<Reader, Run>);
}
Result<RunResult> decode_run_result(std::string_view payload) {
  return codec::read_record<RunResult>(payload, "bench run result", run_result_fields<Reader, RunResult>);
}
Result<End> decode_end(std::string_view payload) {
  return codec::read_record<End>(payload, "bench end", end_fields<Reader, End>);
}

Result<Problem> round_trip(const Problem& problem) {
  Status why;
  Writer w;
  problem_field(w, problem, why);
  Reader r(w.buffer());
  Problem back;
  problem_field(r, back, why);
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
