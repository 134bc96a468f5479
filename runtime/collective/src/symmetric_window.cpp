#include "symmetric_window.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "nccl_api.h"

namespace kiln::runtime::detail {

namespace {

// Every rank learns whether `local` failed anywhere; the first failing rank's message is not exchanged (the
// control collectives carry numbers), so a rank that did not fail names the step instead.
Status agree(Communicator& comm, const Status& local, const char* step) {
  std::vector<double> failed{local.ok() ? 0.0 : 1.0};
  KILN_RETURN_IF_ERROR(comm.all_reduce_max(failed));
  if (!local.ok()) return local;
  if (failed[0] > 0) return make_error(ErrorCode::kUnavailable, fmt::format("{} failed on another rank", step));
  return Status();
}

}  // namespace

Result<SymmetricWindowPtr> create_symmetric_window(Communicator& comm, size_t bytes) {
  auto api = nccl();
  Status local = api.status();
  if (local.ok() && !(*api)->has_symmetric_memory()) {
    local = make_error(ErrorCode::kUnavailable,
                       fmt::format("NCCL {} ({}) has no symmetric memory (2.27 or newer has)", (*api)->version,
                                   (*api)->library));
  }
  if (local.ok() && bytes == 0) local = make_error(ErrorCode::kInvalidArgument, "a symmetric window of 0 bytes");
  void* buffer = nullptr;
  if (local.ok()) local = to_status((*api)->ncclMemAlloc(&buffer, bytes), "ncclMemAlloc", __FILE__, __LINE__);
  // Registration is collective: no rank may start it unless every rank has its buffer.
  if (Status st = agree(comm, local, "ncclMemAlloc"); !st.ok()) {
    if (buffer) (void)(*api)->ncclMemFree(buffer);
    return st;
  }
  ncclWindow_t window = nullptr;
  local = to_status((*api)->ncclCommWindowRegister(comm.nccl(), buffer, bytes, &window, NCCL_WIN_COLL_SYMMETRIC),
                    "ncclCommWindowRegister", __FILE__, __LINE__);
  if (Status st = agree(comm, local, "ncclCommWindowRegister"); !st.ok()) {
    // A rank whose registration succeeded while another's failed cannot deregister collectively: its window
    // and buffer stay until the communicator is destroyed, which releases NCCL's windows.
    if (!local.ok()) (void)(*api)->ncclMemFree(buffer);
    return st;
  }
  return SymmetricWindowPtr(new SymmetricWindow{&comm, buffer, bytes, window});
}

void ReleaseSymmetricWindow::operator()(SymmetricWindow* w) const {
  std::unique_ptr<SymmetricWindow> owned(w);
  auto api = nccl();
  if (!api.ok()) return;
  if (Status st = to_status((*api)->ncclCommWindowDeregister(w->comm->nccl(), w->window), "ncclCommWindowDeregister",
                            __FILE__, __LINE__);
      !st.ok()) {
    spdlog::warn("kiln: rank {}: {}", w->comm->rank(), st.to_string());
    return;  // still registered: freeing the memory under NCCL would be worse than keeping it
  }
  if (Status st = to_status((*api)->ncclMemFree(w->buffer), "ncclMemFree", __FILE__, __LINE__); !st.ok()) {
    spdlog::warn("kiln: rank {}: {}", w->comm->rank(), st.to_string());
  }
}

}  // namespace kiln::runtime::detail
