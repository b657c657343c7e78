// 2-D pooling on NCHW float32 tensors: max, average and global average.
//
// Shapes: x [N, C, H, W] -> y [N, C, OH, OW] with OH, OW from Window2d (floor mode, as PyTorch).
// Padding never wins a max (it counts as −inf) and counts as zeros in an average, whose divisor
// is always KH·KW (PyTorch's default count_include_pad=True). Padding may be at most half the
// kernel, as in PyTorch, so every window holds at least one input element.
//   max_pool2d_forward writes y and, in `indices` (Int32, the shape of y), the position
//   ih·W + iw of each maximum inside its plane (the first one on ties; NaN propagates);
//   max_pool2d_backward routes dy there. Backward functions overwrite dx.
//
// Every op runs on the CPU or on a CUDA device (all its tensors on one device; mixed devices are
// a ConfigError naming both). On CUDA the results equal the CPU's: maxima and indices exactly,
// the max pool's gradient bit for bit, the averages to float rounding.
#pragma once

#include <pipeline/core/tensor.hpp>
#include <pipeline/ops/window2d.hpp>

namespace pipeline::ops {

// Checks the window against the input (including the half-kernel bound on padding).
Shape pool2d_output_shape(const Shape& x, const Window2d& window);

void max_pool2d_forward(const Tensor& x, Tensor& y, Tensor& indices, const Window2d& window);
void max_pool2d_backward(const Tensor& dy, const Tensor& indices, Tensor& dx);
// The same, told the forward's window (which it checks against the shapes): on CUDA each input
// element then gathers its gradient from the windows covering it, where the form above must walk
// each plane's outputs serially (it does not know which windows overlap). Indices that are no
// position of their window are ignored on CUDA rather than reported: they can only come from
// somewhere other than max_pool2d_forward. Layers call this form.
void max_pool2d_backward(const Tensor& dy, const Tensor& indices, Tensor& dx,
                         const Window2d& window);

void avg_pool2d_forward(const Tensor& x, Tensor& y, const Window2d& window);
void avg_pool2d_backward(const Tensor& dy, Tensor& dx, const Window2d& window);

// [N, C, H, W] -> [N, C]: the mean of each plane.
void global_avg_pool_forward(const Tensor& x, Tensor& y);
void global_avg_pool_backward(const Tensor& dy, Tensor& dx);

}  // namespace pipeline::ops
