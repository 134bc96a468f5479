#include "suite_shapes.h"

#include <set>
#include <sstream>

#include <fmt/format.h>

namespace kiln::bench::suite {

using templates::DType;
using templates::Layout;

std::string SuiteShape::id() const {
  return fmt::format("m{}_n{}_k{}_{}_{}", m, n, k, templates::dtype_name(dtype),
                     layout_b == Layout::kColMajor ? "c" : "r");
}

namespace {

struct Weight {
  const char* model;
  const char* layer;
  int64_t n, k;
  std::vector<int64_t> ms;
};

// (N, K) of each layer, from the models' config.json:
//   Llama-3 8B: hidden 4096, intermediate 14336, 32 heads / 8 KV heads of 128, vocabulary 128256.
//   Llama-3 70B: hidden 8192, intermediate 28672, 64 / 8 heads of 128 (TP slices split N of qkv and gate_up,
//     K of o and down).
//   Qwen2.5 7B: hidden 3584, intermediate 18944, 28 / 4 heads of 128, vocabulary 152064.
//   Qwen2.5 72B: hidden 8192, intermediate 29568, 64 / 8 heads of 128.
//   Mixtral 8x7B: hidden 4096, expert intermediate 14336 (w1 and w3 fused: 28672), 8 experts, top 2.
//   DeepSeek-V3: hidden 7168; MLA q_lora 1536, kv_lora 512 (+64 rope), 128 heads (q 192, v 128);
//     dense layers intermediate 18432; 256 routed experts of intermediate 2048, top 8.
// M: 1, 3, 8, 16, 32, 64 decode (batch sizes); 77, 128, 256, 333 batched decode and MoE expert loads;
// 1000, 2048, 4096, 8192 prefill chunks.
std::vector<Weight> weights() {
  return {
      {"square", "4096^3", 4096, 4096, {4096}},
      {"llama3-8b", "qkv", 6144, 4096, {1, 16, 77, 1000, 4096}},
      {"llama3-8b", "o", 4096, 4096, {1, 8, 64, 333, 2048}},
      {"llama3-8b", "gate_up", 28672, 4096, {1, 32, 128, 1000, 8192}},
      {"llama3-8b", "down", 4096, 14336, {1, 16, 77, 2048, 8192}},
      {"llama3-8b", "lm_head", 128256, 4096, {1, 3, 64}},
      {"llama3-70b tp8", "qkv", 1280, 8192, {1, 64, 1000}},
      {"llama3-70b tp8", "o", 8192, 1024, {1, 333, 4096}},
      {"llama3-70b tp8", "gate_up", 7168, 8192, {1, 16, 256, 2048}},
      {"llama3-70b tp8", "down", 8192, 3584, {3, 64, 1000}},
      {"llama3-70b tp4", "gate_up", 14336, 8192, {8, 512}},
      {"llama3-70b tp4", "down", 8192, 7168, {1, 4096}},
      {"llama3-70b tp2", "qkv", 5120, 8192, {16, 333}},
      {"qwen2.5-7b", "qkv", 4608, 3584, {1, 77, 2048}},
      {"qwen2.5-7b", "gate_up", 37888, 3584, {1, 64, 1000}},
      {"qwen2.5-7b", "down", 3584, 18944, {1, 32, 4096}},
      {"qwen2.5-7b", "lm_head", 152064, 3584, {1, 16}},
      {"qwen2.5-72b tp8", "gate_up", 7392, 8192, {1, 77, 2048}},
      {"qwen2.5-72b tp8", "down", 8192, 3696, {16, 333}},
      {"qwen2.5-72b tp4", "qkv", 2560, 8192, {1, 128}},
      {"mixtral-8x7b", "expert w13", 28672, 4096, {3, 77, 333}},
      {"mixtral-8x7b", "expert w2", 4096, 14336, {3, 77, 333}},
      {"mixtral-8x7b tp2", "expert w13", 14336, 4096, {16, 256}},
      {"deepseek-v3", "q_a", 1536, 7168, {1, 64, 2048}},
      {"deepseek-v3", "kv_a", 576, 7168, {1, 333}},
      {"deepseek-v3", "q_b", 24576, 1536, {1, 128}},
      {"deepseek-v3", "kv_b", 32768, 512, {8, 1000}},
      {"deepseek-v3", "o", 7168, 16384, {1, 77}},
      {"deepseek-v3", "dense gate_up", 36864, 7168, {1, 256}},
      {"deepseek-v3", "dense down", 7168, 18432, {16, 1000}},
      {"deepseek-v3 tp8", "dense gate_up", 4608, 7168, {3, 2048}},
      {"deepseek-v3", "expert gate_up", 4096, 7168, {1, 8, 32, 77, 256}},
      {"deepseek-v3", "expert down", 7168, 2048, {1, 8, 32, 77, 256}},
  };
}

}  // namespace

std::vector<SuiteShape> suite_shapes() {
  std::vector<SuiteShape> out;
  std::set<std::string> seen;
  auto add = [&](SuiteShape s) {
    if (seen.insert(s.id()).second) out.push_back(std::move(s));
  };
  for (const Weight& w : weights()) {
    for (int64_t m : w.ms) add({w.model, w.layer, m, w.n, w.k, DType::kBF16, Layout::kColMajor});
  }
  // The other B layout (weights stored [K, N], N contiguous) and fp16, on a spread of sizes.
  add({"square", "4096^3", 4096, 4096, 4096, DType::kBF16, Layout::kRowMajor});
  add({"square", "4096^3", 4096, 4096, 4096, DType::kF16, Layout::kColMajor});
  for (const Weight& w : weights()) {
    const std::string layer = w.layer;
    if (std::string(w.model) == "llama3-8b" && layer != "lm_head") {
      add({w.model, w.layer, 16, w.n, w.k, DType::kBF16, Layout::kRowMajor});
      add({w.model, w.layer, 1000, w.n, w.k, DType::kF16, Layout::kColMajor});
    }
    if (std::string(w.model) == "mixtral-8x7b") add({w.model, w.layer, 77, w.n, w.k, DType::kF16, Layout::kRowMajor});
    if (std::string(w.model) == "deepseek-v3" && layer.rfind("expert", 0) == 0) {
      add({w.model, w.layer, 3, w.n, w.k, DType::kBF16, Layout::kRowMajor});
      add({w.model, w.layer, 333, w.n, w.k, DType::kF16, Layout::kRowMajor});
    }
  }
  return out;
}

std::vector<SuiteShape> filter_shapes(const std::vector<SuiteShape>& all, const std::string& filter) {
  std::vector<std::string> terms;
  int64_t max_m = -1;
  size_t max_count = SIZE_MAX;
  std::stringstream ss(filter);
  for (std::string t; std::getline(ss, t, ',');) {
    if (t.empty()) continue;
    if (t.rfind("m<=", 0) == 0) {
      max_m = std::stoll(t.substr(3));
    } else if (t.rfind("max=", 0) == 0) {
      max_count = std::stoull(t.substr(4));
    } else {
      terms.push_back(t);
    }
  }
  std::vector<SuiteShape> out;
  for (const SuiteShape& s : all) {
    if (max_m >= 0 && s.m > max_m) continue;
    bool hit = terms.empty();
    for (const std::string& t : terms) {
      hit |= s.id().find(t) != std::string::npos || s.model.find(t) != std::string::npos ||
             s.layer.find(t) != std::string::npos;
    }
    if (hit && out.size() < max_count) out.push_back(s);
  }
  return out;
}

}  // namespace kiln::bench::suite
