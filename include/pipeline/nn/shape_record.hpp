// A shape kept in a Saved record as a small int32 tensor, so that a layer whose backward needs
// only its input's shape (pooling, flatten) does not keep the input itself alive.
#pragma once

#include <pipeline/core/tensor.hpp>

#include <cstdint>
#include <limits>
#include <vector>

namespace pipeline {

inline Tensor shape_record(const Shape& s) {
  std::vector<std::int32_t> dims;
  for (auto d : s.dims()) {
    PIPELINE_CHECK(d <= std::numeric_limits<std::int32_t>::max(),
                   "extent {} of shape {} is too large to record", d, s);
    dims.push_back(static_cast<std::int32_t>(d));
  }
  return Tensor::from_ints({static_cast<std::int64_t>(dims.size())}, dims);
}

inline Shape shape_from_record(const Tensor& t) {
  PIPELINE_CHECK(t.dtype() == DType::Int32 && t.rank() == 1,
                 "a shape record is a rank-1 int32 tensor, got {} {}", dtype_name(t.dtype()),
                 t.shape());
  std::vector<std::int64_t> dims;
  for (std::int64_t i = 0; i < t.numel(); ++i) dims.push_back(t.data<std::int32_t>()[i]);
  return Shape(std::move(dims));
}

}  // namespace pipeline
