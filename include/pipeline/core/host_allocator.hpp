// HostAllocator: the caching allocator behind every CPU tensor.
//
// A training step allocates the same large buffers (activations, their gradients, workspace)
// every step. From the C library each of them is fresh memory: glibc serves large requests by
// mmap, or returns the top of its heap to the system when it shrinks, so every step faults its
// pages in again — the input-gradient half of a transformer block's backward, which keeps its
// children's gradients for the weight half, ran 1.6x slower from that alone. The allocator keeps
// freed blocks of 64 KiB and more in size classes (8 per power of two, so at most 12.5% of a
// block is slack) and hands them out again, so that a step in the steady state reaches the
// system for nothing; smaller requests go to the C library, which caches them itself.
//
// Statistics (bytes in use, cached, peak in use, requests that reached the system) say whether
// that holds. release_cached() gives the cache back to the system; set_cache_limit() bounds it
// (a block freed beyond the limit is returned at once). Thread-safe. Under AddressSanitizer every
// request goes to the C library, so that use-after-free and overflows stay visible (the bytes in
// use and their peak are still counted).
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <vector>

namespace pipeline {

struct HostAllocatorStats {
  // Handed out and not freed: requests of kMinCachedBytes and more, at their class sizes.
  std::int64_t in_use_bytes = 0;
  std::int64_t cached_bytes = 0;   // freed and kept for reuse
  std::int64_t peak_in_use_bytes = 0;
  std::int64_t system_allocations = 0;  // large requests the cache could not serve
  std::int64_t cache_hits = 0;          // large requests served from the cache
};

class HostAllocator {
 public:
  static constexpr std::size_t kAlignment = 64;
  static constexpr std::size_t kMinCachedBytes = std::size_t{64} << 10;

  // 64-byte aligned, at least `bytes` (> 0); throws Error when the system has no memory left.
  void* allocate(std::size_t bytes);
  // `bytes` must be the size given to allocate().
  void deallocate(void* ptr, std::size_t bytes) noexcept;

  HostAllocatorStats stats() const;
  // Starts a new peak: peak_in_use_bytes = in_use_bytes (the profiler measures each layer's).
  void reset_peak();
  // Frees every cached block.
  void release_cached();
  // Cached bytes beyond which freed blocks go back to the system (default: no limit).
  void set_cache_limit(std::size_t bytes);

  // The size a request of `bytes` is served with: its size class when cached, else `bytes`
  // rounded up to the alignment.
  static std::size_t rounded_size(std::size_t bytes);

 private:
  mutable std::mutex m_mutex;
  std::map<std::size_t, std::vector<void*>> m_free;  // size class -> cached blocks
  HostAllocatorStats m_stats;
  std::size_t m_limit = std::numeric_limits<std::size_t>::max();
};

// The process's allocator of CPU tensors.
HostAllocator& host_allocator();

}  // namespace pipeline
