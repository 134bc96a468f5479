// Real NVRTC compiles: these run in CI, where there is no GPU.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <stop_token>
#include <thread>

#include <unistd.h>

#include "kiln/jit/compiler.h"
#include "testing.h"
#include "kiln_test.h"
#include "shared_kernels.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

KernelSource axpy_source() { return {.name = "axpy", .entry = "axpy", .source = test_kernels::kAxpy}; }

const Target kSm90{"sm_90"};

bool is_elf(const std::string& image) { return image.size() > 4 && image.compare(0, 4, "\x7f" "ELF") == 0; }

TEST(Compile, PlainKernel) {
  KILN_ASSERT_OK_AND_ASSIGN(Binary bin, compile(axpy_source(), kSm90));
  EXPECT_TRUE(is_elf(bin.cubin));
  EXPECT_EQ(bin.arch, "sm_90");
  EXPECT_EQ(bin.entry_symbol(), "axpy");
  EXPECT_GT(bin.compile_seconds, 0.0);
  EXPECT_TRUE(bin.ptx.empty()) << "PTX is only produced on request";
  EXPECT_EQ(bin.key, make_key(axpy_source(), kSm90));
  EXPECT_EQ(bin.nvrtc_major, nvrtc_version().major);
  EXPECT_NE(bin.cubin.find("axpy"), std::string::npos) << "the kernel's symbol is in the cubin";
}

TEST(Compile, PtxOnRequest) {
  CompileSettings settings;
  settings.want_ptx = true;
  KILN_ASSERT_OK_AND_ASSIGN(Binary bin, compile(axpy_source(), kSm90, settings));
  EXPECT_NE(bin.ptx.find(".entry axpy"), std::string::npos) << bin.ptx;
  EXPECT_NE(bin.ptx.find(".target sm_90"), std::string::npos);
}

TEST(Compile, TemplateInstantiatedByNameExpression) {
  KernelSource s;
  s.name = "scale";
  s.source = test_kernels::kTemplated;
  s.name_expressions = {"scale<float, 3>", "scale<double, 5>"};
  s.entry = "scale<float, 3>";
  KILN_ASSERT_OK_AND_ASSIGN(Binary bin, compile(s, kSm90));
  ASSERT_EQ(bin.lowered_names.size(), 2u);
  EXPECT_EQ(bin.symbol_for("scale<float, 3>"), "_Z5scaleIfLi3EEviPKT_PS0_");
  EXPECT_EQ(bin.symbol_for("scale<double, 5>"), "_Z5scaleIdLi5EEviPKT_PS0_");
  EXPECT_EQ(bin.entry_symbol(), "_Z5scaleIfLi3EEviPKT_PS0_");
  EXPECT_NE(bin.cubin.find("_Z5scaleIdLi5EEviPKT_PS0_"), std::string::npos);
}

TEST(Compile, InMemoryHeader) {
  KernelSource s;
  s.name = "with_header";
  s.entry = "fill";
  s.source = R"(
#include "kiln_test/consts.h"
extern "C" __global__ void fill(int* out) { out[threadIdx.x] = kMagic; }
)";
  auto missing = compile(s, kSm90);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), ErrorCode::kCompileError);
  EXPECT_NE(missing.status().detail().find("kiln_test/consts.h"), std::string::npos)
      << missing.status().detail();

  s.headers.push_back({"kiln_test/consts.h", "constexpr int kMagic = 0x5eed;\n"});
  KILN_ASSERT_OK_AND_ASSIGN(Binary bin, compile(s, kSm90));
  EXPECT_TRUE(is_elf(bin.cubin));
}

TEST(Compile, HeaderFromIncludeDirOnDisk) {
  fs::path dir = fs::temp_directory_path() / ("kiln_inc_" + std::to_string(::getpid()));
  fs::create_directories(dir / "sub");
  std::ofstream(dir / "sub" / "k.cuh") << "#define KILN_FROM_DISK 7\n";
  KernelSource s;
  s.name = "disk";
  s.entry = "k";
  s.source = "#include \"sub/k.cuh\"\nextern \"C\" __global__ void k(int* o) { o[0] = KILN_FROM_DISK; }\n";
  s.include_dirs = {dir.string()};
  KILN_EXPECT_OK(compile(s, kSm90));
  fs::remove_all(dir);
}

TEST(Compile, OptionChangesTheCode) {
  KernelSource s;
  s.name = "factor";
  s.entry = "k";
  s.source = "extern \"C\" __global__ void k(float* o) { o[threadIdx.x] = FACTOR * 1.5f; }\n";
  s.options = {"-DFACTOR=2"};
  KILN_ASSERT_OK_AND_ASSIGN(Binary two, compile(s, kSm90));
  s.options = {"-DFACTOR=3"};
  KILN_ASSERT_OK_AND_ASSIGN(Binary three, compile(s, kSm90));
  EXPECT_NE(two.cubin, three.cubin);
  EXPECT_NE(two.key, three.key);

  KernelSource fast;
  fast.name = "sine";
  fast.entry = "k";
  fast.source = "extern \"C\" __global__ void k(float* o) { o[threadIdx.x] = sinf(o[threadIdx.x]); }\n";
  CompileSettings ptx;
  ptx.want_ptx = true;
  KILN_ASSERT_OK_AND_ASSIGN(Binary precise, compile(fast, kSm90, ptx));
  fast.options = {"--use_fast_math"};
  KILN_ASSERT_OK_AND_ASSIGN(Binary approx, compile(fast, kSm90, ptx));
  EXPECT_NE(approx.ptx.find("sin.approx"), std::string::npos);
  EXPECT_EQ(precise.ptx.find("sin.approx"), std::string::npos);
}

TEST(Compile, SyntaxErrorCarriesTheFullLog) {
  KernelSource s;
  s.name = "broken";
  s.entry = "k";
  s.source = "extern \"C\" __global__ void k(float* o) {\n  o[0] = 1\n}\n";
  auto r = compile(s, kSm90);
  ASSERT_FALSE(r.ok());
  const Status& st = r.status();
  EXPECT_EQ(st.code(), ErrorCode::kCompileError);
  EXPECT_NE(st.message().find("broken"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("sm_90"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("expected a \";\""), std::string::npos) << st.message();
  EXPECT_NE(st.detail().find("broken.cu(3): error"), std::string::npos) << st.detail();
  EXPECT_NE(st.detail().find("1 error detected in the compilation of \"broken.cu\""), std::string::npos)
      << st.detail();
}

TEST(Compile, RejectsBadInput) {
  KernelSource s = axpy_source();
  s.options = {"-arch=sm_80"};
  EXPECT_EQ(compile(s, kSm90).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(compile(axpy_source(), Target{"sm90"}).status().code(), ErrorCode::kInvalidArgument);
  KernelSource empty = axpy_source();
  empty.source.clear();
  EXPECT_EQ(compile(empty, kSm90).status().code(), ErrorCode::kInvalidArgument);
  KernelSource no_entry = axpy_source();
  no_entry.entry.clear();
  EXPECT_EQ(compile(no_entry, kSm90).status().code(), ErrorCode::kInvalidArgument);
}

// A folder with src/ (the include folder) and secret/ beside it, whose file must never be read or echoed.
struct Folders {
  fs::path root = fs::temp_directory_path() / ("kiln_outside_" + std::to_string(::getpid()));
  Folders() {
    fs::create_directories(root / "src");
    fs::create_directories(root / "secret");
    std::ofstream(root / "secret" / "secret.h") << "int kiln_secret = 424242; this is not C++\n";
    std::ofstream(root / "src" / "fine.h") << "constexpr int kFine = 1;\n";
  }
  ~Folders() { fs::remove_all(root); }
  KernelSource with(const std::string& include_line) const {
    KernelSource s;
    s.name = "outside";
    s.entry = "k";
    s.include_dirs = {(root / "src").string()};
    s.source = include_line + "\nextern \"C\" __global__ void k(int* p) { p[0] = 1; }\n";
    return s;
  }
};

TEST(Compile, IncludesOutsideTheIncludeFoldersAreRefused) {
  Folders f;
  fs::create_symlink(f.root / "secret" / "secret.h", f.root / "src" / "link.h");
  for (std::string line : {"#include \"" + (f.root / "secret" / "secret.h").string() + "\"",
                           std::string("#include \"../secret/secret.h\""), std::string("#include <link.h>"),
                           std::string("#define F \"fine.h\"\n#include F"),
                           std::string("#include \"fine.h\"\n#inc\\\nlude \"../secret/secret.h\"")}) {
    auto r = compile(f.with(line), kSm90);
    ASSERT_FALSE(r.ok()) << line;
    EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument) << r.status().to_string();
    EXPECT_NE(r.status().message().find("'outside'"), std::string::npos) << r.status().to_string();
    EXPECT_EQ(r.status().to_string_with_detail().find("424242"), std::string::npos) << "the secret was echoed";
  }
  // Inside the folder, and the toolkit's own headers, compile.
  KILN_EXPECT_OK(compile(f.with("#include \"fine.h\"\n#include <cuda_fp16.h>"), kSm90).status());
}

TEST(Compile, OutsideIncludesOnlyWhenAllowed) {
  Folders f;
  std::ofstream(f.root / "secret" / "ok.h") << "constexpr int kOk = 1;\n";
  KernelSource src = f.with("#include \"" + (f.root / "secret" / "ok.h").string() + "\"");
  EXPECT_EQ(compile(src, kSm90).status().code(), ErrorCode::kInvalidArgument);
  CompileSettings allowed;
  allowed.allow_outside_includes = true;
  KILN_EXPECT_OK(compile(src, kSm90, allowed).status());
}

TEST(Compile, NeverSearchesTheCurrentDirectory) {
  // NVRTC searches the "source file's folder", the current directory for a program named "x.cu", unless told
  // not to: a folder no one configured, whose headers the key does not see.
  Folders f;
  const fs::path before = fs::current_path();
  fs::current_path(f.root / "secret");
  std::ofstream("cwd_only.h") << "constexpr int kCwd = 1;\n";
  KernelSource s;
  s.name = "cwd";
  s.entry = "k";
  s.source = "#include \"cwd_only.h\"\nextern \"C\" __global__ void k(int* p) { p[0] = kCwd; }\n";
  auto r = compile(s, kSm90);
  fs::current_path(before);
  EXPECT_EQ(r.status().code(), ErrorCode::kCompileError) << r.status().to_string();
}

TEST(Compile, InProcessTimeoutThroughTheFlowCallback) {
  // The deadline is checked where NVRTC calls its flow callback: a deadline already passed cancels at the
  // first call, as a kTimeout.
  CompileSettings settings;
  settings.timeout = std::chrono::milliseconds(1);
  const auto start = std::chrono::steady_clock::now();
  testing::set_nvrtc_flow_hook([start] {
    while (std::chrono::steady_clock::now() < start + std::chrono::milliseconds(2)) {
    }
  });
  auto r = compile(axpy_source(), kSm90, settings);
  testing::set_nvrtc_flow_hook({});
  EXPECT_EQ(r.status().code(), ErrorCode::kTimeout) << r.status().to_string();
}

TEST(Target, ParsesArches) {
  KILN_ASSERT_OK_AND_ASSIGN(Target a, Target::parse("sm_90a"));
  EXPECT_TRUE(a.arch_specific());
  EXPECT_EQ(a.compute_capability(), 90);
  KILN_ASSERT_OK_AND_ASSIGN(Target b, Target::parse("sm_80"));
  EXPECT_FALSE(b.arch_specific());
  EXPECT_EQ(b.compute_capability(), 80);
  KILN_ASSERT_OK_AND_ASSIGN(Target c, Target::parse("sm_100f"));
  EXPECT_EQ(c.compute_capability(), 100);
  for (const char* bad : {"sm90", "compute_90", "sm_", "sm_9", "sm_90x", "SM_90", "sm_9000"}) {
    auto t = Target::parse(bad);
    ASSERT_FALSE(t.ok()) << bad;
    EXPECT_NE(t.status().message().find(bad), std::string::npos);
  }
}

TEST(Compile, EveryArchKilnTargets) {
  for (const char* arch : {"sm_80", "sm_90", "sm_90a"}) {
    KILN_ASSERT_OK_AND_ASSIGN(Binary bin, compile(axpy_source(), Target{arch}));
    EXPECT_EQ(bin.arch, arch);
    EXPECT_TRUE(is_elf(bin.cubin));
  }
}

TEST(Compile, CancelledBeforeStart) {
  std::stop_source stop;
  stop.request_stop();
  CompileSettings settings;
  settings.stop = stop.get_token();
  auto r = compile(axpy_source(), kSm90, settings);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kCancelled);
  EXPECT_NE(r.status().message().find("before it started"), std::string::npos);
}

TEST(Compile, CancelledMidCompileThroughNvrtcFlowCallback) {
  std::stop_source stop;
  std::atomic<int> polls{0};
  // The stop is requested from inside NVRTC's own callback: the compile is certainly under way.
  testing::set_nvrtc_flow_hook([&] {
    if (polls.fetch_add(1) == 0) stop.request_stop();
  });
  CompileSettings settings;
  settings.stop = stop.get_token();
  auto r = compile(axpy_source(), kSm90, settings);
  testing::set_nvrtc_flow_hook({});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kCancelled) << r.status().to_string();
  EXPECT_EQ(r.status().message().find("before it started"), std::string::npos);
  EXPECT_GE(polls.load(), 1);

  // A token that is never triggered leaves the compile alone.
  std::stop_source idle;
  settings.stop = idle.get_token();
  KILN_EXPECT_OK(compile(axpy_source(), kSm90, settings));
}

TEST(Compile, PrecompiledHeadersGiveTheSameBinary) {
  KernelSource s;
  s.name = "half_kernel";
  s.entry = "k";
  s.source = "#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n"
             "extern \"C\" __global__ void k(__half* x) { x[threadIdx.x] = __hadd(x[threadIdx.x], x[0]); }\n";
  KILN_ASSERT_OK_AND_ASSIGN(Binary plain, compile(s, kSm90));
  fs::path dir = fs::temp_directory_path() / ("kiln_pch_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  CompileSettings pch;
  pch.use_pch = true;
  pch.pch_dir = dir.string();
  KILN_ASSERT_OK_AND_ASSIGN(Binary first, compile(s, kSm90, pch));
  KILN_ASSERT_OK_AND_ASSIGN(Binary second, compile(s, kSm90, pch));
  EXPECT_EQ(plain.key, first.key) << "PCH is a compile-speed setting: it must not change the key";
  EXPECT_EQ(plain.cubin, second.cubin);
  EXPECT_NE(second.log.find("using precompiled header"), std::string::npos) << second.log;
  fs::remove_all(dir);
}

TEST(Compile, ConcurrentCompilesInThreads) {
  constexpr int kThreads = 6;
  std::vector<Result<Binary>> results(kThreads, Result<Binary>(make_error(ErrorCode::kInternal, "not run")));
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      KernelSource s = axpy_source();
      s.options = {"-DVARIANT=" + std::to_string(i)};
      results[i] = compile(s, kSm90);
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kThreads; ++i) KILN_EXPECT_OK(results[i]);
  for (int i = 1; i < kThreads; ++i) EXPECT_NE(results[i]->key, results[0]->key);
}

}  // namespace
}  // namespace kiln
