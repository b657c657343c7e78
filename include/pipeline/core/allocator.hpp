// Storage allocation. CPU buffers are 64-byte aligned so that Eigen's AVX-512 paths can use
// aligned loads, and come from the caching host allocator (host_allocator.hpp); CUDA buffers
// come from a hook the CUDA module installs, so that the core never includes CUDA headers and a
// CPU-only build has no CUDA symbols.
#pragma once

#include <pipeline/core/device.hpp>
#include <pipeline/core/error.hpp>
#include <pipeline/core/host_allocator.hpp>

#include <cstddef>
#include <cstdlib>
#include <memory>
#include <new>

namespace pipeline {

// Allocates and frees device memory; installed by the CUDA module at start-up.
struct DeviceAllocator {
  void* (*allocate)(std::size_t bytes, int device) = nullptr;
  void (*deallocate)(void* ptr, int device) noexcept = nullptr;
};

inline DeviceAllocator& cuda_allocator() {
  static DeviceAllocator a;
  return a;
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
  auto& a = cuda_allocator();
  PIPELINE_CHECK_AS(ConfigError, a.allocate != nullptr,
                    "a tensor on {} was requested but this build has no CUDA support: "
                    "rebuild with -DPIPELINE_WITH_CUDA=ON or use the CPU",
                    device.str());
  int index = device.index;
  void* p = a.allocate(rounded, index);
  auto free_fn = a.deallocate;
  return std::shared_ptr<std::byte>(static_cast<std::byte*>(p),
                                    [free_fn, index](std::byte* q) { free_fn(q, index); });
}

}  // namespace pipeline
