// Launchers of the per-channel bias kernels of NCHW tensors (channel_bias.cu): the bias of a
// convolution. CPU reference: ops::conv2d_forward's bias and ops::conv2d_backward_bias
// (src/ops/conv.cpp).
//
// y and dy are float32 device memory [n, channels, plane] (plane = H·W), bias and dbias hold
// `channels` floats. Asynchronous on `stream`; an empty tensor launches nothing.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace pipeline::kernels {

// y[n, c, p] += bias[c] (one float addition per element, as the CPU).
void channel_bias_add(cudaStream_t stream, float* y, const float* bias, std::int64_t n,
                      std::int64_t channels, std::int64_t plane);

// dbias[c] += Σ_{n, p} dy[n, c, p]: one block per channel, summed in double in a fixed order,
// so the result is the same bits on every run.
void channel_bias_grad(cudaStream_t stream, const float* dy, std::int64_t n, std::int64_t channels,
                       std::int64_t plane, float* dbias);

}  // namespace pipeline::kernels
