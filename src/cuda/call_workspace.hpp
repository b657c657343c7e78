// Internal: a cuDNN call's workspace from the stream-ordered caching allocator.
#pragma once

#include <pipeline/cuda/device_memory.hpp>

#include <cuda_runtime.h>

#include <cstddef>

namespace pipeline::cuda::detail {

// Device memory from the caching allocator for the duration of one queued call: given back as
// soon as the call is queued, which is safe because the pool hands the block out again only to
// work queued later on the same stream.
class CallWorkspace {
 public:
  CallWorkspace(int device, std::size_t bytes, cudaStream_t stream)
      : m_device(device),
        m_bytes(bytes),
        m_ptr(bytes > 0 ? device_pool(device).allocate(bytes, stream) : nullptr) {}
  ~CallWorkspace() {
    if (m_ptr != nullptr) device_pool(m_device).deallocate(m_ptr);
  }
  CallWorkspace(const CallWorkspace&) = delete;
  CallWorkspace& operator=(const CallWorkspace&) = delete;
  void* get() const { return m_ptr; }
  std::size_t bytes() const { return m_bytes; }

 private:
  int m_device;
  std::size_t m_bytes;
  void* m_ptr;
};

}  // namespace pipeline::cuda::detail
