#include "kiln/jit/compiler.h"

#include <nvrtc.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>

#include <fmt/format.h>

#include "kiln/jit/cuda_status.h"
#include "testing.h"
#include "includes.h"
#include "options.h"

#ifndef KILN_DEFAULT_CUDA_INCLUDE
#define KILN_DEFAULT_CUDA_INCLUDE "/usr/local/cuda/include"
#endif

namespace kiln {

Status to_status(nvrtcResult result, const char* expr, const char* file, int line) {
  if (result == NVRTC_SUCCESS) return Status();
  std::string_view f(file);
  if (auto s = f.rfind('/'); s != std::string_view::npos) f.remove_prefix(s + 1);
  ErrorCode code = result == NVRTC_ERROR_CANCELLED ? ErrorCode::kCancelled : ErrorCode::kInternal;
  return make_error(code, fmt::format("{} failed: {} [{}:{}]", expr, nvrtcGetErrorString(result), f, line));
}

NvrtcVersion nvrtc_version() {
  static const NvrtcVersion v = [] {
    NvrtcVersion out;
    if (nvrtcVersion(&out.major, &out.minor) != NVRTC_SUCCESS) out = {};
    return out;
  }();
  return v;
}

const std::vector<std::string>& cuda_include_dirs() {
  static const std::vector<std::string> dirs = [] {
    auto has_headers = [](const std::string& d) {
      struct stat st {};
      return ::stat((d + "/cuda_fp16.h").c_str(), &st) == 0;
    };
    std::string dir = "/usr/local/cuda/include";
    if (const char* env = std::getenv("KILN_CUDA_INCLUDE"); env && *env) {
      dir = env;
    } else if (has_headers(KILN_DEFAULT_CUDA_INCLUDE)) {
      dir = KILN_DEFAULT_CUDA_INCLUDE;
    } else if (const char* home = std::getenv("CUDA_HOME");
               home && *home && has_headers(std::string(home) + "/include")) {
      dir = std::string(home) + "/include";
    }
    std::vector<std::string> out{dir};
    struct stat st {};
    if (::stat((dir + "/cccl").c_str(), &st) == 0 && S_ISDIR(st.st_mode)) out.push_back(dir + "/cccl");
    return out;
  }();
  return dirs;
}

std::string Binary::symbol_for(const std::string& name) const {
  for (const auto& [expr, lowered] : lowered_names) {
    if (expr == name) return lowered;
  }
  return name;
}

namespace {

// Owns an nvrtcProgram.
class Program {
 public:
  explicit Program(nvrtcProgram p) : p_(p) {}
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;
  ~Program() { nvrtcDestroyProgram(&p_); }
  nvrtcProgram get() const { return p_; }

 private:
  nvrtcProgram p_;
};

std::function<void()>& flow_hook() {
  static std::function<void()> hook;
  return hook;
}

struct FlowState {
  std::stop_token stop;
  std::chrono::steady_clock::time_point deadline;
  std::atomic<bool> timed_out{false};
};

// NVRTC's flow callback: 1 cancels. Neither a stop request nor a passed deadline ever goes back, as NVRTC
// requires of the answer.
int flow_callback(void* payload, void*) {
  if (const auto& hook = flow_hook()) hook();
  auto* state = static_cast<FlowState*>(payload);
  if (state->stop.stop_requested()) return 1;
  if (state->timed_out.load() || std::chrono::steady_clock::now() >= state->deadline) {
    state->timed_out.store(true);
    return 1;
  }
  return 0;
}

constexpr std::string_view kNoFolder = "/dev/null/";

// The log as if the program had no folder: "/dev/null/gemm.cu(3): error" reads "gemm.cu(3): error".
std::string without_folder(std::string log, const std::string& base_name) {
  const std::string full = std::string(kNoFolder) + base_name;
  for (size_t at = log.find(full); at != std::string::npos; at = log.find(full, at)) log.erase(at, kNoFolder.size());
  return log;
}

std::string program_log(nvrtcProgram p) {
  size_t n = 0;
  if (nvrtcGetProgramLogSize(p, &n) != NVRTC_SUCCESS || n <= 1) return {};
  std::string log(n, '\0');
  if (nvrtcGetProgramLog(p, log.data()) != NVRTC_SUCCESS) return {};
  log.resize(n - 1);  // drop the terminating NUL
  return log;
}

// The first line of the log that reports an error, for a one-line message.
std::string first_error_line(const std::string& log) {
  size_t pos = 0;
  while (pos < log.size()) {
    size_t eol = log.find('\n', pos);
    if (eol == std::string::npos) eol = log.size();
    std::string_view line(log.data() + pos, eol - pos);
    if (line.find("error") != std::string_view::npos) return std::string(line);
    pos = eol + 1;
  }
  return log.substr(0, log.find('\n'));
}

Status validate(const KernelSource& src) {
  if (src.source.empty()) return make_error(ErrorCode::kInvalidArgument, fmt::format("kernel '{}' has no source text", src.name));
  if (src.entry.empty()) return make_error(ErrorCode::kInvalidArgument, fmt::format("kernel '{}' names no entry point", src.name));
  for (const auto& o : src.options) {
    if (detail::is_arch_option(o)) {
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("kernel '{}': option '{}' sets the arch; give it as the Target instead", src.name, o));
    }
  }
  return Status();
}

}  // namespace

void testing::set_nvrtc_flow_hook(std::function<void()> hook) { flow_hook() = std::move(hook); }

Result<std::chrono::milliseconds> compile_timeout() {
  const char* env = std::getenv("KILN_COMPILE_TIMEOUT");
  if (!env || !*env) return std::chrono::milliseconds(300'000);
  char* end = nullptr;
  const double seconds = std::strtod(env, &end);
  if (end == env || *end != '\0' || !(seconds > 0) || seconds > 1e7) {
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("$KILN_COMPILE_TIMEOUT='{}' is not a number of seconds (e.g. 300, 2.5)", env));
  }
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

Result<Binary> compile(const KernelSource& src, const Target& target, const CompileSettings& settings) {
  KILN_RETURN_IF_ERROR(validate(src));
  KILN_RETURN_IF_ERROR(Target::parse(target.arch));
  if (!settings.allow_outside_includes && !detail::outside_includes_allowed_by_env()) {
    KILN_RETURN_IF_ERROR(detail::check_includes(src, cuda_include_dirs()));
  }
  std::chrono::milliseconds timeout = settings.timeout;
  if (timeout.count() <= 0) {
    KILN_ASSIGN_OR_RETURN(timeout, compile_timeout());
  }
  if (settings.stop.stop_requested()) {
    return make_error(ErrorCode::kCancelled, fmt::format("compile of '{}' cancelled before it started", src.name));
  }
  auto start = std::chrono::steady_clock::now();

  std::vector<const char*> header_contents, header_names;
  for (const auto& h : src.headers) {
    header_contents.push_back(h.content.c_str());
    header_names.push_back(h.name.c_str());
  }
  // NVRTC searches the folder of the "source file" for quoted includes: for a bare program name, the current
  // directory, which no one configured and whose files the key does not see. A name under /dev/null has a
  // folder that cannot exist. (--no-source-include would also stop quoted includes next to a header.)
  const std::string base_name = (src.name.empty() ? std::string("kernel") : src.name) + ".cu";
  const std::string program_name = std::string(kNoFolder) + base_name;
  nvrtcProgram raw = nullptr;
  KILN_CHECK(nvrtcCreateProgram(&raw, src.source.c_str(), program_name.c_str(), static_cast<int>(src.headers.size()),
                                header_contents.data(), header_names.data()));
  Program program(raw);
  for (const auto& e : src.name_expressions) KILN_CHECK(nvrtcAddNameExpression(program.get(), e.c_str()));
  // Copy the token: the callback may run on NVRTC's threads while `settings` belongs to the caller.
  FlowState flow;
  flow.stop = settings.stop;
  flow.deadline = start + timeout;
  KILN_CHECK(nvrtcSetFlowCallback(program.get(), &flow_callback, &flow));

  std::vector<std::string> options;
  options.push_back("-arch=" + target.arch);
  for (const auto& o : src.options) options.push_back(o);
  for (const auto& d : src.include_dirs) options.push_back("-I" + d);
  for (const auto& d : cuda_include_dirs()) options.push_back("-I" + d);
  if (settings.use_pch) {
    options.push_back("-pch");
    if (!settings.pch_dir.empty()) options.push_back("-pch-dir=" + settings.pch_dir);
  }
  std::vector<const char*> option_ptrs;
  for (const auto& o : options) option_ptrs.push_back(o.c_str());

  nvrtcResult rc = nvrtcCompileProgram(program.get(), static_cast<int>(option_ptrs.size()), option_ptrs.data());
  std::string log = without_folder(program_log(program.get()), base_name);
  if (rc == NVRTC_ERROR_CANCELLED && flow.timed_out.load() && !settings.stop.stop_requested()) {
    return make_error(ErrorCode::kTimeout,
                      fmt::format("compile of '{}' for {} timed out after {:.3g} s ($KILN_COMPILE_TIMEOUT)", src.name,
                                  target.arch, std::chrono::duration<double>(timeout).count()));
  }
  if (rc == NVRTC_ERROR_CANCELLED) {
    return make_error(ErrorCode::kCancelled, fmt::format("compile of '{}' for {} cancelled", src.name, target.arch));
  }
  if (rc != NVRTC_SUCCESS) {
    return make_error(ErrorCode::kCompileError,
                      fmt::format("NVRTC could not compile '{}' for {}: {}", src.name, target.arch,
                                  log.empty() ? std::string(nvrtcGetErrorString(rc)) : first_error_line(log)),
                      log);
  }

  Binary bin;
  bin.key = make_key(src, target);
  bin.name = src.name;
  bin.entry = src.entry;
  bin.arch = target.arch;
  bin.log = std::move(log);
  size_t n = 0;
  KILN_CHECK(nvrtcGetCUBINSize(program.get(), &n));
  bin.cubin.resize(n);
  KILN_CHECK(nvrtcGetCUBIN(program.get(), bin.cubin.data()));
  if (settings.want_ptx) {
    KILN_CHECK(nvrtcGetPTXSize(program.get(), &n));
    bin.ptx.resize(n);
    KILN_CHECK(nvrtcGetPTX(program.get(), bin.ptx.data()));
    if (!bin.ptx.empty() && bin.ptx.back() == '\0') bin.ptx.pop_back();
  }
  for (const auto& e : src.name_expressions) {
    const char* lowered = nullptr;
    KILN_CHECK(nvrtcGetLoweredName(program.get(), e.c_str(), &lowered));
    bin.lowered_names.emplace_back(e, lowered);
  }
  NvrtcVersion v = nvrtc_version();
  bin.nvrtc_major = v.major;
  bin.nvrtc_minor = v.minor;
  bin.compile_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return bin;
}

}  // namespace kiln
