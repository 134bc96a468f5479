#include <fmt/format.h>

#include "commands.h"
#include "kiln/jit.h"
#include "kiln/version.h"

namespace kiln::cli {

namespace {

void add_version_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("version", "Print kiln's, NVRTC's and the driver's versions and the devices");
  cmd->callback([] {
    NvrtcVersion nv = nvrtc_version();
    fmt::print("kiln    {}\n", kKilnVersion);
    fmt::print("NVRTC   {}.{}\n", nv.major, nv.minor);
    for (const auto& d : cuda_include_dirs()) fmt::print("headers {}\n", d);
    auto d = driver();
    if (!d.ok()) {
      fmt::print("driver  none ({})\n", d.status().to_string());
      return;
    }
    fmt::print("driver  CUDA {}.{} ({})\n", (*d)->driver_version / 1000, (*d)->driver_version % 1000 / 10,
               (*d)->library);
    for (int i = 0; i < (*d)->device_count; ++i) {
      auto info = device_info(i);
      if (!info.ok()) {
        fmt::print("device  {}: {}\n", i, info.status().to_string());
        continue;
      }
      fmt::print("device  {}: {}, {}, {} SMs, {:.0f} GiB, {} KiB shared memory per block (opt-in)\n", i,
                 info->name, info->arch(), info->sm_count, info->total_memory / double(1 << 30),
                 info->max_shared_per_block_optin / 1024);
    }
  });
}

}  // namespace

KILN_REGISTER_COMMAND(add_version_command);

}  // namespace kiln::cli
