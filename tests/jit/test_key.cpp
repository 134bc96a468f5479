// KernelKey: stable across processes and paths, and sensitive to every input that changes the binary.
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "includes.h"
#include "kiln/jit/compiler.h"
#include "kiln/jit/key.h"
#include "kiln_test.h"
#include "shared_kernels.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
const Target kSm90{"sm_90"};

// kiln_key_probe next to this test executable (so a packed copy on another machine finds it), else the one
// CMake built.
std::string probe_path() {
  std::error_code ec;
  fs::path next_to_me = fs::read_symlink("/proc/self/exe", ec).parent_path() / "kiln_key_probe";
  return !ec && fs::exists(next_to_me) ? next_to_me.string() : std::string(KILN_KEY_PROBE);
}

std::string run_probe(const std::string& include_dir) {
  std::string cmd = probe_path() + (include_dir.empty() ? "" : " '" + include_dir + "'");
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return "popen failed";
  std::array<char, 128> buf{};
  std::string out;
  while (fgets(buf.data(), buf.size(), p) != nullptr) out += buf.data();
  int rc = pclose(p);
  if (rc != 0) return "probe exited with " + std::to_string(rc);
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

// A directory holding kiln_probe/tile.cuh (which includes a sibling by a quoted relative path).
fs::path make_header_dir(const std::string& tag, const std::string& tile_value) {
  fs::path dir = fs::temp_directory_path() / ("kiln_key_" + tag + "_" + std::to_string(::getpid()));
  fs::create_directories(dir / "kiln_probe");
  std::ofstream(dir / "kiln_probe" / "tile.cuh") << "#include \"inner.cuh\"\nconstexpr int kTile = kInner * 2;\n";
  std::ofstream(dir / "kiln_probe" / "inner.cuh") << "constexpr int kInner = " << tile_value << ";\n";
  return dir;
}

TEST(KernelKey, HexRoundTrip) {
  KernelKey k = make_key(test_kernels::probe_source(""), kSm90);
  std::string hex = k.hex();
  ASSERT_EQ(hex.size(), 32u);
  EXPECT_EQ(hex.find_first_not_of("0123456789abcdef"), std::string::npos);
  KILN_ASSERT_OK_AND_ASSIGN(KernelKey back, KernelKey::parse(hex));
  EXPECT_EQ(back, k);
  EXPECT_FALSE(KernelKey::parse("xyz").ok());
  EXPECT_FALSE(KernelKey::parse(std::string(32, 'g')).ok());
}

TEST(KernelKey, SameInTwoSeparateProcesses) {
  std::string here = make_key(test_kernels::probe_source(""), kSm90).hex();
  std::string first = run_probe("");
  std::string second = run_probe("");
  EXPECT_EQ(first, here);
  EXPECT_EQ(second, here);
}

TEST(KernelKey, SameWhenTheSameHeadersLiveAtDifferentPaths) {
  fs::path a = make_header_dir("a", "16");
  fs::path b = make_header_dir("b", "16");
  KernelKey ka = make_key(test_kernels::probe_source(a.string()), kSm90);
  KernelKey kb = make_key(test_kernels::probe_source(b.string()), kSm90);
  EXPECT_EQ(ka, kb);
  EXPECT_EQ(run_probe(b.string()), ka.hex()) << "another process, another path, same key";
  // And the headers really are part of it: the same include at a third path with other content differs.
  fs::path c = make_header_dir("c", "32");
  EXPECT_NE(make_key(test_kernels::probe_source(c.string()), kSm90), ka);
  KILN_EXPECT_OK(compile(test_kernels::probe_source(a.string()), kSm90));
  for (const auto& d : {a, b, c}) fs::remove_all(d);
}

TEST(KernelKey, ChangesWhenANestedHeaderOnDiskChanges) {
  fs::path dir = make_header_dir("edit", "16");
  KernelKey before = make_key(test_kernels::probe_source(dir.string()), kSm90);
  // Same size, new content: the file's size is unchanged, so the content hash must be what catches it.
  std::ofstream(dir / "kiln_probe" / "inner.cuh") << "constexpr int kInner = 61;\n";
  fs::last_write_time(dir / "kiln_probe" / "inner.cuh",
                      fs::last_write_time(dir / "kiln_probe" / "inner.cuh") + std::chrono::seconds(2));
  EXPECT_NE(make_key(test_kernels::probe_source(dir.string()), kSm90), before);
  fs::remove_all(dir);
}

// Rewrites `path` with `text` and moves its mtime on, so the header cache cannot keep the old facts.
void rewrite(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::trunc) << text;
  fs::last_write_time(path, fs::last_write_time(path) + std::chrono::seconds(2));
}

TEST(KernelKey, CoversTheContentOfAnAbsoluteInclude) {
  fs::path dir = fs::temp_directory_path() / ("kiln_key_abs_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "abs.cuh") << "constexpr int kAbs = 1;\n";
  KernelSource src;
  src.name = "abs";
  src.entry = "k";
  src.source = "#include \"" + (dir / "abs.cuh").string() + "\"\nextern \"C\" __global__ void k() {}\n";
  KernelKey before = make_key(src, kSm90);
  rewrite(dir / "abs.cuh", "constexpr int kAbs = 2;\n");
  EXPECT_NE(make_key(src, kSm90), before) << "the key ignored the content of an absolute include";
  fs::remove_all(dir);
}

// A header past kHeaderScanBytes is hashed in pieces, never held whole: its content still makes the key, the lines
// it includes are not followed. One at the limit is read and followed as any other.
TEST(KernelKey, AHugeHeaderIsHashedInPiecesAndNotFollowed) {
  fs::path dir = fs::temp_directory_path() / ("kiln_key_huge_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto make = [&](const std::string& name, uint64_t size) {
    std::ofstream(dir / name) << "#include \"nested.cuh\"\n";
    fs::resize_file(dir / name, size);  // sparse: no disk, zeros after the first line
  };
  std::ofstream(dir / "nested.cuh") << "constexpr int kNested = 1;\n";
  make("huge.cuh", detail::kHeaderScanBytes + 4096);
  make("limit.cuh", detail::kHeaderScanBytes);
  auto source = [&](const std::string& header) {
    KernelSource src;
    src.name = "huge";
    src.entry = "k";
    src.source = "#include \"" + header + "\"\nextern \"C\" __global__ void k() {}\n";
    src.options = {"-I" + dir.string()};
    return src;
  };
  const KernelKey huge = make_key(source("huge.cuh"), kSm90), limit = make_key(source("limit.cuh"), kSm90);
  // The huge file's last byte changes its key.
  {
    std::fstream f(dir / "huge.cuh", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(detail::kHeaderScanBytes + 4095));
    f.put('x');
  }
  fs::last_write_time(dir / "huge.cuh", fs::last_write_time(dir / "huge.cuh") + std::chrono::seconds(2));
  const KernelKey huge_edited = make_key(source("huge.cuh"), kSm90);
  EXPECT_NE(huge_edited, huge);
  // What it includes is not followed; what the file at the limit includes is.
  rewrite(dir / "nested.cuh", "constexpr int kNested = 2;\n");
  EXPECT_EQ(make_key(source("huge.cuh"), kSm90), huge_edited);
  EXPECT_NE(make_key(source("limit.cuh"), kSm90), limit);
  fs::remove_all(dir);
}

TEST(KernelKey, DirectivesHiddenBySplicesCommentsOrDigraphsStillCount) {
  fs::path dir = fs::temp_directory_path() / ("kiln_key_hidden_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "h.cuh") << "constexpr int kH = 1;\n";
  for (std::string spelling : {"#inc\\\nlude \"h.cuh\"", "#/* c */include \"h.cuh\"", "%:include \"h.cuh\"",
                               "  #  include_next <h.cuh>"}) {
    KernelSource src;
    src.name = "hidden";
    src.entry = "k";
    src.include_dirs = {dir.string()};
    src.source = spelling + "\nextern \"C\" __global__ void k() {}\n";
    rewrite(dir / "h.cuh", "constexpr int kH = 1;\n");
    KernelKey before = make_key(src, kSm90);
    rewrite(dir / "h.cuh", "constexpr int kH = 2;\n");
    EXPECT_NE(make_key(src, kSm90), before) << spelling;
  }
  fs::remove_all(dir);
}

TEST(KernelKey, EveryInputThatChangesTheBinaryChangesIt) {
  const KernelSource base = test_kernels::probe_source("");
  const KernelKey k0 = make_key(base, kSm90);
  std::set<KernelKey> keys = {k0};
  auto expect_new = [&](const KernelSource& s, const Target& t, const char* what) {
    KernelKey k = make_key(s, t);
    EXPECT_NE(k, k0) << what;
    EXPECT_TRUE(keys.insert(k).second) << what << " collides with another variant";
  };
  KernelSource s = base;
  s.source += "// a comment\n";
  expect_new(s, kSm90, "source text");
  s = base;
  s.options.push_back("-DC=3");
  expect_new(s, kSm90, "an added option");
  s = base;
  s.options[0] = "-DA=5";
  expect_new(s, kSm90, "an option's value");
  s = base;
  s.headers[0].content = "constexpr int kProbe = 4;\n";
  expect_new(s, kSm90, "a header's content");
  s = base;
  s.headers[0].name = "probe/other.h";
  expect_new(s, kSm90, "a header's name");
  s = base;
  s.name_expressions.push_back("scale<double, 2>");
  expect_new(s, kSm90, "a name expression");
  s = base;
  s.name = "probe2";
  expect_new(s, kSm90, "the program name (it appears in line info)");
  expect_new(base, Target{"sm_90a"}, "the arch");
  expect_new(base, Target{"sm_80"}, "another arch");
}

// Threads keying the same new texts at once (a pool compiling a template's configurations, which share their
// headers) race to scan them; each must get the same key as one thread alone. The include scans of in-memory
// texts are memoised by content: a thread whose scan lost the race once iterated a vector only it still held
// (compile_test failed half its runs with corrupted strings; here, without ASan, the freed vector is often still
// readable: CI's ASan pass names the use after free).
TEST(KernelKey, ThreadsKeyingTheSameNewTextsAgree) {
  for (int round = 0; round < 40; ++round) {
    KernelSource s = test_kernels::probe_source("");
    const std::string salt = "// round " + std::to_string(round) + " " + std::to_string(::getpid()) + "\n";
    s.source = salt + s.source;
    for (auto& h : s.headers) h.content = salt + "#include <cuda_fp16.h>\n" + h.content;
    std::array<KernelKey, 8> keys;
    std::vector<std::thread> threads;
    for (size_t i = 0; i < keys.size(); ++i) threads.emplace_back([&, i] { keys[i] = make_key(s, kSm90); });
    for (auto& t : threads) t.join();
    const KernelKey alone = make_key(s, kSm90);
    for (const KernelKey& k : keys) EXPECT_EQ(k, alone) << "round " << round;
  }
}

TEST(KernelKey, OptionOrderAndSpeedOnlyOptionsDoNotChangeIt) {
  KernelSource a = test_kernels::probe_source("");
  KernelSource b = a;
  std::reverse(b.options.begin(), b.options.end());
  EXPECT_EQ(make_key(a, kSm90), make_key(b, kSm90));
  b.options.push_back("-pch");
  b.options.push_back("-pch-dir=/tmp/somewhere");
  EXPECT_EQ(make_key(a, kSm90), make_key(b, kSm90));
  EXPECT_EQ(canonical_options({"-DB=2", "-I/abs/path", "-DA=1", "--pch-messages=false"}),
            (std::vector<std::string>{"-DA=1", "-DB=2"}));
}

TEST(KernelKey, NoPathsOrHostNamesInTheHashedInputs) {
  // The key is a pure function of content: moving the CUDA include dir's files would not change it, and the
  // only paths kiln knows (include dirs) are excluded from the canonical options.
  KernelSource s = test_kernels::probe_source("");
  s.options.push_back("-I/home/someone/include");
  s.options.push_back("--include-path=/opt/x");
  EXPECT_EQ(make_key(s, kSm90), make_key(test_kernels::probe_source(""), kSm90));
}

// The directive view skips runs of uninteresting characters in bulk; it must give exactly what the plain
// character-at-a-time definition below gives (keys of existing caches depend on it), on the CUDA headers
// every template includes and on random text dense in the characters that change state.
std::string directive_view_by_character(std::string_view text) {
  std::string out;
  enum { kCode, kLine, kBlock, kString, kChar } state = kCode;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\\' && i + 1 < text.size() &&
        (text[i + 1] == '\n' || (text[i + 1] == '\r' && i + 2 < text.size() && text[i + 2] == '\n'))) {
      i += text[i + 1] == '\r' ? 2 : 1;
      continue;
    }
    const char c = text[i];
    const char next = i + 1 < text.size() ? text[i + 1] : '\0';
    switch (state) {
      case kCode:
        if (c == '/' && next == '/') state = kLine, out.push_back(' '), ++i;
        else if (c == '/' && next == '*') state = kBlock, out.push_back(' '), ++i;
        else {
          if (c == '"') state = kString;
          else if (c == '\'') state = kChar;
          out.push_back(c);
        }
        break;
      case kLine:
        if (c == '\n') state = kCode, out.push_back(c);
        break;
      case kBlock:
        if (c == '*' && next == '/') state = kCode, ++i;
        else if (c == '\n') out.push_back(c);
        break;
      case kString:
      case kChar:
        out.push_back(c);
        if (c == '\\' && next != '\0' && next != '\n') out.push_back(next), ++i;
        else if (c == (state == kString ? '"' : '\'') || c == '\n') state = kCode;
        break;
    }
  }
  return out;
}

TEST(KernelKey, TheDirectiveViewIsTheCharacterByCharacterOne) {
  int files = 0;
  for (const auto& dir : cuda_include_dirs()) {
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (!it->is_regular_file() || it->file_size() > (4u << 20)) continue;
      std::ifstream in(it->path(), std::ios::binary);
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      ASSERT_EQ(detail::directive_view(text), directive_view_by_character(text)) << it->path();
      ++files;
    }
  }
  EXPECT_GT(files, 100) << "the CUDA toolkit's headers were not found";
  std::mt19937 rng(16);
  const std::string alphabet = "/*\"'\\\n\r #ia";
  for (int round = 0; round < 20000; ++round) {
    std::string text(rng() % 48, ' ');
    for (char& c : text) c = alphabet[rng() % alphabet.size()];
    ASSERT_EQ(detail::directive_view(text), directive_view_by_character(text)) << "round " << round;
  }
}

}  // namespace
}  // namespace kiln
