/* ewdsl's test. `test_ewdsl cpu`: the parser (and its errors), the interpreter, the emitter, and every variant
 * compiled through kiln into a fresh cache for sm_90 (no GPU). `test_ewdsl gpu`: tune, run and check
 * elementwise and reduction programs, unaligned inputs, and a second context that loads the decisions from
 * the cache in strict mode; exits 77 (skipped) without a GPU. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ewdsl.h"

static int failures = 0;
#define EXPECT(cond)                                                                                  \
  do {                                                                                                \
    if (!(cond)) {                                                                                    \
      fprintf(stderr, "%s:%d: expected %s (kiln: %s)\n", __FILE__, __LINE__, #cond, kiln_last_error()); \
      ++failures;                                                                                     \
    }                                                                                                 \
  } while (0)

static void expect_error(const char* program, const char* words) {
  ew_program* p = NULL;
  char err[200];
  int rc = ew_parse(program, &p, err, sizeof err);
  EXPECT(rc != 0 && p == NULL);
  if (strstr(err, words) == NULL) {
    fprintf(stderr, "parsing '%s': the error '%s' does not say '%s'\n", program, err, words);
    ++failures;
  }
}

static kiln_context* context(const char* dir, kiln_tune_mode mode) {
  kiln_context_options o;
  kiln_context* ctx = NULL;
  kiln_context_options_init(&o);
  o.cache_dir = dir;
  o.tune_mode = mode;
  o.executor = KILN_EXECUTOR_ARENA;
  EXPECT(kiln_context_create(&o, &ctx) == KILN_OK);
  return ctx;
}

static void cpu_tests(const char* dir) {
  ew_program* p = NULL;
  char err[200];
  float a[] = {2, 3}, x[] = {10, 20}, y[] = {1, 1};
  const float* in[] = {a, x, y};
  char* src;
  kiln_context* ctx;
  int compiled = 0;

  EXPECT(ew_parse("a * x + y", &p, err, sizeof err) == 0);
  EXPECT(ew_num_inputs(p) == 3 && strcmp(ew_input_name(p, 1), "x") == 0 && !ew_is_reduction(p));
  EXPECT(ew_eval(p, in, 1) == 61.0f);
  src = ew_emit_cuda(p, "axpy");
  EXPECT(src && strstr(src, "void __launch_bounds__(BLOCK) axpy(const float* __restrict__ in0") != NULL);
  EXPECT(src && strstr(src, "load_vec(in2 + base, a2)") != NULL);
  free(src);
  ew_free(p);

  EXPECT(ew_parse("sum(max(x, 0.5) * -w / 2)", &p, err, sizeof err) == 0);
  EXPECT(ew_is_reduction(p) && ew_num_inputs(p) == 2);
  src = ew_emit_cuda(p, "r");
  EXPECT(src && strstr(src, "atomicAdd(counter, 1u)") != NULL && strstr(src, "fmaxf(v0, 5.000000000e-01f)") != NULL);
  free(src);
  ew_free(p);

  expect_error("a +", "column 4: the expression ends too early");
  expect_error("foo(x)", "unknown function 'foo'");
  expect_error("2 + 3", "reads no input");
  expect_error("sum(x) + 1", "unexpected '+' after the expression");
  expect_error("x $ y", "column 3: unexpected '$'");
  expect_error("min(x)", "min takes two arguments");
  expect_error("exp(sum(x))", "sum(...) must be the whole program");
  expect_error("(x + y", "expected ')'");

  /* Every variant through NVRTC and kiln's cache, no GPU. */
  ctx = context(dir, KILN_TUNE_MODE_TUNE);
  if (ctx == NULL) return;
  EXPECT(ew_parse("tanh(x) * a + y", &p, err, sizeof err) == 0);
  EXPECT(ew_precompile(ctx, p, "cpu_ew", "sm_90", &compiled) == KILN_OK);
  EXPECT(compiled == EW_NUM_VARIANTS);
  ew_free(p);
  EXPECT(ew_parse("sum(abs(x - y))", &p, err, sizeof err) == 0);
  EXPECT(ew_precompile(ctx, p, "cpu_sum", "sm_90", &compiled) == KILN_OK);
  EXPECT(compiled == EW_NUM_VARIANTS);
  ew_free(p);
  kiln_context_destroy(ctx);
}

/* Runs `program` on n elements (inputs offset by `offset` floats) and compares with the interpreter. */
static void run_and_check(kiln_context* ctx, ew_kernel* k, const ew_program* p, int n, int offset) {
  const int inputs = ew_num_inputs(p);
  const int out_count = ew_is_reduction(p) ? 1 : n;
  uint64_t dev[8] = {0}, dev_at[8] = {0}, out = 0;
  float* host[8] = {0};
  float* got = (float*)malloc(sizeof(float) * (size_t)out_count);
  int i, j;
  for (i = 0; i < inputs; ++i) {
    host[i] = (float*)malloc(sizeof(float) * (size_t)n);
    for (j = 0; j < n; ++j) host[i][j] = (float)((j * (i + 5)) % 23) / 23.0f - 0.3f;
    EXPECT(kiln_device_alloc(ctx, sizeof(float) * (size_t)(n + offset), &dev[i]) == KILN_OK);
    dev_at[i] = dev[i] + sizeof(float) * (size_t)offset;
    EXPECT(kiln_copy_to_device(ctx, dev_at[i], host[i], sizeof(float) * (size_t)n) == KILN_OK);
  }
  EXPECT(kiln_device_alloc(ctx, sizeof(float) * (size_t)out_count, &out) == KILN_OK);
  EXPECT(ew_run(k, dev_at, out, n, NULL) == KILN_OK);
  EXPECT(kiln_synchronize(ctx, NULL) == KILN_OK);
  EXPECT(kiln_copy_to_host(ctx, got, out, sizeof(float) * (size_t)out_count) == KILN_OK);
  if (ew_is_reduction(p)) {
    double want = 0;
    for (j = 0; j < n; ++j) want += ew_eval(p, (const float* const*)host, j);
    EXPECT(fabs(got[0] - want) <= 1e-3 * (1 + fabs(want)));
  } else {
    for (j = 0; j < n; ++j) {
      float want = ew_eval(p, (const float* const*)host, j);
      if (fabsf(got[j] - want) > 1e-5f * (1 + fabsf(want))) {
        fprintf(stderr, "out[%d] = %g, want %g\n", j, (double)got[j], (double)want);
        ++failures;
        break;
      }
    }
  }
  for (i = 0; i < inputs; ++i) {
    kiln_device_free(ctx, dev[i]);
    free(host[i]);
  }
  kiln_device_free(ctx, out);
  free(got);
}

static int gpu_tests(const char* dir) {
  const char* programs[] = {"a * x + y", "sum(x * x)", "max(x, 0) * exp(-w)"};
  char chosen[3][64];
  int devices = 0, i;
  char err[200];
  if (kiln_device_count(&devices) != KILN_OK || devices == 0) {
    printf("skipped: needs a GPU (%s)\n", devices == 0 && kiln_last_error()[0] == '\0' ? "no device" : kiln_last_error());
    return 77;
  }
  for (int round = 0; round < 2; ++round) {
    /* Round 1 tunes; round 2 is a fresh context in strict mode: every decision must come from the cache. */
    kiln_context* ctx = context(dir, round == 0 ? KILN_TUNE_MODE_TUNE : KILN_TUNE_MODE_STRICT);
    if (ctx == NULL) return 1;
    for (i = 0; i < 3; ++i) {
      ew_program* p = NULL;
      ew_kernel* k = NULL;
      char name[16];
      sprintf(name, "gpu%d", i);
      EXPECT(ew_parse(programs[i], &p, err, sizeof err) == 0);
      EXPECT(ew_build(ctx, p, name, 1 << 20, &k) == KILN_OK);
      if (k != NULL) {
        printf("%-22s %s chose %s\n", programs[i], round == 0 ? "tuned:" : "cached:", ew_chosen(k));
        if (round == 0) {
          EXPECT(!ew_from_cache(k));
          strcpy(chosen[i], ew_chosen(k));
        } else {
          EXPECT(ew_from_cache(k));
          EXPECT(strcmp(chosen[i], ew_chosen(k)) == 0);
        }
        run_and_check(ctx, k, p, 100003, 0); /* a tail past the last full vector */
        run_and_check(ctx, k, p, 4097, 1);   /* inputs not aligned for float2/float4 loads */
      }
      ew_kernel_free(k);
      ew_free(p);
    }
    kiln_context_destroy(ctx);
  }
  return failures == 0 ? 0 : 1;
}

/* `test_ewdsl cpu`, `test_ewdsl gpu`, or with no mode (or only other arguments, as a script that runs every
 * test program passes them) both: then a GPU part skipped for want of a GPU is not a failure. */
int main(int argc, char** argv) {
  char dir[] = "/tmp/kiln_ewdsl_XXXXXX";
  char cmd[64];
  const char* mode = argc >= 2 && argv[1][0] != '-' ? argv[1] : "all";
  int rc = 0;
  if (strcmp(mode, "cpu") != 0 && strcmp(mode, "gpu") != 0 && strcmp(mode, "all") != 0) {
    fprintf(stderr, "usage: test_ewdsl [cpu|gpu]\n");
    return 2;
  }
  if (mkdtemp(dir) == NULL) return 2;
  if (strcmp(mode, "gpu") != 0) {
    cpu_tests(dir);
    rc = failures == 0 ? 0 : 1;
  }
  if (rc == 0 && strcmp(mode, "cpu") != 0) {
    rc = gpu_tests(dir);
    if (rc == 77 && strcmp(mode, "all") == 0) rc = 0;
  }
  sprintf(cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  if (rc == 0) printf("ewdsl %s tests passed\n", mode);
  return rc;
}
