/* kiln's C API: JIT compilation and autotuning of CUDA kernels for DSLs and other languages.
 *
 * Plain C (C99 and later; C++ includes it as is). Every function returns a kiln_status; on an error the
 * message is kept per thread until that thread's next failing call: kiln_last_error(). No C++ exception
 * crosses this API. Objects are opaque handles, each with its destroy function (NULL is accepted there).
 * Option structs start with a `size` field: fill it with sizeof(the struct) (the *_init functions do), so that
 * a program built against an older, smaller struct keeps working with a newer libkiln.
 *
 * Device pointers are passed as uint64_t (CUdeviceptr) and streams as void* (a CUstream; NULL is the legacy
 * default stream), so this header needs no CUDA header.
 *
 *   kiln_context* ctx;  kiln_context_create(NULL, &ctx);                 (defaults; see kiln_context_options)
 *   kiln_source src;    kiln_source_init(&src);
 *   src.source = "extern \"C\" __global__ void k(float* x) { x[threadIdx.x] *= 2; }";  src.kernel = "k";
 *   kiln_kernel* k;     if (kiln_compile(ctx, &src, &k) != KILN_OK) puts(kiln_last_error());
 *   void* args[] = {&x};  kiln_kernel_launch(k, grid, block, 0, stream, args);
 *
 * The DSL flow (register variants, tune, launch the winner) is in docs/capi.md and examples/dsl/.
 */
#ifndef KILN_KILN_H_
#define KILN_KILN_H_

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__) || defined(__clang__)
#define KILN_API __attribute__((visibility("default")))
#else
#define KILN_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- versions, status, errors */

#define KILN_VERSION_MAJOR 0
#define KILN_VERSION_MINOR 1
#define KILN_VERSION_PATCH 0
/* The C ABI version: libkiln.so.<KILN_ABI_VERSION>. */
#define KILN_ABI_VERSION 0

/* Codes 1..20 are kiln's own error codes (kiln::ErrorCode), in its order. */
typedef enum kiln_status {
  KILN_OK = 0,
  KILN_ERROR_INVALID_ARGUMENT = 1,   /* a malformed argument: NULL where one is needed, a bad size, a bad name */
  KILN_ERROR_NOT_FOUND = 2,          /* a named thing does not exist (a kernel symbol, a cache entry, a file) */
  KILN_ERROR_ALREADY_EXISTS = 3,
  KILN_ERROR_FAILED_PRECONDITION = 4,/* valid call, wrong state (no device for a launch; strict mode miss) */
  KILN_ERROR_OUT_OF_RANGE = 5,
  KILN_ERROR_UNSUPPORTED = 6,        /* not available here (e.g. all-reduce without NCCL) */
  KILN_ERROR_INTERNAL = 7,           /* a bug in kiln */
  KILN_ERROR_UNAVAILABLE = 8,
  KILN_ERROR_CANCELLED = 9,
  KILN_ERROR_TIMEOUT = 10,
  KILN_ERROR_COMPILE = 11,           /* NVRTC rejected the source: kiln_last_error_detail() has the log */
  KILN_ERROR_NO_DRIVER = 12,         /* libcuda.so.1 could not be loaded */
  KILN_ERROR_NO_DEVICE = 13,
  KILN_ERROR_CUDA = 14,
  KILN_ERROR_LIBRARY = 15,           /* cuBLAS, NCCL */
  KILN_ERROR_CORRUPT = 16,
  KILN_ERROR_IO = 17,
  KILN_ERROR_SHUTDOWN = 18,
  KILN_ERROR_WORKER_CRASHED = 19,
  KILN_ERROR_WRONG_RESULT = 20,      /* a kernel ran but its output does not match the reference */
  KILN_ERROR_NOT_READY = 100,        /* kiln_compile_job_poll: still compiling (not an error: no message set) */
  KILN_ERROR_OUT_OF_MEMORY = 101,    /* host memory */
  KILN_ERROR_BUFFER_TOO_SMALL = 102  /* a caller's buffer is too small: the size needed was returned */
} kiln_status;

/* "0.1.0". */
KILN_API const char* kiln_version(void);
/* KILN_VERSION_MAJOR * 10000 + MINOR * 100 + PATCH of the loaded library. */
KILN_API int kiln_version_number(void);
/* "ok", "invalid argument", "compile error", ... */
KILN_API const char* kiln_status_name(kiln_status status);
/* The message of this thread's last failing call ("" when none): "<code name>: <message> (while ...)". Valid
 * until this thread's next kiln call. */
KILN_API const char* kiln_last_error(void);
/* Its long detail, e.g. the compiler's log of a compile error ("" when none). */
KILN_API const char* kiln_last_error_detail(void);
/* For callbacks (variant buffers and checks): sets the message kiln reports for the error status the callback
 * returns. */
KILN_API void kiln_set_callback_error(const char* message);

/* How many CUDA devices this process can use: KILN_ERROR_NO_DRIVER without a driver (*count is then 0). */
KILN_API kiln_status kiln_device_count(int* count);

/* ---- context */

typedef enum kiln_tune_mode {
  KILN_TUNE_MODE_DEFAULT = 0, /* $KILN_TUNE_MODE, else tune */
  KILN_TUNE_MODE_TUNE = 1,    /* use cached decisions, tune what is missing */
  KILN_TUNE_MODE_USE = 2,     /* use cached decisions; a miss uses the reference, never measures */
  KILN_TUNE_MODE_STRICT = 3,  /* use cached decisions; a miss is KILN_ERROR_NOT_FOUND */
  KILN_TUNE_MODE_OFF = 4      /* no cache at all */
} kiln_tune_mode;

typedef enum kiln_executor_kind {
  KILN_EXECUTOR_DEFAULT = 0,  /* $KILN_EXECUTOR, else the process pool (the arena, said on stderr, without its worker) */
  KILN_EXECUTOR_INLINE = 1,   /* compiles on the calling thread */
  KILN_EXECUTOR_ARENA = 2,    /* a TBB arena in this process */
  KILN_EXECUTOR_PROCESS = 3   /* kiln-compile-worker processes */
} kiln_executor_kind;

typedef enum kiln_log_level {
  KILN_LOG_DEBUG = 1,
  KILN_LOG_INFO = 2,
  KILN_LOG_WARN = 3,
  KILN_LOG_ERROR = 4
} kiln_log_level;

/* Called from any kiln thread for each log message at or above the context's level. */
typedef void (*kiln_log_fn)(void* user, kiln_log_level level, const char* message);

typedef struct kiln_context_options {
  size_t size;              /* sizeof(kiln_context_options) */
  const char* cache_dir;    /* NULL: $KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln or ~/.cache/kiln */
  kiln_tune_mode tune_mode;
  kiln_executor_kind executor;
  int compile_workers;      /* compiles at once; 0: the executor's default */
  int device;               /* the CUDA device ordinal tuning and launches use (default 0) */
  kiln_log_fn log;          /* NULL: kiln logs to stderr as usual */
  void* log_user;
  kiln_log_level log_level; /* default KILN_LOG_WARN */
  /* The fleet's remote cache (docs/fleet.md): a Redis behind the local cache. A local miss asks it, and what
   * this context records is published to it; an unreachable remote only costs bounded misses. (A caller whose
   * struct ends before these fields gets their defaults.) */
  const char* remote_cache;      /* redis://[user:password@]host:port/db or unix:///path?db=N; NULL:
                                    $KILN_REMOTE_CACHE (none when unset); "": no remote */
  const char* cache_key_file;    /* the fleet key (mode 600) that signs and verifies; NULL: $KILN_CACHE_KEY_FILE;
                                    "": none (then only decisions and timings travel) */
  int remote_allow_unsigned;     /* 1: without a key, send and accept unsigned binaries (a trusted network
                                    only); 0: $KILN_REMOTE_ALLOW_UNSIGNED, else no */
  int remote_connect_timeout_ms; /* 0: $KILN_REMOTE_CONNECT_TIMEOUT_MS, else 50 */
  int remote_read_timeout_ms;    /* each command's reply; 0: $KILN_REMOTE_READ_TIMEOUT_MS, else 200 */
} kiln_context_options;

/* Defaults into *options (size included). */
KILN_API void kiln_context_options_init(kiln_context_options* options);

/* A context: the cache, the compile executor and (on first use of a GPU) the tuner of one device. Creating one
 * needs no GPU: compiling and precompiling work without one. `options` NULL: defaults. Thread-safe. */
typedef struct kiln_context kiln_context;
KILN_API kiln_status kiln_context_create(const kiln_context_options* options, kiln_context** out);
/* Waits for its compiles; every handle made from it must be destroyed first. */
KILN_API void kiln_context_destroy(kiln_context* ctx);

/* ---- device memory and streams of the context's device (for programs with no allocator of their own: a DSL's
 * tests, examples; a framework passes its own device pointers and streams instead) */

KILN_API kiln_status kiln_device_alloc(kiln_context* ctx, size_t bytes, uint64_t* ptr);
KILN_API kiln_status kiln_device_free(kiln_context* ctx, uint64_t ptr);
KILN_API kiln_status kiln_copy_to_device(kiln_context* ctx, uint64_t dst, const void* src, size_t bytes);
KILN_API kiln_status kiln_copy_to_host(kiln_context* ctx, void* dst, uint64_t src, size_t bytes);
/* Waits for `stream` (NULL: everything on the device). */
KILN_API kiln_status kiln_synchronize(kiln_context* ctx, void* stream);

/* ---- compiling and launching one kernel */

typedef struct kiln_define {
  const char* name;
  const char* value; /* NULL or "": -D<name> */
} kiln_define;

typedef struct kiln_header {
  const char* name;    /* what `#include "name"` finds */
  const char* content;
} kiln_header;

typedef struct kiln_source {
  size_t size;                        /* sizeof(kiln_source) */
  const char* name;                   /* program name in logs; NULL: the kernel's */
  const char* source;                 /* CUDA C++ */
  const char* kernel;                 /* an extern "C" name, or a name expression ("scale<float, 4>") */
  const char* const* name_expressions;/* further instantiations to compile; the kernel's own is added */
  size_t num_name_expressions;
  const kiln_define* defines;
  size_t num_defines;
  const char* const* options;         /* NVRTC options ("--use_fast_math") */
  size_t num_options;
  const char* const* include_dirs;
  size_t num_include_dirs;
  const kiln_header* headers;
  size_t num_headers;
  const char* arch;                   /* "sm_90", "sm_90a"; NULL: the context's device's */
} kiln_source;

KILN_API void kiln_source_init(kiln_source* source);

typedef struct kiln_kernel kiln_kernel;
typedef struct kiln_compile_job kiln_compile_job;

/* Compiles through the context's cache and executor (a cached binary is returned without compiling) and
 * blocks until done. */
KILN_API kiln_status kiln_compile(kiln_context* ctx, const kiln_source* source, kiln_kernel** out);
/* Starts a compile and returns at once. */
KILN_API kiln_status kiln_compile_async(kiln_context* ctx, const kiln_source* source, kiln_compile_job** out);
/* KILN_OK when the compile is done (kiln_compile_job_wait then returns at once), KILN_ERROR_NOT_READY if not. */
KILN_API kiln_status kiln_compile_job_poll(const kiln_compile_job* compile);
/* Waits for the compile; its result, and on success the kernel (a new handle each call). */
KILN_API kiln_status kiln_compile_job_wait(kiln_compile_job* compile, kiln_kernel** out);
/* Cancels the compile if it is still running. */
KILN_API void kiln_compile_job_destroy(kiln_compile_job* compile);

typedef struct kiln_dim3 {
  unsigned x, y, z;
} kiln_dim3;

/* Launches on `stream` with `args` as cuLaunchKernel takes them (an array of pointers to each argument). The
 * kernel is loaded into the context's device on first launch. */
KILN_API kiln_status kiln_kernel_launch(kiln_kernel* kernel, kiln_dim3 grid, kiln_dim3 block, unsigned shared_bytes,
                                        void* stream, void** args);
/* The compiled image (cubin) and its 32-hex-character cache key (33 bytes with the NUL). Valid while the
 * kernel lives. */
KILN_API kiln_status kiln_kernel_cubin(const kiln_kernel* kernel, const void** data, size_t* size);
KILN_API kiln_status kiln_kernel_key(const kiln_kernel* kernel, char key[33]);
KILN_API void kiln_kernel_destroy(kiln_kernel* kernel);

/* ---- variants: N sources of one operation, tuned on a problem key */

typedef struct kiln_launch_dims {
  kiln_dim3 grid;
  kiln_dim3 block;
  unsigned shared_bytes;
} kiln_launch_dims;

/* The launch geometry of a variant for a problem's sizes. */
typedef kiln_status (*kiln_geometry_fn)(void* user, const int64_t* sizes, size_t num_sizes, kiln_launch_dims* out);

typedef struct kiln_variant {
  size_t size;                   /* sizeof(kiln_variant) */
  const char* name;              /* unique within the op; what the cache stores the decision under */
  const char* source;
  const char* kernel;            /* extern "C" name or name expression */
  const kiln_define* defines;
  size_t num_defines;
  const char* const* options;
  size_t num_options;
  const char* const* include_dirs;
  size_t num_include_dirs;
  const kiln_header* headers;
  size_t num_headers;
  kiln_launch_dims dims;         /* the geometry when `geometry` is NULL */
  kiln_geometry_fn geometry;     /* NULL: `dims` for every problem */
  void* geometry_user;
  const kiln_define* parameters; /* what the variant is, for reports ("vec" = "4") */
  size_t num_parameters;
} kiln_variant;

KILN_API void kiln_variant_init(kiln_variant* variant);

typedef enum kiln_dtype {
  KILN_F16 = 0,
  KILN_BF16 = 1,
  KILN_F32 = 2
} kiln_dtype;

/* A region a variant writes: poisoned before its checked run and compared with the reference variant's. A region
 * the variants also read (an in-place update, y = a * x + y) is named in kiln_variant_op.inouts instead: it is
 * restored before each checked run, never poisoned. */
typedef struct kiln_output {
  uint64_t ptr;     /* device pointer */
  kiln_dtype dtype;
  int64_t rows, cols, ld; /* row-major; ld in elements (0: cols) */
  const char* name;
} kiln_output;

/* The buffers a tune runs the variants on, made by the op's buffers callback. */
typedef struct kiln_tune_buffers {
  void** params;              /* the kernel parameters, as a launch takes them; valid until released */
  size_t num_params;
  const kiln_output* outputs; /* may be empty when the op's check callback does the checking */
  size_t num_outputs;
  void* owner;                /* handed back to the release callback */
} kiln_tune_buffers;

/* Makes the buffers for `sizes` with inputs from `seed` (the device's context is current). */
typedef kiln_status (*kiln_buffers_fn)(void* user, const int64_t* sizes, size_t num_sizes, uint32_t seed,
                                       kiln_tune_buffers* out);
typedef void (*kiln_release_fn)(void* user, void* owner);
/* Checks a variant's output after its checked run (the stream is synchronised); an error status fails the
 * variant (message: kiln_set_callback_error). */
typedef kiln_status (*kiln_check_fn)(void* user, const int64_t* sizes, size_t num_sizes, void** params, void* stream);

typedef struct kiln_variant_op {
  size_t size;                   /* sizeof(kiln_variant_op) */
  const char* name;              /* the op, part of every cache key ("mydsl.axpy") */
  const kiln_variant* variants;
  size_t num_variants;
  const char* reference;         /* checked against; NULL: the first variant */
  kiln_buffers_fn buffers;       /* required */
  kiln_release_fn release;       /* optional */
  kiln_check_fn check;           /* optional */
  void* user;                    /* passed to buffers, release and check; must outlive the op */
  double tolerance;              /* relative-norm error allowed against the reference; default 1e-2 */
  /* The outputs (by kiln_output.name; an unnamed output i is "output<i>") the variants read as well as write,
   * e.g. an accumulator. Before each variant's checked run such a region gets back what the buffers callback
   * put there, instead of poison that every variant would read and fail on; it is still compared with the
   * reference's. A name no output has fails the tune, naming it. Default none. (A caller whose struct ends
   * before these fields has none.) */
  const char* const* inouts;
  size_t num_inouts;
} kiln_variant_op;

KILN_API void kiln_variant_op_init(kiln_variant_op* op);

typedef struct kiln_op kiln_op;
typedef struct kiln_selection kiln_selection;
typedef struct kiln_dispatcher kiln_dispatcher;

/* Registers the variants (copied; callbacks and `user` are kept, and called while an op of that name is
 * registered) for tunes through the context. Op names are process-wide: registering a name again replaces the
 * earlier registration (and its callbacks). A changed variant gives new cache keys, so it is tuned again
 * rather than a stale decision reused. */
KILN_API kiln_status kiln_variants_register(kiln_context* ctx, const kiln_variant_op* op, kiln_op** out);
KILN_API void kiln_op_destroy(kiln_op* op);

/* Tunes the op on the problem `sizes` (+ `attributes`, anything else that changes the winner; both part of the
 * key), or loads the cached decision: a second process with the same cache gets it without tuning. Needs the
 * context's device. */
KILN_API kiln_status kiln_op_tune(kiln_op* op, const int64_t* sizes, size_t num_sizes, const kiln_define* attributes,
                                  size_t num_attributes, kiln_selection** out);

typedef struct kiln_tune_info {
  size_t size;          /* sizeof(kiln_tune_info) */
  int from_cache;       /* 1: a cached decision, nothing measured */
  int candidates;
  int failures;
  double median_us;     /* the chosen variant's (0 when from the cache or not measured) */
  double total_seconds;
} kiln_tune_info;

/* The chosen variant's name, valid while the selection lives. */
KILN_API kiln_status kiln_selection_variant(const kiln_selection* selection, const char** name);
KILN_API kiln_status kiln_selection_info(const kiln_selection* selection, kiln_tune_info* info);
/* The tune's report as JSON into buf (capacity cap, NUL included); *needed: the bytes it takes. */
KILN_API kiln_status kiln_selection_report(const kiln_selection* selection, char* buf, size_t cap, size_t* needed);
/* Launches the chosen variant with `params` for `sizes` on `stream`. Capture-safe. */
KILN_API kiln_status kiln_selection_launch(const kiln_selection* selection, const int64_t* sizes, size_t num_sizes,
                                           void** params, void* stream);
KILN_API void kiln_selection_destroy(kiln_selection* selection);

/* Size dispatch: tunes the op for each bucket bound of sizes[0] (`buckets` ascending; the rest of `sizes` and
 * the attributes fixed) and returns a dispatcher that picks the bucket's variant per call in O(1). */
KILN_API kiln_status kiln_op_dispatcher(kiln_op* op, const int64_t* sizes, size_t num_sizes,
                                        const kiln_define* attributes, size_t num_attributes, const int64_t* buckets,
                                        size_t num_buckets, kiln_dispatcher** out);
/* Launches the variant of the bucket of sizes[0]. Capture-safe. */
KILN_API kiln_status kiln_dispatcher_launch(const kiln_dispatcher* dispatcher, const int64_t* sizes, size_t num_sizes,
                                            void** params, void* stream);
/* The variant the bucket of `size` runs; valid while the dispatcher lives. */
KILN_API kiln_status kiln_dispatcher_variant(const kiln_dispatcher* dispatcher, int64_t size, const char** name);
KILN_API void kiln_dispatcher_destroy(kiln_dispatcher* dispatcher);

/* Compiles every variant of the op for `arch` ("sm_90"; NULL: the device's) into the cache without a GPU (a
 * build machine warming a fleet's cache). *compiled / *failed: kernels built or found cached / failed. */
KILN_API kiln_status kiln_op_precompile(kiln_op* op, const int64_t* sizes, size_t num_sizes, const char* arch,
                                        int* compiled, int* failed);

/* ---- workloads: precompile and warm up */

typedef struct kiln_workload_report {
  size_t size;        /* sizeof(kiln_workload_report) */
  int problems;
  int kernels;        /* precompile: kernels compiled or found cached */
  int cached;         /* of those, found cached */
  int failed;
  int decisions;      /* warm-up: problems whose decision was loaded (or tuned) */
  double seconds;
} kiln_workload_report;

/* Compiles every choice of every problem of a workload file's JSON text (docs/runtime.md) for `arch`
 * ("sm_90"; NULL: the device's) into the cache, with no GPU needed. */
KILN_API kiln_status kiln_precompile_workload(kiln_context* ctx, const char* workload_json, const char* arch,
                                              kiln_workload_report* report);
/* Loads (in tune mode: tunes what is missing) the decision of every problem of the workload and prepares its
 * kernels, so that the first op calls compile and tune nothing. Needs a GPU. */
KILN_API kiln_status kiln_warmup_workload(kiln_context* ctx, const char* workload_json, kiln_workload_report* report);

/* ---- built-in ops on raw device pointers (tuned per problem through the context, then cached) */

typedef enum kiln_layout {
  KILN_ROW_MAJOR = 0,
  KILN_COL_MAJOR = 1
} kiln_layout;

/* d[m, n] = epilogue(a[m, k] . b[k, n]). */
typedef struct kiln_gemm_args {
  size_t size;             /* sizeof(kiln_gemm_args) */
  int64_t m, n, k;
  kiln_dtype a_dtype, b_dtype, d_dtype;   /* default bf16 */
  kiln_layout a_layout, b_layout;         /* default row-major */
  const char* epilogue;    /* "" / NULL (none), "bias", "gelu", "bias+gelu", "bias+silu", "scale+bias+relu",
                              "bias+silu+residual", ... (ops in order) */
  uint64_t a, b, d;
  uint64_t bias;           /* [n], bf16, with a "bias" epilogue */
  uint64_t residual;       /* [m, ld_residual], bf16, with a "residual" epilogue */
  int64_t ld_residual;     /* 0: n */
  float alpha, beta;       /* "scale" multiplies by alpha; "residual" adds beta * residual (default 1, 1) */
  /* Added after the first version; a struct that ends before it (size up to offsetof b_constant) reads as 0.
   * 1: the caller promises that b (a weight) is not written by the kernel before this one on `stream`; the tune
   * then also tries decode kernels that load b's first stages before waiting for that kernel. A problem with the
   * promise is tuned and cached apart from the same problem without it. */
  int b_constant;
} kiln_gemm_args;

KILN_API void kiln_gemm_args_init(kiln_gemm_args* args);
KILN_API kiln_status kiln_gemm(kiln_context* ctx, const kiln_gemm_args* args, void* stream);

/* y = x / sqrt(mean(x^2) + eps) * weight per row; with `residual`: h = x + residual is normalised and written to
 * residual_out. */
typedef struct kiln_rmsnorm_args {
  size_t size;             /* sizeof(kiln_rmsnorm_args) */
  int64_t rows, cols;
  kiln_dtype dtype;        /* default bf16 */
  float eps;               /* default 1e-6 */
  uint64_t x, weight, y;
  uint64_t residual, residual_out; /* both 0, or both set */
} kiln_rmsnorm_args;

KILN_API void kiln_rmsnorm_args_init(kiln_rmsnorm_args* args);
KILN_API kiln_status kiln_rmsnorm(kiln_context* ctx, const kiln_rmsnorm_args* args, void* stream);

/* y = softmax(scale * x) per row. */
typedef struct kiln_softmax_args {
  size_t size;             /* sizeof(kiln_softmax_args) */
  int64_t rows, cols;
  kiln_dtype dtype;        /* default bf16 */
  float scale;             /* default 1 */
  uint64_t x, y;
} kiln_softmax_args;

KILN_API void kiln_softmax_args_init(kiln_softmax_args* args);
KILN_API kiln_status kiln_softmax(kiln_context* ctx, const kiln_softmax_args* args, void* stream);

/* All-reduce (sum) over an application's NCCL communicator: wraps its ncclComm_t (never destroyed by kiln),
 * tunes per message size and runs the winner. KILN_ERROR_UNSUPPORTED (NCCL not loadable) or KILN_ERROR_NO_DEVICE
 * where there is no communicator to be had. Every rank makes the same calls. */
typedef struct kiln_allreduce kiln_allreduce;
KILN_API kiln_status kiln_allreduce_create(kiln_context* ctx, void* nccl_comm, int rank, int world, kiln_dtype dtype,
                                           size_t max_bytes, kiln_allreduce** out);
/* Tunes every power-of-two message size up to max_bytes (collective). */
KILN_API kiln_status kiln_allreduce_tune(kiln_allreduce* allreduce);
/* Runs the tuned winner for `count` elements from `in` to `out` (in == out: in place). An input allocated with
 * kiln_allreduce_alloc (on every rank alike) is read where it is, with no copy; any other is copied into kiln's
 * staging buffer first. Each kind of call dispatches from its own tuned table. Capture-safe. */
KILN_API kiln_status kiln_allreduce_run(const kiln_allreduce* allreduce, uint64_t in, uint64_t out, int64_t count,
                                        void* stream);
KILN_API void kiln_allreduce_destroy(kiln_allreduce* allreduce);

/* Symmetric tensors: memory of the all-reduce's peer-mapped heap (256 MiB per rank), at the same offset on every
 * rank, which kiln_allreduce_run reduces without a copy.
 * kiln_allreduce_alloc is collective: every rank calls it with the same `bytes` in the same order. A rank that
 * asked another size, or whose heap diverged (the ranks did not free the same tensors), gets
 * KILN_ERROR_INVALID_ARGUMENT naming both, on every rank; a full heap KILN_ERROR_OUT_OF_RANGE. *ptr is 0 on error.
 * kiln_allreduce_free is local: the range is reused only after the runs that used it have completed; every rank
 * must have freed the same tensors by its next kiln_allreduce_alloc. Freeing 0 does nothing; a pointer that is
 * not a live allocation (freed twice, not from kiln_allreduce_alloc) is KILN_ERROR_INVALID_ARGUMENT. */
KILN_API kiln_status kiln_allreduce_alloc(kiln_allreduce* allreduce, size_t bytes, uint64_t* ptr);
KILN_API kiln_status kiln_allreduce_free(kiln_allreduce* allreduce, uint64_t ptr);

/* The kinds of call, each tuned on its own: an input copied into the staging buffer, a symmetric input reduced
 * out of place, and in place. kiln_allreduce_tune tunes the staged calls; this tunes the kind `call`. */
typedef enum kiln_allreduce_call {
  KILN_ALLREDUCE_STAGED = 0,
  KILN_ALLREDUCE_SYMMETRIC = 1,
  KILN_ALLREDUCE_SYMMETRIC_IN_PLACE = 2
} kiln_allreduce_call;
KILN_API kiln_status kiln_allreduce_tune_call(kiln_allreduce* allreduce, kiln_allreduce_call call);

/* ---- the cache */

typedef struct kiln_cache_stats {
  size_t size;             /* sizeof(kiln_cache_stats) */
  uint64_t binaries;
  uint64_t binary_bytes;
  uint64_t timings;
  uint64_t failures;
  uint64_t decisions;
  uint64_t stale;
  uint64_t disk_bytes;
} kiln_cache_stats;

/* KILN_ERROR_FAILED_PRECONDITION in tune mode off (no cache). */
KILN_API kiln_status kiln_cache_stats_get(kiln_context* ctx, kiln_cache_stats* stats);
/* Writes the cache's decisions and timings (and binaries when `binaries` is 1) to a bundle file at `path`,
 * unsigned. */
KILN_API kiln_status kiln_cache_export(kiln_context* ctx, const char* path, int binaries);
/* The same, signed (HMAC-SHA256) with the key in `sign_key_file` (32 bytes to 4 KiB, mode 600), so that an
 * importer holding that key stores its binaries. */
KILN_API kiln_status kiln_cache_export_signed(kiln_context* ctx, const char* path, int binaries, const char* sign_key_file);

/* Which bundles' binaries an import stores. Decisions and timings are always imported; binaries (code that
 * will run) only from a bundle signed with one of the trusted keys, or from an unsigned bundle when
 * trust_unsigned is 1. A bundle whose signature does not verify never has its binaries stored. */
typedef struct kiln_import_trust {
  size_t size;                        /* sizeof(kiln_import_trust), set by kiln_import_trust_init */
  const char* const* trusted_key_files;
  size_t trusted_key_count;
  int trust_unsigned;                 /* default 0 */
} kiln_import_trust;
KILN_API void kiln_import_trust_init(kiln_import_trust* trust);

/* Imports a bundle, trusting no binaries (decisions and timings only); *imported: entries stored, *rejected:
 * entries that failed verification (either may be NULL). */
KILN_API kiln_status kiln_cache_import(kiln_context* ctx, const char* path, size_t* imported, size_t* rejected);
/* The same with `trust` (NULL: as kiln_cache_import); *binaries_trusted (may be NULL): 1 when the bundle's
 * binaries were trusted and stored. */
KILN_API kiln_status kiln_cache_import_trusted(kiln_context* ctx, const char* path, const kiln_import_trust* trust,
                                               size_t* imported, size_t* rejected, int* binaries_trusted);

/* ---- the fleet's remote cache (docs/fleet.md) */

/* What kiln_cache_push / kiln_cache_pull move, and through which remote. */
typedef struct kiln_sync_options {
  size_t size;              /* sizeof(kiln_sync_options), set by kiln_sync_options_init */
  const char* remote_cache; /* NULL or "": the context's remote (kiln_context_options.remote_cache) */
  const char* key_file;     /* with remote_cache: the fleet key; NULL: $KILN_CACHE_KEY_FILE; "": none */
  int allow_unsigned;       /* with remote_cache: as kiln_context_options.remote_allow_unsigned */
  int decisions_only;       /* 1: decisions only (no timings, no binaries); default 0 */
  const char* arch;         /* "sm_90a": only binaries for it, and problems of devices of its compute capability;
                               NULL or "": every arch */
} kiln_sync_options;
KILN_API void kiln_sync_options_init(kiln_sync_options* options);

/* What a push or pull moved, and what it did not. */
typedef struct kiln_sync_report {
  size_t size;              /* sizeof(kiln_sync_report) */
  uint64_t decisions;       /* entries sent (push) or verified and stored (pull) */
  uint64_t timings;
  uint64_t binaries;
  uint64_t refused;         /* pull: values that failed their checks (unsigned, another key, damaged): never stored */
  uint64_t withheld;        /* push: binaries not sent because no fleet key is configured */
  uint64_t failed;          /* entries not written (a full remote, a local write error) */
} kiln_sync_report;

/* Publishes the context's cache (decisions, timings, binaries; `options` NULL: all of it) to the remote, in
 * pipelined batches outside the circuit breaker: an explicit call fails loudly rather than skipping.
 * KILN_OK when the remote was reached; then check report->withheld and report->failed (report may be NULL).
 * Errors: KILN_ERROR_FAILED_PRECONDITION (no remote named; tune mode off), KILN_ERROR_UNAVAILABLE /
 * KILN_ERROR_TIMEOUT (the remote cannot be reached: what was sent before stays). */
KILN_API kiln_status kiln_cache_push(kiln_context* ctx, const kiln_sync_options* options, kiln_sync_report* report);
/* Reads what the remote holds (selected by `options`), verifies each value and stores those that pass in the
 * context's cache. KILN_OK when the remote was reached; then report->refused counts values that failed their
 * checks (none of them stored) and report->failed entries not stored. Errors as kiln_cache_push. */
KILN_API kiln_status kiln_cache_pull(kiln_context* ctx, const kiln_sync_options* options, kiln_sync_report* report);

typedef enum kiln_breaker_state {
  KILN_BREAKER_CLOSED = 0,    /* the remote is asked on a local miss */
  KILN_BREAKER_OPEN = 1,      /* after repeated failures: local only until the cool-down ends (30 s) */
  KILN_BREAKER_HALF_OPEN = 2  /* the cool-down ended: the next call tries the remote */
} kiln_breaker_state;

/* This process's use of the context's remote (counters since the context was created). */
typedef struct kiln_remote_stats {
  size_t size;              /* sizeof(kiln_remote_stats) */
  int configured;           /* 0: the context has no remote (everything below is 0) */
  int signing;              /* 1: a fleet key is configured */
  uint64_t hits;            /* local misses the remote answered with a value that passed every check */
  uint64_t misses;          /* lookups the remote had nothing for */
  uint64_t refused;         /* values read and refused (never loaded): the sum of the three below */
  uint64_t refused_unsigned;
  uint64_t refused_signature;
  uint64_t refused_malformed;
  uint64_t errors;          /* lookups that failed: unreachable, timed out */
  uint64_t skipped;         /* lookups not tried because the breaker was open */
  uint64_t queued;          /* entries put on the write-behind queue */
  uint64_t published;       /* entries the remote stored */
  uint64_t queue_drops;     /* entries dropped because the queue was full (a publisher never waits) */
  uint64_t write_errors;    /* entries the remote did not store */
  uint64_t withheld;        /* binaries not published: no fleet key */
  uint64_t breaker_opened;  /* times the breaker opened */
  kiln_breaker_state breaker;
  char remote[256];         /* the remote's URL, password shown as ***; "" without one (NUL-terminated, cut to fit) */
  char last_error[512];     /* the last failure's message ("" when none; never a password or key; cut to fit) */
} kiln_remote_stats;

/* The context's remote counters (never contacts the remote: cheap, and honest while it is down). KILN_OK with
 * stats->configured 0 when the context has no remote. */
KILN_API kiln_status kiln_cache_remote_stats(kiln_context* ctx, kiln_remote_stats* stats);

#ifdef __cplusplus
}
#endif

#endif /* KILN_KILN_H_ */
