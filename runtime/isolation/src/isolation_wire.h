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
// Every decode is bounds-checked; seq numbers tie each answer to its request.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/codec/frame.h"
#include "kiln/jit/key.h"
#include "kiln/runtime/choice.h"
#include "kiln/runtime/problem.h"
#include "kiln/runtime/tuner.h"
#include "kiln/status.h"

namespace kiln::runtime::detail::bench_wire {

enum class Type : uint16_t { kHello = 1, kBegin = 2, kBegun = 3, kRun = 4, kRunResult = 5, kEnd = 6 };

/// Bump the version when any message's layout changes; host and worker must agree exactly. Version 2:
/// kiln::codec's encodings.
inline constexpr codec::Protocol kProtocol{0x3157424Bu /* "KBW1" */, 2, static_cast<uint16_t>(Type::kEnd),
                                           "kiln bench worker"};

struct Hello {
  int32_t pid = 0;
  int32_t device = 0;
  Status status;               // not ok: the worker has no usable context (it exits after saying so)
  double context_seconds = 0;  // ensure_context() in the worker
  std::string device_name;
};

/// A choice the host wants measured: its name and the keys of its kernels (empty for externs), so the worker
/// can tell its own choice of that name is the same code.
struct ChoiceSpec {
  std::string name;
  std::vector<KernelKey> keys;
};

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

struct Begin {
  uint64_t seq = 0;
  SessionSpec session;
};

struct Begun {
  uint64_t seq = 0;
  Status status;                             // not ok: the session did not start (unknown op or reference, ...)
  std::map<std::string, std::string> unknown;  // choice name -> why the worker cannot rebuild it
  bool poisoned = false;                     // the reference left the worker's context unusable
  double worker_seconds = 0;
};

enum class RunMode : uint8_t { kCheckAndMeasure = 1, kTimeRuns = 2 };

struct Run {
  uint64_t seq = 0;
  std::string name;
  RunMode mode = RunMode::kCheckAndMeasure;
  bool has_binaries = false;
  Binaries binaries;
  double best_us = 0;  // kCheckAndMeasure: the early-drop reference (0: none yet)
  int32_t n = 0;       // kTimeRuns
  bool graph = false;  // kTimeRuns
};

struct RunResult {
  uint64_t seq = 0;
  Status status;
  double error = 0;  // relative error of the check
  std::vector<double> us;
  bool graph = false;
  bool partial = false;
  bool poisoned = false;
  double worker_seconds = 0;
};

struct End {
  uint64_t seq = 0;
};

/// Whole frames (header + payload), ready to write. Errors: a field or the frame over its size limit.
Result<std::string> encode(const Hello& m);
Result<std::string> encode(const Begin& m);
Result<std::string> encode(const Begun& m);
Result<std::string> encode(const Run& m);
Result<std::string> encode(const RunResult& m);
Result<std::string> encode(const End& m);

/// Parse a payload (the bytes after the header) of the given type. kCorrupt when malformed.
Result<Hello> decode_hello(std::string_view payload);
Result<Begin> decode_begin(std::string_view payload);
Result<Begun> decode_begun(std::string_view payload);
Result<Run> decode_run(std::string_view payload);
Result<RunResult> decode_run_result(std::string_view payload);
Result<End> decode_end(std::string_view payload);

/// The problem as the worker will decode it; kInvalidArgument when it does not survive the trip unchanged
/// (then the worker cannot be asked to measure it).
Result<Problem> round_trip(const Problem& problem);

}  // namespace kiln::runtime::detail::bench_wire
