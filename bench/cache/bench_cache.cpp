// bench_cache: the cache's latencies and warm-start preloading, each beside its reference.
//
//   store      put/get latency through kiln's Store against raw RocksDB Put/Get of the same bytes in the
//              same run; decision lookup (the in-memory layer) against a raw RocksDB Get and an unlocked
//              std::unordered_map; staging (a reader's write) against the writer's direct write.
//   preload    N = 100, 1,000, 10,000 distinct real cubins stored under their own decisions. References, the
//              same cubins already in memory, 1..8 threads: raw cuModuleLoadData + cuModuleGetFunction, and
//              raw cuLibraryLoadData + cuLibraryGetKernel + cuKernelGetFunction. kiln's variants, each with
//              its breakdown (read = RocksDB MultiGet, verify = decode + checksum + checks, driver = load +
//              lookup): eager with the module API on 1..8 threads (serial and parallel), eager with the
//              library API, the default thread count, lazy (the default: verified in memory, each module
//              loaded at its kernel's first use; also the time to then use every kernel once), lazy with the
//              library API, and verify-only. Without a GPU only the read+verify part runs.
//   first      the first and second launch (lookup + launch + sync) of kernels preloaded eagerly and lazily
//              (kiln's lazy mode loads the module at the first lookup), under whatever CUDA_MODULE_LOADING
//              the process runs with.
//
// Distinct cubins: 16 kernels of different code size are compiled with NVRTC once; each stored variant is
// one of them with the 32-byte initialiser of a __device__ array patched to the variant's own bytes (the
// kernel reads it, and the bench checks that a launched variant returns its own bytes). So every stored
// cubin is a different image that the driver must load; none is a byte-identical copy it could dedup.
//
// Usage: bench_cache [--json FILE] [--sizes 100,1000,10000] [--reps 5] [--threads 1,2,4,8] [--quick]
//                    [--keep-dir D]   (keeps the 1,000-kernel cache in D, e.g. for `kiln warmup`)
#include <rocksdb/db.h>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "bench_util.h"
#include "format.h"
#include "kiln/cache/cache.h"
#include "kiln/jit.h"

using namespace kiln;
using namespace kiln::cache;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

using bench::Clock;
using bench::us_since;

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(std::stoi(item));
  return out;
}

std::string fresh_dir(const std::string& name) {
  std::random_device rd;
  fs::path p = fs::temp_directory_path() / fmt::format("kiln-bench-{}-{:08x}", name, rd());
  fs::create_directories(p);
  return p.string();
}

ProblemKey problem_for(int i, const DeviceFingerprint& dev, const VersionStamp& v) {
  ProblemKey p;
  p.op = "gemm";
  p.operands = {{"bf16", "row", {16 * (i + 1), 4096}}, {"bf16", "col", {4096, 8192}}, {"bf16", "row", {16 * (i + 1), 8192}}};
  p.epilogue = "none";
  p.device = dev;
  p.versions = v;
  return p;
}

// Times `fn` (called `batch` times per sample) and returns ns per call, median of `samples` samples.
template <class F>
bench::Stats ns_per_call(int samples, int batch, F&& fn) {
  std::vector<double> v;
  for (int s = 0; s < samples; ++s) {
    auto t0 = Clock::now();
    for (int i = 0; i < batch; ++i) fn(i);
    v.push_back(us_since(t0) * 1e3 / batch);
  }
  return bench::stats(v);
}

// ---- raw RocksDB reference (same column-family shape, default options)

struct RawDb {
  rocksdb::DB* db = nullptr;
  std::vector<rocksdb::ColumnFamilyHandle*> cfs;
  explicit RawDb(const std::string& path) {
    rocksdb::DBOptions o;
    o.create_if_missing = true;
    o.create_missing_column_families = true;
    std::vector<rocksdb::ColumnFamilyDescriptor> d;
    for (const char* n : {"default", "binaries", "timings", "decisions"}) d.emplace_back(n, rocksdb::ColumnFamilyOptions());
    auto s = rocksdb::DB::Open(o, path, d, &cfs, &db);
    if (!s.ok()) bench::fail(make_error(ErrorCode::kLibraryError, s.ToString()), "raw RocksDB");
  }
  ~RawDb() {
    for (auto* h : cfs) (void)db->DestroyColumnFamilyHandle(h);
    delete db;
  }
};

// ---- kernels with distinct images

constexpr uint64_t kTag[4] = {0x6b696c6e54414730ull, 0x0123456789abcdefull, 0xfedcba9876543210ull, 0x54414731b1e55ed0ull};

struct BaseKernel {
  Binary binary;
  size_t tag_offset = 0;
};

std::vector<BaseKernel> compile_bases(const Target& target) {
  std::vector<BaseKernel> out(16);
  std::vector<std::jthread> compilers;
  for (int k = 0; k < 16; ++k) compilers.emplace_back([&out, &target, k] {
    int unroll = 32 << (k % 5);  // 32 .. 512: code sizes from a few KiB to tens of KiB
    KernelSource src;
    src.name = fmt::format("preload_{}", k);
    src.entry = "preload_kernel";
    src.source = fmt::format(R"(
__device__ unsigned long long kiln_tag[4] = {{0x{:x}ull, 0x{:x}ull, 0x{:x}ull, 0x{:x}ull}};
extern "C" __global__ void preload_kernel(unsigned* out, const float* in, int n) {{
  float acc = 0.f;
#pragma unroll
  for (int i = 0; i < {}; ++i) acc = fmaf(acc, 1.0001f + i * {}e-6f, in[(threadIdx.x * {} + i * 7) % n]);
  out[threadIdx.x] = (unsigned)(kiln_tag[threadIdx.x & 3] >> 8) + (acc > 1e30f ? 1u : 0u);
}}
)",
                             kTag[0], kTag[1], kTag[2], kTag[3], unroll, k + 1, k + 3);
    auto bin = bench::must(compile(src, target), "compiling " + src.name);
    std::string tag(reinterpret_cast<const char*>(kTag), sizeof kTag);
    size_t at = bin.cubin.find(tag);
    if (at == std::string::npos || bin.cubin.find(tag, at + 1) != std::string::npos) {
      bench::fail(make_error(ErrorCode::kInternal, "the tag is not in the cubin exactly once"), "patching");
    }
    out[k] = {std::move(bin), at};
  });
  compilers.clear();
  return out;
}

uint64_t variant_word(int v, int w) { return (uint64_t(v) + 1) * 0x9e3779b97f4a7c15ull ^ (uint64_t(w) << 56); }

Binary variant(const BaseKernel& base, int v) {
  Binary b = base.binary;
  uint64_t words[4] = {kTag[0], variant_word(v, 1), variant_word(v, 2), variant_word(v, 3)};
  std::memcpy(b.cubin.data() + base.tag_offset, words, sizeof words);
  b.key = KernelKey{0x6b696c6e00000000ull | uint64_t(v % 16), uint64_t(v)};
  b.name = fmt::format("{}_v{}", base.binary.name, v);
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  std::vector<int> sizes = {100, 1000, 10000};
  std::vector<int> thread_counts = {1, 2, 4, 8};
  int reps = 5;
  bool quick = false;
  std::string keep_dir;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--json") json_path = next();
    else if (a == "--sizes") sizes = parse_list(next());
    else if (a == "--threads") thread_counts = parse_list(next());
    else if (a == "--reps") reps = std::stoi(next());
    else if (a == "--quick") quick = true;
    else if (a == "--keep-dir") keep_dir = next();
    else {
      fmt::print(stderr, "usage: bench_cache [--json FILE] [--sizes 100,1000,10000] [--threads 1,2,4,8] [--reps N] [--quick] [--keep-dir D]\n");
      return 2;
    }
  }
  json out;
  out["environment"] = bench::environment();
  const char* loading = std::getenv("CUDA_MODULE_LOADING");
  out["cuda_module_loading"] = loading ? loading : "(unset: the driver's default, LAZY)";
  bool gpu = ensure_context(0).ok();
  fmt::print("bench_cache on {} ({}), CUDA_MODULE_LOADING={}\n", out["environment"].value("device", "no GPU"),
             out["environment"].value("date", ""), out["cuda_module_loading"].get<std::string>());

  // ================= store latencies =================
  {
    const int n = quick ? 300 : 2000;
    std::string dir = fresh_dir("store"), raw_dir = fresh_dir("raw");
    StoreOptions so;
    so.dir = dir;
    so.ingest_interval = std::chrono::milliseconds(0);
    auto store = bench::must(Store::open(so), "open");
    RawDb raw(raw_dir);
    DeviceFingerprint dev{"NVIDIA H200", 132, 9, 0};
    VersionStamp ver = VersionStamp::current();
    std::vector<std::string> problems;
    for (int i = 0; i < n; ++i) problems.push_back(problem_for(i, dev, ver).canonical());
    bench::Table t({"operation", "kiln (median)", "reference (median)", "reference"});
    json lat;
    auto row = [&](const std::string& name, const bench::Stats& k, const bench::Stats& r, const std::string& ref, const char* unit) {
      double div = std::string(unit) == "us" ? 1e3 : 1;
      t.add({name, fmt::format("{:.2f} {}", k.median / div, unit), r.n ? fmt::format("{:.2f} {}", r.median / div, unit) : "-", ref});
      lat[name] = {{"kiln_ns", bench::to_json(k)}, {"reference_ns", bench::to_json(r)}, {"reference", ref}};
    };

    // put_timing vs raw Put of the same encoded value.
    std::vector<TimingRecord> recs;
    for (int i = 0; i < n; ++i) {
      TimingRecord r;
      r.problem = problems[i];
      r.choice = "mma_128x128x32_w8_s3";
      r.median_us = 10 + i;
      r.samples = 100;
      recs.push_back(r);
    }
    std::vector<double> kp, rp;
    for (int i = 0; i < n; ++i) {
      auto t0 = Clock::now();
      bench::check(store->put_timing(recs[i]), "put_timing");
      kp.push_back(us_since(t0) * 1e3);
      std::string v = encode_timing(recs[i]);
      t0 = Clock::now();
      (void)raw.db->Put(rocksdb::WriteOptions(), raw.cfs[2], timing_key(recs[i].problem, recs[i].choice), v);
      rp.push_back(us_since(t0) * 1e3);
    }
    row("put timing", bench::stats(kp), bench::stats(rp), "RocksDB Put", "us");

    // decisions
    for (int i = 0; i < n; ++i) {
      Decision d;
      d.problem = problems[i];
      d.choice = "mma_128x128x32_w8_s3";
      d.params = {{"tile_m", "128"}, {"tile_n", "128"}, {"stages", "3"}};
      d.kernel = KernelKey{1, uint64_t(i)};
      bench::check(store->put_decision(d), "put_decision");
      d.decided_at_ns = now_ns();
      d.toolchain = Toolchain::current();
      (void)raw.db->Put(rocksdb::WriteOptions(), raw.cfs[3], d.problem, encode_decision(d));
    }
    std::unordered_map<std::string, std::shared_ptr<const Decision>> plain;
    for (auto& d : store->decisions()) plain[d->problem] = d;
    auto tc = TuningCache(TuneMode::kUse, std::shared_ptr<Store>(store.get(), [](Store*) {}));
    std::vector<size_t> order(n);
    for (int i = 0; i < n; ++i) order[i] = (size_t(i) * 7919) % n;
    size_t hits = 0;
    auto k_lookup = ns_per_call(31, n, [&](int i) { hits += store->decision(problems[order[i]]) != nullptr; });
    auto k_policy = ns_per_call(31, n, [&](int i) { hits += tc.lookup_decision(problems[order[i]]).ok(); });
    auto plain_lookup = ns_per_call(31, n, [&](int i) { hits += plain.find(problems[order[i]]) != plain.end(); });
    std::string val;
    auto raw_lookup = ns_per_call(11, n, [&](int i) { hits += raw.db->Get(rocksdb::ReadOptions(), raw.cfs[3], problems[order[i]], &val).ok(); });
    ProblemKey pk = problem_for(5, dev, ver);
    auto canon = ns_per_call(31, 1000, [&](int) { hits += pk.canonical().size(); });
    row("decision lookup (hit)", k_lookup, raw_lookup, "RocksDB Get", "ns");
    row("decision lookup (TuningCache)", k_policy, plain_lookup, "unordered_map find, no lock", "ns");
    row("ProblemKey::canonical()", canon, {}, "", "ns");

    // Lookups from 8 threads at once (each thread's own ns per lookup).
    {
      std::vector<double> per_thread(8);
      std::vector<std::jthread> th;
      std::atomic<int> ready{0};
      for (int t = 0; t < 8; ++t) {
        th.emplace_back([&, t] {
          ready++;
          while (ready < 8) {}
          size_t mine = 0;  // per thread: a shared counter would measure its own cache-line traffic
          auto s = ns_per_call(11, n, [&](int i) { mine += store->decision(problems[order[(i + t * 97) % n]]) != nullptr; });
          per_thread[t] = s.median;
          if (mine == 0) per_thread[t] = -1;
        });
      }
      th.clear();
      auto s = bench::stats(per_thread);
      row("decision lookup, 8 threads", s, {}, "", "ns");
    }

    // Binaries: 32 KiB values.
    std::vector<Binary> bins;
    std::mt19937_64 rng(1);
    for (int i = 0; i < n / 4; ++i) {
      Binary b;
      b.key = KernelKey{2, uint64_t(i)};
      b.name = "b";
      b.entry = "e";
      b.arch = "sm_90";
      b.cubin.resize(32 * 1024);
      for (size_t j = 0; j < b.cubin.size(); j += 8) {
        uint64_t x = rng() & 0x0f0f0f0f0f0f0f0full;  // compressible like real code, not zeros
        std::memcpy(b.cubin.data() + j, &x, 8);
      }
      b.nvrtc_major = nvrtc_version().major;
      b.nvrtc_minor = nvrtc_version().minor;
      bins.push_back(std::move(b));
    }
    std::vector<double> kb, rb, kg, rg, km;
    for (auto& b : bins) {
      auto t0 = Clock::now();
      bench::check(store->put_binary(b), "put_binary");
      kb.push_back(us_since(t0) * 1e3);
      std::string v = encode_binary(b, now_ns());
      t0 = Clock::now();
      (void)raw.db->Put(rocksdb::WriteOptions(), raw.cfs[1], binary_key(b.key), v);
      rb.push_back(us_since(t0) * 1e3);
    }
    // Reopen, so that reads come from RocksDB and not from the in-memory layer that put_binary filled.
    store.reset();
    store = bench::must(Store::open(so), "reopen");
    (void)raw.db->Flush(rocksdb::FlushOptions(), raw.cfs[1]);
    for (auto& b : bins) {
      auto t0 = Clock::now();
      auto got = store->get_binary(b.key, {}, false);
      kg.push_back(us_since(t0) * 1e3);
      if (!got.ok() || (*got)->cubin != b.cubin) bench::fail(got.status(), "get_binary");
      rocksdb::PinnableSlice ps;
      t0 = Clock::now();
      (void)raw.db->Get(rocksdb::ReadOptions(), raw.cfs[1], binary_key(b.key), &ps);
      rg.push_back(us_since(t0) * 1e3);
    }
    for (auto& b : bins) (void)store->get_binary(b.key);  // now remembered
    for (auto& b : bins) {
      auto t0 = Clock::now();
      auto got = store->get_binary(b.key);
      km.push_back(us_since(t0) * 1e3);
    }
    row("put binary (32 KiB)", bench::stats(kb), bench::stats(rb), "RocksDB Put", "us");
    row("get binary (32 KiB, from RocksDB)", bench::stats(kg), bench::stats(rg), "RocksDB Get (no decode)", "us");
    row("get binary (in memory)", bench::stats(km), {}, "", "ns");

    // A reader's write (staged as an SST batch) against the writer's direct write, and ingestion.
    {
      auto reader = bench::must(Store::open(so), "open reader");
      std::vector<double> staged;
      int m = quick ? 50 : 200;
      for (int i = 0; i < m; ++i) {
        TimingRecord r = recs[i];
        r.choice = "staged";
        auto t0 = Clock::now();
        bench::check(reader->put_timing(r), "staged put");
        staged.push_back(us_since(t0) * 1e3);
      }
      auto t0 = Clock::now();
      bench::check(store->sync(), "ingest");
      double ingest = us_since(t0) * 1e3 / m;
      row("put timing from a reader (staged)", bench::stats(staged), bench::stats(kp), "writer's direct put", "us");
      row("ingest one staged batch (writer)", bench::stats({ingest}), {}, "", "us");
    }
    fmt::print("\n{}", t.str());
    out["store"] = lat;
    out["store"]["entries"] = n;
    if (hits == 0) fmt::print("(no hits?)\n");
    store.reset();
    fs::remove_all(dir);
    fs::remove_all(raw_dir);
  }

  // ================= preload =================
  Target target = gpu ? bench::must(Target::from_device(0), "target") : Target{"sm_90"};
  auto t_compile = Clock::now();
  auto bases = compile_bases(target);
  double compile_ms = us_since(t_compile) / 1e3;
  size_t min_cubin = SIZE_MAX, max_cubin = 0;
  for (auto& b : bases) min_cubin = std::min(min_cubin, b.binary.cubin.size()), max_cubin = std::max(max_cubin, b.binary.cubin.size());
  fmt::print("\npreload: 16 base kernels for {} compiled in {:.0f} ms, cubins {}..{} bytes\n", target.arch, compile_ms,
             min_cubin, max_cubin);
  out["preload_kernels"] = {{"arch", target.arch}, {"bases", 16}, {"cubin_min_bytes", min_cubin}, {"cubin_max_bytes", max_cubin}};

  DeviceFingerprint dev = gpu ? bench::must(DeviceFingerprint::of_device(0), "device") : DeviceFingerprint{"NVIDIA H200", 132, 9, 0};
  VersionStamp ver = VersionStamp::current();
  const DriverApi* d = gpu ? bench::must(driver(), "driver") : nullptr;
  CUcontext ctx = gpu ? bench::must(current_context(), "context") : nullptr;

  // Correct first: a few patched variants, launched, return their own bytes.
  if (gpu) {
    auto dout = bench::must(DeviceBuffer::allocate(32 * sizeof(unsigned)), "alloc");
    auto din = bench::must(DeviceBuffer::allocate(1024 * sizeof(float)), "alloc");
    bench::check(din.fill_bytes(0), "fill");
    for (int v : {0, 1, 17, 999}) {
      Binary b = variant(bases[v % 16], v);
      auto k = bench::must(load_kernel(b), "load variant");
      bench::check(dout.fill_bytes(0xff), "poison");
      LaunchConfig lc;
      lc.grid = {1, 1, 1};
      lc.block = {32, 1, 1};
      bench::check(k(lc, dout.ptr(), din.ptr(), 1024), "launch");
      unsigned host[32];
      bench::check(dout.copy_to_host(host, sizeof host), "copy");
      for (int w = 1; w < 4; ++w) {
        if (host[w] != unsigned(variant_word(v, w) >> 8)) {
          bench::fail(make_error(ErrorCode::kWrongResult, fmt::format("variant {} word {} returned {:x}", v, w, host[w])), "check");
        }
      }
    }
    fmt::print("check: patched variants launch and return their own tag bytes\n");
  }

  bench::Table pt({"kernels", "MiB", "raw load 1t", "raw load best", "kiln eager 1t", "kiln eager best", "per kernel",
                   "kiln lazy (default)", "read+verify only (raw threads)"});
  json pre = json::array();
  for (int n : sizes) {
    std::string dir = fresh_dir("preload");
    std::vector<std::string> images;
    size_t bytes = 0;
    {
      StoreOptions so;
      so.dir = dir;
      so.ingest_interval = std::chrono::milliseconds(0);
      auto store = bench::must(Store::open(so), "open");
      std::vector<Binary> chunk;
      std::vector<Decision> decisions;
      for (int v = 0; v < n; ++v) {
        Binary b = variant(bases[v % 16], v);
        images.push_back(b.cubin);
        bytes += b.cubin.size();
        Decision dec;
        dec.problem = problem_for(v, dev, ver).canonical();
        dec.choice = b.name;
        dec.kernel = b.key;
        decisions.push_back(dec);
        chunk.push_back(std::move(b));
        if (chunk.size() == 512 || v == n - 1) {
          bench::check(store->put_all({}, std::move(decisions), chunk), "put_all");
          chunk.clear();
          decisions.clear();
        }
      }
      bench::check(store->flush(), "flush");
    }
    json entry = {{"kernels", n}, {"cubin_bytes", bytes}};
    StoreOptions so;
    so.dir = dir;
    so.ingest_interval = std::chrono::milliseconds(0);
    auto t_open = Clock::now();
    auto store = bench::must(Store::open(so), "reopen");
    entry["open_ms"] = us_since(t_open) / 1e3;
    int r = n >= 10000 ? std::max(2, reps / 2) : reps;

    // read + verify only (no driver): every thread count.
    double read_best = 1e30;
    for (int t : thread_counts) {
      std::vector<double> ms;
      auto decs = store->decisions(environment_prefix(dev, ver));
      if (decs.size() != size_t(n)) bench::fail(make_error(ErrorCode::kInternal, fmt::format("{} decisions", decs.size())), "select");
      for (int rep = 0; rep < r; ++rep) {
        std::atomic<size_t> next{0};
        auto t0 = Clock::now();
        std::vector<std::jthread> th;
        for (int i = 0; i < t; ++i) {
          th.emplace_back([&] {
            for (size_t j = next++; j < decs.size(); j = next++) {
              auto b = store->get_binary(*decs[j]->kernel, {}, false);
              if (!b.ok()) bench::fail(b.status(), "read");
            }
          });
        }
        th.clear();
        ms.push_back(us_since(t0) / 1e3);
      }
      auto s = bench::stats(ms);
      entry["read_verify_ms"][std::to_string(t)] = bench::to_json(s);
      read_best = std::min(read_best, s.median);
    }
    std::string raw1 = "-", rawbest = "-", k1 = "-", kbest = "-", per = "-", lazy_cell = "-";
    if (gpu) {
      // Raw references: the same images from memory, on 1..8 threads with the context current on each.
      //   module:  cuModuleLoadData + cuModuleGetFunction (what eager preload does per kernel)
      //   library: cuLibraryLoadData + cuLibraryGetKernel + cuKernelGetFunction (the context-independent API,
      //            the function put into this context)
      //   library, no function: cuLibraryLoadData + cuLibraryGetKernel only (what the context-independent part
      //            costs; under lazy loading the context's share then comes at cuKernelGetFunction/launch)
      enum class Raw { kModule, kLibrary, kLibraryNoFunction };
      auto raw_pass = [&](int t, Raw mode) {
        const bool library = mode != Raw::kModule;
        std::vector<CUmodule> mods(n);
        std::vector<CUlibrary> libs(n);
        std::atomic<size_t> next{0};
        std::atomic<int> errors{0};
        auto t0 = Clock::now();
        {
          std::vector<std::jthread> th;
          for (int i = 0; i < t; ++i) {
            th.emplace_back([&] {
              d->cuCtxSetCurrent(ctx);
              for (size_t j = next++; j < size_t(n); j = next++) {
                CUfunction f;
                if (library) {
                  CUkernel k;
                  if (d->cuLibraryLoadData(&libs[j], images[j].data(), nullptr, nullptr, 0, nullptr, nullptr, 0) != CUDA_SUCCESS ||
                      d->cuLibraryGetKernel(&k, libs[j], "preload_kernel") != CUDA_SUCCESS ||
                      (mode == Raw::kLibrary && d->cuKernelGetFunction(&f, k) != CUDA_SUCCESS)) {
                    errors++;
                  }
                } else if (d->cuModuleLoadData(&mods[j], images[j].data()) != CUDA_SUCCESS ||
                           d->cuModuleGetFunction(&f, mods[j], "preload_kernel") != CUDA_SUCCESS) {
                  errors++;
                }
              }
            });
          }
        }
        double ms = us_since(t0) / 1e3;
        for (auto m : mods) if (m) (void)d->cuModuleUnload(m);
        for (auto l : libs) if (l) (void)d->cuLibraryUnload(l);
        if (errors) bench::fail(make_error(ErrorCode::kCudaError, library ? "cuLibraryLoadData failed" : "cuModuleLoadData failed"), "raw load");
        return ms;
      };
      double raw_best = 1e30, raw_one = 0;
      bench::Table rt({"raw reference", "median by thread count"});
      for (Raw mode : {Raw::kModule, Raw::kLibrary, Raw::kLibraryNoFunction}) {
        const char* name = mode == Raw::kModule ? "raw_load_ms" : mode == Raw::kLibrary ? "raw_library_load_ms" : "raw_library_no_function_ms";
        std::string cells;
        for (int t : thread_counts) {
          std::vector<double> ms;
          for (int rep = 0; rep < r; ++rep) ms.push_back(raw_pass(t, mode));
          auto s = bench::stats(ms);
          entry[name][std::to_string(t)] = bench::to_json(s);
          cells += fmt::format("{}{:.1f} ms ({}t)", cells.empty() ? "" : ", ", s.median, t);
          if (mode == Raw::kModule && t == 1) raw_one = s.median;
          if (mode == Raw::kModule) raw_best = std::min(raw_best, s.median);
        }
        rt.add({name, cells});
      }
      fmt::print("\nraw driver loads of the same {} images from memory (medians of {})\n{}", n, r, rt.str());
      // kiln's variants, each with its breakdown (medians over the reps): read = RocksDB MultiGet, verify =
      // decode + checksum + checks, driver = module load + kernel lookup (summed over threads).
      struct Variant {
        std::string name;
        PreloadOptions options;
      };
      std::vector<Variant> variants;
      for (int t : thread_counts) {
        PreloadOptions po;
        po.lazy = false;
        po.threads = t;
        variants.push_back({fmt::format("eager_module_{}t", t), po});
      }
      for (int t : {1, 2}) {
        PreloadOptions po;
        po.lazy = false;
        po.threads = t;
        po.api = ModuleApi::kLibrary;
        variants.push_back({fmt::format("eager_library_{}t", t), po});
      }
      {
        PreloadOptions po;
        po.lazy = false;
        variants.push_back({"eager_default_threads", po});
      }
      variants.push_back({"lazy_default", PreloadOptions{}});  // the default: verified now, loaded at first use
      {
        PreloadOptions po;
        po.api = ModuleApi::kLibrary;
        variants.push_back({"lazy_library", po});
      }
      {
        PreloadOptions po;
        po.load_modules = false;
        variants.push_back({"verify_only", po});
      }
      double k_best = 1e30, k_one = 0, lazy_ms = 0, lazy_first_use_ms = 0;
      std::string k_best_name;
      bench::Table vt({"variant", "threads", "preload", "read", "verify", "driver", "first use of all (lazy)"});
      for (auto& v : variants) {
        v.options.touch = false;
        std::vector<double> ms, rd, vf, dr, first_use;
        int threads = 0;
        for (int rep = 0; rep < r; ++rep) {
          auto t0 = Clock::now();
          auto loaded = bench::must(preload(*store, v.options), "preload " + v.name);
          ms.push_back(us_since(t0) / 1e3);
          const PreloadReport& rep_r = loaded.report();
          threads = rep_r.threads;
          rd.push_back(rep_r.read_seconds * 1e3);
          vf.push_back(rep_r.verify_seconds * 1e3);
          dr.push_back(rep_r.driver_seconds * 1e3);
          size_t expect = v.options.load_modules ? size_t(n) : 0;
          if (loaded.size() != expect || (!v.options.load_modules && rep_r.verified != size_t(n))) {
            bench::fail(make_error(ErrorCode::kInternal, fmt::format("{}: {} of {} preloaded: {}", v.name, loaded.size(), n,
                                                                       rep_r.errors.empty() ? "" : rep_r.errors[0])), "preload");
          }
          if (v.options.load_modules && v.options.lazy) {
            // What lazy loading leaves to first use: resolving every kernel once (each loads its module).
            auto t1 = Clock::now();
            for (const auto& dec : store->decisions(environment_prefix(dev, ver))) {
              if (loaded.find(dec->problem) == nullptr) bench::fail(make_error(ErrorCode::kInternal, "lazy load failed"), v.name);
            }
            first_use.push_back(us_since(t1) / 1e3);
          }
        }
        auto s = bench::stats(ms);
        json vj = {{"preload_ms", bench::to_json(s)}, {"threads", threads},
                   {"read_ms", bench::to_json(bench::stats(rd))}, {"verify_ms", bench::to_json(bench::stats(vf))},
                   {"driver_ms", bench::to_json(bench::stats(dr))}};
        if (!first_use.empty()) vj["first_use_of_all_ms"] = bench::to_json(bench::stats(first_use));
        entry["kiln"][v.name] = vj;
        vt.add({v.name, std::to_string(threads), fmt::format("{:.1f} ms", s.median), fmt::format("{:.1f}", bench::stats(rd).median),
                fmt::format("{:.1f}", bench::stats(vf).median), fmt::format("{:.1f}", bench::stats(dr).median),
                first_use.empty() ? "-" : fmt::format("{:.1f} ms", bench::stats(first_use).median)});
        if (v.name == "eager_module_1t") k_one = s.median;
        if (!v.options.lazy && v.options.load_modules && s.median < k_best) k_best = s.median, k_best_name = v.name;
        if (v.name == "lazy_default") {
          lazy_ms = s.median;
          lazy_first_use_ms = bench::stats(first_use).median;
        }
      }
      fmt::print("\npreload variants, {} kernels (medians of {}; read/verify/driver in ms summed over threads)\n{}", n, r, vt.str());
      raw1 = fmt::format("{:.1f} ms", raw_one);
      rawbest = fmt::format("{:.1f} ms", raw_best);
      k1 = fmt::format("{:.1f} ms", k_one);
      kbest = fmt::format("{:.1f} ms ({})", k_best, k_best_name);
      per = fmt::format("{:.1f} us", k_best * 1e3 / n);
      lazy_cell = fmt::format("{:.1f} ms (+{:.1f} ms at first use)", lazy_ms, lazy_first_use_ms);
      entry["kiln_preload_default_ms"] = entry["kiln"]["lazy_default"]["preload_ms"];
      entry["default_threads"] = default_preload_threads(n);
      entry["default_eager_threads"] = default_preload_threads(n, true);
    }
    pt.add({std::to_string(n), fmt::format("{:.1f}", bytes / 1048576.0), raw1, rawbest, k1, kbest, per, lazy_cell,
            fmt::format("{:.1f} ms", read_best)});
    pre.push_back(entry);
    store.reset();
    if (n == 1000 && !keep_dir.empty()) {
      fs::remove_all(keep_dir);
      fs::copy(dir, keep_dir, fs::copy_options::recursive);
    }
    fs::remove_all(dir);
  }
  fmt::print("\n{}", pt.str());
  out["preload"] = pre;

  // ================= first launch after preload =================
  if (gpu) {
    std::string dir = fresh_dir("first");
    StoreOptions so;
    so.dir = dir;
    so.ingest_interval = std::chrono::milliseconds(0);
    auto store = bench::must(Store::open(so), "open");
    const int m = 64;
    for (int v = 0; v < m; ++v) {
      Binary b = variant(bases[v % 16], 20000 + v);
      Decision dec;
      dec.problem = problem_for(20000 + v, dev, ver).canonical();
      dec.choice = b.name;
      dec.kernel = b.key;
      bench::check(store->put_binary(b), "put");
      bench::check(store->put_decision(dec), "put");
    }
    auto dout = bench::must(DeviceBuffer::allocate(32 * sizeof(unsigned)), "alloc");
    auto din = bench::must(DeviceBuffer::allocate(1024 * sizeof(float)), "alloc");
    bench::check(din.fill_bytes(0), "fill");
    // The first launch includes the lookup, which under lazy preloading (the default) loads the module.
    for (bool lazy : {false, true}) {
      PreloadOptions po;
      po.lazy = lazy;
      po.touch = false;
      auto loaded = bench::must(preload(*store, po), "preload");
      std::vector<double> first, second;
      for (const auto& dec : store->decisions(environment_prefix(dev, ver))) {
        LaunchConfig lc;
        lc.grid = {1, 1, 1};
        lc.block = {32, 1, 1};
        for (auto* sink : {&first, &second}) {
          auto t0 = Clock::now();
          const Kernel* k = loaded.find(dec->problem);
          if (!k) bench::fail(make_error(ErrorCode::kInternal, "not preloaded"), "first launch");
          bench::check((*k)(lc, dout.ptr(), din.ptr(), 1024), "launch");
          bench::check(Status(d->cuCtxSynchronize() == CUDA_SUCCESS ? Status() : make_error(ErrorCode::kCudaError, "sync")), "sync");
          sink->push_back(us_since(t0));
        }
      }
      auto f = bench::stats(first), s = bench::stats(second);
      const char* mode = lazy ? "lazy" : "eager";
      fmt::print("first launch after {} preload: {:.1f} us median (p90 {:.1f}); second launch {:.1f} us; {} kernels\n", mode,
                 f.median, f.p90, s.median, first.size());
      out["first_launch_us"][mode] = {{"first", bench::to_json(f)}, {"second", bench::to_json(s)}};
    }
    store.reset();
    fs::remove_all(dir);
  }
  if (!json_path.empty() && !bench::write_json(json_path, out)) return 1;
  return 0;
}
