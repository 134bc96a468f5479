// The bench worker's protocol (kiln/runtime/isolation.h): the messages between the tuner and kiln-bench-worker.
//
// Frames of kiln::codec (kiln/codec/frame.h) with their own magic "KBW1", so a compile worker started by
// mistake, or a worker of another build, is a clean kCorrupt error. Field encodings, Binary and Status
// included, are the codec's (kiln/codec/values.h). A session, one problem at a time:
//
//   worker -> Hello (pid, device, context creation time; or why it could not open a context)
//   host   -> Begin (problem, seed, bench options, choice-generation knobs, reference name + binaries,
//             every choice to measure with its kernel keys)
//   worker -> Begun (ok: buffers allocated, reference run and captured; the names it cannot rebuild and why)
//   host   -> Run (one choice: check + measure with the best time so far, or n timed runs for a near-tie;
//             the binaries, the first time this worker sees the choice)
//   worker -> RunResult (samples, or a Status; `poisoned` when the context cannot be used any more)
//   host   -> End (the worker frees the problem's buffers)
//
// Every decode is bounds-checked; seq numbers tie each answer to its request. Each message's fields are
// listed in order beside it (kiln/codec/codec.h): that list is the layout.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/codec/frame.h"
#include "kiln/codec/values.h"
#include "kiln/jit/key.h"
#include "kiln/runtime/choice.h"
#include "kiln/runtime/problem.h"
#include "kiln/runtime/tuner.h"
#include "kiln/status.h"

namespace kiln::runtime {

// A problem: its op name, then its description (isolation_wire.cpp). One whose description this build cannot
// parse is refused (codec::Reader::refuse) rather than corrupt.
void field(codec::Writer& w, const Problem& p, std::string_view name);
void field(codec::Reader& r, Problem& p, std::string_view name);

// Every field of BenchmarkOptions crosses the wire; a new field must join this list (and the protocol's
// version be bumped) or the worker would silently measure with its default.
static_assert(sizeof(BenchmarkOptions) == 120, "BenchmarkOptions changed: update the bench worker's encoding");
KILN_CODEC_FIELDS(BenchmarkOptions, budget_ms, min_reps, max_reps, fixed_reps, drop_factor, tie_fraction, tie_rounds,
                  tie_rounds_max,
                  rank_tie_fraction, flush_l2, flush_l2_by_writing, graph_below_us, adaptive, precision, abandon_factor,
                  placements, placement_bytes, hold_on_host)

}  // namespace kiln::runtime

namespace kiln::runtime::detail::bench_wire {

enum class Type : uint16_t { kHello = 1, kBegin = 2, kBegun = 3, kRun = 4, kRunResult = 5, kEnd = 6 };

/// Bump the version when any message's layout changes; host and worker must agree exactly. Version 2:
/// kiln::codec's encodings. Version 3: BenchmarkOptions' adaptive repetitions and early abandonment. Version 4:
/// BenchmarkOptions' rank_tie_fraction. Version 5: flush_l2_by_writing. Version 6: placements, placement_bytes.
/// Version 7: RunResult's placement of each run. Version 8: BenchmarkOptions' tie_rounds_max. Version 9: hold_on_host.
inline constexpr codec::Protocol kProtocol{0x3157424Bu /* "KBW1" */, 9, static_cast<uint16_t>(Type::kEnd),
                                           "kiln bench worker"};
constexpr const codec::Protocol& protocol(Type) { return kProtocol; }

struct Hello {
  static constexpr Type kType = Type::kHello;
  int32_t pid = 0;
  int32_t device = 0;
  Status status;               // not ok: the worker has no usable context (it exits after saying so)
  double context_seconds = 0;  // ensure_context() in the worker
  std::string device_name;
};
KILN_CODEC_FIELDS(Hello, pid, device, status, context_seconds, device_name)

/// A choice the host wants measured: its name and the keys of its kernels (empty for externs), so the worker
/// can tell its own choice of that name is the same code.
struct ChoiceSpec {
  std::string name;
  std::vector<KernelKey> keys;
};
KILN_CODEC_FIELDS(ChoiceSpec, name, keys)

/// The problem of a session, as plain data (tests build it without choices or a GPU).
struct SessionSpec {
  Problem problem;
  uint32_t seed = 1;
  BenchmarkOptions bench;
  int32_t max_template_configs = 24;
  int32_t max_cublas_algos = 8;
  bool split_k = true;
  ChoiceSpec reference;
  Binaries reference_binaries;
  std::vector<ChoiceSpec> choices;
};
KILN_CODEC_FIELDS(SessionSpec, problem, seed, bench, max_template_configs, max_cublas_algos, split_k, reference,
                  reference_binaries, choices)

struct Begin {
  static constexpr Type kType = Type::kBegin;
  uint64_t seq = 0;
  SessionSpec session;
};
KILN_CODEC_FIELDS(Begin, seq, session)

struct Begun {
  static constexpr Type kType = Type::kBegun;
  uint64_t seq = 0;
  Status status;                             // not ok: the session did not start (unknown op or reference, ...)
  std::map<std::string, std::string> unknown;  // choice name -> why the worker cannot rebuild it
  bool poisoned = false;                     // the reference left the worker's context unusable
  double worker_seconds = 0;
};
KILN_CODEC_FIELDS(Begun, seq, status, unknown, poisoned, worker_seconds)

enum class RunMode : uint8_t { kCheckAndMeasure = 1, kTimeRuns = 2 };
constexpr bool known(RunMode m) { return m == RunMode::kCheckAndMeasure || m == RunMode::kTimeRuns; }

struct Run {
  static constexpr Type kType = Type::kRun;
  uint64_t seq = 0;
  std::string name;
  RunMode mode = RunMode::kCheckAndMeasure;
  std::optional<Binaries> binaries;  // only the first time this worker sees the choice
  double best_us = 0;  // kCheckAndMeasure: the early-drop reference (0: none yet)
  int32_t n = 0;       // kTimeRuns
  bool graph = false;  // kTimeRuns
};
KILN_CODEC_FIELDS(Run, seq, name, mode, binaries, best_us, n, graph)

struct RunResult {
  static constexpr Type kType = Type::kRunResult;
  uint64_t seq = 0;
  Status status;
  double error = 0;  // relative error of the check
  std::vector<double> us;
  std::vector<uint32_t> placement;  // Samples::placement
  bool graph = false;
  bool partial = false;
  bool poisoned = false;
  double worker_seconds = 0;
};
KILN_CODEC_FIELDS(RunResult, seq, status, error, us, placement, graph, partial, poisoned, worker_seconds)

struct End {
  static constexpr Type kType = Type::kEnd;
  uint64_t seq = 0;
};
KILN_CODEC_FIELDS(End, seq)

// encode(m) and decode<M>(payload): kiln/codec/frame.h.
using codec::decode;
using codec::encode;

/// The problem as the worker will decode it; kInvalidArgument when it does not survive the trip unchanged
/// (then the worker cannot be asked to measure it).
Result<Problem> round_trip(const Problem& problem);

}  // namespace kiln::runtime::detail::bench_wire
