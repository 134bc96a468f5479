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
  EXPECT(kiln_context_create(&options, &ctx) == KILN_OK);
  if (ctx == NULL) return 1;

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

  kiln_context_destroy(ctx);
  {
    char cmd[64];
    sprintf(cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  }
  if (failures == 0) printf("kiln %s: C99 round trip ok\n", kiln_version());
  return failures == 0 ? 0 : 1;
}
