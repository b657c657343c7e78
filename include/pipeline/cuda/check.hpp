// Checks of CUDA, cuBLAS(Lt) and cuDNN return codes. Each macro evaluates the call once and, when
// it did not succeed, throws CudaError whose message names the call, the library's error name and
// text, the current device and file:line (with the rank prefix of every error):
//
//   PIPELINE_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, stream));
//   my_kernel<<<grid, block, 0, stream>>>(...);
//   PIPELINE_CUDA_LAUNCH_CHECK();  // the launch's own error (bad configuration), not its execution
//
// The failure functions live in src/cuda/check.cpp, so this header pulls in no fmt: kernel files
// (.cu) include it, and nvcc's front end cannot compile fmt's compile-time format checks.
// Requires the CUDA toolkit's headers (PIPELINE_WITH_CUDA builds only).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <string>

namespace pipeline::cuda {

// "cuda:N", or "cuda:?" when even asking for the device fails (a broken context).
std::string current_device_name();

namespace detail {
[[noreturn]] void cuda_failed(cudaError_t e, const char* expr, const char* file, int line);
[[noreturn]] void cublas_failed(cublasStatus_t s, const char* expr, const char* file, int line);
[[noreturn]] void cudnn_failed(cudnnStatus_t s, const char* expr, const char* file, int line);
}  // namespace detail
}  // namespace pipeline::cuda

#define PIPELINE_CUDA_CHECK(expr)                                                             \
  do {                                                                                        \
    const cudaError_t pipeline_cuda_status_ = (expr);                                         \
    if (pipeline_cuda_status_ != cudaSuccess) [[unlikely]]                                    \
      ::pipeline::cuda::detail::cuda_failed(pipeline_cuda_status_, #expr, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: the launch's configuration error, if any.
#define PIPELINE_CUDA_LAUNCH_CHECK() PIPELINE_CUDA_CHECK(cudaGetLastError())

#define PIPELINE_CUBLAS_CHECK(expr)                                                     \
  do {                                                                                  \
    const cublasStatus_t pipeline_cublas_status_ = (expr);                              \
    if (pipeline_cublas_status_ != CUBLAS_STATUS_SUCCESS) [[unlikely]]                  \
      ::pipeline::cuda::detail::cublas_failed(pipeline_cublas_status_, #expr, __FILE__, \
                                              __LINE__);                                \
  } while (0)

#define PIPELINE_CUDNN_CHECK(expr)                                                    \
  do {                                                                                \
    const cudnnStatus_t pipeline_cudnn_status_ = (expr);                              \
    if (pipeline_cudnn_status_ != CUDNN_STATUS_SUCCESS) [[unlikely]]                  \
      ::pipeline::cuda::detail::cudnn_failed(pipeline_cudnn_status_, #expr, __FILE__, \
                                             __LINE__);                               \
  } while (0)
