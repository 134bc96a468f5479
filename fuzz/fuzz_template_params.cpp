// A template with parameters of any value (of each parameter's kind): Grid::create, sample and render
// answer with configurations or errors, never a crash.
#include <cstddef>
#include <cstdint>
#include <string>

#include "kiln/templates/templates.h"

namespace {

struct Bytes {
  const uint8_t* p;
  size_t n;
  uint8_t byte() { return n ? (--n, *p++) : 0; }
  int64_t integer() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v = v << 8 | byte();
    // Mostly small numbers near the declared ones, sometimes anything.
    return (v & 3) == 0 ? static_cast<int64_t>(v) : static_cast<int64_t>(v % 1024) - 64;
  }
  std::string text() {
    std::string s;
    for (size_t len = byte() % 24; len > 0 && n > 0; --len) s.push_back(static_cast<char>(byte()));
    return s;
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln::templates;
  Bytes in{data, size};
  const auto& all = all_templates();
  if (all.empty()) return 0;
  const TemplatePtr& t = all[in.byte() % all.size()];
  Params given;
  for (int count = in.byte() % 6; count > 0; --count) {
    const auto& specs = t->params();
    if (specs.empty()) break;
    const ParamSpec& s = specs[in.byte() % specs.size()];
    switch (s.kind) {
      case ParamKind::kInt: given.insert_or_assign(s.name, Value::integer(in.integer())); break;
      case ParamKind::kBool: given.insert_or_assign(s.name, Value::boolean(in.byte() & 1)); break;
      case ParamKind::kDType: {
        auto d = parse_dtype(in.text());
        if (d.ok()) given.insert_or_assign(s.name, Value::dtype(*d));
        break;
      }
      case ParamKind::kLayout:
        given.insert_or_assign(s.name, Value::layout(in.byte() & 1 ? Layout::kColMajor : Layout::kRowMajor));
        break;
      case ParamKind::kEnum: given.insert_or_assign(s.name, Value::enumeration(in.text())); break;
      case ParamKind::kCode: {
        auto spec = parse_epilogue(in.text(), DType::kBF16);
        if (spec.ok()) given.insert_or_assign(s.name, epilogue_value(*spec));
        break;
      }
    }
  }
  (void)t->render(given);
  auto grid = Grid::create(t, given);
  if (!grid.ok()) return 0;
  static const char* kArchs[] = {"sm_80", "sm_90", "sm_90a"};
  auto limits = DeviceLimits::for_target(kiln::Target{kArchs[in.byte() % 3]});
  if (!limits.ok()) return 0;
  for (const Params& p : sample(*grid, *limits, 1 + in.byte() % 3)) (void)t->render(p);
  return 0;
}
