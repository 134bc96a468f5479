#include <stdlib.h>

#include <chrono>
#include <fstream>
#include <regex>
#include <sstream>

#include <fmt/format.h>

#include "commands.h"
#include "kiln/embedded.h"
#include "kiln/input.h"
#include "kiln/jit.h"
#include "kiln/pool/process_pool.h"

namespace kiln::tools_samples {
std::span<const kiln::EmbeddedFile> embedded_files();
}

namespace kiln::cli {
namespace {

struct CompileArgs {
  std::string file;
  bool sample = false;
  std::string arch;
  std::vector<std::string> defines;
  std::vector<std::string> include_dirs;
  std::vector<std::string> name_exprs;
  std::vector<std::string> options;
  std::string entry;
  std::string output;
  bool ptx = false;
  bool pch = false;
  bool allow_outside_includes = false;
  bool in_worker = false;
};

// The compile in a kiln-compile-worker process: a source that hangs NVRTC (a macro bomb) is killed at the
// compile timeout with its worker, which an in-process compile cannot promise (NVRTC checks for
// cancellation only between its phases).
Result<Binary> compile_in_worker(const KernelSource& src, const Target& target, const CompileSettings& settings) {
  ProcessPoolOptions o;
  o.workers = 1;
  KILN_ASSIGN_OR_RETURN(o.job_timeout, compile_timeout());
  KILN_ASSIGN_OR_RETURN(auto pool, ProcessPool::start(std::move(o)));
  if (!pool->wait_ready(std::chrono::seconds(60))) {
    std::string why = pool->stats().gave_up;
    return make_error(ErrorCode::kUnavailable,
                      fmt::format("the compile worker '{}' did not start{}", pool->worker_path(), why.empty() ? "" : ": " + why));
  }
  CompileJob job;
  job.source = src;
  job.target = target;
  job.settings = settings;
  return pool->submit(std::move(job)).future.get();
}

std::string basename_without_ext(const std::string& path) {
  std::string base = path.substr(path.rfind('/') == std::string::npos ? 0 : path.rfind('/') + 1);
  return base.substr(0, base.rfind('.'));
}

// The first `extern "C" __global__` function of a source, for when no entry is named.
std::string guess_entry(const std::string& source) {
  static const std::regex re(R"re(extern\s+"C"\s+__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+(\w+))re");
  std::smatch m;
  return std::regex_search(source, m, re) ? m[1].str() : std::string();
}

// A kernel source file: far past any real one (the CUDA headers it includes are read by NVRTC, not here).
constexpr InputLimit kSourceBytesLimit{"kernel source file", "KILN_MAX_SOURCE_BYTES", 16ull << 20};

Result<KernelSource> source_from_args(const CompileArgs& a) {
  KernelSource src;
  if (a.sample) {
    for (const auto& f : tools_samples::embedded_files()) {
      if (f.name == "axpy.cu") src.source = std::string(f.contents);
    }
    src.name = "axpy";
    src.name_expressions = {"axpy<__half, 8>"};
    src.entry = "axpy<__half, 8>";
  } else {
    // Bounded like every file kiln reads: /dev/zero, a FIFO or a folder is an error naming it, not a read that
    // never ends (it ended in an out-of-memory exit).
    KILN_ASSIGN_OR_RETURN(src.source, read_file_limited(a.file, kSourceBytesLimit));
    src.name = basename_without_ext(a.file);
    src.name_expressions = a.name_exprs;
    // Quoted includes next to the file resolve as they would with nvcc.
    std::string dir = a.file.find('/') == std::string::npos ? "." : a.file.substr(0, a.file.rfind('/'));
    src.include_dirs.push_back(dir);
  }
  for (const auto& d : a.defines) src.options.push_back("-D" + d);
  for (const auto& o : a.options) src.options.push_back(o);
  for (const auto& i : a.include_dirs) src.include_dirs.push_back(i);
  if (!a.entry.empty()) src.entry = a.entry;
  if (src.entry.empty()) src.entry = a.name_exprs.empty() ? guess_entry(src.source) : a.name_exprs.front();
  return src;
}

int run_compile(const CompileArgs& a) {
  if (a.sample == !a.file.empty()) {
    fmt::print(stderr, "kiln compile: give a FILE.cu or --sample (one of them)\n");
    return 2;
  }
  auto src = source_from_args(a);
  if (!src.ok()) {
    fmt::print(stderr, "kiln compile: {}\n", src.status().to_string());
    return 1;
  }
  if (src->entry.empty()) src->entry = "(none)";

  Target target;
  std::string arch_note;
  if (!a.arch.empty()) {
    auto t = Target::parse(a.arch);
    if (!t.ok()) {
      fmt::print(stderr, "kiln compile: {}\n", t.status().to_string());
      return 2;
    }
    target = *t;
  } else if (auto t = Target::from_device(0); t.ok()) {
    target = *t;
    arch_note = " (from device 0)";
  } else {
    target = Target{"sm_90"};
    arch_note = " (default: no device to ask)";
  }

  CompileSettings settings;
  settings.want_ptx = a.ptx;
  settings.use_pch = a.pch;
  settings.allow_outside_includes = a.allow_outside_includes;
  // Workers take the opt-in from the environment they inherit.
  if (a.allow_outside_includes) ::setenv("KILN_ALLOW_OUTSIDE_INCLUDES", "1", 1);
  auto bin = a.in_worker ? compile_in_worker(*src, target, settings) : compile(*src, target, settings);
  if (!bin.ok()) {
    fmt::print(stderr, "kiln compile: {}\n", bin.status().to_string());
    if (!bin.status().detail().empty()) fmt::print(stderr, "{}", bin.status().detail());
    return 1;
  }
  fmt::print("kernel   {} (entry {})\n", bin->name, bin->entry);
  fmt::print("arch     {}{}\n", bin->arch, arch_note);
  fmt::print("key      {}\n", bin->key.hex());
  fmt::print("cubin    {} bytes\n", bin->cubin.size());
  fmt::print("compile  {:.1f} ms (NVRTC {}.{}{})\n", bin->compile_seconds * 1e3, bin->nvrtc_major, bin->nvrtc_minor,
             a.pch ? ", -pch" : "");
  if (!bin->log.empty()) fmt::print("log\n{}\n", bin->log);

  if (!a.output.empty()) {
    std::ofstream out(a.output, std::ios::binary);
    out.write(bin->cubin.data(), static_cast<std::streamsize>(bin->cubin.size()));
    if (!out) {
      fmt::print(stderr, "kiln compile: cannot write '{}'\n", a.output);
      return 1;
    }
    fmt::print("wrote    {}\n", a.output);
  }
  if (a.ptx) {
    if (a.output.empty()) {
      fmt::print("ptx\n{}\n", bin->ptx);
    } else {
      std::string path = a.output.substr(0, a.output.rfind('.')) + ".ptx";
      std::ofstream(path, std::ios::binary) << bin->ptx;
      fmt::print("wrote    {}\n", path);
    }
  }

  auto ctx = ensure_context(0);
  if (!ctx.ok()) {
    fmt::print("device   none: {} (registers and shared memory need a GPU)\n", ctx.status().to_string());
    return 0;
  }
  auto info = device_info(0);
  auto kernel = load_kernel(*bin);
  if (!kernel.ok()) {
    fmt::print(stderr, "kiln compile: compiled, but {}\n", kernel.status().to_string());
    return 1;
  }
  auto attr = kernel->attributes();
  if (!attr.ok()) {
    fmt::print(stderr, "kiln compile: {}\n", attr.status().to_string());
    return 1;
  }
  fmt::print("device   {} ({})\n", info.ok() ? info->name : "device 0", info.ok() ? info->arch() : "?");
  fmt::print("regs     {} per thread\n", attr->registers);
  fmt::print("smem     {} bytes static, up to {} bytes dynamic\n", attr->static_shared_bytes,
             attr->max_dynamic_shared_bytes);
  fmt::print("spills   {} bytes local memory per thread\n", attr->local_bytes);
  fmt::print("threads  {} per block at most\n", attr->max_threads_per_block);
  return 0;
}

void add_compile_command(CLI::App& app) {
  auto args = std::make_shared<CompileArgs>();
  auto* cmd = app.add_subcommand("compile", "Compile a CUDA C++ file with NVRTC; print its key, size and time");
  cmd->add_option("file", args->file, "The .cu file to compile");
  cmd->add_flag("--sample", args->sample, "Compile kiln's bundled sample kernel instead of a file");
  cmd->add_option("--arch", args->arch, "Target, e.g. sm_90 or sm_90a (default: device 0's, else sm_90)");
  cmd->add_option("-D,--define", args->defines, "Preprocessor definition NAME[=VALUE]")->allow_extra_args(false);
  cmd->add_option("-I,--include", args->include_dirs, "Include directory")->allow_extra_args(false);
  cmd->add_option("--name-expr", args->name_exprs, "Template instantiation to compile, e.g. 'k<float,4>'")
      ->allow_extra_args(false);
  cmd->add_option("--option", args->options, "Any other NVRTC option, e.g. --option=--use_fast_math")
      ->allow_extra_args(false);
  cmd->add_option("--entry", args->entry, "The kernel to load (default: the first name expression, else the "
                                          "first extern \"C\" __global__ function)");
  cmd->add_option("-o,--output", args->output, "Write the cubin here (and the PTX next to it with --ptx)");
  cmd->add_flag("--ptx", args->ptx, "Also produce PTX");
  cmd->add_flag("--pch", args->pch, "Use NVRTC automatic precompiled headers");
  cmd->add_flag("--allow-outside-includes", args->allow_outside_includes,
                "Let the source #include files outside its include folders (-I, its own folder, the CUDA toolkit's)");
  cmd->add_flag("--worker", args->in_worker,
                "Compile in a kiln-compile-worker process, killed at the compile timeout ($KILN_COMPILE_TIMEOUT, "
                "default 300 s)");
  on_run(cmd, args, run_compile);
}

}  // namespace

KILN_REGISTER_COMMAND(add_compile_command);

}  // namespace kiln::cli
