// The caching host allocator (see host_allocator.hpp).
#include <pipeline/core/host_allocator.hpp>

#include <pipeline/core/error.hpp>

#include <bit>
#include <cstdlib>

#if defined(__SANITIZE_ADDRESS__)
#define PIPELINE_HOST_CACHE 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PIPELINE_HOST_CACHE 0
#endif
#endif
#ifndef PIPELINE_HOST_CACHE
#define PIPELINE_HOST_CACHE 1
#endif

namespace pipeline {
namespace {

void* system_allocate(std::size_t bytes) {
  void* p = std::aligned_alloc(HostAllocator::kAlignment, bytes);
  if (!p)
    PIPELINE_FAIL(Error,
                  "out of host memory allocating {} bytes ({:.3g} GiB): a smaller batch (the "
                  "tools' --batch) or model needs less",
                  bytes, static_cast<double>(bytes) / (1ull << 30));
  return p;
}

}  // namespace

std::size_t HostAllocator::rounded_size(std::size_t bytes) {
  std::size_t aligned = (std::max<std::size_t>(bytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
  if (!PIPELINE_HOST_CACHE || aligned < kMinCachedBytes) return aligned;
  // 8 classes per power of two: the step is an eighth of the largest power of two below.
  const std::size_t step = std::bit_floor(aligned) / 8;
  return (aligned + step - 1) / step * step;
}

void* HostAllocator::allocate(std::size_t bytes) {
  const std::size_t size = rounded_size(bytes);
  if (size < kMinCachedBytes) return system_allocate(size);
  {
    std::lock_guard<std::mutex> lock(m_mutex);
    m_stats.in_use_bytes += static_cast<std::int64_t>(size);
    m_stats.peak_in_use_bytes = std::max(m_stats.peak_in_use_bytes, m_stats.in_use_bytes);
    if (!PIPELINE_HOST_CACHE) return system_allocate(size);  // counted, never cached
    auto it = m_free.find(size);
    if (it != m_free.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      m_stats.cached_bytes -= static_cast<std::int64_t>(size);
      ++m_stats.cache_hits;
      return p;
    }
    ++m_stats.system_allocations;
  }
  try {
    return system_allocate(size);
  } catch (...) {
    // Out of memory: give the cache back and try once more before failing.
    release_cached();
    try {
      return system_allocate(size);
    } catch (...) {
      std::lock_guard<std::mutex> lock(m_mutex);
      m_stats.in_use_bytes -= static_cast<std::int64_t>(size);
      throw;
    }
  }
}

void HostAllocator::deallocate(void* ptr, std::size_t bytes) noexcept {
  if (!ptr) return;
  const std::size_t size = rounded_size(bytes);
  if (size < kMinCachedBytes) {
    std::free(ptr);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(m_mutex);
    m_stats.in_use_bytes -= static_cast<std::int64_t>(size);
    if (PIPELINE_HOST_CACHE && static_cast<std::size_t>(m_stats.cached_bytes) + size <= m_limit) {
      m_free[size].push_back(ptr);
      m_stats.cached_bytes += static_cast<std::int64_t>(size);
      return;
    }
  }
  std::free(ptr);
}

HostAllocatorStats HostAllocator::stats() const {
  std::lock_guard<std::mutex> lock(m_mutex);
  return m_stats;
}

void HostAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(m_mutex);
  m_stats.peak_in_use_bytes = m_stats.in_use_bytes;
}

void HostAllocator::release_cached() {
  std::map<std::size_t, std::vector<void*>> blocks;
  {
    std::lock_guard<std::mutex> lock(m_mutex);
    blocks.swap(m_free);
    m_stats.cached_bytes = 0;
  }
  for (auto& [size, list] : blocks)
    for (void* p : list) std::free(p);
}

void HostAllocator::set_cache_limit(std::size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(m_mutex);
    m_limit = bytes;
    if (static_cast<std::size_t>(m_stats.cached_bytes) <= bytes) return;
  }
  release_cached();
}

HostAllocator& host_allocator() {
  // Never destroyed: tensors in static storage may be freed after main returns.
  static HostAllocator* a = new HostAllocator;
  return *a;
}

}  // namespace pipeline
