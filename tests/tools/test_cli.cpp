// kiln::cli::run called many times in one process, as the CLI fuzz target calls it: parse-only runs check
// every option and run no command, and the arguments a command's options write into are alive while they are
// written (the parse-only mode once dropped the callbacks that owned them, and the parse wrote into freed
// memory: fuzz_cli's heap-use-after-free).
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"

namespace kiln::cli {
namespace {

namespace fs = std::filesystem;

// A command made like kiln's own (arguments in a shared_ptr that only its callback keeps, see on_run) that
// counts its live arguments, so that a write into freed ones is seen without a sanitizer.
int live_probe_args = 0;
std::vector<std::string> probe_runs;

struct ProbeArgs {
  std::string value;
  ProbeArgs() { ++live_probe_args; }
  ~ProbeArgs() { --live_probe_args; }
};

void add_probe_command(CLI::App& app) {
  auto args = std::make_shared<ProbeArgs>();
  CLI::App* cmd = app.add_subcommand("test-probe", "A test's command");
  cmd->group("");
  cmd->add_option("--value", args->value, "Any text")
      ->check(CLI::Validator(
          [](std::string&) { return live_probe_args > 0 ? std::string() : std::string("written after its arguments were freed"); },
          "TEXT"));
  on_run(cmd, args, [](const ProbeArgs& a) {
    probe_runs.push_back(a.value);
    return a.value == "fail" ? 3 : 0;
  });
}

KILN_REGISTER_COMMAND(add_probe_command);

int run_args(std::initializer_list<std::string> words, bool run_commands) {
  std::vector<std::string> args{"kiln"};
  args.insert(args.end(), words);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  return run(static_cast<int>(args.size()), argv.data(), run_commands);
}

class CliRun : public ::testing::Test {
 protected:
  void SetUp() override {
    probe_runs.clear();
    dir_ = fs::temp_directory_path() / ("kiln-test-cli-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(CliRun, ParseOnlyWritesIntoLiveArgumentsAndRunsNothing) {
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(run_args({"test-probe", "--value", "x" + std::to_string(i)}, false), 0);
  }
  EXPECT_TRUE(probe_runs.empty()) << "a parse-only run ran the command";
  EXPECT_EQ(live_probe_args, 0) << "the arguments outlived the run";
}

TEST_F(CliRun, ParseOnlyParsesEveryCommandOneAfterAnother) {
  const std::string cache = (dir_ / "cache").string();
  EXPECT_EQ(run_args({"cache", "stats", "--cache-dir", cache, "--json"}, false), 0);
  EXPECT_EQ(run_args({"cache", "clear", "--cache-dir", cache, "--yes"}, false), 0);
  EXPECT_EQ(run_args({"tune", "--workload", "w.json", "--cache-dir", cache, "--top", "3"}, false), 0);
  EXPECT_EQ(run_args({"precompile", "--workload", "w.json", "--configs", "2"}, false), 0);
  EXPECT_EQ(run_args({"tune", "--workload", "w.json", "--effort", "quick", "--budget", "30"}, false), 0);
  EXPECT_EQ(run_args({"precompile", "--workload", "w.json", "--effort", "exhaustive"}, false), 0);
  EXPECT_EQ(run_args({"warmup", "--device", "1"}, false), 0);
  EXPECT_EQ(run_args({"version", "--json"}, false), 0);
  EXPECT_FALSE(fs::exists(dir_)) << "a parse-only run opened the cache";
}

TEST_F(CliRun, ParseOnlyStillRefusesBadOptionsAndCommands) {
  testing::internal::CaptureStderr();
  EXPECT_NE(run_args({"tune", "--workload", "w.json", "--top", "0"}, false), 0);
  EXPECT_NE(run_args({"tune", "--workload", "w.json", "--effort", "turbo"}, false), 0);
  EXPECT_NE(run_args({"precompile", "--workload", "w.json", "--effort", ""}, false), 0);
  EXPECT_NE(run_args({"cache", "stats", "--cache-dir", ""}, false), 0);
  EXPECT_EQ(run_args({"cahce", "stats"}, false), 2);
  EXPECT_NE(run_args({"cache"}, false), 0);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("unknown command 'cahce'"), std::string::npos) << err;
  EXPECT_NE(err.find("unknown effort 'turbo'"), std::string::npos) << err;
}

TEST_F(CliRun, CommandsRunAfterParseOnlyRunsWithTheirOwnArguments) {
  EXPECT_EQ(run_args({"test-probe", "--value", "parsed"}, false), 0);
  EXPECT_EQ(run_args({"test-probe", "--value", "first"}, true), 0);
  EXPECT_EQ(run_args({"test-probe", "--value", "fail"}, true), 3);
  EXPECT_EQ(probe_runs, (std::vector<std::string>{"first", "fail"}));
  // A real command after them: a reader on a folder with no cache says so and fails.
  testing::internal::CaptureStderr();
  EXPECT_NE(run_args({"cache", "stats", "--cache-dir", (dir_ / "none").string()}, true), 0);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("kiln cache stats"), std::string::npos) << err;
  EXPECT_EQ(live_probe_args, 0);
}

// A configuration the tuner seeds and chooses (a swap-AB decode tile with the deepest ring that fits) lies
// outside the sampled grid's stages (3-8); `kiln templates render` must still print it, and still refuse values
// that are no tile size at all.
TEST_F(CliRun, RenderTakesATunedSeedOutsideTheSampledGrid) {
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  const int rc = run_args({"templates", "render", "gemm_wgmma_sm90", "--arch", "sm_90a", "bm=64", "bn=32",
                           "swap_ab=true", "cluster_k=2", "stages=16"},
                          true);
  const std::string out = testing::internal::GetCapturedStdout(), err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(rc, 0) << err;
  EXPECT_NE(out.find("// configuration gemm_wgmma_swab_64x32x64_c1_s16_"), std::string::npos) << out.substr(0, 300);
  EXPECT_NE(out.find("stages=16"), std::string::npos);

  for (const char* bad : {"stages=0", "stages=65537"}) {
    testing::internal::CaptureStderr();
    EXPECT_EQ(run_args({"templates", "render", "gemm_wgmma_sm90", "--arch", "sm_90a", bad}, true), 2) << bad;
    const std::string why = testing::internal::GetCapturedStderr();
    EXPECT_NE(why.find("is out of range: stages is from 1 to 65536"), std::string::npos) << why;
  }
  // Within the span, the template's constraints decide (a ring far larger than shared memory).
  testing::internal::CaptureStderr();
  EXPECT_EQ(run_args({"templates", "render", "gemm_wgmma_sm90", "--arch", "sm_90a", "stages=40"}, true), 2);
  EXPECT_NE(testing::internal::GetCapturedStderr().find("constraints rule it out"), std::string::npos);
}

}  // namespace
}  // namespace kiln::cli
