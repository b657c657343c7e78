// Checks of NCCL return codes, in the style of cuda/check.hpp. PIPELINE_NCCL_CHECK evaluates the
// call once and, unless it returned ncclSuccess, throws NcclError whose message names the call,
// NCCL's error name (ncclGetErrorString), NCCL's last error text (ncclGetLastError), the current
// device and file:line (with the rank prefix of every error):
//
//   PIPELINE_NCCL_CHECK(ncclGetUniqueId(&id));
//   PIPELINE_NCCL_CHECK_ASYNC(ncclSend(buf, n, ncclFloat32, peer, comm, stream));  // non-blocking
//
// PIPELINE_NCCL_CHECK_ASYNC also accepts ncclInProgress: what calls on a non-blocking communicator
// (ncclConfig_t::blocking = 0) return while the operation is still being set up; the caller then
// polls ncclCommGetAsyncError until the state leaves ncclInProgress (comms/nccl.hpp does).
// Requires the CUDA toolkit and NCCL (PIPELINE_WITH_CUDA builds only).
#pragma once

#include <nccl.h>

#include <string>

namespace pipeline::cuda {

// "ncclInternalError (internal error - please report this issue to the NCCL developers); NCCL
// says: <ncclGetLastError(comm)>": an NCCL result as text. `comm` may be null (the calling
// thread's last error).
std::string nccl_error_text(ncclResult_t result, ncclComm_t comm = nullptr);

namespace detail {
[[noreturn]] void nccl_failed(ncclResult_t r, const char* expr, const char* file, int line);
}  // namespace detail
}  // namespace pipeline::cuda

#define PIPELINE_NCCL_CHECK(expr)                                                             \
  do {                                                                                        \
    const ncclResult_t pipeline_nccl_status_ = (expr);                                        \
    if (pipeline_nccl_status_ != ncclSuccess) [[unlikely]]                                    \
      ::pipeline::cuda::detail::nccl_failed(pipeline_nccl_status_, #expr, __FILE__, __LINE__); \
  } while (0)

#define PIPELINE_NCCL_CHECK_ASYNC(expr)                                                       \
  do {                                                                                        \
    const ncclResult_t pipeline_nccl_status_ = (expr);                                        \
    if (pipeline_nccl_status_ != ncclSuccess && pipeline_nccl_status_ != ncclInProgress)      \
        [[unlikely]]                                                                          \
      ::pipeline::cuda::detail::nccl_failed(pipeline_nccl_status_, #expr, __FILE__, __LINE__); \
  } while (0)
