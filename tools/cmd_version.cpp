#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <memory>

#include "commands.h"
#include "kiln/jit.h"
#include "kiln/version.h"

namespace kiln::cli {

namespace {

// Every line `kiln version` prints, as JSON: the same facts for scripts.
nlohmann::json version_json() {
  NvrtcVersion nv = nvrtc_version();
  nlohmann::json out{{"kiln", kKilnVersion}, {"nvrtc", fmt::format("{}.{}", nv.major, nv.minor)},
                     {"headers", cuda_include_dirs()}, {"devices", nlohmann::json::array()}};
  auto d = driver();
  if (!d.ok()) {
    out["driver"] = nullptr;
    out["driver_error"] = d.status().to_string();
    return out;
  }
  out["driver"] = {{"cuda", fmt::format("{}.{}", (*d)->driver_version / 1000, (*d)->driver_version % 1000 / 10)},
                   {"library", (*d)->library}};
  for (int i = 0; i < (*d)->device_count; ++i) {
    auto info = device_info(i);
    if (!info.ok()) {
      out["devices"].push_back({{"ordinal", i}, {"error", info.status().to_string()}});
      continue;
    }
    out["devices"].push_back({{"ordinal", i}, {"name", info->name}, {"arch", info->arch()}, {"sms", info->sm_count},
                              {"memory_bytes", info->total_memory},
                              {"shared_per_block_optin", info->max_shared_per_block_optin}});
  }
  return out;
}

void print_version() {
  nlohmann::json v = version_json();
  fmt::print("kiln    {}\n", v["kiln"].get<std::string>());
  fmt::print("NVRTC   {}\n", v["nvrtc"].get<std::string>());
  for (const auto& d : v["headers"]) fmt::print("headers {}\n", d.get<std::string>());
  if (v["driver"].is_null()) {
    fmt::print("driver  none ({})\n", v["driver_error"].get<std::string>());
    return;
  }
  fmt::print("driver  CUDA {} ({})\n", v["driver"]["cuda"].get<std::string>(), v["driver"]["library"].get<std::string>());
  for (const auto& dev : v["devices"]) {
    if (dev.contains("error")) {
      fmt::print("device  {}: {}\n", dev["ordinal"].get<int>(), dev["error"].get<std::string>());
      continue;
    }
    fmt::print("device  {}: {}, {}, {} SMs, {:.0f} GiB, {} KiB shared memory per block (opt-in)\n",
               dev["ordinal"].get<int>(), dev["name"].get<std::string>(), dev["arch"].get<std::string>(),
               dev["sms"].get<int>(), dev["memory_bytes"].get<double>() / double(1 << 30),
               dev["shared_per_block_optin"].get<int64_t>() / 1024);
  }
}

void add_version_command(CLI::App& app) {
  auto json = std::make_shared<bool>(false);
  auto* cmd = app.add_subcommand("version", "Print kiln's, NVRTC's and the driver's versions and the devices");
  cmd->add_flag("--json", *json, "Print them as JSON");
  cmd->callback([json] {
    if (*json) fmt::print("{}\n", version_json().dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
    else print_version();
  });
}

}  // namespace

KILN_REGISTER_COMMAND(add_version_command);

}  // namespace kiln::cli
