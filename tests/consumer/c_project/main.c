/* A C program outside kiln's tree, built with `cc main.c $(pkg-config --cflags --libs kiln)` against an
 * installed kiln: creates a context with the defaults (the process pool, its worker found relative to
 * libkiln.so), compiles a kernel for sm_90 and prints its key. */
#include <kiln/kiln.h>
#include <stdio.h>

int main(void) {
  kiln_context* ctx = NULL;
  kiln_kernel* kernel = NULL;
  kiln_source src;
  char key[33];
  kiln_status st = kiln_context_create(NULL, &ctx);
  if (st != KILN_OK) {
    fprintf(stderr, "kiln_context_create: %s\n", kiln_last_error());
    return 1;
  }
  kiln_source_init(&src);
  src.source = "extern \"C\" __global__ void k(float* x) { x[threadIdx.x] += 1.0f; }\n";
  src.kernel = "k";
  src.arch = "sm_90";
  st = kiln_compile(ctx, &src, &kernel);
  if (st != KILN_OK) {
    fprintf(stderr, "kiln_compile: %s\n", kiln_last_error());
    kiln_context_destroy(ctx);
    return 1;
  }
  kiln_kernel_key(kernel, key);
  printf("kiln %s (C, pkg-config): key %s\n", kiln_version(), key);
  kiln_kernel_destroy(kernel);
  kiln_context_destroy(ctx);
  return 0;
}
