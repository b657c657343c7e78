// CUDA graphs: the work queued on one stream, captured once and replayed with one launch.
//
// Why: a training step of a small model is hundreds of kernel launches of a few microseconds
// each, so the host's launch overhead, not the GPU, sets its pace. Captured into a graph, the same
// kernels with the same arguments and addresses are replayed by one cudaGraphLaunch.
//
// What the captured work must do: only queue work (no host waits on the stream, no results read
// back during the capture), and use addresses that stay valid for every replay. Inputs live in
// tensors the caller refills before each replay; memory the work allocates comes from the
// capture's private pool (caching_pool.hpp), which nothing else reuses while the graph lives;
// values that change from one replay to the next (the learning rate) are read from device memory.
//
// Checks that read a value back (an id out of range) cannot wait inside a capture: an op calls
// defer_check() instead, and the graph runs its check after each replay (run_checks()).
// Requires the CUDA toolkit (PIPELINE_WITH_CUDA builds only).
#pragma once

#include <pipeline/core/tensor.hpp>
#include <pipeline/cuda/stream.hpp>

#include <cuda_runtime.h>

#include <functional>
#include <memory>
#include <vector>

namespace pipeline::cuda {

// A check an op could not make inside a capture: `status` holds what its kernel wrote (device
// memory that lives as long as the graph); `check` gets its bytes on the host and throws.
struct DeferredCheck {
  Tensor status;
  std::function<void(const void* host_bytes)> check;
};

class Graph {
 public:
  Graph() = default;
  // Captures what `work` queues on `stream` (a stream of our own: the legacy default stream
  // cannot capture). Nothing runs yet: replay() runs it. If `work` throws, or queues something a
  // capture cannot hold, the capture is abandoned and CudaError names the cause.
  static Graph capture(const Stream& stream, const std::function<void()>& work);

  Graph(Graph&&) noexcept = default;
  Graph& operator=(Graph&&) noexcept = default;
  ~Graph() = default;

  bool empty() const { return m_state == nullptr; }
  // Queues the captured work on `stream`.
  void replay(cudaStream_t stream) const;
  // Waits for `stream` and runs the checks deferred during the capture on what the last replay
  // wrote (nothing to wait for when there are none).
  void run_checks(cudaStream_t stream) const;

 private:
  struct State;  // the executable graph, its private pool and its deferred checks
  std::shared_ptr<State> m_state;
};

// Whether `stream` is capturing a graph now.
bool capturing(cudaStream_t stream);

// While `stream` captures a graph: keeps `check` to run after each replay of it and returns
// true. Otherwise returns false, and the caller reads `status` back and checks it at once.
bool defer_check(cudaStream_t stream, DeferredCheck check);

}  // namespace pipeline::cuda
