// Staging batches on the training device one step ahead, so that host-to-device copies overlap
// the previous step's compute.
//
// stage(b) copies the batch into pinned (page-locked) host memory and queues its transfer on a
// side stream of the device; take() hands it over to the calling thread's current stream (which
// waits for the transfer on the device, not the host) and returns the device tensors. Two pinned
// buffers alternate, so staging the next batch never overwrites one still in flight. On the CPU
// both are pass-throughs. One stage() per take(), in that order.
#pragma once

#include <pipeline/core/device.hpp>
#include <pipeline/data/dataset.hpp>

#include <memory>

namespace pipeline {

class DevicePrefetcher {
 public:
  explicit DevicePrefetcher(Device device);
  ~DevicePrefetcher();
  DevicePrefetcher(const DevicePrefetcher&) = delete;
  DevicePrefetcher& operator=(const DevicePrefetcher&) = delete;

  Device device() const { return m_device; }
  void stage(const Batch& host);
  Batch take();

 private:
  struct Impl;  // the CUDA side (src/data/device_prefetch.cpp)
  Device m_device;
  Batch m_staged;
  bool m_has_staged = false;
  std::unique_ptr<Impl> m_impl;
};

}  // namespace pipeline
