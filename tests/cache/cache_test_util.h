// Helpers shared by the cache tests: a fresh folder per test, store options for it, sample records.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <random>
#include <string>

#include <fmt/format.h>

#include "kiln/cache/problem_key.h"
#include "kiln/cache/records.h"
#include "kiln/cache/store.h"
#include "kiln/jit/compiler.h"

namespace kiln::cache::testing {

/// A new empty folder under the system temp dir, removed when the object goes.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = (std::filesystem::temp_directory_path() / fmt::format("kiln-cache-test-{}-{:08x}", ::getpid(), rd())).string();
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

/// Options for a store in `dir` with no background ingest thread: staged entries are ingested only when the
/// test says so (sync(), the writer's own writes, close), so what a test sees does not depend on timing.
inline StoreOptions store_options(const TempDir& dir, Role role = Role::kAuto) {
  StoreOptions o;
  o.dir = dir.path();
  o.role = role;
  o.ingest_interval = std::chrono::milliseconds(0);
  return o;
}

inline ProblemKey sample_problem(int m, int n = 4096, int k = 4096) {
  ProblemKey p;
  p.op = "gemm";
  p.operands = {{"f16", "row", {m, k}}, {"f16", "col", {k, n}}, {"f16", "row", {m, n}}};
  p.epilogue = "bias";
  p.attributes = {{"split_k", "1"}};
  p.device = {"NVIDIA H200", 132, 9, 0};
  p.versions = {13000, "13.0", "130100", "0.1.0"};
  return p;
}

/// A fake binary: an ELF-looking cubin of `bytes` bytes whose content depends on `seed`.
inline Binary fake_binary(uint64_t seed, size_t bytes = 4096, std::string arch = "sm_90") {
  Binary b;
  b.key = {seed * 0x9e3779b97f4a7c15ull + 1, seed ^ 0xabcdefull};
  b.name = fmt::format("kernel_{}", seed);
  b.entry = "entry";
  b.arch = std::move(arch);
  b.cubin.assign(bytes, '\0');
  std::mt19937_64 rng(seed);
  for (auto& c : b.cubin) c = static_cast<char>(rng());
  b.cubin.replace(0, 4, "\x7f" "ELF");
  b.nvrtc_major = nvrtc_version().major;
  b.nvrtc_minor = nvrtc_version().minor;
  b.compile_seconds = 0.25;
  b.lowered_names = {{"entry<1>", "_Z5entryILi1EEvv"}};
  return b;
}

}  // namespace kiln::cache::testing
