#include <pipeline/cuda/device_memory.hpp>

#include <pipeline/core/threads.hpp>
#include <pipeline/cuda/stream.hpp>

#include "elementwise.cuh"
#include "fill.cuh"

#include <memory>
#include <mutex>
#include <vector>

namespace pipeline::cuda {

namespace {

PoolDriver cuda_driver(int device) {
  PoolDriver d;
  d.allocate = [device](std::size_t bytes) -> void* {
    DeviceGuard guard(device);
    void* p = nullptr;
    // Inside a graph capture of this thread cudaMalloc is an "unsafe" call; a new block for the
    // capture's private pool is legitimate (it is not part of the captured work), so the capture
    // mode is relaxed around it.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    PIPELINE_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    const cudaError_t e = cudaMalloc(&p, bytes);
    PIPELINE_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // not sticky: the pool releases its cache and retries
      return nullptr;
    }
    PIPELINE_CUDA_CHECK(e);
    return p;
  };
  d.free = [device](void* p) {
    DeviceGuard guard(device);
    PIPELINE_CUDA_CHECK(cudaFree(p));
  };
  d.record_event = [device](StreamHandle stream) -> EventHandle {
    DeviceGuard guard(device);
    cudaEvent_t e = nullptr;
    PIPELINE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    PIPELINE_CUDA_CHECK(cudaEventRecord(e, static_cast<cudaStream_t>(stream)));
    return e;
  };
  d.event_done = [](EventHandle event) {
    const cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(event));
    if (e == cudaErrorNotReady) return false;
    PIPELINE_CUDA_CHECK(e);
    return true;
  };
  d.wait_event = [](EventHandle event) {
    PIPELINE_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
  };
  d.destroy_event = [](EventHandle event) { (void)cudaEventDestroy(static_cast<cudaEvent_t>(event)); };
  return d;
}

std::mutex g_pools_mutex;
std::vector<CachingPool*> g_pools;  // by device; leaked on purpose (see the header)

void* allocate(std::size_t bytes, int device) {
  return device_pool(device).allocate(bytes, current_stream(device));
}

void deallocate(void* ptr, int device) noexcept { device_pool(device).deallocate(ptr); }

void copy(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes) {
  const int device = dst_device.is_cuda() ? dst_device.index : src_device.index;
  DeviceGuard guard(device);
  cudaStream_t stream = current_stream(device);
  PIPELINE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream));
  // The host side may be read or reused as soon as this returns; so may both sides of a copy
  // between two GPUs, whose source no stream of its own device orders.
  if (dst_device != src_device) PIPELINE_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void zero(void* dst, int device, std::size_t bytes) {
  DeviceGuard guard(device);
  PIPELINE_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, current_stream(device)));
}

void fill(float* dst, int device, float value, std::size_t count) {
  DeviceGuard guard(device);
  kernels::fill_f32(current_stream(device), dst, value, count);
}

void add(float* acc, const float* x, int device, std::size_t count) {
  DeviceGuard guard(device);
  kernels::add_in_place(current_stream(device), acc, x, static_cast<std::int64_t>(count));
}

std::shared_ptr<void> mark(int device) {
  DeviceGuard guard(device);
  cudaEvent_t e = nullptr;
  PIPELINE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  std::shared_ptr<void> owned(e,
                              [](void* p) { (void)cudaEventDestroy(static_cast<cudaEvent_t>(p)); });
  PIPELINE_CUDA_CHECK(cudaEventRecord(e, current_stream(device)));
  return owned;
}

void wait_for(const std::shared_ptr<void>& m, int device) {
  if (!m) return;
  DeviceGuard guard(device);
  PIPELINE_CUDA_CHECK(
      cudaStreamWaitEvent(current_stream(device), static_cast<cudaEvent_t>(m.get()), 0));
}

// The calling rank's blocks: the whole device's in a process of its own, its stream's when the
// ranks are threads of this process (each with its own stream).
MemoryUse memory_use(int device) {
  CachingPool& pool = device_pool(device);
  if (ranks_per_process() > 1) {
    const StreamUse u = pool.stream_use(current_stream(device));
    return {u.in_use_bytes, u.peak_in_use_bytes};
  }
  const PoolStats s = pool.stats();
  return {s.in_use_bytes, s.peak_in_use_bytes};
}

void reset_peak(int device) {
  device_pool(device).reset_peak(current_stream(device));
}

void used_here(const void* storage, int device) {
  device_pool(device).record_stream(const_cast<void*>(storage), current_stream(device));
}

}  // namespace

CachingPool& device_pool(int device) {
  std::lock_guard<std::mutex> lock(g_pools_mutex);
  const int n = device_count();
  PIPELINE_CHECK_AS(ConfigError, device >= 0 && device < n,
                    "cuda:{} does not exist: this process sees {} CUDA device(s){}", device, n,
                    n == 0 ? " (no GPU or no driver; CUDA_VISIBLE_DEVICES may hide them)" : "");
  if (g_pools.size() <= static_cast<std::size_t>(device))
    g_pools.resize(static_cast<std::size_t>(device) + 1, nullptr);
  auto& pool = g_pools[static_cast<std::size_t>(device)];
  if (pool == nullptr) pool = new CachingPool(cuda_driver(device), "cuda:" + std::to_string(device));
  return *pool;
}

PoolStats device_memory_stats(int device) { return device_pool(device).stats(); }

void record_stream(const Tensor& t, cudaStream_t stream) {
  PIPELINE_CHECK(t.device().is_cuda(), "record_stream: the tensor is on {}, not a CUDA device",
                 t.device().str());
  device_pool(t.device().index).record_stream(const_cast<void*>(t.storage_id()), stream);
}

void install_device_hooks() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto& a = cuda_allocator();
    a.deallocate = deallocate;
    a.copy = copy;
    a.zero = zero;
    a.fill = fill;
    a.add = add;
    a.mark = mark;
    a.wait_for = wait_for;
    a.used_here = used_here;
    a.memory_use = memory_use;
    a.reset_peak = reset_peak;
    a.allocate = allocate;  // last: the core tests it to know whether the hooks are in
  });
}

}  // namespace pipeline::cuda
