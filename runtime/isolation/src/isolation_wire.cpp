#include "isolation_wire.h"

#include <fmt/format.h>

#include "kiln/pool/wire_codec.h"
#include "kiln/runtime/workload.h"

namespace kiln::runtime::detail::bench_wire {
namespace {

using wire::Reader;
using wire::Writer;

// Every field of BenchmarkOptions crosses the wire; a new field must be added to put_bench/get_bench (and
// kVersion bumped) or the worker would silently measure with its default.
static_assert(sizeof(BenchmarkOptions) == 56, "BenchmarkOptions changed: update the bench worker's encoding");

Writer frame(Type t) { return Writer(kMagic, kVersion, static_cast<uint16_t>(t)); }

void put_status_or_ok(Writer& w, const Status& s) {
  w.u8(s.ok() ? 1 : 0);
  if (!s.ok()) wire::put_status(w, s);
}

Status get_status_or_ok(Reader& r) {
  uint8_t ok = r.u8();
  if (ok == 1) return Status();
  if (ok != 0) {
    r.fail();
    return Status();
  }
  return wire::get_status(r);
}

void put_key(Writer& w, const KernelKey& k) {
  w.u64(k.high);
  w.u64(k.low);
}

KernelKey get_key(Reader& r) {
  KernelKey k;
  k.high = r.u64();
  k.low = r.u64();
  return k;
}

void put_spec(Writer& w, const ChoiceSpec& s) {
  w.str(s.name);
  w.u32(static_cast<uint32_t>(s.keys.size()));
  for (const auto& k : s.keys) put_key(w, k);
}

ChoiceSpec get_spec(Reader& r) {
  ChoiceSpec s;
  s.name = r.str();
  uint32_t n = r.u32();
  if (n > r.remaining() / 16) {
    r.fail();
    return s;
  }
  for (uint32_t i = 0; i < n && r.ok(); ++i) s.keys.push_back(get_key(r));
  return s;
}

void put_binaries(Writer& w, const Binaries& b) {
  w.u32(static_cast<uint32_t>(b.size()));
  for (const auto& x : b) wire::put_binary(w, x);
}

Binaries get_binaries(Reader& r) {
  Binaries out;
  uint32_t n = r.u32();
  if (n > r.remaining() / 16) {
    r.fail();
    return out;
  }
  for (uint32_t i = 0; i < n && r.ok(); ++i) out.push_back(wire::get_binary(r));
  return out;
}

void put_bench(Writer& w, const BenchmarkOptions& b) {
  w.f64(b.budget_ms);
  w.i32(b.min_reps);
  w.i32(b.max_reps);
  w.i32(b.fixed_reps);
  w.f64(b.drop_factor);
  w.f64(b.tie_fraction);
  w.i32(b.tie_rounds);
  w.u8(b.flush_l2 ? 1 : 0);
  w.f64(b.graph_below_us);
}

BenchmarkOptions get_bench(Reader& r) {
  BenchmarkOptions b;
  b.budget_ms = r.f64();
  b.min_reps = r.i32();
  b.max_reps = r.i32();
  b.fixed_reps = r.i32();
  b.drop_factor = r.f64();
  b.tie_fraction = r.f64();
  b.tie_rounds = r.i32();
  b.flush_l2 = r.u8() != 0;
  b.graph_below_us = r.f64();
  return b;
}

// A problem: its op name, then its description. Built-in descriptions travel as the workload entry
// problem_to_json writes (for the op they describe; the op name may be a registered alias such as a private
// copy of gemm); custom ones as their sizes and attributes.
enum class DescKind : uint8_t { kGemm = 0, kNorm = 1, kSoftmax = 2, kCustom = 3 };

void put_problem(Writer& w, const Problem& p) {
  w.str(p.op);
  if (const auto* c = std::get_if<CustomProblem>(&p.desc)) {
    w.u8(static_cast<uint8_t>(DescKind::kCustom));
    w.u32(static_cast<uint32_t>(c->sizes.size()));
    for (int64_t s : c->sizes) w.u64(static_cast<uint64_t>(s));
    w.u32(static_cast<uint32_t>(c->attributes.size()));
    for (const auto& [k, v] : c->attributes) {
      w.str(k);
      w.str(v);
    }
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
  w.str(problem_to_json(canonical));
}

// A problem that does not parse is not a corrupt frame but a description this build cannot read: `why` says so.
Problem get_problem(Reader& r, Status& why) {
  Problem p;
  p.op = r.str();
  uint8_t kind = r.u8();
  if (!r.ok()) return p;
  if (kind == static_cast<uint8_t>(DescKind::kCustom)) {
    CustomProblem c;
    uint32_t n = r.u32();
    if (n > r.remaining() / 8) {
      r.fail();
      return p;
    }
    for (uint32_t i = 0; i < n; ++i) c.sizes.push_back(static_cast<int64_t>(r.u64()));
    uint32_t a = r.u32();
    if (a > r.remaining() / 8) {
      r.fail();
      return p;
    }
    for (uint32_t i = 0; i < a && r.ok(); ++i) {
      std::string k = r.str();
      c.attributes[k] = r.str();
    }
    p.desc = std::move(c);
    return p;
  }
  if (kind > static_cast<uint8_t>(DescKind::kSoftmax)) {
    r.fail();
    return p;
  }
  std::string json = r.str();
  if (!r.ok()) return p;
  auto parsed = problem_from_json(json);
  if (!parsed.ok()) {
    why = std::move(parsed).status().with_context("decoding the problem of a bench request");
    return p;
  }
  p.desc = parsed->desc;
  return p;
}

void put_doubles(Writer& w, const std::vector<double>& v) {
  w.u32(static_cast<uint32_t>(v.size()));
  for (double x : v) w.f64(x);
}

std::vector<double> get_doubles(Reader& r) {
  std::vector<double> v;
  uint32_t n = r.u32();
  if (n > r.remaining() / 8) {
    r.fail();
    return v;
  }
  for (uint32_t i = 0; i < n; ++i) v.push_back(r.f64());
  return v;
}

}  // namespace

std::string encode(const Hello& m) {
  Writer w = frame(Type::kHello);
  w.i32(m.pid);
  w.i32(m.device);
  put_status_or_ok(w, m.status);
  w.f64(m.context_seconds);
  w.str(m.device_name);
  return std::move(w).finish();
}

std::string encode(const Begin& m) {
  Writer w = frame(Type::kBegin);
  w.u64(m.seq);
  put_problem(w, m.problem);
  w.u32(m.seed);
  put_bench(w, m.bench);
  w.i32(m.max_template_configs);
  w.i32(m.max_cublas_algos);
  w.u8(m.split_k ? 1 : 0);
  put_spec(w, m.reference);
  put_binaries(w, m.reference_binaries);
  w.u32(static_cast<uint32_t>(m.choices.size()));
  for (const auto& c : m.choices) put_spec(w, c);
  return std::move(w).finish();
}

std::string encode(const Begun& m) {
  Writer w = frame(Type::kBegun);
  w.u64(m.seq);
  put_status_or_ok(w, m.status);
  w.u32(static_cast<uint32_t>(m.unknown.size()));
  for (const auto& [name, why] : m.unknown) {
    w.str(name);
    w.str(why);
  }
  w.u8(m.poisoned ? 1 : 0);
  w.f64(m.worker_seconds);
  return std::move(w).finish();
}

std::string encode(const Run& m) {
  Writer w = frame(Type::kRun);
  w.u64(m.seq);
  w.str(m.name);
  w.u8(static_cast<uint8_t>(m.mode));
  w.u8(m.has_binaries ? 1 : 0);
  if (m.has_binaries) put_binaries(w, m.binaries);
  w.f64(m.best_us);
  w.i32(m.n);
  w.u8(m.graph ? 1 : 0);
  return std::move(w).finish();
}

std::string encode(const RunResult& m) {
  Writer w = frame(Type::kRunResult);
  w.u64(m.seq);
  put_status_or_ok(w, m.status);
  w.f64(m.error);
  put_doubles(w, m.us);
  w.u8(m.graph ? 1 : 0);
  w.u8(m.partial ? 1 : 0);
  w.u8(m.poisoned ? 1 : 0);
  w.f64(m.worker_seconds);
  return std::move(w).finish();
}

std::string encode(const End& m) {
  Writer w = frame(Type::kEnd);
  w.u64(m.seq);
  return std::move(w).finish();
}

Result<FrameHeader> decode_header(std::string_view bytes) {
  if (bytes.size() < wire::kHeaderSize) return make_error(ErrorCode::kCorrupt, "truncated frame header");
  Reader r(bytes.substr(0, wire::kHeaderSize));
  uint32_t magic = r.u32();
  uint16_t version = r.u16();
  uint16_t type = r.u16();
  FrameHeader h;
  h.length = r.u32();
  if (magic != kMagic) {
    return make_error(ErrorCode::kCorrupt, fmt::format("not a kiln bench worker frame (magic {:#010x})", magic));
  }
  if (version != kVersion) {
    return make_error(ErrorCode::kCorrupt, fmt::format("bench worker protocol version {} (this build speaks {}): "
                                                       "the worker executable and the library differ",
                                                       version, kVersion));
  }
  if (type < 1 || type > static_cast<uint16_t>(Type::kEnd)) {
    return make_error(ErrorCode::kCorrupt, fmt::format("unknown bench message type {}", type));
  }
  if (h.length > wire::kMaxFramePayload) {
    return make_error(ErrorCode::kCorrupt, fmt::format("frame payload of {} bytes is over the limit", h.length));
  }
  h.type = static_cast<Type>(type);
  return h;
}

Result<Hello> decode_hello(std::string_view payload) {
  Reader r(payload);
  Hello m;
  m.pid = r.i32();
  m.device = r.i32();
  m.status = get_status_or_ok(r);
  m.context_seconds = r.f64();
  m.device_name = r.str();
  KILN_RETURN_IF_ERROR(r.finish("bench hello"));
  return m;
}

Result<Begin> decode_begin(std::string_view payload) {
  Reader r(payload);
  Begin m;
  Status problem_status;
  m.seq = r.u64();
  m.problem = get_problem(r, problem_status);
  m.seed = r.u32();
  m.bench = get_bench(r);
  m.max_template_configs = r.i32();
  m.max_cublas_algos = r.i32();
  m.split_k = r.u8() != 0;
  m.reference = get_spec(r);
  m.reference_binaries = get_binaries(r);
  uint32_t n = r.u32();
  if (n > r.remaining() / 8) r.fail();
  for (uint32_t i = 0; i < n && r.ok(); ++i) m.choices.push_back(get_spec(r));
  KILN_RETURN_IF_ERROR(r.finish("bench begin"));
  KILN_RETURN_IF_ERROR(problem_status);
  return m;
}

Result<Begun> decode_begun(std::string_view payload) {
  Reader r(payload);
  Begun m;
  m.seq = r.u64();
  m.status = get_status_or_ok(r);
  uint32_t n = r.u32();
  if (n > r.remaining() / 8) r.fail();
  for (uint32_t i = 0; i < n && r.ok(); ++i) {
    std::string name = r.str();
    m.unknown[name] = r.str();
  }
  m.poisoned = r.u8() != 0;
  m.worker_seconds = r.f64();
  KILN_RETURN_IF_ERROR(r.finish("bench begun"));
  return m;
}

Result<Run> decode_run(std::string_view payload) {
  Reader r(payload);
  Run m;
  m.seq = r.u64();
  m.name = r.str();
  uint8_t mode = r.u8();
  if (mode != static_cast<uint8_t>(RunMode::kCheckAndMeasure) && mode != static_cast<uint8_t>(RunMode::kTimeRuns)) {
    r.fail();
  }
  m.mode = static_cast<RunMode>(mode);
  m.has_binaries = r.u8() != 0;
  if (m.has_binaries) m.binaries = get_binaries(r);
  m.best_us = r.f64();
  m.n = r.i32();
  m.graph = r.u8() != 0;
  KILN_RETURN_IF_ERROR(r.finish("bench run"));
  return m;
}

Result<RunResult> decode_run_result(std::string_view payload) {
  Reader r(payload);
  RunResult m;
  m.seq = r.u64();
  m.status = get_status_or_ok(r);
  m.error = r.f64();
  m.us = get_doubles(r);
  m.graph = r.u8() != 0;
  m.partial = r.u8() != 0;
  m.poisoned = r.u8() != 0;
  m.worker_seconds = r.f64();
  KILN_RETURN_IF_ERROR(r.finish("bench run result"));
  return m;
}

Result<End> decode_end(std::string_view payload) {
  Reader r(payload);
  End m;
  m.seq = r.u64();
  KILN_RETURN_IF_ERROR(r.finish("bench end"));
  return m;
}

Result<Problem> round_trip(const Problem& problem) {
  Writer w = frame(Type::kBegin);
  put_problem(w, problem);
  std::string bytes = std::move(w).finish();
  Reader r(std::string_view(bytes).substr(wire::kHeaderSize));
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
