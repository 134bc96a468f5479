// Writes the seed corpora of the binary-decoder fuzz targets from real encoded messages: every value kind the
// cache stores and every message of the pool's, the bench worker's and the local group's protocols, each
// made by kiln's own encoders. Usage: fuzz_make_seeds DIR (DIR/cache_value, DIR/pool_wire, ...). The seeds in
// fuzz/corpus/ were written by it; rerun it when a format changes (its version bump makes old seeds stale).
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "format.h"
#include "isolation_wire.h"
#include "kiln/codec/values.h"
#include "wire.h"

namespace {

using namespace kiln;
namespace fs = std::filesystem;
namespace bw = kiln::runtime::detail::bench_wire;

fs::path root;

// `mode` is the first byte of a seed (see fuzz_util.h and each target): how the target reads the rest.
void put(const std::string& target, const std::string& name, char mode, const std::string& bytes) {
  fs::create_directories(root / target);
  std::ofstream(root / target / name, std::ios::binary | std::ios::trunc) << mode << bytes;
}

template <class R>
std::string must(R r) {
  if (!r.ok()) {
    std::fprintf(stderr, "fuzz_make_seeds: %s\n", r.status().to_string().c_str());
    std::exit(1);
  }
  return *r;
}

Binary sample_binary(const std::string& name) {
  return Binary{.key = {0x0123456789abcdefull, 0xfedcba9876543210ull}, .name = name, .entry = "gemm<128, 128>",
                .arch = "sm_90a", .cubin = std::string("\x7f" "ELF\x02\x01\x01\x33", 8),
                .ptx = ".version 8.0\n.target sm_90a\n",
                .lowered_names = {{"gemm<128, 128>", "_Z4gemmILi128ELi128EEvv"}}, .log = "warning: none",
                .compile_seconds = 0.25, .nvrtc_major = 13};
}

Status sample_error() {
  Status s(ErrorCode::kCompileError, "kernel.cu(3): error: identifier \"x\" is undefined", "nvrtc log");
  s.with_context("compiling gemm_128x128");
  return s;
}

KernelSource sample_source() {
  KernelSource s;
  s.name = "gemm_128x128";
  s.entry = "gemm";
  s.source = "extern \"C\" __global__ void gemm() {}\n";
  s.options = {"-DTILE=128", "--std=c++17"};
  s.headers = {Header{"tile.cuh", "#pragma once\n"}};
  s.include_dirs = {"/usr/include/kiln"};
  s.name_expressions = {"gemm<128, 128>"};
  return s;
}

void cache_values() {
  const cache::Toolchain tc{13, 0, 13000, "0.1.0"};
  put("cache_value", "binary", 0, cache::encode_binary(sample_binary("gemm_128x128"), 1700000000000000000));
  cache::TimingRecord t;
  t.problem = "gemm|m=16|n=64|k=32|bf16";
  t.choice = "gemm_mma_128x128x32_w8_s3";
  t.median_us = 12.5, t.min_us = 12.0, t.p90_us = 13.0, t.samples = 40, t.measured_at_ns = 1700000000000000001;
  t.toolchain = tc;
  put("cache_value", "timing", 0, cache::encode_timing(t));
  t.ok = false, t.error = ErrorCode::kWrongResult, t.reason = "max relative error 0.5";
  put("cache_value", "timing_failed", 1, cache::encode_timing(t));
  cache::Decision d;
  d.problem = t.problem, d.choice = t.choice, d.params = {{"tile_m", "128"}, {"stages", "3"}};
  d.kernel = KernelKey{1, 2}, d.median_us = 12.5, d.decided_at_ns = 1700000000000000002, d.toolchain = tc;
  put("cache_value", "decision", 0, cache::encode_decision(d));
  d.kernel.reset(), d.choice = "cublaslt/algo17";
  put("cache_value", "decision_extern", 1, cache::encode_decision(d));
  put("cache_value", "meta", 0, cache::encode_meta({cache::kFormatVersion, "0.1.0", 1700000000000000003}));
  put("cache_value", "used", 0, cache::encode_used(1700000000000000004));
}

void pool_wire() {
  wire::Request req;
  req.job_id = 7, req.source = sample_source(), req.target.arch = "sm_90a", req.want_ptx = true;
  wire::Reply ok{7, sample_binary("gemm_128x128")};
  wire::Reply failed{8, sample_error()};
  const std::string hello = must(wire::encode(wire::Hello{1234, 13, 0}));
  put("pool_wire", "hello", 0, hello);
  put("pool_wire", "request", 0, must(wire::encode(req)));
  put("pool_wire", "reply_binary", 0, must(wire::encode(ok)));
  put("pool_wire", "reply_error", 0, must(wire::encode(failed)));
  // A worker's whole answer stream, and one payload for the target to frame (type byte 1: a request).
  put("pool_wire", "stream", 0, hello + must(wire::encode(ok)) + must(wire::encode(failed)));
  put("pool_wire", "request_payload", 1, std::string(1, '\1') + must(wire::encode(req)).substr(codec::kFrameHeaderBytes));
}

void isolation_wire() {
  bw::Hello hello{4321, 0, Status(), 0.2, "NVIDIA H200"};
  bw::Hello no_context{4321, 1, Status(ErrorCode::kUnavailable, "no device 1"), 0, ""};
  put("isolation_wire", "hello", 0, must(bw::encode(hello)));
  put("isolation_wire", "hello_failed", 0, must(bw::encode(no_context)));

  runtime::GemmProblem g;
  g.m = 16, g.n = 64, g.k = 32;
  runtime::NormProblem n;
  n.layernorm = true, n.rows = 8, n.cols = 4096, n.residual = true;
  runtime::SoftmaxProblem s;
  s.rows = 32, s.cols = 1024, s.scale = 0.125f;
  runtime::CustomProblem c;
  c.sizes = {3, 1 << 20}, c.attributes = {{"dtype", "f32"}};
  const runtime::Problem problems[] = {runtime::Problem::gemm(g), runtime::Problem::norm(n),
                                       runtime::Problem::softmax(s), runtime::Problem::custom("my_op", c)};
  const char* names[] = {"begin_gemm", "begin_norm", "begin_softmax", "begin_custom"};
  for (int i = 0; i < 4; ++i) {
    bw::Begin b;
    b.seq = 1;
    b.session.problem = problems[i];
    b.session.seed = 42;
    b.session.reference = {"reference", {KernelKey{9, 9}}};
    b.session.reference_binaries = {sample_binary("reference")};
    b.session.choices = {{"a", {KernelKey{1, 2}}}, {"cublas_default", {}}};
    put("isolation_wire", names[i], 0, must(bw::encode(b)));
  }
  bw::Begun begun{1, Status(), {{"b", "unknown template"}}, false, 0.01};
  put("isolation_wire", "begun", 0, must(bw::encode(begun)));
  bw::Run run;
  run.seq = 2, run.name = "a", run.binaries = std::vector<Binary>{sample_binary("a")}, run.best_us = 11.5;
  put("isolation_wire", "run_measure", 0, must(bw::encode(run)));
  run.mode = bw::RunMode::kTimeRuns, run.binaries.reset(), run.n = 5, run.graph = true;
  put("isolation_wire", "run_time", 0, must(bw::encode(run)));
  bw::RunResult result{2, Status(), 1e-3, {11.9, 12.0, 12.2}, {0, 1, 2}, false, false, false, 0.5};
  put("isolation_wire", "run_result", 0, must(bw::encode(result)));
  bw::RunResult faulted{3, sample_error(), 0, {}, {}, false, true, true, 0.1};
  put("isolation_wire", "run_result_poisoned", 0, must(bw::encode(faulted)));
  put("isolation_wire", "end", 0, must(bw::encode(bw::End{4})));
}

// The codec target's first byte picks the reader (fuzz_codec.cpp); 0 and 1 are the local group's messages.
void codec_values() {
  codec::Writer outcome;
  codec::put_outcome(outcome, Status());
  outcome.bytes("{\"busbw_gbps\": 310.5}", "rank result");
  put("codec", "rank_outcome_ok", 0, outcome.buffer());
  codec::Writer failed;
  codec::put_outcome(failed, sample_error());
  failed.bytes("", "rank result");
  put("codec", "rank_outcome_error", 0, failed.buffer());
  codec::Writer id;
  id.bytes(std::string(128, '\x5a'), "NCCL id");
  put("codec", "nccl_id", 1, id.buffer());
  codec::Writer source;
  const KernelSource sample = sample_source();
  codec::field(source, sample, "kernel source");
  put("codec", "source", 2, source.buffer());
  codec::Writer binaries;
  codec::put_binaries(binaries, {sample_binary("a"), sample_binary("b")});
  put("codec", "binaries", 3, binaries.buffer());
  codec::Writer error;
  codec::put_error(error, sample_error());
  put("codec", "status", 4, error.buffer());
  codec::Writer strings;
  strings.strings({"a", "bc", ""}, "strings");
  put("codec", "strings", 5, strings.buffer());
  // A local group stream: the protocol's header constants (magic "KLG1", version 2, types 1..2), then rank 0's
  // id frame and its outcome frame.
  codec::Writer header;
  header.u32(0x31474C4Bu), header.u16(2), header.u16(2);
  codec::Protocol group{0x31474C4Bu, 2, 2, "kiln local group"};
  codec::Writer id_payload, outcome_payload;
  id_payload.bytes(std::string(128, '\x5a'), "NCCL id");
  codec::put_outcome(outcome_payload, Status());
  outcome_payload.bytes("ok", "rank result");
  put("codec", "group_stream", 6,
      header.buffer() + must(codec::seal_frame(group, 1, std::move(id_payload))) +
          must(codec::seal_frame(group, 2, std::move(outcome_payload))));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_make_seeds DIR\n");
    return 2;
  }
  root = argv[1];
  cache_values();
  pool_wire();
  isolation_wire();
  codec_values();
  return 0;
}
