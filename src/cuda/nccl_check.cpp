#include <pipeline/core/error.hpp>
#include <pipeline/cuda/check.hpp>
#include <pipeline/cuda/nccl_check.hpp>

namespace pipeline::cuda {

std::string nccl_error_text(ncclResult_t result, ncclComm_t comm) {
  const char* last = ncclGetLastError(comm);
  std::string text = ncclGetErrorString(result);
  if (last != nullptr && last[0] != '\0') text += fmt::format("; NCCL says: {}", last);
  return text;
}

namespace detail {

void nccl_failed(ncclResult_t r, const char* expr, const char* file, int line) {
  ::pipeline::detail::fail<NcclError>(
      expr, file, line,
      fmt::format("NCCL error {} on {} (run with NCCL_DEBUG=WARN or INFO for NCCL's own log)",
                  nccl_error_text(r), current_device_name()));
}

}  // namespace detail
}  // namespace pipeline::cuda
