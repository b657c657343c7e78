#include <pipeline/cuda/graph.hpp>

#include <pipeline/core/error.hpp>
#include <pipeline/cuda/blas.hpp>
#include <pipeline/cuda/device_memory.hpp>
#include <pipeline/cuda/dnn.hpp>

#include <exception>
#include <mutex>
#include <vector>

namespace pipeline::cuda {

struct Graph::State {
  cudaGraphExec_t exec = nullptr;
  int device = 0;
  int pool = 0;  // the private pool of the capture's allocations
  std::vector<DeferredCheck> checks;

  ~State() {
    checks.clear();  // their status tensors go back to the private pool before it is released
    if (exec != nullptr) (void)cudaGraphExecDestroy(exec);
    if (pool != 0) device_pool(device).release_private(pool);
  }
};

namespace {

// The capture under way on this thread (captures are per thread: cudaStreamCaptureModeThreadLocal).
struct Capture {
  cudaStream_t stream = nullptr;
  std::vector<DeferredCheck>* checks = nullptr;
};
thread_local Capture t_capture;

}  // namespace

bool capturing(cudaStream_t stream) {
  if (stream == nullptr) return false;  // the legacy default stream never captures
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  PIPELINE_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

bool defer_check(cudaStream_t stream, DeferredCheck check) {
  if (t_capture.checks == nullptr || t_capture.stream != stream) {
    PIPELINE_CHECK(!capturing(stream),
                   "a check that reads a result back was asked for inside a CUDA graph capture "
                   "that did not begin here (capture with cuda::Graph::capture)");
    return false;
  }
  t_capture.checks->push_back(std::move(check));
  return true;
}

Graph Graph::capture(const Stream& stream, const std::function<void()>& work) {
  PIPELINE_CHECK(stream.get() != nullptr,
                 "a CUDA graph captures work on a stream of its own, not the legacy default "
                 "stream: make one with cuda::Stream::create");
  DeviceGuard guard(stream.device());
  auto state = std::make_shared<State>();
  state->device = stream.device();
  CachingPool& pool = device_pool(stream.device());
  // The libraries' handles of this thread, made before the capture (their creation allocates and
  // synchronises, which a capture forbids) for work that first meets them inside it.
  prepare_blas(stream.device());
  (void)dnn_handle(stream.device(), stream.get());
  state->pool = pool.begin_private(stream.get());
  t_capture = {stream.get(), &state->checks};
  cudaGraph_t graph = nullptr;
  try {
    // Thread-local mode: an unsafe call of this thread (a synchronous copy, a host wait) fails
    // the capture instead of running outside it; the allocator's cudaMalloc relaxes the mode
    // for itself.
    PIPELINE_CUDA_CHECK(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal));
    try {
      work();
    } catch (...) {
      (void)cudaStreamEndCapture(stream.get(), &graph);
      if (graph != nullptr) (void)cudaGraphDestroy(graph);
      (void)cudaGetLastError();
      throw;
    }
    PIPELINE_CUDA_CHECK(cudaStreamEndCapture(stream.get(), &graph));
    PIPELINE_CUDA_CHECK(cudaGraphInstantiate(&state->exec, graph, 0));
    (void)cudaGraphDestroy(graph);
  } catch (const std::exception& e) {
    t_capture = {};
    pool.end_private();
    PIPELINE_FAIL(CudaError,
                  "capturing a CUDA graph on {} failed: {}. The captured work must only queue "
                  "work on its stream (no host waits or read-backs); run without CUDA graphs",
                  current_device_name(), e.what());
  }
  t_capture = {};
  pool.end_private();
  Graph g;
  g.m_state = std::move(state);
  return g;
}

void Graph::replay(cudaStream_t stream) const {
  PIPELINE_CHECK(m_state != nullptr, "replay of an empty CUDA graph");
  DeviceGuard guard(m_state->device);
  PIPELINE_CUDA_CHECK(cudaGraphLaunch(m_state->exec, stream));
}

void Graph::run_checks(cudaStream_t stream) const {
  if (m_state == nullptr || m_state->checks.empty()) return;
  DeviceGuard guard(m_state->device);
  std::vector<std::vector<unsigned char>> host;
  for (const DeferredCheck& c : m_state->checks) {
    host.emplace_back(c.status.nbytes());
    PIPELINE_CUDA_CHECK(cudaMemcpyAsync(host.back().data(), c.status.raw(), c.status.nbytes(),
                                        cudaMemcpyDeviceToHost, stream));
  }
  PIPELINE_CUDA_CHECK(cudaStreamSynchronize(stream));
  for (std::size_t i = 0; i < host.size(); ++i) m_state->checks[i].check(host[i].data());
}

}  // namespace pipeline::cuda
