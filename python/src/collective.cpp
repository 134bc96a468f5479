// kiln.distributed's C++ side: kiln's tuned all-reduce (kiln/runtime/collective.h) on torch tensors.
//
// _C.AllReduce owns one rank's Communicator (made from rank 0's NCCL unique id, which kiln/distributed.py
// sends over the torch.distributed group) and AllReduce; kiln.distributed.AllReduce subclasses it, so its
// methods are these, with no Python frame per call. The torch custom ops (torch.ops.kiln.all_reduce, ...) take
// an int handle instead of the object, so that their schemas stay tensors and ints: a process-wide registry
// maps handles to the live objects.
//
// Every call runs on the caller's current torch stream, allocates nothing of kiln's and synchronises nothing,
// so it can be captured in a CUDA graph. Every rank must make the same calls with the same shapes (as with any
// collective); the choice a call runs is a function of the shared dispatch table and the call's shape only,
// never of anything that may differ between ranks, except the alignment of the caller's pointers, which is
// the same on every rank of an SPMD program (torch's allocator returns 512-byte aligned blocks).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <atomic>
#include <mutex>
#include <unordered_map>

#include "errors.h"
#include "kiln/jit/device.h"
#include "kiln/runtime/collective.h"
#include "dlpack.h"
#include "tensor.h"
#include "text.h"
#include "tuner.h"

namespace nb = nanobind;

// The kinds of all-reduce call (collective.h, with the symmetric heap); declared opaquely here as well so that
// this file also builds against a kiln whose AllReduce has one kind only (the requires-expressions below).
namespace kiln::runtime {
enum class AllReduceCall : int;
}

namespace kiln::py {
namespace {

using runtime::AllReduce;
using templates::DType;

[[noreturn]] void bad(const std::string& message) { raise(make_error(ErrorCode::kInvalidArgument, message)); }

// The widest vector access of kiln's all-reduce templates is 8 elements: a message of a multiple of 8 elements
// at pointers aligned to 8 elements can run any choice; anything else runs NCCL (which takes anything), on
// every rank alike (the count is the same everywhere, and so is the alignment in an SPMD program).
constexpr int64_t kVecElems = 8;

// The symmetric heap (AllReduce::allocate / free / is_symmetric, AllReduceOptions::heap_bytes) is used where the
// kiln this is built against has it; against one without, .empty() raises kiln.UnimplementedError.
template <class A = AllReduce>
Result<CUdeviceptr> heap_allocate(A& ar, size_t bytes) {
  if constexpr (requires { ar.allocate(bytes); }) {
    return ar.allocate(bytes);
  } else {
    return make_error(ErrorCode::kUnimplemented, "this kiln's AllReduce has no symmetric heap (AllReduce::allocate)");
  }
}
template <class A = AllReduce>
Status heap_free(A& ar, CUdeviceptr p) {
  if constexpr (requires { ar.free(p); }) {
    return ar.free(p);
  } else {
    return make_error(ErrorCode::kUnimplemented, "this kiln's AllReduce has no symmetric heap");
  }
}
template <class A = AllReduce>
bool heap_has(const A& ar, CUdeviceptr p, size_t bytes) {
  if constexpr (requires { ar.is_symmetric(p, bytes); }) {
    return ar.is_symmetric(p, bytes);
  } else {
    return false;
  }
}
// The kinds of call (staged, symmetric, symmetric in place: AllReduceCall 0, 1, 2) each have their own table
// where the kiln has them; `call` < 0 is the options' kind (the only one of a kiln without them).
constexpr int kCallKinds = 3;
template <class A = AllReduce>
Result<std::vector<runtime::CollectiveReport>> tune_kind(A& ar, int call, std::vector<size_t> sizes) {
  if (call < 0) return ar.tune(std::move(sizes));
  if constexpr (requires { ar.tune(runtime::AllReduceCall{}, sizes); }) {
    if (call >= kCallKinds) {
      return make_error(ErrorCode::kInvalidArgument, strf("call kind {} is not one", call));
    }
    return ar.tune(static_cast<runtime::AllReduceCall>(call), std::move(sizes));
  } else {
    return make_error(ErrorCode::kUnimplemented, "this kiln's AllReduce has one kind of call (no AllReduceCall)");
  }
}
template <class A = AllReduce>
std::string choice_of_kind(const A& ar, int64_t count, int call) {
  if constexpr (requires { ar.choice_for(count, runtime::AllReduceCall{}); }) {
    if (call >= 0 && call < kCallKinds) return ar.choice_for(count, static_cast<runtime::AllReduceCall>(call));
  }
  return ar.choice_for(count);
}
template <class A = AllReduce>
int call_kinds() {
  if constexpr (requires(A& a) { a.tune(runtime::AllReduceCall{}, std::vector<size_t>{}); }) {
    return kCallKinds;
  } else {
    return 0;
  }
}

template <class O = runtime::AllReduceOptions>
bool set_heap_bytes(O& o, size_t bytes) {
  if constexpr (requires { o.heap_bytes = bytes; }) {
    o.heap_bytes = bytes;
    return true;
  } else {
    return false;
  }
}

/// One rank's all-reduce: what a _C.AllReduce and every tensor from its heap share. The last of them to go
/// destroys it, which is collective (the peer buffers are unmapped on every rank): close() does it at a point
/// every rank reaches.
struct Collective {
  int64_t handle = 0;
  int rank = 0, world = 0, device = 0;
  DType dtype = DType::kBF16;
  char dtype_code = 'b';  // TensorView::dtype_code of `dtype`
  int elem_bytes = 2;
  size_t max_bytes = 0, heap_bytes = 0;
  std::unique_ptr<runtime::Communicator> comm;
  std::unique_ptr<AllReduce> ar;
  std::atomic<int64_t> live{0};  // heap tensors not yet freed
  std::atomic<bool> closed{false};
  // The fused step's table (tune_fused): the hidden size it was tuned for and its largest token count.
  int64_t fused_cols = 0, fused_max_rows = 0;
  std::mutex mu;  // close() against heap frees from other threads

  // Releases the AllReduce and the communicator (collective). Idempotent.
  void release() {
    std::lock_guard lock(mu);
    closed = true;
    ar.reset();
    comm.reset();
  }
  ~Collective() {
    // Dropped without close(): still collective, at whatever point the last reference went (every rank drops
    // its object at the same point of an SPMD program). Never at interpreter exit: see _leak_collectives.
    release();
  }
};

// What runs the calls: absent only in a test instance (_for_tests), whose argument checks run all the same.
AllReduce& ar_of(Collective& c) {
  if (!c.ar) raise(make_error(ErrorCode::kFailedPrecondition, "this kiln AllReduce has no communicator (a test instance)"));
  return *c.ar;
}

std::mutex registry_mu;
std::unordered_map<int64_t, std::weak_ptr<Collective>> registry;
int64_t next_handle = 1;

std::shared_ptr<Collective> lookup(int64_t handle) {
  std::lock_guard lock(registry_mu);
  auto it = registry.find(handle);
  std::shared_ptr<Collective> c = it == registry.end() ? nullptr : it->second.lock();
  if (!c || c->closed) {
    raise(make_error(ErrorCode::kNotFound,
                     strf("no open kiln AllReduce with handle {} (closed, garbage-collected or never made)", handle)));
  }
  return c;
}

struct PyAllReduce {
  std::shared_ptr<Collective> c;

  Collective& open() const {
    if (!c || c->closed) raise(make_error(ErrorCode::kFailedPrecondition, "this kiln AllReduce is closed"));
    return *c;
  }
};

DType parse_dtype_name(const std::string& name) {
  if (name == "bfloat16" || name == "bf16") return DType::kBF16;
  if (name == "float16" || name == "f16" || name == "half") return DType::kF16;
  if (name == "float32" || name == "f32" || name == "float") return DType::kF32;
  bad(strf("dtype {}: kiln's all-reduce takes bfloat16, float16 or float32", name));
}

char code_of(DType t) { return t == DType::kF16 ? 'h' : t == DType::kBF16 ? 'b' : 'f'; }
const char* torch_name(DType t) { return t == DType::kF16 ? "float16" : t == DType::kBF16 ? "bfloat16" : "float32"; }

int64_t numel(const TensorView& v) {
  int64_t n = 1;
  for (int i = 0; i < v.ndim; ++i) n *= v.shape[i];
  return n;
}

std::string shape_text(const TensorView& v) {
  std::string s = "(";
  for (int i = 0; i < v.ndim; ++i) s += strf("{}{}", i ? ", " : "", v.shape[i]);
  return s + (v.ndim == 1 ? ",)" : ")");
}

// A tensor the all-reduce reads or writes: this AllReduce's dtype and contiguous. Where it lives is checked
// by on_device() once the shapes agree, so that every check but that one can be tested without a GPU.
TensorView operand(const Collective& c, nb::handle obj, const char* what) {
  TensorView v = tensor_view(obj, what);
  if (v.dtype_code != c.dtype_code) {
    bad(strf("{}: dtype {}; this AllReduce reduces {} (make one per dtype)", what, v.dtype_name, torch_name(c.dtype)));
  }
  if (!v.contiguous()) bad(strf("{}: not contiguous (shape {}); call .contiguous()", what, shape_text(v)));
  return v;
}

// A CUDA tensor on this rank's device.
void on_device(const Collective& c, const TensorView& v, const char* what) {
  if (v.device != DeviceKind::kCuda) bad(strf("{}: on the CPU; kiln's all-reduce runs on CUDA tensors", what));
  if (v.device_index >= 0 && v.device_index != c.device) {
    bad(strf("{}: on cuda:{}, but this rank's communicator is on cuda:{}", what, v.device_index, c.device));
  }
}

void ensure_thread_context(int device) {
  // torch's threads have the device's primary context current (the communicator's too); a fresh thread gets it.
  thread_local int ready_for = -1;
  if (ready_for == device) return;
  auto ctx = ensure_context(device);
  if (!ctx.ok()) raise(ctx.status());
  ready_for = device;
}

bool aligned(uintptr_t p, const Collective& c) { return p % (kVecElems * c.elem_bytes) == 0; }

bool overlap(uintptr_t a, uintptr_t b, size_t bytes) { return a < b + bytes && b < a + bytes; }

// out = sum over ranks of in (in == out: in place), on torch's current stream.
void run_all_reduce(Collective& c, const TensorView& in, const TensorView& out) {
  const int64_t count = numel(in);
  if (count == 0) return;
  const size_t bytes = static_cast<size_t>(count) * c.elem_bytes;
  if (in.ptr != out.ptr && overlap(in.ptr, out.ptr, bytes)) bad("out overlaps the input without being it");
  AllReduce& ar = ar_of(c);
  const uintptr_t stream = resolve_stream(nb::handle(), in);
  ensure_thread_context(c.device);
  const bool any_choice = count % kVecElems == 0 && aligned(in.ptr, c) && aligned(out.ptr, c);
  Status s;
  {
    nb::gil_scoped_release release;
    s = any_choice ? ar.run(in.ptr, out.ptr, count, reinterpret_cast<CUstream>(stream))
                   : ar.run_choice("nccl", in.ptr, out.ptr, count, reinterpret_cast<CUstream>(stream));
  }
  check(s);
}

nb::object all_reduce(PyAllReduce& self, nb::handle t, nb::handle out) {
  Collective& c = self.open();
  TensorView vin = operand(c, t, "tensor");
  if (out.is_none()) {
    on_device(c, vin, "tensor");
    run_all_reduce(c, vin, vin);
    return nb::borrow(t);
  }
  TensorView vout = operand(c, out, "out");
  if (numel(vout) != numel(vin)) {
    bad(strf("out: shape {} ({} elements), but the tensor has {} elements {}", shape_text(vout), numel(vout),
             numel(vin), shape_text(vin)));
  }
  on_device(c, vin, "tensor");
  on_device(c, vout, "out");
  run_all_reduce(c, vin, vout);
  return nb::borrow(out);
}

// The Python composition kiln.distributed runs when the fused step's table does not cover a call (another
// hidden size, more tokens than tuned, misaligned rows): kiln's all-reduce, then torch's add and RMSNorm.
nb::object* unfused_step = nullptr;  // set once by kiln.distributed; kept for the process

struct Rows {
  int64_t rows = 1, cols = 0;
};
Rows rows_of(const TensorView& v, const char* what) {
  if (v.ndim < 1) bad(strf("{}: a scalar; the fused step normalises rows", what));
  Rows r;
  r.cols = v.shape[v.ndim - 1];
  for (int i = 0; i + 1 < v.ndim; ++i) r.rows *= v.shape[i];
  return r;
}

// y = rmsnorm(h) * weight, h = all-reduce(x) + residual -> residual_out. Returns (y, residual_out).
nb::tuple fused_add_rmsnorm(PyAllReduce& self, nb::handle x, nb::handle residual, nb::handle weight, double eps,
                            nb::handle out, nb::handle residual_out) {
  Collective& c = self.open();
  TensorView vx = operand(c, x, "x");
  TensorView vr = operand(c, residual, "residual");
  TensorView vw = operand(c, weight, "weight");
  const Rows r = rows_of(vx, "x");
  if (vr.ndim != vx.ndim || numel(vr) != numel(vx) || rows_of(vr, "residual").cols != r.cols) {
    bad(strf("residual: shape {}, but x is {}", shape_text(vr), shape_text(vx)));
  }
  if (vw.ndim != 1 || vw.shape[0] != r.cols) bad(strf("weight: shape {}; expected ({},)", shape_text(vw), r.cols));
  on_device(c, vx, "x");
  on_device(c, vr, "residual");
  on_device(c, vw, "weight");
  nb::object y;
  if (out.is_none()) {
    if (!vx.torch) bad("fused_add_rmsnorm: pass out= (kiln allocates outputs only for torch tensors)");
    y = nb::borrow(x).attr("new_empty")(nb::borrow(x).attr("shape"));
  } else {
    y = nb::borrow(out);
  }
  TensorView vy = operand(c, y, "out");
  on_device(c, vy, "out");
  nb::object ro = residual_out.is_none() ? nb::borrow(residual) : nb::borrow(residual_out);
  TensorView vro = residual_out.is_none() ? vr : operand(c, ro, "residual_out");
  on_device(c, vro, "residual_out");
  const size_t bytes = static_cast<size_t>(r.rows * r.cols) * c.elem_bytes;
  for (const auto& [v, what] : {std::pair<const TensorView*, const char*>{&vy, "out"}, {&vro, "residual_out"}}) {
    if (numel(*v) != numel(vx) || rows_of(*v, what).cols != r.cols) {
      bad(strf("{}: shape {}, but x is {}", what, shape_text(*v), shape_text(vx)));
    }
  }
  if (r.rows * r.cols == 0) return nb::make_tuple(y, ro);
  if (overlap(vy.ptr, vx.ptr, bytes) || overlap(vy.ptr, vr.ptr, bytes) || overlap(vy.ptr, vro.ptr, bytes)) {
    bad("out overlaps x or the residual");
  }
  if (vro.ptr != vr.ptr && overlap(vro.ptr, vr.ptr, bytes)) bad("residual_out overlaps the residual without being it");
  const bool fused = c.fused_cols == r.cols && r.rows <= c.fused_max_rows && r.cols % kVecElems == 0 &&
                     aligned(vx.ptr, c) && aligned(vr.ptr, c) && aligned(vro.ptr, c) && aligned(vw.ptr, c) &&
                     aligned(vy.ptr, c);
  if (!fused) {
    if (!unfused_step) raise(make_error(ErrorCode::kInternal, "kiln.distributed did not set its unfused step"));
    (*unfused_step)(c.handle, x, residual, weight, eps, y, ro);
    return nb::make_tuple(y, ro);
  }
  AllReduce& ar = ar_of(c);
  AllReduce::FusedArgs a;
  a.x = vx.ptr, a.residual = vr.ptr, a.residual_out = vro.ptr, a.weight = vw.ptr, a.y = vy.ptr;
  a.rows = r.rows, a.cols = r.cols;
  a.eps = static_cast<float>(eps);
  const uintptr_t stream = resolve_stream(nb::handle(), vx);
  ensure_thread_context(c.device);
  Status s;
  {
    nb::gil_scoped_release release;
    s = ar.run_fused(a, reinterpret_cast<CUstream>(stream));
  }
  check(s);
  return nb::make_tuple(y, ro);
}

std::vector<std::string> report_texts(const std::vector<runtime::CollectiveReport>& reports) {
  std::vector<std::string> out;
  for (const auto& r : reports) out.push_back(r.json());
  return out;
}

// ---- the heap: tensors made through DLPack, freed (deferred by kiln past the calls using them) by the deleter


struct HeapBlock {
  std::shared_ptr<Collective> owner;
  CUdeviceptr ptr = 0;
  std::vector<int64_t> shape;
  DLManagedTensor managed{};
};

// Called by whoever drops the tensor (torch, possibly without the GIL, on any thread): touches no Python.
void free_block(DLManagedTensor* m) {
  auto* b = static_cast<HeapBlock*>(m->manager_ctx);
  {
    std::lock_guard lock(b->owner->mu);
    if (!b->owner->closed && b->owner->ar) (void)heap_free(*b->owner->ar, b->ptr);
    --b->owner->live;
  }
  delete b;  // may drop the last reference to the Collective (collective teardown, as documented)
}

void capsule_destructor(PyObject* capsule) {
  // A capsule nobody consumed still owns its tensor.
  if (PyCapsule_IsValid(capsule, "dltensor")) {
    auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
    if (m && m->deleter) m->deleter(m);
  }
}

nb::object empty_capsule(PyAllReduce& self, std::vector<int64_t> shape, int dl_code, int dl_bits) {
  Collective& c = self.open();
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) bad(strf("empty: negative size {}", d));
    n *= d;
  }
  if (dl_bits % 8 || dl_bits <= 0) bad(strf("empty: {} bits per element", dl_bits));
  const size_t bytes = std::max<size_t>(1, static_cast<size_t>(n) * (dl_bits / 8));
  AllReduce& ar = ar_of(c);
  ensure_thread_context(c.device);
  Result<CUdeviceptr> p = make_error(ErrorCode::kInternal, "unset");
  {
    nb::gil_scoped_release release;
    p = heap_allocate(ar, bytes);
  }
  if (!p.ok()) raise(p.status());
  auto* b = new HeapBlock;
  b->owner = self.c;
  b->ptr = *p;
  b->shape = std::move(shape);
  ++c.live;
  DLTensor& t = b->managed.dl_tensor;
  t.data = reinterpret_cast<void*>(static_cast<uintptr_t>(b->ptr));
  t.device = {kDLCUDA, c.device};
  t.ndim = static_cast<int32_t>(b->shape.size());
  t.dtype = {static_cast<uint8_t>(dl_code), static_cast<uint8_t>(dl_bits), 1};
  t.shape = b->shape.data();
  t.strides = nullptr;  // compact row-major
  t.byte_offset = 0;
  b->managed.manager_ctx = b;
  b->managed.deleter = free_block;
  PyObject* capsule = PyCapsule_New(&b->managed, "dltensor", capsule_destructor);
  if (!capsule) {
    free_block(&b->managed);
    throw nb::python_error();
  }
  return nb::steal(capsule);
}

// ---- the custom ops' implementations (what torch's dispatcher calls for torch.ops.kiln.*)

void op_all_reduce(nb::handle x, int64_t handle) {
  std::shared_ptr<Collective> c = lookup(handle);
  PyAllReduce self{c};
  all_reduce(self, x, nb::none());
}

nb::object op_fused(nb::handle x, nb::handle residual, nb::handle weight, double eps, int64_t handle) {
  std::shared_ptr<Collective> c = lookup(handle);
  PyAllReduce self{c};
  nb::tuple r = fused_add_rmsnorm(self, x, residual, weight, eps, nb::none(), nb::none());
  return r[0];
}

}  // namespace

void bind_collective(nb::module_& m) {
  m.def("nccl_unique_id", [] {
    auto id = runtime::nccl_unique_id();
    if (!id.ok()) raise(id.status());
    return nb::bytes(id->data(), id->size());
  }, "A fresh NCCL unique id (128 bytes): rank 0 makes it, the other ranks get it from rank 0. Needs NCCL, no GPU.");

  nb::class_<PyAllReduce>(m, "AllReduce",
      "One rank's tuned all-reduce (kiln::runtime::AllReduce). Use kiln.distributed.AllReduce, which makes it\n"
      "from a torch.distributed process group.")
      .def("__init__",
           [](PyAllReduce* self, nb::bytes unique_id, int rank, int world, int device, const std::string& dtype,
              size_t max_bytes, size_t heap_bytes, nb::handle cache_dir, nb::handle mode, int configs) {
             if (unique_id.size() != sizeof(runtime::NcclId)) {
               bad(strf("unique_id: {} bytes; an NCCL unique id has {}", unique_id.size(), sizeof(runtime::NcclId)));
             }
             if (world < 1 || rank < 0 || rank >= world) bad(strf("rank {} of world {} is not a rank", rank, world));
             if (device < 0) bad(strf("device {} is not a CUDA device", device));
             if (configs < 1) bad("configs must be at least 1");
             auto c = std::make_shared<Collective>();
             c->rank = rank, c->world = world, c->device = device;
             c->dtype = parse_dtype_name(dtype);
             c->dtype_code = code_of(c->dtype);
             c->elem_bytes = templates::dtype_bytes(c->dtype);
             runtime::AllReduceOptions o;
             o.dtype = c->dtype;
             if (max_bytes > 0) o.max_bytes = max_bytes;
             if (heap_bytes > 0 && !set_heap_bytes(o, heap_bytes)) {
               raise(make_error(ErrorCode::kUnimplemented, "heap_bytes: this kiln's AllReduce has no symmetric heap"));
             }
             o.max_configs = configs;
             std::string cache = cache_dir.is_none() ? "" : nb::cast<std::string>(nb::str(cache_dir));
             cache::TuneMode tune_mode = cache::TuneMode::kTune;
             {
               auto parsed = mode.is_none() ? cache::tune_mode_from_env(cache::TuneMode::kTune)
                                            : cache::parse_tune_mode(nb::cast<std::string>(mode));
               if (!parsed.ok()) raise(parsed.status());
               tune_mode = *parsed;
             }
             runtime::NcclId id;
             std::memcpy(id.data(), unique_id.c_str(), id.size());
             Status s;
             {
               nb::gil_scoped_release release;
               s = [&]() -> Status {
                 std::shared_ptr<cache::Store> store;
                 if (tune_mode != cache::TuneMode::kOff) {
                   KILN_ASSIGN_OR_RETURN(store, shared_store(cache));
                 }
                 o.cache = std::make_shared<cache::TuningCache>(tune_mode, std::move(store));
                 KILN_ASSIGN_OR_RETURN(c->comm, runtime::Communicator::init(id, rank, world, device));
                 KILN_ASSIGN_OR_RETURN(c->ar, AllReduce::create(*c->comm, std::move(o)));
                 return Status();
               }();
             }
             if (!s.ok()) {
               c->release();
               raise(s.with_context(strf("creating rank {} of {}'s all-reduce on cuda:{}", rank, world, device)));
             }
             c->max_bytes = c->ar->options().max_bytes;
             c->heap_bytes = heap_bytes;
             {
               std::lock_guard lock(registry_mu);
               c->handle = next_handle++;
               registry[c->handle] = c;
             }
             new (self) PyAllReduce{std::move(c)};
           },
           nb::arg("unique_id"), nb::arg("rank"), nb::arg("world"), nb::arg("device"), nb::arg("dtype") = "bfloat16",
           nb::arg("max_bytes") = 0, nb::arg("heap_bytes") = 0, nb::arg("cache_dir").none() = nb::none(),
           nb::arg("mode").none() = nb::none(), nb::arg("configs") = 24,
           "Collective: every rank calls it with the same unique id, world, dtype and sizes. Creates this rank's NCCL\n"
           "communicator on `device` and kiln's all-reduce over it (buffers exchanged, choices compiled).")
      .def_static("_for_tests",
           [](int rank, int world, int device, const std::string& dtype) {
             // An instance without a communicator: argument checks can be tested where there is no GPU.
             auto c = std::make_shared<Collective>();
             c->rank = rank, c->world = world, c->device = device;
             c->dtype = parse_dtype_name(dtype);
             c->dtype_code = code_of(c->dtype);
             c->elem_bytes = templates::dtype_bytes(c->dtype);
             std::lock_guard lock(registry_mu);
             c->handle = next_handle++;
             registry[c->handle] = c;
             return PyAllReduce{std::move(c)};
           })
      .def("all_reduce", &all_reduce, nb::arg("tensor"), nb::arg("out").none() = nb::none(),
           "all_reduce(tensor, out=None)\n\n"
           "Sums `tensor` over the ranks, in place (like torch.distributed.all_reduce), or into `out` (any shape of\n"
           "the same element count). Returns the result tensor. On torch's current stream; zero-copy when the tensor\n"
           "comes from .empty(), through kiln's staging buffer otherwise. Capture-safe.")
      .def("fused_add_rmsnorm", &fused_add_rmsnorm, nb::arg("x"), nb::arg("residual"), nb::arg("weight"),
           nb::arg("eps") = 1e-6, nb::arg("out").none() = nb::none(), nb::arg("residual_out").none() = nb::none(),
           "fused_add_rmsnorm(x, residual, weight, eps=1e-6, out=None, residual_out=None)\n\n"
           "h = all_reduce(x) + residual is written to residual_out (default: residual, in place, as vLLM's\n"
           "fused_add_rms_norm), y = rmsnorm(h) * weight to out (default: a new tensor like x). Returns\n"
           "(y, residual_out). One fused kernel where tune(hidden_size=...) tuned the step for this hidden size and\n"
           "token count, else kiln's all-reduce followed by torch's add and RMSNorm. x is not modified.")
      .def("_tune",
           [](PyAllReduce& self, std::vector<size_t> sizes, int call) {
             AllReduce& ar = ar_of(self.open());
             Result<std::vector<runtime::CollectiveReport>> r = make_error(ErrorCode::kInternal, "unset");
             {
               nb::gil_scoped_release release;
               r = tune_kind(ar, call, std::move(sizes));
             }
             return report_texts(unwrap(std::move(r)));
           }, nb::arg("sizes"), nb::arg("call") = -1)
      .def("_tune_fused",
           [](PyAllReduce& self, int64_t cols, std::vector<int64_t> rows) {
             Collective& c = self.open();
             AllReduce& ar = ar_of(c);
             Result<std::vector<runtime::CollectiveReport>> r = make_error(ErrorCode::kInternal, "unset");
             {
               nb::gil_scoped_release release;
               r = ar.tune_fused(cols, rows);
             }
             auto reports = unwrap(std::move(r));
             int64_t most = 0;
             for (int64_t n : rows) most = std::max(most, n);
             c.fused_cols = cols;
             c.fused_max_rows = most;
             return report_texts(reports);
           }, nb::arg("cols"), nb::arg("rows"))
      .def("_empty_capsule", &empty_capsule, nb::arg("shape"), nb::arg("dl_code"), nb::arg("dl_bits"))
      .def("is_symmetric",
           [](PyAllReduce& self, nb::handle t) {
             AllReduce& ar = ar_of(self.open());
             TensorView v = tensor_view(t, "tensor");
             if (v.device != DeviceKind::kCuda) return false;
             return heap_has(ar, v.ptr, static_cast<size_t>(numel(v)) * v.itemsize);
           }, nb::arg("tensor"),
           "True when the tensor lies in this AllReduce's symmetric heap (made by .empty()): its all-reduce is zero-copy.")
      .def("_choice_for",
           [](PyAllReduce& self, int64_t count, int call) { return choice_of_kind(ar_of(self.open()), count, call); },
           nb::arg("count"), nb::arg("call") = -1)
      .def("fused_choice_for",
           [](PyAllReduce& self, int64_t rows) {
             Collective& c = self.open();
             return rows <= c.fused_max_rows ? ar_of(c).fused_choice_for(rows) : std::string("unfused:torch");
           }, nb::arg("rows"),
           "The choice the fused step runs for `rows` tokens of the tuned hidden size ('unfused:torch': kiln's\n"
           "all-reduce, then torch's add and RMSNorm).")
      .def("_close",
           [](PyAllReduce& self) {
             if (!self.c || self.c->closed) return;
             Collective& c = *self.c;
             if (c.ar) {
               // Heap tensors alive anywhere: every rank refuses alike (their memory would go with the heap).
               std::vector<double> live{static_cast<double>(c.live.load())};
               Status s;
               {
                 nb::gil_scoped_release release;
                 s = c.comm->all_reduce_max(live);
               }
               check(s);
               if (live[0] > 0) {
                 raise(make_error(ErrorCode::kFailedPrecondition,
                                  strf("close(): {} tensor(s) from .empty() are still alive on a rank (this one: {}); "
                                       "drop them first", static_cast<int64_t>(live[0]), c.live.load())));
               }
               nb::gil_scoped_release release;
               c.release();
             } else {
               c.release();
             }
             std::lock_guard lock(registry_mu);
             registry.erase(c.handle);
           })
      .def_prop_ro("handle", [](const PyAllReduce& self) { return self.c ? self.c->handle : 0; },
                   "The int the custom ops take (torch.ops.kiln.all_reduce(x, handle)).")
      .def_prop_ro("rank", [](const PyAllReduce& self) { return self.c->rank; })
      .def_prop_ro("world", [](const PyAllReduce& self) { return self.c->world; })
      .def_prop_ro("device", [](const PyAllReduce& self) { return self.c->device; })
      .def_prop_ro("dtype_name", [](const PyAllReduce& self) { return std::string(torch_name(self.c->dtype)); })
      .def_prop_ro("max_bytes", [](const PyAllReduce& self) { return self.c->max_bytes; })
      .def_prop_ro("closed", [](const PyAllReduce& self) { return !self.c || self.c->closed.load(); })
      .def_prop_ro("live_tensors", [](const PyAllReduce& self) { return self.c ? self.c->live.load() : 0; },
                   "Tensors from .empty() not yet freed.")
      .def_prop_ro("hidden_size", [](const PyAllReduce& self) { return self.c->fused_cols; },
                   "The hidden size the fused step is tuned for (0: none).");

  // The kinds of call this kiln tunes apart (0: one kind only), in AllReduceCall order.
  m.attr("all_reduce_call_kinds") = call_kinds();
  m.def("_op_all_reduce", &op_all_reduce, nb::arg("x"), nb::arg("handle"));
  m.def("_op_all_reduce_fused_add_rmsnorm", &op_fused, nb::arg("x"), nb::arg("residual"), nb::arg("weight"),
        nb::arg("eps"), nb::arg("handle"));
  m.def("_all_reduce_by_handle", [](int64_t handle, nb::handle t, nb::handle out) {
    PyAllReduce self{lookup(handle)};
    return all_reduce(self, t, out);
  }, nb::arg("handle"), nb::arg("tensor"), nb::arg("out").none() = nb::none());
  m.def("_set_unfused_step", [](nb::object f) {
    if (!unfused_step) unfused_step = new nb::object;
    *unfused_step = std::move(f);
  });
  m.def("_leak_collectives", [] {
    // At interpreter exit the ranks no longer meet at one point: tearing down (collective) could wait forever
    // for a peer that has gone. The OS reclaims the memory and the driver the mappings instead.
    std::lock_guard lock(registry_mu);
    for (auto& [handle, weak] : registry) {
      if (auto c = weak.lock()) {
        std::lock_guard l(c->mu);
        c->closed = true;
        (void)c->ar.release();
        (void)c->comm.release();
      }
    }
    registry.clear();
  });
}

}  // namespace kiln::py
