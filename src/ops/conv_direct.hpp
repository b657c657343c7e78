// Internal: the direct CPU forward convolution and weight gradient for inputs of few channels (a
// network's first layer on grayscale or RGB images), stride 1, on AVX-512.
//
// With one input channel a 5x5 convolution lowers to a product of depth 25 (fashion-cnn's conv1:
// [32 x 25] by [25 x 784] per sample), too shallow for Eigen's packed gemm to pay for its packing:
// the forward ran at 110-120 GFLOP/s on two cores. Here the sums run as written: 32 output columns
// of a row in two vectors, 8 output channels at a time in registers, each input row (zero-bordered
// into a small buffer) loaded once per tap and multiplied by broadcast weights: 1.55-1.8x. (The
// input gradient, which a first layer does not compute, stays lowered.)
//
// The weight gradient sums dy ⋆ x over the batch in register tiles of 4 output channels by one
// kernel row's taps (20 vectors of partial sums for 5x5), each thread running every sample through
// its own tiles and reducing the lanes once at the end: 1.6-1.7x the lowered one, whose im2col
// matrix and Eigen's packing of both operands moved ~20 MiB for fashion-cnn's 80 MFLOP. (Earlier,
// one vector accumulator per tap over one channel at a time came out no faster than lowering.)
// Each output is summed by one thread in a fixed order: the same bits for any thread count.
#pragma once

#include <cstdint>

namespace pipeline::ops::detail {

struct DirectConvProblem {
  std::int64_t n, c, h, w;  // input
  std::int64_t m, oh, ow;   // output channels and extents
  std::int64_t kh, kw, ph, pw;
};

// Whether direct_conv_forward and direct_conv_backward_filter take this convolution: an AVX-512
// build, at most 4 input channels, stride 1, kernels up to 7x7.
bool direct_conv_suits(const DirectConvProblem& p, std::int64_t stride_h, std::int64_t stride_w);

// y = conv(x, weight) + bias (bias may be null); NCHW float32.
void direct_conv_forward(const DirectConvProblem& p, const float* x, const float* weight,
                         const float* bias, float* y);

// dweight += Σ_n dy ⋆ x (the weight gradient, accumulated); NCHW float32.
void direct_conv_backward_filter(const DirectConvProblem& p, const float* x, const float* dy,
                                 float* dweight);

}  // namespace pipeline::ops::detail
