// Launchers of the direct convolution kernels (conv_direct.cu) for convolutions with a shallow
// window: C·KH·KW <= kDirectConvMaxDepth taps per output and at most kDirectConvMaxOutputs
// outputs (a network's first layer: 1 or 3 input channels). CPU reference: ops::conv2d_forward
// and ops::conv2d_backward_filter.
//
// Why: cuDNN lowers such a convolution to a product whose inner dimension is the window's 25 or
// 27 taps, which no exact float32 algorithm runs well: fashion-cnn's first layer (1 channel, 5x5,
// 32 outputs, batch 64) took 0.08 ms forward and 0.26-0.29 ms for its weight gradient on an H100,
// for 0.1 GFLOP in all. The ops offer these kernels to cuDNN's timed algorithm choice
// (cuda::ConvKernel, cuda/dnn.hpp), so a shape takes them only where they measured faster.
//
// NCHW float32 device memory, PyTorch's weight layout [M, C, KH, KW]; asynchronous on `stream`.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace pipeline::kernels {

constexpr int kDirectConvMaxDepth = 32;    // C·KH·KW
constexpr int kDirectConvMaxOutputs = 64;  // M

struct DirectConv {
  int n = 0, c = 0, h = 0, w = 0;  // input
  int m = 0, kh = 0, kw = 0;       // output channels, window
  int sh = 1, sw = 1, ph = 0, pw = 0;
  int oh = 0, ow = 0;  // output extents
};

// Whether the direct kernels take this convolution.
bool direct_conv_applies(const DirectConv& p);

// y = conv(x, weight) (overwritten; no bias).
void direct_conv_forward(cudaStream_t stream, const DirectConv& p, const float* x,
                         const float* weight, float* y);

// Bytes of device workspace direct_conv_backward_filter needs.
std::size_t direct_conv_backward_filter_workspace(const DirectConv& p);

// dweight = beta · dweight + Σ_{n, oh, ow} dy ⋆ x, summed in an order that depends on the shape
// alone: the same bits on every run.
void direct_conv_backward_filter(cudaStream_t stream, const DirectConv& p, const float* x,
                                 const float* dy, float beta, float* dweight, void* workspace);

}  // namespace pipeline::kernels
