// Eigen views of tensors (private to the CPU op implementations).
#pragma once

#include <pipeline/core/tensor.hpp>

#include <Eigen/Core>

namespace pipeline::ops::detail {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatrixMap = Eigen::Map<RowMatrix, Eigen::Unaligned>;
using ConstMatrixMap = Eigen::Map<const RowMatrix, Eigen::Unaligned>;
using VectorMap = Eigen::Map<Eigen::VectorXf, Eigen::Unaligned>;
using ConstVectorMap = Eigen::Map<const Eigen::VectorXf, Eigen::Unaligned>;

inline MatrixMap as_matrix(Tensor& t, std::int64_t rows, std::int64_t cols) {
  PIPELINE_CHECK(rows * cols == t.numel(), "matrix view {}x{} of a tensor of shape {}", rows, cols, t.shape());
  return {t.data<float>(), rows, cols};
}
inline ConstMatrixMap as_matrix(const Tensor& t, std::int64_t rows, std::int64_t cols) {
  PIPELINE_CHECK(rows * cols == t.numel(), "matrix view {}x{} of a tensor of shape {}", rows, cols, t.shape());
  return {t.data<float>(), rows, cols};
}
inline MatrixMap as_matrix(Tensor& t) {
  PIPELINE_CHECK(t.rank() == 2, "expected a matrix, got shape {}", t.shape());
  return as_matrix(t, t.dim(0), t.dim(1));
}
inline ConstMatrixMap as_matrix(const Tensor& t) {
  PIPELINE_CHECK(t.rank() == 2, "expected a matrix, got shape {}", t.shape());
  return as_matrix(t, t.dim(0), t.dim(1));
}
inline VectorMap as_vector(Tensor& t) { return {t.data<float>(), t.numel()}; }
inline ConstVectorMap as_vector(const Tensor& t) { return {t.data<float>(), t.numel()}; }

}  // namespace pipeline::ops::detail
