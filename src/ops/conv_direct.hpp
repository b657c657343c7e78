// Internal: the direct CPU forward convolution for inputs of few channels (a network's first
// layer on grayscale or RGB images), stride 1, on AVX-512.
//
// With one input channel a 5x5 convolution lowers to a product of depth 25 (fashion-cnn's conv1:
// [32 x 25] by [25 x 784] per sample), too shallow for Eigen's packed gemm to pay for its packing:
// the forward ran at 110-120 GFLOP/s on two cores. Here the sums run as written: 32 output columns
// of a row in two vectors, 8 output channels at a time in registers, each input row (zero-bordered
// into a small buffer) loaded once per tap and multiplied by broadcast weights: 1.55-1.8x. (The
// weight gradient written the same way — one vector accumulator per tap, reduced at the end — came
// out no faster than the lowered one and stays lowered; so does the input gradient, which a first
// layer does not compute.) Each output is summed by one thread in a fixed order: the same bits
// for any thread count.
#pragma once

#include <cstdint>

namespace pipeline::ops::detail {

struct DirectConvProblem {
  std::int64_t n, c, h, w;  // input
  std::int64_t m, oh, ow;   // output channels and extents
  std::int64_t kh, kw, ph, pw;
};

// Whether direct_conv_forward takes this convolution: an AVX-512 build, at most 4 input channels,
// stride 1, kernels up to 7x7.
bool direct_conv_suits(const DirectConvProblem& p, std::int64_t stride_h, std::int64_t stride_w);

// y = conv(x, weight) + bias (bias may be null); NCHW float32.
void direct_conv_forward(const DirectConvProblem& p, const float* x, const float* weight,
                         const float* bias, float* y);

}  // namespace pipeline::ops::detail
