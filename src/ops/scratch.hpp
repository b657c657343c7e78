// Internal: uninitialised float scratch for the CPU ops, from the caching host allocator.
#pragma once

#include <pipeline/core/tensor.hpp>

#include <algorithm>
#include <cstdint>

namespace pipeline::ops::detail {

// Always written before it is read, so zeroing it would be waste. Coming from the caching host
// allocator, it is reused step after step and counted in its bytes in use like every other
// buffer of a pass (the profiler's workspace_bytes).
class Scratch {
 public:
  explicit Scratch(std::int64_t floats)
      : m_storage(Tensor::empty(Shape{std::max<std::int64_t>(floats, 1)}, DType::Float32)) {}
  float* get() { return m_storage.data<float>(); }

 private:
  Tensor m_storage;
};

}  // namespace pipeline::ops::detail
