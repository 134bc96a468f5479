// GPU correctness of the memory-bound templates and the split-K reduction against a float64 CPU reference.
// For each template: a covering sample of configurations (every value of every parameter appears at least
// once), every dtype, shapes with rows = 1, 7, 17, 4095 and cols that are not multiples of 8, rows longer
// than a configuration keeps in registers (the re-reading path), padded leading dimensions. Outputs are
// poisoned (all bits set: NaN in every dtype) before each run; inputs are fresh random values for each check.
// Tolerances (METHOD.md): relative norm error <= 1e-2 for bf16, 5e-3 for f16, 1e-4 for f32.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <thread>

#include "kiln/jit/compiler.h"
#include <fmt/format.h>

#include "kiln/jit/device.h"
#include "kiln/jit/driver.h"
#include "kiln/jit/module.h"
#include "kiln_test.h"
#include "kiln/templates/templates.h"

namespace kiln::templates {
namespace {

// ------------------------------------------------------------------------------------------------ host dtypes

uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}
float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// Device bytes for `v` in dtype `t` (values rounded to t).
std::vector<uint8_t> encode(const std::vector<double>& v, DType t) {
  std::vector<uint8_t> out(v.size() * dtype_bytes(t));
  for (size_t i = 0; i < v.size(); ++i) {
    float f = static_cast<float>(v[i]);
    if (t == DType::kF32) {
      std::memcpy(out.data() + 4 * i, &f, 4);
    } else if (t == DType::kBF16) {
      uint16_t h = f32_to_bf16(f);
      std::memcpy(out.data() + 2 * i, &h, 2);
    } else {
      _Float16 h = static_cast<_Float16>(f);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}
std::vector<double> decode(const std::vector<uint8_t>& b, DType t) {
  size_t n = b.size() / dtype_bytes(t);
  std::vector<double> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (t == DType::kF32) {
      float f;
      std::memcpy(&f, b.data() + 4 * i, 4);
      out[i] = f;
    } else if (t == DType::kBF16) {
      uint16_t h;
      std::memcpy(&h, b.data() + 2 * i, 2);
      out[i] = bf16_to_f32(h);
    } else {
      _Float16 h;
      std::memcpy(&h, b.data() + 2 * i, 2);
      out[i] = static_cast<double>(h);
    }
  }
  return out;
}
/// `v` rounded to dtype t, as doubles.
std::vector<double> round_to(const std::vector<double>& v, DType t) { return decode(encode(v, t), t); }
double round_one(double v, DType t) { return round_to({v}, t)[0]; }

double tolerance(DType t) { return t == DType::kBF16 ? 1e-2 : t == DType::kF16 ? 5e-3 : 1e-4; }

/// ||out - ref|| / ||ref|| over the elements of a rows x cols region with leading dimensions; NaN -> inf.
double rel_error(const std::vector<double>& out, int64_t ld_out, const std::vector<double>& ref, int64_t rows,
                 int64_t cols) {
  double num = 0, den = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      double o = out[r * ld_out + c], e = ref[r * cols + c];
      if (!std::isfinite(o)) return INFINITY;
      num += (o - e) * (o - e);
      den += e * e;
    }
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

Status sync() {
  KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
  KILN_CHECK(d->cuCtxSynchronize());
  return Status();
}

std::mt19937_64& rng() {
  static std::mt19937_64 r(20261121);
  return r;
}
std::vector<double> random_values(size_t n, double lo, double hi) {
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<double> v(n);
  for (double& x : v) x = d(rng());
  return v;
}

// ------------------------------------------------------------------------------------------------ device

struct Buf {
  DeviceBuffer b;
  DType t;
};
Result<Buf> upload(const std::vector<double>& v, DType t) {
  auto bytes = encode(v, t);
  KILN_ASSIGN_OR_RETURN(DeviceBuffer b, DeviceBuffer::allocate(std::max<size_t>(bytes.size(), 16)));
  KILN_RETURN_IF_ERROR(b.copy_from_host(bytes.data(), bytes.size()));
  return Buf{std::move(b), t};
}
Result<Buf> poisoned(size_t n, DType t) {
  KILN_ASSIGN_OR_RETURN(DeviceBuffer b, DeviceBuffer::allocate(std::max<size_t>(n * dtype_bytes(t), 16)));
  KILN_RETURN_IF_ERROR(b.fill_bytes(0xff));
  return Buf{std::move(b), t};
}
Result<std::vector<double>> download(const Buf& b, size_t n) {
  std::vector<uint8_t> bytes(n * dtype_bytes(b.t));
  KILN_RETURN_IF_ERROR(b.b.copy_to_host(bytes.data(), bytes.size()));
  return decode(bytes, b.t);
}
void* ptr(const Buf& b) { return reinterpret_cast<void*>(static_cast<uintptr_t>(b.b.ptr())); }

struct Config {
  Rendered r;
  std::optional<Kernel> kernel;
};

/// Renders and compiles (in threads) then loads the configurations.
std::vector<Config> build(const Template& t, const std::vector<Params>& configs, const Target& target) {
  std::vector<Config> out(configs.size());
  std::vector<Result<Binary>> bins(configs.size(), Result<Binary>(make_error(ErrorCode::kInternal, "not compiled")));
  std::vector<std::thread> threads;
  unsigned n = std::max(2u, std::thread::hardware_concurrency());
  std::atomic<size_t> next{0};
  for (unsigned w = 0; w < n; ++w) {
    threads.emplace_back([&] {
      for (size_t i; (i = next.fetch_add(1)) < configs.size();) {
        auto r = t.render(configs[i]);
        if (!r.ok()) {
          bins[i] = r.status();
          continue;
        }
        out[i].r = *r;
        bins[i] = compile(out[i].r.source, target);
      }
    });
  }
  for (auto& th : threads) th.join();
  for (size_t i = 0; i < configs.size(); ++i) {
    EXPECT_TRUE(bins[i].ok()) << bins[i].status().to_string_with_detail();
    if (!bins[i].ok()) continue;
    auto k = load_kernel(*bins[i]);
    EXPECT_TRUE(k.ok()) << k.status().to_string();
    if (k.ok()) out[i].kernel.emplace(std::move(*k));
  }
  return out;
}

struct Gpu {
  Target target;
  DeviceLimits limits;
};
std::optional<Gpu> gpu() {
  auto info = device_info(0);
  if (!info.ok()) return std::nullopt;
  Target t{info->arch()};
  return Gpu{t, DeviceLimits::from_device(*info, t)};
}

/// The covering sample of a template's configurations for this device, plus `extra`.
std::vector<Params> configs_for(const TemplatePtr& t, const DeviceLimits& lim, std::vector<Params> extra = {}) {
  auto g = Grid::create(t);
  EXPECT_TRUE(g.ok());
  auto picks = sample(*g, lim, 1);
  for (auto& p : extra) picks.push_back(std::move(p));
  return picks;
}

/// A template and its covering sample (plus `extra`) compiled and loaded for device 0.
struct Sample {
  TemplatePtr t;
  std::vector<Config> configs;
};
Result<Sample> sample_for_device(std::string_view name, std::vector<Params> extra = {}) {
  auto g = gpu();
  if (!g) return make_error(ErrorCode::kUnavailable, "no usable device 0");
  KILN_ASSIGN_OR_RETURN(TemplatePtr t, find_template(name));
  auto configs = build(*t, configs_for(t, g->limits, std::move(extra)), g->target);
  return Sample{t, std::move(configs)};
}

struct RowShape {
  int64_t rows, cols, pad;  // leading dimension = cols + pad
};
const std::vector<RowShape> kRowShapes = {{1, 4096, 0}, {7, 1000, 0}, {17, 4099, 0},
                                          {4095, 768, 0}, {3, 12288, 0}, {5, 2048, 16}};

/// Runs `check(config, shape, ld)` for every compiled configuration and every row shape it serves, under a
/// trace naming both; stops at the first fatal failure and expects each shape to have been run by some
/// configuration.
template <class Check>
void for_each_row_run(const TemplatePtr& t, std::vector<Config>& configs, Check check) {
  std::vector<int> runs_per_shape(kRowShapes.size(), 0);
  for (Config& c : configs) {
    if (!c.kernel) continue;
    for (size_t si = 0; si < kRowShapes.size(); ++si) {
      const RowShape s = kRowShapes[si];
      if (!t->check_problem(c.r.params, Shape{s.rows, s.cols}).ok()) continue;
      ++runs_per_shape[si];
      SCOPED_TRACE(fmt::format("{} rows={} cols={} ld=+{}", c.r.config_name, s.rows, s.cols, s.pad));
      check(c, s, s.cols + s.pad);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
  for (size_t si = 0; si < kRowShapes.size(); ++si) EXPECT_GT(runs_per_shape[si], 0) << "no config ran shape " << si;
}

/// Launches configuration `c` of `t` with `a` on shape `s`, waits, and returns `out` (s.rows * ld elements).
template <class Args>
Result<std::vector<double>> run_rows(const TemplatePtr& t, const Config& c, const RowShape& s, int64_t ld,
                                     const Args& a, const Buf& out) {
  KILN_ASSIGN_OR_RETURN(Launch geo, t->geometry(c.r.params, Shape{s.rows, s.cols}));
  KILN_RETURN_IF_ERROR(launch(*c.kernel, geo, a, nullptr));
  KILN_RETURN_IF_ERROR(sync());
  return download(out, s.rows * ld);
}

// ------------------------------------------------------------------------------------------------ norms

void check_norm(const std::string& name) {
  const bool layer = name == "layernorm";
  // Plus configurations that keep 8192-wide rows in registers (the benchmark's).
  std::vector<Params> extra;
  for (DType dt : {DType::kBF16, DType::kF16, DType::kF32}) {
    Params p{{"dtype", Value::dtype(dt)}, {"residual", Value::boolean(true)}, {"threads", Value::integer(512)},
             {"rows_per_block", Value::integer(1)}, {"vec", Value::integer(dt == DType::kF32 ? 4 : 8)},
             {"items", Value::integer(dt == DType::kF32 ? 4 : 2)}};
    if (layer) p.emplace("has_bias", Value::boolean(true));
    extra.push_back(p);
  }
  KILN_ASSERT_OK_AND_ASSIGN(Sample sample, sample_for_device(name, extra));
  const TemplatePtr& t = sample.t;
  for_each_row_run(t, sample.configs, [&](Config& c, const RowShape& s, int64_t ld) {
    const Params& p = c.r.params;
    const DType dt = get_dtype(p, "dtype");
    const bool residual = get_bool(p, "residual");
    const bool has_bias = get_bool(p, "has_bias");
    auto x = round_to(random_values(s.rows * ld, -2, 2), dt);
    auto res = round_to(random_values(s.rows * ld, -2, 2), dt);
    auto w = round_to(random_values(s.cols, 0.5, 1.5), dt);
    auto b = round_to(random_values(s.cols, -1, 1), dt);
    const float eps = 1e-5f;
    // Reference.
    std::vector<double> h_ref(s.rows * s.cols), y_ref(s.rows * s.cols);
    for (int64_t r = 0; r < s.rows; ++r) {
      double sum = 0;
      for (int64_t col = 0; col < s.cols; ++col) {
        double h = x[r * ld + col];
        if (residual) h = round_one(static_cast<float>(x[r * ld + col]) + static_cast<float>(res[r * ld + col]), dt);
        h_ref[r * s.cols + col] = h;
        sum += layer ? h : h * h;
      }
      double mean = layer ? sum / s.cols : 0, var = 0;
      if (layer) {
        for (int64_t col = 0; col < s.cols; ++col) var += std::pow(h_ref[r * s.cols + col] - mean, 2);
        var /= s.cols;
      } else {
        var = sum / s.cols;
      }
      double inv = 1 / std::sqrt(var + eps);
      for (int64_t col = 0; col < s.cols; ++col) {
        double v = (h_ref[r * s.cols + col] - mean) * inv * w[col];
        if (has_bias) v += b[col];
        y_ref[r * s.cols + col] = v;
      }
    }
    KILN_ASSERT_OK_AND_ASSIGN(Buf dx, upload(x, dt));
    KILN_ASSERT_OK_AND_ASSIGN(Buf dres, upload(res, dt));
    KILN_ASSERT_OK_AND_ASSIGN(Buf dw, upload(w, dt));
    KILN_ASSERT_OK_AND_ASSIGN(Buf db, upload(b, dt));
    KILN_ASSERT_OK_AND_ASSIGN(Buf dy, poisoned(s.rows * ld, dt));
    KILN_ASSERT_OK_AND_ASSIGN(Buf dro, poisoned(s.rows * ld, dt));
    NormArgs a{};
    a.x = ptr(dx);
    a.residual = residual ? ptr(dres) : nullptr;
    a.residual_out = residual ? ptr(dro) : nullptr;
    a.weight = ptr(dw);
    a.bias = has_bias ? ptr(db) : nullptr;
    a.y = ptr(dy);
    a.rows = static_cast<int>(s.rows);
    a.cols = static_cast<int>(s.cols);
    a.ld_x = a.ld_residual = a.ld_residual_out = a.ld_y = ld;
    a.eps = eps;
    KILN_ASSERT_OK_AND_ASSIGN(auto y, run_rows(t, c, s, ld, a, dy));
    EXPECT_LE(rel_error(y, ld, y_ref, s.rows, s.cols), tolerance(dt));
    if (residual) {
      KILN_ASSERT_OK_AND_ASSIGN(auto ro, download(dro, s.rows * ld));
      EXPECT_LE(rel_error(ro, ld, h_ref, s.rows, s.cols), 1e-6) << "residual_out";
    }
  });
}

TEST(GpuTemplates, RmsNorm) {
  KILN_REQUIRE_GPU();
  check_norm("rmsnorm");
}
TEST(GpuTemplates, LayerNorm) {
  KILN_REQUIRE_GPU();
  check_norm("layernorm");
}

// ------------------------------------------------------------------------------------------------ softmax

TEST(GpuTemplates, Softmax) {
  KILN_REQUIRE_GPU();
  KILN_ASSERT_OK_AND_ASSIGN(Sample sample, sample_for_device("softmax"));
  const TemplatePtr& t = sample.t;
  for_each_row_run(t, sample.configs, [&](Config& c, const RowShape& s, int64_t ld) {
    const Params& p = c.r.params;
    const DType dt = get_dtype(p, "dtype");
    const float scale = 0.7f;
    auto x = round_to(random_values(s.rows * ld, -6, 6), dt);
    std::vector<double> ref(s.rows * s.cols);
    for (int64_t r = 0; r < s.rows; ++r) {
      double m = -INFINITY, sum = 0;
      for (int64_t col = 0; col < s.cols; ++col) m = std::max(m, x[r * ld + col] * scale);
      for (int64_t col = 0; col < s.cols; ++col) sum += std::exp(x[r * ld + col] * scale - m);
      for (int64_t col = 0; col < s.cols; ++col) ref[r * s.cols + col] = std::exp(x[r * ld + col] * scale - m) / sum;
    }
    KILN_ASSERT_OK_AND_ASSIGN(Buf dx, upload(x, dt));
    KILN_ASSERT_OK_AND_ASSIGN(Buf dy, poisoned(s.rows * ld, dt));
    SoftmaxArgs a{};
    a.x = ptr(dx);
    a.y = ptr(dy);
    a.rows = static_cast<int>(s.rows);
    a.cols = static_cast<int>(s.cols);
    a.ld_x = a.ld_y = ld;
    a.scale = scale;
    KILN_ASSERT_OK_AND_ASSIGN(auto y, run_rows(t, c, s, ld, a, dy));
    EXPECT_LE(rel_error(y, ld, ref, s.rows, s.cols), tolerance(dt));
  });
}

// The split-row softmax (softmax_cluster, sm_90+): vocabulary-sized rows over a cluster of blocks, odd column
// counts (vec 1), slices that end mid-row and a padded leading dimension, against a float64 reference.
TEST(GpuTemplates, SoftmaxClusterLongRows) {
  KILN_REQUIRE_GPU();
  auto g = gpu();
  ASSERT_TRUE(g);
  if (g->limits.cc < 90) GTEST_SKIP() << "thread-block clusters need sm_90";
  KILN_ASSERT_OK_AND_ASSIGN(TemplatePtr t, find_template("softmax_cluster"));
  struct Case {
    DType dt;
    int64_t threads, vec, items, cluster;
    RowShape shape;
  };
  const std::vector<Case> cases = {
      {DType::kBF16, 1024, 8, 2, 8, {1, 128256, 0}},  {DType::kBF16, 1024, 8, 3, 8, {8, 152064, 0}},
      {DType::kF16, 1024, 8, 4, 4, {3, 128256, 8}},   {DType::kBF16, 256, 1, 8, 4, {5, 4099, 1}},
      {DType::kF32, 512, 4, 4, 2, {2, 10000, 4}},     {DType::kBF16, 1024, 8, 1, 2, {64, 12288, 0}},
  };
  std::vector<Params> params;
  for (const Case& c : cases) {
    params.push_back({{"dtype", Value::dtype(c.dt)}, {"threads", Value::integer(c.threads)}, {"vec", Value::integer(c.vec)},
                      {"items", Value::integer(c.items)}, {"cluster", Value::integer(c.cluster)}});
    KILN_ASSERT_OK(t->check(params.back(), g->limits));
    KILN_ASSERT_OK(t->check_problem(params.back(), Shape{c.shape.rows, c.shape.cols}));
  }
  std::vector<Config> configs = build(*t, params, g->target);
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const RowShape& s = c.shape;
    const int64_t ld = s.cols + s.pad;
    SCOPED_TRACE(fmt::format("{} rows={} cols={} ld=+{}", configs[i].r.config_name, s.rows, s.cols, s.pad));
    ASSERT_TRUE(configs[i].kernel.has_value());
    const float scale = 0.7f;
    auto x = round_to(random_values(s.rows * ld, -6, 6), c.dt);
    std::vector<double> ref(s.rows * s.cols);
    for (int64_t r = 0; r < s.rows; ++r) {
      double m = -INFINITY, sum = 0;
      for (int64_t col = 0; col < s.cols; ++col) m = std::max(m, x[r * ld + col] * scale);
      for (int64_t col = 0; col < s.cols; ++col) sum += std::exp(x[r * ld + col] * scale - m);
      for (int64_t col = 0; col < s.cols; ++col) ref[r * s.cols + col] = std::exp(x[r * ld + col] * scale - m) / sum;
    }
    KILN_ASSERT_OK_AND_ASSIGN(Buf dx, upload(x, c.dt));
    KILN_ASSERT_OK_AND_ASSIGN(Buf dy, poisoned(s.rows * ld, c.dt));
    SoftmaxArgs a{};
    a.x = ptr(dx);
    a.y = ptr(dy);
    a.rows = static_cast<int>(s.rows);
    a.cols = static_cast<int>(s.cols);
    a.ld_x = a.ld_y = ld;
    a.scale = scale;
    KILN_ASSERT_OK_AND_ASSIGN(auto y, run_rows(t, configs[i], s, ld, a, dy));
    EXPECT_LE(rel_error(y, ld, ref, s.rows, s.cols), tolerance(c.dt));
  }
}

// ------------------------------------------------------------------------------------------------ split-K

double apply_ops(double v, const EpilogueSpec& spec, double bias, double residual, double alpha, double beta) {
  for (EpilogueOp op : spec.ops) {
    switch (op) {
      case EpilogueOp::kScale: v *= alpha; break;
      case EpilogueOp::kBias: v += bias; break;
      case EpilogueOp::kResidual: v += beta * residual; break;
      case EpilogueOp::kRelu: v = std::max(v, 0.0); break;
      case EpilogueOp::kGelu: v = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))); break;
      case EpilogueOp::kSilu: v = v / (1 + std::exp(-v)); break;
    }
  }
  return v;
}

TEST(GpuTemplates, SplitKReduce) {
  KILN_REQUIRE_GPU();
  KILN_ASSERT_OK_AND_ASSIGN(Sample sample, sample_for_device("splitk_reduce"));
  const TemplatePtr& t = sample.t;
  std::vector<Config>& configs = sample.configs;
  struct S {
    int64_t m, n, slices, ldd_pad;
  };
  for (Config& c : configs) {
    if (!c.kernel) continue;
    const Value& epi = c.r.params.at("epilogue");
    // The tag is "<ops>_<out dtype>"; the spec is parsed back from it.
    std::string tag = epi.code_tag();
    auto cut = tag.rfind('_');
    KILN_ASSERT_OK_AND_ASSIGN(DType out, parse_dtype(tag.substr(cut + 1)));
    KILN_ASSERT_OK_AND_ASSIGN(EpilogueSpec spec, parse_epilogue(tag.substr(0, cut), out));
    ASSERT_EQ(render_epilogue(spec), epi.as_code());
    for (S s : std::vector<S>{{1, 8, 2, 0}, {7, 40, 3, 0}, {17, 1001, 2, 0}, {4095, 64, 4, 0}, {33, 256, 1, 3}}) {
      SCOPED_TRACE(fmt::format("{} m={} n={} slices={} ldd=+{}", c.r.config_name, s.m, s.n, s.slices, s.ldd_pad));
      const int64_t ldd = s.n + s.ldd_pad;
      auto ws = random_values(s.slices * s.m * s.n, -2, 2);
      auto bias = round_to(random_values(s.n, -1, 1), out);
      auto resid = round_to(random_values(s.m * ldd, -1, 1), out);
      const float alpha = 0.5f, beta = 0.75f;
      std::vector<double> ref(s.m * s.n);
      auto ws32 = round_to(ws, DType::kF32);
      for (int64_t i = 0; i < s.m; ++i) {
        for (int64_t j = 0; j < s.n; ++j) {
          double acc = 0;
          for (int64_t z = 0; z < s.slices; ++z) acc += ws32[z * s.m * s.n + i * s.n + j];
          ref[i * s.n + j] = apply_ops(acc, spec, bias[j], resid[i * ldd + j], alpha, beta);
        }
      }
      KILN_ASSERT_OK_AND_ASSIGN(Buf dws, upload(ws, DType::kF32));
      KILN_ASSERT_OK_AND_ASSIGN(Buf dbias, upload(bias, out));
      KILN_ASSERT_OK_AND_ASSIGN(Buf dres, upload(resid, out));
      KILN_ASSERT_OK_AND_ASSIGN(Buf dd, poisoned(s.m * ldd, out));
      SplitKReduceArgs a{};
      a.workspace = static_cast<const float*>(ptr(dws));
      a.d = ptr(dd);
      a.m = static_cast<int>(s.m);
      a.n = static_cast<int>(s.n);
      a.slices = static_cast<int>(s.slices);
      a.slice_stride = s.m * s.n;
      a.ldd = ldd;
      a.ep = default_epilogue_args();
      a.ep.bias = ptr(dbias);
      a.ep.residual = ptr(dres);
      a.ep.ld_residual = ldd;
      a.ep.alpha = alpha;
      a.ep.beta = beta;
      KILN_ASSERT_OK_AND_ASSIGN(Launch geo, t->geometry(c.r.params, Shape{s.m, s.n, 1, 1, static_cast<int>(s.slices)}));
      KILN_ASSERT_OK(launch(*c.kernel, geo, a, nullptr));
      KILN_ASSERT_OK(sync());
      KILN_ASSERT_OK_AND_ASSIGN(auto d, download(dd, s.m * ldd));
      EXPECT_LE(rel_error(d, ldd, ref, s.m, s.n), tolerance(out));
    }
  }
}

// ------------------------------------------------------------------------------------------------ launch checks

TEST(GpuTemplates, LaunchRefusesMisalignedArguments) {
  KILN_REQUIRE_GPU();
  auto g = gpu();
  ASSERT_TRUE(g);
  KILN_ASSERT_OK_AND_ASSIGN(TemplatePtr t, find_template("rmsnorm"));
  Params p{{"dtype", Value::dtype(DType::kBF16)}, {"residual", Value::boolean(false)}, {"threads", Value::integer(128)},
           {"rows_per_block", Value::integer(1)}, {"vec", Value::integer(8)},          {"items", Value::integer(1)}};
  auto configs = build(*t, {p}, g->target);
  ASSERT_TRUE(configs[0].kernel);
  KILN_ASSERT_OK_AND_ASSIGN(DeviceBuffer buf, DeviceBuffer::allocate(1 << 16));
  char* base = reinterpret_cast<char*>(static_cast<uintptr_t>(buf.ptr()));
  NormArgs a{};
  a.x = base + 2;  // one bf16 element off a 16-byte boundary
  a.weight = base;
  a.y = base + 4096;
  a.rows = 1;
  a.cols = 64;
  a.ld_x = a.ld_y = 64;
  KILN_ASSERT_OK_AND_ASSIGN(Launch geo, t->geometry(p, Shape{1, 64}));
  Status s = launch(*configs[0].kernel, geo, a, nullptr);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("norm: x"));
  a.x = base;
  a.ld_y = 60;
  EXPECT_THAT(launch(*configs[0].kernel, geo, a, nullptr).message(), ::testing::HasSubstr("ld_y = 60"));
  a.ld_y = 64;
  KILN_EXPECT_OK(launch(*configs[0].kernel, geo, a, nullptr));
  KILN_EXPECT_OK(sync());
}

}  // namespace
}  // namespace kiln::templates
