// Tensor: a dense, contiguous, row-major array with a shape, an element type and a device.
//
// Storage is shared: copying a Tensor copies a handle, not the data (use clone() for a deep
// copy). Views — slices along the outermost dimension and reshapes — share the storage of the
// tensor they come from without copying, which is how a minibatch is cut into microbatches.
// Element access through data<T>() is only valid on the CPU; device tensors are reached through
// ops that dispatch on device().
#pragma once

#include <pipeline/core/allocator.hpp>
#include <pipeline/core/device.hpp>
#include <pipeline/core/dtype.hpp>
#include <pipeline/core/error.hpp>
#include <pipeline/core/shape.hpp>
#include <pipeline/core/threads.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <type_traits>
#include <vector>

namespace pipeline {

class Tensor {
 public:
  Tensor() = default;

  // Uninitialised storage.
  static Tensor empty(Shape shape, DType dtype = DType::Float32, Device device = Device::cpu()) {
    // The byte count below must not wrap: a wrapped count allocates a few bytes for a tensor
    // that claims many more elements.
    PIPELINE_CHECK_AS(ConfigError,
                      static_cast<std::uint64_t>(shape.numel()) <=
                          std::numeric_limits<std::size_t>::max() / dtype_size(dtype),
                      "a tensor of shape {} needs more bytes than memory can address", shape);
    Tensor t;
    t.m_shape = std::move(shape);
    t.m_dtype = dtype;
    t.m_device = device;
    t.m_storage_bytes = static_cast<std::size_t>(t.m_shape.numel()) * dtype_size(dtype);
    t.m_storage = allocate_bytes(t.m_storage_bytes, device);
    return t;
  }
  static Tensor zeros(Shape shape, DType dtype = DType::Float32, Device device = Device::cpu()) {
    Tensor t = empty(std::move(shape), dtype, device);
    t.zero();
    return t;
  }
  static Tensor full(Shape shape, float value, Device device = Device::cpu()) {
    Tensor t = empty(std::move(shape), DType::Float32, device);
    t.fill(value);
    return t;
  }
  static Tensor from_ints(Shape shape, const std::vector<std::int32_t>& values) {
    PIPELINE_CHECK(shape.numel() == static_cast<std::int64_t>(values.size()),
                   "from_ints: shape {} holds {} elements but {} values were given", shape,
                   shape.numel(), values.size());
    Tensor t = empty(std::move(shape), DType::Int32);
    std::copy(values.begin(), values.end(), t.data<std::int32_t>());
    return t;
  }
  static Tensor from_vector(Shape shape, const std::vector<float>& values) {
    PIPELINE_CHECK(shape.numel() == static_cast<std::int64_t>(values.size()),
                   "from_vector: shape {} holds {} elements but {} values were given", shape,
                   shape.numel(), values.size());
    Tensor t = empty(std::move(shape));
    std::copy(values.begin(), values.end(), t.data<float>());
    return t;
  }

  bool defined() const { return m_storage != nullptr; }
  const Shape& shape() const { return m_shape; }
  int rank() const { return m_shape.rank(); }
  std::int64_t dim(int i) const { return m_shape[i]; }
  std::int64_t numel() const { return m_shape.numel(); }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(m_dtype); }
  DType dtype() const { return m_dtype; }
  Device device() const { return m_device; }

  void* raw() { return m_storage.get() + m_offset; }
  const void* raw() const { return m_storage.get() + m_offset; }

  template <typename T>
  T* data() {
    check_host_access<T>();
    return reinterpret_cast<T*>(raw());
  }
  template <typename T>
  const T* data() const {
    check_host_access<T>();
    return reinterpret_cast<const T*>(raw());
  }
  // The elements on the tensor's own device (a device pointer for a CUDA tensor): for kernels
  // and copies, never for host access.
  template <typename T>
  T* device_data() {
    check_dtype<T>();
    return reinterpret_cast<T*>(raw());
  }
  template <typename T>
  const T* device_data() const {
    check_dtype<T>();
    return reinterpret_cast<const T*>(raw());
  }

  std::span<float> values() { return {data<float>(), static_cast<std::size_t>(numel())}; }
  std::span<const float> values() const {
    return {data<float>(), static_cast<std::size_t>(numel())};
  }
  std::vector<float> to_vector() const { return {values().begin(), values().end()}; }

  // Rows [begin, end) of the outermost dimension, sharing storage.
  Tensor slice(std::int64_t begin, std::int64_t end) const {
    PIPELINE_CHECK(rank() >= 1, "slice of a rank-0 tensor");
    PIPELINE_CHECK(0 <= begin && begin <= end && end <= dim(0),
                   "slice [{}, {}) out of range for shape {}", begin, end, m_shape);
    Tensor t = *this;
    std::size_t row_bytes = static_cast<std::size_t>(m_shape.inner()) * dtype_size(m_dtype);
    t.m_offset += static_cast<std::size_t>(begin) * row_bytes;
    t.m_shape[0] = end - begin;
    return t;
  }

  // The same elements under another shape of equal size, sharing storage.
  Tensor reshape(Shape shape) const {
    PIPELINE_CHECK(shape.numel() == numel(), "cannot reshape {} ({} elements) to {} ({} elements)",
                   m_shape, numel(), shape, shape.numel());
    Tensor t = *this;
    t.m_shape = std::move(shape);
    return t;
  }

  Tensor clone() const {
    Tensor t = empty(m_shape, m_dtype, m_device);
    t.copy_from(*this);
    return t;
  }

  // The same elements on `device`: this tensor when it is already there, else a copy (complete
  // when it returns if either side is the CPU; see DeviceAllocator::copy).
  Tensor to(Device device) const {
    if (device == m_device) return *this;
    Tensor t = empty(m_shape, m_dtype, device);
    t.copy_from(*this);
    return t;
  }

  // Copies the elements of src (same element count and dtype, any device) into this tensor.
  void copy_from(const Tensor& src) {
    PIPELINE_CHECK(src.numel() == numel() && src.dtype() == dtype(),
                   "copy_from: source {} does not match destination {}", src.shape(), shape());
    if (nbytes() == 0) return;
    if (m_device.is_cpu() && src.device().is_cpu()) {
      copy_bytes(raw(), src.raw(), nbytes());
      return;
    }
    const Device on = m_device.is_cpu() ? src.device() : m_device;
    device_functions(on).copy(raw(), m_device, src.raw(), src.device(), nbytes());
  }

  void fill(float value) {
    if (m_device.is_cpu()) {
      std::fill_n(data<float>(), numel(), value);
      return;
    }
    check_dtype<float>();
    if (numel() > 0)
      device_functions(m_device).fill(device_data<float>(), m_device.index, value,
                                      static_cast<std::size_t>(numel()));
  }
  void zero() {
    if (nbytes() == 0) return;
    if (m_device.is_cpu())
      zero_bytes(raw(), nbytes());
    else
      device_functions(m_device).zero(raw(), m_device.index, nbytes());
  }

  // True when both tensors view the same bytes (used to detect in-place aliasing).
  bool same_storage(const Tensor& o) const { return m_storage == o.m_storage; }
  // The allocation this tensor views (null when undefined), where its bytes end in it, and its
  // size: what a memory count needs to count storage shared by several views once.
  const void* storage_id() const { return m_storage.get(); }
  std::size_t storage_end() const { return m_offset + nbytes(); }
  std::size_t storage_bytes() const { return m_storage_bytes; }

 private:
  template <typename T>
  void check_host_access() const {
    PIPELINE_CHECK(m_device.is_cpu(), "host access to a tensor on {}: copy it to the CPU first",
                   m_device.str());
    check_dtype<T>();
  }
  template <typename T>
  void check_dtype() const {
    if constexpr (std::is_same_v<T, float>)
      PIPELINE_CHECK(m_dtype == DType::Float32, "float access to a {} tensor", dtype_name(m_dtype));
    else if constexpr (std::is_same_v<T, std::int32_t>)
      PIPELINE_CHECK(m_dtype == DType::Int32, "int32 access to a {} tensor", dtype_name(m_dtype));
    else
      PIPELINE_CHECK(sizeof(T) == dtype_size(m_dtype), "{}-byte access to a {} tensor", sizeof(T),
                     dtype_name(m_dtype));
  }

  std::shared_ptr<std::byte> m_storage;
  std::size_t m_storage_bytes = 0;
  std::size_t m_offset = 0;
  Shape m_shape;
  DType m_dtype = DType::Float32;
  Device m_device;
};

// t.zero() for every tensor, the CPU ones in one parallel region (zero_bytes over all of them).
inline void zero_all(std::span<Tensor> tensors) {
  std::vector<ByteRange> cpu;
  for (Tensor& t : tensors) {
    if (t.nbytes() == 0) continue;
    if (t.device().is_cpu())
      cpu.push_back({t.raw(), t.nbytes()});
    else
      t.zero();
  }
  zero_bytes(cpu);
}

}  // namespace pipeline
