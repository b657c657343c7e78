// Element-wise arithmetic between tensors: the residual additions of composite layers.
//
// acc and x are float32 tensors of equal element count (any shapes) on one device (a mixed call
// is a ConfigError naming both); acc may not partially overlap x (acc == x doubles it). On the
// CPU one OpenMP-SIMD loop, on CUDA one kernel: a single float addition per element either way,
// so the two agree bitwise.
#pragma once

#include <pipeline/core/tensor.hpp>

namespace pipeline::ops {

// acc += x.
void add_in_place(Tensor& acc, const Tensor& x);

}  // namespace pipeline::ops
