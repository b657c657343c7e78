// Device memory of tensors: one stream-ordered CachingPool (caching_pool.hpp) per CUDA device
// behind the core's allocation hook (core/allocator.hpp), plus the copies and fills of device
// tensors. Pools are made on first use and live until the process ends (never destroyed: at exit
// the CUDA runtime may already be gone).
#pragma once

#include <pipeline/core/tensor.hpp>
#include <pipeline/cuda/caching_pool.hpp>

#include <cuda_runtime.h>

namespace pipeline::cuda {

// The pool of `device` (made on first use).
CachingPool& device_pool(int device);

// Bytes in use, cached and at peak on `device`, and how many requests reached the driver.
PoolStats device_memory_stats(int device);

// `t`'s storage is used by work on `stream` too (besides the stream it was allocated on): its
// block is not reused until that work is done (CachingPool::record_stream).
void record_stream(const Tensor& t, cudaStream_t stream);

// Installs allocation, copy and fill into the core's hooks (done on the first device tensor).
void install_device_hooks();

}  // namespace pipeline::cuda
