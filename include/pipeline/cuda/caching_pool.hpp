// CachingPool: the stream-ordered caching allocator behind device tensors, independent of CUDA so
// that its policy is tested on any machine (the CUDA binding, cuda/device_memory.hpp, gives it
// cudaMalloc, cudaFree and events).
//
// Why: cudaMalloc and cudaFree synchronise the device and cost tens of microseconds to
// milliseconds; a training step allocates the same sizes again and again. Freed blocks are kept
// in pools keyed by (stream, size class) and handed out again without the driver, so a step in
// the steady state makes no driver call.
//
// Stream order: a block freed by its tensor may still be in use by work queued on its stream; a
// new allocation on the same stream is queued after that work, so the block is reused at once
// there. A block that was also used on other streams (record_stream()) is reused only after an
// event recorded on each of them at the free has completed.
//
// Size classes: requests up to 1 MiB round up to 512 bytes; larger ones to an eighth of their
// power of two (at most 12.5% waste), so the few sizes a model uses map to a few pools.
//
// Out of memory: when the driver refuses, every cached block is released and the request
// retried once; if it still fails, CudaError says what was asked, what is in use and cached, the
// peak, and on which device.
//
// Private pools (CUDA graphs): a captured graph replays its kernels on the very addresses it was
// captured with, without calling the allocator. So while a stream captures (begin_private), its
// allocations and every block freed on it belong to the capture's private pool: they are reused
// only by that pool's later allocations (stream-ordered within the one captured stream), never
// handed to other work, and not given back to the driver on out-of-memory; release_private()
// returns them to the common pools once the graph is destroyed.
#pragma once

#include <pipeline/core/error.hpp>
#include <pipeline/core/text.hpp>

#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace pipeline::cuda {

// Opaque stream and event handles (cudaStream_t and cudaEvent_t in the CUDA binding).
using StreamHandle = void*;
using EventHandle = void*;

// What the pool needs from a device. allocate returns nullptr when the device is out of memory.
struct PoolDriver {
  std::function<void*(std::size_t bytes)> allocate;
  std::function<void(void* ptr)> free;
  std::function<EventHandle(StreamHandle stream)> record_event;  // a new event, recorded
  std::function<bool(EventHandle event)> event_done;
  std::function<void(EventHandle event)> wait_event;  // blocks the host until it is done
  std::function<void(EventHandle event)> destroy_event;
};

// Bytes of the blocks allocated for work on one stream (the stream a block was asked for, also
// when another frees it), and their largest total: one in-process rank's device memory, as each
// rank allocates on its own stream.
struct StreamUse {
  std::int64_t in_use_bytes = 0;
  std::int64_t peak_in_use_bytes = 0;
};

struct PoolStats {
  std::int64_t in_use_bytes = 0;       // held by live allocations (their size classes)
  std::int64_t cached_bytes = 0;       // freed, kept for reuse
  std::int64_t peak_in_use_bytes = 0;  // the most in use at once
  std::int64_t requests = 0;           // allocate() calls
  std::int64_t driver_allocations = 0;  // requests that reached the driver
  std::int64_t driver_frees = 0;
};

class CachingPool {
 public:
  // `device_name` ("cuda:0") goes into error messages.
  CachingPool(PoolDriver driver, std::string device_name)
      : m_driver(std::move(driver)), m_device_name(std::move(device_name)) {}
  ~CachingPool() { release_cached(/*wait=*/true); }
  CachingPool(const CachingPool&) = delete;
  CachingPool& operator=(const CachingPool&) = delete;

  static std::size_t size_class(std::size_t bytes) {
    constexpr std::size_t kSmall = std::size_t{1} << 20, kSmallStep = 512;
    if (bytes <= kSmall) return std::max<std::size_t>(kSmallStep, round_up(bytes, kSmallStep));
    std::size_t p = kSmall;
    while (p * 2 <= bytes) p *= 2;
    return round_up(bytes, p / 8);
  }

  // A block of at least `bytes` for work on `stream`.
  void* allocate(std::size_t bytes, StreamHandle stream) {
    std::lock_guard<std::mutex> lock(m_mutex);
    ++m_stats.requests;
    collect_ready();
    const std::size_t size = size_class(bytes);
    const int pool = capturing(stream) ? m_capture_pool : 0;
    void* ptr = nullptr;
    // A capture takes its own freed blocks first, then common ones of its stream (which become
    // its own: the graph will use them).
    if (pool != 0) ptr = take(m_private[pool], {stream, size});
    if (ptr == nullptr) ptr = take(m_free, {stream, size});
    if (ptr != nullptr) {
      m_stats.cached_bytes -= static_cast<std::int64_t>(size);
    } else {
      ptr = m_driver.allocate(size);
      if (ptr == nullptr) {
        release_cached_locked(/*wait=*/true);
        ptr = m_driver.allocate(size);
      }
      if (ptr == nullptr)
        PIPELINE_FAIL(CudaError,
                      "out of memory on {}: asked for {} ({} with rounding); {} in use by live "
                      "tensors, {} cached (released and retried), peak {}: lower the microbatch "
                      "size, recompute activations (--recompute), or use more stages",
                      m_device_name, format_bytes(static_cast<std::int64_t>(bytes)),
                      format_bytes(static_cast<std::int64_t>(size)),
                      format_bytes(m_stats.in_use_bytes), format_bytes(m_stats.cached_bytes),
                      format_bytes(m_stats.peak_in_use_bytes));
      ++m_stats.driver_allocations;
    }
    m_live.emplace(ptr, Block{size, stream, {}, pool});
    m_stats.in_use_bytes += static_cast<std::int64_t>(size);
    m_stats.peak_in_use_bytes = std::max(m_stats.peak_in_use_bytes, m_stats.in_use_bytes);
    StreamUse& use = m_streams[stream];
    use.in_use_bytes += static_cast<std::int64_t>(size);
    use.peak_in_use_bytes = std::max(use.peak_in_use_bytes, use.in_use_bytes);
    return ptr;
  }

  // Marks a live block as used by work on `stream` too, so that it is not handed out on its own
  // stream before that work is done.
  void record_stream(void* ptr, StreamHandle stream) {
    std::lock_guard<std::mutex> lock(m_mutex);
    auto it = m_live.find(ptr);
    PIPELINE_CHECK(it != m_live.end(), "record_stream: {} is not a live block of {}", ptr,
                   m_device_name);
    if (stream == it->second.stream) return;
    for (StreamHandle s : it->second.other_streams)
      if (s == stream) return;
    it->second.other_streams.push_back(stream);
  }

  // Returns a block; it is cached, never given back to the driver here (see release_cached).
  void deallocate(void* ptr) noexcept {
    if (ptr == nullptr) return;
    std::lock_guard<std::mutex> lock(m_mutex);
    auto it = m_live.find(ptr);
    if (it == m_live.end()) return;  // not ours: nothing sensible to do in a destructor path
    Block b = std::move(it->second);
    m_live.erase(it);
    m_stats.in_use_bytes -= static_cast<std::int64_t>(b.size);
    m_stats.cached_bytes += static_cast<std::int64_t>(b.size);
    m_streams[b.stream].in_use_bytes -= static_cast<std::int64_t>(b.size);
    // Freed while its stream captures: the graph may use it, so it is the graph's from now on.
    if (b.pool == 0 && capturing(b.stream)) b.pool = m_capture_pool;
    if (b.other_streams.empty()) {
      free_list(b.pool)[{b.stream, b.size}].push_back(ptr);
      return;
    }
    Pending p{ptr, b.size, b.stream, {}, b.pool};
    for (StreamHandle s : b.other_streams) p.events.push_back(m_driver.record_event(s));
    m_pending.push_back(std::move(p));
  }

  // `stream` is about to be destroyed and its work is done (the caller synchronised it). No event
  // may be recorded on its handle any more, and a new stream may be given the same handle: live
  // blocks stop listing it as a user, and its blocks (live, cached or pending) pass to the legacy
  // default stream (handle nullptr), on which their reuse needs no ordering.
  void forget_stream(StreamHandle stream) {
    if (stream == nullptr) return;
    std::lock_guard<std::mutex> lock(m_mutex);
    for (auto& [ptr, b] : m_live) {
      if (b.stream == stream) b.stream = nullptr;
      std::erase(b.other_streams, stream);
    }
    if (auto it = m_streams.find(stream); it != m_streams.end()) {
      m_streams[nullptr].in_use_bytes += it->second.in_use_bytes;  // its live blocks moved there
      m_streams.erase(it);
    }
    for (auto& p : m_pending)
      if (p.stream == stream) p.stream = nullptr;
    move_to_default_stream(m_free, stream);
    for (auto& [id, lists] : m_private) move_to_default_stream(lists, stream);
  }

  // From now until end_private(), allocations on `stream` and blocks freed on it belong to a new
  // private pool, whose id is returned (one capture at a time per device).
  int begin_private(StreamHandle stream) {
    std::lock_guard<std::mutex> lock(m_mutex);
    PIPELINE_CHECK(m_capture_pool == 0,
                   "{}: a CUDA graph capture is already under way; capture one at a time",
                   m_device_name);
    m_capture_pool = ++m_last_pool;
    m_capture_stream = stream;
    m_private[m_capture_pool];
    return m_capture_pool;
  }
  // The capture has ended; the private pool keeps its blocks until release_private().
  void end_private() {
    std::lock_guard<std::mutex> lock(m_mutex);
    m_capture_pool = 0;
    m_capture_stream = nullptr;
  }
  // The graph that used private pool `id` is gone: its cached blocks return to the common pools,
  // and its live ones will when they are freed.
  void release_private(int id) {
    std::lock_guard<std::mutex> lock(m_mutex);
    auto it = m_private.find(id);
    if (it == m_private.end()) return;
    for (auto& [key, ptrs] : it->second) {
      auto& into = m_free[key];
      into.insert(into.end(), ptrs.begin(), ptrs.end());
    }
    m_private.erase(it);
    for (auto& [ptr, b] : m_live)
      if (b.pool == id) b.pool = 0;
    for (auto& p : m_pending)
      if (p.pool == id) p.pool = 0;
  }

  // Gives every cached block back to the driver (blocks waiting for other streams' work are
  // waited for when `wait`, kept otherwise). Called on out-of-memory and at exit.
  void release_cached(bool wait = true) {
    std::lock_guard<std::mutex> lock(m_mutex);
    release_cached_locked(wait);
  }

  PoolStats stats() const {
    std::lock_guard<std::mutex> lock(m_mutex);
    return m_stats;
  }
  StreamUse stream_use(StreamHandle stream) const {
    std::lock_guard<std::mutex> lock(m_mutex);
    auto it = m_streams.find(stream);
    return it == m_streams.end() ? StreamUse{} : it->second;
  }
  // Starts a new peak, of the device and of `stream`'s blocks: each peak = what is in use now.
  void reset_peak(StreamHandle stream) {
    std::lock_guard<std::mutex> lock(m_mutex);
    m_stats.peak_in_use_bytes = m_stats.in_use_bytes;
    if (auto it = m_streams.find(stream); it != m_streams.end())
      it->second.peak_in_use_bytes = it->second.in_use_bytes;
  }
  // Live blocks (allocations not yet freed).
  std::size_t live_blocks() const {
    std::lock_guard<std::mutex> lock(m_mutex);
    return m_live.size();
  }

 private:
  using FreeLists = std::map<std::pair<StreamHandle, std::size_t>, std::vector<void*>>;
  struct Block {
    std::size_t size = 0;
    StreamHandle stream = nullptr;
    std::vector<StreamHandle> other_streams;
    int pool = 0;  // 0: the common pools; else the private pool it belongs to
  };
  struct Pending {
    void* ptr = nullptr;
    std::size_t size = 0;
    StreamHandle stream = nullptr;
    std::vector<EventHandle> events;
    int pool = 0;
  };

  static std::size_t round_up(std::size_t n, std::size_t step) { return (n + step - 1) / step * step; }

  static void* take(FreeLists& lists, std::pair<StreamHandle, std::size_t> key) {
    auto it = lists.find(key);
    if (it == lists.end() || it->second.empty()) return nullptr;
    void* ptr = it->second.back();
    it->second.pop_back();
    return ptr;
  }
  bool capturing(StreamHandle stream) const {
    return m_capture_pool != 0 && stream == m_capture_stream;
  }
  static void move_to_default_stream(FreeLists& lists, StreamHandle stream) {
    for (auto it = lists.lower_bound({stream, 0});
         it != lists.end() && it->first.first == stream;) {
      auto& into = lists[{nullptr, it->first.second}];
      into.insert(into.end(), it->second.begin(), it->second.end());
      it = lists.erase(it);
    }
  }
  FreeLists& free_list(int pool) { return pool == 0 ? m_free : m_private.at(pool); }

  // Moves pending blocks whose other streams have finished with them into the free pools.
  void collect_ready() {
    for (auto it = m_pending.begin(); it != m_pending.end();) {
      bool ready = true;
      for (EventHandle e : it->events) ready = ready && m_driver.event_done(e);
      if (!ready) {
        ++it;
        continue;
      }
      for (EventHandle e : it->events) m_driver.destroy_event(e);
      free_list(it->pool)[{it->stream, it->size}].push_back(it->ptr);
      it = m_pending.erase(it);
    }
  }

  void release_cached_locked(bool wait) {
    if (wait) {
      // Waiting on the host for the other streams: only when memory is needed back.
      for (auto& p : m_pending) {
        for (EventHandle e : p.events) {
          m_driver.wait_event(e);
          m_driver.destroy_event(e);
        }
        free_list(p.pool)[{p.stream, p.size}].push_back(p.ptr);
      }
      m_pending.clear();
    } else {
      collect_ready();
    }
    for (auto& [key, ptrs] : m_free) {
      for (void* ptr : ptrs) {
        m_driver.free(ptr);
        ++m_stats.driver_frees;
        m_stats.cached_bytes -= static_cast<std::int64_t>(key.second);
      }
    }
    m_free.clear();
  }

  PoolDriver m_driver;
  std::string m_device_name;
  mutable std::mutex m_mutex;
  FreeLists m_free;
  std::map<int, FreeLists> m_private;  // by private pool id
  int m_last_pool = 0;
  int m_capture_pool = 0;  // the capture under way, 0 when none
  StreamHandle m_capture_stream = nullptr;
  std::unordered_map<void*, Block> m_live;
  std::list<Pending> m_pending;
  PoolStats m_stats;
  std::unordered_map<StreamHandle, StreamUse> m_streams;
};

}  // namespace pipeline::cuda
