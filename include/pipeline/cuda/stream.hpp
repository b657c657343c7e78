// Streams, events and the current stream: the ordering primitives of the CUDA device layer.
//
// Stream and Event are move-only RAII handles; a Stream either owns its cudaStream_t (created
// here, destroyed with it) or borrows one (the legacy default stream, or a caller's), and says
// which. Destructors never throw: a failure while destroying is ignored, since the context it
// belongs to may already be gone.
//
// Every thread has a current stream per device (the legacy default stream until set), which is
// what the caching allocator orders its blocks on and what ops launch on unless told otherwise;
// StreamGuard sets it for a scope. Requires the CUDA toolkit (PIPELINE_WITH_CUDA builds only).
#pragma once

#include <pipeline/cuda/check.hpp>

#include <cuda_runtime.h>

#include <string>
#include <utility>

namespace pipeline::cuda {

// CUDA devices visible to this process; 0 without a driver or a GPU (never throws).
int device_count();

// "cuda: NVIDIA H100 80GB HBM3 (cuda:0, sm_90, 79.1 GiB)": a profile's `device` string.
std::string device_description(int device);

// Makes `device` current for the calling thread for its scope, and restores the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int m_previous = -1;
};

class Stream {
 public:
  Stream() = default;  // the legacy default stream of device 0, borrowed
  // A new non-blocking stream on `device`, owned.
  static Stream create(int device);
  // `stream` of `device`, not owned (never destroyed here).
  static Stream borrow(cudaStream_t stream, int device) { return Stream(stream, device, false); }

  Stream(Stream&& o) noexcept
      : m_stream(std::exchange(o.m_stream, nullptr)),
        m_device(o.m_device),
        m_owned(std::exchange(o.m_owned, false)) {}
  Stream& operator=(Stream&& o) noexcept {
    if (this != &o) {
      reset();
      m_stream = std::exchange(o.m_stream, nullptr);
      m_device = o.m_device;
      m_owned = std::exchange(o.m_owned, false);
    }
    return *this;
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream() { reset(); }

  cudaStream_t get() const { return m_stream; }
  int device() const { return m_device; }
  bool owned() const { return m_owned; }
  // Blocks the host until everything queued on the stream has run (CudaError if any failed).
  void synchronize() const;

 private:
  Stream(cudaStream_t s, int device, bool owned) : m_stream(s), m_device(device), m_owned(owned) {}
  void reset() noexcept;

  cudaStream_t m_stream = nullptr;
  int m_device = 0;
  bool m_owned = false;
};

class Event {
 public:
  Event() = default;  // no event
  // A new event on `device`; `timing` events can measure elapsed time (and cost a little more).
  static Event create(int device, bool timing = false);

  Event(Event&& o) noexcept
      : m_event(std::exchange(o.m_event, nullptr)), m_device(o.m_device) {}
  Event& operator=(Event&& o) noexcept {
    if (this != &o) {
      reset();
      m_event = std::exchange(o.m_event, nullptr);
      m_device = o.m_device;
    }
    return *this;
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event() { reset(); }

  cudaEvent_t get() const { return m_event; }
  // Marks the point in `stream` that everything queued on it so far reaches.
  void record(cudaStream_t stream);
  // Whether the recorded work has completed (true for an event never recorded).
  bool done() const;
  void synchronize() const;
  // Makes `stream` wait (on the device, not the host) for the recorded work.
  void block(cudaStream_t stream) const;
  // Milliseconds between two recorded timing events (`end` after `start`).
  static float elapsed_ms(const Event& start, const Event& end);

 private:
  void reset() noexcept;

  cudaEvent_t m_event = nullptr;
  int m_device = 0;
};

// The calling thread's current stream on `device` (the legacy default stream until set).
cudaStream_t current_stream(int device);

// Sets the calling thread's current stream on the stream's device for its scope.
class StreamGuard {
 public:
  explicit StreamGuard(const Stream& stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  int m_device;
  cudaStream_t m_previous;
};

}  // namespace pipeline::cuda
