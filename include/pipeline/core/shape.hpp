// Shape: the extents of a row-major tensor, outermost first (NCHW for images, [rows, cols] for
// matrices). Extents are int64 so that element counts of large activations never overflow.
#pragma once

#include <pipeline/core/error.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace pipeline {

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<std::int64_t> dims) : m_dims(dims) { validate(); }
  explicit Shape(std::vector<std::int64_t> dims) : m_dims(std::move(dims)) { validate(); }

  int rank() const { return static_cast<int>(m_dims.size()); }
  // Negative indices count from the back, as in Python.
  std::int64_t operator[](int i) const { return m_dims.at(normalize(i)); }
  std::int64_t& operator[](int i) { return m_dims.at(normalize(i)); }
  const std::vector<std::int64_t>& dims() const { return m_dims; }

  std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto d : m_dims) n *= d;
    return n;
  }
  // Product of the extents after the first: the size of one sample for batched tensors.
  std::int64_t inner() const {
    return m_dims.empty() ? 1 : numel() / std::max<std::int64_t>(m_dims[0], 1);
  }

  // The same shape with the outermost (batch) extent replaced.
  Shape with_batch(std::int64_t n) const {
    PIPELINE_CHECK(!m_dims.empty(), "with_batch on a rank-0 shape");
    Shape s = *this;
    s.m_dims[0] = n;
    return s;
  }

  // A batch of `n` samples of this shape: {n, dims...}.
  Shape batched(std::int64_t n) const {
    std::vector<std::int64_t> dims{n};
    dims.insert(dims.end(), m_dims.begin(), m_dims.end());
    return Shape(std::move(dims));
  }

  bool operator==(const Shape&) const = default;
  std::string str() const { return fmt::format("[{}]", fmt::join(m_dims, ", ")); }

 private:
  int normalize(int i) const {
    int r = rank();
    int j = i < 0 ? i + r : i;
    PIPELINE_CHECK(j >= 0 && j < r, "dimension {} out of range for shape {}", i, str());
    return j;
  }
  // Extents are non-negative and their product fits numel()'s int64, so no shape read from a
  // file can make an element count overflow.
  void validate() const {
    std::int64_t n = 1;
    for (auto d : m_dims) {
      PIPELINE_CHECK_AS(ConfigError, d >= 0, "negative extent {} in shape", d);
      PIPELINE_CHECK_AS(ConfigError, !__builtin_mul_overflow(n, d, &n),
                        "shape {} has more elements than a 64-bit count holds", str());
    }
  }

  std::vector<std::int64_t> m_dims;
};

}  // namespace pipeline

template <>
struct fmt::formatter<pipeline::Shape> : fmt::formatter<std::string> {
  auto format(const pipeline::Shape& s, format_context& ctx) const {
    return fmt::formatter<std::string>::format(s.str(), ctx);
  }
};
