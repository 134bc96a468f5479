/* ewdsl: a small elementwise/reduction expression language JIT-compiled and autotuned through kiln's C API.
 *
 *   ew_program* p;  ew_parse("sum(x * x)", &p, err, sizeof err);       (or "a * x + y", "max(x, 0) * w", ...)
 *   ew_kernel* k;   ew_build(ctx, p, "norm2", 1 << 20, &k);             (variants registered, tuned or loaded)
 *   ew_run(k, inputs, out, n, stream);                                    (the chosen variant)
 *
 * The language: one expression over float arrays of one length n, named by identifiers (in order of first use
 * they are the kernel's inputs), with float literals, + - * /, unary minus, parentheses and the functions
 * exp, log, sqrt, tanh, abs (one argument), min and max (two). A whole program may be sum(expr): the sum over
 * all n elements of expr, one float. Everything else is an error with its position.
 *
 * How it uses kiln (this is the part a DSL author copies): the front end emits one CUDA C++ source per
 * program, written over two macros, VEC (elements per thread, with float2/float4 loads) and BLOCK (threads
 * per block); each (VEC, BLOCK) pair is a kiln variant. kiln compiles them through its pool and cache, checks
 * each against the reference variant (VEC=1) and against this DSL's own host interpreter, times them, and
 * stores the decision: the next process that builds the same program on the same GPU gets the winner from the
 * cache without tuning.
 */
#ifndef EWDSL_H_
#define EWDSL_H_

#include <kiln/kiln.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ew_program ew_program;

/* Parses `text`. On an error returns non-zero and writes "column N: what" into err. */
int ew_parse(const char* text, ew_program** out, char* err, size_t err_cap);
void ew_free(ew_program* p);

/* The inputs, in kernel parameter order. */
int ew_num_inputs(const ew_program* p);
const char* ew_input_name(const ew_program* p, int i);
/* 1 for a sum(...) program (its output is one float), 0 for an elementwise one (n floats). */
int ew_is_reduction(const ew_program* p);

/* The program evaluated on the host at element i of `inputs` (one array per input): the DSL's reference. */
float ew_eval(const ew_program* p, const float* const* inputs, int64_t i);

/* The CUDA C++ source of the program's kernel `name`, written over VEC and BLOCK (malloc'd; free it).
 * Elementwise: name(const float* in0, ..., float* out, int n).
 * Reduction:   name(const float* in0, ..., float* out, float* partials, unsigned* counter, int n). */
char* ew_emit_cuda(const ew_program* p, const char* name);

/* The variants the front end tries: VEC in {1, 2, 4} x BLOCK in {128, 256}. */
#define EW_NUM_VARIANTS 6

typedef struct ew_kernel ew_kernel;

/* Registers the program's variants as the kiln op "ewdsl.<name>" and tunes them at size `tune_n` (or loads the
 * cached decision). Needs a GPU. The program must outlive the kernel. */
kiln_status ew_build(kiln_context* ctx, const ew_program* p, const char* name, int64_t tune_n, ew_kernel** out);
/* Compiles every variant for `arch` into kiln's cache without a GPU (a build machine); *compiled variants. */
kiln_status ew_precompile(kiln_context* ctx, const ew_program* p, const char* name, const char* arch, int* compiled);
/* Runs the chosen variant: `inputs` are ew_num_inputs() device pointers of n floats; `out` n floats (or one for
 * a reduction). */
kiln_status ew_run(ew_kernel* k, const uint64_t* inputs, uint64_t out, int64_t n, void* stream);
/* The chosen variant's name ("vec4_block256") and whether it came from kiln's cache. */
const char* ew_chosen(const ew_kernel* k);
int ew_from_cache(const ew_kernel* k);
void ew_kernel_free(ew_kernel* k);

#ifdef __cplusplus
}
#endif

#endif /* EWDSL_H_ */
