/* ewdsl: parser, host interpreter, CUDA C++ emitter, and the kiln glue (variants, tuning, launch). C99, and
 * kiln/kiln.h is the only kiln header it uses. See ewdsl.h for the language. */
#include "ewdsl.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the syntax tree */

enum node_kind { N_NUM, N_VAR, N_NEG, N_ADD, N_SUB, N_MUL, N_DIV, N_CALL };
enum fn_kind { F_EXP, F_LOG, F_SQRT, F_TANH, F_ABS, F_MIN, F_MAX };

static const struct {
  const char* name;
  int args;
  const char* cuda;
} kFunctions[] = {{"exp", 1, "expf"},   {"log", 1, "logf"},   {"sqrt", 1, "sqrtf"}, {"tanh", 1, "tanhf"},
                  {"abs", 1, "fabsf"},  {"min", 2, "fminf"},  {"max", 2, "fmaxf"}};

typedef struct node {
  enum node_kind kind;
  float value;  /* N_NUM */
  int index;    /* N_VAR: the input; N_CALL: the function */
  struct node* a;
  struct node* b;
} node;

#define EW_MAX_INPUTS 8

struct ew_program {
  node* root;
  int reduction;
  int num_inputs;
  char inputs[EW_MAX_INPUTS][32];
};

static void free_node(node* n) {
  if (n == NULL) return;
  free_node(n->a);
  free_node(n->b);
  free(n);
}

/* ---- the parser: recursive descent, one token of lookahead */

typedef struct parser {
  const char* text;
  size_t pos;
  ew_program* prog;
  char* err;
  size_t err_cap;
  int failed;
} parser;

static node* fail(parser* p, const char* fmt, ...) {
  if (!p->failed) {
    va_list ap;
    int n = snprintf(p->err, p->err_cap, "column %d: ", (int)p->pos + 1);
    va_start(ap, fmt);
    if (n >= 0 && (size_t)n < p->err_cap) vsnprintf(p->err + n, p->err_cap - (size_t)n, fmt, ap);
    va_end(ap);
    p->failed = 1;
  }
  return NULL;
}

static void skip_space(parser* p) {
  while (isspace((unsigned char)p->text[p->pos])) ++p->pos;
}

static int accept(parser* p, char c) {
  skip_space(p);
  if (p->text[p->pos] != c) return 0;
  ++p->pos;
  return 1;
}

static node* make(enum node_kind kind, node* a, node* b) {
  node* n = (node*)calloc(1, sizeof(node));
  if (n == NULL) {
    free_node(a);
    free_node(b);
    return NULL;
  }
  n->kind = kind;
  n->a = a;
  n->b = b;
  return n;
}

static node* parse_expr(parser* p);

static node* parse_primary(parser* p) {
  skip_space(p);
  const char* s = p->text + p->pos;
  if (isdigit((unsigned char)*s) || (*s == '.' && isdigit((unsigned char)s[1]))) {
    char* end = NULL;
    float v = strtof(s, &end);
    p->pos += (size_t)(end - s);
    node* n = make(N_NUM, NULL, NULL);
    if (n) n->value = v;
    return n;
  }
  if (isalpha((unsigned char)*s) || *s == '_') {
    char name[32];
    size_t len = 0;
    while (isalnum((unsigned char)s[len]) || s[len] == '_') ++len;
    if (len >= sizeof name) return fail(p, "the name '%.*s' is longer than 31 characters", (int)len, s);
    memcpy(name, s, len);
    name[len] = '\0';
    const size_t at = p->pos;
    p->pos += len;
    if (accept(p, '(')) {
      size_t f = 0;
      while (f < sizeof kFunctions / sizeof kFunctions[0] && strcmp(kFunctions[f].name, name) != 0) ++f;
      if (f == sizeof kFunctions / sizeof kFunctions[0]) {
        p->pos = at;
        return fail(p, strcmp(name, "sum") == 0 ? "sum(...) must be the whole program"
                                                : "unknown function '%s' (exp, log, sqrt, tanh, abs, min, max)",
                    name);
      }
      node* n = make(N_CALL, NULL, NULL);
      if (n == NULL) return NULL;
      n->index = (int)f;
      n->a = parse_expr(p);
      if (kFunctions[f].args == 2) {
        if (!accept(p, ',')) {
          free_node(n);
          return fail(p, "%s takes two arguments", name);
        }
        n->b = parse_expr(p);
      }
      if (!accept(p, ')')) {
        free_node(n);
        return fail(p, "expected ')' closing %s(", name);
      }
      return n;
    }
    int i = 0;
    while (i < p->prog->num_inputs && strcmp(p->prog->inputs[i], name) != 0) ++i;
    if (i == p->prog->num_inputs) {
      if (i == EW_MAX_INPUTS) {
        p->pos = at;
        return fail(p, "more than %d inputs", EW_MAX_INPUTS);
      }
      memcpy(p->prog->inputs[i], name, len + 1);
      ++p->prog->num_inputs;
    }
    node* n = make(N_VAR, NULL, NULL);
    if (n) n->index = i;
    return n;
  }
  if (accept(p, '(')) {
    node* n = parse_expr(p);
    if (!accept(p, ')')) {
      free_node(n);
      return fail(p, "expected ')'");
    }
    return n;
  }
  if (*s == '\0') return fail(p, "the expression ends too early");
  return fail(p, "unexpected '%c'", *s);
}

static node* parse_unary(parser* p) {
  if (accept(p, '-')) {
    node* a = parse_unary(p);
    return a ? make(N_NEG, a, NULL) : NULL;
  }
  return parse_primary(p);
}

/* A left-associative level of binary operators: operand (op operand)*, op one of the two given. */
static node* parse_level(parser* p, node* (*operand)(parser*), char op1, enum node_kind kind1, char op2,
                         enum node_kind kind2) {
  node* left = operand(p);
  while (left != NULL) {
    enum node_kind k;
    node* right;
    if (accept(p, op1)) {
      k = kind1;
    } else if (accept(p, op2)) {
      k = kind2;
    } else {
      break;
    }
    right = operand(p);
    if (right == NULL) {
      free_node(left);
      return NULL;
    }
    left = make(k, left, right);
  }
  return left;
}

static node* parse_term(parser* p) { return parse_level(p, parse_unary, '*', N_MUL, '/', N_DIV); }
static node* parse_expr(parser* p) { return parse_level(p, parse_term, '+', N_ADD, '-', N_SUB); }

int ew_parse(const char* text, ew_program** out, char* err, size_t err_cap) {
  char scratch[8];
  parser p;
  ew_program* prog;
  *out = NULL;
  if (err == NULL || err_cap == 0) {
    err = scratch;
    err_cap = sizeof scratch;
  }
  err[0] = '\0';
  if (text == NULL) {
    snprintf(err, err_cap, "no program");
    return 1;
  }
  prog = (ew_program*)calloc(1, sizeof(ew_program));
  if (prog == NULL) return 1;
  p.text = text;
  p.pos = 0;
  p.prog = prog;
  p.err = err;
  p.err_cap = err_cap;
  p.failed = 0;
  /* sum(...) as the whole program is a reduction. */
  skip_space(&p);
  if (strncmp(text + p.pos, "sum", 3) == 0) {
    size_t save = p.pos;
    p.pos += 3;
    if (accept(&p, '(')) {
      prog->reduction = 1;
      prog->root = parse_expr(&p);
      if (prog->root != NULL && !accept(&p, ')')) fail(&p, "expected ')' closing sum(");
    } else {
      p.pos = save;
    }
  }
  if (!prog->reduction) prog->root = parse_expr(&p);
  skip_space(&p);
  if (!p.failed && prog->root != NULL && text[p.pos] != '\0') fail(&p, "unexpected '%c' after the expression", text[p.pos]);
  if (!p.failed && prog->num_inputs == 0) fail(&p, "the program reads no input array");
  if (p.failed || prog->root == NULL) {
    ew_free(prog);
    return 1;
  }
  *out = prog;
  return 0;
}

void ew_free(ew_program* p) {
  if (p == NULL) return;
  free_node(p->root);
  free(p);
}

int ew_num_inputs(const ew_program* p) { return p->num_inputs; }
const char* ew_input_name(const ew_program* p, int i) { return i >= 0 && i < p->num_inputs ? p->inputs[i] : NULL; }
int ew_is_reduction(const ew_program* p) { return p->reduction; }

/* ---- the host interpreter: the DSL's reference */

static float eval_node(const node* n, const float* const* in, int64_t i) {
  switch (n->kind) {
    case N_NUM: return n->value;
    case N_VAR: return in[n->index][i];
    case N_NEG: return -eval_node(n->a, in, i);
    case N_ADD: return eval_node(n->a, in, i) + eval_node(n->b, in, i);
    case N_SUB: return eval_node(n->a, in, i) - eval_node(n->b, in, i);
    case N_MUL: return eval_node(n->a, in, i) * eval_node(n->b, in, i);
    case N_DIV: return eval_node(n->a, in, i) / eval_node(n->b, in, i);
    case N_CALL:
      switch ((enum fn_kind)n->index) {
        case F_EXP: return expf(eval_node(n->a, in, i));
        case F_LOG: return logf(eval_node(n->a, in, i));
        case F_SQRT: return sqrtf(eval_node(n->a, in, i));
        case F_TANH: return tanhf(eval_node(n->a, in, i));
        case F_ABS: return fabsf(eval_node(n->a, in, i));
        case F_MIN: return fminf(eval_node(n->a, in, i), eval_node(n->b, in, i));
        case F_MAX: return fmaxf(eval_node(n->a, in, i), eval_node(n->b, in, i));
      }
  }
  return 0.0f;
}

float ew_eval(const ew_program* p, const float* const* inputs, int64_t i) { return eval_node(p->root, inputs, i); }

/* ---- the emitter */

typedef struct text {
  char* s;
  size_t len, cap;
  int oom;
} text;

static void put(text* t, const char* fmt, ...) {
  va_list ap;
  int n;
  if (t->oom) return;
  for (;;) {
    va_start(ap, fmt);
    n = vsnprintf(t->s ? t->s + t->len : NULL, t->s ? t->cap - t->len : 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
      t->oom = 1;
      return;
    }
    if (t->s && t->len + (size_t)n < t->cap) break;
    t->cap = (t->cap + (size_t)n + 1) * 2;
    char* grown = (char*)realloc(t->s, t->cap);
    if (grown == NULL) {
      t->oom = 1;
      return;
    }
    t->s = grown;
  }
  t->len += (size_t)n;
}

/* The expression in CUDA C++ over v0, v1, ... (each input's element). */
static void emit_node(text* t, const node* n) {
  switch (n->kind) {
    case N_NUM: put(t, "%.9ef", (double)n->value); return;
    case N_VAR: put(t, "v%d", n->index); return;
    case N_NEG: put(t, "(-"); emit_node(t, n->a); put(t, ")"); return;
    case N_CALL:
      put(t, "%s(", kFunctions[n->index].cuda);
      emit_node(t, n->a);
      if (n->b) {
        put(t, ", ");
        emit_node(t, n->b);
      }
      put(t, ")");
      return;
    default: {
      const char* op = n->kind == N_ADD ? " + " : n->kind == N_SUB ? " - " : n->kind == N_MUL ? " * " : " / ";
      put(t, "(");
      emit_node(t, n->a);
      put(t, "%s", op);
      emit_node(t, n->b);
      put(t, ")");
    }
  }
}

/* Loads of VEC elements (float2/float4 where VEC allows and the pointer is aligned) and a block-wide sum. */
static const char* kPrelude =
    "#ifndef VEC\n#error VEC (elements per thread) must be defined\n#endif\n"
    "#ifndef BLOCK\n#error BLOCK (threads per block) must be defined\n#endif\n"
    "__device__ __forceinline__ void load_vec(const float* __restrict__ p, float (&v)[VEC]) {\n"
    "#if VEC == 4\n  float4 t = *reinterpret_cast<const float4*>(p); v[0] = t.x; v[1] = t.y; v[2] = t.z; v[3] = t.w;\n"
    "#elif VEC == 2\n  float2 t = *reinterpret_cast<const float2*>(p); v[0] = t.x; v[1] = t.y;\n"
    "#else\n  _Pragma(\"unroll\") for (int j = 0; j < VEC; ++j) v[j] = p[j];\n#endif\n}\n"
    "__device__ __forceinline__ void store_vec(float* __restrict__ p, const float (&v)[VEC]) {\n"
    "#if VEC == 4\n  *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);\n"
    "#elif VEC == 2\n  *reinterpret_cast<float2*>(p) = make_float2(v[0], v[1]);\n"
    "#else\n  _Pragma(\"unroll\") for (int j = 0; j < VEC; ++j) p[j] = v[j];\n#endif\n}\n"
    "__device__ __forceinline__ bool aligned(const void* p) {\n"
    "  return reinterpret_cast<unsigned long long>(p) % (VEC * sizeof(float)) == 0;\n}\n"
    "__device__ float block_sum(float v) {\n"
    "  __shared__ float warp_sums[BLOCK / 32];\n"
    "  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);\n"
    "  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x / 32] = v;\n"
    "  __syncthreads();\n"
    "  v = threadIdx.x < BLOCK / 32 ? warp_sums[threadIdx.x] : 0.0f;\n"
    "  if (threadIdx.x < 32) for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);\n"
    "  __syncthreads();\n"
    "  return v;  // complete in thread 0\n}\n";

char* ew_emit_cuda(const ew_program* p, const char* name) {
  text t = {NULL, 0, 0, 0};
  int i;
  put(&t, "// Generated by ewdsl from one program; VEC and BLOCK choose the variant.\n%s\n", kPrelude);
  put(&t, "extern \"C\" __global__ void __launch_bounds__(BLOCK) %s(", name);
  for (i = 0; i < p->num_inputs; ++i) put(&t, "const float* __restrict__ in%d, ", i);
  put(&t, p->reduction ? "float* __restrict__ out, float* partials, unsigned* counter, int n) {\n"
                       : "float* __restrict__ out, int n) {\n");
  /* Each input's VEC elements as arrays a<i>, the expression per element j. */
  put(&t, p->reduction ? "  bool vec_ok = true" : "  bool vec_ok = aligned(out)");
  for (i = 0; i < p->num_inputs; ++i) put(&t, " && aligned(in%d)", i);
  put(&t, ";\n");
  if (p->reduction) {
    put(&t, "  float acc = 0.0f;\n"
            "  const long long stride = (long long)gridDim.x * BLOCK * VEC;\n"
            "  for (long long base = ((long long)blockIdx.x * BLOCK + threadIdx.x) * VEC; base < n; base += stride) {\n");
  } else {
    put(&t, "  const long long base = ((long long)blockIdx.x * BLOCK + threadIdx.x) * VEC;\n  {\n");
    put(&t, "    if (base >= n) return;\n");
  }
  put(&t, "    if (vec_ok && base + VEC <= n) {\n");
  for (i = 0; i < p->num_inputs; ++i) put(&t, "      float a%d[VEC]; load_vec(in%d + base, a%d);\n", i, i, i);
  if (!p->reduction) put(&t, "      float r[VEC];\n");
  put(&t, "      _Pragma(\"unroll\") for (int j = 0; j < VEC; ++j) {\n");
  for (i = 0; i < p->num_inputs; ++i) put(&t, "        const float v%d = a%d[j];\n", i, i);
  put(&t, p->reduction ? "        acc += " : "        r[j] = ");
  emit_node(&t, p->root);
  put(&t, ";\n      }\n");
  if (!p->reduction) put(&t, "      store_vec(out + base, r);\n");
  put(&t, "    } else {\n      for (long long i = base; i < base + VEC && i < n; ++i) {\n");
  for (i = 0; i < p->num_inputs; ++i) put(&t, "        const float v%d = in%d[i];\n", i, i);
  put(&t, p->reduction ? "        acc += " : "        out[i] = ");
  emit_node(&t, p->root);
  put(&t, ";\n      }\n    }\n  }\n");
  if (p->reduction) {
    /* The last block to finish sums the blocks' partials and resets the counter for the next launch. */
    put(&t, "  acc = block_sum(acc);\n"
            "  __shared__ bool last;\n"
            "  if (threadIdx.x == 0) {\n"
            "    partials[blockIdx.x] = acc;\n"
            "    __threadfence();\n"
            "    last = atomicAdd(counter, 1u) == gridDim.x - 1;\n"
            "  }\n"
            "  __syncthreads();\n"
            "  if (last) {\n"
            "    float s = 0.0f;\n"
            "    for (int b = threadIdx.x; b < gridDim.x; b += BLOCK) s += ((volatile float*)partials)[b];\n"
            "    s = block_sum(s);\n"
            "    if (threadIdx.x == 0) { *out = s; *counter = 0u; }\n"
            "  }\n");
  }
  put(&t, "}\n");
  if (t.oom) {
    free(t.s);
    return NULL;
  }
  return t.s;
}

/* ---- kiln: variants, tuning, launches */

#define EW_MAX_BLOCKS 1024 /* a reduction's grid (and its partials) */

typedef struct variant_config {
  int vec, block, reduction;
} variant_config;

/* Static: kiln keeps the geometry callbacks' user pointers as long as the op is registered. */
static const variant_config kConfigs[2][EW_NUM_VARIANTS] = {
    {{1, 128, 0}, {1, 256, 0}, {2, 128, 0}, {2, 256, 0}, {4, 128, 0}, {4, 256, 0}},
    {{1, 128, 1}, {1, 256, 1}, {2, 128, 1}, {2, 256, 1}, {4, 128, 1}, {4, 256, 1}}};

static kiln_status geometry(void* user, const int64_t* sizes, size_t num_sizes, kiln_launch_dims* out) {
  const variant_config* c = (const variant_config*)user;
  int64_t blocks;
  if (num_sizes < 1 || sizes[0] <= 0) {
    kiln_set_callback_error("ewdsl: a launch needs the element count");
    return KILN_ERROR_INVALID_ARGUMENT;
  }
  blocks = (sizes[0] + (int64_t)c->vec * c->block - 1) / ((int64_t)c->vec * c->block);
  if (c->reduction && blocks > EW_MAX_BLOCKS) blocks = EW_MAX_BLOCKS;
  out->grid.x = (unsigned)blocks;
  out->grid.y = out->grid.z = 1;
  out->block.x = (unsigned)c->block;
  out->block.y = out->block.z = 1;
  out->shared_bytes = 0;
  return KILN_OK;
}

struct ew_kernel {
  kiln_context* ctx;
  const ew_program* prog;
  kiln_op* op;
  kiln_selection* sel;
  uint64_t partials, counter; /* reductions */
  char chosen[64];
  int from_cache;
  /* The variants' strings, alive while the op is. */
  char names[EW_NUM_VARIANTS][32];
  char vecs[EW_NUM_VARIANTS][4];
  char blocks[EW_NUM_VARIANTS][8];
  kiln_define defines[EW_NUM_VARIANTS][2];
  char* source;
  char op_name[96];
};

/* One tune's buffers: device arrays (first, so that params[0] leads back here), their host copies. */
typedef struct tune_buffers {
  uint64_t dev[EW_MAX_INPUTS + 3]; /* inputs, out, partials, counter */
  int n;
  void* params[EW_MAX_INPUTS + 4];
  kiln_output out;
  float* host[EW_MAX_INPUTS];
  int num_dev;
} tune_buffers;

static void release(void* user, void* owner) {
  ew_kernel* k = (ew_kernel*)user;
  tune_buffers* b = (tune_buffers*)owner;
  int i;
  if (b == NULL) return;
  for (i = 0; i < b->num_dev; ++i) kiln_device_free(k->ctx, b->dev[i]);
  for (i = 0; i < EW_MAX_INPUTS; ++i) free(b->host[i]);
  free(b);
}

/* Inputs in [-1, 1) from the seed (a linear congruential generator: the same seed, the same data). */
static kiln_status make_buffers(void* user, const int64_t* sizes, size_t num_sizes, uint32_t seed, kiln_tune_buffers* out) {
  ew_kernel* k = (ew_kernel*)user;
  const ew_program* p = k->prog;
  tune_buffers* b;
  uint32_t state = seed * 2654435761u + 1u;
  int i;
  int64_t j;
  if (num_sizes < 1 || sizes[0] <= 0 || sizes[0] > 0x7fffffff) {
    kiln_set_callback_error("ewdsl: the problem size must be a positive int");
    return KILN_ERROR_INVALID_ARGUMENT;
  }
  b = (tune_buffers*)calloc(1, sizeof(tune_buffers));
  if (b == NULL) return KILN_ERROR_OUT_OF_MEMORY;
  out->owner = b; /* released by kiln whatever happens next */
  b->n = (int)sizes[0];
  for (i = 0; i < p->num_inputs; ++i) {
    b->host[i] = (float*)malloc(sizeof(float) * (size_t)b->n);
    if (b->host[i] == NULL) return KILN_ERROR_OUT_OF_MEMORY;
    for (j = 0; j < b->n; ++j) {
      state = state * 1664525u + 1013904223u;
      b->host[i][j] = (float)(state >> 8) / 8388608.0f - 1.0f;
    }
    if (kiln_device_alloc(k->ctx, sizeof(float) * (size_t)b->n, &b->dev[b->num_dev]) != KILN_OK) return KILN_ERROR_CUDA;
    ++b->num_dev;
    if (kiln_copy_to_device(k->ctx, b->dev[i], b->host[i], sizeof(float) * (size_t)b->n) != KILN_OK) return KILN_ERROR_CUDA;
    b->params[i] = &b->dev[i];
  }
  if (kiln_device_alloc(k->ctx, sizeof(float) * (size_t)(p->reduction ? 1 : b->n), &b->dev[b->num_dev]) != KILN_OK) {
    return KILN_ERROR_CUDA;
  }
  b->params[i] = &b->dev[b->num_dev];
  b->out = (kiln_output){b->dev[b->num_dev], KILN_F32, 1, p->reduction ? 1 : b->n, 0, "out"};
  ++b->num_dev;
  ++i;
  if (p->reduction) {
    unsigned zero = 0;
    if (kiln_device_alloc(k->ctx, sizeof(float) * EW_MAX_BLOCKS, &b->dev[b->num_dev]) != KILN_OK) return KILN_ERROR_CUDA;
    b->params[i++] = &b->dev[b->num_dev++];
    if (kiln_device_alloc(k->ctx, sizeof zero, &b->dev[b->num_dev]) != KILN_OK) return KILN_ERROR_CUDA;
    if (kiln_copy_to_device(k->ctx, b->dev[b->num_dev], &zero, sizeof zero) != KILN_OK) return KILN_ERROR_CUDA;
    b->params[i++] = &b->dev[b->num_dev++];
  }
  b->params[i++] = &b->n;
  out->params = b->params;
  out->num_params = (size_t)i;
  out->outputs = &b->out;
  out->num_outputs = 1;
  return KILN_OK;
}

/* Every variant against the DSL's own interpreter (kiln compares them with the reference variant as well). */
static kiln_status check(void* user, const int64_t* sizes, size_t num_sizes, void** params, void* stream) {
  ew_kernel* k = (ew_kernel*)user;
  const tune_buffers* b = (const tune_buffers*)params[0]; /* params[0] is &b->dev[0] */
  const int n = (int)sizes[0];
  const int count = k->prog->reduction ? 1 : n;
  float* got = (float*)malloc(sizeof(float) * (size_t)count);
  kiln_status st;
  char message[160];
  int64_t i;
  (void)num_sizes;
  (void)stream;
  if (got == NULL) return KILN_ERROR_OUT_OF_MEMORY;
  st = kiln_copy_to_host(k->ctx, got, b->out.ptr, sizeof(float) * (size_t)count);
  if (st != KILN_OK) {
    free(got);
    return st;
  }
  if (k->prog->reduction) {
    double want = 0;
    for (i = 0; i < n; ++i) want += ew_eval(k->prog, (const float* const*)b->host, i);
    if (fabs(got[0] - want) > 1e-3 * (1.0 + fabs(want))) {
      snprintf(message, sizeof message, "sum is %.7g, the interpreter says %.7g", (double)got[0], want);
      st = KILN_ERROR_WRONG_RESULT;
    }
  } else {
    for (i = 0; i < n && st == KILN_OK; ++i) {
      const float want = ew_eval(k->prog, (const float* const*)b->host, i);
      if (!(fabsf(got[i] - want) <= 1e-5f * (1.0f + fabsf(want))) && !(isnan(want) && isnan(got[i]))) {
        snprintf(message, sizeof message, "out[%lld] is %.7g, the interpreter says %.7g", (long long)i, (double)got[i],
                 (double)want);
        st = KILN_ERROR_WRONG_RESULT;
      }
    }
  }
  free(got);
  if (st != KILN_OK) kiln_set_callback_error(message);
  return st;
}

/* The op of a program: its variants (the source is the same, VEC and BLOCK differ). */
static kiln_status register_op(kiln_context* ctx, const ew_program* p, const char* name, ew_kernel** out) {
  ew_kernel* k = (ew_kernel*)calloc(1, sizeof(ew_kernel));
  kiln_variant variants[EW_NUM_VARIANTS];
  kiln_variant_op op;
  kiln_status st;
  int i;
  *out = NULL;
  if (k == NULL) return KILN_ERROR_OUT_OF_MEMORY;
  k->ctx = ctx;
  k->prog = p;
  k->source = ew_emit_cuda(p, name);
  if (k->source == NULL) {
    free(k);
    return KILN_ERROR_OUT_OF_MEMORY;
  }
  snprintf(k->op_name, sizeof k->op_name, "ewdsl.%s", name);
  for (i = 0; i < EW_NUM_VARIANTS; ++i) {
    const variant_config* c = &kConfigs[p->reduction][i];
    snprintf(k->names[i], sizeof k->names[i], "vec%d_block%d", c->vec, c->block);
    snprintf(k->vecs[i], sizeof k->vecs[i], "%d", c->vec);
    snprintf(k->blocks[i], sizeof k->blocks[i], "%d", c->block);
    k->defines[i][0] = (kiln_define){"VEC", k->vecs[i]};
    k->defines[i][1] = (kiln_define){"BLOCK", k->blocks[i]};
    kiln_variant_init(&variants[i]);
    variants[i].name = k->names[i];
    variants[i].source = k->source;
    variants[i].kernel = name;
    variants[i].defines = k->defines[i];
    variants[i].num_defines = 2;
    variants[i].geometry = geometry;
    variants[i].geometry_user = (void*)c;
    variants[i].parameters = k->defines[i];
    variants[i].num_parameters = 2;
  }
  kiln_variant_op_init(&op);
  op.name = k->op_name;
  op.variants = variants;
  op.num_variants = EW_NUM_VARIANTS;
  op.buffers = make_buffers;
  op.release = release;
  op.check = check;
  op.user = k;
  op.tolerance = 1e-4;
  st = kiln_variants_register(ctx, &op, &k->op);
  if (st != KILN_OK) {
    ew_kernel_free(k);
    return st;
  }
  *out = k;
  return KILN_OK;
}

kiln_status ew_build(kiln_context* ctx, const ew_program* p, const char* name, int64_t tune_n, ew_kernel** out) {
  ew_kernel* k;
  kiln_tune_info info;
  const char* chosen = NULL;
  kiln_status st = register_op(ctx, p, name, &k);
  *out = NULL;
  if (st != KILN_OK) return st;
  st = kiln_op_tune(k->op, &tune_n, 1, NULL, 0, &k->sel);
  if (st == KILN_OK) st = kiln_selection_variant(k->sel, &chosen);
  info.size = sizeof info;
  if (st == KILN_OK) st = kiln_selection_info(k->sel, &info);
  if (st == KILN_OK && p->reduction) {
    unsigned zero = 0;
    st = kiln_device_alloc(ctx, sizeof(float) * EW_MAX_BLOCKS, &k->partials);
    if (st == KILN_OK) st = kiln_device_alloc(ctx, sizeof zero, &k->counter);
    if (st == KILN_OK) st = kiln_copy_to_device(ctx, k->counter, &zero, sizeof zero);
  }
  if (st != KILN_OK) {
    ew_kernel_free(k);
    return st;
  }
  snprintf(k->chosen, sizeof k->chosen, "%s", chosen);
  k->from_cache = info.from_cache;
  *out = k;
  return KILN_OK;
}

kiln_status ew_precompile(kiln_context* ctx, const ew_program* p, const char* name, const char* arch, int* compiled) {
  ew_kernel* k;
  int64_t n = 1;
  int failed = 0;
  kiln_status st = register_op(ctx, p, name, &k);
  if (st != KILN_OK) return st;
  st = kiln_op_precompile(k->op, &n, 1, arch, compiled, &failed);
  ew_kernel_free(k);
  return st;
}

kiln_status ew_run(ew_kernel* k, const uint64_t* inputs, uint64_t out, int64_t n, void* stream) {
  void* params[EW_MAX_INPUTS + 4];
  uint64_t in[EW_MAX_INPUTS];
  int count = (int)n, i;
  if (k == NULL || inputs == NULL || n <= 0 || n > 0x7fffffff) return KILN_ERROR_INVALID_ARGUMENT;
  for (i = 0; i < k->prog->num_inputs; ++i) {
    in[i] = inputs[i];
    params[i] = &in[i];
  }
  params[i++] = &out;
  if (k->prog->reduction) {
    params[i++] = &k->partials;
    params[i++] = &k->counter;
  }
  params[i] = &count;
  return kiln_selection_launch(k->sel, &n, 1, params, stream);
}

const char* ew_chosen(const ew_kernel* k) { return k->chosen; }
int ew_from_cache(const ew_kernel* k) { return k->from_cache; }

void ew_kernel_free(ew_kernel* k) {
  if (k == NULL) return;
  kiln_selection_destroy(k->sel);
  kiln_op_destroy(k->op);
  if (k->partials) kiln_device_free(k->ctx, k->partials);
  if (k->counter) kiln_device_free(k->ctx, k->counter);
  free(k->source);
  free(k);
}
