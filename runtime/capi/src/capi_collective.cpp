// The C API's all-reduce over an application's NCCL communicator (kiln/kiln.h, "All-reduce"): create, tune, run,
// and the symmetric heap's tensors (alloc/free), each a thin call into kiln::runtime::AllReduce.
#include <fmt/format.h>

#include "capi_args.h"
#include "kiln/runtime/collective.h"
#include "kiln/runtime/comm.h"

struct kiln_allreduce {
  std::unique_ptr<kiln::runtime::Communicator> comm;
  std::unique_ptr<kiln::runtime::AllReduce> allreduce;
};

using namespace kiln;

extern "C" {

KILN_API kiln_status kiln_allreduce_create(kiln_context* ctx, void* nccl_comm, int rank, int world, kiln_dtype dtype,
                                           size_t max_bytes, kiln_allreduce** out) {
  return capi::entry("kiln_allreduce_create", [&](const capi::Args& arg) -> Status {
    KILN_RETURN_IF_ERROR(arg.out(out));
    KILN_RETURN_IF_ERROR(arg.given(ctx, "ctx"));
    // The arguments first, so a bad dtype is named as such on any machine (not hidden behind a missing NCCL).
    runtime::AllReduceOptions o;
    KILN_ASSIGN_OR_RETURN(o.dtype, capi::dtype_of(dtype, "dtype"));
    if (nccl_comm == nullptr) return arg.bad("nccl_comm is NULL: pass the application's ncclComm_t");
    if (world < 1 || rank < 0 || rank >= world) return arg.bad(fmt::format("rank {} of world {} is not a rank", rank, world));
    if (auto v = runtime::nccl_version(); !v.ok()) {
      return make_error(ErrorCode::kUnimplemented,
                        fmt::format("all-reduce needs NCCL, and it cannot be loaded here: {}", v.status().to_string()));
    }
    if (max_bytes > 0) o.max_bytes = max_bytes;
    o.cache = ctx->cache;
    o.executor = ctx->executor;
    auto h = std::make_unique<kiln_allreduce>();
    KILN_ASSIGN_OR_RETURN(h->comm, runtime::Communicator::wrap(static_cast<ncclComm_t>(nccl_comm), rank, world,
                                                                ctx->options.device));
    KILN_ASSIGN_OR_RETURN(h->allreduce, runtime::AllReduce::create(*h->comm, std::move(o)));
    *out = h.release();
    return Status();
  });
}

KILN_API kiln_status kiln_allreduce_tune(kiln_allreduce* allreduce) {
  return capi::entry("kiln_allreduce_tune", [&](const capi::Args& arg) -> Status {
    KILN_RETURN_IF_ERROR(arg.given(allreduce, "allreduce"));
    return allreduce->allreduce->tune().status();
  });
}

KILN_API kiln_status kiln_allreduce_tune_call(kiln_allreduce* allreduce, kiln_allreduce_call call) {
  return capi::entry("kiln_allreduce_tune_call", [&](const capi::Args& arg) -> Status {
    KILN_RETURN_IF_ERROR(arg.given(allreduce, "allreduce"));
    if (call != KILN_ALLREDUCE_STAGED && call != KILN_ALLREDUCE_SYMMETRIC && call != KILN_ALLREDUCE_SYMMETRIC_IN_PLACE) {
      return arg.bad(fmt::format("call {} is not a kiln_allreduce_call", static_cast<int>(call)));
    }
    return allreduce->allreduce->tune(static_cast<runtime::AllReduceCall>(call)).status();
  });
}

KILN_API kiln_status kiln_allreduce_run(const kiln_allreduce* allreduce, uint64_t in, uint64_t out, int64_t count,
                                        void* stream) {
  return capi::entry("kiln_allreduce_run", [&](const capi::Args& arg) -> Status {
    KILN_RETURN_IF_ERROR(arg.given(allreduce, "allreduce"));
    if (in == 0 || out == 0 || count <= 0) return arg.bad("in, out and a positive count are needed");
    return allreduce->allreduce->run(in, out, count, static_cast<CUstream>(stream));
  });
}

KILN_API kiln_status kiln_allreduce_alloc(kiln_allreduce* allreduce, size_t bytes, uint64_t* ptr) {
  return capi::entry("kiln_allreduce_alloc", [&](const capi::Args& arg) -> Status {
    KILN_RETURN_IF_ERROR(arg.given(ptr, "ptr"));
    *ptr = 0;
    KILN_RETURN_IF_ERROR(arg.given(allreduce, "allreduce"));
    if (bytes == 0) return arg.bad("bytes is 0: a symmetric tensor needs at least one byte");
    KILN_ASSIGN_OR_RETURN(CUdeviceptr p, allreduce->allreduce->allocate(bytes));
    *ptr = static_cast<uint64_t>(p);
    return Status();
  });
}

KILN_API kiln_status kiln_allreduce_free(kiln_allreduce* allreduce, uint64_t ptr) {
  return capi::entry("kiln_allreduce_free", [&](const capi::Args& arg) -> Status {
    KILN_RETURN_IF_ERROR(arg.given(allreduce, "allreduce"));
    if (ptr == 0) return Status();  // as free(NULL)
    return allreduce->allreduce->free(static_cast<CUdeviceptr>(ptr));
  });
}

KILN_API void kiln_allreduce_destroy(kiln_allreduce* allreduce) {
  try {
    delete allreduce;
  } catch (...) {
  }
}

}  // extern "C"
