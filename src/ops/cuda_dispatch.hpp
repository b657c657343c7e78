// How the ops reach their CUDA kernels (private to src/ops/, PIPELINE_WITH_CUDA builds only).
//
// An op whose tensors are on a CUDA device runs there: every defined tensor it is given must be
// on that one device (a mixed call is a ConfigError naming the op and both devices), the device
// is made current for the call, and the kernels are queued on the calling thread's current stream
// of that device (cuda::current_stream), which is also the stream the caching allocator orders
// the op's scratch memory on. All-CPU calls return Device::cpu() and take the CPU code unchanged.
#pragma once

#if PIPELINE_WITH_CUDA

#include <pipeline/core/tensor.hpp>
#include <pipeline/cuda/stream.hpp>

#include <cstddef>
#include <initializer_list>

namespace pipeline::ops::detail {

// The device of the defined tensors among `tensors` (null entries and undefined tensors are
// skipped; Device::cpu() when there are none).
inline Device common_device(const char* op, std::initializer_list<const Tensor*> tensors) {
  const Tensor* first = nullptr;
  for (const Tensor* t : tensors) {
    if (t == nullptr || !t->defined()) continue;
    if (first == nullptr) {
      first = t;
      continue;
    }
    PIPELINE_CHECK_AS(ConfigError, t->device() == first->device(),
                      "{}: its tensors are on {} and {}; move them to one device first", op,
                      first->device().str(), t->device().str());
  }
  return first != nullptr ? first->device() : Device::cpu();
}

// The device made current and its current stream, for the scope of one op call.
class CudaScope {
 public:
  explicit CudaScope(Device device)
      : m_guard(device.index), m_device(device), m_stream(cuda::current_stream(device.index)) {}
  cudaStream_t stream() const { return m_stream; }
  Device device() const { return m_device; }

  // Uninitialised device memory for a kernel's scratch, freed (stream-ordered) with the tensor.
  Tensor scratch_floats(std::int64_t n) const {
    return Tensor::empty(Shape{n > 0 ? n : 0}, DType::Float32, m_device);
  }
  Tensor scratch_bytes(std::size_t bytes) const {
    return scratch_floats(static_cast<std::int64_t>((bytes + sizeof(float) - 1) / sizeof(float)));
  }

 private:
  cuda::DeviceGuard m_guard;
  Device m_device;
  cudaStream_t m_stream;
};

}  // namespace pipeline::ops::detail

#endif  // PIPELINE_WITH_CUDA
