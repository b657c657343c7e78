#include <pipeline/core/error.hpp>
#include <pipeline/cuda/check.hpp>

namespace pipeline::cuda {

std::string current_device_name() {
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) return "cuda:?";
  return "cuda:" + std::to_string(device);
}

namespace detail {

void cuda_failed(cudaError_t e, const char* expr, const char* file, int line) {
  ::pipeline::detail::fail<CudaError>(expr, file, line,
                                      fmt::format("CUDA error {} ({}) on {}", cudaGetErrorName(e),
                                                  cudaGetErrorString(e), current_device_name()));
}

void cublas_failed(cublasStatus_t s, const char* expr, const char* file, int line) {
  ::pipeline::detail::fail<CudaError>(
      expr, file, line,
      fmt::format("cuBLAS error {} ({}) on {}", cublasLtGetStatusName(s), cublasLtGetStatusString(s),
                  current_device_name()));
}

void cudnn_failed(cudnnStatus_t s, const char* expr, const char* file, int line) {
  char last[512] = {};
  cudnnGetLastErrorString(last, sizeof(last));
  ::pipeline::detail::fail<CudaError>(expr, file, line,
                                      fmt::format("cuDNN error {}{}{} on {}",
                                                  cudnnGetErrorString(s), last[0] ? ": " : "",
                                                  last, current_device_name()));
}

}  // namespace detail
}  // namespace pipeline::cuda
