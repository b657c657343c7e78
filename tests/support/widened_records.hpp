// What a layer kept for its backward with every bfloat16 tensor widened to float32 (on its
// device), recursively: the records the layers kept before they kept product operands in bf16,
// for the tests that check both give the same gradients.
#pragma once

#include <pipeline/nn/layer.hpp>
#include <pipeline/ops/convert.hpp>

namespace pipeline::testing {

inline Saved widened(const Saved& saved) {
  Saved w;
  for (const Tensor& t : saved.tensors)
    w.tensors.push_back(t.dtype() == DType::BFloat16 ? ops::to_dtype(t, DType::Float32) : t);
  for (const Saved& c : saved.children) w.children.push_back(widened(c));
  w.child_output_grads = saved.child_output_grads;
  return w;
}

}  // namespace pipeline::testing
