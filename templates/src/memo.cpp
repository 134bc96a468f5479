// Choice generation's memo: its switch, epoch and counters, and the keys it files entries under.
#include "memo.h"

#include <fmt/format.h>

#include "env.h"

namespace kiln::templates {
namespace {

std::atomic<bool> g_enabled{detail::env_switch_on("KILN_GENERATION_CACHE")};
std::atomic<uint64_t> g_epoch{1};
std::atomic<uint64_t> g_renders{0}, g_render_hits{0}, g_samples{0}, g_sample_hits{0}, g_sample_checks{0};

}  // namespace

bool generation_cache_enabled() { return g_enabled.load(std::memory_order_relaxed); }

void set_generation_cache(bool on) {
  g_enabled.store(on, std::memory_order_relaxed);
  if (!on) clear_generation_cache();
}

void clear_generation_cache() { g_epoch.fetch_add(1, std::memory_order_relaxed); }

GenerationStats generation_stats() {
  return {g_renders.load(), g_render_hits.load(), g_samples.load(), g_sample_hits.load(), g_sample_checks.load()};
}

namespace detail {

uint64_t memo_epoch() { return g_epoch.load(std::memory_order_relaxed); }
void count_render(bool hit) { (hit ? g_render_hits : g_renders).fetch_add(1, std::memory_order_relaxed); }
void count_sample(bool hit) { (hit ? g_sample_hits : g_samples).fetch_add(1, std::memory_order_relaxed); }
void count_sample_checks(uint64_t n) { g_sample_checks.fetch_add(n, std::memory_order_relaxed); }

std::string params_key(const Params& p) {
  std::string out;
  for (const auto& [name, v] : p) {
    out += name;
    out += '\x1f';
    out += static_cast<char>('0' + static_cast<int>(v.kind()));
    switch (v.kind()) {
      case ParamKind::kInt: out += std::to_string(v.as_int()); break;
      case ParamKind::kBool: out += v.as_bool() ? '1' : '0'; break;
      case ParamKind::kDType: out += static_cast<char>('0' + static_cast<int>(v.as_dtype())); break;
      case ParamKind::kLayout: out += static_cast<char>('0' + static_cast<int>(v.as_layout())); break;
      case ParamKind::kEnum: out += v.as_enum(); break;
      case ParamKind::kCode:
        // The tag names the snippet in configuration names; the text is what renders, so both are the key
        // (with the text's length, so that no tag/text split can read as another).
        out += v.code_tag();
        out += '\x1f';
        out += std::to_string(v.as_code().size());
        out += '\x1f';
        out += v.as_code();
        break;
    }
    out += '\x1e';
  }
  return out;
}

std::string limits_key(const DeviceLimits& l) {
  return fmt::format("{}|{}|{}|{}|{}|{}|{}|{}|{}|{}", l.arch, l.cc, l.arch_specific, l.sm_count, l.smem_per_block_optin,
                     l.smem_per_sm, l.regs_per_sm, l.max_regs_per_thread, l.max_threads_per_block, l.measured);
}

}  // namespace detail
}  // namespace kiln::templates
