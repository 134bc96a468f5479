/* kiln/kiln.h as strict C99 (-std=c99 -Wall -Wextra -pedantic -Werror): the header compiles as plain C, and a
 * C program links libkiln and round-trips a context, a compile and an error. Exits non-zero on a failure. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <kiln/kiln.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0;

#define EXPECT(cond)                                                         \
  do {                                                                       \
    if (!(cond)) {                                                           \
      fprintf(stderr, "%s:%d: expected %s (%s)\n", __FILE__, __LINE__, #cond, \
              kiln_last_error());                                            \
      ++failures;                                                            \
    }                                                                        \
  } while (0)

/* An invalid-argument error whose message has `text`. */
static void expect_invalid(kiln_status status, const char* text, int line) {
  if (status != KILN_ERROR_INVALID_ARGUMENT || strstr(kiln_last_error(), text) == NULL) {
    fprintf(stderr, "%s:%d: expected an invalid argument saying \"%s\", got %s (%s)\n", __FILE__, line, text,
            kiln_status_name(status), kiln_last_error());
    ++failures;
  }
}
#define EXPECT_INVALID(call, text) expect_invalid((call), (text), __LINE__)

/* A C enum is an int to its caller, who may store anything in it: every enum-typed field and argument is checked
 * as an integer and rejected with its name (under UBSan, loading such a value as the C++ enum type is reported). */
static void garbage_enums(kiln_context* ctx, const char* dir) {
  kiln_context_options o;
  kiln_context* bad = NULL;
  kiln_gemm_args g;
  kiln_rmsnorm_args r;
  kiln_softmax_args sm;
  kiln_allreduce* ar = NULL;

  kiln_context_options_init(&o);
  o.cache_dir = dir;
  o.tune_mode = (kiln_tune_mode)42;
  EXPECT_INVALID(kiln_context_create(&o, &bad), "options.tune_mode 42 is not a kiln_tune_mode (0 to 4)");
  EXPECT(bad == NULL);
  kiln_context_options_init(&o);
  o.cache_dir = dir;
  o.executor = (kiln_executor_kind)-3;
  EXPECT_INVALID(kiln_context_create(&o, &bad), "options.executor -3 is not a kiln_executor_kind");
  kiln_context_options_init(&o);
  o.cache_dir = dir;
  o.log_level = (kiln_log_level)1000;
  EXPECT_INVALID(kiln_context_create(&o, &bad), "options.log_level 1000 is not a kiln_log_level (1 to 4)");
  EXPECT(bad == NULL);

  kiln_gemm_args_init(&g);
  g.m = g.n = g.k = 64;
  g.a = g.b = g.d = 0x1000;
  g.b_layout = (kiln_layout)7;
  EXPECT_INVALID(kiln_gemm(ctx, &g, NULL), "args.b_layout 7 is not a kiln_layout (0 to 1)");
  kiln_gemm_args_init(&g);
  g.m = g.n = g.k = 64;
  g.a = g.b = g.d = 0x1000;
  g.d_dtype = (kiln_dtype)-1;
  EXPECT_INVALID(kiln_gemm(ctx, &g, NULL), "args.d_dtype -1 is not a kiln_dtype (0 to 2)");
  kiln_rmsnorm_args_init(&r);
  r.rows = 4;
  r.cols = 64;
  r.x = r.weight = r.y = 0x1000;
  r.dtype = (kiln_dtype)123456;
  EXPECT_INVALID(kiln_rmsnorm(ctx, &r, NULL), "args.dtype 123456 is not a kiln_dtype");
  kiln_softmax_args_init(&sm);
  sm.rows = 4;
  sm.cols = 64;
  sm.x = sm.y = 0x1000;
  sm.dtype = (kiln_dtype)3;
  EXPECT_INVALID(kiln_softmax(ctx, &sm, NULL), "args.dtype 3 is not a kiln_dtype");
  /* Checked after the communicator: without one (or without NCCL) the call fails before reading dtype. */
  EXPECT(kiln_allreduce_create(ctx, NULL, 0, 1, (kiln_dtype)99, 0, &ar) == KILN_ERROR_INVALID_ARGUMENT && ar == NULL);
  EXPECT(strcmp(kiln_status_name((kiln_status)-7), "unknown status") == 0);
  EXPECT(strcmp(kiln_status_name((kiln_status)100000), "unknown status") == 0);
}

int main(void) {
  kiln_context_options options;
  kiln_context* ctx = NULL;
  kiln_source source;
  kiln_kernel* kernel = NULL;
  char key[33];
  char dir[] = "/tmp/kiln_capi_c99_XXXXXX";

  EXPECT(strlen(kiln_version()) > 0);
  EXPECT(kiln_context_create(NULL, NULL) == KILN_ERROR_INVALID_ARGUMENT);
  EXPECT(strstr(kiln_last_error(), "out is NULL") != NULL);

  if (mkdtemp(dir) == NULL) return 2;
  kiln_context_options_init(&options);
  options.cache_dir = dir;
  options.executor = KILN_EXECUTOR_INLINE;
  options.tune_mode = KILN_TUNE_MODE_TUNE;
  options.remote_cache = ""; /* no remote, whatever $KILN_REMOTE_CACHE says */
  EXPECT(kiln_context_create(&options, &ctx) == KILN_OK);
  if (ctx == NULL) return 1;
  {
    /* The remote calls from C: without a remote, the counters say so and a push says what is missing. */
    kiln_remote_stats rs;
    kiln_sync_options so;
    kiln_sync_report report;
    rs.size = sizeof(rs);
    EXPECT(kiln_cache_remote_stats(ctx, &rs) == KILN_OK && rs.configured == 0 && rs.breaker == KILN_BREAKER_CLOSED);
    kiln_sync_options_init(&so);
    so.decisions_only = 1;
    report.size = sizeof(report);
    EXPECT(kiln_cache_push(ctx, &so, &report) == KILN_ERROR_FAILED_PRECONDITION);
    EXPECT(strstr(kiln_last_error(), "no remote cache named") != NULL);
  }

  kiln_source_init(&source);
  source.source = "extern \"C\" __global__ void twice(float* x) { x[threadIdx.x] *= 2.0f; }";
  source.kernel = "twice";
  source.arch = "sm_90";
  EXPECT(kiln_compile(ctx, &source, &kernel) == KILN_OK);
  EXPECT(kiln_kernel_key(kernel, key) == KILN_OK && strlen(key) == 32);
  kiln_kernel_destroy(kernel);

  source.source = "not cuda";
  kernel = NULL;
  EXPECT(kiln_compile(ctx, &source, &kernel) == KILN_ERROR_COMPILE);
  EXPECT(kernel == NULL);
  EXPECT(strlen(kiln_last_error_detail()) > 0);

  garbage_enums(ctx, dir);

  kiln_context_destroy(ctx);
  {
    char cmd[64];
    sprintf(cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  }
  if (failures == 0) printf("kiln %s: C99 round trip ok\n", kiln_version());
  return failures == 0 ? 0 : 1;
}
