/* ewdsl-demo: compile, tune and run one ewdsl program through kiln, checked against the DSL's interpreter.
 *
 *   ewdsl-demo 'a * x + y'                     tune (or load the cached decision) and run on 1M elements
 *   ewdsl-demo --n 4096 'sum(x * x)'           another size; a reduction
 *   ewdsl-demo --source 'max(x, 0)'            print the generated CUDA C++ and stop
 *   ewdsl-demo --precompile sm_90 'a * x + y'  compile every variant into kiln's cache, no GPU needed
 *
 * kiln's cache is $KILN_CACHE_DIR (default ~/.cache/kiln): run it twice and the second run loads the winner. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ewdsl.h"

static int kiln_failed(const char* what, kiln_status st) {
  fprintf(stderr, "ewdsl-demo: %s failed (%s): %s\n", what, kiln_status_name(st), kiln_last_error());
  return 1;
}

int main(int argc, char** argv) {
  const char* program = NULL;
  const char* precompile_arch = NULL;
  int show_source = 0, i, rc = 0;
  long long n = 1 << 20;
  char err[256];
  ew_program* p = NULL;
  kiln_context* ctx = NULL;
  kiln_status st;

  for (i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "--n") == 0 && i + 1 < argc) {
      n = atoll(argv[++i]);
    } else if (strcmp(argv[i], "--precompile") == 0 && i + 1 < argc) {
      precompile_arch = argv[++i];
    } else if (strcmp(argv[i], "--source") == 0) {
      show_source = 1;
    } else {
      program = argv[i];
    }
  }
  if (program == NULL || n <= 0) {
    fprintf(stderr, "usage: ewdsl-demo [--n N] [--source] [--precompile ARCH] PROGRAM\n");
    return 2;
  }
  if (ew_parse(program, &p, err, sizeof err) != 0) {
    fprintf(stderr, "ewdsl-demo: %s\n  %s\n", err, program);
    return 2;
  }
  if (show_source) {
    char* src = ew_emit_cuda(p, "demo");
    fputs(src, stdout);
    free(src);
    ew_free(p);
    return 0;
  }
  if ((st = kiln_context_create(NULL, &ctx)) != KILN_OK) {
    ew_free(p);
    return kiln_failed("kiln_context_create", st);
  }
  if (precompile_arch != NULL) {
    int compiled = 0;
    st = ew_precompile(ctx, p, "demo", precompile_arch, &compiled);
    if (st != KILN_OK) {
      rc = kiln_failed("precompile", st);
    } else {
      printf("compiled %d variants of '%s' for %s into kiln's cache\n", compiled, program, precompile_arch);
    }
  } else {
    ew_kernel* k = NULL;
    const int inputs = ew_num_inputs(p);
    const size_t bytes = sizeof(float) * (size_t)n;
    const size_t out_count = ew_is_reduction(p) ? 1 : (size_t)n;
    uint64_t dev[8] = {0}, out = 0;
    float* host[8] = {0};
    float* got = (float*)malloc(sizeof(float) * out_count);
    double worst = 0;
    long long j;
    st = ew_build(ctx, p, "demo", n, &k);
    if (st != KILN_OK) {
      rc = kiln_failed("ew_build", st);
    } else {
      printf("'%s': %d input(s), chose %s (%s)\n", program, inputs, ew_chosen(k),
             ew_from_cache(k) ? "kiln's cached decision" : "tuned now");
      for (i = 0; i < inputs && st == KILN_OK; ++i) {
        host[i] = (float*)malloc(bytes);
        for (j = 0; j < n; ++j) host[i][j] = (float)((j * (i + 3)) % 17) / 17.0f;
        st = kiln_device_alloc(ctx, bytes, &dev[i]);
        if (st == KILN_OK) st = kiln_copy_to_device(ctx, dev[i], host[i], bytes);
      }
      if (st == KILN_OK) st = kiln_device_alloc(ctx, sizeof(float) * out_count, &out);
      if (st == KILN_OK) st = ew_run(k, dev, out, n, NULL);
      if (st == KILN_OK) st = kiln_synchronize(ctx, NULL);
      if (st == KILN_OK) st = kiln_copy_to_host(ctx, got, out, sizeof(float) * out_count);
      if (st != KILN_OK) {
        rc = kiln_failed("running it", st);
      } else if (ew_is_reduction(p)) {
        double want = 0;
        for (j = 0; j < n; ++j) want += ew_eval(p, (const float* const*)host, j);
        worst = (got[0] - want) / (1.0 + (want < 0 ? -want : want));
        printf("sum = %.7g (the interpreter: %.7g)\n", (double)got[0], want);
      } else {
        for (j = 0; j < n; ++j) {
          double d = got[j] - ew_eval(p, (const float* const*)host, j);
          if (d < 0) d = -d;
          if (d > worst) worst = d;
        }
        printf("out[0] = %.7g, out[n-1] = %.7g; largest difference from the interpreter %.3g\n", (double)got[0],
               (double)got[n - 1], worst);
      }
      if (rc == 0 && (worst > 1e-3 || worst < -1e-3)) {
        fprintf(stderr, "ewdsl-demo: the result differs from the interpreter\n");
        rc = 1;
      }
    }
    for (i = 0; i < inputs; ++i) {
      kiln_device_free(ctx, dev[i]);
      free(host[i]);
    }
    kiln_device_free(ctx, out);
    free(got);
    ew_kernel_free(k);
  }
  kiln_context_destroy(ctx);
  ew_free(p);
  return rc;
}
