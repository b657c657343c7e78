// Storage allocation. CPU buffers are 64-byte aligned so that Eigen's AVX-512 paths can use
// aligned loads, and come from the caching host allocator (host_allocator.hpp); CUDA buffers
// come from a hook the CUDA module installs, so that the core never includes CUDA headers and a
// CPU-only build has no CUDA symbols.
#pragma once

#include <pipeline/core/device.hpp>
#include <pipeline/core/error.hpp>
#include <pipeline/core/host_allocator.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>

namespace pipeline {

// The bytes a device's tensors hold, as its allocator counts them (at their size classes): in use
// now, and the most in use at once since the last reset_memory_peak. On the CPU these are the host
// allocator's requests of 64 KiB and more, the whole process's; on a GPU the caching pool's blocks
// of the whole device or, when the ranks of a job are threads of this process, the blocks
// allocated on the calling thread's stream (its rank's).
struct MemoryUse {
  std::int64_t in_use_bytes = 0;
  std::int64_t peak_in_use_bytes = 0;
};

// Device memory for the core: allocation, copies and fills, installed by the CUDA device layer
// (src/cuda/device_memory.cpp) the first time a device tensor is made, so that the core never
// includes CUDA headers and a CPU-only build has no CUDA symbols. All of them work on the calling
// thread's current stream of the device (cuda/stream.hpp).
struct DeviceAllocator {
  void* (*allocate)(std::size_t bytes, int device) = nullptr;
  void (*deallocate)(void* ptr, int device) noexcept = nullptr;
  // Copies `bytes` between any two devices, the CPU included, on the current stream of the
  // destination (of the source for a copy to the CPU). A copy that involves the CPU or two
  // different GPUs has completed when it returns (the host may read or reuse its buffer); a copy
  // within one GPU is queued.
  void (*copy)(void* dst, Device dst_device, const void* src, Device src_device,
               std::size_t bytes) = nullptr;
  void (*zero)(void* dst, int device, std::size_t bytes) = nullptr;
  void (*fill)(float* dst, int device, float value, std::size_t count) = nullptr;
  // acc[i] += x[i] for float32 (the in-process communicator's sums of device tensors).
  void (*add)(float* acc, const float* x, int device, std::size_t count) = nullptr;

  // Ordering across threads that each have their own current stream (the in-process
  // communicator hands device tensors from one rank's thread to another's):
  // mark() records an event on the caller's current stream of `device` now; wait_for() makes the
  // caller's current stream wait for such a mark on the device (the host does not block);
  // used_here() tells the allocator that the storage at `storage` (a tensor's storage_id()) is
  // used by work queued on the caller's current stream too, so that its block is reused only
  // after that work (see cuda/caching_pool.hpp).
  // The caching pool's bytes in use and their peak for the calling rank (memory_use below), and
  // a new peak from now.
  MemoryUse (*memory_use)(int device) = nullptr;
  void (*reset_peak)(int device) = nullptr;

  std::shared_ptr<void> (*mark)(int device) = nullptr;
  void (*wait_for)(const std::shared_ptr<void>& mark, int device) = nullptr;
  void (*used_here)(const void* storage, int device) = nullptr;
};

#if PIPELINE_WITH_CUDA
namespace cuda {
void install_device_hooks();  // src/cuda/device_memory.cpp
}
#endif

// The installed device functions; ConfigError naming the device in a build without CUDA.
inline DeviceAllocator& cuda_allocator() {
  static DeviceAllocator a;
  return a;
}
inline const DeviceAllocator& device_functions(Device device) {
  auto& a = cuda_allocator();
#if PIPELINE_WITH_CUDA
  if (a.allocate == nullptr) cuda::install_device_hooks();
#endif
  PIPELINE_CHECK_AS(ConfigError, a.allocate != nullptr,
                    "a tensor on {} was requested but this build has no CUDA support: "
                    "rebuild with -DPIPELINE_WITH_CUDA=ON or use the CPU",
                    device.str());
  return a;
}

inline MemoryUse memory_use(Device device) {
  if (device.is_cpu()) {
    const HostAllocatorStats s = host_allocator().stats();
    return {s.in_use_bytes, s.peak_in_use_bytes};
  }
  return device_functions(device).memory_use(device.index);
}

inline void reset_memory_peak(Device device) {
  if (device.is_cpu())
    host_allocator().reset_peak();
  else
    device_functions(device).reset_peak(device.index);
}

// A reference-counted buffer; tensors share it, views keep it alive.
inline std::shared_ptr<std::byte> allocate_bytes(std::size_t bytes, Device device) {
  constexpr std::size_t kAlign = 64;
  std::size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  if (rounded == 0) rounded = kAlign;
  if (device.is_cpu()) {
    void* p = host_allocator().allocate(rounded);
    return std::shared_ptr<std::byte>(static_cast<std::byte*>(p), [rounded](std::byte* q) {
      host_allocator().deallocate(q, rounded);
    });
  }
  const DeviceAllocator& a = device_functions(device);
  int index = device.index;
  void* p = a.allocate(rounded, index);
  auto free_fn = a.deallocate;
  return std::shared_ptr<std::byte>(static_cast<std::byte*>(p),
                                    [free_fn, index](std::byte* q) { free_fn(q, index); });
}

}  // namespace pipeline
